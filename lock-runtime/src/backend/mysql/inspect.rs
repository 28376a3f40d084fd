//! Inspection of MySQL locks ([`Inspect`] for [`MysqlBackend`]): the server names no holder of
//! a `GET_LOCK` (only its connection, with `IS_USED_LOCK`), so each grant writes a record of its
//! holder in the round trip that raises the fencing counter (the table `lock_runtime_holders`:
//! key, owner, holding process, token, connection, time), and the release deletes it. A record is shown only
//! while `IS_USED_LOCK` names its connection, so a session that ended without releasing (a
//! crash, an operator's `KILL`) leaves a row that is never shown.
//!
//! A forced release names the owner it expects (as `lockctl release` does) and asks that
//! holder: one statement marks the record while it names that owner and its session still
//! holds the lock; the holder's next heartbeat finds the mark, frees that one lock and fires
//! its `lost()` (the other locks on a shared connection stay held). The server cannot check
//! an owner and end a session in one step, and the next holder of a name usually sits on the
//! same carrier, so `KILL` is only the last resort: for a holder that does not answer within
//! the operation timeout and a heartbeat (a paused process), whose session then ends with
//! every lock on it, and for a forced release that names no owner, or of a lock held with no
//! record (another client's `GET_LOCK`). Nothing announces changes: a live view looks again
//! every interval.

use std::time::Duration;

use super::backend::{MysqlBackend, Pools};
use super::sql::{inspect_sql, list_sql, mark_sql, marked_sql, Recorded};
use super::KIND;
use crate::backend::inspect::Unannounced;
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, Holder, Inspect, LockInfo, LockKind};
use crate::error::LockError;

/// How long a look waits for the record of a lock held with no record (see
/// [`MysqlBackend::holder`]).
const GRANTING: Duration = Duration::from_secs(1);

/// A row as what it tells of the lock.
fn info((key, owner, holder, token, age, _): Recorded) -> LockInfo {
    let text =
        |bytes: Vec<u8>| String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into());
    let mut info = LockInfo::new(text(key), text(owner));
    info.holder = Holder::parse(&text(holder));
    info.kind = token.is_some().then_some(LockKind::Exclusive);
    // 0: its release was asked for (see `force_release`), the token no longer kept.
    info.fencing_token = token.filter(|t| *t > 0);
    info.age = age.map(|us| Duration::from_micros(us.max(0) as u64));
    info.session_bound = true;
    info
}

impl MysqlBackend {
    /// The rows `sql` answers, on a connection of the backend's own (an idle one, kept for the
    /// next look) or of the application's pool.
    async fn recorded(&self, sql: String) -> Result<Vec<Recorded>, LockError> {
        let bound = self.options().operation_timeout;
        let rows = async {
            match &self.pools {
                Pools::Own(pool) => pool.sessions.inspect(pool, sql).await,
                #[cfg(feature = "sqlx")]
                Pools::App(pool) => pool.sessions.inspect(sql).await,
            }
        };
        match tokio::time::timeout(bound, rows).await {
            Ok(rows) => rows,
            Err(_) => Err(LockError::timed_out("", KIND, "inspect", bound)),
        }
    }

    /// The holder of `key`, with its connection. A lock held with no record while records are
    /// on is looked at again for up to [`GRANTING`]: a grant writes its record in the round trip
    /// after `GET_LOCK` answered, so such a lock is usually one being granted; after that it is
    /// shown held with no holder (another client's `GET_LOCK`, or a record the server refused).
    async fn holder(&self, key: &str) -> Result<Option<(LockInfo, u64)>, LockError> {
        let deadline = crate::clock::now() + GRANTING;
        let mut pause = Duration::from_millis(1);
        let rows = loop {
            let mut rows = self.recorded(inspect_sql(key)).await?;
            // A recorded holder first; else the session that holds it without a record.
            rows.sort_by_key(|row| row.3.is_none());
            let granting = rows.first().is_some_and(|row| row.3.is_none());
            if !granting || !self.options().record_holders || crate::clock::now() >= deadline {
                break rows;
            }
            // Nothing tells when the record is written: looked at again, soon.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        Ok(rows.into_iter().next().map(|row| {
            let connection = row.5;
            // The key asked for (a record keeps at most 512 bytes of it).
            (LockInfo { key: key.to_owned(), ..info(row) }, connection)
        }))
    }
}

impl Inspect for MysqlBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(async move { Ok(self.recorded(list_sql(prefix)).await?.into_iter().map(info).collect()) })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move { Ok(self.holder(key).await?.map(|(info, _)| info)) })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(async move {
            let Some((info, connection)) = self.holder(key).await? else { return Ok(ForceRelease::NotHeld) };
            if expected_owner.is_some_and(|owner| owner != info.owner) {
                return Ok(ForceRelease::OwnerChanged(info.owner));
            }
            if let (Some(owner), true) = (expected_owner, info.kind.is_some()) {
                return self.ask_holder(key, owner, connection).await;
            }
            self.kill(connection, info.owner).await
        })
    }

    fn changes<'a>(&'a self, _prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(std::future::ready(Ok(Box::new(Unannounced) as Box<dyn ChangeFeed>)))
    }
}

impl MysqlBackend {
    /// A forced release of `owner`'s recorded lock `key`, held on `connection`: asks its holder
    /// (the record marked, in one statement that checks the owner, see [`mark_sql`]), whose
    /// heartbeat frees that one lock and fires its `lost()`; the other locks on a shared
    /// connection stay held. Nothing announces the release: the record is looked at again until
    /// it is gone. A holder that does not answer within the operation timeout and a heartbeat
    /// (a paused process) has its session ended, with every lock on it, while the record still
    /// names it asked (a check and a `KILL`, two round trips: a paused holder does not release
    /// in between).
    async fn ask_holder(&self, key: &str, owner: &str, connection: u64) -> Result<ForceRelease, LockError> {
        self.recorded(mark_sql(key, owner, connection)).await?;
        let options = self.options();
        let deadline = crate::clock::now() + options.operation_timeout + options.heartbeat;
        let mut pause = Duration::from_millis(5);
        let mut asked = false;
        loop {
            let marked = self.recorded(marked_sql(key, owner)).await?;
            let Some(row) = marked.into_iter().next() else {
                if asked {
                    return Ok(ForceRelease::Released(owner.to_owned()));
                }
                // Not marked: released meanwhile, or another owner's now.
                return Ok(match self.holder(key).await? {
                    Some((info, _)) if info.owner != owner => ForceRelease::OwnerChanged(info.owner),
                    _ => ForceRelease::NotHeld,
                });
            };
            asked = true;
            if crate::clock::now() >= deadline {
                tracing::warn!(
                    connection = row.5,
                    "the holder of a MySQL lock did not answer a forced release: its session was ended, with every \
                     lock on it"
                );
                return self.kill(row.5, owner.to_owned()).await;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Ends the session on `connection`: the server frees its locks at once; each holder's
    /// heartbeat finds it closed and fires `lost()`.
    async fn kill(&self, connection: u64, owner: String) -> Result<ForceRelease, LockError> {
        match self.recorded(format!("KILL CONNECTION {connection}")).await {
            Ok(_) => Ok(ForceRelease::Released(owner)),
            // The session ended on its own meanwhile (error 1094; both drivers' messages carry
            // the server's text, and only the text is common to them).
            Err(e) if e.to_string().contains("Unknown thread id") => Ok(ForceRelease::NotHeld),
            Err(e) => Err(e),
        }
    }
}
