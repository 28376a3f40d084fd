use lock_runtime::distributed_locked;

// `wait = 2`: two seconds or two milliseconds? A bare number names no unit.
#[distributed_locked(name = "report", wait = 2)]
async fn report() {}

fn main() {
    let _ = report();
}
