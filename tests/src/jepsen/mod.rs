//! A Jepsen-style fault suite: worker processes lock a name and read-modify-write a counter in
//! a fenced witness store while a nemesis injects faults; a checker reads the history afterwards.

pub mod checker;
pub mod guarantees;
pub mod held;
pub mod history;
#[cfg(all(feature = "redis", feature = "postgres"))]
pub mod nemesis;
#[cfg(feature = "postgres")]
pub mod witness;
