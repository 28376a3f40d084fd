//! The etcd backend with RBAC on, as a user whose role may read and write the library's key
//! prefix only: the whole conformance suite.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
use lock_runtime::LockManagerBuilder;
use lock_tests::etcd_server::EtcdServer;

/// Turns RBAC on (see [`lock_tests::etcd_server::enable_rbac`]).
async fn enable_rbac(endpoint: &str) {
    let mut admin = etcd_client::Client::connect([endpoint], None).await.expect("admin");
    lock_tests::etcd_server::enable_rbac(&mut admin).await;
}

lock_tests::conformance_suite!(
    {
        let server = Arc::new(EtcdServer::start());
        let rbac = Arc::new(tokio::sync::OnceCell::new());
        move |builder: LockManagerBuilder| {
            let (server, rbac) = (server.clone(), rbac.clone());
            async move {
                let endpoint = server.endpoint();
                rbac.get_or_init(|| enable_rbac(&endpoint)).await;
                let options = EtcdOptions::new().credentials("locker", "lock-secret");
                builder
                    .backend(EtcdBackend::connect_with(&[endpoint], options).await.expect("connect as the lock user"))
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
