//! [`TlsOptions`]: the TLS settings every networked backend takes (feature `tls` or
//! `tls-aws-lc`).
//!
//! One TLS stack serves the whole crate: rustls, on the crypto provider its feature names:
//! `ring` (feature `tls`) or `aws-lc-rs` (feature `tls-aws-lc`, rustls's own default and
//! FIPS-capable; ZooKeeper's client needs it). Never OpenSSL. The server's certificate is checked against the platform's roots (read once per
//! process) plus the CAs given here, and its name against the host of the URL. A client
//! certificate, when given, is presented to servers that ask for one (mutual TLS).
//!
//! Everything given is read and checked when a backend connects: a file that cannot be read, a
//! PEM without a certificate or key, or a key that does not belong to its certificate is an
//! [`is_invalid`](crate::LockError::is_invalid) error naming the file. A server that refuses
//! the handshake (unknown CA, wrong host name, expired certificate, no client certificate) is
//! an [`is_backend`](crate::LockError::is_backend) error carrying the TLS library's reason.
//!
//! If no process-wide rustls provider is installed when the first TLS connection is made, the
//! feature's provider is installed as the process default (as the Redis and ZooKeeper clients
//! look it up there).

// Until every backend takes TLS settings, a build with none of those that do leaves this unused.
#![cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "etcd", feature = "mysql", feature = "zookeeper")),
    allow(dead_code)
)]

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::LockError;

/// TLS settings for a backend's connections: CAs to trust besides the platform's roots, and a
/// client certificate for mutual TLS. Cheap to clone. Feature `tls`.
///
/// ```
/// use lock_runtime::TlsOptions;
///
/// let tls = TlsOptions::new()
///     .ca_file("/etc/ssl/my-ca.pem")                    // trust this CA besides the platform roots
///     .client_cert_files("client.pem", "client.key");   // mutual TLS
/// # let _ = tls;
/// ```
///
/// Given to a backend's options, e.g.
/// `RedisOptions::default().tls(tls)` with a `rediss://` URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    cas: Vec<Pem>,
    identity: Option<(Pem, Pem)>,
}

/// PEM text, in a file or in memory.
#[derive(Clone, PartialEq, Eq)]
enum Pem {
    File(PathBuf),
    Bytes(Arc<[u8]>),
}

impl Pem {
    fn read(&self, what: &str) -> Result<PemText, String> {
        match self {
            Pem::Bytes(bytes) => Ok(bytes.clone()),
            Pem::File(path) => std::fs::read(path)
                .map(Arc::from)
                .map_err(|e| format!("cannot read the {what} file `{}`: {e}", path.display())),
        }
    }

    fn shown(&self, what: &str) -> String {
        match self {
            Pem::File(path) => format!("the {what} file `{}`", path.display()),
            Pem::Bytes(_) => format!("the {what} PEM given"),
        }
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |pem: &Pem| match pem {
            Pem::File(path) => path.display().to_string(),
            Pem::Bytes(_) => "<pem>".to_owned(),
        };
        f.debug_struct("TlsOptions")
            .field("cas", &self.cas.iter().map(shown).collect::<Vec<_>>())
            .field("client_cert", &self.identity.as_ref().map(|(cert, _)| shown(cert)))
            .finish_non_exhaustive() // the key is never shown
    }
}

impl TlsOptions {
    /// No CA besides the platform's roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also trusts the CA certificate(s) in the PEM file at `path` (read when a backend
    /// connects).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.cas.push(Pem::File(path.into()));
        self
    }

    /// Also trusts the CA certificate(s) in `pem` (PEM text), for a CA that never touches the
    /// disk.
    ///
    /// ```
    /// let ca = std::env::var("REDIS_CA_PEM").unwrap_or_default();
    /// let tls = lock_runtime::TlsOptions::new().ca_pem(ca);
    /// # let _ = tls;
    /// ```
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.cas.push(Pem::Bytes(pem.into().into()));
        self
    }

    /// Presents the certificate chain in the PEM file `cert` with the private key in the PEM
    /// file `key` to servers that ask for a client certificate (mutual TLS).
    pub fn client_cert_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// [`client_cert_files`](Self::client_cert_files) from PEM text in memory.
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((Pem::Bytes(cert.into().into()), Pem::Bytes(key.into().into())));
        self
    }

    /// Reads and checks everything given: the CAs and client identity as PEM text, and the
    /// rustls configuration they make. `name` is what errors are about (the backend's URL).
    pub(crate) fn load(&self, name: &str) -> Result<Loaded, LockError> {
        let invalid = |why: String| LockError::invalid(name, why);
        let mut roots = rustls::RootCertStore::empty();
        let mut cas_pem = Vec::new();
        for ca in &self.cas {
            let pem = ca.read("TLS CA").map_err(invalid)?;
            let certs = certificates(&pem, &ca.shown("TLS CA")).map_err(invalid)?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("{} holds an unusable CA certificate: {e}", ca.shown("TLS CA"))))?;
            }
            cas_pem.extend_from_slice(&pem);
            cas_pem.push(b'\n');
        }
        for cert in platform_roots() {
            // A platform root rustls cannot use is skipped, as the platform verifiers do.
            let _ = roots.add(cert.clone());
        }
        let roots = Arc::new(roots);
        install_provider();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("no usable TLS protocol version: {e}")))?
            .with_root_certificates(roots.clone());
        let (config, identity) = match &self.identity {
            None => (builder.with_no_client_auth(), None),
            Some((cert, key)) => {
                let cert_pem = cert.read("TLS client certificate").map_err(invalid)?;
                let key_pem = key.read("TLS client key").map_err(invalid)?;
                let chain = certificates(&cert_pem, &cert.shown("TLS client certificate")).map_err(invalid)?;
                let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                    invalid(format!("{} holds no usable private key: {e}", key.shown("TLS client key")))
                })?;
                let config = builder.with_client_auth_cert(chain, private).map_err(|e| {
                    invalid(format!(
                        "{} and {} do not make a usable client identity: {e}",
                        cert.shown("TLS client certificate"),
                        key.shown("TLS client key")
                    ))
                })?;
                (config, Some((cert_pem, key_pem)))
            }
        };
        Ok(Loaded { config: Arc::new(config), roots, cas_pem, identity })
    }
}

/// PEM text as read.
pub(crate) type PemText = Arc<[u8]>;

/// [`TlsOptions`] read and checked.
pub(crate) struct Loaded {
    /// The client configuration (roots: the platform's and the CAs given).
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// The roots `config` trusts.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) roots: Arc<rustls::RootCertStore>,
    /// The CAs given, as PEM text (empty: none).
    pub(crate) cas_pem: Vec<u8>,
    /// The client certificate chain and key, as PEM text.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "etcd",
            feature = "mysql",
            all(feature = "zookeeper", feature = "tls-aws-lc")
        )),
        allow(dead_code)
    )]
    pub(crate) identity: Option<(PemText, PemText)>,
}

impl Loaded {
    /// The trusted roots as PEM text, for clients that take PEM: the CAs given, then the
    /// platform's roots.
    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "mysql",
        all(feature = "zookeeper", feature = "tls-aws-lc")
    ))]
    pub(crate) fn roots_pem(&self) -> Vec<u8> {
        [&self.cas_pem[..], platform_roots_pem()].concat()
    }
}

/// The platform's roots as PEM text, encoded once per process (every `rediss://` URL and etcd
/// connection of every backend hands them to its client).
#[cfg(any(feature = "redis", feature = "etcd", feature = "mysql", all(feature = "zookeeper", feature = "tls-aws-lc")))]
fn platform_roots_pem() -> &'static [u8] {
    static PEM: OnceLock<Vec<u8>> = OnceLock::new();
    PEM.get_or_init(|| {
        let mut pem = Vec::new();
        for cert in platform_roots() {
            pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
            for line in base64(cert.as_ref()).as_bytes().chunks(64) {
                pem.extend_from_slice(line);
                pem.push(b'\n');
            }
            pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
        }
        pem
    })
}

/// The certificates in `pem`; at least one.
fn certificates(pem: &[u8], shown: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown} is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{shown} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)"));
    }
    Ok(certs)
}

/// The platform's trusted roots, read once per process (none if it has no store).
fn platform_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::debug!(%error, "a platform root certificate could not be read");
        }
        found.certs
    })
}

/// Installs the feature's provider as the process default if none is installed yet.
pub(crate) fn install_provider() {
    let _ = provider().install_default();
}

/// The crypto provider of this build: aws-lc-rs with the feature `tls-aws-lc`, else ring.
fn provider() -> rustls::crypto::CryptoProvider {
    #[cfg(feature = "tls-aws-lc")]
    return rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(not(feature = "tls-aws-lc"))]
    return rustls::crypto::ring::default_provider();
}

/// Standard base64 with padding.
#[cfg(any(feature = "redis", feature = "etcd", feature = "mysql", all(feature = "zookeeper", feature = "tls-aws-lc")))]
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "mysql",
        all(feature = "zookeeper", feature = "tls-aws-lc")
    ))]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "mysql",
        all(feature = "zookeeper", feature = "tls-aws-lc")
    ))]
    fn the_platform_roots_pem_reads_back_as_the_same_certificates() {
        let back: Vec<_> =
            CertificateDer::pem_slice_iter(platform_roots_pem()).collect::<Result<_, _>>().expect("valid PEM");
        assert_eq!(back, platform_roots());
    }

    #[test]
    fn bad_material_is_invalid_and_names_the_file() {
        let missing = TlsOptions::new().ca_file("/nonexistent/ca.pem").load("rediss://h").err().expect("error");
        assert!(missing.is_invalid(), "{missing}");
        assert!(missing.to_string().contains("/nonexistent/ca.pem"), "{missing}");
        let empty = TlsOptions::new().ca_pem("not pem").load("rediss://h").err().expect("error");
        assert!(empty.is_invalid() && empty.to_string().contains("no PEM certificate"), "{empty}");
        let no_key = TlsOptions::new().client_cert_pem("x", "y").load("rediss://h").err().expect("error");
        assert!(no_key.is_invalid(), "{no_key}");
    }

    #[test]
    fn debug_never_shows_key_material() {
        let tls = TlsOptions::new().ca_pem("secret-ca").client_cert_pem("secret-cert", "secret-key");
        let shown = format!("{tls:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
