//! Times as kube-apiserver reads and writes them: RFC 3339 parsed as strictly as Go's
//! `time.Parse(time.RFC3339, ..)` (an upper-case `T` between date and time, a `Z` or a
//! numeric offset, an optional fraction), and written in UTC with whole seconds
//! (`metav1.Time`) or microseconds (`metav1.MicroTime`).

use jiff::Timestamp;

/// Seconds since the epoch, now.
pub fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

/// Parses an RFC 3339 time the way kube-apiserver does. jiff alone accepts more (a space
/// for the `T`, ISO 8601 basic format, a bracketed zone), so the shape is checked first.
pub fn parse_rfc3339(s: &str) -> Result<Timestamp, String> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let mut ok = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if ok {
        let mut i = 19;
        if b.get(i) == Some(&b'.') {
            let start = i + 1;
            i = start;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            ok = i > start;
        }
        let zone = &b[i.min(b.len())..];
        ok = ok
            && (zone == b"Z"
                || (zone.len() == 6
                    && (zone[0] == b'+' || zone[0] == b'-')
                    && zone[1..3].iter().all(u8::is_ascii_digit)
                    && zone[3] == b':'
                    && zone[4..6].iter().all(u8::is_ascii_digit)));
    }
    if !ok {
        return Err("not in the RFC 3339 form 2006-01-02T15:04:05Z07:00".into());
    }
    s.parse::<Timestamp>().map_err(|e| e.to_string())
}

/// `metav1.Time`'s form: UTC, whole seconds.
pub fn format_secs(t: Timestamp) -> String {
    format!("{t:.0}")
}

/// `metav1.MicroTime`'s form: UTC, six fractional digits.
pub fn format_micros(t: Timestamp) -> String {
    format!("{t:.6}")
}

/// [`format_secs`] of a count of seconds since the epoch (out of range: the epoch).
pub fn rfc3339(secs: i64) -> String {
    format_secs(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_go_accepts() {
        for s in [
            "2024-06-19T15:22:45Z",
            "2024-06-19T15:22:45.123456Z",
            "2024-06-19T17:22:45+02:00",
            "2024-06-19T10:22:45.5-05:00",
        ] {
            assert!(parse_rfc3339(s).is_ok(), "{s}");
        }
        assert_eq!(
            format_secs(parse_rfc3339("2024-06-19T17:22:45+02:00").unwrap()),
            "2024-06-19T15:22:45Z"
        );
        assert_eq!(
            format_micros(parse_rfc3339("2024-06-19T15:22:45.1234567Z").unwrap()),
            "2024-06-19T15:22:45.123456Z"
        );
        assert_eq!(
            format_micros(parse_rfc3339("2024-06-19T15:22:45Z").unwrap()),
            "2024-06-19T15:22:45.000000Z"
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // Truncated, never rounded up, as Go's Format does.
        assert_eq!(
            format_secs(parse_rfc3339("2024-06-19T15:22:45.999999999Z").unwrap()),
            "2024-06-19T15:22:45Z"
        );
        assert_eq!(
            format_micros(parse_rfc3339("2024-06-19T15:22:45.9999999Z").unwrap()),
            "2024-06-19T15:22:45.999999Z"
        );
    }

    #[test]
    fn refuses_what_go_refuses() {
        for s in [
            "2024-06-19 15:22:45Z",
            "2024-06-19t15:22:45Z",
            "20240619T152245Z",
            "2024-06-19T15:22:45",
            "2024-06-19T15:22:45z",
            "2024-06-19T15:22:45+0200",
            "2024-06-19T15:22:45.Z",
            "2024-06-19T15:22:45Z[UTC]",
            "2024-13-19T15:22:45Z",
            "",
        ] {
            assert!(parse_rfc3339(s).is_err(), "{s}");
        }
    }
}
