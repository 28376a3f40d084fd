//! The payments ledger of the orders service, in PostgreSQL (feature `postgres`; the examples
//! use it when `DATABASE_URL` is set). Every payment is recorded through `lock-runtime`'s
//! PostgreSQL fence under the fencing token of the order's lock, so a request that lost the
//! lock (paused past its lease while another request took it and paid) cannot record its
//! payment after the newer holder did: its transaction fails with a fenced error, answered
//! `409 Conflict`.

use lock_runtime::fence::postgres::{check, INSTALL_SQL};
use lock_runtime::LockError;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

use crate::orders::Receipt;

/// The ledger: one connection (a real service would use a pool).
pub struct Ledger {
    client: Mutex<Client>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ledger")
    }
}

fn failed(order_id: u64, e: tokio_postgres::Error) -> LockError {
    LockError::backend(format!("order:{order_id}"), "postgres", "record the payment", e)
}

impl Ledger {
    /// Connects to `url`, installs the fence (idempotent) and the `payments` table.
    pub async fn connect(url: &str) -> Result<Ledger, Box<dyn std::error::Error>> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(connection);
        client.batch_execute(INSTALL_SQL).await?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS payments (order_id bigint PRIMARY KEY, payment_id text NOT NULL,
                 amount_cents bigint NOT NULL, fencing_token bigint NOT NULL)",
            )
            .await?;
        Ok(Ledger { client: Mutex::new(client) })
    }

    /// Records a payment in one transaction that first passes the fence of `order:<id>` (the
    /// order's lock name) with the receipt's token. A stale token is an error for which
    /// [`LockError::is_fenced`] is true, and nothing is recorded.
    pub async fn record(&self, receipt: &Receipt) -> Result<(), LockError> {
        let id = receipt.order_id;
        let mut client = self.client.lock().await;
        let tx = client.transaction().await.map_err(|e| failed(id, e))?;
        check(&tx, &format!("order:{id}"), receipt.fencing_token).await?;
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO payments VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING",
            &[&as_i64(id), &receipt.payment_id, &as_i64(receipt.amount_cents), &as_i64(receipt.fencing_token)],
        )
        .await
        .map_err(|e| failed(id, e))?;
        tx.commit().await.map_err(|e| failed(id, e))
    }
}
