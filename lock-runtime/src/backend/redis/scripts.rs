//! The backend's Lua scripts, each composed from its sibling `.lua` files and made with
//! [`resend::script`] (so a server that lost one is given it again wherever it is called).

use std::sync::LazyLock;

use redis::Script;

use super::resend;

/// A script made of the functions of `acquire.lua` and `queue.lua` (which call each other),
/// then `tail`: more functions, and what calls them.
macro_rules! with_lock_functions {
    ($($tail:expr),+ $(,)?) => {
        resend::script(concat!(include_str!("acquire.lua"), include_str!("queue.lua"), $($tail),+))
    };
}

/// `acquire.lua`'s `attempt`, called on its own, then (given a queue) `queue.lua`'s `queued`.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    with_lock_functions!(
        "local now = redis.call('time')\n",
        "local status, value, again = attempt(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], now)\n",
        // (A refusal's third value is the holder's.)
        "again = status == 1 and again\n",
        // A grant that was this owner's already left no entry: the grant before removed it.
        "if KEYS[3] then queued(KEYS[3], ARGV[1], {status, value}, ARGV[4], again and '0' or ARGV[5], now) end\n",
        "return {status, value}\n"
    )
});
/// Redlock's attempt on one node: `acquire.lua`'s `attempt`, answering `{1, token, ''}`, or
/// `{0, pttl, holder}` refused (the holder's value, its owner before the first `#`), so that a
/// lock held on a majority by one owner is told from votes split between contenders.
pub(super) static VOTE: LazyLock<Script> = LazyLock::new(|| {
    with_lock_functions!(
        "local now = redis.call('time')\n",
        "local status, value, holder = attempt(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], now)\n",
        "return {status, value, status == 1 and '' or holder}\n"
    )
});
pub(super) static EXTEND: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("extend.lua")));
/// `release.lua`'s function, called on its own.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    with_lock_functions!(include_str!("release.lua"), "return release(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[3])\n")
});
/// A release that grants the lock to the releasing process's next waiter (`handoff.lua`).
pub(super) static HANDOFF: LazyLock<Script> =
    LazyLock::new(|| with_lock_functions!(include_str!("release.lua"), include_str!("handoff.lua")));
/// Many attempts and releases in one call (`batch.lua`, see `batch.rs`).
pub(super) static BATCH: LazyLock<Script> =
    LazyLock::new(|| with_lock_functions!(include_str!("release.lua"), include_str!("batch.lua")));
pub(super) static RELEASE_AFTER: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("release_after.lua")));
pub(super) static WATCH: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("watch.lua")));
pub(super) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("force_release.lua")));
pub(super) static INSPECT: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("inspect.lua")));
pub(super) static INSPECT_KINDS: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("inspect_kinds.lua")));
pub(super) static KIND_ACQUIRE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_acquire.lua")));
pub(super) static KIND_RELEASE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_release.lua")));
/// Redlock's raise of a node's counter to the quorum's token (`redlock.rs`).
pub(super) static FENCE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("fence.lua")));
/// Which of many held locks are still their owners' (`holdings.rs`).
pub(super) static CHECK: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("check.lua")));
pub(super) static KIND_EXTEND: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_extend.lua")));

#[cfg(test)]
mod tests {
    #[test]
    fn scripts_state_their_interface() {
        for src in [
            include_str!("acquire.lua"),
            include_str!("extend.lua"),
            include_str!("release.lua"),
            include_str!("release_after.lua"),
            include_str!("force_release.lua"),
            include_str!("handoff.lua"),
            include_str!("batch.lua"),
        ] {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
        for src in [
            include_str!("watch.lua"),
            include_str!("inspect.lua"),
            include_str!("check.lua"),
            include_str!("inspect_kinds.lua"),
        ] {
            assert!(src.contains("KEYS[1]") && src.contains("Returns"));
        }
    }

    #[test]
    fn kind_scripts_state_their_interface() {
        for src in [include_str!("kind_acquire.lua"), include_str!("kind_release.lua"), include_str!("kind_extend.lua")]
        {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
    }
}
