use lock_runtime::{distributed_locked, LockError};

// Conflicting kind options are reported on the option given later, with every other problem.
#[distributed_locked(name = "a", names = ["b:{id}"], wait = "2 sec")]
async fn both_names(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_locked(name = "a", mode = read, permits = 2)]
async fn mode_and_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(names = ["a", "b"], mode = write)]
async fn names_and_mode() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(permits = 3, names = ["a"])]
async fn permits_and_names() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", permits = 0)]
async fn zero_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", mode = upgrade)]
async fn bad_mode() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(names = "a")]
async fn names_not_an_array() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(names = ["acct:{nope}", 7])]
async fn bad_templates(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
