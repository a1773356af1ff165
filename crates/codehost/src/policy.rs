//! Pure helpers of the client: backoff with jitter, `Link` headers, rate-limit headers, and
//! URL pieces. No I/O; the clock is a parameter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// The longest exponential step before the cap (2^20 × base): keeps the arithmetic finite.
const MAX_EXPONENT: u32 = 20;

/// The upper bound of the `retry`-th backoff (0-based): `min(max, base × 2^retry)`.
pub(crate) fn backoff_cap(base: Duration, max: Duration, retry: u32) -> Duration {
    let factor = 1u32 << retry.min(MAX_EXPONENT);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

/// The `retry`-th backoff with full jitter: uniform in `[0, backoff_cap]`, drawn from
/// `random` (any 64-bit value).
pub(crate) fn backoff_delay(base: Duration, max: Duration, retry: u32, random: u64) -> Duration {
    let cap = backoff_cap(base, max, retry).as_nanos();
    // cap × random / 2^64, in u128: at most cap.
    let nanos = (cap.saturating_mul(u128::from(random))) >> 64;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// A lock-free SplitMix64 generator for jitter, seeded from the OS (or the clock if the OS
/// has no randomness to give).
#[derive(Debug)]
pub(crate) struct Jitter(AtomicU64);

impl Jitter {
    pub fn new() -> Self {
        let seed = getrandom::u64().unwrap_or_else(|_| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0x9E37_79B9, |d| d.as_nanos() as u64)
        });
        Jitter(AtomicU64::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The target of `rel="next"` in a `Link` header
/// (`<https://…?page=2>; rel="next", <…>; rel="last"`), if any.
pub(crate) fn next_link(header: &str) -> Option<&str> {
    let mut rest = header;
    while let Some(open) = rest.find('<') {
        let after = rest.get(open + 1..)?;
        let close = after.find('>')?;
        let url = after.get(..close)?;
        let tail = after.get(close + 1..)?;
        // The parameters run up to the next link (a `<` after a comma) or the end.
        let params_end = tail.find('<').unwrap_or(tail.len());
        let params = tail.get(..params_end)?;
        let is_next = params.split([';', ',']).any(|param| {
            let Some((key, value)) = param.split_once('=') else {
                return false;
            };
            key.trim().eq_ignore_ascii_case("rel")
                && value
                    .trim()
                    .trim_matches('"')
                    .split_ascii_whitespace()
                    .any(|rel| rel.eq_ignore_ascii_case("next"))
        });
        if is_next {
            return Some(url.trim());
        }
        rest = tail;
    }
    None
}

/// What to request for a pagination link: its path and query, on the client's own host, with
/// the base path (`/api/v3` on GitHub Enterprise Server) put in front if the link lacks it.
/// `None` when the link is not a URL or a path.
pub(crate) fn link_target(base_path: &str, link: &str) -> Option<String> {
    let uri: http::Uri = link.parse().ok()?;
    let pq = uri.path_and_query()?.as_str();
    if !pq.starts_with('/') {
        return None;
    }
    let path = uri.path();
    let has_base = base_path.is_empty()
        || path == base_path
        || path
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.starts_with('/'));
    Some(if has_base {
        pq.to_owned()
    } else {
        format!("{base_path}{pq}")
    })
}

/// `Retry-After`: delay seconds, or an HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`) relative
/// to `now` (a date in the past gives zero).
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::PrimitiveDateTime::parse(value, format)
        .ok()?
        .assume_utc();
    let at = u64::try_from(at.unix_timestamp()).ok()?;
    Some(until_epoch(at, now))
}

/// The time from `now` until the unix time `epoch_secs` (`X-RateLimit-Reset`); zero if it
/// has passed. A time past what the clock can hold (a code host's or a proxy's garbage) is
/// the longest wait, [`Duration::MAX`]: the caller gives up instead of waiting for it.
pub(crate) fn until_epoch(epoch_secs: u64, now: SystemTime) -> Duration {
    match UNIX_EPOCH.checked_add(Duration::from_secs(epoch_secs)) {
        Some(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
        None => Duration::MAX,
    }
}

/// Every ASCII byte but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`); bytes
/// outside ASCII are always encoded.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one path segment (an owner, a repository or a label name): everything but
/// RFC 3986's unreserved characters, as `%XX` with upper-case hex digits.
pub(crate) fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let (base, max) = (500 * MS, Duration::from_secs(30));
        assert_eq!(backoff_cap(base, max, 0), 500 * MS);
        assert_eq!(backoff_cap(base, max, 1), 1000 * MS);
        assert_eq!(backoff_cap(base, max, 5), 16_000 * MS);
        assert_eq!(backoff_cap(base, max, 6), max);
        assert_eq!(backoff_cap(base, max, 1000), max);
        assert_eq!(backoff_cap(Duration::MAX, max, 3), max);
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_cap() {
        let (base, max) = (5 * MS, 50 * MS);
        assert_eq!(backoff_delay(base, max, 2, 0), Duration::ZERO);
        let top = backoff_delay(base, max, 2, u64::MAX);
        assert!(top <= 20 * MS && top > 19 * MS, "{top:?}");
        assert_eq!(backoff_delay(base, max, 1, 1 << 63), 5 * MS);
        let jitter = Jitter::new();
        let mut distinct = std::collections::HashSet::new();
        for retry in 0..50 {
            let d = backoff_delay(base, max, retry, jitter.next_u64());
            assert!(d <= backoff_cap(base, max, retry));
            distinct.insert(d);
        }
        assert!(distinct.len() > 40, "jitter should spread the delays");
    }

    #[test]
    fn the_next_link_is_found_among_others() {
        let h = r#"<https://api.github.com/repositories/1/issues?page=1>; rel="prev", <https://api.github.com/repositories/1/issues?labels=a,b&page=3>; rel="next", <https://api.github.com/repositories/1/issues?page=5>; rel="last""#;
        assert_eq!(
            next_link(h),
            Some("https://api.github.com/repositories/1/issues?labels=a,b&page=3")
        );
        assert_eq!(
            next_link(r#"<http://x/a?page=2>; rel=next"#),
            Some("http://x/a?page=2")
        );
        assert_eq!(
            next_link(r#"<http://x/a?page=2>; title="n"; REL="last next""#),
            Some("http://x/a?page=2")
        );
        assert_eq!(next_link(r#"<http://x/a?page=1>; rel="prev""#), None);
        assert_eq!(next_link(""), None);
        assert_eq!(next_link("<unterminated; rel=\"next\""), None);
    }

    #[test]
    fn link_targets_keep_path_and_query_under_the_base_path() {
        assert_eq!(
            link_target("", "https://api.github.com/repos/o/r/issues?page=2").unwrap(),
            "/repos/o/r/issues?page=2"
        );
        assert_eq!(
            link_target(
                "/api/v3",
                "https://ghe.example/api/v3/repos/o/r/issues?page=2"
            )
            .unwrap(),
            "/api/v3/repos/o/r/issues?page=2"
        );
        // A proxy that rewrote the link without the base path: put it back.
        assert_eq!(
            link_target("/api/v3", "http://internal:8080/repos/o/r/issues?page=2").unwrap(),
            "/api/v3/repos/o/r/issues?page=2"
        );
        assert_eq!(
            link_target("/api", "https://h/apix/repos?page=2").unwrap(),
            "/api/apix/repos?page=2"
        );
        assert!(link_target("", "not a url at all").is_none());
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn the_reset_time_is_measured_from_now() {
        let now = UNIX_EPOCH + Duration::from_millis(1_000_500);
        assert_eq!(until_epoch(1_010, now), Duration::from_millis(9_500));
        assert_eq!(until_epoch(1_000, now), Duration::ZERO);
        assert_eq!(until_epoch(0, now), Duration::ZERO);
    }

    #[test]
    fn a_reset_past_what_the_clock_holds_is_the_longest_wait() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(until_epoch(u64::MAX, now), Duration::MAX);
        assert_eq!(until_epoch(u64::MAX, SystemTime::now()), Duration::MAX);
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("good first issue"), "good%20first%20issue");
        assert_eq!(encode_segment("a/b?c#d%"), "a%2Fb%3Fc%23d%25");
        assert_eq!(encode_segment("agentry-bot_1.x~"), "agentry-bot_1.x~");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
