//! The fault suite with leader elections (`Election::campaign`): worker processes campaign in
//! the elections of the run's names; each term read-modify-writes a counter in the fenced
//! witness store under the term's token and resigns, while the nemesis kills and pauses
//! leaders (SIGSTOP past the lease), crashes and restarts the server, partitions and delays
//! workers (`lock_tests::jepsen::nemesis`). The checker holds terms to the rules of locks: no
//! two leaders' terms overlap unless the earlier leader's `lost()` fired first (or the
//! backend's row in GUARANTEES.md says the fault allows it), terms' tokens strictly increase,
//! the witness refuses every stale leader's write, and a campaigner is elected within the
//! stated bound after a leader goes away. One run per store, one after the other (two at once
//! would share the 2 cores and stretch every bound): Redis, PostgreSQL, etcd and ZooKeeper.
//! `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes each longer.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

fn elections(backend: Backend) -> Config {
    let mut config = Config::new(backend, env!("CARGO_BIN_EXE_jepsen_worker")).with_tasks(4);
    config.elect = true;
    config
}

/// The bounds of each store are those of its lock run (`jepsen_<store>.rs`, which explains
/// them): a term is a grant of the election's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_elections() {
    let extra = Duration::from_secs(120);

    let redis = elections(Backend::Redis);
    let (slack, handoff) = (redis.op_timeout + Duration::from_millis(250), redis.lease + redis.op_timeout);
    nemesis::run_and_check(redis, "jepsen_elections", slack, handoff + Duration::from_millis(250), extra).await;

    let postgres = elections(Backend::Postgres);
    let (slack, handoff) = (postgres.op_timeout + Duration::from_millis(250), postgres.op_timeout);
    nemesis::run_and_check(postgres, "jepsen_elections", slack, handoff + Duration::from_millis(500), extra).await;

    #[cfg(feature = "etcd")]
    {
        let etcd = elections(Backend::Etcd);
        let ttl = Duration::from_secs(2); // the workers' etcd lease
        let (slack, handoff) = (etcd.op_timeout + Duration::from_millis(250), ttl + etcd.op_timeout);
        nemesis::run_and_check(etcd, "jepsen_elections", slack, handoff + Duration::from_millis(500), extra).await;
    }

    #[cfg(feature = "zookeeper")]
    {
        use lock_runtime::backend::zookeeper::STALE_HOLDER_MARGIN;
        let zk = elections(Backend::Zookeeper);
        let (slack, handoff) =
            (zk.op_timeout + Duration::from_millis(250), zk.lease + STALE_HOLDER_MARGIN + zk.op_timeout);
        nemesis::run_and_check(zk, "jepsen_elections", slack, handoff + Duration::from_millis(250), extra).await;
    }
}
