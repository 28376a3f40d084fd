//! Certificates made at test time with the `openssl` command (`scripts/test` installs it): a
//! CA, a server certificate for `localhost` and 127.0.0.1 signed by it, a client certificate
//! signed by it, and an unrelated CA (whose trust must not be enough), in a temporary
//! directory removed on drop.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server_process::ServerProcess;

/// The certificate files of one test run.
#[derive(Debug)]
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Makes a CA, a server and a client certificate signed by it, and an unrelated CA.
    pub fn make() -> Self {
        let dir = ServerProcess::temp_dir("tls");
        let certs = Certs { dir };
        certs.ca("ca");
        certs.ca("other-ca");
        // Also a client certificate: a Redis Cluster's nodes present it to each other on the bus.
        let server = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth";
        certs.signed("server", "localhost", server, "2");
        certs.signed("expired", "localhost", server, "-1");
        certs.signed(
            "elsewhere",
            "elsewhere.invalid",
            "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth",
            "2",
        );
        certs.signed("client", "lock-client", "extendedKeyUsage=clientAuth", "2");
        certs
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl").args(args).current_dir(&self.dir).output().unwrap_or_else(|e| {
            panic!("cannot run `openssl` (scripts/test installs it): {e}");
        });
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A self-signed CA `<name>.pem` (key `<name>.key`).
    fn ca(&self, name: &str) {
        let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN=lock-tests {name}"));
        self.new_key(&key, &["-x509", "-out", &pem, "-days", "2", "-subj", &subject]);
    }

    /// A certificate `<name>.pem` (key `<name>.key`) for `cn`, signed by the CA, valid for
    /// `days` (negative: expired already).
    fn signed(&self, name: &str, cn: &str, extensions: &str, days: &str) {
        let (key, csr, pem, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        std::fs::write(self.dir.join(&ext), format!("{extensions}\n")).expect("extensions file");
        self.new_key(&key, &["-out", &csr, "-subj", &format!("/CN={cn}")]);
        let sign = ["-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem];
        self.openssl(&[&["x509"][..], &sign, &["-days", days, "-extfile", &ext]].concat());
    }

    /// `openssl req` with a new P-256 key in `key` (quick to make and to handshake with) and
    /// `rest`.
    fn new_key(&self, key: &str, rest: &[&str]) {
        let new = ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key];
        self.openssl(&[&new[..], rest].concat());
    }

    /// `<dir>/<file>`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Trusts the CA and presents the client certificate (mutual TLS).
    #[cfg(any(feature = "tls", feature = "tls-aws-lc"))]
    pub fn mutual(&self) -> lock_runtime::TlsOptions {
        lock_runtime::TlsOptions::new()
            .ca_file(self.path("ca.pem"))
            .client_cert_files(self.path("client.pem"), self.path("client.key"))
    }

    /// The directory holding them.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
