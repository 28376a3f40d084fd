//! `lockctl`: inspect and free the locks of lock-runtime's Redis (one server, Cluster,
//! Sentinel, Redlock), ZooKeeper, etcd, PostgreSQL, MySQL and lock-file backends.
//!
//! ```text
//! lockctl (--url URL
//!          | --redis URL | --redis-cluster URLS | --redis-sentinel URLS --master NAME
//!          | --redlock URLS | --zookeeper HOSTS [--zk-root PATH] | --etcd ENDPOINTS [--etcd-root PATH]
//!          | --postgres URL | --mysql URL | --file DIR) [--json]
//!         [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] COMMAND
//!
//!   list [--prefix P]            held locks: kind, holder, fencing token, age, lease left, waiters
//!   show NAME                    one lock in detail
//!   release NAME --force         frees a lock whose holder is gone
//!   watch [--prefix P]           the locks followed live
//!         [--interval MS] [--count N]
//! ```
//!
//! `watch` on a terminal redraws the screen in place: one line per held lock, ages and leases
//! counting, a lock that just changed highlighted, and the latest events under the table
//! ("acquired `order:1` (mutex) by db-1/4242/billing (token 17)", "released …", "waiting on …:
//! 3"). Piped, it prints one line per event, each with its time of day (UTC); with `--json`,
//! one JSON line per view. A view changes when a lock is taken, released, changes hands or
//! gains or loses waiters (not when only ages and leases move on), and it exits after
//! `--count` views if given. On ZooKeeper it waits on
//! watches. On Redis, a release that was waited for and a forced release are announced (the
//! view follows at once); acquisitions are announced only when the server has keyspace
//! notifications on (`notify-keyspace-events` including `K` and `g$x`, which `lockctl` never
//! changes), so it also looks every `--interval` (default 250 ms).
//!
//! `--url URL` (or, with no store on the command line, the environment's `LOCKCTL_URL`) names
//! the store as a manager's URL does (`LockManager::connect`; every scheme
//! and parameter of `lock_runtime::backend::url`): `redis://`, `redis+cluster://h:p,h:p`,
//! `redis+sentinel://h:p,h:p/<master>`, `redlock://h:p,h:p,h:p`, `zookeeper://h:p/chroot`,
//! `etcd://h:p`, `postgres://…`, `mysql://…`, `file:///dir`. The per-store options below do the same with
//! TLS files and roots given on the command line.
//!
//! Over TLS: a `rediss://` URL (the platform's roots are trusted), `--tls-ca` to trust a CA
//! of your own besides, `--tls-cert` and `--tls-key` for mutual TLS; an ACL user and password
//! go in the URL (`rediss://user:password@host:6380`); the same for etcd, PostgreSQL and MySQL (`lockctl`
//! reaches ZooKeeper without TLS). For locks
//! made under ZooKeeper `digest` authentication, give the same identity before the hosts
//! (`--zookeeper user:password@zk1:2181,zk2:2181`): only it may release them.
//!
//! Install with `cargo install --path lockctl`. `NAME` is the lock's key in the store: the
//! manager's prefix followed by the lock's name, as `list` shows it.
//!
//! # What is shown
//!
//! Each lock stores the process holding it (host, pid and the label given with
//! `LockManagerBuilder::label`), so `lockctl` tells who holds it. What a store cannot tell is
//! printed as `unknown` (`null` in JSON), never guessed:
//!
//! - **Redis**: the waiters of other processes cannot be counted. Shown instead: whether the
//!   lock is marked waited on (some acquisition found it held and waits), how many
//!   connections subscribe to its release channel (processes with a waiter), and how many
//!   processes' waiters are in the lock's queue, to be granted it by its release (`queued`; a
//!   waiter enters it once it has waited a third of its claim window, at most 2 s; not on a
//!   Cluster, which keeps no queue). Age is counted by the server's clock from the grant.
//! - **ZooKeeper**: the waiters are exact (the nodes queued behind the holder's); a lock
//!   without a fixed lease is held as long as its holder's session lives (`session`); the age
//!   of a holder that did not record its grant is counted from when it queued (`≤` marks such
//!   an upper bound).
//! - **Redis Cluster and Sentinel** (`--redis-cluster URLS`, `--redis-sentinel URLS --master
//!   NAME`, URLS comma-separated): as on one server; `list` scans every primary of a Cluster;
//!   with Sentinel, the primary the sentinels name. Read-write locks and semaphores show one
//!   line per holder (kind `read`, `write`, `semaphore of N`), on every store that has them.
//! - **Redlock** (`--redlock URLS`, the independent primaries, comma-separated): each node is
//!   read as a Redis server; a lock is held when a quorum of them (N/2 + 1) names one owner,
//!   shown with the largest token among them (the quorum's), the oldest grant and the
//!   shortest lease left; a key fewer nodes name (a lost split vote) is not held. A quorum of
//!   nodes must answer. `release` frees the key on every node, owner-checked.
//! - **etcd** (`--etcd ENDPOINTS`, comma-separated; `user:password@` before them with RBAC on;
//!   `https://` endpoints with the `--tls-*` settings): a lock's holder is its lowest key, its
//!   token that key's create revision; waiters are exact (the keys queued behind it); a lock
//!   lives as long as its holder's lease is kept alive (`session`); the age is not stored
//!   (`unknown`). `release` deletes the holder's key: the next key holds the lock and its
//!   waiter is woken. `watch` follows an etcd watch on the prefix.
//! - **PostgreSQL** (`--postgres URL`): holders are read from `pg_locks` and
//!   `pg_stat_activity` (each holder's grant query names its lock and process; its token is in
//!   its session's `application_name`), so the user needs to see other sessions' queries (a
//!   superuser, the holders' role, or `pg_read_all_stats`). Waiters are exact (the requests
//!   queued on the key); a lock lives as long as its holder's session (`session`). `release`
//!   ends the holder's session (`pg_terminate_backend`): its lock is freed and its `lost()`
//!   fires at once. `watch` looks every `--interval`. `--tls-*` apply as for Redis.
//! - **MySQL / MariaDB** (`--mysql URL`; `cargo install --path lockctl --features mysql`): the
//!   server names no holder of a `GET_LOCK`, so each grant records its holder (key, owner,
//!   process, token, connection, time) in the in-memory table `lock_runtime_holders` and its
//!   release deletes it (unless the holders' backend has `MysqlOptions::record_holders(false)`:
//!   their locks are not listed); a record is shown only while `IS_USED_LOCK` names its
//!   connection. Waiters cannot be counted; a lock
//!   lives as long as its holder's session (`session`). `release` ends the holder's session
//!   (`KILL CONNECTION`, which needs the holders' user or `CONNECTION ADMIN`): the server frees
//!   its lock and grants it to a waiter at once, and the holder's `lost()` fires at its next
//!   heartbeat; a lock carried on a connection shared with other locks of the same process
//!   (`MysqlOptions::multiplexing`) frees those too, and their holders are told `lost()` as
//!   well. `watch` looks every `--interval`.
//! - **Lock files** (`--file DIR`): a lock is held while its file is locked; its holder wrote
//!   who it is into it. Waiters cannot be counted; without a fixed lease a lock lives as long
//!   as its holder's process (`session`). A file lock cannot be taken from a live process:
//!   `release` is refused (exit 4) and names the process to end. `watch` looks every
//!   `--interval`.
//!
//! # Releasing
//!
//! `release NAME --force` frees the lock at once and wakes its waiters; the holder's guard
//! reports the lock lost (`lost()` completes: on ZooKeeper at once; on Redis at its next
//! renewal, within a third of its lease, but for a fixed `lease` only when that lease ends,
//! since nothing renews it: Redis tells the holder nothing). Without `--force`, `lockctl` asks for confirmation when standard input is a
//! terminal, and refuses otherwise. The lock is freed only if the holder shown is still the
//! holder.
//!
//! # JSON
//!
//! `--json` prints one JSON document on standard output (`watch`: one line per change);
//! errors still go to standard error as text.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | error: the store is unreachable, a command failed |
//! | 2 | usage: bad arguments |
//! | 3 | not found: `show` or `release` of a lock nobody holds |
//! | 4 | refused: `release` without `--force` and not confirmed, the holder changed meanwhile, or the store cannot take a lock from its holder (lock files) |

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use lock_runtime::backend::{BoxFuture, ChangeFeed, ForceRelease, Inspect, LockInfo, LockKind};
use lock_runtime::LockError;
use serde_json::{json, Value};

#[cfg(feature = "redis")]
mod redlock;
mod watch;

/// `lockctl --help`'s closing section.
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  error: the store is unreachable, a command failed
  2  usage: bad arguments
  3  not found: show or release of a lock nobody holds
  4  refused: release without --force and not confirmed, or the holder changed meanwhile

What a store cannot tell is shown as `unknown` (null in JSON). NAME is the lock's key in the
store: the manager's prefix followed by the lock's name, as `list` shows it.";

/// How `lockctl` ends, with its exit code.
#[derive(Debug)]
enum Failure {
    /// 1: the store failed.
    Error(String),
    /// 2: bad arguments found after parsing (no store given).
    Usage(String),
    /// 3: nobody holds the lock.
    NotFound(String),
    /// 4: a release refused.
    Refused(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Error(_) => 1,
            Failure::Usage(_) => 2,
            Failure::NotFound(_) => 3,
            Failure::Refused(_) => 4,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Error(m) | Failure::Usage(m) | Failure::NotFound(m) | Failure::Refused(m) => m,
        }
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Error(e.to_string())
    }
}

fn command() -> Command {
    let prefix =
        || Arg::new("prefix").long("prefix").value_name("P").help("Only keys starting with P").default_value("");
    let name = || Arg::new("name").value_name("NAME").required(true).help("The lock's key (prefix and name)");
    let backend = |id: &'static str, value: &'static str, help: &'static str| {
        Arg::new(id).long(id).value_name(value).help(help).global(true)
    };
    Command::new("lockctl")
        .version(env!("CARGO_PKG_VERSION"))
        .about(
            "Inspect and free the locks of lock-runtime's Redis, Redlock, ZooKeeper, etcd, PostgreSQL, MySQL and \
             lock-file backends",
        )
        .after_help(EXIT_CODES)
        .arg(backend(
            "url",
            "URL",
            "The store, by the URL a manager connects to (LockManager::connect), e.g. redis://127.0.0.1:6379, \
             redlock://a:6379,b:6379,c:6379, zookeeper://zk1:2181, postgres://admin@db/app, file:///var/lock/app",
        ))
        .arg(backend("redis", "URL", "The Redis server, e.g. redis://127.0.0.1:6379"))
        .arg(backend(
            "redis-cluster",
            "URLS",
            "Nodes of a Redis Cluster, comma-separated, e.g. redis://a:7000,redis://b:7001",
        ))
        .arg(backend("redis-sentinel", "URLS", "Redis sentinels, comma-separated; with --master").requires("master"))
        .arg(backend("master", "NAME", "The primary's name at the sentinels (with --redis-sentinel)"))
        .arg(backend(
            "redlock",
            "URLS",
            "Redlock's independent primaries, comma-separated; a lock is held when a quorum names one owner",
        ))
        .arg(backend(
            "etcd",
            "ENDPOINTS",
            "etcd endpoints, comma-separated, e.g. http://127.0.0.1:2379 (user:password@... with RBAC)",
        ))
        .arg(backend("etcd-root", "PATH", "The lock root in etcd (default lock-runtime)"))
        .arg(backend(
            "zookeeper",
            "HOSTS",
            "The ZooKeeper ensemble, e.g. zk1:2181,zk2:2181 (user:password@... for digest auth)",
        ))
        .arg(backend("zk-root", "PATH", "The lock root in ZooKeeper (default /lock-runtime)"))
        .arg(backend("postgres", "URL", "The PostgreSQL server, e.g. postgres://admin@db:5432/app"))
        .arg(backend("mysql", "URL", "The MySQL or MariaDB server, e.g. mysql://admin@db:3306/app"))
        .arg(backend("file", "DIR", "The lock directory of the lock-file backend, e.g. /var/lock/myapp"))
        .arg(backend("tls-ca", "FILE", "Also trust this CA (PEM) for a rediss:// URL"))
        .arg(backend("tls-cert", "FILE", "Client certificate (PEM) for mutual TLS; with --tls-key").requires("tls-key"))
        .arg(backend("tls-key", "FILE", "The client certificate's key (PEM); with --tls-cert").requires("tls-cert"))
        .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).global(true).help("Print JSON"))
        .group(
            ArgGroup::new("store")
                .args([
                    "url",
                    "redis",
                    "redis-cluster",
                    "redis-sentinel",
                    "redlock",
                    "zookeeper",
                    "etcd",
                    "postgres",
                    "mysql",
                    "file",
                ])
                .required(false),
        )
        .subcommand_required(true)
        .subcommand(Command::new("list").about("Lists the held locks").arg(prefix()))
        .subcommand(Command::new("show").about("Shows one lock in detail").arg(name()))
        .subcommand(
            Command::new("release")
                .about("Frees a lock whose holder is gone; its waiters are woken, its holder sees lost()")
                .arg(name())
                .arg(
                    Arg::new("force")
                        .long("force")
                        .action(ArgAction::SetTrue)
                        .help("Release without asking (required when standard input is not a terminal)"),
                ),
        )
        .subcommand(
            Command::new("watch")
                .about("Follows the held locks: a live screen on a terminal, a line per event when piped")
                .arg(prefix())
                .arg(
                    Arg::new("interval")
                        .long("interval")
                        .value_name("MS")
                        .value_parser(clap::value_parser!(u64).range(10..=60_000))
                        .default_value("250")
                        .help("Redis: how often to look for changes Redis does not announce, in milliseconds"),
                )
                .arg(
                    Arg::new("count")
                        .long("count")
                        .value_name("N")
                        .value_parser(clap::value_parser!(u64).range(1..))
                        .help("Exit after N views (the first one included)"),
                ),
        )
}

fn main() -> ExitCode {
    let matches = match command().try_get_matches() {
        Ok(matches) => matches,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(&matches)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("lockctl: {}", failure.message());
            ExitCode::from(failure.code())
        }
    }
}

/// Connects to the store the command line names, as the inspection capability every backend
/// that `lockctl` speaks implements: nothing below knows which store it is.
async fn connect(matches: &ArgMatches) -> Result<Box<dyn Inspect>, Failure> {
    if let Some(url) = matches.get_one::<String>("url") {
        return connect_url(url, matches).await;
    }
    let stores =
        ["redis", "redis-cluster", "redis-sentinel", "redlock", "zookeeper", "etcd", "postgres", "mysql", "file"];
    if !stores.iter().any(|id| matches.contains_id(id)) {
        // No store on the command line: the environment's `LOCKCTL_URL`.
        return match std::env::var("LOCKCTL_URL") {
            Ok(url) if !url.trim().is_empty() => connect_url(&url, matches).await,
            _ => Err(Failure::Usage(
                "no store given: --url URL (or LOCKCTL_URL in the environment), --redis URL, --zookeeper HOSTS, …; \
                 see --help"
                    .into(),
            )),
        };
    }
    if let Some(url) = matches.get_one::<String>("redis") {
        #[cfg(feature = "redis")]
        {
            let options = redis_options(matches)?;
            return Ok(Box::new(lock_runtime::backend::redis::RedisBackend::connect_with(url, options).await?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::Error(format!(
            "built without the `redis` feature (build it with `--features redis`): cannot use {url}"
        )));
    }
    if let Some(urls) = matches.get_one::<String>("redis-cluster") {
        #[cfg(feature = "redis")]
        {
            let options = redis_options(matches)?;
            return Ok(Box::new(lock_runtime::backend::redis::RedisBackend::cluster(list(urls), options).await?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::Error(format!(
            "built without the `redis` feature (build it with `--features redis`): cannot use {urls}"
        )));
    }
    if let Some(urls) = matches.get_one::<String>("redis-sentinel") {
        let master = matches.get_one::<String>("master").map_or("", String::as_str);
        #[cfg(feature = "redis")]
        {
            let options = redis_options(matches)?;
            let backend = lock_runtime::backend::redis::RedisBackend::sentinel(list(urls), master, options).await?;
            return Ok(Box::new(backend));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::Error(format!(
            "built without the `redis` feature (build it with `--features redis`): cannot use {urls} ({master})"
        )));
    }
    if let Some(urls) = matches.get_one::<String>("redlock") {
        #[cfg(feature = "redis")]
        {
            let options = redis_options(matches)?;
            return Ok(Box::new(redlock::Quorum::connect(&list(urls), options).await?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::Error(format!(
            "built without the `redis` feature (build it with `--features redis`): cannot use {urls}"
        )));
    }
    if let Some(endpoints) = matches.get_one::<String>("etcd") {
        #[cfg(feature = "etcd")]
        {
            use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
            let mut options = EtcdOptions::new();
            if let Some(root) = matches.get_one::<String>("etcd-root") {
                options = options.root(root.as_str());
            }
            // `user:password@endpoint,...`: the RBAC user.
            let endpoints = match endpoints.rsplit_once('@') {
                Some((credentials, endpoints)) => {
                    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
                    options = options.credentials(user, password);
                    endpoints
                }
                None => endpoints.as_str(),
            };
            if let Some(tls) = tls_options(matches)? {
                #[cfg(feature = "tls")]
                {
                    options = options.tls(tls);
                }
                #[cfg(not(feature = "tls"))]
                let () = tls;
            }
            return Ok(Box::new(EtcdBackend::connect_with(list(endpoints), options).await?));
        }
        #[cfg(not(feature = "etcd"))]
        return Err(Failure::Error(format!(
            "built without the `etcd` feature (build it with `--features etcd`): cannot use {endpoints}"
        )));
    }
    if let Some(url) = matches.get_one::<String>("postgres") {
        #[cfg(feature = "postgres")]
        {
            use lock_runtime::backend::postgres::{PostgresBackend, PostgresOptions};
            #[allow(unused_mut)]
            let mut options = PostgresOptions::new();
            if let Some(tls) = tls_options(matches)? {
                #[cfg(feature = "tls")]
                {
                    options = options.tls(tls);
                }
                #[cfg(not(feature = "tls"))]
                let () = tls;
            }
            return Ok(Box::new(PostgresBackend::connect_with(url, options).await?));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(Failure::Error(format!(
            "built without the `postgres` feature (build it with `--features postgres`): cannot use {url}"
        )));
    }
    if let Some(url) = matches.get_one::<String>("mysql") {
        #[cfg(feature = "mysql")]
        {
            use lock_runtime::backend::mysql::{MysqlBackend, MysqlOptions};
            #[allow(unused_mut)]
            let mut options = MysqlOptions::new();
            if let Some(tls) = tls_options(matches)? {
                #[cfg(feature = "tls")]
                {
                    options = options.tls(tls);
                }
                #[cfg(not(feature = "tls"))]
                let () = tls;
            }
            return Ok(Box::new(MysqlBackend::connect_with(url, options).await?));
        }
        #[cfg(not(feature = "mysql"))]
        return Err(Failure::Error(format!(
            "built without the `mysql` feature (build it with `--features mysql`): cannot use {url}"
        )));
    }
    if tls_given(matches) {
        return Err(Failure::Error(
            "--tls-ca, --tls-cert and --tls-key are for Redis, etcd, PostgreSQL and MySQL (lockctl reaches ZooKeeper \
             and lock files without TLS)"
                .into(),
        ));
    }
    if let Some(dir) = matches.get_one::<String>("file") {
        if !std::path::Path::new(dir).is_dir() {
            return Err(Failure::Error(format!(
                "{dir} is not a directory (a lock directory is made by its first manager)"
            )));
        }
        return Ok(Box::new(lock_runtime::backend::file::FileBackend::open(dir)?));
    }
    let hosts = matches.get_one::<String>("zookeeper").map_or("", String::as_str);
    #[cfg(feature = "zookeeper")]
    {
        use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
        let mut options = ZookeeperOptions::new().operation_timeout(Duration::from_secs(5));
        if let Some(root) = matches.get_one::<String>("zk-root") {
            options = options.root(root.as_str());
        }
        // `user:password@host:port,...`: ZooKeeper's digest identity (locks made under one can
        // only be released under the same).
        let hosts = match hosts.rsplit_once('@') {
            Some((credentials, hosts)) => {
                let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
                options = options.digest_auth(user, password);
                hosts
            }
            None => hosts,
        };
        Ok(Box::new(ZookeeperBackend::connect_with(hosts, options).await?))
    }
    #[cfg(not(feature = "zookeeper"))]
    Err(Failure::Error(format!(
        "built without the `zookeeper` feature (build it with `--features zookeeper`): cannot use {hosts}"
    )))
}

/// `--url URL`: the backend `LockManager::connect(URL)` would use, seen through its
/// inspection; Redlock's nodes as one quorum.
async fn connect_url(url: &str, matches: &ArgMatches) -> Result<Box<dyn Inspect>, Failure> {
    if tls_given(matches) {
        return Err(Failure::Error(
            "--tls-ca, --tls-cert and --tls-key go with --redis, --etcd, --postgres or --mysql; with --url, give TLS in the \
             URL (rediss://, etcd+https://, postgres://…?sslmode=verify-full&sslrootcert=FILE)"
                .into(),
        ));
    }
    let scheme = url.trim().split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    if matches!(scheme.as_deref(), Some("redlock" | "redis+redlock" | "rediss+redlock")) {
        let nodes = lock_runtime::backend::url::redis_nodes(url)?;
        #[cfg(feature = "redis")]
        {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let options = lock_runtime::backend::redis::RedisOptions::default();
            return Ok(Box::new(redlock::Quorum::connect(&nodes, options).await?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::Error(format!(
            "built without the `redis` feature (build it with `--features redis`): cannot use {} nodes",
            nodes.len()
        )));
    }
    if scheme.as_deref() == Some("memory") {
        return Err(Failure::Error(
            "memory:// locks live inside one process: there is nothing to see from here".into(),
        ));
    }
    let backend = lock_runtime::backend::url::connect(url).await?;
    if backend.inspector().is_none() {
        return Err(Failure::Error(format!("the {} backend cannot be inspected", backend.name())));
    }
    Ok(Box::new(Inspected(backend)))
}

/// A backend known to have an inspector, as that inspector.
struct Inspected(Box<dyn lock_runtime::backend::LockBackend>);

impl Inspected {
    fn inspector(&self) -> &dyn Inspect {
        self.0.inspector().expect("checked at connect")
    }
}

impl Inspect for Inspected {
    fn store(&self) -> &'static str {
        self.inspector().store()
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        self.inspector().list(prefix)
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        self.inspector().inspect(key)
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        self.inspector().force_release(key, expected_owner)
    }

    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        self.inspector().changes(prefix)
    }

    fn changes_of<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        self.inspector().changes_of(key)
    }
}

/// The comma-separated items of `text` (URLs, endpoints), trimmed, empty ones left out.
#[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
fn list(text: &str) -> Vec<&str> {
    text.split(',').map(str::trim).filter(|item| !item.is_empty()).collect()
}

/// Whether `--tls-ca` or `--tls-cert` is given.
fn tls_given(matches: &ArgMatches) -> bool {
    matches.get_one::<String>("tls-ca").is_some() || matches.get_one::<String>("tls-cert").is_some()
}

/// The TLS settings of `--tls-ca`, `--tls-cert` and `--tls-key`, if any is given.
#[cfg(feature = "tls")]
#[cfg_attr(not(any(feature = "redis", feature = "postgres", feature = "mysql", feature = "etcd")), allow(dead_code))]
fn tls_options(matches: &ArgMatches) -> Result<Option<lock_runtime::TlsOptions>, Failure> {
    if !tls_given(matches) {
        return Ok(None);
    }
    let file = |id: &str| matches.get_one::<String>(id);
    let mut tls = lock_runtime::TlsOptions::new();
    if let Some(ca) = file("tls-ca") {
        tls = tls.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (file("tls-cert"), file("tls-key")) {
        tls = tls.client_cert_files(cert, key);
    }
    Ok(Some(tls))
}

/// Without the feature `tls`, `--tls-*` are refused.
#[cfg(not(feature = "tls"))]
#[cfg_attr(not(any(feature = "redis", feature = "postgres", feature = "mysql", feature = "etcd")), allow(dead_code))]
fn tls_options(matches: &ArgMatches) -> Result<Option<()>, Failure> {
    if tls_given(matches) {
        return Err(Failure::Error("built without the `tls` feature: --tls-* cannot be used".into()));
    }
    Ok(None)
}

/// The Redis options of the command line (its TLS settings).
#[cfg(feature = "redis")]
fn redis_options(matches: &ArgMatches) -> Result<lock_runtime::backend::redis::RedisOptions, Failure> {
    #[allow(unused_mut)]
    let mut options = lock_runtime::backend::redis::RedisOptions::default();
    if let Some(tls) = tls_options(matches)? {
        #[cfg(feature = "tls")]
        {
            options = options.tls(tls);
        }
        #[cfg(not(feature = "tls"))]
        let () = tls;
    }
    Ok(options)
}

async fn run(matches: &ArgMatches) -> Result<(), Failure> {
    let json = matches.get_flag("json");
    let store = connect(matches).await?;
    let store = &*store;
    let mut out = std::io::stdout().lock();
    let print = |out: &mut std::io::StdoutLock<'_>, text: &str| {
        out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|e| Failure::Error(format!("stdout: {e}")))
    };
    match matches.subcommand() {
        Some(("list", sub)) => {
            let prefix = sub.get_one::<String>("prefix").map_or("", String::as_str);
            let locks = store.list(prefix).await?;
            let text = if json { format!("{}\n", list_json(store, &locks)) } else { table(&locks) };
            print(&mut out, &text)
        }
        Some(("show", sub)) => {
            let name = sub.get_one::<String>("name").map_or("", String::as_str);
            let info = store.inspect(name).await?.ok_or_else(|| Failure::NotFound(format!("`{name}` is not held")))?;
            let text = if json { format!("{}\n", lock_json(&info)) } else { details(store.store(), &info) };
            print(&mut out, &text)
        }
        Some(("release", sub)) => {
            let name = sub.get_one::<String>("name").map_or("", String::as_str);
            let info = store.inspect(name).await?.ok_or_else(|| Failure::NotFound(format!("`{name}` is not held")))?;
            if !sub.get_flag("force") {
                confirm(&info)?;
            }
            // A store that cannot take a lock from its holder (lock files) refuses: exit 4.
            let released = store.force_release(name, Some(&info.owner)).await.map_err(|e| {
                if e.is_invalid() {
                    Failure::Refused(e.to_string())
                } else {
                    Failure::from(e)
                }
            })?;
            match released {
                ForceRelease::Released(owner) => {
                    let text = if json {
                        format!("{}\n", json!({ "released": name, "owner": owner, "holder": holder_json(&info) }))
                    } else {
                        format!("released `{name}` (held by {})\n", holder_text(&info))
                    };
                    print(&mut out, &text)
                }
                ForceRelease::NotHeld => Err(Failure::NotFound(format!("`{name}` is not held any more"))),
                ForceRelease::OwnerChanged(owner) => Err(Failure::Refused(format!(
                    "`{name}` changed hands meanwhile (now owner {owner}): left alone; look again"
                ))),
            }
        }
        Some(("watch", sub)) => {
            let prefix = sub.get_one::<String>("prefix").map_or("", String::as_str);
            let interval = Duration::from_millis(sub.get_one::<u64>("interval").copied().unwrap_or(250));
            let count = sub.get_one::<u64>("count").copied();
            let mode = match (json, std::io::stdout().is_terminal()) {
                (true, _) => watch::Mode::Json,
                (false, true) => watch::Mode::Screen,
                (false, false) => watch::Mode::Lines,
            };
            watch::watch(store, prefix, interval, count, mode, |text| print(&mut out, text)).await
        }
        _ => Err(Failure::Error("no command given (see lockctl --help)".to_owned())),
    }
}

/// Asks on the terminal whether to release; refuses when standard input is not one.
fn confirm(info: &LockInfo) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::Refused(format!(
            "refusing to release `{}` (held by {}) without --force: standard input is not a terminal",
            info.key,
            holder_text(info)
        )));
    }
    eprint!("Release `{}`, held by {} (token {})? [y/N] ", info.key, holder_text(info), opt(info.fencing_token));
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer).map_err(|e| Failure::Error(format!("stdin: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::Refused(format!("`{}` left alone", info.key)))
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

fn age_text(info: &LockInfo) -> String {
    match info.age {
        Some(age) if info.age_at_most => format!("≤{}", duration(age)),
        Some(age) => duration(age),
        None => "unknown".to_owned(),
    }
}

fn lease_text(info: &LockInfo) -> String {
    match info.remaining_lease {
        Some(left) => duration(left),
        None if info.session_bound => "session".to_owned(),
        None => "unknown".to_owned(),
    }
}

fn waiters_text(info: &LockInfo) -> String {
    match info.waiters {
        Some(n) => n.to_string(),
        None => {
            let mut text = "unknown".to_owned();
            let mut notes = Vec::new();
            if let Some(marked) = info.waited_on {
                notes.push(if marked { "waited on" } else { "not waited on" }.to_owned());
            }
            if let Some(subs) = info.subscribers {
                notes.push(format!("{subs} subscribed"));
            }
            if let Some(queued) = info.queued {
                notes.push(format!("{queued} queued"));
            }
            if !notes.is_empty() {
                let _ = write!(text, " ({})", notes.join(", "));
            }
            text
        }
    }
}

/// The kind of lock: `mutex`, `read`, `write`, `semaphore` (of N permits), `unknown`.
fn kind_text(info: &LockInfo) -> String {
    match info.kind {
        Some(LockKind::Exclusive) => "mutex".to_owned(),
        Some(LockKind::Read) => "read".to_owned(),
        Some(LockKind::Write) => "write".to_owned(),
        Some(LockKind::Semaphore { permits }) => format!("semaphore of {permits}"),
        Some(_) | None => "unknown".to_owned(),
    }
}

fn holder_text(info: &LockInfo) -> String {
    let holder = match &info.holder {
        Some(h) => h.to_string(),
        None => format!("unknown (owner {})", info.owner),
    };
    if info.unclaimed {
        format!("{holder} (granted, not claimed yet)")
    } else {
        holder
    }
}

/// The `list` table.
fn table(locks: &[LockInfo]) -> String {
    let header = ["NAME", "KIND", "HOLDER", "TOKEN", "AGE", "LEASE LEFT", "WAITERS"].map(str::to_owned);
    let rows: Vec<[String; 7]> = locks
        .iter()
        .map(|l| {
            let (token, age, lease) = (opt(l.fencing_token), age_text(l), lease_text(l));
            [l.key.clone(), kind_text(l), holder_text(l), token, age, lease, waiters_text(l)]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    if rows.is_empty() {
        out.push_str("(no lock held)\n");
    }
    out
}

/// The `show` text.
fn details(kind: &str, info: &LockInfo) -> String {
    let holder = info.holder.as_ref();
    let mut fields = vec![
        ("name", info.key.clone()),
        ("kind", kind_text(info)),
        ("store", kind.to_owned()),
        ("owner", info.owner.clone()),
        ("host", opt(holder.map(|h| h.host()))),
        ("pid", opt(holder.and_then(|h| h.pid()))),
        (
            "label",
            match holder {
                Some(h) => h.label().unwrap_or("(none)").to_owned(),
                None => "unknown".to_owned(),
            },
        ),
        ("fencing token", opt(info.fencing_token)),
        ("age", age_text(info)),
        ("lease left", lease_text(info)),
        ("waiters", waiters_text(info)),
    ];
    if info.waiters.is_none() {
        fields.push(("", "(waiters in other processes cannot be counted by this store)".to_owned()));
    }
    let mut out = String::new();
    for (k, v) in fields {
        let label = if k.is_empty() { String::new() } else { format!("{k}:") };
        let _ = writeln!(out, "{label:<15}{v}");
    }
    out
}

fn holder_json(info: &LockInfo) -> Value {
    match &info.holder {
        Some(h) => json!({ "host": h.host(), "pid": h.pid(), "label": h.label() }),
        None => Value::Null,
    }
}

fn millis(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

fn lock_json(info: &LockInfo) -> Value {
    json!({
        "name": info.key,
        "kind": info.kind.map(|_| kind_text(info)),
        "owner": info.owner,
        "holder": holder_json(info),
        "fencing_token": info.fencing_token,
        "age_ms": millis(info.age),
        "age_at_most": info.age_at_most,
        "remaining_lease_ms": millis(info.remaining_lease),
        "session_bound": info.session_bound,
        "waiters": info.waiters,
        "waited_on": info.waited_on,
        "subscribers": info.subscribers,
        "queued": info.queued,
        "unclaimed": info.unclaimed,
    })
}

fn list_json(store: &dyn Inspect, locks: &[LockInfo]) -> Value {
    json!({ "store": store.store(), "locks": locks.iter().map(lock_json).collect::<Vec<_>>() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
        // No store on the command line parses: `LOCKCTL_URL` may name it (`connect` refuses
        // when it does not).
        assert!(command().try_get_matches_from(["lockctl", "list"]).is_ok(), "a store may come from LOCKCTL_URL");
        let both = command().try_get_matches_from(["lockctl", "--redis", "r", "--zookeeper", "z", "list"]);
        assert!(both.is_err(), "one store at a time");
        let m = command().try_get_matches_from(["lockctl", "--redis", "r", "show", "x", "--json"]).expect("parses");
        assert!(m.get_flag("json"));
    }

    #[test]
    fn unknowns_are_shown_as_such() {
        let info = LockInfo::new("k", "0a-1");
        assert_eq!(holder_text(&info), "unknown (owner 0a-1)");
        assert_eq!(
            (age_text(&info), lease_text(&info), waiters_text(&info)),
            ("unknown".into(), "unknown".into(), "unknown".into())
        );
        let text = table(std::slice::from_ref(&info));
        assert!(text.starts_with("NAME  KIND") && text.contains("unknown (owner 0a-1)"), "{text}");
        assert_eq!(lock_json(&info)["kind"], Value::Null);
        let mut read = info.clone();
        read.kind = Some(LockKind::Read);
        assert_eq!((kind_text(&read), lock_json(&read)["kind"].clone()), ("read".to_owned(), json!("read")));
        assert_eq!(lock_json(&info)["fencing_token"], Value::Null);
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_secs(75)), "1m15s");
    }
}
