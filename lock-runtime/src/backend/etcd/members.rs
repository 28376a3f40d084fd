//! [`Members`]: the members of the etcd cluster a backend talks to, one client each, and the
//! one every request goes to now.
//!
//! A request goes to the current member. When that member refuses the connection, answers that
//! it has no leader (or any other "try elsewhere" answer), or does not answer within its share
//! of the operation bound (the bound divided among the members: a stopped or cut-off member
//! keeps its sockets open and answers nothing), the backend moves on to the next member and
//! sends the request there, round the members until the bound ends. Every request the backend
//! sends is safe to send twice (a put only where the key is absent, a delete only of the
//! revision it was granted, reads), so a request whose answer was lost may be sent again.
//!
//! The clients are made at their first use: a member that is down when the backend connects
//! costs nothing until it is the current one. Watches and the lease's keep-alive stream live on
//! one member's connection: [`Members::until_moved`] tells them when the backend left it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

/// How a request sent through [`Members::call`] failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// No member answered before the request's deadline.
    NoAnswer,
    /// An error the server gave (or the last member's "try elsewhere" when the deadline came).
    Error(etcd_client::Error),
}

/// The members of the cluster and the client of each, made at its first use.
pub(super) struct Members {
    endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<tokio::sync::Mutex<Option<Client>>>,
    /// The index of the member requests go to now.
    current: AtomicUsize,
    /// How many times the backend moved to another member.
    moves: AtomicU64,
    moved: tokio::sync::Notify,
    bound: Duration,
}

impl Members {
    /// The members at `endpoints` (checked, not empty), each connected with `options`;
    /// `bound` is the operation timeout.
    pub(super) fn new(endpoints: Vec<String>, options: ConnectOptions, bound: Duration) -> Self {
        let clients = endpoints.iter().map(|_| tokio::sync::Mutex::new(None)).collect();
        Members {
            endpoints,
            options,
            clients,
            current: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
            moved: tokio::sync::Notify::new(),
            bound,
        }
    }

    /// How many members.
    pub(super) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The longest one try on one member may take: the whole bound with one member, its share
    /// (at least 250 ms) with several.
    pub(super) fn share(&self) -> Duration {
        match self.endpoints.len() {
            0 | 1 => self.bound,
            n => (self.bound / u32::try_from(n).unwrap_or(u32::MAX)).max(Duration::from_millis(250)).min(self.bound),
        }
    }

    /// How many times the backend moved to another member (a generation for
    /// [`until_moved`](Self::until_moved)).
    pub(super) fn generation(&self) -> u64 {
        self.moves.load(Ordering::Acquire)
    }

    /// Completes once the backend has moved away from the member it talked to at
    /// `generation`.
    pub(super) async fn until_moved(&self, generation: u64) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.generation() != generation {
                return;
            }
            moved.await;
        }
    }

    /// The index of the member requests go to now.
    pub(super) fn current_index(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// The index of the current member and its client (made now if it is the first use).
    pub(super) async fn current(&self) -> Result<(usize, Client), etcd_client::Error> {
        let i = self.current.load(Ordering::Acquire);
        Ok((i, self.client(i).await?))
    }

    async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let mut slot = self.clients[i].lock().await;
        if let Some(client) = &*slot {
            return Ok(client.clone());
        }
        let client = Client::connect([self.endpoints[i].as_str()], Some(self.options.clone())).await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Leaves member `i` for the next one, unless another request left it already.
    pub(super) fn leave(&self, i: usize) {
        let next = (i + 1) % self.endpoints.len().max(1);
        if next != i && self.current.compare_exchange(i, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.moves.fetch_add(1, Ordering::AcqRel);
            self.moved.notify_waiters();
            tracing::debug!(from = %self.endpoints[i], to = %self.endpoints[next], "etcd: moving to another member");
        }
    }

    /// Sends a request (made by `request` from a member's client) until a member answers it or
    /// `until` passes: to the current member first, then, whenever a member refuses, says to
    /// try elsewhere or does not answer within its [`share`](Self::share), to the next. With
    /// one member, one try until `until`. An error that another member would give too (a
    /// failed comparison, a permission, a lease the cluster no longer knows) is returned at
    /// once.
    pub(super) async fn call<T, F, Fut>(&self, until: Instant, mut request: F) -> Result<T, Failure>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.endpoints.len();
        let mut last = Failure::NoAnswer;
        let mut tries = 0usize;
        loop {
            let now = Instant::now();
            if now >= until {
                return Err(last);
            }
            let i = self.current.load(Ordering::Acquire);
            let try_until = if n > 1 { until.min(now + self.share()) } else { until };
            let answer = tokio::time::timeout_at(try_until.into(), async {
                let client = self.client(i).await?;
                request(client).await
            })
            .await;
            match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if n == 1 || !elsewhere(&e) => return Err(Failure::Error(e)),
                Ok(Err(e)) => last = Failure::Error(e),
                Err(_) if n == 1 => return Err(Failure::NoAnswer),
                Err(_) => last = Failure::NoAnswer,
            }
            self.leave(i);
            tries += 1;
            if tries.is_multiple_of(n) {
                // Every member failed once: a pause before the next round (a cluster that is
                // electing a leader, or members still starting), shorter than the time left.
                let pause = Duration::from_millis(50 * (tries / n).min(10) as u64);
                tokio::time::sleep_until((Instant::now() + pause).min(until).into()).await;
            }
        }
    }
}

/// Whether another member may answer where this one gave `e`: a connection refused or broken,
/// a member without a leader (or whose leader changed, or that is stopping), a request the
/// member timed out on, too many requests.
pub(super) fn elsewhere(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted | Code::Cancelled => {
                true
            }
            Code::Unknown | Code::Internal => {
                let message = status.message();
                ["no leader", "leader changed", "timed out", "stopped", "connection", "transport"]
                    .iter()
                    .any(|m| message.contains(m))
            }
            _ => false,
        },
        etcd_client::Error::WatchError(m) | etcd_client::Error::LeaseKeepAliveError(m) => !m.contains("not found"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_another_member_may_answer() {
        let status = |code, m: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, m));
        assert!(elsewhere(&status(tonic::Code::Unavailable, "etcdserver: no leader")));
        assert!(elsewhere(&status(tonic::Code::Unknown, "etcdserver: leader changed")));
        assert!(!elsewhere(&status(tonic::Code::NotFound, "etcdserver: requested lease not found")));
        assert!(!elsewhere(&status(tonic::Code::PermissionDenied, "etcdserver: permission denied")));
        assert!(!elsewhere(&etcd_client::Error::LeaseKeepAliveError("lease not found".into())));
    }

    #[test]
    fn each_member_gets_a_share_of_the_bound() {
        let endpoints = |n: usize| (0..n).map(|i| format!("http://127.0.0.1:{}", 2379 + i)).collect::<Vec<_>>();
        let bound = Duration::from_secs(6);
        assert_eq!(Members::new(endpoints(1), ConnectOptions::new(), bound).share(), bound);
        assert_eq!(Members::new(endpoints(3), ConnectOptions::new(), bound).share(), Duration::from_secs(2));
        let short = Duration::from_millis(100);
        assert_eq!(Members::new(endpoints(3), ConnectOptions::new(), short).share(), short);
    }
}
