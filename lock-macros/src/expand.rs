//! The expansion: keep the signature, take the lock, then run the body in `async move`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{FnArg, Ident, ItemFn, Pat, PatIdent, ReturnType, Type};

use crate::options::{self, Errors, Mode, OnLost, Options};
use crate::template::{self, Piece};

/// One parameter of the locked fn, as the expansion sees it.
enum Param {
    /// `self`, `&self`, `&mut self`, `self: Arc<Self>`.
    Receiver(syn::Token![self]),
    /// A plain `ident: Type`: kept as is.
    Plain(Ident),
    /// A pattern (`(a, b): (u32, u32)`, `Path(id): Path<u64>`, `mut x: T`): renamed to `hidden`
    /// in the signature and destructured inside.
    Pattern { hidden: Ident, pat: Box<Pat>, bindings: Vec<Ident> },
}

impl Param {
    /// The expression that passes this parameter on to the fallback.
    fn argument(&self) -> TokenStream {
        match self {
            Param::Receiver(s) => s.to_token_stream(),
            Param::Plain(id) => id.to_token_stream(),
            Param::Pattern { hidden, .. } => hidden.to_token_stream(),
        }
    }
}

/// Expands the attribute; on any error, the function is emitted unchanged beside the errors.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let opts = options::parse(attr, &mut errors);
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let e =
                syn::Error::new(e.span(), format!("`#[distributed_locked]` goes on an `async fn` with a body ({e})"));
            errors.push(e);
            let e = errors.into_result().err().map(|e| e.into_compile_error());
            return quote!(#e #item);
        }
    };
    if func.sig.asyncness.is_none() {
        errors.add(
            func.sig.fn_token.span,
            "`#[distributed_locked]` goes on an `async fn`: the lock is awaited; add `async`",
        );
    }
    let params = collect_params(&mut func);
    if let ReturnType::Type(_, ty) = &func.sig.output {
        if let Some(span) = impl_trait(ty) {
            errors
                .add(span, "`#[distributed_locked]` needs a nameable return type; `impl Trait` is not supported here");
        }
    }
    let name = match (&opts.names, &opts.name) {
        (Some(names), _) => {
            // `lock_all` of every rendered template.
            let private = private(&opts);
            let rendered: Vec<TokenStream> = names
                .iter()
                .filter_map(|lit| render_name(lit, &params, &mut errors, &private))
                .map(|name| quote!(#private::LockName::into_name(#name)))
                .collect();
            quote!(::std::vec![#(#rendered),*])
        }
        (None, Some(lit)) => match render_name(lit, &params, &mut errors, &private(&opts)) {
            Some(name) => name,
            None => quote!(""),
        },
        (None, None) => default_name(&func, &private(&opts)),
    };
    if let Err(e) = errors.into_result() {
        let original: ItemFn = match syn::parse2(item) {
            Ok(f) => f,
            Err(e2) => return e2.into_compile_error(),
        };
        let e = e.into_compile_error();
        return quote!(#e #original);
    }
    let block = body(&func, &opts, &params, name);
    *func.block = block;
    func.into_token_stream()
}

/// Renames pattern parameters to hidden idents and returns the parameter list.
fn collect_params(func: &mut ItemFn) -> Vec<Param> {
    let mut params = Vec::new();
    for (i, arg) in func.sig.inputs.iter_mut().enumerate() {
        match arg {
            FnArg::Receiver(r) => params.push(Param::Receiver(r.self_token)),
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(PatIdent { by_ref: None, mutability: None, subpat: None, ident, attrs })
                    if attrs.is_empty() && ident != "self" =>
                {
                    params.push(Param::Plain(ident.clone()))
                }
                _ => {
                    let hidden = format_ident!("__lock_arg{}", i, span = Span::mixed_site());
                    let pat = std::mem::replace(
                        &mut t.pat,
                        Box::new(Pat::Ident(PatIdent {
                            attrs: Vec::new(),
                            by_ref: None,
                            mutability: None,
                            ident: hidden.clone(),
                            subpat: None,
                        })),
                    );
                    let mut bindings = Bindings(Vec::new());
                    bindings.visit_pat(&pat);
                    params.push(Param::Pattern { hidden, pat, bindings: bindings.0 });
                }
            },
        }
    }
    params
}

/// The idents a pattern binds.
struct Bindings(Vec<Ident>);

impl<'ast> Visit<'ast> for Bindings {
    fn visit_pat_ident(&mut self, p: &'ast PatIdent) {
        self.0.push(p.ident.clone());
        syn::visit::visit_pat_ident(self, p);
    }
}

/// Strips `mut` and `ref` so the pattern can bind by reference (match ergonomics).
struct ByRef;

impl VisitMut for ByRef {
    fn visit_pat_ident_mut(&mut self, p: &mut PatIdent) {
        p.by_ref = None;
        p.mutability = None;
        syn::visit_mut::visit_pat_ident_mut(self, p);
    }
}

fn impl_trait(ty: &Type) -> Option<Span> {
    struct Find(Option<Span>);
    impl<'ast> Visit<'ast> for Find {
        fn visit_type_impl_trait(&mut self, t: &'ast syn::TypeImplTrait) {
            self.0.get_or_insert(t.impl_token.span);
        }
    }
    let mut f = Find(None);
    f.visit_type(ty);
    f.0
}

/// The template rendered per call (`__private::render`), or its text, shared, when it has no
/// parameter (`__private::fixed_name`); `None` on errors.
fn render_name(lit: &syn::LitStr, params: &[Param], errors: &mut Errors, private: &TokenStream) -> Option<TokenStream> {
    let pieces = match template::parse(&lit.value()) {
        Ok(p) => p,
        Err(e) => {
            errors.add(lit.span(), format!("in `name`: {e}"));
            return None;
        }
    };
    if pieces.is_empty() {
        errors.add(lit.span(), "`name` is empty; give the lock a name, or leave `name` out for the default");
        return None;
    }
    let mut fmt = String::new();
    let mut args = Vec::new();
    let mut ok = true;
    for piece in &pieces {
        match piece {
            Piece::Text(t) => fmt.push_str(&t.replace('{', "{{").replace('}', "}}")),
            Piece::Field(path) => {
                fmt.push_str("{}");
                let Some(root) = resolve(&path[0], params, lit.span()) else {
                    errors.add(lit.span(), unknown_param(&path[0], params));
                    ok = false;
                    continue;
                };
                let fields = path[1..].iter().map(|f| match f.parse::<u32>() {
                    Ok(index) => syn::Index { index, span: lit.span() }.into_token_stream(),
                    Err(_) => Ident::new(f, lit.span()).into_token_stream(),
                });
                args.push(quote_spanned!(lit.span()=> &#root #(.#fields)*));
            }
        }
    }
    if !ok {
        return None;
    }
    if args.is_empty() {
        // A fixed name: shared by every call of the fn, allocated once.
        let text = syn::LitStr::new(&fmt.replace("{{", "{").replace("}}", "}"), lit.span());
        let cell = Ident::new("__LOCK_NAME", Span::mixed_site());
        return Some(quote!({
            static #cell: ::std::sync::OnceLock<::std::sync::Arc<str>> = ::std::sync::OnceLock::new();
            #private::fixed_name(&#cell, #text)
        }));
    }
    let fmt = syn::LitStr::new(&fmt, lit.span());
    Some(quote_spanned!(lit.span()=> #private::render(::core::format_args!(#fmt, #(#args),*))))
}

/// The tokens naming template root `name`, if it is a parameter (or `self`).
fn resolve(name: &str, params: &[Param], span: Span) -> Option<TokenStream> {
    for p in params {
        match p {
            Param::Receiver(_) if name == "self" => return Some(quote_spanned!(span=> self)),
            Param::Plain(id) if id == name => return Some(Ident::new(name, span).into_token_stream()),
            Param::Pattern { bindings, .. } if bindings.iter().any(|b| b == name) => {
                return Some(Ident::new(name, span).into_token_stream())
            }
            _ => {}
        }
    }
    None
}

fn unknown_param(name: &str, params: &[Param]) -> String {
    if name == "self" {
        return "`{self.…}` in `name` needs a method with a `self` receiver".to_owned();
    }
    let mut known: Vec<String> = Vec::new();
    for p in params {
        match p {
            Param::Receiver(_) => known.push("`self`".to_owned()),
            Param::Plain(id) => known.push(format!("`{id}`")),
            Param::Pattern { bindings, .. } => known.extend(bindings.iter().map(|b| format!("`{b}`"))),
        }
    }
    if known.is_empty() {
        format!("`{{{name}}}` in `name`: this function has no parameters to interpolate")
    } else {
        format!("`{{{name}}}` in `name` is not a parameter; the parameters are {}", known.join(", "))
    }
}

/// md5 of `module_path!()::fn_name`, computed once per fn into a static inside its body.
fn default_name(func: &ItemFn, private: &TokenStream) -> TokenStream {
    let cell = Ident::new("__LOCK_DEFAULT_NAME", Span::mixed_site());
    let fn_name = syn::LitStr::new(&func.sig.ident.to_string(), func.sig.ident.span());
    quote!({
        static #cell: ::std::sync::OnceLock<::std::sync::Arc<str>> = ::std::sync::OnceLock::new();
        #private::default_name(&#cell, ::core::module_path!(), #fn_name)
    })
}

/// `::lock_runtime`, or the `crate = ".."` given.
fn krate(opts: &Options) -> TokenStream {
    opts.krate.clone().map(|p| p.into_token_stream()).unwrap_or_else(|| quote!(::lock_runtime))
}

/// `::lock_runtime::__private`, or under the `crate = ".."` given.
fn private(opts: &Options) -> TokenStream {
    let krate = krate(opts);
    quote!(#krate::__private)
}

/// `tokens` (a braced block) as the fn's new block; a block holding the error if they do not
/// parse.
fn block(tokens: TokenStream) -> syn::Block {
    match syn::parse2(tokens) {
        Ok(block) => block,
        Err(e) => syn::Block {
            brace_token: Default::default(),
            stmts: vec![syn::Stmt::Expr(syn::Expr::Verbatim(e.into_compile_error()), None)],
        },
    }
}

/// The new body of a `leader` fn: `Election::lead` of the election `name`, the body made anew
/// for each term from clones of the arguments (references are copied).
fn leader(
    opts: &Options,
    params: &[Param],
    by_ref: &[TokenStream],
    name: TokenStream,
    fut: TokenStream,
    ret_ty: &Type,
    ret_span: Span,
) -> syn::Block {
    let m = Span::mixed_site();
    let private = private(opts);
    let (name_var, manager_var, leadership, error, output) = (
        Ident::new("__lock_name", m),
        Ident::new("__lock_manager", m),
        Ident::new("__lock_leadership", m),
        Ident::new("__lock_error", m),
        Ident::new("__lock_output", m),
    );
    let manager = match &opts.manager {
        Some(manager) => quote! {
            let (#manager_var, #name_var) = { #(#by_ref)* (#manager, #name) };
            let #manager_var = ::core::option::Option::Some(&#manager_var);
        },
        None => quote! {
            let #name_var = { #(#by_ref)* #name };
            let #manager_var = #private::default_manager();
            let #manager_var = #manager_var.as_ref();
        },
    };
    let lease = match opts.lease {
        Some(l) => {
            let ms = l.ms;
            quote!(::core::option::Option::Some(#private::millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    // Each term's body owns clones of the arguments; `self` (a `&self` receiver) is copied.
    let clones = params.iter().filter_map(|p| match p {
        Param::Receiver(_) => None,
        Param::Plain(id) => Some(quote!(#[allow(unused_variables)] let #id = ::core::clone::Clone::clone(&#id);)),
        Param::Pattern { hidden, .. } => {
            Some(quote!(#[allow(unused_variables)] let #hidden = ::core::clone::Clone::clone(&#hidden);))
        }
    });
    let carry_lock = quote_spanned!(ret_span=> <#ret_ty as #private::CarryLockError>::from_lock_error);
    let tokens = quote! {{
        #manager
        match #private::lead(#manager_var, #name_var, #lease, |#leadership| {
            #(#clones)*
            async move {
                // The term lasts as long as the body: dropped with it, it resigns.
                let #leadership = #leadership;
                let #output: #ret_ty = #fut.await;
                ::core::mem::drop(#leadership);
                #output
            }
        })
        .await
        {
            ::core::result::Result::Ok(#output) => #output,
            ::core::result::Result::Err(#error) => #carry_lock(#error),
        }
    }};
    block(tokens)
}

/// The new body of the locked fn.
fn body(func: &ItemFn, opts: &Options, params: &[Param], name: TokenStream) -> syn::Block {
    let (name_tokens, manager_tokens) = (name.clone(), opts.manager.as_ref().map(ToTokens::to_token_stream));
    let m = Span::mixed_site();
    let private = private(opts);
    let (run_var, error, output, name_var, manager_var, carry) = (
        Ident::new("__lock_run", m),
        Ident::new("__lock_error", m),
        Ident::new("__lock_output", m),
        Ident::new("__lock_name", m),
        Ident::new("__lock_manager", m),
        Ident::new("__lock_carry", m),
    );

    // Pattern parameters bound by reference, for the template and the manager expression.
    let by_ref: Vec<TokenStream> = params
        .iter()
        .filter_map(|p| match p {
            Param::Pattern { hidden, pat, bindings } if !bindings.is_empty() => {
                let mut pat = (**pat).clone();
                ByRef.visit_pat_mut(&mut pat);
                Some(quote!(#[allow(unused_variables)] let #pat = &#hidden;))
            }
            _ => None,
        })
        .collect();

    let mut options = quote!(#private::LockOptions::new());
    if let Some(w) = opts.wait {
        let ms = w.ms;
        options.extend(quote!(.wait(#private::millis(#ms))));
    }
    if let Some(l) = opts.lease {
        let ms = l.ms;
        options.extend(quote!(.lease(#private::millis(#ms))));
    }
    if let Some(r) = opts.retry {
        options.extend(quote!(.retry(#r)));
    }
    if let Some((h, _)) = opts.hold_at_least {
        let ms = h.ms;
        options.extend(quote!(.hold_at_least(#private::millis(#ms))));
    }
    if opts.skip_if_locked.is_some() && opts.wait.is_none() {
        // One attempt: a scheduled job held elsewhere is skipped, not waited for.
        options.extend(quote!(.wait(#private::millis(0))));
    }

    // The kind of `mode` and `permits` (a mutex without them).
    let krate = krate(opts);
    let kind = match (opts.mode, opts.permits) {
        (Some(Mode::Read), _) => quote!(#krate::backend::LockKind::Read),
        (Some(Mode::Write), _) => quote!(#krate::backend::LockKind::Write),
        (None, Some(permits)) => quote!(#krate::backend::LockKind::Semaphore { permits: #permits }),
        (None, None) => quote!(#krate::backend::LockKind::Exclusive),
    };

    // The lock goes into `run` (a `Locked` run), pinned in the locked fn's future: entered in
    // place before the arguments move into the body, then run with it. A read lock, write lock
    // or permit is the same run of another kind; `names`, several locks entered into it.
    let enter = match (&opts.manager, kind, &opts.names) {
        (Some(manager), _, Some(_)) => quote! {
            let (#manager_var, #name_var) = { #(#by_ref)* (#manager, #name) };
            #private::enter_all(#run_var.as_mut(), ::core::option::Option::Some(&#manager_var), #name_var, #options).await
        },
        (None, _, Some(_)) => quote! {
            let #name_var = { #(#by_ref)* #name };
            let #manager_var = #private::default_manager();
            #private::enter_all(#run_var.as_mut(), #manager_var.as_ref(), #name_var, #options).await
        },
        (Some(manager), kind, None) => quote! {
            let (#manager_var, #name_var) = { #(#by_ref)* (#manager, #name) };
            #private::enter(#run_var.as_mut(), &#manager_var, #name_var, #kind, #options).await
        },
        (None, kind, None) => quote! {
            let #name_var = { #(#by_ref)* #name };
            let #manager_var = #private::default_manager();
            #private::enter_default(#run_var.as_mut(), &#manager_var, #name_var, #kind, #options).await
        },
    };

    let (ret_ty, ret_span): (Type, Span) = match &func.sig.output {
        ReturnType::Type(_, ty) => ((**ty).clone(), ty.span()),
        ReturnType::Default => (syn::parse_quote_spanned!(func.sig.ident.span()=> ()), func.sig.ident.span()),
    };
    let carry_lock = quote_spanned!(ret_span=> <#ret_ty as #private::CarryLockError>::from_lock_error);

    let on_fail = match &opts.fallback {
        None if opts.skip_if_locked.is_some() => {
            // Only the call is spanned at the return type: a missing `Default` is reported there.
            let call = quote_spanned!(ret_span=> (&#private::Probe::<#ret_ty>::new()).skipped());
            let skipped = quote! {
                || {
                    use #private::{SkipWithDefault as _, SkipWithOk as _};
                    #call
                }
            };
            quote! {
                let #carry = {
                    use #private::{AbortIfCarried as _, RunToEndOtherwise as _};
                    (&#private::Probe::<#ret_ty>::new()).on_lost()
                };
                return #private::skip(#error, #carry, #skipped);
            }
        }
        None => quote!(return #carry_lock(#error);),
        Some((key, path)) => {
            let receiver = params.iter().any(|p| matches!(p, Param::Receiver(_)));
            let path = match path.get_ident() {
                Some(method) if receiver => quote_spanned!(key.span()=> Self::#method),
                _ => path.to_token_stream(),
            };
            let args = params.iter().map(Param::argument);
            let span = key.span();
            quote_spanned! {span=>
                #private::falling_back(&#error);
                return #path(#(#args),*).await;
            }
        }
    };

    // The body, in `async move`, with its output pinned to the declared return type. (Inner
    // attributes stay in `func.attrs`; `ItemFn` prints them inside the new block.)
    // A binding the attribute uses (in `manager = &state.locks`, in a name template) is used,
    // though the body may not use it: said so after binding it, or rustc warns "unused
    // variable" about code the user wrote correctly. An unused one still warns.
    let in_attribute = quote!(#name_tokens #manager_tokens);
    let by_value: Vec<TokenStream> = params
        .iter()
        .filter_map(|p| match p {
            Param::Pattern { hidden, pat, bindings } => {
                let used = bindings.iter().filter(|b| mentions(&in_attribute, b));
                Some(quote!(let #pat = #hidden; #(let _ = &#used;)*))
            }
            _ => None,
        })
        .collect();
    let fake_return = match &func.sig.output {
        ReturnType::Type(_, ty) => {
            let fake = Ident::new("__lock_return", m);
            quote! {
                #[allow(
                    unknown_lints, unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop,
                    clippy::let_unit_value, clippy::let_with_type_underscore, clippy::needless_return,
                    clippy::unreachable
                )]
                if false {
                    let #fake: #ty = loop {};
                    return #fake;
                }
            }
        }
        ReturnType::Default => quote!(),
    };
    let stmts = &func.block.stmts;
    let fut = quote! {
        async move {
            #(#by_value)*
            #fake_return
            #(#stmts)*
        }
    };
    if opts.leader.is_some() {
        return leader(opts, params, &by_ref, name, fut, &ret_ty, ret_span);
    }

    let start = |on_lost: TokenStream| quote!(#private::start(#run_var, #on_lost, #fut).await);
    // Whether a failure to take the lock has an answer other than the error (a `fallback`, or
    // `skip_if_locked`): then the default `on_lost` follows the return type.
    let alternative = (opts.fallback.is_some() || opts.skip_if_locked.is_some()).then_some(());
    let run = match (opts.on_lost, alternative) {
        (Some((OnLost::Ignore, _)), Some(_)) => {
            let start = start(quote!(#private::OnLost::Ignore));
            quote!(#private::carried(#start, ::core::option::Option::None))
        }
        (Some((OnLost::Abort, span)), Some(_)) => {
            let start = start(quote!(#private::OnLost::Abort));
            let carry_lost = quote_spanned!(span=> <#ret_ty as #private::CarryLostError>::from_lost_error);
            quote! {
                match #start {
                    ::core::result::Result::Ok(#output) => #output,
                    ::core::result::Result::Err(#error) => #carry_lost(#error),
                }
            }
        }
        (on_lost, None) => {
            let start = match on_lost {
                Some((OnLost::Ignore, _)) => start(quote!(#private::OnLost::Ignore)),
                _ => start(quote!(#private::OnLost::Abort)),
            };
            quote! {
                match #start {
                    ::core::result::Result::Ok(#output) => #output,
                    ::core::result::Result::Err(#error) => #carry_lock(#error),
                }
            }
        }
        (None, Some(_)) => {
            let start = start(quote!(#private::OnLost::carried(&#carry)));
            quote! {{
                let #carry = {
                    use #private::{AbortIfCarried as _, RunToEndOtherwise as _};
                    (&#private::Probe::<#ret_ty>::new()).on_lost()
                };
                #private::carried(#start, #carry)
            }}
        }
    };

    let tokens = quote! {{
        let mut #run_var = ::core::pin::pin!(#private::Locked::new());
        if let ::core::result::Result::Err(#error) = { #enter } {
            #on_fail
        }
        #run
    }};
    block(tokens)
}

/// Whether `tokens` name `ident` anywhere (in a group too).
fn mentions(tokens: &TokenStream, ident: &Ident) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        proc_macro2::TokenTree::Ident(i) => i == *ident,
        proc_macro2::TokenTree::Group(g) => mentions(&g.stream(), ident),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(attr: TokenStream, item: TokenStream) -> String {
        expand(attr, item).to_string()
    }

    #[test]
    fn every_error_is_reported_and_the_fn_still_emitted() {
        let out = expanded(
            quote!(wait = "2 sec", leese = 1, name = "{nope}"),
            quote!(
                fn f(id: u32) -> u32 {
                    id
                }
            ),
        );
        assert_eq!(out.matches("compile_error").count(), 4, "{out}");
        assert!(out.contains("add `async`"), "{out}");
        assert!(out.contains("malformed duration"), "{out}");
        assert!(out.contains("unknown option `leese`"), "{out}");
        assert!(out.contains("`{nope}` in `name` is not a parameter; the parameters are `id`"), "{out}");
        assert!(out.contains("fn f (id : u32) -> u32 { id }"), "the original fn is kept: {out}");
    }

    #[test]
    fn patterns_are_renamed_and_destructured_after_the_lock() {
        let out = expanded(
            quote!(name = "p:{a}"),
            quote!(
                async fn f((a, b): (u32, u32), mut c: u32) -> Result<u32, E> {
                    c += a + b;
                    Ok(c)
                }
            ),
        );
        assert!(out.contains("async fn f (__lock_arg0 : (u32 , u32) , __lock_arg1 : u32)"), "{out}");
        assert!(out.contains("let (a , b) = & __lock_arg0 ;"), "template binds by reference: {out}");
        assert!(out.contains("let (a , b) = __lock_arg0 ;"), "body binds by value: {out}");
        assert!(out.contains("let mut c = __lock_arg1 ;"), "{out}");
        let enter = out.find("enter_default").expect("enters");
        let body = out.find("async move").expect("body");
        assert!(enter < body, "the lock is taken before the arguments move into the body");
    }

    #[test]
    fn fallback_gets_the_same_arguments_and_methods_resolve_on_self() {
        let out = expanded(
            quote!(name = "m:{id}", fallback = busy),
            quote!(
                async fn m(&self, (x, _): (u8, u8), id: u32) -> u32 {
                    id
                }
            ),
        );
        assert!(out.contains("return Self :: busy (self , __lock_arg1 , id) . await"), "{out}");
        let out = expanded(
            quote!(fallback = later),
            quote!(
                async fn f(id: u32) -> u32 {
                    id
                }
            ),
        );
        assert!(out.contains("return later (id) . await"), "{out}");
    }

    #[test]
    fn default_name_is_computed_once_per_fn() {
        let out = expanded(
            quote!(),
            quote!(
                async fn job() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("static __LOCK_DEFAULT_NAME"), "{out}");
        assert!(out.contains(":: core :: module_path ! ()"), "{out}");
        assert!(out.contains("\"job\""), "{out}");
    }

    #[test]
    fn crate_path_is_used_everywhere() {
        let out = expanded(
            quote!(crate = "my::lr", name = "x"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("my :: lr :: __private :: enter_default"), "{out}");
        assert!(!out.contains(":: lock_runtime"), "{out}");
    }
}
