//! TLS of the PostgreSQL backend, as libpq means it: the URL parameters `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey`, plus `PostgresOptions::tls` (feature `tls`, rustls).
//! What each mode checks is in the module docs (`README.md`, *TLS and least privilege*).

use tokio_postgres::config::SslMode;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// libpq's TLS parameters, taken out of a URL.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Params {
    pub(super) mode: Option<Mode>,
    pub(super) rootcert: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

/// `url` without libpq's TLS parameters (tokio-postgres refuses those it does not know), and
/// those parameters; an unknown `sslmode` is an error naming the accepted ones.
pub(super) fn split_url(url: &str) -> Result<(String, Params), String> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), Params::default())) };
    let mut params = Params::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = || percent_decode(value);
        match key {
            "sslmode" => {
                params.mode = Some(match value {
                    "disable" => Mode::Disable,
                    "prefer" | "allow" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(format!(
                            "unknown sslmode `{other}`: give disable, allow (taken as prefer), prefer, require, verify-ca or verify-full"
                        ))
                    }
                })
            }
            "sslrootcert" => params.rootcert = Some(decoded()),
            "sslcert" => params.cert = Some(decoded()),
            "sslkey" => params.key = Some(decoded()),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, params))
}

/// `%XX` sequences decoded (a path in a URL parameter); anything malformed is kept as it is.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What tokio-postgres is told of `mode`.
pub(super) fn ssl_mode(mode: Mode) -> SslMode {
    match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    }
}

/// The connector of lock connections and cancel requests.
#[cfg(not(feature = "_tls"))]
pub(super) type Connector = tokio_postgres::NoTls;

/// The connector for `params`: without the feature `tls`, modes that need TLS are refused.
#[cfg(not(feature = "_tls"))]
pub(super) fn connector(params: &Params, _: &super::PostgresOptions, _: &str) -> Result<(Connector, Mode), String> {
    match params.mode.unwrap_or(Mode::Prefer) {
        mode @ (Mode::Disable | Mode::Prefer) => Ok((tokio_postgres::NoTls, mode)),
        _ => Err("sslmode require, verify-ca and verify-full need TLS, which this build leaves out: enable the \
                  `tls` feature of lock-runtime"
            .to_owned()),
    }
}

#[cfg(feature = "_tls")]
pub(super) use rustls_connector::{connector, Connector};

#[cfg(feature = "_tls")]
mod rustls_connector {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
    use tokio_postgres::Socket;

    use super::{Mode, Params};
    use crate::backend::postgres::PostgresOptions;

    /// Makes the TLS client of each connection (and cancel request): `None` for `disable`.
    #[derive(Clone)]
    pub(in crate::backend::postgres) struct Connector(Option<Arc<ClientConfig>>);

    /// The connector for `params` and `options`, and the mode it stands for. Errors say what in
    /// the settings cannot be used (`name`: what they are about).
    pub(in crate::backend::postgres) fn connector(
        params: &Params,
        options: &PostgresOptions,
        name: &str,
    ) -> Result<(Connector, Mode), String> {
        let given = options.get_tls();
        let mode = params.mode.unwrap_or(if given.is_some() { Mode::VerifyFull } else { Mode::Prefer });
        if mode == Mode::Disable {
            return Ok((Connector(None), mode));
        }
        let mut settings = given.cloned().unwrap_or_default();
        // `system`: the platform's roots, which are always trusted.
        if let Some(path) = params.rootcert.as_deref().filter(|r| *r != "system") {
            settings = settings.ca_file(path);
        }
        match (&params.cert, &params.key) {
            (Some(cert), Some(key)) => settings = settings.client_cert_files(cert, key),
            (None, None) => {}
            _ => return Err("sslcert and sslkey go together: give both, or neither".to_owned()),
        }
        let loaded = settings.load(name).map_err(|e| e.to_string())?;
        let ca_given = !loaded.cas_pem.is_empty();
        let check = match mode {
            Mode::VerifyFull => Check::Full,
            Mode::VerifyCa => Check::Chain,
            Mode::Require if ca_given => Check::Chain,
            _ => Check::Nothing,
        };
        let config = match check {
            Check::Full => loaded.config,
            check => {
                let mut config = (*loaded.config).clone();
                let webpki = WebPkiServerVerifier::builder_with_provider(loaded.roots.clone(), provider())
                    .build()
                    .map_err(|e| format!("no usable TLS roots: {e}"))?;
                config.dangerous().set_certificate_verifier(Arc::new(Verifier { webpki, check }));
                Arc::new(config)
            }
        };
        Ok((Connector(Some(config)), mode))
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// What of the server's certificate is checked.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Check {
        /// Nothing (`prefer`, `require` without a CA): encryption without authentication.
        Nothing,
        /// The chain to a trusted CA, not the host name (`verify-ca`).
        Chain,
        /// Both (`verify-full`).
        Full,
    }

    /// libpq's weaker checks, on rustls' own verifier.
    #[derive(Debug)]
    struct Verifier {
        webpki: Arc<WebPkiServerVerifier>,
        check: Check,
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            if self.check == Check::Nothing {
                return Ok(ServerCertVerified::assertion());
            }
            match self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
                )) if self.check == Check::Chain => Ok(ServerCertVerified::assertion()),
                verdict => verdict,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.webpki.supported_verify_schemes()
        }
    }

    impl MakeTlsConnect<Socket> for Connector {
        type Stream = Stream;
        type TlsConnect = Connect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, io::Error> {
            // Asked for every connection, also with `sslmode=disable` (then never used).
            let Some(config) = self.0.clone() else { return Ok(Connect(None)) };
            let name = ServerName::try_from(domain.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("`{domain}`: {e}")))?;
            Ok(Connect(Some((config, name))))
        }
    }

    /// One connection's TLS client: its configuration and the server's name (`None`: TLS
    /// disabled).
    pub(in crate::backend::postgres) struct Connect(Option<(Arc<ClientConfig>, ServerName<'static>)>);

    impl TlsConnect<Socket> for Connect {
        type Stream = Stream;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>>;

        fn connect(self, socket: Socket) -> Self::Future {
            Box::pin(async move {
                let (config, name) = self.0.ok_or_else(|| io::Error::other("TLS is disabled (sslmode=disable)"))?;
                let stream = tokio_rustls::TlsConnector::from(config).connect(name, socket).await?;
                Ok(Stream(Box::new(stream)))
            })
        }
    }

    /// A TLS connection to the server.
    pub(in crate::backend::postgres) struct Stream(Box<tokio_rustls::client::TlsStream<Socket>>);

    impl TlsStream for Stream {
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }

    impl AsyncRead for Stream {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Stream {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Pin::new(&mut *self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_shutdown(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_of_the_url() {
        let (url, params) = split_url(
            "postgres://u@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem&sslcert=c.pem&sslkey=k.pem",
        )
        .expect("parsed");
        assert_eq!(url, "postgres://u@h:5432/db?application_name=x");
        assert_eq!(params.mode, Some(Mode::VerifyFull));
        assert_eq!(params.rootcert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!((params.cert.as_deref(), params.key.as_deref()), (Some("c.pem"), Some("k.pem")));
        assert_eq!(split_url("postgres://h/db").expect("plain"), ("postgres://h/db".to_owned(), Params::default()));
        assert_eq!(split_url("postgres://h/db?sslmode=require").expect("require").0, "postgres://h/db");
        let e = split_url("postgres://h/db?sslmode=verify").expect_err("unknown mode");
        assert!(e.contains("verify-full"), "{e}");
        // Every mode accepted is named (`allow` was accepted and not named).
        for mode in ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] {
            assert!(e.contains(mode), "{mode} not named: {e}");
            split_url(&format!("postgres://h/db?sslmode={mode}")).expect(mode);
        }
    }
}
