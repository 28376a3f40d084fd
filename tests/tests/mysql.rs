//! The MySQL backend against real MariaDB servers this test binary starts (each test its own,
//! on a free loopback port, from one `mariadb-install-db` template): the conformance suite, an
//! operator's `KILL` of a holder's connection, a server restart (`SIGKILL`: tokens go on from
//! the counter table), a dropped waiter's query ended on the server, names
//! over 64 characters, and bad or unreachable URLs.

#![cfg(feature = "mysql")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::mysql::{lock_name, MysqlBackend, MysqlOptions};
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::mysql_server::{free_port, MysqlServer};
use mysql_async::prelude::Queryable;

lock_tests::conformance_suite!(
    {
        let server = Arc::new(MysqlServer::start());
        move |builder: LockManagerBuilder| {
            let (url, _server) = (server.url(), server.clone());
            async move { builder.mysql(url).await.expect("connect") }
        }
    },
    kinds = [],
    inspect = true
);

/// A connection of the test's own (an observer), tried again for up to 5 s: a CI run under load
/// saw an observer's connection closed under it, and the next one reset as it was made.
async fn raw(server: &MysqlServer) -> mysql_async::Conn {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match mysql_async::Conn::new(mysql_async::Opts::from_url(&server.url()).unwrap()).await {
            Ok(conn) => return conn,
            Err(e) if Instant::now() < deadline => {
                eprintln!("the observer could not connect ({e}); trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("raw connection: {e}"),
        }
    }
}

/// The count `sql` reads on the observer connection `admin`, connected again once if the
/// server closed it (a busy CI machine saw an observer's connection closed under it).
async fn waiting(server: &MysqlServer, admin: &mut mysql_async::Conn, sql: &str) -> i64 {
    match admin.query_first::<i64, _>(sql).await {
        Ok(count) => count.unwrap_or(0),
        Err(e) => {
            eprintln!("the observer's connection failed ({e}); connecting again");
            *admin = raw(server).await;
            admin.query_first::<i64, _>(sql).await.expect("processlist").unwrap_or(0)
        }
    }
}

/// The connection id holding the server-side lock of `key`, if any.
async fn holder_id(conn: &mut mysql_async::Conn, key: &str) -> Option<u64> {
    conn.exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (lock_name(key),)).await.unwrap().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_connection_fires_lost_and_hands_over() {
    let server = MysqlServer::start();
    let options = MysqlOptions::new().heartbeat(Duration::from_millis(200));
    let holder = LockManager::builder().backend(MysqlBackend::connect_with(server.url(), options).await.unwrap());
    let waiter = LockManager::mysql(server.url()).await.unwrap();
    let guard = holder.lock("job").await.unwrap();
    let next = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("job").wait(Duration::from_secs(10)).await }
    });
    let mut admin = raw(&server).await;
    let id = holder_id(&mut admin, "job").await.expect("held");
    let killed = Instant::now();
    admin.query_drop(format!("KILL {id}")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), guard.lost()).await.expect("lost() fires after the KILL");
    let fired = killed.elapsed();
    assert!(fired < Duration::from_millis(1500), "lost() after {fired:?} (heartbeat 200 ms)");
    let taken = next.await.unwrap().expect("the waiter takes over");
    assert!(taken.fencing_token() > guard.fencing_token());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_fires_lost_and_the_manager_recovers() {
    let mut server = MysqlServer::start();
    let options = MysqlOptions::new().heartbeat(Duration::from_millis(200)).operation_timeout(Duration::from_secs(2));
    let manager = LockManager::builder().backend(MysqlBackend::connect_with(server.url(), options).await.unwrap());
    let guard = manager.lock("job").await.unwrap();
    let before = guard.fencing_token();
    server.restart();
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() fires across the restart");
    let again = manager.lock("job").wait(Duration::from_secs(5)).await.expect("locks again after the restart");
    assert!(again.fencing_token() > before, "{} after {before}", again.fencing_token());
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_query_is_ended_on_the_server() {
    let server = MysqlServer::start();
    let manager = LockManager::mysql(server.url()).await.unwrap();
    let guard = manager.lock("job").await.unwrap();
    let other = LockManager::mysql(server.url()).await.unwrap();
    let waiting = tokio::spawn(async move { other.lock("job").wait(Duration::from_secs(60)).await });
    let mut admin = raw(&server).await;
    let count = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(%'";
    let started = Instant::now();
    while admin.query_first::<u64, _>(count).await.unwrap() != Some(1) {
        assert!(started.elapsed() < Duration::from_secs(5), "the waiter's GET_LOCK never showed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    waiting.abort();
    let _ = waiting.await;
    let started = Instant::now();
    while admin.query_first::<u64, _>(count).await.unwrap() != Some(0) {
        assert!(started.elapsed() < Duration::from_secs(2), "the dropped waiter's GET_LOCK still runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    guard.release().await.unwrap();
    assert_eq!(holder_id(&mut admin, "job").await, None, "nobody was handed the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_over_64_characters_are_hashed() {
    let server = MysqlServer::start();
    let manager = LockManager::mysql(server.url()).await.unwrap();
    let other = LockManager::mysql(server.url()).await.unwrap();
    let (a, b) = (format!("{}-a", "x".repeat(80)), format!("{}-b", "x".repeat(80)));
    let ga = manager.lock(&a).await.unwrap();
    let gb = manager.try_lock(&b).await.unwrap().expect("a different long name is another lock");
    assert!(other.try_lock(&a).await.unwrap().is_none(), "the same long name excludes");
    let mut admin = raw(&server).await;
    assert!(holder_id(&mut admin, &a).await.is_some());
    ga.release().await.unwrap();
    gb.release().await.unwrap();
}

#[tokio::test]
async fn malformed_urls_are_invalid() {
    for url in
        ["", "nonsense", "postgres://u@127.0.0.1/db", "mysql://u@127.0.0.1:notaport/db", "mysql://u@127.0.0.1:3306"]
    {
        let err = LockManager::mysql(url).await.expect_err(url);
        assert!(err.is_invalid(), "{url}: {err}");
    }
    let zero = MysqlOptions::new().operation_timeout(Duration::ZERO);
    assert!(MysqlBackend::connect_with("mysql://u@127.0.0.1:3306/db", zero).await.unwrap_err().is_invalid());
}

#[tokio::test]
async fn unreachable_server_is_backend_within_the_timeout() {
    let timeout = Duration::from_millis(400);
    let started = Instant::now();
    let url = format!("mysql://app:secret@127.0.0.1:{}/app", free_port());
    let err = MysqlBackend::connect_with(url, MysqlOptions::new().operation_timeout(timeout)).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_wrong_password_is_backend_with_the_server_message() {
    let server = MysqlServer::start();
    let url = format!("mysql://app:wrong@127.0.0.1:{}/app", server.port());
    let err = LockManager::mysql(url).await.unwrap_err();
    assert!(err.is_backend() && err.to_string().contains("Access denied"), "{err}");
}

/// A waiter dropped while it waits on the server, whose `KILL QUERY` never arrives (lost on
/// the way, or there before the `GET_LOCK` and so for nothing): its `GET_LOCK` does not stay
/// queued for the rest of its 60 s `wait`. Its connection is closed once the kill is given up
/// (the operation timeout), and the server ends a `GET_LOCK` whose client closed its socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_whose_kill_is_lost_leaves_the_server() {
    use lock_tests::etcd_server::tcp_proxy::TcpProxy;
    let server = MysqlServer::start();
    let proxy = TcpProxy::start(server.port()).await;
    let holder = LockManager::builder().mysql(server.url()).await.expect("connect");
    let url = server.url().replace(&format!(":{}/", server.port()), &format!(":{}/", proxy.port()));
    let options = MysqlOptions::new().operation_timeout(Duration::from_millis(500));
    let m = LockManager::builder().backend(MysqlBackend::connect_with(&url, options).await.expect("connect"));
    let held = holder.lock("queued").await.expect("holder");
    let mut admin = raw(&server).await;
    const WAITING: &str =
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%GET_LOCK%' AND ID <> CONNECTION_ID()";
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("queued").wait(Duration::from_secs(60)).await.map(drop) })
    };
    let started = Instant::now();
    while waiting(&server, &mut admin, WAITING).await != 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the waiter never queued on the server");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.silence_new(); // the kill goes on a new connection, and will not arrive
    waiter.abort();
    let _ = waiter.await;
    let dropped = Instant::now();
    while waiting(&server, &mut admin, WAITING).await != 0 {
        assert!(dropped.elapsed() < Duration::from_secs(5), "the dropped waiter is still queued on the server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("the dropped waiter's GET_LOCK ended {:?} after the drop", dropped.elapsed());
    held.release().await.expect("release");
}

/// Inspection reads the record each grant writes: the holder, its token and kind while held;
/// nothing once released (the record is deleted) or once the holder's session was killed (its
/// record is not shown, `IS_USED_LOCK` no longer naming its connection, and swept later); a lock
/// another client holds with a plain `GET_LOCK` is shown held, with no token and no holder; a
/// forced release frees the lock and the holder is told `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_reads_the_grants_record_and_only_while_it_holds() {
    use lock_runtime::backend::{ForceRelease, Inspect, LockKind};
    let server = MysqlServer::start();
    let options = MysqlOptions::new().heartbeat(Duration::from_millis(200));
    let backend = MysqlBackend::connect_with(server.url(), options).await.unwrap();
    let manager = LockManager::builder().label("ledger-worker").backend(backend.clone());
    let mut admin = raw(&server).await;

    let guard = manager.lock("ledger").await.unwrap();
    let info = backend.inspect("ledger").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, Some(guard.fencing_token()));
    assert_eq!(info.kind, Some(LockKind::Exclusive));
    assert_eq!(info.holder.as_ref().and_then(|h| h.label()), Some("ledger-worker"), "{info:?}");
    assert_eq!(info.holder.as_ref().and_then(|h| h.pid()), Some(std::process::id()));
    assert!(info.session_bound && info.age.is_some(), "{info:?}");
    let listed: Vec<_> =
        backend.list("").await.unwrap().into_iter().map(|i| (i.key, i.owner, i.fencing_token)).collect();
    assert_eq!(listed, [(info.key.clone(), info.owner.clone(), info.fencing_token)]);
    guard.release().await.unwrap();
    assert_eq!(backend.inspect("ledger").await.unwrap(), None);
    assert_eq!(records(&mut admin).await, 0, "the release deletes its record");

    // Killed: the record stays (until a sweep), unseen.
    let guard = manager.lock("ledger").await.unwrap();
    let id = holder_id(&mut admin, "ledger").await.expect("held");
    admin.query_drop(format!("KILL {id}")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() after the KILL");
    assert!(records(&mut admin).await <= 1);
    assert_eq!(backend.inspect("ledger").await.unwrap(), None);
    assert!(backend.list("").await.unwrap().is_empty());

    // Held by another client.
    admin.query_drop("SELECT GET_LOCK('by-hand', 0)").await.unwrap();
    let info = backend.inspect("by-hand").await.unwrap().expect("held by the other client");
    assert_eq!((info.fencing_token, info.holder.clone(), info.kind), (None, None, None), "{info:?}");

    // Forced: the owner checked, then the holder's session ended.
    let guard = manager.lock("ledger").await.unwrap();
    let owner = backend.inspect("ledger").await.unwrap().expect("held").owner;
    let other = backend.force_release("ledger", Some("someone-else")).await.unwrap();
    assert_eq!(other, ForceRelease::OwnerChanged(owner.clone()));
    assert_eq!(backend.force_release("ledger", Some(&owner)).await.unwrap(), ForceRelease::Released(owner));
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() after the forced release");
    let again = manager.lock("ledger").await.expect("free again");
    assert!(again.fencing_token() > guard.fencing_token());
    assert_eq!(backend.force_release("nobody", None).await.unwrap(), ForceRelease::NotHeld);
}

/// A look never shows a grant half made (issue 56): a lock held with no record, its record
/// written 50 ms later by the session that holds it (as a grant writes it in the round trip
/// after `GET_LOCK`), is shown with that record, not as held by nobody known. (On a loaded
/// machine the look may start after the write: the test then passes either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_waits_for_the_record_of_a_grant_being_made() {
    use lock_runtime::backend::Inspect;
    let server = MysqlServer::start();
    let backend = MysqlBackend::connect(server.url()).await.unwrap();
    let manager = LockManager::builder().backend(backend.clone());
    drop(manager.lock("made").await.unwrap()); // the holders' table made
    let mut holder = raw(&server).await;
    holder.query_drop("SELECT GET_LOCK('granting', 0)").await.unwrap();
    let writing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        holder
            .query_drop(
                "REPLACE INTO lock_runtime_holders (name, lock_key, owner, holder, token, connection, since) \
                 VALUES ('granting', 'granting', 'owner-7', 'host-1/4242/billing', 7, CONNECTION_ID(), NOW(6))",
            )
            .await
            .unwrap();
        holder
    });
    let seen = backend.inspect("granting").await.unwrap().expect("held");
    let _holder = writing.await.unwrap();
    assert_eq!((seen.owner.as_str(), seen.fencing_token), ("owner-7", Some(7)), "a grant half made: {seen:?}");
}

/// The rows of the holders' records table.
async fn records(admin: &mut mysql_async::Conn) -> u64 {
    admin.query_first::<u64, _>("SELECT COUNT(*) FROM lock_runtime_holders").await.unwrap().unwrap()
}

/// With `record_holders(false)` a grant writes no record (the holders' table is not even made)
/// and the backend offers no inspection: an election's `leader()` is refused as invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_holder_records_nothing_is_written_and_nothing_inspected() {
    let server = MysqlServer::start();
    let options = MysqlOptions::new().record_holders(false);
    let manager = LockManager::builder().backend(MysqlBackend::connect_with(server.url(), options).await.unwrap());
    let guard = manager.lock("ledger").await.unwrap();
    assert!(!manager.can_inspect());
    let refused = manager.election("ledger").leader().await.expect_err("no inspection");
    assert!(refused.is_invalid(), "{refused}");
    let mut admin = raw(&server).await;
    let tables: Vec<String> = admin.query("SHOW TABLES LIKE 'lock_runtime_holders'").await.unwrap();
    assert!(tables.is_empty(), "{tables:?}");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    assert!(manager.lock("ledger").await.unwrap().fencing_token() > token);
}

/// A look after the server closed the backend's idle connections (an operator's `KILL`, the
/// server's `wait_timeout`) succeeds: the dead idle connection it finds is replaced (without
/// that, the look fails with "connection closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_after_the_idle_connections_were_closed_succeeds() {
    use lock_runtime::backend::Inspect;
    let server = MysqlServer::start();
    let backend = MysqlBackend::connect_with(server.url(), MysqlOptions::new().multiplexing(0)).await.unwrap();
    let manager = LockManager::builder().backend(backend.clone());
    manager.lock("ledger").await.unwrap().release().await.unwrap();
    assert!(backend.idle_connections() > 0);
    let mut admin = raw(&server).await;
    let sql = "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND USER = 'app'";
    let ids: Vec<u64> = admin.query(sql).await.unwrap();
    let mut killed = 0;
    for id in ids {
        match admin.query_drop(format!("KILL {id}")).await {
            // Gone meanwhile (the connection of a test helper that closed).
            Err(mysql_async::Error::Server(e)) if e.code == 1094 => {}
            answer => killed += answer.map(|()| 1).unwrap(),
        }
    }
    assert!(killed > 0, "the backend's idle connection was killed");
    assert_eq!(backend.inspect("ledger").await.expect("a look on a new connection"), None);
    let guard = manager.lock("ledger").await.unwrap();
    let info = backend.inspect("ledger").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, Some(guard.fencing_token()));
}

/// Regression (issue 56): the records of sessions that ended were never deleted (only replaced
/// at the same name's next grant), so with names like `order:{id}` every killed carrier or
/// cancelled grant left rows until the in-memory table was full and every lock on the server
/// failed. Now a new connection sweeps the records no live session holds (and carriers and idle
/// connections sweep every 30 s): 2,000 locks held on the carriers, the carriers killed, their
/// 2,000 records are gone once the next lock opens a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_of_killed_carriers_are_swept() {
    let server = MysqlServer::start();
    let manager = LockManager::builder().backend(MysqlBackend::connect(server.url()).await.unwrap());
    let mut admin = raw(&server).await;
    let mut held = Vec::new();
    for i in 0..2000 {
        held.push(manager.lock(format!("order:{i}")).await.expect("lock"));
    }
    assert_eq!(records(&mut admin).await, 2000);
    let carriers: Vec<u64> = admin.query("SELECT DISTINCT connection FROM lock_runtime_holders").await.unwrap();
    for id in &carriers {
        admin.query_drop(format!("KILL {id}")).await.unwrap();
    }
    for guard in &held {
        tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.expect("lost() once its carrier was killed");
    }
    assert_eq!(records(&mut admin).await, 2000, "left by the killed carriers");
    let next = manager.lock("order:next").await.expect("the next lock");
    assert_eq!(records(&mut admin).await, 1, "the killed carriers' records are swept");
    next.release().await.unwrap();
    assert_eq!(records(&mut admin).await, 0);
}

/// Regression (issue 56): a holder's record the server will not write (here: the in-memory
/// table full, error 1114) failed the grant, on carriers and own connections alike; now the
/// lock is granted, and inspection shows it held with no holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_holders_table_fails_no_lock() {
    use lock_runtime::backend::Inspect;
    let server = MysqlServer::start();
    let backend = MysqlBackend::connect(server.url()).await.unwrap();
    let manager = LockManager::builder().backend(backend.clone());
    let mut admin = raw(&server).await;
    // Rebuilt with room for a few rows only (16 KiB, the least a memory table takes).
    admin
        .query_drop("SET SESSION max_heap_table_size = 16384; ALTER TABLE lock_runtime_holders ENGINE=MEMORY")
        .await
        .unwrap();
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(
            manager.lock(format!("full:{i}")).await.unwrap_or_else(|e| panic!("lock {i} with the table full: {e}")),
        );
    }
    let recorded = records(&mut admin).await;
    assert!(recorded < 100, "the table took every record ({recorded}): it was not full");
    let info = backend.inspect("full:99").await.unwrap().expect("held");
    assert_eq!((info.fencing_token, info.holder.clone()), (None, None), "{info:?}");
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// Regression (issue 56): a least-privilege user (no `CREATE`) whose database has the counter
/// table but not the holders' table could not connect once records were on by default, and the
/// error named the counter table; now it connects with records off (one warning gives the
/// statement to run), and locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_create_the_holders_table_connects_with_records_off() {
    let server = MysqlServer::start();
    MysqlBackend::connect_with(server.url(), MysqlOptions::new().record_holders(false)).await.unwrap();
    let mut admin = raw(&server).await;
    admin
        .query_drop(
            "CREATE USER 'lean'@'%' IDENTIFIED BY 'lean-secret'; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'lean'@'%'",
        )
        .await
        .unwrap();
    let url = format!("mysql://lean:lean-secret@127.0.0.1:{}/app", server.port());
    let backend = MysqlBackend::connect(&url).await.expect("a user without CREATE connects");
    assert!(!backend.options().get_record_holders(), "records are off");
    let manager = LockManager::builder().backend(backend);
    let guard = manager.lock("lean").await.expect("lock");
    assert!(guard.fencing_token() > 0);
    guard.release().await.expect("release");
    // With neither table, the error names the counter table.
    admin.query_drop("DROP TABLE lock_runtime_fence_counter").await.unwrap();
    let err = MysqlBackend::connect(&url).await.expect_err("no counter table, no right to make it");
    assert!(err.is_backend() && err.to_string().contains("lock_runtime_fence_counter"), "{err}");
}
