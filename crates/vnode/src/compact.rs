//! Small value types for what the pod controller keeps per tracked pod: a string that
//! holds up to 22 bytes without a heap allocation, a pod UID kept as 16 bytes when it is
//! a canonical UUID, and a claim kept as the 12 bytes of its hash.

use std::fmt;

/// Bytes a [`SmallStr`] holds without allocating.
const INLINE: usize = 22;

/// An immutable string stored inline when it is at most 22 bytes long (instance ids,
/// resource versions, container names, short images), boxed otherwise. 24 bytes.
#[derive(Clone)]
pub(crate) enum SmallStr {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<str>),
}

impl SmallStr {
    pub(crate) fn new(s: &str) -> SmallStr {
        if s.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..s.len()].copy_from_slice(s.as_bytes());
            SmallStr::Inline {
                len: s.len() as u8,
                buf,
            }
        } else {
            SmallStr::Heap(s.into())
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Built from a `&str` cut at its own length, so always UTF-8.
            SmallStr::Inline { len, buf } => {
                std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or_default()
            }
            SmallStr::Heap(s) => s,
        }
    }
}

// Compared and hashed as the `str` it holds, so a map keyed by it can be asked with a `&str`.
impl PartialEq for SmallStr {
    fn eq(&self, other: &SmallStr) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SmallStr {}

impl std::hash::Hash for SmallStr {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h);
    }
}

impl std::ops::Deref for SmallStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for SmallStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for SmallStr {
    fn from(s: &str) -> SmallStr {
        SmallStr::new(s)
    }
}

impl From<String> for SmallStr {
    fn from(s: String) -> SmallStr {
        if s.len() <= INLINE {
            SmallStr::new(&s)
        } else {
            SmallStr::Heap(s.into_boxed_str())
        }
    }
}

impl fmt::Debug for SmallStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SmallStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod UID: 16 bytes when it is a lowercase canonical UUID (what API servers issue),
/// the string itself otherwise. Renders back to exactly the string it was made from.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Uid {
    /// The UUID's bytes (an array, not a `u128`, so a record keeps 8-byte alignment).
    Uuid([u8; 16]),
    Other(SmallStr),
}

impl Uid {
    pub(crate) fn new(s: &str) -> Uid {
        parse_uuid(s).map_or_else(
            || Uid::Other(SmallStr::new(s)),
            |v| Uid::Uuid(v.to_be_bytes()),
        )
    }
}

fn parse_uuid(s: &str) -> Option<u128> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let mut v: u128 = 0;
    for (i, &c) in b.iter().enumerate() {
        if [8, 13, 18, 23].contains(&i) {
            continue;
        }
        // Lowercase only: an uppercase UUID would not render back to itself.
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u128::from(d);
    }
    Some(v)
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Uuid(v) => {
                let h = hex::encode(v);
                write!(
                    f,
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            }
            Uid::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// A claim ([`crate::claim::claim_name`]): the 12 hash bytes behind its 24 hex digits
/// when it has the shape this crate gives claims, the string itself otherwise (a claim a
/// provider lists that this crate did not make). Two claims are equal exactly when their
/// strings are.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum ClaimKey {
    Hash([u8; 12]),
    Other(Box<str>),
}

impl ClaimKey {
    pub(crate) fn new(claim: &str) -> ClaimKey {
        let hash = claim
            .strip_prefix(crate::claim::CLAIM_PREFIX)
            .filter(|h| h.len() == 24 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|h| {
                let mut out = [0u8; 12];
                hex::decode_to_slice(h, &mut out).ok()?;
                Some(out)
            });
        match hash {
            Some(h) => ClaimKey::Hash(h),
            None => ClaimKey::Other(claim.into()),
        }
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimKey::Hash(h) => write!(f, "{}{}", crate::claim::CLAIM_PREFIX, hex::encode(h)),
            ClaimKey::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_strings_round_trip_inline_and_boxed() {
        for s in [
            "",
            "a",
            "mem-12345",
            &"x".repeat(22),
            &"y".repeat(23),
            "é🙂 mixed",
        ] {
            let v = SmallStr::new(s);
            assert_eq!(v.as_str(), s);
            assert_eq!(SmallStr::from(s.to_string()), v);
            assert_eq!(matches!(v, SmallStr::Inline { .. }), s.len() <= 22, "{s:?}");
        }
        assert_eq!(std::mem::size_of::<SmallStr>(), 24);
        assert_eq!(std::mem::size_of::<Option<SmallStr>>(), 24);
    }

    #[test]
    fn uids_render_back_to_what_they_were() {
        let uuid = "0f1e2d3c-4b5a-4697-8877-665544332211";
        assert!(matches!(Uid::new(uuid), Uid::Uuid(_)));
        for s in [
            uuid,
            "0F1E2D3C-4B5A-4697-8877-665544332211",
            "u1",
            "",
            "0f1e2d3c-4b5a-4697-8877-66554433221",
            "0f1e2d3c_4b5a-4697-8877-665544332211",
        ] {
            assert_eq!(Uid::new(s).to_string(), s);
        }
        assert_ne!(Uid::new(uuid), Uid::new(&uuid.to_uppercase()));
        assert_eq!(std::mem::size_of::<Option<Uid>>(), 24);
    }

    #[test]
    fn claim_keys_are_equal_exactly_when_the_strings_are() {
        let claim = crate::claim::claim_for("ns", "web", "u1");
        let key = ClaimKey::new(&claim);
        assert!(matches!(key, ClaimKey::Hash(_)));
        assert_eq!(key.to_string(), claim);
        let upper = format!(
            "{}{}",
            crate::claim::CLAIM_PREFIX,
            &claim[7..].to_uppercase()
        );
        for other in [upper.as_str(), "nebula-", "plain", &claim[..30]] {
            let k = ClaimKey::new(other);
            assert!(matches!(k, ClaimKey::Other(_)), "{other}");
            assert_eq!(k.to_string(), other);
            assert_ne!(k, key);
        }
    }
}
