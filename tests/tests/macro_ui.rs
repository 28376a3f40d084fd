//! Compile-time behaviour of `#[distributed_locked]`: `ui/pass` cases compile (lint-clean) and
//! run; `ui/fail` cases fail with the diagnostics pinned in their `.stderr` files (for the
//! toolchain in `rust-toolchain.toml`; refresh with `TRYBUILD=overwrite`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
