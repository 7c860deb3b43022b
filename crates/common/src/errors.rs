//! The error-chain formatter: errors follow the convention that `Display` never repeats
//! the source, so a log line or a CLI message joins the whole chain itself.

/// `err` and each of its sources, joined with `: ` (what `{:#}` prints for an
/// `anyhow::Error`), for library code that logs an error it handled.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        // A source whose text the outer message already carries adds nothing.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A parser message with the values of the input left out, so a configuration error can
/// name the field without echoing a secret: a double-quoted value becomes `<value>`, a
/// back-quoted name stays only when it looks like a field name (ASCII letters, digits,
/// `_`, `-`; at most 40 characters).
pub fn redact_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut escaped = false;
                for d in chars.by_ref() {
                    match d {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
                out.push_str("<value>");
            }
            '`' => {
                let name: String = chars.by_ref().take_while(|d| *d != '`').collect();
                let field_like = !name.is_empty()
                    && name.len() <= 40
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if field_like {
                    out.push('`');
                    out.push_str(&name);
                    out.push('`');
                } else {
                    out.push_str("<value>");
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_keeps_field_names_and_drops_values() {
        let m = r#"auth.bootstrapToken: invalid value "abcdef.0123456789abcdef" for `token`, expected `a b`"#;
        assert_eq!(
            redact_values(m),
            "auth.bootstrapToken: invalid value <value> for `token`, expected <value>"
        );
        assert_eq!(redact_values(r#""a \" b" x"#), "<value> x");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading the config")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn joins_every_source() {
        let e = Outer {
            source: std::io::Error::other("permission denied"),
        };
        assert_eq!(error_chain(&e), "reading the config: permission denied");
    }

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("write failed: {source}")]
        struct Repeats {
            #[source]
            source: std::io::Error,
        }
        let e = Repeats {
            source: std::io::Error::other("disk full"),
        };
        assert_eq!(error_chain(&e), "write failed: disk full");
    }
}
