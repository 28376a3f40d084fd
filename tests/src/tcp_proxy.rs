//! A loopback TCP proxy for fault injection between a client and a server: it can stop
//! forwarding on some connections without closing them (a connection that died silently, as in
//! a network partition), and hold everything clients send until told to let it through (a
//! request that is on the wire but not answered yet). For the fault suite it can also
//! black-hole every connection, present and future, in both directions (a partition: nothing
//! is forwarded or closed until `heal()`, then what was in flight is delivered, as
//! TCP would after retransmitting) and delay what it forwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// A proxy listening on a free loopback port, forwarding to `127.0.0.1:<target>`. Its tasks
/// run on the current tokio runtime and stop when it is dropped (closing every connection).
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: AbortHandle,
}

#[derive(Debug, Default)]
struct Shared {
    conns: Mutex<Vec<Arc<Conn>>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Client-to-server bytes are held (not forwarded) while set.
    hold: AtomicBool,
    /// Client-to-server bytes held since the last [`TcpProxy::hold`].
    held: AtomicU64,
    /// Nothing is forwarded (nor closed) in either direction while set, on any connection.
    partitioned: AtomicBool,
    /// Microseconds each forwarded chunk waits first.
    delay_us: AtomicU64,
    /// Connections accepted while set are silent from the start ([`TcpProxy::silence_new`]).
    silence_new: AtomicBool,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Conn {
    /// The client sent a `SUBSCRIBE` on it.
    subscriber: AtomicBool,
    /// Nothing is forwarded any more, in either direction; the sockets stay open.
    silent: AtomicBool,
}

impl TcpProxy {
    /// Starts a proxy to the loopback port `target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let conn = Arc::new(Conn::default());
                conn.silent.store(accepting.silence_new.load(Ordering::SeqCst), Ordering::SeqCst);
                accepting.conns.lock().unwrap().push(conn.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let up = tokio::spawn(pump(client_read, server_write, conn.clone(), accepting.clone(), true));
                let down = tokio::spawn(pump(server_read, client_write, conn, accepting.clone(), false));
                accepting.tasks.lock().unwrap().extend([up.abort_handle(), down.abort_handle()]);
            }
        })
        .abort_handle();
        TcpProxy { port, shared, accept }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }

    /// Every connection on which the client sent a `SUBSCRIBE` so far stops forwarding in both
    /// directions, without being closed (later connections work normally). Returns how many.
    pub fn silence_subscribers(&self) -> usize {
        let conns = self.shared.conns.lock().unwrap();
        let mut n = 0;
        for conn in conns.iter().filter(|c| c.subscriber.load(Ordering::SeqCst)) {
            conn.silent.store(true, Ordering::SeqCst);
            n += 1;
        }
        n
    }

    /// Connections accepted from now on forward nothing in either direction and are never
    /// closed towards the server: what a client sends on them never arrives (a request lost on
    /// the way, such as a cancel request). Earlier connections work normally.
    pub fn silence_new(&self) {
        self.shared.silence_new.store(true, Ordering::SeqCst);
    }

    /// From now on, what clients send is held instead of forwarded (answers still flow).
    pub fn hold(&self) {
        self.shared.held.store(0, Ordering::SeqCst);
        self.shared.hold.store(true, Ordering::SeqCst);
    }

    /// Bytes clients sent since [`hold`](Self::hold) and not yet forwarded.
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Waits until at least `bytes` are held (the signal that a request is on the wire).
    pub async fn await_held(&self, bytes: u64) {
        loop {
            let changed = self.shared.changed.notified();
            if self.held() >= bytes {
                return;
            }
            changed.await;
        }
    }

    /// Forwards what was held, and everything from now on.
    pub fn release(&self) {
        self.shared.hold.store(false, Ordering::SeqCst);
        self.shared.changed.notify_waiters();
    }

    /// A partition: from now on nothing is forwarded in either direction, on every connection
    /// (those accepted later too), and no socket is closed (a peer's close is not passed on
    /// either), until [`heal`](Self::heal).
    pub fn partition(&self) {
        self.shared.partitioned.store(true, Ordering::SeqCst);
    }

    /// Ends a [`partition`](Self::partition): what was in flight is delivered, then everything
    /// flows again (connections a peer closed meanwhile are closed now).
    pub fn heal(&self) {
        self.shared.partitioned.store(false, Ordering::SeqCst);
        self.shared.changed.notify_waiters();
    }

    /// Every chunk forwarded from now on, in either direction, waits `delay` first (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_us.store(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }
}

impl Shared {
    /// Waits while the proxy is partitioned.
    async fn pass_partition(&self) {
        loop {
            let changed = self.changed.notified();
            if !self.partitioned.load(Ordering::SeqCst) {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for task in self.shared.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// The command name as a RESP bulk string (not just the word, which a script may contain).
static SUBSCRIBE: &[u8] = b"$9\r\nSUBSCRIBE\r\n";

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    upstream: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if conn.silent.load(Ordering::SeqCst) {
            continue; // swallowed: the peer never hears of it, and nothing is closed
        }
        shared.pass_partition().await;
        let delay = shared.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        if upstream {
            if buf[..n].windows(SUBSCRIBE.len()).any(|w| w.eq_ignore_ascii_case(SUBSCRIBE)) {
                conn.subscriber.store(true, Ordering::SeqCst);
            }
            if shared.hold.load(Ordering::SeqCst) {
                shared.held.fetch_add(n as u64, Ordering::SeqCst);
                shared.changed.notify_waiters();
                loop {
                    let changed = shared.changed.notified();
                    if !shared.hold.load(Ordering::SeqCst) {
                        break;
                    }
                    changed.await;
                }
                if conn.silent.load(Ordering::SeqCst) {
                    continue;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Closed by one side: close the other (unless silenced, where nothing may be noticed; a
    // partition passes the close on once healed).
    shared.pass_partition().await;
    if !conn.silent.load(Ordering::SeqCst) {
        let _ = to.shutdown().await;
    } else {
        std::future::pending::<()>().await;
    }
}
