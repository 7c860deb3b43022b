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

#[cfg(test)]
mod tests {
    use super::*;

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
