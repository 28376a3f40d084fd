//! [`PgSql`]: the statements that take, wait for and release a lock on one PostgreSQL session,
//! whichever driver carries them (the backend's own tokio-postgres connections, or the
//! application's sqlx pool), and [`PgKey`], a lock's key on the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::options::PostgresOptions;
use super::semaphore_keys::Sem;
use super::{advisory_key, RW_SUFFIX, SEQUENCE};
use crate::backend::{Acquire, LockKind};

/// A lock's advisory key, with its name for errors.
#[derive(Clone)]
pub(super) struct PgKey {
    pub(super) name: Arc<str>,
    pub(super) key: (i32, i32),
    /// The shared side of a read-write lock (`pg_advisory_lock_shared`).
    pub(super) shared: bool,
    /// The comment the grant's query starts with, which `lockctl` reads back from
    /// `pg_stat_activity` (see `inspect.rs`).
    pub(super) record: Arc<str>,
    /// A semaphore's keys (`key` is then its queue).
    pub(super) sem: Option<Arc<Sem>>,
}

/// The settings the statements depend on.
pub(super) struct PgSql {
    pub(super) options: PostgresOptions,
    /// The server's version (`server_version_num`), read by the setup: a wait turns off
    /// `transaction_timeout` where the server has it (PostgreSQL 17), and has the server check
    /// its client's connection (`client_connection_check_interval`, PostgreSQL 14).
    pub(super) version: OnceLock<u32>,
    /// The connections' `application_name` (printable ASCII, at most 30 bytes, quotes doubled):
    /// a holder's session shows it followed by ` t=<token>` (see `inspect.rs`).
    pub(super) app_name: String,
    /// Each lock held in a transaction of its own ([`PostgresOptions::transaction_pooling`],
    /// or a pooler seen sharing sessions at connect).
    pub(super) pooled: AtomicBool,
}

impl PgSql {
    pub(super) fn new(options: PostgresOptions, app_name: &str) -> Self {
        let app_name: String = app_name
            .chars()
            .filter(|c| (c.is_ascii_graphic() && *c != '\\') || *c == ' ')
            .take(30)
            .collect::<String>()
            .replace('\'', "''");
        let pooled = options.transaction_pooling.into();
        PgSql { options, version: OnceLock::new(), app_name, pooled }
    }

    /// Whether each lock is held in a transaction of its own.
    pub(super) fn pooled(&self) -> bool {
        self.pooled.load(Ordering::Relaxed)
    }

    /// The server-side key of `req`'s lock.
    pub(super) fn key(&self, req: &Acquire) -> PgKey {
        let record = super::inspect::record(req).into();
        match req.kind {
            // A read-write lock's two sides share one key of their own, apart from the mutex's.
            LockKind::Read | LockKind::Write => PgKey {
                name: req.name.clone(),
                key: advisory_key(&format!("{}{RW_SUFFIX}", req.key)),
                shared: req.kind == LockKind::Read,
                record,
                sem: None,
            },
            LockKind::Semaphore { permits } => {
                let sem = Sem::new(&req.key, permits);
                PgKey { name: req.name.clone(), key: sem.queue, shared: false, record, sem: Some(Arc::new(sem)) }
            }
            _ => PgKey { name: req.name.clone(), key: advisory_key(&req.key), shared: false, record, sem: None },
        }
    }

    /// The expression that draws a grant's token into the session's `application_name`
    /// (`<name> t=<token>`), where `lockctl` reads it.
    pub(super) fn token_sql(&self) -> String {
        // In a held transaction, the name is the transaction's own (the pooler's server
        // connection goes back to others with its own name at the commit).
        let local = self.pooled();
        format!("set_config('application_name', '{} t=' || nextval('{SEQUENCE}'), {local})", self.app_name)
    }

    /// The statements that bound the wait of the implicit transaction they start to `wait`:
    /// only `lock_timeout` does (at least 1 ms: 0 would mean no limit). A `statement_timeout`
    /// (or PostgreSQL 17's `transaction_timeout`) of the server, role, database or URL shorter
    /// than the wait must not cut it. A waiter dropped while its query is on its way (its
    /// cancel request may reach the server first, and be lost) closes its connection: the
    /// server, checking it during the wait (`client_connection_check_interval`, PostgreSQL 14),
    /// ends the session within the interval instead of keeping the request queued.
    pub(super) fn wait_settings(&self, wait: Duration) -> String {
        let ms = wait.as_millis().clamp(1, i32::MAX as u128);
        let version = self.version.get().copied().unwrap_or(0);
        let transaction = match version >= 170_000 {
            true => "SELECT set_config('transaction_timeout', '0', true); ",
            false => "",
        };
        let check = match version >= 140_000 {
            true => "SELECT set_config('client_connection_check_interval', '500', true); ",
            false => "",
        };
        format!(
            "{transaction}{check}SELECT set_config('statement_timeout', '0', true); \
             SELECT set_config('lock_timeout', '{ms}ms', true); "
        )
    }

    /// The query that takes a mutex's or read-write lock's `key` at once (`wait` is `None`)
    /// or waiting on the server, and draws its token: its answer's last value is the
    /// `application_name` with the token, or NULL (not granted at once). With the operation's
    /// name, for errors.
    pub(super) fn lock(&self, key: &PgKey, wait: Option<Duration>) -> (String, &'static str) {
        let (a, b) = key.key;
        let shared = if key.shared { "_shared" } else { "" };
        // The token goes out as the session's `application_name` (`<name> t=<token>`), where
        // `lockctl` reads it; the query's leading comment stays in `pg_stat_activity`.
        let (record, token) = (&key.record, self.token_sql());
        // Held by a transaction of its own (for a transaction-mode pooler): opened here, kept
        // open while held, committed by the release; a refusal rolls it back.
        let (begin, xact) = match self.pooled() {
            true => ("BEGIN; SELECT set_config('idle_in_transaction_session_timeout', '0', true); ", "_xact"),
            false => ("", ""),
        };
        match wait {
            None => (
                format!(
                    "{record}{begin}SELECT CASE WHEN pg_try_advisory{xact}_lock{shared}({a}, {b}) THEN {token} END"
                ),
                "attempt",
            ),
            Some(wait) => {
                let settings = self.wait_settings(wait);
                let lock = format!("SELECT pg_advisory{xact}_lock{shared}({a}, {b}); SELECT {token}");
                (format!("{record}{begin}{settings}{lock}"), "wait")
            }
        }
    }

    /// Whether the sequence exists (`t`): a sequence made beforehand is only used (a
    /// least-privilege role, `USAGE` on it and no `CREATE` on the schema, cannot run even
    /// `CREATE SEQUENCE IF NOT EXISTS`).
    pub(super) fn sequence_exists() -> String {
        format!("SELECT to_regclass('{SEQUENCE}') IS NOT NULL")
    }

    /// Creates the sequence, serialised by a transaction-scoped advisory lock (single-bigint
    /// key space, never one of the locks' two-int keys; the fence's migration in
    /// `lock-runtime/migrations/` takes the same): concurrent `CREATE SEQUENCE IF NOT EXISTS` can collide.
    pub(super) fn create_sequence() -> String {
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7226519712410372941); CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}; COMMIT"
        )
    }

    /// What ends a refused attempt: the transaction of the transaction mode, rolled back.
    pub(super) fn refused(&self) -> Option<&'static str> {
        self.pooled().then_some("ROLLBACK")
    }

    /// The query that releases `key` (a mutex or read-write lock): its answer's last value is
    /// `t` when the session held it. (The transaction mode's `COMMIT` answers nothing: a
    /// transaction answering holds its lock until then.)
    pub(super) fn unlock(&self, key: &PgKey) -> String {
        if self.pooled() {
            return "COMMIT".to_owned();
        }
        let (a, b) = key.key;
        let shared = if key.shared { "_shared" } else { "" };
        let app = &self.app_name;
        format!("SELECT pg_advisory_unlock{shared}({a}, {b}), set_config('application_name', '{app}', false)")
    }
}
