#![doc = include_str!("redlock.md")]

mod node;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::pubsub::Timings;
use node::{gather, gather_more, Answer, Chains, Gathered, Node};
use redis::aio::ConnectionManager;
use redis::ScriptInvocation;
use tokio::sync::mpsc;

use super::layout::KeyLayout;
use super::options::RedisOptions;
use super::scripts::{EXTEND, FENCE, RELEASE, RELEASE_AFTER, VOTE};
use super::server::{lease_millis, Server};
use super::topology::{Conn, Source};
use super::url::{self, redact};
use super::waiters::{Before, Capture, Slot, Step, Waiters};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, LockBackend, LockKind};
use crate::backend::{Renewal, Wake};
use crate::error::LockError;

const KIND: &str = "redlock";
/// How far ahead of the client's wall clock the proposed token floor is (see *Fencing tokens*).
const FLOOR_AHEAD: Duration = Duration::from_secs(1);

/// Locks over N independent Redis primaries (Redlock), with strictly increasing fencing
/// tokens. Cheap to clone: clones share the connections. See the [module docs](self).
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    options: RedisOptions,
    runtime: tokio::runtime::Handle,
    /// The local queues, told of releases by every node's pub/sub connection.
    waiters: Waiters,
    /// The first node (by index) that answered the latest attempt sent to every node; a
    /// contended attempt asks it alone first (see `RedlockAcquisition::attempt_inner`).
    /// `usize::MAX` before any answer.
    first: AtomicUsize,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.inner.nodes.iter().map(|n| n.url.as_str()).collect();
        f.debug_struct("RedlockBackend")
            .field("nodes", &urls)
            .field("quorum", &self.inner.quorum)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl RedlockBackend {
    /// Connects to the independent primaries at `urls` (each
    /// `redis://[[user]:password@]host[:port][/db]`) with `options` (the command timeout bounds
    /// every command on every node).
    ///
    /// An empty list, an empty, malformed or repeated URL (the same host and port twice), one
    /// server listed twice under two names (told by its `run_id`, from `INFO server`; a user
    /// whose ACL has no `INFO` is not checked), or options out of range are an
    /// [`is_invalid`](crate::LockError::is_invalid) error. Fewer than a quorum (`N/2 + 1`) of
    /// nodes answering within the command timeout is an
    /// [`is_backend`](crate::LockError::is_backend) error; a minority down is fine (their
    /// connections are made again as they come back). Connecting waits for every node's
    /// answer, up to the command timeout.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::redis::{RedisOptions, RedlockBackend};
    /// let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
    /// let backend = RedlockBackend::connect(&urls, RedisOptions::default()).await?;
    /// assert_eq!(backend.quorum(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(urls: S, options: RedisOptions) -> Result<Self, LockError> {
        let given: Vec<&str> = urls.as_ref().iter().map(AsRef::as_ref).collect();
        let shown = given.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        if let Some(problem) = options.problem() {
            return Err(LockError::invalid(shown, problem));
        }
        if given.is_empty() {
            return Err(LockError::invalid(shown, "Redlock needs at least one Redis URL (3 or 5 are meant)"));
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| LockError::invalid(&shown, format!("the Redlock backend needs a tokio runtime ({e})")))?;
        let timeout = options.command_timeout;
        let mut clients = Vec::new();
        let mut seen = Vec::new();
        for url in &given {
            let url = url.trim();
            let one = redact(url);
            if url.is_empty() {
                return Err(LockError::invalid(&shown, "an empty Redis URL in the Redlock list"));
            }
            let info = url::connection_info(url, &options, "`redis://127.0.0.1:6379` (a Redlock primary)")?;
            let client = redis::Client::open(info).map_err(|e| LockError::invalid(&one, e.to_string()))?;
            let addr = client.get_connection_info().addr().to_string();
            if seen.contains(&addr) {
                return Err(LockError::invalid(
                    &shown,
                    format!("{addr} is listed twice: Redlock needs independent Redis primaries"),
                ));
            }
            seen.push(addr);
            clients.push((one, client));
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let timings = Timings { timeout, grace: options.get_unsubscribe_after(), ping: options.get_ping_interval() };
        let (mut nodes, mut sources) = (Vec::new(), Vec::new());
        for (url, client) in clients {
            let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                .map_err(|e| LockError::backend(&url, KIND, "connect", e))?;
            sources.push(Source::Single(Box::new(client)));
            nodes.push(Node { url, server: Arc::new(Server::new(Conn::Single(conn), timeout)) });
        }
        let quorum = nodes.len() / 2 + 1;
        let waiters = Waiters::start(&runtime, sources, timings, None);
        let backend = RedlockBackend {
            inner: Arc::new(Inner { nodes, quorum, options, runtime, waiters, first: AtomicUsize::new(usize::MAX) }),
        };
        backend.probe(&shown).await?;
        Ok(backend)
    }

    /// Asks every node for its `run_id` (`INFO server`; a user without `INFO` answers a
    /// `PING` instead, and is not checked), waiting up to the command timeout for all of them:
    /// one server listed twice (under two host names) is an error, and so is fewer than a
    /// quorum answering.
    async fn probe(&self, shown: &str) -> Result<(), LockError> {
        let inner = &*self.inner;
        let timeout = inner.options.command_timeout;
        let deadline = crate::clock::now() + timeout;
        let (tx, mut rx) = mpsc::unbounded_channel();
        for (i, node) in inner.nodes.iter().enumerate() {
            let (server, tx) = (node.server.clone(), tx.clone());
            inner.runtime.spawn(async move {
                let ask = async {
                    let mut conn = server.conn().clone();
                    let id = match redis::cmd("INFO").arg("server").query_async::<String>(&mut conn).await {
                        Ok(info) => run_id(&info),
                        Err(e) if e.code() == Some("NOPERM") => {
                            redis::cmd("PING").query_async::<String>(&mut conn).await.map(|_| None)?
                        }
                        Err(e) => return Err(e),
                    };
                    // Its scripts (lock, release, fencing raise, renewal), so that its first
                    // calls are one call each.
                    server.load(&[&*VOTE, &*RELEASE, &*FENCE, &*EXTEND]).await;
                    Ok(id)
                };
                let answer = match tokio::time::timeout(timeout, ask).await {
                    Ok(Ok(id)) => Ok(id),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                };
                let _ = tx.send((i, answer));
            });
        }
        drop(tx);
        let quorum = inner.quorum;
        let got = gather(&mut rx, inner.nodes.len(), deadline, |_| false).await;
        let ids: Vec<(usize, &String)> = got
            .answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((i, a.as_ref()?.as_ref().ok()?.as_ref()?)))
            .collect();
        for (n, (i, id)) in ids.iter().enumerate() {
            if let Some((j, _)) = ids[n + 1..].iter().find(|(_, other)| other == id) {
                let (a, b) = (&inner.nodes[*i].url, &inner.nodes[*j].url);
                return Err(LockError::invalid(
                    shown,
                    format!("{a} and {b} are the same Redis server (run_id {id}): Redlock needs independent primaries"),
                ));
            }
        }
        if got.answered() >= quorum {
            Ok(())
        } else {
            Err(LockError::backend(shown, KIND, "connect", self.short(&got)))
        }
    }

    /// The number of nodes that must grant a lock: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// The options this backend was created with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// How many release channels are subscribed (or about to be) on all nodes together, for
    /// local waiters now or within their unsubscribe grace (for tests and metrics).
    pub fn subscribed_channels(&self) -> usize {
        self.inner.waiters.channels()
    }

    /// `Redlock needs q of N Redis nodes; a answered (node …: …; …)`.
    fn short<T>(&self, got: &Gathered<T>) -> String {
        let inner = &*self.inner;
        format!(
            "Redlock needs {} of {} Redis nodes; {} answered ({})",
            inner.quorum,
            inner.nodes.len(),
            got.answered(),
            got.failures(&inner.nodes, inner.options.command_timeout)
        )
    }

    /// Sends `script` (built by `invocation` per node) on the nodes `on` of `chains`, each
    /// after the lock's previous command there; answers arrive on the returned receiver.
    fn send<T>(
        &self,
        chains: &Chains,
        on: impl Fn(usize) -> bool,
        invocation: impl Fn() -> ScriptInvocation<'static>,
    ) -> mpsc::UnboundedReceiver<(usize, Answer<T>)>
    where
        T: redis::FromRedisValue + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        self.send_to(&tx, chains, on, invocation);
        rx
    }

    /// [`send`](Self::send), the answers going to `tx`.
    fn send_to<T>(
        &self,
        tx: &mpsc::UnboundedSender<(usize, Answer<T>)>,
        chains: &Chains,
        on: impl Fn(usize) -> bool,
        invocation: impl Fn() -> ScriptInvocation<'static>,
    ) where
        T: redis::FromRedisValue + Send + 'static,
    {
        let inner = &*self.inner;
        for (i, node) in inner.nodes.iter().enumerate() {
            if on(i) {
                let call = node.call::<T>(invocation(), inner.options.command_timeout);
                chains.run(&inner.runtime, i, call, Some(tx.clone()));
            }
        }
    }

    /// Owner-checked release of `layout` for `owner` on every node, in the background.
    fn release_everywhere(&self, chains: &Chains, layout: &Keys, owner: &Arc<str>) {
        let inner = &*self.inner;
        for (i, node) in inner.nodes.iter().enumerate() {
            let call = node.call::<i64>(release(layout, owner), inner.options.command_timeout);
            chains.run(&inner.runtime, i, call, None);
        }
    }

    /// Runs an owner-checked script on every node (release, release after, extend) and tells
    /// how the quorum answered: `1` confirmed.
    async fn on_quorum(
        &self,
        name: &str,
        operation: &'static str,
        chains: &Chains,
        invocation: impl Fn() -> ScriptInvocation<'static>,
    ) -> Result<(), LockError> {
        let inner = &*self.inner;
        let (n, quorum) = (inner.nodes.len(), inner.quorum);
        let deadline = crate::clock::now() + inner.options.command_timeout;
        let mut rx = self.send::<i64>(chains, |_| true, invocation);
        let got =
            gather(&mut rx, n, deadline, |g| g.count(|v| *v == 1) >= quorum || g.count(|v| *v != 1) > n - quorum).await;
        if got.count(|v| *v == 1) >= quorum {
            return Ok(());
        }
        if got.count(|v| *v != 1) > n - quorum {
            let gone = got.count(|v| *v == 0);
            let other = got.count(|v| *v < 0);
            return Err(LockError::lost(
                name,
                format!(
                    "fewer than {quorum} of {n} Redis nodes still hold it (key gone on {gone}, \
                     another owner on {other}): its lease ran out, or the keys were deleted"
                ),
            ));
        }
        Err(LockError::backend(name, KIND, operation, self.short(&got)))
    }
}

/// A node's answer to [`VOTE`]: `(1, token, "")` granted, `(0, pttl, holder's value)` refused.
type Vote = (i64, i64, String);

/// The owner in a lock key's value (before its first `#`).
fn owner_of(value: &str) -> &str {
    value.split('#').next().unwrap_or(value)
}

/// The holders of the nodes that refused, one entry per node. When no owner is there `quorum`
/// times, the votes were split between contenders (this attempt's own undone): nobody holds
/// the lock.
fn holders(got: &Gathered<Vote>) -> Vec<String> {
    got.answers
        .iter()
        .filter_map(|a| match a {
            Some(Ok((0, _, holder))) => Some(owner_of(holder).to_owned()),
            _ => None,
        })
        .collect()
}

/// A lock's Redis names, shared by its acquisition and its held lock.
struct Keys {
    lock: Arc<str>,
    channel: Arc<str>,
    fence: Arc<str>,
}

fn release(keys: &Keys, owner: &Arc<str>) -> ScriptInvocation<'static> {
    let mut invocation = RELEASE.prepare_invoke();
    invocation.key(&*keys.lock).arg(&**owner).arg(&*keys.channel);
    invocation
}

/// One `lock()` call on Redlock: owns its registrations and every acquire it sent until it is
/// granted or dropped.
struct RedlockAcquisition {
    backend: RedlockBackend,
    req: Acquire,
    keys: Arc<Keys>,
    owner: Arc<str>,
    chains: Chains,
    /// Acquires were sent and no grant handed out: a node may hold the key for us.
    dirty: bool,
    /// Its place in the local queue (woken by a release heard on any node, or made through
    /// this backend), once it found the lock busy or others of this process waiting.
    slot: Option<Slot>,
    /// Split votes in a row (its last attempt was one when not 0): the head then sleeps a
    /// random, growing delay; otherwise it waits as its place in the local queue says (a
    /// release heard, the smallest lease left seen run out, its turn at the head).
    splits: u32,
    /// The holders its last vote was refused by, when none of them held a majority (a split):
    /// a refusal by one of them on the first node alone is a split still.
    unheld: Vec<String>,
}

impl RedlockAcquisition {
    async fn attempt_inner(&mut self) -> Result<Attempt, LockError> {
        let backend = self.backend.clone();
        let inner = &*backend.inner;
        let (n, quorum, timeout) = (inner.nodes.len(), inner.quorum, inner.options.command_timeout);
        // Local FIFO (the one every Redis topology keeps, see `waiters.rs`): behind this
        // process's waiters, without racing their head.
        let capture = match &self.slot {
            Some(slot) => {
                slot.attempting();
                None
            }
            None => match inner.waiters.before_attempt(&self.keys.channel, false) {
                Before::Queued(slot) => {
                    self.slot = Some(slot);
                    return Ok(Attempt::Busy);
                }
                Before::Attempt(capture) => Some(capture),
            },
        };
        let lease = self.req.lease.duration();
        let sent = crate::clock::now();
        let keys = self.keys.clone();
        let owner = self.owner.clone();
        let floor = token_floor();
        let acquire = move || {
            let mut invocation = VOTE.prepare_invoke();
            invocation.key(&*keys.lock).key(&*keys.fence).arg(&*owner).arg(lease_millis(lease)).arg(floor);
            invocation
        };
        self.dirty = true;
        let granted = |v: &Vote| v.0 == 1 && v.1 > 0;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut got = Gathered { answers: (0..n).map(|_| None).collect() };
        // Contended (it found the lock busy before, or waits behind this process's waiters):
        // the first node that answered alone first, the others only once it granted. Every
        // contender of every process asks the same node first, which grants one of them, so
        // the others take nothing and the vote does not split; sent to every node at once,
        // contenders that each need every node left up (a minority down) split it again and
        // again, each undoing its part and waking the others together (issue 56: ~2 grants/s).
        // A first node silent for a quarter of the bound, or failing, is not waited on: the
        // others are asked too, and its answer is counted when it comes.
        let first = inner.first.load(Ordering::Relaxed);
        let first = (first < n && self.slot.is_some()).then_some(first);
        backend.send_to(&tx, &self.chains, |i| first.is_none_or(|f| i == f), &acquire);
        if let Some(f) = first {
            got = gather_more(got, &mut rx, sent + timeout / 4, |g| g.answers[f].is_some()).await;
            let refused = match &got.answers[f] {
                Some(Ok(v)) if !granted(v) => Some((v.1, owner_of(&v.2).to_owned())),
                _ => None,
            };
            if let Some((left, holder)) = refused {
                // Busy where it counts: nothing was taken anywhere (the others were not asked).
                self.dirty = false;
                self.splits = 0;
                let pttl = if left >= 0 { left.saturating_add(1) } else { -1 };
                if let Some(slot) = &self.slot {
                    slot.busy(sent, pttl);
                }
                // Held by an owner the last vote saw without a majority: as far as is known,
                // still nobody holds the lock.
                if self.unheld.contains(&holder) {
                    return Ok(Attempt::Split);
                }
                self.unheld.clear();
                return Ok(Attempt::Busy);
            }
            backend.send_to(&tx, &self.chains, |i| i != f, &acquire);
        }
        drop(tx);
        // Decided once a quorum granted, or once no quorum can grant and it is known whether a
        // quorum answered (the lock is busy) or not (too few nodes reachable: an error).
        let got = gather_more(got, &mut rx, sent + timeout, |g| {
            let (yes, answered, pending) = (g.count(granted), g.answered(), g.pending());
            yes >= quorum || (yes + pending < quorum && (answered >= quorum || answered + pending < quorum))
        })
        .await;
        // The first node stays while it answers (one left out because the quorum was decided
        // before it answered is not moved from); one that failed, or was silent for a quarter
        // of the bound, gives way to the first node that answered.
        let current = inner.first.load(Ordering::Relaxed);
        let gone = current >= n
            || match &got.answers[current] {
                Some(Ok(_)) => false,
                Some(Err(_)) => true,
                None => crate::clock::now() >= sent + timeout / 4,
            };
        if gone {
            if let Some(answered) = got.answers.iter().position(|a| matches!(a, Some(Ok(_)))) {
                inner.first.store(answered, Ordering::Relaxed);
            }
        }
        let grants = got.count(granted);
        if grants >= quorum {
            if let Some(token) = self.fence(&got, rx).await {
                let valid = crate::clock::trusted_until(sent, lease).is_some_and(|until| crate::clock::now() < until);
                if valid {
                    self.dirty = false;
                    let lease_end = sent.checked_add(lease);
                    match self.slot.take() {
                        Some(slot) => slot.granted(lease_end),
                        None => inner.waiters.acquired(&self.keys.channel, lease_end),
                    }
                    let held = RedlockHeld {
                        backend: backend.clone(),
                        name: self.req.name.clone(),
                        keys: self.keys.clone(),
                        owner: self.owner.clone(),
                        chains: self.chains.clone(),
                        lease,
                    };
                    let grant = Grant { fencing_token: token, granted_at: Some(sent), lock: Held::new(held) };
                    return Ok(Attempt::Acquired(grant));
                }
            }
        }
        // Not granted: undo what we took, on every node (after the acquires there).
        backend.release_everywhere(&self.chains, &self.keys, &self.owner);
        self.dirty = false;
        if got.answered() < quorum {
            if let Some(slot) = &self.slot {
                slot.look_failed();
            }
            return Err(LockError::backend(&*self.req.name, KIND, "acquire", backend.short(&got)));
        }
        let lease_left = got
            .answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok((0, pttl, _))) if *pttl >= 0 => Some(*pttl),
                _ => None,
            })
            .min();
        self.splits = if grants > 0 { self.splits.saturating_add(1) } else { 0 };
        // The head wakes when the smallest lease left seen has run out (plus a millisecond).
        let pttl = lease_left.map_or(-1, |p| p.saturating_add(1));
        match (&self.slot, capture) {
            (Some(slot), _) => slot.busy(sent, pttl),
            (None, capture) => {
                let capture = capture.unwrap_or(Capture::NONE);
                self.slot = Some(inner.waiters.busy(&self.keys.channel, capture, sent, pttl, false));
            }
        }
        self.unheld = holders(&got);
        if self.unheld.iter().any(|h| self.unheld.iter().filter(|o| *o == h).count() >= quorum) {
            self.unheld.clear();
            return Ok(Attempt::Busy);
        }
        Ok(Attempt::Split)
    }

    /// Raises the counters of the granting nodes below the largest token to it (fence.lua);
    /// the combined token if a quorum is then at or above it, holding our key. Every other node
    /// that answered below the token (one that refused, holding another owner's key; one that
    /// granted below a top that already had its quorum) is raised too, unchecked (a counter only
    /// ever goes up), and awaited within the same bound: a later quorum that includes one of them
    /// mints above this token even if the nodes at the top left or lost their data meanwhile.
    /// A node that has not answered (its answer arriving on `late`) is raised unchecked too once
    /// it has, unless it granted at the top, without waiting for it. Nothing is sent when every
    /// node minted the same token.
    async fn fence(&self, got: &Gathered<Vote>, late: mpsc::UnboundedReceiver<(usize, Answer<Vote>)>) -> Option<u64> {
        let inner = &*self.backend.inner;
        let (n, quorum, timeout) = (inner.nodes.len(), inner.quorum, inner.options.command_timeout);
        let tokens: Vec<Option<i64>> = got
            .answers
            .iter()
            .map(|a| match a {
                Some(Ok((1, token, _))) if *token > 0 => Some(*token),
                _ => None,
            })
            .collect();
        let top = tokens.iter().flatten().copied().max()?;
        let at_top = tokens.iter().filter(|t| **t == Some(top)).count();
        let below: Vec<bool> = tokens.iter().map(|t| t.is_some_and(|t| t < top)).collect();
        // Raised unchecked, not counted: the nodes that refused, and (when the top already has a
        // quorum) those that granted below it.
        let refused: Vec<bool> = got
            .answers
            .iter()
            .zip(&tokens)
            .zip(&below)
            .map(|((a, t), below)| (matches!(a, Some(Ok(_))) && t.is_none()) || (*below && at_top >= quorum))
            .collect();
        let refusing = refused.iter().filter(|r| **r).count();
        let deadline = crate::clock::now() + timeout;
        let raise = |checked: bool| {
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            move || {
                let mut invocation = FENCE.prepare_invoke();
                invocation.key(&*keys.lock).key(&*keys.fence).arg(&*owner).arg(top);
                if !checked {
                    invocation.arg("any");
                }
                invocation
            }
        };
        let others = (refusing > 0).then(|| self.backend.send::<i64>(&self.chains, |i| refused[i], raise(false)));
        // A node that has not answered yet (slow, or paused) is looked at once it has, behind
        // its attempt there and ahead of the lock's next command on it, without waiting for it
        // here: raised unchecked unless it granted at or above the top (as a node of a quorum
        // does; then nothing is sent). A refusal that arrives after the quorum granted leaves
        // its counter at the top too.
        if got.answers.iter().any(Option::is_none) {
            let late = Arc::new(Mutex::new((late, got.answers.iter().map(|_| None).collect::<Vec<_>>())));
            for (i, node) in inner.nodes.iter().enumerate().filter(|(i, _)| got.answers[*i].is_none()) {
                let (late, raised) = (late.clone(), node.call::<i64>(raise(false)(), timeout));
                let look = async move {
                    let answer = {
                        let mut late = late.lock().unwrap_or_else(PoisonError::into_inner);
                        while let Ok((j, answer)) = late.0.try_recv() {
                            late.1[j] = Some(answer);
                        }
                        late.1[i].take()
                    };
                    match answer {
                        Some(Ok((1, token, _))) if token >= top => Ok(0),
                        _ => raised.await,
                    }
                };
                self.chains.run(&inner.runtime, i, look, None);
            }
        }
        if at_top < quorum {
            let mut rx = self.backend.send::<i64>(&self.chains, |i| below[i], raise(true));
            let raising = below.iter().filter(|b| **b).count();
            let done = gather(&mut rx, n, deadline, |g| {
                let raised = g.count(|v| *v == 1);
                let finished = g.answers.iter().filter(|a| a.is_some()).count();
                at_top + raised >= quorum || at_top + raised + (raising - finished) < quorum
            })
            .await;
            if at_top + done.count(|v| *v == 1) < quorum {
                return None;
            }
        }
        if let Some(mut rx) = others {
            gather(&mut rx, n, deadline, |g| g.answers.iter().filter(|a| a.is_some()).count() == refusing).await;
        }
        u64::try_from(top).ok()
    }

    async fn wait_inner(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let Some(slot) = &self.slot else { return Ok(Wake::Retry) };
        if self.splits > 0 && slot.heads() {
            // A split vote: every contender undid its grants, and hearing those releases
            // together they would split again; a random delay parts them.
            let wake_at = crate::clock::now().checked_add(jitter(self.splits, &self.owner)).unwrap_or(deadline);
            tokio::time::sleep_until(wake_at.min(deadline).into()).await;
            return Ok(if crate::clock::now() >= deadline { Wake::TimedOut } else { Wake::Retry });
        }
        loop {
            if crate::clock::now() >= deadline {
                return Ok(Wake::TimedOut);
            }
            // A look after a (re)subscription is an attempt here (it marks the holder's keys).
            let (notify, until) = match slot.step() {
                Step::Attempt | Step::Check => return Ok(Wake::Retry),
                Step::Sleep(notify, until) => (notify, until),
            };
            let wake_at = until.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep_until(wake_at.into()) => {}
            }
        }
    }
}

/// The token floor an attempt proposes: the wall clock in µs plus [`FLOOR_AHEAD`] (at most
/// 2^53, which Lua numbers hold exactly).
fn token_floor() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.saturating_add(FLOOR_AHEAD).as_micros()).unwrap_or(u64::MAX).min(1 << 53)
}

/// A random delay after the `splits`-th split vote in a row: 5 ms at first, doubling up to
/// 40 ms, each drawn in [½, 1½] of that.
fn jitter(splits: u32, owner: &str) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let base = 5u64 << splits.saturating_sub(1).min(3);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(owner.as_bytes());
    h.write_u32(splits);
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    let micros = base * 1000;
    Duration::from_micros(micros / 2 + h.finish() % micros)
}

impl Acquisition for RedlockAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_inner())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_inner(deadline))
    }
}

impl Drop for RedlockAcquisition {
    fn drop(&mut self) {
        // Leave the queue first: a wake-up this acquisition held goes to the next waiter now.
        drop(self.slot.take());
        if self.dirty {
            // Acquires whose outcome was never seen may have been granted on some nodes: undo
            // them there (owner-checked, sent after them on each node).
            self.backend.release_everywhere(&self.chains, &self.keys, &self.owner);
        }
    }
}

/// A lock held by a quorum of Redis nodes.
struct RedlockHeld {
    backend: RedlockBackend,
    name: Arc<str>,
    keys: Arc<Keys>,
    owner: Arc<str>,
    chains: Chains,
    /// Its lease: how long its keys may outlive a release that failed.
    lease: Duration,
}

impl RedlockHeld {
    /// A release no quorum confirmed or refused (too few nodes answered) is owed
    /// ([`owed`](crate::background::owed)): tried again on every node in the background until
    /// a quorum answers it or the lease has ended by itself (`until`). Owner-checked on every
    /// node: safe to repeat. Without it, the keys on the nodes that were away blocked the lock
    /// for the rest of its lease.
    fn owe(&self, until: std::time::Instant) {
        let (backend, name, chains) = (self.backend.clone(), self.name.clone(), self.chains.clone());
        let (keys, owner) = (self.keys.clone(), self.owner.clone());
        let runtime = backend.inner.runtime.clone();
        let over = tokio::time::sleep_until(until.into());
        drop(runtime.spawn(crate::background::owed(over, move || {
            let (backend, name, chains) = (backend.clone(), name.clone(), chains.clone());
            let (keys, owner) = (keys.clone(), owner.clone());
            async move {
                let (k, o) = (keys.clone(), owner.clone());
                match backend.on_quorum(&name, "release", &chains, move || release(&k, &o)).await {
                    Err(e) if !e.is_lost() => false,
                    // Done (or the keys gone): local waiters look again.
                    _ => {
                        backend.inner.waiters.released(&keys.channel, &owner);
                        true
                    }
                }
            }
        })));
    }
}

/// Tells the lock's local queue that its holder let go (or may have): however the release
/// ends, completed, failed or dropped. (Its announcements by the nodes are the same release.)
struct WakeLocal<'a>(&'a RedlockHeld);

impl Drop for WakeLocal<'_> {
    fn drop(&mut self) {
        self.0.backend.inner.waiters.released(&self.0.keys.channel, &self.0.owner);
    }
}

impl HeldLock for RedlockHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let started = crate::clock::now();
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            let _wake = WakeLocal(self);
            let outcome =
                self.backend.on_quorum(&self.name, "release", &self.chains, move || release(&keys, &owner)).await;
            if matches!(&outcome, Err(e) if !e.is_lost()) {
                self.owe(started + self.lease);
            }
            outcome
        })
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            let invocation = move || {
                let mut invocation = RELEASE_AFTER.prepare_invoke();
                invocation.key(&*keys.lock).arg(&*owner).arg(lease_millis(remaining)).arg(&*keys.channel);
                invocation
            };
            let _wake = WakeLocal(self);
            self.backend.on_quorum(&self.name, "release", &self.chains, invocation).await
        })
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        Some(Box::new(RedlockRenewal {
            backend: self.backend.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            chains: self.chains.clone(),
        }))
    }
}

/// Renews a Redlock lock on every node (`extend.lua`); kept iff a quorum extended it.
struct RedlockRenewal {
    backend: RedlockBackend,
    name: Arc<str>,
    keys: Arc<Keys>,
    owner: Arc<str>,
    chains: Chains,
}

impl Renewal for RedlockRenewal {
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            let invocation = move || {
                let mut invocation = EXTEND.prepare_invoke();
                invocation.key(&*keys.lock).arg(&*owner).arg(lease_millis(lease));
                invocation
            };
            self.backend.on_quorum(&self.name, "extend", &self.chains, invocation).await
        })
    }
}

impl LockBackend for RedlockBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    /// Mutexes only: read-write locks and semaphores are not offered on Redlock.
    fn supports(&self, kind: LockKind) -> bool {
        kind == LockKind::Exclusive
    }

    fn begin(&self, req: Acquire, _lost: crate::lost::LostSignal) -> Box<dyn Acquisition> {
        let owner = req.owner.with_holder(&req.holder);
        let layout = KeyLayout::of(&req.key);
        let keys =
            Arc::new(Keys { lock: layout.lock.into(), channel: layout.channel.into(), fence: layout.fence.into() });
        Box::new(RedlockAcquisition {
            chains: Chains::new(self.inner.nodes.len()),
            backend: self.clone(),
            req,
            keys,
            owner,
            dirty: false,
            slot: None,
            splits: 0,
            unheld: Vec::new(),
        })
    }

    fn operation_timeout(&self) -> Duration {
        // An attempt is two rounds (acquire, fence raise), each bounded by the command timeout.
        self.inner.options.command_timeout.saturating_mul(2).saturating_add(Duration::from_millis(250))
    }
}

/// The `run_id` in an `INFO server` answer.
fn run_id(info: &str) -> Option<String> {
    info.lines().find_map(|line| line.strip_prefix("run_id:")).map(|id| id.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_script_states_its_interface() {
        let src = include_str!("fence.lua");
        assert!(src.contains("KEYS[2]") && src.contains("ARGV[2]") && src.contains("Returns"));
    }

    #[test]
    fn jitter_grows_and_stays_in_tens_of_ms() {
        for splits in 1..10 {
            let d = jitter(splits, "owner");
            let base = Duration::from_millis(5 << (splits - 1).min(3));
            assert!(d >= base / 2 && d < base * 3 / 2, "{splits}: {d:?}");
        }
    }
}
