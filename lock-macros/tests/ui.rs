//! Compile-time behaviour of `#[distributed_locked]`: `ui/pass` cases compile (lint-clean) and
//! run; `ui/fail` cases fail with the diagnostics pinned in their `.stderr` files (for the
//! toolchain in `rust-toolchain.toml`; refresh with `TRYBUILD=overwrite`). Kept in this crate
//! so that trybuild builds only `lock-runtime` and `tokio`, not the web frameworks of the
//! `tests` package.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
