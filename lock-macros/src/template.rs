//! Lock-name templates: `"order:{order.id}"`, parsed and checked at compile time.

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text (braces already unescaped).
    Text(String),
    /// `{a.b.c}`: a parameter (or `self`) and the fields after it.
    Field(Vec<String>),
}

/// Splits `template` into pieces. `{{` and `}}` stand for literal braces.
pub(crate) fn parse(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|p| p.1) == Some('{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek().map(|p| p.1) == Some('}') => {
                chars.next();
                text.push('}');
            }
            '}' => return Err(format!("unmatched `}}` at byte {at}; write `}}}}` for a literal brace")),
            '{' => {
                let mut inner = String::new();
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    inner.push(c);
                }
                if !closed {
                    return Err(format!("unclosed `{{` at byte {at}; write `{{{{` for a literal brace"));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field(field(&inner)?));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

fn field(inner: &str) -> Result<Vec<String>, String> {
    let inner = inner.trim();
    if inner.is_empty() {
        return Err("empty `{}` in the name; name a parameter, e.g. `{id}` or `{order.id}`".to_owned());
    }
    if inner.contains(':') {
        return Err(format!("`{{{inner}}}`: format specs are not supported; a parameter is rendered with Display"));
    }
    let segments: Vec<String> = inner.split('.').map(|s| s.trim().to_owned()).collect();
    for (i, s) in segments.iter().enumerate() {
        let ident = s.chars().next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && s.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
        let index = i > 0 && !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        if !(ident || index) {
            return Err(format!("`{{{inner}}}` is not a parameter path; write `{{param}}` or `{{param.field.field}}`"));
        }
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &[&str]) -> Piece {
        Piece::Field(s.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn pieces() {
        assert_eq!(parse("a").unwrap(), vec![Piece::Text("a".into())]);
        assert_eq!(
            parse("order:{order.id}:{ self.shard }{x}").unwrap(),
            vec![
                Piece::Text("order:".into()),
                f(&["order", "id"]),
                Piece::Text(":".into()),
                f(&["self", "shard"]),
                f(&["x"])
            ]
        );
        assert_eq!(parse("{{literal}}:{pair.0}").unwrap(), vec![Piece::Text("{literal}:".into()), f(&["pair", "0"])]);
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn malformed() {
        for bad in ["{", "a}", "{}", "{ }", "{a:>5}", "{a b}", "{a..b}", "{0}", "{a.}", "{a-b}"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
