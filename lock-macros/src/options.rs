//! The attribute's options: parsed once into [`Options`], every problem collected.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

/// Every option, in the order the docs list them.
pub(crate) const OPTIONS: &[&str] = &[
    "name",
    "wait",
    "lease",
    "retry",
    "hold_at_least",
    "skip_if_locked",
    "fallback",
    "manager",
    "on_lost",
    "crate",
    "mode",
    "permits",
    "names",
    "leader",
];

/// The options that are flags (given alone, without `= value`).
const FLAGS: &[&str] = &["skip_if_locked", "leader"];

/// The longest `wait` and `lease` accepted, in milliseconds (`lock_runtime::MAX_WAIT`/`MAX_LEASE`).
pub(crate) const MAX_MILLIS: u64 = 24 * 60 * 60 * 1000;
/// The most `retry` attempts accepted (`lock_runtime::MAX_RETRY`).
pub(crate) const MAX_RETRY: u32 = 1_000_000;

/// `on_lost = ..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Abort,
    Ignore,
}

/// `mode = ..`: which side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// A checked duration option.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Millis {
    pub(crate) ms: u64,
}

/// The parsed options; each keeps the span of its key for diagnostics.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) name: Option<LitStr>,
    pub(crate) wait: Option<Millis>,
    pub(crate) lease: Option<Millis>,
    pub(crate) retry: Option<u32>,
    pub(crate) fallback: Option<(Ident, Path)>,
    pub(crate) manager: Option<Expr>,
    pub(crate) on_lost: Option<(OnLost, Span)>,
    pub(crate) krate: Option<Path>,
    /// `hold_at_least = ..`, with the value's span.
    pub(crate) hold_at_least: Option<(Millis, Span)>,
    /// `skip_if_locked`: the flag's span.
    pub(crate) skip_if_locked: Option<Span>,
    /// `mode = read|write`: a read-write lock of `name`.
    pub(crate) mode: Option<Mode>,
    /// `permits = N`: one of N permits of the semaphore `name`.
    pub(crate) permits: Option<u32>,
    /// `names = [..]`: every one of these templates (`lock_all`), instead of `name`.
    pub(crate) names: Option<Vec<LitStr>>,
    /// `leader`: the fn runs as the leader of the election `name` (`Election::lead`); the
    /// flag's span.
    pub(crate) leader: Option<Span>,
}

/// `key = value`, with any expression as the value (interpreted per key afterwards), or a flag
/// (`value` is `None`).
struct RawOption {
    key: Ident,
    value: Option<Expr>,
}

impl Parse for RawOption {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        // A value with no key (`#[distributed_locked("order:{id}")]`): say which key it wants.
        if input.peek(syn::Lit) {
            let lit: syn::Lit = input.parse()?;
            let hint = match &lit {
                syn::Lit::Str(s) => {
                    format!("options are `key = value` pairs: write `name = {:?}` for the lock's name", s.value())
                }
                _ => "options are `key = value` pairs (`name = \"..\"`, `wait = \"2s\"`, ..): this value has no key"
                    .to_owned(),
            };
            return Err(syn::Error::new(lit.span(), hint));
        }
        let key = Ident::parse_any(input)?;
        if FLAGS.contains(&key.to_string().as_str()) {
            if input.peek(Token![=]) {
                return Err(syn::Error::new(
                    key.span(),
                    format!("`{key}` is a flag: write `{key}` alone, without `= ..`"),
                ));
            }
            return Ok(RawOption { key, value: None });
        }
        if !input.peek(Token![=]) {
            let hint = if OPTIONS.contains(&key.to_string().as_str()) {
                format!("expected `=` after `{key}`: write `{key} = ..`")
            } else {
                unknown(&key)
            };
            return Err(syn::Error::new(key.span(), hint));
        }
        input.parse::<Token![=]>()?;
        let value = input.parse()?;
        Ok(RawOption { key, value: Some(value) })
    }
}

fn unknown(key: &Ident) -> String {
    let list: Vec<String> = OPTIONS.iter().map(|o| format!("`{o}`")).collect();
    format!("unknown option `{key}`; expected one of {}", list.join(", "))
}

/// Collects errors so that one build shows them all.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn add(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn into_result(self) -> Result<(), syn::Error> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Parses the attribute's arguments. Problems go to `errors`; what parsed is returned.
pub(crate) fn parse(attr: TokenStream, errors: &mut Errors) -> Options {
    let mut options = Options::default();
    let raw = match Punctuated::<RawOption, Token![,]>::parse_terminated.parse2(attr) {
        Ok(raw) => raw,
        Err(e) => {
            errors.push(e);
            return options;
        }
    };
    let mut seen: Vec<Ident> = Vec::new();
    for RawOption { key, value } in raw {
        let k = key.to_string();
        if !OPTIONS.contains(&k.as_str()) {
            errors.add(key.span(), unknown(&key));
            continue;
        }
        if let Some(first) = seen.iter().find(|s| **s == key) {
            let mut e = syn::Error::new(key.span(), format!("option `{key}` given twice; keep one"));
            e.combine(syn::Error::new(first.span(), format!("`{key}` first given here")));
            errors.push(e);
            continue;
        }
        seen.push(key.clone());
        let Some(value) = value else {
            match k.as_str() {
                "skip_if_locked" => options.skip_if_locked = Some(key.span()),
                "leader" => options.leader = Some(key.span()),
                _ => {}
            }
            continue;
        };
        let result = match k.as_str() {
            "name" => string(&key, &value, "a string literal template, e.g. `name = \"order:{order.id}\"`")
                .map(|s| options.name = Some(s)),
            "wait" => duration(&key, &value).map(|d| options.wait = Some(d)),
            "lease" => duration(&key, &value).and_then(|d| {
                if d.ms == 0 {
                    return Err(syn::Error::new(
                        value.span(),
                        "a zero lease would expire at once; give at least 1ms, or leave `lease` out so a \
                         watchdog keeps the lock alive while the function runs",
                    ));
                }
                options.lease = Some(d);
                Ok(())
            }),
            "retry" => retry(&value).map(|r| options.retry = Some(r)),
            "hold_at_least" => duration(&key, &value).map(|d| options.hold_at_least = Some((d, value.span()))),
            "fallback" => match &value {
                Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => {
                    options.fallback = Some((key.clone(), p.path.clone()));
                    Ok(())
                }
                _ => Err(syn::Error::new(
                    value.span(),
                    "`fallback` takes the path of an async fn, e.g. `fallback = settle_later`, \
                     `fallback = Self::busy` or a method name on `self`",
                )),
            },
            "manager" => {
                options.manager = Some(value.clone());
                Ok(())
            }
            "on_lost" => on_lost(&value).map(|o| options.on_lost = Some((o, value.span()))),
            "crate" => string(&key, &value, "a string path, e.g. `crate = \"my_facade::lock_runtime\"`")
                .and_then(|s| s.parse::<Path>().map_err(|e| syn::Error::new(s.span(), format!("`crate`: {e}"))))
                .map(|p| options.krate = Some(p)),
            "mode" => mode(&value).map(|m| options.mode = Some(m)),
            "permits" => permits(&value).map(|p| options.permits = Some(p)),
            "names" => names(&value).map(|n| options.names = Some(n)),
            _ => Ok(()),
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    check_combined(&options, errors);
    conflicts(&seen, errors);
    options
}

/// Problems of options given together, each reported on the option that conflicts.
fn check_combined(options: &Options, errors: &mut Errors) {
    if let (Some(skip), Some(_)) = (options.skip_if_locked, &options.fallback) {
        errors.add(
            skip,
            "`skip_if_locked` and `fallback` both say what happens when the lock is held elsewhere; keep one \
             (`skip_if_locked` returns `Default::default()`)",
        );
    }
    if let (Some((hold, span)), Some(lease)) = (options.hold_at_least, options.lease) {
        if hold.ms > lease.ms {
            errors.add(
                span,
                format!(
                    "`hold_at_least` of {}ms is longer than the fixed `lease` of {}ms: the lock would expire \
                     before; give a longer `lease`, or leave it out (a watchdog keeps the lock)",
                    hold.ms, lease.ms
                ),
            );
        }
    }
}

/// Options that cannot go together: the one given later is the offending one.
fn conflicts(seen: &[Ident], errors: &mut Errors) {
    const PAIRS: &[(&str, &str, &str)] = &[
        ("name", "names", "`names` takes several locks in place of `name`; keep one of them"),
        ("mode", "names", "`names` takes exclusive locks; `mode` (a read-write lock) goes with `name`"),
        ("permits", "names", "`names` takes exclusive locks; `permits` (a semaphore) goes with `name`"),
        ("mode", "permits", "a lock is either a read-write lock (`mode`) or a semaphore (`permits`); keep one"),
        ("leader", "wait", "a leader campaigns until elected, without a bound; leave `wait` out"),
        ("leader", "retry", "a leader campaigns until elected; leave `retry` out"),
        (
            "leader",
            "hold_at_least",
            "a leader's term ends when its body ends or leadership is lost; leave `hold_at_least` out",
        ),
        ("leader", "skip_if_locked", "a leader waits to be elected instead of skipping; keep one"),
        ("leader", "fallback", "a leader waits to be elected, so there is nothing to fall back from; keep one"),
        (
            "leader",
            "on_lost",
            "a leader's body is always stopped when leadership is lost (then it campaigns again); leave `on_lost` out",
        ),
        ("leader", "mode", "an election is an exclusive lock; leave `mode` out"),
        ("leader", "permits", "an election has one leader; leave `permits` out"),
        ("leader", "names", "an election has one name; give `name`"),
    ];
    let at = |key: &str| seen.iter().position(|s| s == key);
    for (a, b, why) in PAIRS {
        if let (Some(i), Some(j)) = (at(a), at(b)) {
            let (first, later) = if i < j { (&seen[i], &seen[j]) } else { (&seen[j], &seen[i]) };
            errors.add(later.span(), format!("`{later}` cannot be combined with `{first}`: {why}"));
        }
    }
}

fn mode(value: &Expr) -> syn::Result<Mode> {
    if let Expr::Path(p) = value {
        if p.qself.is_none() {
            if let Some(id) = p.path.get_ident() {
                match id.to_string().as_str() {
                    "read" => return Ok(Mode::Read),
                    "write" => return Ok(Mode::Write),
                    _ => {}
                }
            }
        }
    }
    Err(syn::Error::new(
        value.span(),
        "`mode` takes `read` (shared) or `write` (exclusive): a read-write lock of `name`",
    ))
}

fn permits(value: &Expr) -> syn::Result<u32> {
    let Expr::Lit(ExprLit { lit: Lit::Int(i), .. }) = value else {
        return Err(syn::Error::new(value.span(), "`permits` takes an integer of at least 1: the semaphore's permits"));
    };
    match i.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(i.span(), "`permits = 0` admits nobody; give at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(syn::Error::new(i.span(), format!("`permits` must be a whole number from 1 to {}", u32::MAX))),
    }
}

fn names(value: &Expr) -> syn::Result<Vec<LitStr>> {
    let hint = "`names` takes an array of string literal templates, e.g. `names = [\"acct:{from}\", \"acct:{to}\"]`";
    let Expr::Array(array) = value else { return Err(syn::Error::new(value.span(), hint)) };
    if array.elems.is_empty() {
        return Err(syn::Error::new(value.span(), "`names` is empty; give at least one name template"));
    }
    array
        .elems
        .iter()
        .map(|e| match e {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(s.clone()),
            other => Err(syn::Error::new(other.span(), hint)),
        })
        .collect()
}

fn string(key: &Ident, value: &Expr, what: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(s.clone()),
        _ => Err(syn::Error::new(value.span(), format!("`{key}` takes {what}"))),
    }
}

fn duration(key: &Ident, value: &Expr) -> syn::Result<Millis> {
    let ms = match value {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => {
            parse_duration(&s.value()).map_err(|m| syn::Error::new(s.span(), m))?
        }
        // A bare number is milliseconds (the documented meaning; `"250ms"` says it outright).
        Expr::Lit(ExprLit { lit: Lit::Int(i), .. }) => i.base10_parse::<u64>().map_err(|_| {
            syn::Error::new(i.span(), format!("`{key}` in milliseconds must be a whole number up to {MAX_MILLIS}"))
        })?,
        _ => {
            return Err(syn::Error::new(
                value.span(),
                format!("`{key}` takes a duration: \"250ms\", \"2s\", \"1m\", \"1h\", or an integer (milliseconds)"),
            ))
        }
    };
    if ms > MAX_MILLIS {
        return Err(syn::Error::new(
            value.span(),
            format!("`{key}` of {ms}ms is longer than the most accepted, 24h ({MAX_MILLIS}ms)"),
        ));
    }
    Ok(Millis { ms })
}

/// `"250ms"`, `"2s"`, `"1m"`, `"1h"` to milliseconds.
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    let malformed =
        || format!("malformed duration \"{text}\"; write a whole number and a unit: \"250ms\", \"2s\", \"1m\", \"1h\"");
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(malformed());
    }
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(malformed()),
    };
    let too_long = || format!("duration \"{text}\" is longer than the most accepted, 24h");
    let n: u64 = number.parse().map_err(|_| too_long())?;
    n.checked_mul(factor).ok_or_else(too_long)
}

fn retry(value: &Expr) -> syn::Result<u32> {
    let Expr::Lit(ExprLit { lit: Lit::Int(i), .. }) = value else {
        return Err(syn::Error::new(value.span(), "`retry` takes an integer: at most this many further attempts"));
    };
    match i.base10_parse::<u32>() {
        Ok(n) if n <= MAX_RETRY => Ok(n),
        _ => Err(syn::Error::new(i.span(), format!("`retry` must be a whole number up to {MAX_RETRY}"))),
    }
}

fn on_lost(value: &Expr) -> syn::Result<OnLost> {
    if let Expr::Path(p) = value {
        if p.qself.is_none() {
            if let Some(id) = p.path.get_ident() {
                match id.to_string().as_str() {
                    "abort" => return Ok(OnLost::Abort),
                    "ignore" => return Ok(OnLost::Ignore),
                    _ => {}
                }
            }
        }
    }
    Err(syn::Error::new(value.span(), "`on_lost` takes `abort` (the default) or `ignore`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(ts: TokenStream) -> Options {
        let mut errors = Errors::default();
        let o = parse(ts, &mut errors);
        if let Err(e) = errors.into_result() {
            panic!("unexpected error: {e}");
        }
        o
    }

    fn parse_err(ts: TokenStream) -> Vec<String> {
        let mut errors = Errors::default();
        let _ = parse(ts, &mut errors);
        errors.into_result().err().map(|e| e.into_iter().map(|e| e.to_string()).collect()).unwrap_or_default()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert_eq!(parse_duration("2s"), Ok(2_000));
        assert_eq!(parse_duration("1m"), Ok(60_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000));
        assert_eq!(parse_duration("0s"), Ok(0));
        for bad in ["", "s", "2", "2 s", "2sec", "-1s", "1.5s", "1d", "ms2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn every_option() {
        let o = parse_ok(quote!(
            name = "order:{order.id}",
            wait = "2s",
            lease = "1500ms",
            retry = 3,
            fallback = Self::later,
            manager = &self.locks,
            on_lost = ignore,
            crate = "my::lr",
        ));
        assert_eq!(o.name.map(|n| n.value()).as_deref(), Some("order:{order.id}"));
        assert_eq!(o.wait.map(|w| w.ms), Some(2_000));
        assert_eq!(o.lease.map(|w| w.ms), Some(1_500));
        assert_eq!(o.retry, Some(3));
        assert!(o.fallback.is_some() && o.manager.is_some() && o.krate.is_some());
        assert_eq!(o.on_lost.map(|o| o.0), Some(OnLost::Ignore));
        assert!(parse_ok(quote!()).name.is_none());
    }

    #[test]
    fn errors_are_all_reported() {
        let errs =
            parse_err(quote!(leese = "2s", wait = "2 sec", wait = "1s", lease = "0s", retry = -1, on_lost = stop));
        assert_eq!(errs.len(), 7, "{errs:#?}"); // the duplicate carries a second "first given here"
        assert!(errs[0].contains("unknown option `leese`; expected one of `name`, `wait`"));
        assert!(errs[1].contains("malformed duration"));
        assert!(errs[2].contains("given twice"));
        assert!(errs[4].contains("zero lease"));
        assert!(errs[5].contains("`retry`"));
        assert!(errs[6].contains("`abort`"));
    }

    #[test]
    fn scheduled_job_options() {
        let o = parse_ok(quote!(name = "report", hold_at_least = "30s", skip_if_locked));
        assert_eq!(o.hold_at_least.map(|h| h.0.ms), Some(30_000));
        assert!(o.skip_if_locked.is_some());
        let o = parse_ok(quote!(skip_if_locked, wait = "1s", lease = "1m", hold_at_least = "1m"));
        assert!(o.skip_if_locked.is_some() && o.wait.is_some());
        assert!(parse_ok(quote!(name = "x")).skip_if_locked.is_none());
        let errs = parse_err(quote!(skip_if_locked = true, hold_at_least = "soon"));
        assert_eq!(errs.len(), 1, "a parse error stops at the first: {errs:#?}");
        assert!(errs[0].contains("`skip_if_locked` is a flag"), "{errs:#?}");
        let errs = parse_err(quote!(skip_if_locked, fallback = later, lease = "1s", hold_at_least = "2s"));
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert!(errs[0].contains("`skip_if_locked` and `fallback`"), "{errs:#?}");
        assert!(errs[1].contains("longer than the fixed `lease`"), "{errs:#?}");
        assert!(parse_err(quote!(skip_if_locked, skip_if_locked))[0].contains("given twice"));
        assert!(parse_err(quote!(hold_at_least = "25h"))[0].contains("longer than the most accepted"));
    }

    #[test]
    fn kinds() {
        let o = parse_ok(quote!(name = "catalog", mode = read));
        assert_eq!(o.mode, Some(Mode::Read));
        assert_eq!(parse_ok(quote!(name = "exports", permits = 4)).permits, Some(4));
        let o = parse_ok(quote!(names = ["acct:{from}", "acct:{to}"]));
        assert_eq!(o.names.map(|n| n.len()), Some(2));
        assert!(parse_err(quote!(permits = 0))[0].contains("admits nobody"));
        assert!(parse_err(quote!(mode = upgrade))[0].contains("`read`"));
        assert!(parse_err(quote!(names = "a"))[0].contains("array of string literal"));
        assert!(parse_err(quote!(names = []))[0].contains("empty"));
        let errs = parse_err(quote!(names = ["a"], name = "b", mode = write, permits = 2));
        assert_eq!(errs.len(), 4, "{errs:#?}"); // each pair, on the option given later
        assert!(errs.iter().any(|e| e.contains("`name` cannot be combined with `names`")), "{errs:#?}");
        assert!(errs.iter().any(|e| e.contains("`permits` cannot be combined with `mode`")), "{errs:#?}");
    }

    #[test]
    fn limits() {
        assert!(parse_err(quote!(wait = "25h"))[0].contains("longer than the most accepted"));
        assert!(parse_err(quote!(lease = "86400001ms"))[0].contains("longer than the most accepted"));
        // A bare number is milliseconds (the public contract uses `wait = 250`).
        assert_eq!(parse_ok(quote!(wait = 250)).wait.map(|w| w.ms), Some(250));
        assert!(parse_ok(quote!(wait = "24h", lease = "1ms")).lease.is_some());
        assert!(parse_err(quote!(retry = 1000001))[0].contains("up to 1000000"));
        assert!(parse_err(quote!(name = order))[0].contains("string literal"));
        assert!(parse_err(quote!(fallback = "f"))[0].contains("path of an async fn"));
        assert!(parse_err(quote!(crate = "not a path"))[0].contains("`crate`"));
        assert!(parse_err(quote!(wait))[0].contains("expected `=` after `wait`"));
        assert!(parse_err(quote!("e"))[0].contains("write `name = \"e\"`"), "{:?}", parse_err(quote!("e")));
        assert!(parse_err(quote!(name = "a", 5))[0].contains("this value has no key"));
    }
}
