use lock_runtime::{distributed_locked, LockError};

pub struct Order {
    pub id: u64,
}

#[distributed_locked(name = "order:{order.number}")]
async fn settle(order: &Order) -> Result<u64, LockError> {
    Ok(order.id)
}

fn main() {
    let _ = settle(&Order { id: 1 });
}
