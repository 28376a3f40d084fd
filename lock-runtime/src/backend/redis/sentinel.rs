#![doc = include_str!("sentinel.md")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, Pipeline, RedisConnectionInfo, RedisError, RedisFuture,
    RedisResult, Value,
};

use super::options::RedisOptions;
use super::options::KIND;
use super::url::{self, redact};
use crate::error::LockError;

/// How many subscriptions are remembered for ending them after a switch.
const MAX_SUBSCRIBERS: usize = 64;
/// Longest pause before reconnecting to a sentinel for its announcements.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A `host:port` of a data node.
type Addr = (String, u16);

/// The TLS client of the pub/sub connections to the primary (see [`Shared`]): `None` when
/// the sentinels' URLs are `redis://` ones.
#[cfg(feature = "_tls")]
type Tls = Option<tokio_rustls::TlsConnector>;
#[cfg(not(feature = "_tls"))]
type Tls = Option<std::convert::Infallible>;

/// The [`Tls`] of the sentinels at `infos`: TLS with `options`' settings (or the platform's
/// roots alone) when they are `rediss://` ones.
#[cfg(feature = "_tls")]
fn tls_of(infos: &[ConnectionInfo], options: &RedisOptions, shown: &str) -> Result<Tls, LockError> {
    match infos.first().map(ConnectionInfo::addr) {
        Some(redis::ConnectionAddr::TcpTls { .. }) => {
            let settings = options.get_tls().cloned().unwrap_or_default();
            Ok(Some(tokio_rustls::TlsConnector::from(settings.load(shown)?.config)))
        }
        _ => Ok(None),
    }
}

#[cfg(not(feature = "_tls"))]
fn tls_of(_: &[ConnectionInfo], _: &RedisOptions, _: &str) -> Result<Tls, LockError> {
    Ok(None)
}

/// The command connection and subscription source of a Sentinel-managed primary. Cheap to
/// clone (clones share the connection).
#[derive(Clone)]
pub(super) struct SentinelConn(Arc<Shared>);

struct Shared {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    /// How data nodes are reached, but for their address: the first sentinel's credentials
    /// and TLS settings (see [`node_info`]).
    node: ConnectionInfo,
    /// The TLS client of the pub/sub connections, made here (see [`SentinelConn::pubsub`]).
    #[cfg_attr(not(feature = "_tls"), allow(dead_code))]
    tls: Tls,
    timeout: Duration,
    current: Mutex<Option<Primary>>,
    /// Held while resolving, so concurrent commands share one resolution.
    resolving: tokio::sync::Mutex<()>,
    /// The last primary connected to, to notice a switch.
    last: Mutex<Option<Addr>>,
    /// This backend's subscriptions: on which primary, from which local address.
    subscribers: Mutex<Vec<(Addr, SocketAddr)>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Dropped with this, which stops the announcement listener.
    _stop: tokio::sync::watch::Sender<()>,
}

#[derive(Clone)]
struct Primary {
    id: u64,
    addr: Addr,
    conn: MultiplexedConnection,
}

enum Req<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

enum Reply {
    One(Value),
    Many(Vec<Value>),
}

fn error(msg: String) -> RedisError {
    RedisError::from(std::io::Error::other(msg))
}

fn timed_out(what: &str, timeout: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: no answer within {timeout:?}")))
}

fn is_readonly_value(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => e.code() == "READONLY" || e.details().is_some_and(|d| d.contains("READONLY")),
        _ => false,
    }
}

fn is_readonly(e: &RedisError) -> bool {
    e.code() == Some("READONLY") || e.to_string().contains("READONLY")
}

/// An error after which the connection is not trusted any longer.
fn drops_connection(e: &RedisError) -> bool {
    !matches!(e.kind(), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension) || is_readonly(e)
}

impl SentinelConn {
    /// Checks the input and starts the announcement listener; connects nothing yet.
    fn new(sentinels: Vec<ConnectionInfo>, master: String, options: &RedisOptions, tls: Tls) -> Self {
        let (timeout, ping) = (options.get_command_timeout(), options.get_ping_interval());
        let settings = RedisConnectionInfo::default();
        let first = sentinels[0].redis_settings();
        let settings = match first.username() {
            Some(user) => settings.set_username(user),
            None => settings,
        };
        let settings = match first.password() {
            Some(password) => settings.set_password(password),
            None => settings,
        };
        let node = sentinels[0].clone().set_redis_settings(settings);
        let (stop, stopped) = tokio::sync::watch::channel(());
        let shared = Arc::new(Shared {
            sentinels,
            master,
            node,
            tls,
            timeout,
            current: Mutex::new(None),
            resolving: tokio::sync::Mutex::new(()),
            last: Mutex::new(None),
            subscribers: Mutex::new(Vec::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            _stop: stop,
        });
        tokio::spawn(listen(
            Arc::downgrade(&shared),
            shared.sentinels.clone(),
            shared.master.clone(),
            timeout,
            ping,
            stopped,
        ));
        SentinelConn(shared)
    }

    /// The primary's address as the sentinels see it, asked in turn.
    async fn resolve(&self) -> RedisResult<Addr> {
        let s = &self.0;
        let count = u32::try_from(s.sentinels.len()).unwrap_or(u32::MAX).max(1);
        let share = (s.timeout / count).max(Duration::from_millis(100)).min(s.timeout);
        let mut failures = Vec::new();
        let mut unknown = 0;
        for sentinel in &s.sentinels {
            match tokio::time::timeout(share, ask(sentinel, &s.master, share)).await {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => unknown += 1,
                Ok(Err(e)) => failures.push(format!("{}: {e}", sentinel.addr())),
                Err(_) => failures.push(format!("{}: no answer within {share:?}", sentinel.addr())),
            }
        }
        if unknown > 0 {
            Err(error(format!("{unknown} sentinel(s) know no master named `{}`; {}", s.master, failures.join("; "))))
        } else {
            Err(error(format!("no sentinel reachable ({})", failures.join("; "))))
        }
    }

    /// A connection to the current primary, checked with `ROLE`.
    async fn connect(&self) -> RedisResult<Primary> {
        let s = &self.0;
        let addr = self.resolve().await?;
        let info = node_info(&addr, &s.node)?;
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(s.timeout)).set_response_timeout(Some(s.timeout));
        let mut conn = Client::open(info)?.get_multiplexed_async_connection_with_config(&config).await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        let role = match role.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        if role != "master" {
            return Err(error(format!(
                "the sentinels name {}:{} as primary of `{}`, but it is a {role} (a failover is under way)",
                addr.0, addr.1, s.master
            )));
        }
        let id = s.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let switched = {
            let mut last = s.last.lock().unwrap_or_else(|p| p.into_inner());
            let switched = last.as_ref().is_some_and(|old| *old != addr);
            *last = Some(addr.clone());
            switched
        };
        if switched {
            tracing::info!(master = %s.master, "redis sentinel: primary is now {}:{}", addr.0, addr.1);
            s.end_subscriptions_off(&addr);
        }
        Ok(Primary { id, addr, conn })
    }

    /// The connection to the current primary, resolved when there is none.
    async fn primary(&self) -> RedisResult<Primary> {
        if let Some(p) = self.0.current() {
            return Ok(p);
        }
        let _resolving = self.0.resolving.lock().await;
        if let Some(p) = self.0.current() {
            return Ok(p);
        }
        let p = self.connect().await?;
        *self.0.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.clone());
        Ok(p)
    }

    async fn send(&self, req: Req<'_>) -> RedisResult<Reply> {
        let timeout = self.0.timeout;
        let mut used = None;
        let work = async {
            let mut again = true;
            loop {
                let p = self.primary().await?;
                used = Some(p.id);
                let mut conn = p.conn.clone();
                let reply = match req {
                    Req::One(cmd) => conn.req_packed_command(cmd).await.map(Reply::One),
                    Req::Many(pipeline, offset, count) => {
                        conn.req_packed_commands(pipeline, offset, count).await.map(Reply::Many)
                    }
                };
                let readonly = match &reply {
                    Ok(Reply::One(v)) => is_readonly_value(v),
                    Ok(Reply::Many(vs)) => vs.iter().any(is_readonly_value),
                    Err(e) => is_readonly(e),
                };
                let dropped = matches!(&reply, Err(e) if super::resend::dropped(e));
                if readonly || dropped {
                    // Refused without writing, or the connection found closed (the command is
                    // idempotent for its owner: see `resend.rs`): resolve again and send
                    // once more.
                    self.0.forget(p.id);
                    if std::mem::take(&mut again) {
                        continue;
                    }
                } else if let Err(e) = &reply {
                    if drops_connection(e) {
                        self.0.forget(p.id);
                    }
                }
                return reply;
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(reply) => reply,
            Err(_) => {
                if let Some(id) = used {
                    self.0.forget(id);
                }
                Err(timed_out("redis sentinel command", timeout))
            }
        }
    }

    /// A pub/sub connection to the current primary, remembered so that a switch ends it.
    pub(super) async fn pubsub(&self) -> RedisResult<PubSub> {
        let p = self.primary().await?;
        let stream = tokio::net::TcpStream::connect((p.addr.0.as_str(), p.addr.1)).await?;
        stream.set_nodelay(true)?;
        let local = stream.local_addr()?;
        // Made here (not by the `redis` crate) to know its local address.
        let settings = self.0.node.redis_settings();
        #[cfg(feature = "_tls")]
        let pubsub = match &self.0.tls {
            Some(tls) => {
                let host = rustls::pki_types::ServerName::try_from(p.addr.0.clone())
                    .map_err(|e| error(format!("`{}` is not a TLS server name: {e}", p.addr.0)))?;
                PubSub::new(settings, tls.connect(host, stream).await?).await?
            }
            None => PubSub::new(settings, stream).await?,
        };
        #[cfg(not(feature = "_tls"))]
        let pubsub = PubSub::new(settings, stream).await?;
        let mut subscribers = self.0.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        if subscribers.len() >= MAX_SUBSCRIBERS {
            subscribers.remove(0);
        }
        subscribers.push((p.addr, local));
        Ok(pubsub)
    }
}

impl Shared {
    fn current(&self) -> Option<Primary> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Drops connection `id` if it is still the current one.
    fn forget(&self, id: u64) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|p| p.id == id) {
            *current = None;
        }
    }

    /// The sentinels announced (or were seen to name) `primary`.
    fn switched(&self, primary: &Addr) {
        {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if current.as_ref().is_some_and(|p| p.addr != *primary) {
                *current = None;
            }
        }
        self.end_subscriptions_off(primary);
    }

    /// Ends this backend's subscriptions on any other server than `primary` (best effort, in
    /// the background, each bounded by the command timeout).
    fn end_subscriptions_off(&self, primary: &Addr) {
        let stale: Vec<(Addr, SocketAddr)> = {
            let mut subscribers = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
            let (stale, keep) = subscribers.drain(..).partition(|(addr, _)| addr != primary);
            *subscribers = keep;
            stale
        };
        for (addr, local) in stale {
            let Ok(info) = node_info(&addr, &self.node) else { continue };
            let timeout = self.timeout;
            tokio::spawn(async move {
                let kill = async {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout));
                    let mut conn = Client::open(info)?.get_multiplexed_async_connection_with_config(&config).await?;
                    redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("ADDR")
                        .arg(local.to_string())
                        .query_async::<Value>(&mut conn)
                        .await
                };
                match tokio::time::timeout(timeout, kill).await {
                    Ok(Ok(_)) => tracing::debug!("ended a subscription on the old primary {}:{}", addr.0, addr.1),
                    outcome => tracing::debug!(
                        "could not end a subscription on the old primary {}:{} (gone already?): {}",
                        addr.0,
                        addr.1,
                        match outcome {
                            Ok(Err(e)) => e.to_string(),
                            _ => "no answer".to_owned(),
                        }
                    ),
                }
            });
        }
    }
}

/// The data node at `addr`, reached as `node` says (the sentinels' TLS settings, their
/// credentials, database 0).
fn node_info(addr: &Addr, node: &ConnectionInfo) -> RedisResult<ConnectionInfo> {
    Ok(url::at(node, &addr.0, addr.1))
}

/// One sentinel's answer: the primary's address, or `None` if it knows no such master.
async fn ask(sentinel: &ConnectionInfo, master: &str, timeout: Duration) -> RedisResult<Option<Addr>> {
    let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
    let mut conn = Client::open(sentinel.clone())?.get_multiplexed_async_connection_with_config(&config).await?;
    let reply: Option<(String, String)> =
        redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).query_async(&mut conn).await?;
    match reply {
        None => Ok(None),
        Some((host, port)) => match port.parse() {
            Ok(port) => Ok(Some((host, port))),
            Err(_) => Err(error(format!("the sentinel answered a malformed port `{port}`"))),
        },
    }
}

/// Listens for `+switch-master` of `master` on one sentinel at a time (the next after a loss)
/// until the backend is dropped; checks the primary's address on every (re)connection.
async fn listen(
    shared: Weak<Shared>,
    sentinels: Vec<ConnectionInfo>,
    master: String,
    timeout: Duration,
    ping: Duration,
    mut stopped: tokio::sync::watch::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut next = 0;
    loop {
        let sentinel = &sentinels[next % sentinels.len()];
        next += 1;
        let subscribe = async {
            let client = Client::open(sentinel.clone())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            let addr = ask(sentinel, &master, timeout).await?;
            Ok::<_, RedisError>((pubsub, addr))
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, subscribe) => outcome,
            _ = stopped.changed() => return,
        };
        let pubsub = match outcome {
            Ok(Ok((pubsub, addr))) => {
                backoff = Duration::from_millis(50);
                if let (Some(addr), Some(shared)) = (addr, shared.upgrade()) {
                    shared.switched(&addr);
                }
                pubsub
            }
            _ => {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped.changed() => return,
                }
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { break };
                    // `<master name> <old ip> <old port> <new ip> <new port>`
                    let payload: String = msg.get_payload().unwrap_or_default();
                    let parts: Vec<&str> = payload.split(' ').collect();
                    if let [name, _, _, ip, port] = parts[..] {
                        if name == master {
                            if let (Ok(port), Some(shared)) = (port.parse(), shared.upgrade()) {
                                tracing::info!(master = %master, "redis sentinel announced a switch to {ip}:{port}");
                                shared.switched(&(ip.to_owned(), port));
                            }
                        }
                    }
                }
                _ = tokio::time::sleep(ping) => {
                    if !matches!(tokio::time::timeout(timeout, sink.ping::<Value>()).await, Ok(Ok(_))) {
                        break;
                    }
                }
                _ = stopped.changed() => return,
            }
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.send(Req::One(cmd)).await? {
                Reply::One(v) => Ok(v),
                Reply::Many(_) => Err(error("one reply expected".to_owned())),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.send(Req::Many(pipeline, offset, count)).await? {
                Reply::Many(v) => Ok(v),
                Reply::One(_) => Err(error("several replies expected".to_owned())),
            }
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Checks the sentinel URLs and the master name.
fn check(given: &[&str], master: &str, options: &RedisOptions) -> Result<(Vec<ConnectionInfo>, String), LockError> {
    let shown = format!("{master} via {}", given.iter().map(|u| redact(u)).collect::<Vec<_>>().join(","));
    if given.is_empty() {
        return Err(LockError::invalid(shown, "no sentinel given: pass at least one `redis://host:port` URL"));
    }
    if master.trim().is_empty() {
        return Err(LockError::invalid(shown, "the master name is empty: pass the name the sentinels monitor"));
    }
    let mut infos = Vec::with_capacity(given.len());
    for url in given {
        infos.push(url::connection_info(url, options, "`redis://127.0.0.1:26379` (a sentinel)")?);
    }
    Ok((infos, shown))
}

/// Connects to the primary the sentinels at `given` name `master_name` (see
/// `RedisBackend::sentinel`): its connection (also the source of pub/sub connections), the
/// primary as shown in messages, and the runtime.
pub(super) async fn connect(
    given: &[&str],
    master_name: &str,
    options: &RedisOptions,
) -> Result<(SentinelConn, String, tokio::runtime::Handle), LockError> {
    let (infos, shown) = check(given, master_name, options)?;
    let tls = tls_of(&infos, options, &shown)?;
    if let Some(problem) = options.problem() {
        return Err(LockError::invalid(shown, problem));
    }
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| LockError::invalid(&shown, format!("the Redis backend needs a tokio runtime ({e})")))?;
    let timeout = options.get_command_timeout();
    let conn = {
        let _entered = runtime.enter();
        SentinelConn::new(infos, master_name.to_owned(), options, tls)
    };
    match tokio::time::timeout(timeout, conn.primary()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
        Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
    }
    Ok((conn, shown, runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_invalid() {
        let none: [&str; 0] = [];
        let options = RedisOptions::default();
        assert!(check(&none, "mymaster", &options).unwrap_err().is_invalid());
        assert!(check(&["redis://127.0.0.1:26379"], " ", &options).unwrap_err().is_invalid());
        assert!(check(&["not a url"], "mymaster", &options).unwrap_err().is_invalid());
        assert!(check(&["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"], "mymaster", &options).is_ok());
    }

    #[test]
    fn readonly_answers_are_recognised() {
        let e = RedisError::from((redis::ErrorKind::Io, "x"));
        assert!(drops_connection(&e));
        assert!(!is_readonly(&e));
    }
}
