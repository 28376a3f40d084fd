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
        let server = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth";
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

    fn ca(&self, name: &str) {
        let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN=lock-tests {name}"));
        self.openssl(&[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &pem, "-days", "2", "-subj",
            &subject,
        ]);
    }

    /// A certificate `<name>.pem` (key `<name>.key`) for `cn`, signed by the CA, valid for
    /// `days` (negative: expired already).
    fn signed(&self, name: &str, cn: &str, extensions: &str, days: &str) {
        let (key, csr, pem, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        std::fs::write(self.dir.join(&ext), format!("{extensions}\n")).expect("extensions file");
        let subject = format!("/CN={cn}");
        self.openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &subject]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            days,
            "-extfile",
            &ext,
        ]);
    }

    /// `<dir>/<file>`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
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
