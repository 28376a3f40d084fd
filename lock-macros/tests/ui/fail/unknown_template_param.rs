use lock_runtime::{distributed_locked, LockError};

pub struct Order {
    pub id: u64,
}

#[distributed_locked(name = "order:{ordr.id}")]
async fn settle(order: &Order, (a, b): (u32, u32)) -> Result<u64, LockError> {
    Ok(order.id + u64::from(a + b))
}

#[distributed_locked(name = "order:{id")]
async fn unclosed(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_locked(name = "me:{self.id}")]
async fn no_self(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {
    let _ = settle(&Order { id: 1 }, (1, 2));
    let _ = unclosed(1);
    let _ = no_self(1);
}
