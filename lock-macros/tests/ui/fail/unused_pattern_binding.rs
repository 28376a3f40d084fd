//! A binding that neither the body nor the attribute uses warns as it would without the
//! attribute (denied here).
#![deny(unused_variables)]

use lock_runtime::{distributed_locked, LockError};

struct Path<T>(T);

#[distributed_locked(name = "report")]
async fn report(Path(unused): Path<u64>) -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = report(Path(1));
}
