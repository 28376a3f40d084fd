#![doc = include_str!("README.md")]

mod acquire;
mod attempt_call;
mod backend;
mod batch;
pub mod cluster;
mod handoff;
mod held;
mod holdings;
mod inspect;
pub(crate) mod layout;
mod options;
mod pubsub;
pub mod redlock;
mod resend;
mod scripts;
pub mod sentinel;
mod server;
mod shared;
mod topology;
mod url;
mod waiters;

pub use backend::RedisBackend;
pub use inspect::Changes;
pub use layout::{key_slot, KeyLayout};
pub use options::{RedisOptions, DEFAULT_COMMAND_TIMEOUT, DEFAULT_PING_INTERVAL, DEFAULT_UNSUBSCRIBE_AFTER};
pub use redlock::RedlockBackend;
