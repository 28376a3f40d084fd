//! Runnable examples of `lock-runtime`; see the `examples/` folder of this package.
