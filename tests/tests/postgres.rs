//! The PostgreSQL backend against real `postgres` servers this test binary starts (each test
//! its own, on a free loopback port, from one `initdb` template): the conformance suite, a
//! holder's session terminated by the server (`pg_terminate_backend`), a server restart, and
//! bad or unreachable URLs.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::postgres::{advisory_key, PostgresBackend, PostgresOptions};
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::pg_server::{free_port, PgServer};

lock_tests::conformance_suite!(
    {
        let server = Arc::new(PgServer::start());
        move |builder: LockManagerBuilder| {
            let (url, _server) = (server.url(), server.clone());
            async move { builder.postgres(url).await.expect("connect") }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

async fn raw(server: &PgServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.expect("raw");
    tokio::spawn(connection);
    client
}

/// The server pid of the session holding the advisory lock of `key`.
async fn holder_pid(client: &tokio_postgres::Client, key: &str) -> i32 {
    let (a, b) = advisory_key(key);
    let row = client
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
             AND classid::int8 = $1 AND objid::int8 = $2",
            &[&i64::from(a as u32), &i64::from(b as u32)],
        )
        .await;
    match row {
        Ok(row) => row.get(0),
        Err(e) => panic!("no holder of {key}: {e}"),
    }
}

#[tokio::test]
async fn malformed_url_is_invalid() {
    for url in ["", "nonsense", "http://127.0.0.1:5432", "postgres://127.0.0.1:notaport/db", "postgres://u@[::1/db"] {
        let err = LockManager::postgres(url).await.expect_err(url);
        assert!(err.is_invalid(), "{url}: {err}");
    }
    let zero = PostgresOptions::new().operation_timeout(Duration::ZERO);
    let err = PostgresBackend::connect_with("postgres://u@127.0.0.1:5432/db", zero).await.expect_err("zero timeout");
    assert!(err.is_invalid(), "{err}");
}

#[tokio::test]
async fn unreachable_server_is_backend_within_the_timeout() {
    let timeout = Duration::from_millis(400);
    let started = Instant::now();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let err = PostgresBackend::connect_with(&url, PostgresOptions::new().operation_timeout(timeout))
        .await
        .expect_err("refused");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < timeout + Duration::from_secs(1), "took {:?}", started.elapsed());
}

/// `pg_terminate_backend` of the holder's session: `lost()` fires, a waiter (queued on the
/// server) gets the lock, and the old holder's release is `is_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_holder_session_fires_lost_and_hands_over() {
    let server = PgServer::start();
    let m = LockManager::builder().prefix("t:").postgres(server.url()).await.expect("connect");
    let admin = raw(&server).await;
    let holder = m.lock("victim").await.expect("holder");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("victim").wait(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = holder_pid(&admin, "t:victim").await;
    let ok: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
    assert!(ok);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), holder.lost()).await.expect("lost() fired");
    assert!(started.elapsed() < Duration::from_secs(2), "lost() after {:?}", started.elapsed());
    let next = waiter.await.expect("task").expect("the waiter gets the lock");
    assert!(next.fencing_token() > holder.fencing_token());
    assert!(holder.release().await.expect_err("terminated").is_lost());
    next.release().await.expect("release");
}

/// A server restart (fast shutdown): held locks are lost, and the manager works again once the
/// server is back, with fencing tokens still increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_fires_lost_and_the_manager_recovers() {
    let mut server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let before = m.lock("restarted").await.expect("holder");
    let idle = m.lock("idle").await.expect("idle");
    idle.release().await.expect("release"); // an idle connection to be found closed later
    let restarted = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    });
    let token = before.fencing_token();
    tokio::time::timeout(Duration::from_secs(15), before.lost()).await.expect("lost() fired");
    assert!(before.release().await.expect_err("restarted").is_lost());
    let _server = restarted.await.expect("restart");
    let after = lock_tests::lock_after_outage(&m, "restarted").await;
    assert!(after.fencing_token() > token, "tokens survive the restart");
    after.release().await.expect("release");
}

/// Waiters queued on the server for advisory locks (`pg_locks`, not granted).
async fn queued(client: &tokio_postgres::Client) -> i64 {
    let row = client
        .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", &[])
        .await
        .expect("pg_locks");
    row.get(0)
}

/// A waiter dropped while it waits on the server (in `pg_advisory_lock`) leaves the server's
/// queue at once (its query is cancelled and its connection closed), long before its `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_the_server_queue() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let admin = raw(&server).await;
    let holder = m.lock("queued").await.expect("holder");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("queued").wait(Duration::from_secs(30)).await.map(drop) });
    lock_tests::eventually("the waiter queued on the server", Duration::from_secs(5), async || {
        lock_tests::reached(queued(&admin).await, 1)
    })
    .await;
    waiter.abort();
    let _ = waiter.await;
    lock_tests::eventually("the dropped waiter gone from the server's queue", Duration::from_secs(2), async || {
        lock_tests::reached(queued(&admin).await, 0)
    })
    .await;
    holder.release().await.expect("release");
}

/// The server pid of the session whose grant drew `token` (its `application_name`).
async fn pid_of_token(client: &tokio_postgres::Client, token: u64) -> i32 {
    let pattern = format!("% t={token}");
    let row = client.query_one("SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1", &[&pattern]).await;
    row.unwrap_or_else(|e| panic!("no session drew token {token}: {e}")).get(0)
}

/// Semaphores on PostgreSQL: the waiter at the head of the queue waits on every permit, so it
/// is granted as soon as any holder goes, whichever it is and however (a session ended by
/// `pg_terminate_backend`, a release); the next waiter queues on the server behind it and takes
/// the following permit. Nothing stays queued on the server afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_is_granted_when_any_holder_goes() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let admin = raw(&server).await;
    let mut holders = Vec::new();
    for _ in 0..3 {
        holders.push(m.semaphore("pool", 3).await.expect("permit"));
    }
    assert!(m.try_semaphore("pool", 3).await.expect("try").is_none(), "three permits only");
    let first = tokio::spawn({
        let m = m.clone();
        async move { m.semaphore("pool", 3).wait(Duration::from_secs(20)).await }
    });
    // The head waits on the three permits, each on a connection of its own.
    lock_tests::eventually("the head waiting on every permit", Duration::from_secs(5), async || {
        lock_tests::reached(queued(&admin).await, 3)
    })
    .await;
    let second = tokio::spawn({
        let m = m.clone();
        async move { m.semaphore("pool", 3).wait(Duration::from_secs(20)).await }
    });
    // The next waiter queues behind it, on the queue key.
    lock_tests::eventually("the next waiter queued", Duration::from_secs(5), async || {
        lock_tests::reached(queued(&admin).await, 4)
    })
    .await;
    let middle = holders.remove(1);
    let pid = pid_of_token(&admin, middle.fencing_token()).await;
    let ended: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
    assert!(ended);
    let started = Instant::now();
    let got = first.await.expect("task").expect("granted when the middle holder's session ended");
    assert!(started.elapsed() < Duration::from_secs(2), "granted after {:?}", started.elapsed());
    assert!(got.fencing_token() > middle.fencing_token());
    tokio::time::timeout(Duration::from_secs(5), middle.lost()).await.expect("the ended holder told");
    // The second waiter is the head now: a release lets it in.
    holders.remove(0).release().await.expect("release");
    let next = second.await.expect("task").expect("granted at the release");
    lock_tests::eventually("nothing queued on the server", Duration::from_secs(5), async || {
        lock_tests::reached(queued(&admin).await, 0)
    })
    .await;
    // Listed as permits of three, each with its holder's token.
    let listed = m.list("pool").await.expect("list");
    assert_eq!(listed.len(), 3, "{listed:?}");
    for info in &listed {
        assert_eq!(info.kind, Some(lock_runtime::backend::LockKind::Semaphore { permits: 3 }), "{info:?}");
        assert!(info.fencing_token.is_some(), "{info:?}");
    }
    for permit in [got, next, holders.remove(0)] {
        permit.release().await.expect("release");
    }
    assert!(m.list("pool").await.expect("list").is_empty());
}

/// Regression: a semaphore waiter whose wait ran out at the head of the queue gave its
/// connection back to the idle set still holding the queue key, so waiters of other processes
/// queued behind an idle connection forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_semaphore_waiter_leaves_the_queue() {
    let server = PgServer::start();
    let holder = LockManager::postgres(server.url()).await.expect("connect");
    let timed_out = LockManager::postgres(server.url()).await.expect("connect");
    let other = LockManager::postgres(server.url()).await.expect("connect");
    let permit = holder.semaphore("q", 1).await.expect("permit");
    let err = timed_out.semaphore("q", 1).wait(Duration::from_millis(300)).await.expect_err("all taken");
    assert!(err.is_contended(), "{err}");
    let admin = raw(&server).await;
    let next = tokio::spawn(async move { other.semaphore("q", 1).wait(Duration::from_secs(5)).await });
    lock_tests::eventually("the next waiter queued on the server", Duration::from_secs(5), async || {
        lock_tests::reached(queued(&admin).await, 1)
    })
    .await;
    permit.release().await.expect("release");
    let next = next.await.expect("task").expect("the next waiter gets the freed permit");
    next.release().await.expect("release");
}

/// A semaphore of more permits than a head waiter can watch is refused at once, naming the
/// limit.
#[tokio::test]
async fn a_semaphore_beyond_the_permit_limit_is_invalid() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let max = lock_runtime::backend::postgres::MAX_PERMITS;
    let err = m.semaphore("wide", max + 1).await.expect_err("too many permits");
    assert!(err.is_invalid() && err.to_string().contains(&max.to_string()), "{err}");
    m.semaphore("wide", max).await.expect("the limit itself").release().await.expect("release");
}

/// Regression (issue 24's audit): a `statement_timeout` shorter than the `wait` (here the
/// URL's; the server's, the role's or the database's do the same) cut the server-side wait,
/// and the waiter failed with an `is_backend` error reading "db error". The wait must run its
/// course and be granted at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_statement_timeout_does_not_cut_a_wait() {
    let server = PgServer::start();
    let holder = LockManager::postgres(server.url()).await.unwrap();
    let waiter = LockManager::postgres(format!("{}?options=-c%20statement_timeout%3D200", server.url())).await.unwrap();
    let guard = holder.lock("job").await.unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("job").wait(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(800)).await; // well past the statement timeout
    assert!(!waiting.is_finished(), "the waiter still waits");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let taken = waiting.await.unwrap().expect("granted at the release, past the statement timeout");
    assert!(taken.fencing_token() > token);
}

/// Every PostgreSQL error carries the server's message and SQLSTATE, not "db error" alone.
#[tokio::test]
async fn server_errors_carry_the_message_and_sqlstate() {
    let server = PgServer::start();
    let url = format!("{}/no_such_db", server.url().rsplit_once('/').unwrap().0);
    let err = LockManager::postgres(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(err.is_backend(), "{text}");
    assert!(text.contains("3D000") && text.contains("does not exist"), "{text}");
}

/// An election on PostgreSQL: the leader's session terminated (`pg_terminate_backend`, as a
/// crashed leader's connection ends) deposes it at once (`lost()`), the campaigner queued on the
/// server is elected with a higher token, and an observer reports the hand-over with the new
/// leader's label, read from `pg_stat_activity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_leader_is_replaced_at_once_and_observed() {
    let server = PgServer::start();
    let leader_m = LockManager::builder().prefix("e:").label("first").postgres(server.url()).await.expect("connect");
    let next_m = LockManager::builder().prefix("e:").label("second").postgres(server.url()).await.expect("connect");
    let admin = raw(&server).await;
    let leader = leader_m.election("scheduler").campaign().await.expect("lead");
    let mut watch = next_m.election("scheduler").observe();
    let seen = watch.changed().await.expect("look").expect("a leader");
    assert_eq!((seen.holder().label(), seen.fencing_token()), (Some("first"), Some(leader.fencing_token())));
    let campaign = tokio::spawn(async move { next_m.election("scheduler").campaign().await });
    lock_tests::eventually("the campaign queued on the server", Duration::from_secs(10), async || {
        let sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
        match admin.query_one(sql, &[]).await.expect("pg_locks").get::<_, i64>(0) {
            1 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    let pid = holder_pid(&admin, "e:scheduler").await;
    let ok: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate").get(0);
    assert!(ok);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), leader.lost()).await.expect("deposed");
    let elected = tokio::time::timeout(Duration::from_secs(5), campaign).await.expect("in time").expect("task");
    let elected = elected.expect("the queued campaigner is elected");
    assert!(started.elapsed() < Duration::from_secs(2), "hand-over took {:?}", started.elapsed());
    assert!(elected.fencing_token() > leader.fencing_token());
    let seen = tokio::time::timeout(Duration::from_secs(5), watch.changed()).await.expect("in time").expect("look");
    let seen = seen.expect("the new leader");
    assert_eq!((seen.holder().label(), seen.fencing_token()), (Some("second"), Some(elected.fencing_token())));
}

/// A waiter dropped while it waits on the server, whose cancel request never arrives (lost on
/// the way, or sent before the server started the query and so for nothing): its session does
/// not stay queued on the server for the rest of its 60 s `wait`. Its connection is closed at
/// once, and the server, told to check it during the wait (`client_connection_check_interval`),
/// ends the session within half a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_whose_cancel_is_lost_leaves_the_server() {
    use lock_tests::etcd_server::tcp_proxy::TcpProxy;
    let server = PgServer::start();
    let proxy = TcpProxy::start(server.port()).await;
    let holder = LockManager::postgres(server.url()).await.expect("connect");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let options = PostgresOptions::new().operation_timeout(Duration::from_millis(500));
    let m = LockManager::builder().backend(PostgresBackend::connect_with(&url, options).await.expect("connect"));
    let admin = raw(&server).await;
    let held = holder.lock("queued").await.expect("holder");
    let count = |sql: &'static str| {
        let admin = &admin;
        async move { admin.query_one(sql, &[]).await.expect(sql).get::<_, i64>(0) }
    };
    const WAITING: &str = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    const SESSIONS: &str =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";

    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("queued").wait(Duration::from_secs(60)).await.map(drop) })
    };
    lock_tests::eventually("the waiter is queued on the server", Duration::from_secs(10), async || {
        if count(WAITING).await == 1 {
            Ok(())
        } else {
            Err("not queued yet")
        }
    })
    .await;
    let before = count(SESSIONS).await;
    proxy.silence_new(); // its cancel request will not arrive
    waiter.abort();
    let _ = waiter.await;
    let dropped = Instant::now();
    lock_tests::eventually("the dropped waiter's session ends", Duration::from_secs(5), async || {
        match (count(WAITING).await, count(SESSIONS).await) {
            (0, now) if now < before => Ok(()),
            seen => Err(format!("(waiting, sessions) = {seen:?}, {before} sessions before the drop")),
        }
    })
    .await;
    eprintln!("the dropped waiter's session ended {:?} after the drop", dropped.elapsed());
    held.release().await.expect("release");
}

/// Every valid name is inspectable and observable, however long: a lock and an election whose
/// names' hex passes the 1 kB `pg_stat_activity.query` keeps (`track_activity_query_size`) are
/// seen by `inspect`, `leader()` and `observe()` with their holder and token, on a connection
/// of their own and on a carrier. Before, names of 700 and 1,024 bytes were not held as far as
/// `inspect` and `leader()` could tell, and at 500 bytes the holder was `unknown/0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_are_inspected_and_observed() {
    let server = PgServer::start();
    for multiplexing in [0, 4] {
        let url = format!("{}?multiplexing={multiplexing}", server.url());
        let m = LockManager::builder().label("long-names").connect(&url).await.expect("connect");
        for len in [500, 700, 1024] {
            let name = format!("{len}:{}", "n".repeat(len - 1 - len.to_string().len()));
            assert_eq!(name.len(), len);
            let guard = m.lock(&name).await.expect("lock");
            let seen = m.inspect(&name).await.expect("inspect").unwrap_or_else(|| panic!("{len} bytes: not seen held"));
            assert_eq!(seen.fencing_token, Some(guard.fencing_token()), "{len} bytes, multiplexing {multiplexing}");
            let holder = seen.holder.map(|h| h.to_string()).unwrap_or_default();
            assert!(holder.ends_with("/long-names"), "{len} bytes: holder {holder:?}");
            guard.release().await.expect("release");
            assert!(m.inspect(&name).await.expect("inspect").is_none(), "{len} bytes: seen after the release");

            let election = m.election(&name);
            let mut watch = election.observe();
            assert!(watch.changed().await.expect("look").is_none());
            let leading = election.campaign().await.expect("campaign");
            let leader = election.leader().await.expect("leader()").expect("someone leads");
            assert_eq!(leader.fencing_token(), Some(leading.fencing_token()), "{len} bytes");
            let next = tokio::time::timeout(Duration::from_secs(10), watch.changed()).await.expect("in time");
            assert_eq!(next.expect("look").and_then(|l| l.fencing_token()), Some(leading.fencing_token()));
            leading.resign().await.expect("resign");
        }
    }
}
