//! Redis URLs: read into the `redis` crate's connection info, with the TLS settings of
//! [`RedisOptions::tls`] for a `rediss://` URL (feature `tls`); nodes learnt from a server
//! (a Cluster's, the primary Sentinels name) made from one of them; and URLs shown with their
//! password masked. Every topology connects through here, so `rediss://` and an ACL user
//! (`redis://user:password@host`) mean the same on each.

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use super::options::RedisOptions;
use crate::error::LockError;

/// `url` (a server, a Cluster node, a Sentinel, a Redlock primary) as connection info for
/// `options`, its TCP connections given [`tcp_settings`]. What cannot be used is an
/// [`is_invalid`](LockError::is_invalid) error that shows `example` of what is expected: a
/// malformed URL, a `rediss://` URL without the `tls` feature, TLS settings with a `redis://`
/// URL, or TLS material that cannot be read.
pub(super) fn connection_info(url: &str, options: &RedisOptions, example: &str) -> Result<ConnectionInfo, LockError> {
    let info = parsed(url, options, example)?;
    let settings = tcp_settings(info.tcp_settings().clone(), options);
    Ok(info.set_tcp_settings(settings))
}

/// How long a request may stay unacknowledged by the server's host before the kernel closes
/// its connection (`TCP_USER_TIMEOUT`): the command timeout, at least [`UNACKED_FLOOR`].
///
/// Without it a connection whose packets were dropped (a partition, a host gone) stays open
/// with its retransmissions backed off (1.6 s after 3 s of a cut, 2 min at most), and once the
/// network heals the first requests on it wait for the next retransmission: a CI run saw the
/// first lock after a Redis Cluster partition healed fail with no answer in its 1 s. Closed,
/// the connection is made again at the next request, at once on a healed network.
/// (Linux only: elsewhere the kernel's own retransmission limits apply.)
pub(super) fn tcp_settings(
    settings: redis::io::tcp::TcpSettings,
    options: &RedisOptions,
) -> redis::io::tcp::TcpSettings {
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    return settings.set_user_timeout(options.get_command_timeout().max(UNACKED_FLOOR));
    #[cfg(not(any(target_os = "android", target_os = "fuchsia", target_os = "linux")))]
    {
        let _ = options;
        settings
    }
}

/// The shortest [`tcp_settings`] bound: a lost packet is sent again after 200 ms, then 400 ms
/// more, so a healthy path has acknowledged well within it.
#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
const UNACKED_FLOOR: std::time::Duration = std::time::Duration::from_secs(1);

fn parsed(url: &str, options: &RedisOptions, example: &str) -> Result<ConnectionInfo, LockError> {
    let shown = redact(url);
    let tls = url.trim_start().starts_with("rediss://");
    if tls && !cfg!(feature = "_tls") {
        let why = "a `rediss://` URL needs TLS, which this build leaves out: enable the `tls` feature of lock-runtime";
        return Err(LockError::invalid(shown, why));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| LockError::invalid(&shown, format!("not a usable Redis URL ({e}); expected e.g. {example}")))?;
    #[cfg(feature = "_tls")]
    {
        match (options.get_tls(), tls) {
            (Some(_), false) => Err(LockError::invalid(
                shown,
                "TLS settings were given (`RedisOptions::tls`) but the URL is not a TLS one: use `rediss://host:port`",
            )),
            (Some(settings), true) => {
                let client = redis::Client::build_with_tls(info, certificates(settings, &shown)?)
                    .map_err(|e| LockError::invalid(&shown, format!("unusable TLS settings ({e})")))?;
                Ok(client.get_connection_info().clone())
            }
            (None, tls) => {
                if tls {
                    crate::tls::install_provider();
                }
                Ok(info)
            }
        }
    }
    #[cfg(not(feature = "_tls"))]
    {
        let _ = options;
        Ok(info)
    }
}

/// The `redis` crate's form of `settings`: the CAs given, then the platform's roots (it takes
/// the roots it is given instead of the platform's), and the client identity.
#[cfg(feature = "_tls")]
pub(super) fn certificates(
    settings: &crate::tls::TlsOptions,
    shown: &str,
) -> Result<redis::TlsCertificates, LockError> {
    let loaded = settings.load(shown)?;
    let client_tls = loaded
        .identity
        .as_ref()
        .map(|(cert, key)| redis::ClientTlsConfig { client_cert: cert.to_vec(), client_key: key.to_vec() });
    Ok(redis::TlsCertificates { client_tls, root_cert: Some(loaded.roots_pem()) })
}

/// `template` (credentials, database, TLS settings) at `host:port`: a node a server told of.
pub(super) fn at(template: &ConnectionInfo, host: &str, port: u16) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
            ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: *insecure, tls_params: tls_params.clone() }
        }
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    template.clone().set_addr(addr)
}

pub(super) use crate::backend::credentials::redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:secret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact("redis://user:secret@host"), "redis://user:***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("nonsense"), "nonsense");
    }

    #[test]
    fn learned_nodes_keep_the_template_credentials() {
        let seed = "redis://user:pw@10.0.0.1:7000".into_connection_info().expect("url");
        let node = at(&seed, "10.0.0.2", 7001);
        assert_eq!(node.addr(), &ConnectionAddr::Tcp("10.0.0.2".into(), 7001));
        assert_eq!(node.redis_settings().password(), Some("pw"));
    }

    #[test]
    fn tls_urls_without_the_feature_or_settings_without_tls_urls_are_invalid() {
        let options = RedisOptions::default();
        let plain = connection_info("redis://127.0.0.1:6379", &options, "`redis://host`");
        assert!(plain.is_ok());
        let tls = connection_info("rediss://127.0.0.1:6380", &options, "`redis://host`");
        if cfg!(feature = "_tls") {
            assert!(tls.is_ok());
        } else {
            let e = tls.expect_err("refused");
            assert!(e.is_invalid() && e.to_string().contains("`tls` feature"), "{e}");
        }
        #[cfg(feature = "_tls")]
        {
            let with_tls = RedisOptions::default().tls(crate::tls::TlsOptions::new());
            let e = connection_info("redis://127.0.0.1:6379", &with_tls, "`redis://host`").expect_err("refused");
            assert!(e.is_invalid() && e.to_string().contains("rediss://"), "{e}");
        }
        let e = connection_info("nonsense://x", &options, "`redis://host`").expect_err("refused");
        assert!(e.is_invalid() && e.to_string().contains("`redis://host`"), "{e}");
    }
}
