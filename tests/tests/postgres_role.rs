//! The PostgreSQL backend as the least-privilege role of the backend's docs (`USAGE` on the
//! fencing sequence, which its owner made, and nothing else): the whole conformance suite.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use lock_runtime::LockManagerBuilder;
use lock_tests::pg_server::PgServer;

lock_tests::conformance_suite!(
    {
        let server = Arc::new(PgServer::start());
        move |builder: LockManagerBuilder| {
            let server = server.clone();
            async move {
                // Idempotent: the factory is called for every manager of a case.
                server
                    .admin()
                    .await
                    .batch_execute(
                        "CREATE SEQUENCE IF NOT EXISTS lock_runtime_fence; \
                     DO $$ BEGIN CREATE ROLE locker LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
                     REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
                     GRANT USAGE ON SEQUENCE lock_runtime_fence TO locker",
                    )
                    .await
                    .expect("the least-privilege role");
                let url = format!("postgres://locker@127.0.0.1:{}/postgres", server.port());
                builder.postgres(url).await.expect("connect as the least-privilege role")
            }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);
