//! Query strings: the crate's one decoder (`application/x-www-form-urlencoded`, through
//! `form_urlencoded`), and the encoder that writes them the way Go's `net/url` does for
//! the kubelet requests the proxy builds.

use std::collections::HashMap;

/// Query pairs in order, decoded (`+` is a space; a malformed escape stays as written).
pub fn pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Query parameters by name; the last value of a repeated name wins.
pub fn map(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One path segment decoded (`PathUnescape`: `+` stays a plus).
pub fn unescape_path(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Go's `url.QueryEscape`: unreserved characters stay, a space is `+`, the rest `%XX`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(c as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{c:02X}")),
        }
    }
    out
}

/// Go's `url.Values.Encode`: keys sorted, values of one key in insertion order.
pub fn encode(params: &[(&str, String)]) -> String {
    let mut sorted: Vec<&(&str, String)> = params.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    sorted
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_reads_forms_and_keeps_malformed_escapes() {
        let q = map("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&bad=%zz%&watch=0");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "0", "the last value wins");
        assert_eq!(q["bad"], "%zz%");
        assert_eq!(
            pairs("command=ls&command=-l"),
            [
                ("command".to_string(), "ls".to_string()),
                ("command".to_string(), "-l".to_string())
            ]
        );
        assert_eq!(unescape_path("a+b%2Fc"), "a+b/c");
    }

    #[test]
    fn encoding_matches_go() {
        assert_eq!(escape("a b&c/d~*"), "a+b%26c%2Fd~%2A");
        assert_eq!(
            encode(&[("b", "1".into()), ("a", "2".into()), ("b", "0".into())]),
            "a=2&b=1&b=0"
        );
    }
}
