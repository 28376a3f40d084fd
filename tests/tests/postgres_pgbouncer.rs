//! PostgreSQL through a real PgBouncer in transaction mode (`pool_mode = transaction`), which
//! hands each transaction to any of its server connections: each lock is then held by a
//! transaction of its own (`PostgresOptions::transaction_pooling`, or seen at connect).
//! Mutual exclusion, waiting, read-write locks, fencing, `lost()`, a fixed lease, a dropped
//! waiter, inspection, and a SIGKILLed holder process, each through the pooler.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::backend::postgres::{PostgresBackend, PostgresOptions};
use lock_runtime::LockManager;
use lock_tests::pg_server::{PgBouncer, PgServer};

// The whole conformance suite through the pooler, each lock a transaction of its own.
lock_tests::conformance_suite!(
    {
        let server = PgServer::start();
        let bouncer = std::sync::Arc::new((PgBouncer::start(&server, 40), server));
        move |builder: lock_runtime::LockManagerBuilder| {
            let (url, _kept) = (bouncer.0.url(), bouncer.clone());
            async move {
                let options = PostgresOptions::new().transaction_pooling(true);
                builder.backend(PostgresBackend::connect_with(url, options).await.expect("connect"))
            }
        }
    },
    kinds = [lock_runtime::backend::LockKind::Read, lock_runtime::backend::LockKind::Write],
    inspect = true
);

async fn manager(bouncer: &PgBouncer) -> LockManager {
    let options = PostgresOptions::new().transaction_pooling(true);
    let backend = PostgresBackend::connect_with(bouncer.url(), options).await.expect("connect through PgBouncer");
    LockManager::builder().label("through-pgbouncer").backend(backend)
}

/// How many requests wait on an advisory lock, server-wide.
async fn advisory_waiters(admin: &tokio_postgres::Client) -> i64 {
    let sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    admin.query_one(sql, &[]).await.expect("pg_locks").get(0)
}

/// Until `check` holds, polled (the server tells nothing by itself); `margin` is far above
/// what it takes.
async fn until(what: &str, margin: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < margin, "{what}: not within {margin:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Before the transaction mode, a backend through the pooler passed the connect check (the
/// pooler kept its client on one server session there) and then two managers both held one
/// lock: their sessions were shared. The sharing is now seen, and each lock is a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_sharing_sessions_is_seen_and_locks_exclude() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, 4);
    let backend = PostgresBackend::connect(bouncer.url()).await.expect("connect");
    assert!(backend.transaction_pooling(), "the pooler's shared sessions were not seen");
    let a = LockManager::builder().backend(backend);
    let b = LockManager::connect(format!("{}?transaction_pooling=true", bouncer.url())).await.expect("by URL");
    let held = a.lock("order:1").await.expect("lock");
    let first = held.fencing_token();
    assert!(b.try_lock("order:1").await.expect("try").is_none(), "two holders through the pooler");
    held.release().await.expect("release");
    let next = b.try_lock("order:1").await.expect("try").expect("free after the release");
    assert!(next.fencing_token() > first);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_read_write_fencing_and_inspection() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, 8);
    let (a, b) = (manager(&bouncer).await, manager(&bouncer).await);

    // A waiter is granted at the release, with a higher token.
    let held = a.lock("ledger").await.expect("lock");
    let first = held.fencing_token();
    let (granted, ()) = tokio::join!(b.lock("ledger").wait(Duration::from_secs(30)), async {
        let admin = server.admin().await;
        until("the waiter queued", Duration::from_secs(30), async || advisory_waiters(&admin).await == 1).await;
        // Inspection through the pooler: the holder, its token, one waiter.
        let info = a.inspect("ledger").await.expect("inspect").expect("held");
        assert_eq!(info.fencing_token, Some(first), "{info:?}");
        assert_eq!(info.waiters, Some(1), "{info:?}");
        held.release().await.expect("release");
    });
    let granted = granted.expect("granted at the release");
    assert!(granted.fencing_token() > first);
    granted.release().await.expect("release");

    // Readers share, a writer waits for them.
    let r1 = a.read_lock("doc").await.expect("reader 1");
    let r2 = b.read_lock("doc").await.expect("reader 2");
    let beside = a.write_lock("doc").wait(Duration::ZERO).await.expect_err("a writer beside readers");
    assert!(beside.is_contended(), "{beside}");
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    a.write_lock("doc").await.expect("writer after the readers").release().await.expect("release");

    // Semaphores need sessions: refused by name.
    let err = a.semaphore("pool", 3).await.expect_err("no semaphores");
    assert!(err.to_string().contains("semaphore"), "{err}");
}

/// The server ends the holder's session (an operator, a restart): the pooler closes the
/// holder's connection, `lost()` fires, and the lock is free for the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_server_session_ends_is_told_and_the_lock_is_free() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, 4);
    let (a, b) = (manager(&bouncer).await, manager(&bouncer).await);
    let held = a.lock("job").await.expect("lock");
    let admin = server.admin().await;
    let sql = "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted";
    admin.execute(sql, &[]).await.expect("terminate the holder's session");
    tokio::time::timeout(Duration::from_secs(30), held.lost()).await.expect("lost() fires");
    let next = b.lock("job").wait(Duration::from_secs(10)).await.expect("free");
    next.release().await.expect("release");
}

/// A fixed lease ends by closing the holder's connection: the pooler ends its transaction and
/// the next waiter is granted; a waiter dropped while it waits leaves nothing queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_ends_and_a_dropped_waiter_leaves_nothing() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, 4);
    let (a, b) = (manager(&bouncer).await, manager(&bouncer).await);
    let admin = server.admin().await;
    let held = a.lock("lease").lease(Duration::from_millis(500)).await.expect("lock");
    {
        let waiting = b.lock("lease").wait(Duration::from_secs(60));
        tokio::select! {
            out = waiting => panic!("granted while held: {:?}", out.map(|g| g.fencing_token())),
            () = until("the waiter queued", Duration::from_secs(30), async || advisory_waiters(&admin).await == 1) => {}
        }
    }
    until("the dropped waiter left", Duration::from_secs(30), async || advisory_waiters(&admin).await == 0).await;
    let next = b.lock("lease").wait(Duration::from_secs(30)).await.expect("granted when the lease ends");
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.expect("release");
    drop(held);
}

/// Two processes through the pooler: a holder process killed with SIGKILL frees its lock as
/// soon as the pooler sees its connection close (the kernel closes it), and a waiter of this
/// process is granted it; the time is printed as a figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holder_process_frees_its_lock() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, 4);
    let url = format!("{}?transaction_pooling=true", bouncer.url());
    let mut child = Command::new(env!("CARGO_BIN_EXE_file_worker"))
        .args(["hold", &url, "shared-job"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the worker starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the worker's answer");
    let token: u64 = line.trim().strip_prefix("held ").unwrap_or_else(|| panic!("worker: {line}")).parse().unwrap();
    let here = manager(&bouncer).await;
    assert!(here.try_lock("shared-job").await.expect("try").is_none(), "held by the other process");
    let killed = Instant::now();
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let next = here.lock("shared-job").wait(Duration::from_secs(30)).await.expect("freed by the holder's death");
    let freed = killed.elapsed();
    lock_tests::figure("a_sigkilled_holder_process_frees_its_lock", &format!("freed {freed:?} after the SIGKILL"));
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
}
