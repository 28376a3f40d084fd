use lock_runtime::distributed_locked;

async fn busy() -> impl std::fmt::Display {
    0
}

#[distributed_locked(name = "a", fallback = busy)]
async fn opaque() -> impl std::fmt::Display {
    1
}

fn main() {
    let _ = opaque();
}
