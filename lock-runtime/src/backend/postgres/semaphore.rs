//! Semaphores of N permits on PostgreSQL: N advisory keys tried in turn, a queue key the
//! waiters line up on, and a marker of the permit count that every holder keeps (see the
//! *Semaphores* section of the [module docs](super)).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::conn::{last_value, Conn, PgSessions};
use super::semaphore_keys::{Sem, MAX_PERMITS};
use super::{pg_error, KIND};
use crate::backend::session::Failure;
use crate::error::LockError;

/// What an attempt's answer says.
enum Answer {
    Busy,
    Granted { permit: u32, token: u64 },
    Mismatch(String),
}

fn answer(value: Option<String>) -> Option<Answer> {
    let Some(value) = value else { return Some(Answer::Busy) };
    if let Some(other) = value.strip_prefix("mismatch ") {
        return Some(Answer::Mismatch(other.to_owned()));
    }
    let mut parts = value.splitn(3, ' ');
    let permit = parts.next()?.parse().ok()?;
    let _marker = parts.next()?;
    let token = super::inspect::token(parts.next()?)?;
    Some(Answer::Granted { permit, token })
}

/// Takes a permit of `sem` on `conn`: at once (`wait` `None`), or waiting at most `wait`. The
/// waiting side: queue on the server for the queue key; once at its head, try the permits;
/// if all are taken, wait on every permit at once, each on a connection of its own, and keep
/// the first granted (its connection replaces `conn`, whose session ends, freeing the queue
/// for the next waiter). Every other connection is closed, freeing what it may have got.
pub(super) async fn lock(
    sessions: &PgSessions,
    conn: &mut Conn,
    (name, record): (&str, &str),
    sem: &Sem,
    wait: Option<Duration>,
) -> Result<Option<u64>, Failure> {
    if sem.permits == 0 || sem.permits > MAX_PERMITS {
        let why = format!(
            "a PostgreSQL semaphore takes 1 to {MAX_PERMITS} permits (got {}): the waiter at the head of its queue \
             waits on every permit with a connection of its own",
            sem.permits
        );
        return Err(Failure::Failed(LockError::invalid(name, why)));
    }
    let token = sessions.token_sql();
    let Some(wait) = wait else {
        let sql = format!("{record}{}", sem.attempt_sql(&token));
        return granted(conn, name, sem, try_permits(conn, name, &sql).await?);
    };
    let deadline = crate::clock::now() + wait;
    // In line for the queue key (the server's order), then at its head.
    let (q0, q1) = sem.queue;
    let queued = format!("{}SELECT pg_advisory_lock({q0}, {q1})", sessions.wait_settings(wait));
    match conn.client.simple_query(&queued).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(None),
        Err(e) => return Err(failure(conn, name, "wait", e)),
    }
    match try_permits(conn, name, &sem.attempt_sql(&token)).await? {
        Answer::Busy => {}
        answer => {
            let granted = granted(conn, name, sem, answer)?;
            // The grant's query shows its record (for `lockctl`) and lets the next waiter in.
            let unqueue = format!("{record}SELECT pg_advisory_unlock({q0}, {q1})");
            if let Err(e) = conn.client.simple_query(&unqueue).await {
                return Err(failure(conn, name, "wait", e));
            }
            return Ok(granted);
        }
    }
    // Every permit taken: wait on all of them at once.
    let remaining = deadline.saturating_duration_since(crate::clock::now());
    if remaining.is_zero() {
        return leave_queue(conn, name, sem).await;
    }
    type Racing<'a> = Pin<Box<dyn Future<Output = Result<Option<(Conn, u32, u64)>, LockError>> + Send + 'a>>;
    let mut racers: Vec<Racing<'_>> =
        (0..sem.permits).map(|i| Box::pin(race(sessions, (name, record), sem, i, remaining)) as Racing<'_>).collect();
    let mut failed = None;
    while !racers.is_empty() {
        let (done, outcome) = std::future::poll_fn(|cx| {
            for (i, racer) in racers.iter_mut().enumerate() {
                if let Poll::Ready(outcome) = racer.as_mut().poll(cx) {
                    return Poll::Ready((i, outcome));
                }
            }
            Poll::Pending
        })
        .await;
        drop(racers.swap_remove(done));
        match outcome {
            Ok(Some((mut winner, permit, token))) => {
                winner.semaphore = Some((sem.permit(permit), sem.marker()));
                // The head's session ends with its connection: the queue goes to the next.
                let head = std::mem::replace(conn, winner);
                sessions.close_now(head);
                return Ok(Some(token));
            }
            Ok(None) => {}
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) => Err(Failure::Failed(e)),
        None => leave_queue(conn, name, sem).await,
    }
}

/// The head's wait ran out: it lets go of the queue key before its connection goes back to the
/// idle set (else the next waiter of any process would queue behind an idle connection).
async fn leave_queue(conn: &Conn, name: &str, sem: &Sem) -> Result<Option<u64>, Failure> {
    let (q0, q1) = sem.queue;
    match conn.client.simple_query(&format!("SELECT pg_advisory_unlock({q0}, {q1})")).await {
        Ok(_) => Ok(None),
        Err(e) => Err(failure(conn, name, "wait", e)),
    }
}

/// Runs an attempt's SQL on `conn` and reads its answer.
async fn try_permits(conn: &Conn, name: &str, sql: &str) -> Result<Answer, Failure> {
    let rows = conn.client.simple_query(sql).await.map_err(|e| failure(conn, name, "attempt", e))?;
    answer(last_value(&rows)).ok_or_else(|| {
        // Cannot happen with a sane server; closing the connection frees what it took.
        Failure::Failed(LockError::backend(name, KIND, "attempt", "no permit and fencing token in the answer"))
    })
}

/// An attempt's answer as the skeleton takes it: the token of a grant (the permit recorded on
/// the connection, for its release), `None` when every permit is taken, an error for a count
/// that differs from another holder's or attempt's.
fn granted(conn: &mut Conn, name: &str, sem: &Sem, answer: Answer) -> Result<Option<u64>, Failure> {
    match answer {
        Answer::Busy => Ok(None),
        Answer::Granted { permit, token } => {
            conn.semaphore = Some((sem.permit(permit), sem.marker()));
            Ok(Some(token))
        }
        Answer::Mismatch(other) => Err(Failure::Failed(LockError::invalid(
            name,
            format!(
                "the semaphore is held or asked for with {other} permits; this call asked for {}: every holder of a \
                 semaphore must give the same number of permits",
                sem.permits
            ),
        ))),
    }
}

/// One connection of the head waiter waiting on permit `i` for at most `wait`: the connection
/// with its token once granted, `None` when the wait ran out. Dropped before its answer (the
/// race was won by another permit, or the whole wait was dropped), its connection is closed
/// at once and its query cancelled.
async fn race(
    sessions: &PgSessions,
    (name, record): (&str, &str),
    sem: &Sem,
    i: u32,
    wait: Duration,
) -> Result<Option<(Conn, u32, u64)>, LockError> {
    let conn = sessions.connect_once(name).await?;
    let mut racer = Racer { sessions, conn: Some(conn) };
    let ((p0, p1), (m0, m1)) = (sem.permit(i), sem.marker());
    let sql = format!(
        "{record}{}SELECT pg_advisory_lock_shared({m0}, {m1}); SELECT pg_advisory_lock({p0}, {p1}); SELECT {}",
        sessions.wait_settings(wait),
        sessions.token_sql()
    );
    let Some(conn) = racer.conn.as_ref() else { return Ok(None) };
    let outcome = conn.client.simple_query(&sql).await;
    let conn = racer.conn.take();
    match (outcome, conn) {
        (Ok(rows), Some(conn)) => match last_value(&rows).as_deref().and_then(super::inspect::token) {
            Some(token) => Ok(Some((conn, i, token))),
            None => {
                sessions.close_now(conn);
                Err(LockError::backend(name, KIND, "wait", "no fencing token in the answer"))
            }
        },
        (Err(e), Some(conn)) => {
            sessions.close_now(conn);
            match e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                true => Ok(None),
                false => Err(pg_error(name, "wait", e)),
            }
        }
        (_, None) => Ok(None),
    }
}

/// A racer's connection: closed at once (its query cancelled) when dropped before its answer.
struct Racer<'a> {
    sessions: &'a PgSessions,
    conn: Option<Conn>,
}

impl Drop for Racer<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.sessions.close_now(conn);
        }
    }
}

/// A failed query on `conn` as the skeleton takes it.
fn failure(conn: &Conn, name: &str, operation: &'static str, e: tokio_postgres::Error) -> Failure {
    if conn.ended_by(&e) {
        Failure::Closed(pg_error(name, operation, e))
    } else {
        Failure::Failed(pg_error(name, operation, e))
    }
}
