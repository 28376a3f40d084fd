//! The `#[distributed_locked]` attribute of `lock-runtime`. Use it as
//! `lock_runtime::distributed_locked`; this crate only parses and generates code.

use proc_macro::TokenStream;

mod expand;
mod options;
mod template;

/// See `lock_runtime::distributed_locked`.
#[proc_macro_attribute]
pub fn distributed_locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
