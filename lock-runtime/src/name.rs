//! Lock names of locked calls: a template rendered per call ([`render`]), or a name without
//! parameters shared by every call of its fn ([`fixed_name`], [`default_name`]); both are a
//! [`LockName`], taken without a copy when the lock must be taken.

use std::sync::{Arc, OnceLock};

/// The default lock name: md5 hex of `"<module_path>::<fn_name>"`, computed once per fn.
pub fn default_name(cell: &'static OnceLock<Arc<str>>, module_path: &str, fn_name: &str) -> LockName {
    LockName(cell.get_or_init(|| Arc::from(format!("{:x}", md5::compute(format!("{module_path}::{fn_name}"))))).clone())
}

/// A lock name without parameters: allocated once per fn, shared by its calls.
#[inline]
pub fn fixed_name(cell: &'static OnceLock<Arc<str>>, name: &str) -> LockName {
    LockName(cell.get_or_init(|| Arc::from(name)).clone())
}

/// A locked call's lock name: rendered for the call ([`render`]), or shared by every call of
/// its fn ([`fixed_name`], [`default_name`]).
#[derive(Debug, Clone)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The name.
    #[inline]
    pub fn as_name(&self) -> &str {
        &self.0
    }

    /// The name, shared.
    #[inline]
    pub fn into_name(self) -> Arc<str> {
        self.0
    }
}

/// Renders a name template straight into the shared name: a short name goes through a buffer
/// on the stack rather than a `String` of its own (one allocation per call, not two).
#[inline]
pub fn render(args: std::fmt::Arguments<'_>) -> LockName {
    let mut buf = NameBuf { bytes: [0; NAME_BUF], len: 0 };
    if std::fmt::write(&mut buf, args).is_ok() {
        if let Ok(name) = std::str::from_utf8(&buf.bytes[..buf.len]) {
            return LockName(Arc::from(name));
        }
    }
    LockName(Arc::from(std::fmt::format(args))) // longer (or a `Display` that failed: as `format!`)
}

const NAME_BUF: usize = 64;

/// Where [`render`] writes a short name.
struct NameBuf {
    bytes: [u8; NAME_BUF],
    len: usize,
}

impl std::fmt::Write for NameBuf {
    #[inline]
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_names_are_formatted_names() {
        let long = "x".repeat(NAME_BUF + 1);
        for (args, expected) in [
            (render(format_args!("order:{}", 42)), "order:42".to_owned()),
            (render(format_args!("заказ/{}", "✓")), "заказ/✓".to_owned()),
            (render(format_args!("{}", "y".repeat(NAME_BUF))), "y".repeat(NAME_BUF)),
            (render(format_args!("{long}:{}", 7)), format!("{long}:7")),
            (render(format_args!("plain")), "plain".to_owned()),
        ] {
            assert_eq!(args.as_name(), expected);
            assert_eq!(&*args.into_name(), expected);
        }
    }
}
