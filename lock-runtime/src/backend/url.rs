#![doc = include_str!("url.md")]

use std::time::Duration;

use crate::error::LockError;

use super::LockBackend;

/// The schemes [`connect`] knows, each with the feature it needs (`None`: always compiled).
const SCHEMES: &[(&str, Option<&str>)] = &[
    ("memory", None),
    ("file", None),
    ("redis", Some("redis")),
    ("rediss", Some("redis")),
    ("redis+unix", Some("redis")),
    ("unix", Some("redis")),
    ("redis+cluster", Some("redis")),
    ("rediss+cluster", Some("redis")),
    ("redis+sentinel", Some("redis")),
    ("rediss+sentinel", Some("redis")),
    ("redlock", Some("redis")),
    ("redis+redlock", Some("redis")),
    ("rediss+redlock", Some("redis")),
    ("zookeeper", Some("zookeeper")),
    ("etcd", Some("etcd")),
    ("etcd+http", Some("etcd")),
    ("etcd+https", Some("etcd")),
    ("postgres", Some("postgres")),
    ("postgresql", Some("postgres")),
    ("mysql", Some("mysql")),
    ("mariadb", Some("mysql")),
];

/// The backend `url` names, connected (see the [module docs](self) for the schemes).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let backend = lock_runtime::backend::url::connect("memory://").await?;
/// assert_eq!(backend.name(), "memory");
///
/// let Err(err) = lock_runtime::backend::url::connect("consul://127.0.0.1:8500").await else { unreachable!() };
/// assert!(err.is_invalid());
/// assert!(err.to_string().contains("redis://"));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Box<dyn LockBackend>, LockError> {
    let mut parts = Parts::of(url)?;
    const COMPILED: &[(&str, bool)] = &[
        ("redis", cfg!(feature = "redis")),
        ("zookeeper", cfg!(feature = "zookeeper")),
        ("etcd", cfg!(feature = "etcd")),
        ("postgres", cfg!(feature = "postgres")),
        ("mysql", cfg!(feature = "mysql")),
    ];
    let compiled = |feature: &str| COMPILED.iter().any(|(name, on)| *name == feature && *on);
    parts.check_feature(compiled)?;
    match parts.scheme.as_str() {
        "memory" => {
            parts.no_more(&[])?;
            if parts.userinfo.is_some() || !parts.hosts.is_empty() || !matches!(parts.path, "" | "/") {
                return Err(parts.invalid("the in-process backend takes nothing after the scheme: `memory://`"));
            }
            Ok(Box::new(super::memory::MemoryBackend::new()))
        }
        "file" => {
            use super::file::{FileBackend, FileOptions};
            let mut options = FileOptions::new();
            if let Some(timeout) = parts.duration("operation_timeout")? {
                options = options.operation_timeout(timeout);
            }
            if let Some(allow) = parts.flag("allow_network_file_system")? {
                options = options.allow_network_file_system(allow);
            }
            parts.no_more(&["operation_timeout", "allow_network_file_system"])?;
            let local = parts.userinfo.is_none() && matches!(parts.hosts, "" | "localhost");
            if !(local && parts.path.starts_with('/')) {
                return Err(parts.invalid("a lock directory is an absolute path: `file:///var/lock/myapp`"));
            }
            Ok(Box::new(FileBackend::open_with(decode(parts.path), options)?))
        }
        _ => connect_networked(&mut parts).await,
    }
}

/// The backends behind a feature (each arm compiled only with it; `check_feature` has refused
/// the others).
async fn connect_networked(parts: &mut Parts<'_>) -> Result<Box<dyn LockBackend>, LockError> {
    #[cfg(feature = "redis")]
    if parts.scheme.starts_with("redis") || parts.scheme == "unix" || parts.scheme == "redlock" {
        return connect_redis(parts).await;
    }
    match parts.scheme.as_str() {
        #[cfg(feature = "zookeeper")]
        "zookeeper" => {
            use super::zookeeper::{ZookeeperBackend, ZookeeperOptions};
            let mut options = ZookeeperOptions::new();
            if let Some(timeout) = parts.duration("operation_timeout")? {
                options = options.operation_timeout(timeout);
            }
            if let Some(timeout) = parts.duration("session_timeout")? {
                options = options.session_timeout(timeout);
            }
            if let Some(grace) = parts.duration("lost_after_disconnect")? {
                options = options.lost_after_disconnect(grace);
            }
            if let Some(root) = parts.take("root") {
                options = options.root(root);
            }
            parts.no_more(&["operation_timeout", "session_timeout", "lost_after_disconnect", "root"])?;
            if let Some((user, password)) = parts.credentials() {
                options = options.digest_auth(user, password);
            }
            let hosts = parts.host_list("zookeeper://host:2181,host:2181[/chroot]")?.join(",");
            let chroot = if parts.path == "/" { "" } else { parts.path };
            Ok(Box::new(ZookeeperBackend::connect_with(format!("{hosts}{chroot}"), options).await?))
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcd+http" | "etcd+https" => {
            use super::etcd::{EtcdBackend, EtcdOptions};
            let mut options = EtcdOptions::new();
            if let Some(timeout) = parts.duration("operation_timeout")? {
                options = options.operation_timeout(timeout);
            }
            if let Some(ttl) = parts.duration("lease_ttl")? {
                options = options.lease_ttl(ttl);
            }
            parts.no_more(&["operation_timeout", "lease_ttl"])?;
            if let Some((user, password)) = parts.credentials() {
                options = options.credentials(user, password);
            }
            let root = parts.path.trim_matches('/');
            if !root.is_empty() {
                options = options.root(decode(root));
            }
            let http = if parts.scheme == "etcd+https" { "https" } else { "http" };
            let hosts = parts.host_list("etcd://host:2379,host:2379")?;
            let endpoints: Vec<String> = hosts.iter().map(|host| format!("{http}://{host}")).collect();
            Ok(Box::new(EtcdBackend::connect_with(endpoints, options).await?))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            use super::postgres::{PostgresBackend, PostgresOptions};
            let mut options = PostgresOptions::new();
            if let Some(timeout) = parts.duration("operation_timeout")? {
                options = options.operation_timeout(timeout);
            }
            if let Some(max_idle) = parts.count("max_idle")? {
                options = options.max_idle(max_idle);
            }
            if let Some(pooled) = parts.flag("transaction_pooling")? {
                options = options.transaction_pooling(pooled);
            }
            if let Some(carriers) = parts.count("multiplexing")? {
                options = options.multiplexing(carriers);
            }
            parts.only_drivers(
                &["operation_timeout", "max_idle", "transaction_pooling", "multiplexing"],
                POSTGRES_DRIVER,
            )?;
            Ok(Box::new(PostgresBackend::connect_with(parts.passed_on(), options).await?))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            use super::mysql::{MysqlBackend, MysqlOptions};
            let mut options = MysqlOptions::new();
            if let Some(timeout) = parts.duration("operation_timeout")? {
                options = options.operation_timeout(timeout);
            }
            if let Some(heartbeat) = parts.duration("heartbeat")? {
                options = options.heartbeat(heartbeat);
            }
            if let Some(max_idle) = parts.count("max_idle")? {
                options = options.max_idle(max_idle);
            }
            if let Some(carriers) = parts.count("multiplexing")? {
                options = options.multiplexing(carriers);
            }
            parts.only_drivers(&["operation_timeout", "heartbeat", "max_idle", "multiplexing"], MYSQL_DRIVER)?;
            let url = parts.passed_on().replacen("mariadb://", "mysql://", 1);
            Ok(Box::new(MysqlBackend::connect_with(url, options).await?))
        }
        _ => Err(parts.invalid(format!("unknown scheme `{}://`; {}", parts.scheme, known()))),
    }
}

/// The Redis schemes: one server, a Cluster, Sentinel, Redlock.
#[cfg(feature = "redis")]
async fn connect_redis(parts: &mut Parts<'_>) -> Result<Box<dyn LockBackend>, LockError> {
    use super::redis::{RedisBackend, RedisOptions, RedlockBackend};
    let mut options = RedisOptions::default();
    if let Some(timeout) = parts.duration("operation_timeout")? {
        options = options.command_timeout(timeout);
    }
    if let Some(replicas) = parts.count("wait_for_replicas")? {
        let timeout = parts.duration("replica_timeout")?.unwrap_or(options.get_command_timeout() / 2);
        options = options.wait_for_replicas(replicas, timeout);
    }
    parts.only_drivers(&["operation_timeout", "wait_for_replicas", "replica_timeout"], REDIS_DRIVER)?;
    match parts.scheme.as_str() {
        "redis+cluster" | "rediss+cluster" => {
            let nodes = parts.redis_nodes("redis+cluster://host:port,host:port")?;
            Ok(Box::new(RedisBackend::cluster(nodes, options).await?))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let master = parts.path.trim_matches('/');
            if master.is_empty() || master.contains('/') {
                let why = "the path names the primary: `redis+sentinel://host:26379,host:26379/mymaster`";
                return Err(parts.invalid(why));
            }
            let sentinels = parts.redis_nodes("redis+sentinel://host:26379,host:26379/mymaster")?;
            let master = decode(master);
            Ok(Box::new(RedisBackend::sentinel(sentinels, &master, options).await?))
        }
        "redlock" | "redis+redlock" | "rediss+redlock" => {
            let nodes = parts.redis_nodes("redlock://host:6379,host:6379,host:6379")?;
            Ok(Box::new(RedlockBackend::connect(nodes, options).await?))
        }
        _ => Ok(Box::new(RedisBackend::connect_with(&parts.passed_on(), options).await?)),
    }
}

/// The one-server URLs of a multi-node Redis URL (`redis+cluster://`, `redis+sentinel://`,
/// `redlock://`, and their `rediss+` forms): one `redis://` (or `rediss://`) URL per host, each
/// with the user information and the query. For a tool that looks at each node itself.
///
/// ```
/// let nodes = lock_runtime::backend::url::redis_nodes("redlock://u:p@a:6379,b:6379?protocol=resp3")?;
/// assert_eq!(nodes, ["redis://u:p@a:6379?protocol=resp3", "redis://u:p@b:6379?protocol=resp3"]);
/// # Ok::<(), lock_runtime::LockError>(())
/// ```
pub fn redis_nodes(url: &str) -> Result<Vec<String>, LockError> {
    let parts = Parts::of(url)?;
    match parts.scheme.split_once('+') {
        Some(("redis" | "rediss", "cluster" | "sentinel" | "redlock")) => {}
        None if parts.scheme == "redlock" => {}
        _ => return Err(parts.invalid("not a multi-node Redis URL: expected e.g. `redlock://a:6379,b:6379,c:6379`")),
    }
    parts.redis_nodes("redlock://a:6379,b:6379,c:6379")
}

/// The parameters of a Redis URL the `redis` crate reads (passed on to it).
#[cfg(feature = "redis")]
const REDIS_DRIVER: &[&str] = &["protocol", "db", "user", "pass"];

/// The parameters of a PostgreSQL URL tokio-postgres reads, and libpq's TLS ones the backend
/// reads (passed on).
#[cfg(feature = "postgres")]
const POSTGRES_DRIVER: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// The parameters of a MySQL URL `mysql_async` reads (passed on).
#[cfg(feature = "mysql")]
const MYSQL_DRIVER: &[&str] = &[
    "pool_min",
    "pool_max",
    "inactive_connection_ttl",
    "ttl_check_interval",
    "conn_ttl",
    "abs_conn_ttl",
    "abs_conn_ttl_jitter",
    "tcp_keepalive",
    "max_allowed_packet",
    "wait_timeout",
    "enable_cleartext_plugin",
    "reset_connection",
    "tcp_nodelay",
    "stmt_cache_size",
    "prefer_socket",
    "secure_auth",
    "client_found_rows",
    "socket",
    "compression",
    "require_ssl",
    "verify_ca",
    "verify_identity",
    "built_in_roots",
];

/// "known schemes: …", for an unknown one.
fn known() -> String {
    let names: Vec<String> = SCHEMES.iter().map(|(scheme, _)| format!("{scheme}://")).collect();
    format!("known schemes: {}", names.join(", "))
}

/// `scheme://[userinfo@]hosts[/path][?query]`, with commas allowed among the hosts.
#[derive(Debug)]
struct Parts<'a> {
    /// The whole URL, as given (trimmed).
    url: &'a str,
    /// Lower case.
    scheme: String,
    userinfo: Option<&'a str>,
    hosts: &'a str,
    /// From the first `/` after the hosts (with it), up to the query.
    path: &'a str,
    /// The query's `key=value` pairs not taken yet (as given, not decoded).
    query: Vec<(&'a str, &'a str)>,
}

impl<'a> Parts<'a> {
    fn of(url: &'a str) -> Result<Self, LockError> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            let why = format!("not a URL: expected `scheme://…`, e.g. `redis://127.0.0.1:6379`; {}", known());
            return Err(LockError::invalid(redact(url), why));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, query),
            None => (rest, ""),
        };
        let query =
            query.split('&').filter(|pair| !pair.is_empty()).map(|pair| pair.split_once('=').unwrap_or((pair, "")));
        let (authority, path) = rest.find('/').map_or((rest, ""), |slash| rest.split_at(slash));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        Ok(Parts { url, scheme: scheme.to_ascii_lowercase(), userinfo, hosts, path, query: query.collect() })
    }

    /// Refuses a known scheme whose feature `compiled` says this build leaves out, and an
    /// unknown scheme.
    fn check_feature(&self, compiled: impl Fn(&str) -> bool) -> Result<(), LockError> {
        match SCHEMES.iter().find(|(scheme, _)| *scheme == self.scheme) {
            None => Err(self.invalid(format!("unknown scheme `{}://`; {}", self.scheme, known()))),
            Some((_, Some(feature))) if !compiled(feature) => Err(self.invalid(format!(
                "`{}://` needs lock-runtime's `{feature}` feature, which this build leaves out: \
                 enable it (`lock-runtime = {{ version = \"…\", features = [\"{feature}\"] }}`)",
                self.scheme
            ))),
            Some(_) => Ok(()),
        }
    }

    fn invalid(&self, why: impl Into<String>) -> LockError {
        LockError::invalid(redact(self.url), why)
    }

    /// The value of parameter `key`, percent-decoded, taken out of the query (the last one
    /// given wins).
    fn take(&mut self, key: &str) -> Option<String> {
        let mut value = None;
        self.query.retain(|(k, v)| {
            let ours = *k == key;
            if ours {
                value = Some(decode(v));
            }
            !ours
        });
        value
    }

    /// Parameter `key` as a duration (`250ms`, `5s`, `1m`).
    fn duration(&mut self, key: &str) -> Result<Option<Duration>, LockError> {
        let Some(text) = self.take(key) else { return Ok(None) };
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        let (number, unit) = text.split_at(digits);
        let factor = match unit {
            "ms" => Some(1),
            "s" => Some(1_000),
            "m" => Some(60_000),
            _ => None,
        };
        match (number.parse::<u64>(), factor) {
            (Ok(n), Some(factor)) if n > 0 => Ok(Some(Duration::from_millis(n.saturating_mul(factor)))),
            _ => Err(self.invalid(format!(
                "`{key}={text}` is not a duration above zero: give a whole number and a unit, `250ms`, `5s` or `1m`"
            ))),
        }
    }

    /// Parameter `key` as a whole number.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn count(&mut self, key: &str) -> Result<Option<usize>, LockError> {
        let Some(text) = self.take(key) else { return Ok(None) };
        match text.parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(self.invalid(format!("`{key}={text}` is not a whole number"))),
        }
    }

    /// Parameter `key` as `true` or `false`.
    fn flag(&mut self, key: &str) -> Result<Option<bool>, LockError> {
        let Some(text) = self.take(key) else { return Ok(None) };
        match text.as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(self.invalid(format!("`{key}={text}` is neither `true` nor `false`"))),
        }
    }

    /// Refuses the parameters left: the scheme takes none but lock-runtime's.
    fn no_more(&self, ours: &[&str]) -> Result<(), LockError> {
        self.only_drivers(ours, &[])
    }

    /// Refuses a parameter left (lock-runtime's own, `ours`, are taken already) that the
    /// scheme's driver does not take either (`drivers`: those passed on to it), naming both
    /// lists: a misspelled one is caught at once, not ignored.
    fn only_drivers(&self, ours: &[&str], drivers: &[&str]) -> Result<(), LockError> {
        let Some((key, _)) = self.query.iter().find(|(k, _)| !drivers.contains(k)) else { return Ok(()) };
        let listed = |names: &[&str]| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        let known = match (ours, drivers) {
            ([], []) => "none".to_owned(),
            (ours, []) => listed(ours),
            (ours, drivers) => format!("{}; and the driver's: {}", listed(ours), listed(drivers)),
        };
        Err(self.invalid(format!(
            "`{}://` URLs take no parameter `{key}`; known: {known} (see the `backend::url` docs)",
            self.scheme
        )))
    }

    /// The URL to give the scheme's own driver: as given, with lock-runtime's parameters taken
    /// out of its query.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn passed_on(&self) -> String {
        // The scheme in lower case (drivers match it as written), then the rest as given.
        let rest = self.url.split_once("://").map_or("", |(_, rest)| rest);
        let rest = rest.split_once('?').map_or(rest, |(rest, _)| rest);
        let base = format!("{}://{rest}", self.scheme);
        match self.query_string() {
            query if query.is_empty() => base,
            query => format!("{base}?{query}"),
        }
    }

    /// The parameters left, as a query (no `?`).
    fn query_string(&self) -> String {
        let pairs: Vec<String> = self.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.join("&")
    }

    /// The comma-separated `host:port` items, each checked to be one.
    fn host_list(&self, example: &str) -> Result<Vec<&'a str>, LockError> {
        let hosts: Vec<&str> = self.hosts.split(',').map(str::trim).collect();
        if hosts.iter().any(|host| host.is_empty() || host.contains(['/', ' ', '?', '#'])) {
            return Err(self.invalid(format!("expected a list of `host:port` separated by commas: `{example}`")));
        }
        Ok(hosts)
    }

    /// The user and password of the user information, percent-decoded.
    #[cfg_attr(not(any(feature = "zookeeper", feature = "etcd")), allow(dead_code))]
    fn credentials(&self) -> Option<(String, String)> {
        let userinfo = self.userinfo?;
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        Some((decode(user), decode(password)))
    }

    /// One `redis://` (or `rediss://`) URL per host, each with the user information and the
    /// query.
    fn redis_nodes(&self, example: &str) -> Result<Vec<String>, LockError> {
        let scheme = if self.scheme.starts_with("rediss") { "rediss" } else { "redis" };
        let userinfo = self.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let query = match self.query_string() {
            query if query.is_empty() => query,
            query => format!("?{query}"),
        };
        let hosts = self.host_list(example)?;
        Ok(hosts.iter().map(|host| format!("{scheme}://{userinfo}{host}{query}")).collect())
    }
}

/// `text` with its `%XX` escapes decoded (a malformed escape is kept as it is).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) use super::credentials::redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_splits_into_its_parts_with_commas_among_the_hosts() {
        let parts = Parts::of(" redis+sentinel://u:p%40ss@s1:26379,s2:26379/my%20master?protocol=resp3 ").unwrap();
        assert_eq!(parts.scheme, "redis+sentinel");
        assert_eq!(parts.userinfo, Some("u:p%40ss"));
        assert_eq!(parts.hosts, "s1:26379,s2:26379");
        assert_eq!(parts.path, "/my%20master");
        assert_eq!(parts.query, [("protocol", "resp3")]);
        assert_eq!(parts.credentials(), Some(("u".into(), "p@ss".into())));
        assert_eq!(
            parts.redis_nodes("").unwrap(),
            ["redis://u:p%40ss@s1:26379?protocol=resp3", "redis://u:p%40ss@s2:26379?protocol=resp3"]
        );
        let file = Parts::of("file:///var/lock/my%20app").unwrap();
        assert_eq!((file.hosts, file.path), ("", "/var/lock/my%20app"));
        assert_eq!(decode(file.path), "/var/lock/my app");
    }

    #[test]
    fn a_scheme_left_out_of_the_build_names_its_feature() {
        let parts = Parts::of("zookeeper://zk1:2181").unwrap();
        let err = parts.check_feature(|feature| feature != "zookeeper").unwrap_err();
        assert!(err.is_invalid());
        assert!(err.to_string().contains("needs lock-runtime's `zookeeper` feature"), "{err}");
        assert!(parts.check_feature(|_| true).is_ok());
    }

    #[test]
    fn an_unknown_scheme_lists_the_known_ones_and_no_password() {
        let err = Parts::of("consul://user:secret@c:8500").unwrap().check_feature(|_| true).unwrap_err();
        let shown = err.to_string();
        assert!(err.is_invalid());
        for scheme in ["memory://", "file://", "redis+cluster://", "redlock://", "etcd+https://", "mariadb://"] {
            assert!(shown.contains(scheme), "{shown}");
        }
        assert!(!shown.contains("secret") && shown.contains("user:***"), "{shown}");
        let err = Parts::of("127.0.0.1:6379").unwrap_err();
        assert!(err.to_string().contains("not a URL"), "{err}");
    }

    #[test]
    fn a_host_list_refuses_empty_items() {
        let parts = Parts::of("redlock://a:1,,c:3").unwrap();
        let err = parts.host_list("redlock://a:1,b:2,c:3").unwrap_err();
        assert!(err.to_string().contains("`host:port` separated by commas"), "{err}");
    }

    async fn refused(url: &str) -> LockError {
        match connect(url).await {
            Ok(backend) => panic!("{url} connected to {}", backend.name()),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn memory_and_file_urls_connect_and_bad_ones_say_why() {
        assert_eq!(connect("memory://").await.unwrap().name(), "memory");
        assert_eq!(connect("MEMORY://").await.unwrap().name(), "memory");
        assert!(refused("memory://host").await.is_invalid());
        let dir = std::env::temp_dir().join(format!("lock-runtime-url-{}", std::process::id()));
        let file = connect(&format!("file://{}", dir.display())).await.unwrap();
        assert_eq!(file.name(), "file");
        let _ = std::fs::remove_dir_all(&dir);
        let err = refused("file://relative/dir").await;
        assert!(err.to_string().contains("absolute path"), "{err}");
        let err = refused("file:///tmp/x?timeout=1s").await;
        assert!(err.to_string().contains("take no parameter `timeout`"), "{err}");
        let err = refused("file:///tmp/x?operation_timeout=2").await;
        assert!(err.to_string().contains("`operation_timeout=2` is not a duration"), "{err}");
    }

    #[test]
    fn lock_runtimes_parameters_are_taken_out_and_the_rest_passed_on() {
        let mut parts = Parts::of("postgres://u:p@db/app?sslmode=require&operation_timeout=250ms&max_idle=4").unwrap();
        assert_eq!(parts.duration("operation_timeout").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(parts.count("max_idle").unwrap(), Some(4));
        assert_eq!(parts.duration("heartbeat").unwrap(), None);
        assert_eq!(parts.passed_on(), "postgres://u:p@db/app?sslmode=require");
        let mut parts = Parts::of("redis://h:1?operation_timeout=2s").unwrap();
        assert_eq!(parts.duration("operation_timeout").unwrap(), Some(Duration::from_secs(2)));
        assert_eq!(parts.passed_on(), "redis://h:1");
        let parts = Parts::of("POSTGRES://u@db/app?sslmode=require").unwrap();
        assert_eq!(parts.passed_on(), "postgres://u@db/app?sslmode=require");
        for bad in ["0s", "5", "1h", "s", "-1s"] {
            let url = format!("etcd://h:1?lease_ttl={bad}");
            let mut parts = Parts::of(&url).unwrap();
            assert!(parts.duration("lease_ttl").unwrap_err().is_invalid(), "{bad}");
        }
    }
}
