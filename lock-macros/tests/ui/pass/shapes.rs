//! Signatures pass through untouched: attributes, visibility, lifetimes, where clauses,
//! `impl Trait` arguments, inner attributes, trait impls, patterns of every kind.
#![deny(warnings)]

use std::fmt::Display;
use std::sync::{Arc, LazyLock};

use lock_runtime::{distributed_locked, LockError, LockManager};

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

/// Documented, with attributes kept.
#[distributed_locked(name = "doc:{x}", manager = &*LOCKS)]
#[inline]
pub(crate) async fn documented(x: u32) -> Result<u32, LockError> {
    #![allow(clippy::let_and_return)]
    let y = x;
    y
        .checked_add(1)
        .ok_or_else(|| LockError::invalid("doc", "overflow"))
}

#[distributed_locked(name = "life:{s}", manager = &*LOCKS)]
async fn lifetimes<'a, 'b: 'a>(s: &'a str, _t: &'b str) -> Result<&'a str, LockError> {
    Ok(s)
}

#[distributed_locked(name = "impl:{d}", manager = &*LOCKS)]
async fn impl_arg(d: impl Display + Send) -> Result<String, LockError> {
    Ok(d.to_string())
}

#[distributed_locked(name = "const", manager = &*LOCKS)]
async fn const_generic<const N: usize>(x: [u8; N]) -> Result<usize, LockError>
where
    [u8; N]: Sized,
{
    Ok(x.len())
}

pub struct Pair {
    pub left: u32,
    pub right: (u32, u32),
}

#[distributed_locked(name = "pat:{l}:{r0}:{c}:{m}", manager = &*LOCKS, fallback = patterns_busy)]
async fn patterns(
    Pair { left: l, right: (r0, _) }: Pair,
    &(c, _): &(u32, u32),
    mut m: u32,
    _: String,
    ref r: u32,
) -> Result<u32, LockError> {
    m += l + r0 + c + *r;
    Ok(m)
}
async fn patterns_busy(p: Pair, t: &(u32, u32), m: u32, _s: String, r: u32) -> Result<u32, LockError> {
    Ok(p.left + t.0 + m + r)
}

#[distributed_locked(name = "tuple:{pair.0}:{pair.1}", wait = "0s", manager = &*LOCKS, fallback = tuple_busy::<T>)]
async fn tuple_index<T: Display + Send>(pair: (T, u8)) -> String {
    pair.0.to_string()
}
async fn tuple_busy<T: Display + Send>(pair: (T, u8)) -> String {
    format!("busy {}", pair.0)
}

pub trait Store {
    fn put(&self, k: u32) -> impl std::future::Future<Output = Result<u32, LockError>> + Send;
}

pub struct Mem {
    pub shard: u8,
}

impl Store for Mem {
    #[distributed_locked(name = "store:{self.shard}:{k}", manager = &*LOCKS)]
    async fn put(&self, k: u32) -> Result<u32, LockError> {
        Ok(k)
    }
}

impl Mem {
    #[distributed_locked(name = "arc:{self.shard}", manager = &*LOCKS, fallback = Self::busy)]
    pub async fn by_arc(self: Arc<Self>) -> u8 {
        self.shard
    }
    async fn busy(self: Arc<Self>) -> u8 {
        0
    }

    #[distributed_locked(name = "own", manager = &*LOCKS)]
    pub async fn by_value(self) -> Result<u8, LockError> {
        Ok(self.shard)
    }

    #[distributed_locked(name = "assoc:{n}", manager = &*LOCKS)]
    pub async fn associated(n: u8) -> Result<Self, LockError> {
        Ok(Mem { shard: n })
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        assert_eq!(documented(1).await.expect("locked"), 2);
        assert_eq!(lifetimes("a", "b").await.expect("locked"), "a");
        assert_eq!(impl_arg(5).await.expect("locked"), "5");
        assert_eq!(const_generic([1, 2, 3]).await.expect("locked"), 3);
        let pair = Pair { left: 1, right: (2, 3) };
        assert_eq!(patterns(pair, &(4, 5), 10, String::new(), 6).await.expect("locked"), 23);
        assert_eq!(Mem { shard: 1 }.put(9).await.expect("locked"), 9);
        assert_eq!(tuple_index(("t", 1)).await, "t");
        let held = LOCKS.lock("tuple:u:2").await.expect("held");
        assert_eq!(tuple_index(("u", 2)).await, "busy u");
        drop(held);
        assert_eq!(Arc::new(Mem { shard: 2 }).by_arc().await, 2);
        assert_eq!(Mem { shard: 3 }.by_value().await.expect("locked"), 3);
        assert_eq!(Mem::associated(4).await.expect("locked").shard, 4);
    });
}
