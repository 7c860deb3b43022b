//! The bootstrap-token format: `<id>.<secret>`, `[a-z0-9]{6}.[a-z0-9]{16}`, the one type
//! every crate parses tokens with (the control plane minting and joining, the worker
//! joining, the node-stack config naming one).
//!
//! `Display` is the whole token (what a join command carries); `Debug` hides the secret
//! half, and no parse error quotes a character of it.

use std::fmt;

use rand::Rng as _;

const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;
const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Name prefix of a bootstrap token Secret (`kube-system/bootstrap-token-<id>`).
pub const TOKEN_SECRET_PREFIX: &str = "bootstrap-token-";

/// A bootstrap token, `<id>.<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

/// Text that is not a bootstrap token, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a bootstrap token: {reason} (expected <6 chars>.<16 chars> of a-z and 0-9, as \
     `stratum-server token create` prints)"
)]
pub struct MalformedToken {
    /// What is wrong with it (never a character of the secret half).
    pub reason: String,
}

impl BootstrapToken {
    /// A fresh token from a CSPRNG (rand's thread RNG, seeded from the OS), each character
    /// drawn uniformly from `[a-z0-9]`.
    pub fn generate() -> BootstrapToken {
        let mut rng = rand::rng();
        let mut draw = |len: usize| -> String {
            (0..len)
                .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
                .collect()
        };
        let id = draw(ID_LEN);
        let secret = draw(SECRET_LEN);
        BootstrapToken { id, secret }
    }

    /// Parses `<id>.<secret>` (surrounding whitespace ignored), explaining what is wrong
    /// with a malformed one.
    pub fn parse(text: &str) -> Result<BootstrapToken, MalformedToken> {
        let text = text.trim();
        let malformed = |reason: String| MalformedToken { reason };
        let Some((id, secret)) = text.split_once('.') else {
            return Err(malformed(
                "it has no '.' between the 6-character id and the 16-character secret".into(),
            ));
        };
        check_part(id, ID_LEN, "id").map_err(malformed)?;
        check_part(secret, SECRET_LEN, "secret").map_err(malformed)?;
        Ok(BootstrapToken {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The public half, which names the Secret and the grant entry.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The private half.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// `bootstrap-token-<id>`.
    pub fn secret_name(&self) -> String {
        token_secret_name(&self.id)
    }
}

/// `bootstrap-token-<id>`.
pub fn token_secret_name(id: &str) -> String {
    format!("{TOKEN_SECRET_PREFIX}{id}")
}

fn check_part(part: &str, len: usize, what: &str) -> Result<(), String> {
    if part.len() != len {
        return Err(format!(
            "the {what} is {} characters long, it must be {len}",
            part.chars().count()
        ));
    }
    if let Some((at, c)) = part
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
    {
        // The id is public; the secret half is not, so not even one character of it is
        // quoted, only where the offending one sits.
        return Err(if what == "id" {
            format!("the {what} contains {c:?}; only lowercase letters and digits are allowed")
        } else {
            format!(
                "the {what} has a character other than a lowercase letter or a digit at \
                 position {} (not shown: it is secret)",
                at + 1
            )
        });
    }
    Ok(())
}

/// Whether `id` is a well-formed token id (`[a-z0-9]{6}`).
pub fn is_token_id(id: &str) -> bool {
    check_part(id, ID_LEN, "id").is_ok()
}

/// A token lifetime that cannot be used. Its `Display` matches `ha::tokens::TokenError::Ttl`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token lifetime {text:?} is invalid: {reason}")]
pub struct TtlError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a token lifetime with `humantime`, like every duration flag of the project
/// (`2h`, `1h30m`, `90s`, `1d`). A token's expiration is written in whole seconds, so a
/// lifetime with a fraction of a second is refused rather than silently cut.
pub fn parse_ttl(text: &str) -> Result<std::time::Duration, TtlError> {
    let bad = |reason: String| TtlError {
        text: text.to_string(),
        reason,
    };
    let ttl = humantime::parse_duration(text.trim())
        .map_err(|e| bad(format!("{e}; write e.g. 2h, 30m or 1h30m")))?;
    if ttl.subsec_nanos() != 0 {
        return Err(bad(
            "a token lifetime is whole seconds; write e.g. 2h, 30m or 1h30m".into(),
        ));
    }
    Ok(ttl)
}

impl fmt::Display for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_whole_seconds_of_humantime() {
        assert_eq!(
            parse_ttl(" 1h30m "),
            Ok(std::time::Duration::from_secs(5400))
        );
        let fraction = parse_ttl("1500ms").unwrap_err();
        assert!(fraction.reason.contains("whole seconds"), "{fraction}");
        let junk = parse_ttl("soon").unwrap_err();
        assert!(
            junk.to_string()
                .starts_with("token lifetime \"soon\" is invalid: ")
        );
    }

    #[test]
    fn parses_and_prints_back() {
        let t = BootstrapToken::parse(" abcdef.0123456789abcdef\n").unwrap();
        assert_eq!(t.id(), "abcdef");
        assert_eq!(t.secret(), "0123456789abcdef");
        assert_eq!(t.to_string(), "abcdef.0123456789abcdef");
        assert_eq!(t.secret_name(), "bootstrap-token-abcdef");
    }

    #[test]
    fn debug_and_errors_never_show_the_secret() {
        let t = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        assert_eq!(format!("{t:?}"), "BootstrapToken(abcdef.<redacted>)");
        let err = BootstrapToken::parse("abcdef.0123456789abcdeX").unwrap_err();
        assert!(err.reason.contains("position 16"), "{err}");
        assert!(!err.to_string().contains('X'), "{err}");
        let err = BootstrapToken::parse("abcdef.0123456789abcdefg").unwrap_err();
        assert!(err.reason.contains("17 characters"), "{err}");
    }

    #[test]
    fn refuses_each_malformed_shape() {
        for bad in [
            "",
            "abcdef",
            "abcde.0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef:0123456789abcdef",
        ] {
            assert!(BootstrapToken::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(is_token_id("a1b2c3"));
        assert!(!is_token_id("a1b2c"));
        assert!(!is_token_id("a1b2C3"));
    }

    #[test]
    fn generated_tokens_parse_and_differ() {
        let a = BootstrapToken::generate();
        let b = BootstrapToken::generate();
        assert_eq!(BootstrapToken::parse(&a.to_string()).unwrap(), a);
        assert_ne!(a, b);
    }
}
