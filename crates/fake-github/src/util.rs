//! Small helpers of the fake GitHub: encodings, time formatting, a deterministic RNG.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Lower-case hex of the SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A strong ETag (quoted hex SHA-256) of a response body.
pub(crate) fn etag_of(body: &[u8]) -> String {
    format!("\"{}\"", sha256_hex(body))
}

/// A legacy GitHub global node id, e.g. `MDQ6VXNlcjE=` for `04:User1`.
pub(crate) fn node_id(kind: &str, id: u64) -> String {
    STANDARD.encode(format!("0{}:{}{}", kind.len(), kind, id))
}

/// GitHub's timestamp format: RFC 3339, UTC, whole seconds, `Z`.
pub(crate) fn format_time(unix: i64) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    // Cannot fail: an OffsetDateTime has every component the description names.
    OffsetDateTime::from_unix_timestamp(unix)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
        .format(format)
        .unwrap_or_default()
}

/// Parses an ISO 8601 / RFC 3339 timestamp (or a bare `YYYY-MM-DD` date) into unix seconds.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return Some(t.unix_timestamp());
    }
    OffsetDateTime::parse(&format!("{s}T00:00:00Z"), &Rfc3339)
        .ok()
        .map(OffsetDateTime::unix_timestamp)
}

/// Every ASCII byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`); bytes
/// outside ASCII are always encoded.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Decodes `%XX` escapes of a path segment; `None` on a bad escape (a `%` not followed by two
/// hex digits) or invalid UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let well_formed = s.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|digits| digits.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub(crate) fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

/// Decodes an `application/x-www-form-urlencoded` query string into pairs, in order.
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let decode = |s: &str| {
                let s = s.replace('+', " ");
                percent_decode(&s).unwrap_or(s)
            };
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_match_githubs_legacy_format() {
        assert_eq!(node_id("User", 21031067), "MDQ6VXNlcjIxMDMxMDY3");
        assert_eq!(
            node_id("Repository", 186853002),
            "MDEwOlJlcG9zaXRvcnkxODY4NTMwMDI="
        );
        // Padding: `04:User12` needs none, `04:User123` two `=`.
        assert_eq!(node_id("User", 12), "MDQ6VXNlcjEy");
        assert_eq!(node_id("User", 123), "MDQ6VXNlcjEyMw==");
    }

    #[test]
    fn times_round_trip() {
        let s = format_time(1_557_933_618);
        assert_eq!(s, "2019-05-15T15:20:18Z");
        assert_eq!(parse_time(&s), Some(1_557_933_618));
        assert_eq!(parse_time("2019-05-15"), Some(1_557_878_400));
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn percent_codec() {
        assert_eq!(
            percent_decode("good%20first%20issue").as_deref(),
            Some("good first issue")
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("a%41%"), None);
        assert_eq!(percent_decode("%%41"), None);
        assert_eq!(percent_decode("%FF"), None);
        assert_eq!(percent_decode("%c3%A9%2F").as_deref(), Some("é/"));
        assert_eq!(percent_encode("é/~"), "%C3%A9%2F~");
        assert_eq!(percent_encode("a b:c"), "a%20b%3Ac");
        assert_eq!(
            parse_query("state=open&labels=a%2Cb&x"),
            vec![
                ("state".to_owned(), "open".to_owned()),
                ("labels".to_owned(), "a,b".to_owned()),
                ("x".to_owned(), String::new())
            ]
        );
    }
}
