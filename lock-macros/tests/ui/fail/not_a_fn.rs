use lock_runtime::distributed_locked;

#[distributed_locked]
struct NotAFn;

fn main() {}
