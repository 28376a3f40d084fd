//! The shop behind the web examples, shared by the Axum and the Actix-web versions: orders to
//! pay and stock to reserve. Nothing here knows about HTTP or locks; the handlers in
//! [`orders_axum`](crate::orders_axum) and [`orders_actix`](crate::orders_actix) take the lock
//! and call in.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_runtime::LockManager;
use serde::{Deserialize, Serialize};

/// A boxed, `Send` future, as the [`Upstream`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Body of `POST /orders/{id}/pay`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PayRequest {
    /// What to charge, in cents.
    pub amount_cents: u64,
}

/// Answer of `POST /orders/{id}/pay`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The order.
    pub order_id: u64,
    /// The payment provider's id for the charge.
    pub payment_id: String,
    /// What was charged, in cents.
    pub amount_cents: u64,
    /// The fencing token of the lock the charge was made under.
    pub fencing_token: u64,
    /// `true` when the order had been paid by an earlier request (nothing was charged now).
    pub already_paid: bool,
}

/// Body of `POST /stock/reserve`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// The article.
    pub sku: String,
    /// How many to set aside.
    pub quantity: u32,
}

/// Answer of `POST /stock/reserve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The article.
    pub sku: String,
    /// How many were set aside.
    pub quantity: u32,
    /// How many are left.
    pub left: u32,
    /// The fencing token of the lock the reservation was made under.
    pub fencing_token: u64,
}

/// The JSON body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Problem {
    /// What went wrong, for people.
    pub error: String,
}

/// The slow outside world the handlers call while they hold their lock: a payment provider and
/// a warehouse. [`Simulated`] stands in for both; tests plug in their own.
pub trait Upstream: Send + Sync + 'static {
    /// Charges an order; returns the provider's payment id.
    fn charge(&self, order_id: u64, amount_cents: u64) -> BoxFuture<'_, String>;
    /// Asks the warehouse to set stock aside.
    fn set_aside<'a>(&'a self, sku: &'a str, quantity: u32) -> BoxFuture<'a, ()>;
}

/// An [`Upstream`] that answers after a fixed latency.
#[derive(Debug, Clone)]
pub struct Simulated {
    /// How long each call takes.
    pub latency: Duration,
}

impl Upstream for Simulated {
    fn charge(&self, order_id: u64, _amount_cents: u64) -> BoxFuture<'_, String> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            static NEXT: AtomicU64 = AtomicU64::new(1);
            format!("pay_{order_id}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
        })
    }

    fn set_aside<'a>(&'a self, _sku: &'a str, _quantity: u32) -> BoxFuture<'a, ()> {
        Box::pin(tokio::time::sleep(self.latency))
    }
}

/// The articles a new [`Shop`] has in stock.
pub const STOCK: [(&str, u32); 2] = [("tea-42", 100), ("mug-7", 20)];

/// Orders and stock, in memory; with a [`Ledger`](crate::ledger::Ledger) (feature `postgres`)
/// every payment is also recorded in PostgreSQL through the fence.
pub struct Shop {
    paid: Mutex<HashMap<u64, Receipt>>,
    stock: Mutex<HashMap<String, u32>>,
    upstream: Arc<dyn Upstream>,
    #[cfg(feature = "postgres")]
    ledger: Option<crate::ledger::Ledger>,
}

/// Not enough stock for a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfStock {
    /// The article.
    pub sku: String,
    /// How many are left.
    pub left: u32,
}

impl Shop {
    /// A shop with [`STOCK`], calling `upstream`.
    pub fn new(upstream: Arc<dyn Upstream>) -> Self {
        let stock = STOCK.iter().map(|(sku, n)| ((*sku).to_owned(), *n)).collect();
        Shop {
            paid: Mutex::default(),
            stock: Mutex::new(stock),
            upstream,
            #[cfg(feature = "postgres")]
            ledger: None,
        }
    }

    /// This shop recording its payments in `ledger`.
    #[cfg(feature = "postgres")]
    pub fn with_ledger(self, ledger: crate::ledger::Ledger) -> Self {
        Shop { ledger: Some(ledger), ..self }
    }

    /// Pays an order once: a second payment of a paid order returns the first receipt.
    ///
    /// Call it under the order's lock: the check and the charge are not atomic, which is the
    /// point of the lock (two concurrent requests would otherwise both charge). With a ledger,
    /// the payment is recorded through the fence of `order:<id>`: a holder whose token is
    /// stale fails with a fenced [`LockError`](lock_runtime::LockError).
    pub async fn pay(
        &self,
        order_id: u64,
        amount_cents: u64,
        fencing_token: u64,
    ) -> Result<Receipt, lock_runtime::LockError> {
        if let Some(receipt) = self.paid.lock().unwrap_or_else(PoisonError::into_inner).get(&order_id) {
            return Ok(Receipt { already_paid: true, ..receipt.clone() });
        }
        let payment_id = self.upstream.charge(order_id, amount_cents).await;
        let receipt = Receipt { order_id, payment_id, amount_cents, fencing_token, already_paid: false };
        #[cfg(feature = "postgres")]
        if let Some(ledger) = &self.ledger {
            ledger.record(&receipt).await?;
        }
        self.paid.lock().unwrap_or_else(PoisonError::into_inner).insert(order_id, receipt.clone());
        Ok(receipt)
    }

    /// Sets `quantity` of `sku` aside. Call it under the article's lock (check, then act).
    pub async fn reserve(&self, sku: &str, quantity: u32, fencing_token: u64) -> Result<Reservation, OutOfStock> {
        let left = self.stock.lock().unwrap_or_else(PoisonError::into_inner).get(sku).copied().unwrap_or(0);
        if left < quantity {
            return Err(OutOfStock { sku: sku.to_owned(), left });
        }
        self.upstream.set_aside(sku, quantity).await;
        let left = left - quantity;
        self.stock.lock().unwrap_or_else(PoisonError::into_inner).insert(sku.to_owned(), left);
        Ok(Reservation { sku: sku.to_owned(), quantity, left, fencing_token })
    }
}

/// What every handler gets: the lock manager and the shop. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The locks: `LockManager::memory()`, or Redis to share them between instances.
    pub locks: LockManager,
    /// Orders and stock.
    pub shop: Arc<Shop>,
}

impl AppState {
    /// A state on `locks` with a fresh [`Shop`] calling `upstream`.
    pub fn new(locks: LockManager, upstream: Arc<dyn Upstream>) -> Self {
        AppState { locks, shop: Arc::new(Shop::new(upstream)) }
    }

    /// A state on `locks` with `shop`.
    pub fn with_shop(locks: LockManager, shop: Shop) -> Self {
        AppState { locks, shop: Arc::new(shop) }
    }
}

/// The fencing token of the running locked call (0 outside one).
pub fn fencing_token() -> u64 {
    lock_runtime::current().map(|lock| lock.fencing_token()).unwrap_or(0)
}

/// Seconds a client is told to wait (`Retry-After`) when an order is being paid right now.
pub const RETRY_AFTER_SECS: u32 = 1;

/// The setup both example binaries share: the address to bind (the first argument, else
/// `ORDERS_ADDR`, else `default_addr`) and the lock manager (Redis when `REDIS_URL` is set, else
/// in memory).
pub async fn from_env(default_addr: &str) -> Result<(String, LockManager), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("ORDERS_ADDR").ok())
        .unwrap_or_else(|| default_addr.to_owned());
    let builder = LockManager::builder().prefix("orders:").default_wait(Duration::from_secs(2));
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => redis_manager(builder, &url).await?,
        Err(_) => builder.memory(),
    };
    Ok((addr, locks))
}

/// The shop of the example binaries: with a PostgreSQL ledger when `DATABASE_URL` is set.
pub async fn shop_from_env(upstream: Arc<dyn Upstream>) -> Result<Shop, Box<dyn std::error::Error>> {
    let shop = Shop::new(upstream);
    match std::env::var("DATABASE_URL") {
        #[cfg(feature = "postgres")]
        Ok(url) => Ok(shop.with_ledger(crate::ledger::Ledger::connect(&url).await?)),
        #[cfg(not(feature = "postgres"))]
        Ok(url) => {
            Err(format!("DATABASE_URL={url} is set, but this build has no PostgreSQL: add `--features postgres`")
                .into())
        }
        Err(_) => Ok(shop),
    }
}

#[cfg(feature = "redis")]
async fn redis_manager(
    builder: lock_runtime::LockManagerBuilder,
    url: &str,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    Ok(builder.redis(url).await?)
}

#[cfg(not(feature = "redis"))]
async fn redis_manager(
    _builder: lock_runtime::LockManagerBuilder,
    url: &str,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    Err(format!("REDIS_URL={url} is set, but this build has no Redis: add `--features redis`").into())
}
