//! The lifecycle matrix: every networked backend × the everyday events (the server closes idle
//! connections, an operator kills every client session, a crash and restart). After each, as
//! soon as the server answers again, the next `lock()`, `try_lock()`, `read_lock()`,
//! `semaphore()` and `campaign()` succeed at their first call, a waiter parked across the event
//! is granted, and a lock released or dropped while the server was away is free for others once
//! it answers. GUARANTEES.md's "Connections" table states the same; each row is a module here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(feature = "redis")]
mod redis_row {
    use std::time::Duration;

    use lock_runtime::LockManager;
    use lock_tests::lifecycle::{every_operation_succeeds, park_waiter, until_closed, waiter_granted, warm};
    use lock_tests::redis_server::RedisServer;

    async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
        redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.expect("admin")
    }

    /// The ids of the normal (command) connections other than the asking one.
    async fn others(admin: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
        let me: i64 = redis::cmd("CLIENT").arg("ID").query_async(admin).await.unwrap();
        let list: String = redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("normal").query_async(admin).await.unwrap();
        let ids = list.lines().filter_map(|line| line.split(' ').next()?.strip_prefix("id=").map(str::to_owned));
        ids.filter(|id| *id != me.to_string()).collect()
    }

    /// `CONFIG SET timeout 1`: the server closes every connection idle for a second, the
    /// manager's among them (the next command on it met "broken pipe").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_the_server_closed_idle_connections_every_operation_succeeds() {
        let server = RedisServer::start();
        let mut admin = admin(&server).await;
        // The watchdog's lease: 9 s, renewed every 3 s.
        let builder = LockManager::builder().default_lease(Duration::from_secs(9));
        let manager = builder.redis(server.url()).await.expect("connect");
        warm(&manager, "idle").await;
        // A live holder whose connection is closed while idle between two renewals: its key
        // lives on, so it is not lost and its renewals go on.
        let holder = manager.lock("idle:held").await.expect("holder");
        let key = lock_runtime::backend::redis::KeyLayout::of("idle:held").lock;
        let before = others(&mut admin).await;
        let () = redis::cmd("CONFIG").arg("SET").arg("timeout").arg("1").query_async(&mut admin).await.unwrap();
        // The admin connection asks every 10 ms, so it is never idle for a second.
        until_closed(&before, async || others(&mut admin).await).await;
        let pttl = async |admin: &mut redis::aio::MultiplexedConnection| -> i64 {
            redis::cmd("PTTL").arg(&key).query_async(admin).await.unwrap()
        };
        let closed_at = pttl(&mut admin).await;
        lock_tests::eventually("the holder renewed after its connection closed", Duration::from_secs(15), async || {
            let now = pttl(&mut admin).await;
            if now > closed_at {
                Ok(())
            } else {
                Err(now)
            }
        })
        .await;
        assert!(!holder.is_lost(), "a holder whose key lives on was told lost");
        every_operation_succeeds(&manager, "idle", "the server closed idle connections").await;
        holder.release().await.expect("the holder's release");
    }

    /// `CLIENT KILL TYPE normal`: every command connection dies under the manager, a holder's
    /// and a waiter's among them; the holder's lock lives on in Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_an_operator_killed_every_client_every_operation_succeeds() {
        let server = RedisServer::start();
        let mut admin = admin(&server).await;
        let manager = LockManager::redis(server.url()).await.expect("connect");
        warm(&manager, "kill").await;
        let holder = manager.lock("kill:parked").await.expect("holder");
        let waiter = park_waiter(&manager, "kill:parked").await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1, "the manager's connection was killed");
        tokio::select! {
            () = holder.lost() => panic!("a holder whose key lives on was told lost"),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        every_operation_succeeds(&manager, "kill", "an operator killed every client").await;
        waiter_granted(waiter, Some(holder), "an operator killed every client").await;
    }

    /// A server with an append-only file (fsync always) SIGKILLed while a holder releases and
    /// another drops its guard, then restarted on its data: the keys came back with their 30 s
    /// leases, and the releases the library owed are done once the server answers, so another
    /// manager is granted both names long before those leases end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn releases_owed_during_an_outage_are_done_once_the_server_answers() {
        let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let manager = LockManager::redis(server.url()).await.expect("connect");
        warm(&manager, "outage").await;
        let released = manager.lock("outage:released").await.expect("lock");
        let dropped = manager.lock("outage:dropped").await.expect("lock");
        server.kill();
        assert!(released.release().await.is_err(), "no server: the release cannot be confirmed");
        drop(dropped);
        // An outage longer than the command timeout (2 s), so that no first try is still
        // pending when the server is back.
        tokio::time::sleep(Duration::from_secs(3)).await;
        server.restart();
        let other = LockManager::redis(server.url()).await.expect("connect");
        for name in ["outage:released", "outage:dropped"] {
            let guard = other
                .lock(name)
                .wait(Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("`{name}` was left held after the outage: {e}"));
            guard.release().await.expect("release");
        }
        every_operation_succeeds(&manager, "outage", "a crash and restart on the data").await;
    }

    /// A crash (SIGKILL) and restart without persistence: the holder's lock is gone with the
    /// data, so it is told `lost()`; the parked waiter is granted; every operation succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_crash_and_restart_every_operation_succeeds() {
        let mut server = RedisServer::start();
        let manager = LockManager::redis(server.url()).await.expect("connect");
        warm(&manager, "restart").await;
        let holder = manager.lock("restart:parked").await.expect("holder");
        let waiter = park_waiter(&manager, "restart:parked").await;
        server.restart();
        every_operation_succeeds(&manager, "restart", "a crash and restart").await;
        tokio::time::timeout(Duration::from_secs(20), holder.lost())
            .await
            .expect("a holder whose key went with the restart is told lost()");
        waiter_granted(waiter, Some(holder), "a crash and restart").await;
    }
}

/// Redis's other topologies: a Cluster of three primaries, a Sentinel-managed primary with a
/// replica, Redlock over three servers. The events act on every node the manager talks to.
#[cfg(feature = "redis")]
mod redis_topologies_row {
    use std::time::Duration;

    use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    use lock_runtime::LockManager;
    use lock_tests::lifecycle::{every_operation_succeeds, park_waiter, waiter_granted, warm};
    use lock_tests::redis_cluster::RedisCluster;
    use lock_tests::redis_sentinel::SentinelSetup;
    use lock_tests::redis_server::RedisServer;

    /// An everyday event on one node.
    #[derive(Clone, Copy, Debug)]
    enum Event {
        /// `CONFIG SET timeout 1`, then a wait until no command connection older than it is
        /// left (the asking one excepted, which asks every 10 ms).
        IdleTimeout,
        /// `CLIENT KILL TYPE normal`.
        KillClients,
    }

    async fn command<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
        let mut conn =
            redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.expect("admin connection");
        cmd.query_async(&mut conn).await.expect("admin command")
    }

    /// The ids of the normal (command) connections other than the asking one and the
    /// sentinels' (which ping every second: never idle), on `conn`'s node.
    async fn others(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
        let me: i64 = redis::cmd("CLIENT").arg("ID").query_async(conn).await.unwrap();
        let list: String = redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("normal").query_async(conn).await.unwrap();
        let ours = list.lines().filter(|line| !line.contains(" name=sentinel-"));
        let ids = ours.filter_map(|line| line.split(' ').next()?.strip_prefix("id=").map(str::to_owned));
        ids.filter(|id| *id != me.to_string()).collect()
    }

    async fn happen(event: Event, urls: &[String]) {
        for url in urls {
            match event {
                Event::IdleTimeout => {
                    let mut conn = redis::Client::open(url.as_str())
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .expect("admin connection");
                    let before = others(&mut conn).await;
                    let () =
                        redis::cmd("CONFIG").arg("SET").arg("timeout").arg("1").query_async(&mut conn).await.unwrap();
                    lock_tests::eventually("idle connections closed", Duration::from_secs(30), async || {
                        let now = others(&mut conn).await;
                        lock_tests::reached(before.iter().any(|id| now.contains(id)), false)
                    })
                    .await;
                }
                Event::KillClients => {
                    let cmd =
                        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").clone();
                    let _: i64 = command(url, &cmd).await;
                }
            }
        }
    }

    /// The matrix's cell: warm, the event on every node, then every operation at its first
    /// call. Across killed clients, also a holder and a parked waiter, granted once the holder
    /// releases (across an idle timeout they would keep the connection busy: not idle).
    async fn cell(manager: &LockManager, urls: &[String], event: Event, label: &str) {
        warm(manager, label).await;
        let what = format!("{event:?} on every node");
        let parked = match event {
            Event::KillClients => {
                let parked = format!("{label}:parked");
                let holder = manager.lock(&parked).await.expect("holder");
                Some((holder, park_waiter(manager, &parked).await))
            }
            Event::IdleTimeout => None,
        };
        happen(event, urls).await;
        every_operation_succeeds(manager, label, &what).await;
        if let Some((holder, waiter)) = parked {
            waiter_granted(waiter, Some(holder), &what).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_after_idle_timeouts_and_killed_clients() {
        let cluster = RedisCluster::start(3, 0);
        let manager = LockManager::redis_cluster(cluster.urls()).await.expect("connect");
        cell(&manager, &cluster.urls(), Event::KillClients, "cluster-kill").await;
        cell(&manager, &cluster.urls(), Event::IdleTimeout, "cluster-idle").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinel_after_idle_timeouts_and_killed_clients() {
        let setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 3));
        let backend =
            RedisBackend::sentinel(setup.sentinel_urls(), lock_tests::redis_sentinel::MASTER, RedisOptions::default())
                .await
                .expect("connect");
        let manager = LockManager::builder().backend(backend);
        let primary = vec![setup.node(setup.primary_index()).url()];
        cell(&manager, &primary, Event::KillClients, "sentinel-kill").await;
        cell(&manager, &primary, Event::IdleTimeout, "sentinel-idle").await;
    }

    /// Redlock over three append-only servers, two of them SIGKILLed for 3 s while a holder
    /// releases: the quorum's release cannot be confirmed, and the two keep the key on their
    /// data. The release is owed: done once they answer, so another manager is granted the
    /// name long before its 30 s lease ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redlock_releases_owed_during_an_outage_are_done_once_the_servers_answer() {
        let aof = ["--appendonly", "yes", "--appendfsync", "always"];
        let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(&aof)).collect();
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let manager = LockManager::redlock(&urls).await.expect("connect");
        let held = manager.lock("outage:released").await.expect("lock");
        servers[0].kill();
        servers[1].kill();
        assert!(held.release().await.is_err(), "no quorum: the release cannot be confirmed");
        tokio::time::sleep(Duration::from_secs(3)).await;
        servers[0].restart();
        servers[1].restart();
        let other = LockManager::redlock(&urls).await.expect("connect");
        let guard = other
            .lock("outage:released")
            .wait(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("the name was left held after the outage: {e}"));
        guard.release().await.expect("release");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redlock_after_idle_timeouts_killed_clients_and_restarts() {
        let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let manager = LockManager::redlock(&urls).await.expect("connect");
        cell(&manager, &urls, Event::KillClients, "redlock-kill").await;
        cell(&manager, &urls, Event::IdleTimeout, "redlock-idle").await;
        warm(&manager, "redlock-restart").await;
        for server in &mut servers {
            server.restart();
        }
        every_operation_succeeds(&manager, "redlock-restart", "a crash and restart of every node").await;
    }
}

#[cfg(feature = "mysql")]
mod mysql_row {
    use std::time::Duration;

    use lock_runtime::LockManager;
    use lock_tests::lifecycle::{
        every_operation_succeeds, park_waiter, several_idle, until_closed, waiter_granted, warm,
    };
    use lock_tests::mysql_server::MysqlServer;
    use mysql_async::prelude::Queryable;

    async fn admin(server: &MysqlServer) -> mysql_async::Conn {
        mysql_async::Conn::new(mysql_async::Opts::from_url(&server.url()).unwrap()).await.expect("admin")
    }

    /// The ids of the other client connections (the manager's).
    async fn others(admin: &mut mysql_async::Conn) -> Vec<u64> {
        admin
            .query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'app' AND ID <> CONNECTION_ID()")
            .await
            .expect("processlist")
    }

    /// `wait_timeout = 2`: the server closes every connection idle for two seconds, each of
    /// the manager's idle ones (the next query on one met "Connection reset by peer").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_the_server_closed_idle_connections_every_operation_succeeds() {
        let server = MysqlServer::start();
        let mut admin = admin(&server).await;
        admin.query_drop("SET GLOBAL wait_timeout = 2").await.unwrap();
        // Connected after the change, so every connection of the manager has the short timeout
        // (the admin's has it too: it asks every 10 ms, so it is never idle that long).
        let manager = LockManager::mysql(server.url()).await.expect("connect");
        // Several idle connections: three acquisitions at once, released.
        several_idle(&manager, "idle").await;
        warm(&manager, "idle").await;
        let before = others(&mut admin).await;
        assert!(before.len() >= 3, "the manager keeps idle connections: {before:?}");
        until_closed(&before, async || others(&mut admin).await).await;
        every_operation_succeeds(&manager, "idle", "the server closed idle connections").await;
    }

    /// `KILL` of every other client connection: the idle ones die, and the holder's session
    /// with its lock (the holder is told `lost()`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_an_operator_killed_every_client_every_operation_succeeds() {
        let server = MysqlServer::start();
        let mut admin = admin(&server).await;
        let manager = LockManager::mysql(server.url()).await.expect("connect");
        several_idle(&manager, "kill").await;
        let holder = manager.lock("kill:held").await.expect("holder");
        let ids = others(&mut admin).await;
        assert!(ids.len() >= 2, "idle connections and the holder's: {ids:?}");
        for id in ids {
            let _ = admin.query_drop(format!("KILL {id}")).await;
        }
        tokio::time::timeout(Duration::from_secs(20), holder.lost())
            .await
            .expect("a holder whose session was killed is told lost()");
        every_operation_succeeds(&manager, "kill", "an operator killed every client").await;
    }

    /// A crash (SIGKILL) and restart: every idle connection died with the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_crash_and_restart_every_operation_succeeds() {
        let mut server = MysqlServer::start();
        let manager = LockManager::mysql(server.url()).await.expect("connect");
        several_idle(&manager, "restart").await;
        let holder = manager.lock("restart:held").await.expect("holder");
        server.restart();
        tokio::time::timeout(Duration::from_secs(20), holder.lost())
            .await
            .expect("a holder whose session died with the server is told lost()");
        every_operation_succeeds(&manager, "restart", "a crash and restart").await;
        let other = manager.lock("restart:parked").await.expect("holder");
        let waiter = park_waiter(&manager, "restart:parked").await;
        waiter_granted(waiter, Some(other), "a restart").await;
        warm(&manager, "restart").await;
    }
}

#[cfg(feature = "postgres")]
mod postgres_row {
    use std::time::Duration;

    use lock_runtime::LockManager;
    use lock_tests::lifecycle::{every_operation_succeeds, until_closed, warm};
    use lock_tests::pg_server::PgServer;

    /// The other client backends' pids (the manager's connections).
    async fn others(admin: &tokio_postgres::Client) -> Vec<i32> {
        admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// `idle_session_timeout = 1000`: the server closes every session idle for a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_the_server_closed_idle_connections_every_operation_succeeds() {
        let server = PgServer::start();
        let admin = server.admin().await;
        admin.batch_execute("ALTER SYSTEM SET idle_session_timeout = 1000").await.unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        let manager = LockManager::postgres(server.url()).await.expect("connect");
        warm(&manager, "idle").await;
        let before = others(&admin).await;
        until_closed(&before, async || others(&admin).await).await;
        every_operation_succeeds(&manager, "idle", "the server closed idle connections").await;
    }

    /// `pg_terminate_backend` of every other session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_an_operator_killed_every_client_every_operation_succeeds() {
        let server = PgServer::start();
        let admin = server.admin().await;
        let manager = LockManager::postgres(server.url()).await.expect("connect");
        warm(&manager, "kill").await;
        let holder = manager.lock("kill:held").await.expect("holder");
        for pid in others(&admin).await {
            admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
        }
        tokio::time::timeout(Duration::from_secs(20), holder.lost())
            .await
            .expect("a holder whose session was terminated is told lost()");
        every_operation_succeeds(&manager, "kill", "an operator killed every client").await;
    }

    /// The next `lock()` sent right after an operator ended the idle connection's session:
    /// the server's `FATAL 57P01` can come as the answer to that very query, before the
    /// connection is seen closed (a fresh-clone CI run saw `lock()` fail with it). It must be
    /// taken as the connection's end: the attempt goes again on a new connection. 30 rounds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_right_after_an_operator_kill_goes_again_on_a_new_connection() {
        let server = PgServer::start();
        let admin = server.admin().await;
        let manager = LockManager::postgres(server.url()).await.expect("connect");
        for round in 0..30 {
            manager.lock("race").await.expect("lock").release().await.expect("release");
            for pid in others(&admin).await {
                admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
            }
            let guard = manager.lock("race").await.unwrap_or_else(|e| panic!("round {round}: {e}"));
            guard.release().await.expect("release");
        }
    }

    /// An immediate shutdown (as a crash) and a start on the same data.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_crash_and_restart_every_operation_succeeds() {
        let mut server = PgServer::start();
        let manager = LockManager::postgres(server.url()).await.expect("connect");
        warm(&manager, "restart").await;
        let holder = manager.lock("restart:held").await.expect("holder");
        server.kill();
        server.restart();
        every_operation_succeeds(&manager, "restart", "a crash and restart").await;
        tokio::time::timeout(Duration::from_secs(20), holder.lost())
            .await
            .expect("a holder whose session died with the server is told lost()");
    }
}

#[cfg(feature = "etcd")]
mod etcd_row {
    use std::time::Duration;

    use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
    use lock_runtime::LockManager;
    use lock_tests::etcd_server::EtcdServer;
    use lock_tests::lifecycle::{every_operation_succeeds, warm};

    /// A lease long enough to outlive the outage (the manager's lease survives it).
    async fn manager(server: &EtcdServer, label: &str) -> LockManager {
        let options = EtcdOptions::new().lease_ttl(Duration::from_secs(30)).operation_timeout(Duration::from_secs(1));
        let backend = EtcdBackend::connect_with(&[server.endpoint()], options).await.expect("connect");
        LockManager::builder().label(label).backend(backend)
    }

    /// etcd SIGKILLed and restarted on its data while a holder releases, a holder drops its
    /// guard, a waiter is dropped and a fixed lease ends: each of those keys is deleted once
    /// the server answers, so another manager is granted each name at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clean_up_owed_during_an_outage_is_done_once_the_server_answers() {
        let mut server = EtcdServer::start();
        let first = manager(&server, "first").await;
        let second = manager(&server, "second").await;
        warm(&first, "outage").await;
        let released = first.lock("outage:released").await.expect("lock");
        let dropped = first.lock("outage:dropped").await.expect("lock");
        let fixed = first.lock("outage:fixed").lease(Duration::from_secs(2)).await.expect("lock");
        let blocker = second.lock("outage:waited").await.expect("lock");
        let waiter = {
            let first = first.clone();
            tokio::spawn(async move { first.lock("outage:waited").wait(Duration::from_secs(60)).await })
        };
        // The waiter's key is in the queue behind the blocker's.
        lock_tests::eventually("the waiter queued", Duration::from_secs(10), async || {
            let info = second.inspect("outage:waited").await.expect("inspect").expect("held");
            lock_tests::reached(info.waiters.unwrap_or(0) >= 1, true)
        })
        .await;
        server.kill();
        assert!(released.release().await.is_err(), "no server: the release cannot be confirmed");
        drop(dropped);
        waiter.abort();
        let _ = waiter.await;
        // The fixed lease ends in the outage (its end is 2 s after the grant).
        tokio::time::timeout(Duration::from_secs(20), fixed.lost()).await.expect("the fixed lease ended");
        drop(fixed);
        tokio::time::sleep(Duration::from_millis(500)).await; // an outage of a few seconds in all
        server.restart();
        blocker.release().await.expect("the blocker's release");
        for name in ["outage:released", "outage:dropped", "outage:fixed", "outage:waited"] {
            let guard = second
                .lock(name)
                .wait(Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("`{name}` was left held after the outage: {e}"));
            guard.release().await.expect("release");
        }
        every_operation_succeeds(&first, "outage", "an etcd crash and restart").await;
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper_row {
    use lock_runtime::LockManager;
    use lock_tests::lifecycle::{every_operation_succeeds, warm};
    use lock_tests::zk_server::ZkServer;

    /// A crash and restart on the same data, within the session timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_crash_and_restart_every_operation_succeeds() {
        let mut server = ZkServer::start();
        let manager = LockManager::zookeeper(server.hosts()).await.expect("connect");
        warm(&manager, "restart").await;
        let holder = manager.lock("restart:held").await.expect("holder");
        server.restart();
        // The client reconnects by itself within its session timeout: the first operation
        // after the server answers may still wait for that, within its own bound.
        every_operation_succeeds(&manager, "restart", "a crash and restart").await;
        // The session outlived the restart, and the holder's node with it.
        assert!(!holder.is_lost(), "a holder whose session lives on was told lost");
        let other = LockManager::zookeeper(server.hosts()).await.expect("connect");
        assert!(other.try_lock("restart:held").await.expect("try_lock").is_none(), "still held");
        holder.release().await.expect("the holder's release");
    }
}
