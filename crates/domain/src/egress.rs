//! The egress allow-list of sandboxed agents.
//!
//! A sandboxed agent reaches the network only through agentry's egress proxy, which lets a
//! connection through when its host is allowed. What is allowed is a list of
//! [`EgressPattern`]s, the union of the repository's `egressAllow` setting and the
//! instance's `AGENTRY_EGRESS_ALLOW`, held as an [`EgressAllow`].
//!
//! A pattern is one of:
//!
//! - an exact host name, `api.github.com`, which matches that host only;
//! - an IP address, `127.0.0.1` or `::1` (`[::1]` is accepted too), which matches that
//!   address only;
//! - a wildcard, `*.example.com`, which matches any host strictly below `example.com`
//!   (`a.example.com`, `a.b.example.com`), not `example.com` itself.
//!
//! Patterns are parsed case-insensitively and kept in a normal form: lower case, without a
//! trailing dot, IPv6 without brackets, an IPv4-mapped IPv6 address as the IPv4 address.
//! Every port of an allowed host is allowed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest host name, in characters (RFC 1035).
const MAX_NAME_CHARS: usize = 253;
/// The longest label of a host name, in characters (RFC 1035).
const MAX_LABEL_CHARS: usize = 63;

/// One entry of an egress allow-list: an exact host name, an IP address or a wildcard
/// `*.example.com`, in normal form (see the [module documentation](self)).
///
/// Every value is valid: the only ways to make one are [`EgressPattern::parse`] and its
/// [`FromStr`](std::str::FromStr) and [`Deserialize`](serde::Deserialize) forms. It is
/// displayed (and serialised) in normal form, which parses back to the same pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressPattern(Kind);

/// What an [`EgressPattern`] is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kind {
    /// An exact host name, lower case, without a trailing dot.
    Name(String),
    /// An IP address (an IPv4-mapped IPv6 address is held as IPv4).
    Ip(IpAddr),
    /// `*.` followed by this suffix (lower case, at least two labels).
    Wildcard(String),
}

/// Why a text is not an [`EgressPattern`]. Each message is a sentence fragment that reads
/// after the name of the offending setting, e.g. `egressAllow[2]: a URL is not a host
/// name; give the host only, e.g. "pypi.org"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressPatternError {
    /// The text is empty (or only a dot).
    #[error("an empty string is not a host name; give a host such as \"pypi.org\"")]
    Empty,
    /// The text contains white space.
    #[error("a host name contains no white space")]
    Whitespace,
    /// The text is (or looks like) a URL: it has a scheme, `/`, `@`, `?` or `#`.
    #[error("a URL is not a host name; give the host only, e.g. \"pypi.org\"")]
    Url,
    /// The text names a port.
    #[error(
        "a port is not part of a host name; give the host only, e.g. \"pypi.org\" (every \
         port of an allowed host is allowed)"
    )]
    Port,
    /// The text is `*` alone.
    #[error(
        "\"*\" would allow every host; list the hosts, or a wildcard such as \"*.example.com\""
    )]
    Everything,
    /// A `*` elsewhere than as a leading `*.`.
    #[error("\"*\" is allowed only as a leading \"*.\", e.g. \"*.example.com\"")]
    MisplacedStar,
    /// A wildcard over a single label, such as `*.com`.
    #[error(
        "a wildcard must stand for hosts below a domain of at least two labels, e.g. \
         \"*.example.com\", not \"*.com\""
    )]
    WildcardTooBroad,
    /// Two dots in a row, or a leading dot.
    #[error("a host name has no empty label (two dots in a row, or a leading dot)")]
    EmptyLabel,
    /// A label with characters other than letters, digits and `-`, starting or ending
    /// with `-`, or longer than 63 characters.
    #[error(
        "{0:?} is not a valid label of a host name: 1 to 63 letters, digits and -, not \
         starting or ending with - (an international name is given in its xn-- form)"
    )]
    InvalidLabel(String),
    /// The name is longer than 253 characters.
    #[error("a host name has at most 253 characters")]
    TooLong,
    /// The last label is all digits, yet the text is not an IPv4 address.
    #[error("{0:?} is neither an IPv4 address (four numbers from 0 to 255) nor a host name")]
    NotAnAddress(String),
    /// Colons, yet not an IPv6 address.
    #[error("{0:?} is not an IPv6 address")]
    InvalidIpv6(String),
}

impl EgressPattern {
    /// Parses a pattern (an exact host name, an IP address, or `*.` and a domain of at least
    /// two labels), case-insensitively, into its normal form.
    ///
    /// Refused, with a reason: an empty text, white space, a URL (`://`, `/`, `@`, `?`,
    /// `#`), a port (`host:443`, `[::1]:443`), `*` alone or anywhere but a leading `*.`, a
    /// wildcard over a single label (`*.com`), labels other than RFC 1123's (letters,
    /// digits and `-`, not at either end, at most 63 characters), a name over 253
    /// characters, and a last label of digits only that is not part of an IPv4 address.
    pub fn parse(text: &str) -> Result<EgressPattern, EgressPatternError> {
        if text.is_empty() {
            return Err(EgressPatternError::Empty);
        }
        if text.chars().any(char::is_whitespace) {
            return Err(EgressPatternError::Whitespace);
        }
        if text.contains(['/', '@', '?', '#']) {
            return Err(EgressPatternError::Url);
        }
        let lower = text.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix('[') {
            return match rest.split_once(']') {
                Some((inner, "")) => inner
                    .parse::<Ipv6Addr>()
                    .map(|ip| EgressPattern::ip(IpAddr::V6(ip)))
                    .map_err(|_| EgressPatternError::InvalidIpv6(text.to_owned())),
                Some((_, tail)) if tail.starts_with(':') => Err(EgressPatternError::Port),
                _ => Err(EgressPatternError::InvalidIpv6(text.to_owned())),
            };
        }
        if lower.contains(':') {
            if let Ok(ip) = lower.parse::<Ipv6Addr>() {
                return Ok(EgressPattern::ip(IpAddr::V6(ip)));
            }
            return Err(if lower.matches(':').count() == 1 {
                EgressPatternError::Port
            } else {
                EgressPatternError::InvalidIpv6(text.to_owned())
            });
        }
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        if name.is_empty() {
            return Err(EgressPatternError::Empty);
        }
        if let Ok(ip) = name.parse::<Ipv4Addr>() {
            return Ok(EgressPattern::ip(IpAddr::V4(ip)));
        }
        if name == "*" {
            return Err(EgressPatternError::Everything);
        }
        let (wildcard, domain) = match name.strip_prefix("*.") {
            Some(domain) => (true, domain),
            None => (false, name),
        };
        if domain.contains('*') {
            return Err(EgressPatternError::MisplacedStar);
        }
        if name.chars().count() > MAX_NAME_CHARS {
            return Err(EgressPatternError::TooLong);
        }
        let mut labels = 0;
        let mut last = "";
        for label in domain.split('.') {
            check_label(label)?;
            labels += 1;
            last = label;
        }
        if last.bytes().all(|b| b.is_ascii_digit()) {
            return Err(EgressPatternError::NotAnAddress(text.to_owned()));
        }
        if wildcard {
            if labels < 2 {
                return Err(EgressPatternError::WildcardTooBroad);
            }
            Ok(EgressPattern(Kind::Wildcard(domain.to_owned())))
        } else {
            Ok(EgressPattern(Kind::Name(domain.to_owned())))
        }
    }

    /// The pattern of exactly this address (an IPv4-mapped IPv6 address becomes IPv4).
    fn ip(ip: IpAddr) -> EgressPattern {
        EgressPattern(Kind::Ip(ip.to_canonical()))
    }

    /// Whether this is a wildcard `*.example.com`.
    pub fn is_wildcard(&self) -> bool {
        matches!(self.0, Kind::Wildcard(_))
    }

    /// The address, when this pattern is an IP address.
    pub fn ip_addr(&self) -> Option<IpAddr> {
        match self.0 {
            Kind::Ip(ip) => Some(ip),
            _ => None,
        }
    }

    /// Whether this pattern matches `host` (a pattern that is not a wildcard, in normal
    /// form): an exact name or address matches itself, a wildcard the names strictly below
    /// its domain.
    fn matches(&self, host: &EgressPattern) -> bool {
        match (&self.0, &host.0) {
            (Kind::Wildcard(domain), Kind::Name(name)) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Kind::Wildcard(_), _) => false,
            (exact, other) => exact == other,
        }
    }
}

/// Checks one label of a host name (RFC 1123).
fn check_label(label: &str) -> Result<(), EgressPatternError> {
    if label.is_empty() {
        return Err(EgressPatternError::EmptyLabel);
    }
    let valid = label.len() <= MAX_LABEL_CHARS
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(EgressPatternError::InvalidLabel(label.to_owned()))
    }
}

impl fmt::Display for EgressPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Name(name) => f.write_str(name),
            Kind::Ip(ip) => write!(f, "{ip}"),
            Kind::Wildcard(domain) => write!(f, "*.{domain}"),
        }
    }
}

text_form!(
    EgressPattern,
    EgressPatternError,
    "an egress pattern such as \"pypi.org\" or \"*.example.com\""
);

/// How a host is allowed by an [`EgressAllow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressMatch {
    /// The host (name or address) is listed itself.
    Literal,
    /// Only a wildcard `*.domain` covers the host.
    Wildcard,
}

/// An egress allow-list: the hosts a sandboxed agent may reach, in order, each pattern
/// listed once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressAllow {
    patterns: Vec<EgressPattern>,
}

impl EgressAllow {
    /// The list of `patterns`, in order, without repetitions (the first of equal patterns
    /// is kept).
    pub fn new(patterns: impl IntoIterator<Item = EgressPattern>) -> EgressAllow {
        let mut list: Vec<EgressPattern> = Vec::new();
        for pattern in patterns {
            if !list.contains(&pattern) {
                list.push(pattern);
            }
        }
        EgressAllow { patterns: list }
    }

    /// The patterns, in order.
    pub fn patterns(&self) -> &[EgressPattern] {
        &self.patterns
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `host` (a host name or an IP address, in any case, with or without a
    /// trailing dot, an IPv6 address with or without brackets; no port) is allowed, and
    /// how: [`EgressMatch::Literal`] when it is listed itself, [`EgressMatch::Wildcard`]
    /// when only a wildcard covers it, `None` when nothing does or `host` is not a valid
    /// host name or address. An IP address is allowed only when listed itself.
    pub fn check(&self, host: &str) -> Option<EgressMatch> {
        let host = EgressPattern::parse(host).ok()?;
        if host.is_wildcard() {
            return None;
        }
        if self.patterns.contains(&host) {
            Some(EgressMatch::Literal)
        } else if self.patterns.iter().any(|p| p.matches(&host)) {
            Some(EgressMatch::Wildcard)
        } else {
            None
        }
    }
}

impl FromIterator<EgressPattern> for EgressAllow {
    fn from_iter<I: IntoIterator<Item = EgressPattern>>(iter: I) -> Self {
        EgressAllow::new(iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(text: &str) -> EgressPattern {
        EgressPattern::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn err(text: &str) -> EgressPatternError {
        EgressPattern::parse(text).expect_err(text)
    }

    #[test]
    fn names_addresses_and_wildcards_parse_to_their_normal_form() {
        for (text, normal) in [
            ("api.github.com", "api.github.com"),
            ("API.GitHub.COM", "api.github.com"),
            ("pypi.org.", "pypi.org"),
            ("localhost", "localhost"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("a-b.c0", "a-b.c0"),
            ("127.0.0.1", "127.0.0.1"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("[2001:DB8::1]", "2001:db8::1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("*.example.com", "*.example.com"),
            ("*.GitHubUserContent.com.", "*.githubusercontent.com"),
        ] {
            assert_eq!(p(text).to_string(), normal, "{text}");
        }
        assert!(p("*.example.com").is_wildcard());
        assert!(!p("example.com").is_wildcard());
        assert_eq!(p("[::1]").ip_addr(), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(p("example.com").ip_addr(), None);
        assert_eq!("a.b".parse::<EgressPattern>(), Ok(p("a.b")));
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        use EgressPatternError as E;
        for (text, why) in [
            ("", E::Empty),
            (".", E::Empty),
            ("https://pypi.org", E::Url),
            ("pypi.org/simple", E::Url),
            ("user@pypi.org", E::Url),
            ("pypi.org?x", E::Url),
            ("pypi.org#x", E::Url),
            ("pypi.org:443", E::Port),
            ("pypi.org:", E::Port),
            ("127.0.0.1:80", E::Port),
            ("[::1]:443", E::Port),
            (" pypi.org", E::Whitespace),
            ("pypi .org", E::Whitespace),
            ("pypi.org\n", E::Whitespace),
            ("*", E::Everything),
            ("*.", E::Everything),
            ("a.*.com", E::MisplacedStar),
            ("*example.com", E::MisplacedStar),
            ("**.example.com", E::MisplacedStar),
            ("*.*.example.com", E::MisplacedStar),
            ("example.*", E::MisplacedStar),
            ("*.com", E::WildcardTooBroad),
            ("*.localhost", E::WildcardTooBroad),
            ("a..b", E::EmptyLabel),
            (".a.b", E::EmptyLabel),
            ("a.b..", E::EmptyLabel),
            ("-a.com", E::InvalidLabel("-a".into())),
            ("a-.com", E::InvalidLabel("a-".into())),
            ("a_b.com", E::InvalidLabel("a_b".into())),
            ("bücher.de", E::InvalidLabel("bücher".into())),
            ("1.2.3", E::NotAnAddress("1.2.3".into())),
            ("256.1.1.1", E::NotAnAddress("256.1.1.1".into())),
            ("01.2.3.4", E::NotAnAddress("01.2.3.4".into())),
            ("*.1.2", E::NotAnAddress("*.1.2".into())),
            ("1:2:3", E::InvalidIpv6("1:2:3".into())),
            ("[::1", E::InvalidIpv6("[::1".into())),
            ("[pypi.org]", E::InvalidIpv6("[pypi.org]".into())),
            ("fe80::1%eth0", E::InvalidIpv6("fe80::1%eth0".into())),
        ] {
            assert_eq!(EgressPattern::parse(text), Err(why), "{text:?}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(matches!(err(&long_label), E::InvalidLabel(_)));
        assert!(EgressPattern::parse(&format!("{}.com", "a".repeat(63))).is_ok());
        // 4 × 63 + 3 dots = 255 characters; 253 is the most.
        let label = "a".repeat(63);
        let too_long = [label.as_str(); 4].join(".");
        assert_eq!(err(&too_long), E::TooLong);
        let longest = format!("{}.{}", "b".repeat(61), [label.as_str(); 3].join("."));
        assert_eq!(longest.len(), 253);
        assert!(EgressPattern::parse(&longest).is_ok());
        assert_eq!(
            err("https://x").to_string(),
            "a URL is not a host name; give the host only, e.g. \"pypi.org\""
        );
    }

    #[test]
    fn a_wildcard_matches_strictly_below_its_domain() {
        let allow = EgressAllow::new([
            p("api.github.com"),
            p("*.example.com"),
            p("127.0.0.1"),
            p("::1"),
        ]);
        for (host, expected) in [
            ("api.github.com", Some(EgressMatch::Literal)),
            ("API.GITHUB.COM.", Some(EgressMatch::Literal)),
            ("github.com", None),
            ("x.api.github.com", None),
            ("a.example.com", Some(EgressMatch::Wildcard)),
            ("a.b.example.com", Some(EgressMatch::Wildcard)),
            ("example.com", None),
            ("badexample.com", None),
            ("a.example.com.evil.net", None),
            ("127.0.0.1", Some(EgressMatch::Literal)),
            ("[::1]", Some(EgressMatch::Literal)),
            ("::ffff:127.0.0.1", Some(EgressMatch::Literal)),
            ("127.0.0.2", None),
            ("*.example.com", None),
            ("a.example.com:443", None),
            ("", None),
        ] {
            assert_eq!(allow.check(host), expected, "{host:?}");
        }
        // Listed itself and covered by a wildcard: literal.
        let both = EgressAllow::new([p("*.example.com"), p("a.example.com")]);
        assert_eq!(both.check("a.example.com"), Some(EgressMatch::Literal));
        assert_eq!(EgressAllow::default().check("a.example.com"), None);
        assert!(EgressAllow::default().is_empty());
    }

    #[test]
    fn an_allow_list_holds_each_pattern_once_in_order() {
        let allow: EgressAllow = ["b.org", "A.org", "B.ORG", "a.org."]
            .iter()
            .map(|t| p(t))
            .collect();
        assert_eq!(allow.patterns(), [p("b.org"), p("a.org")]);
    }

    #[test]
    fn patterns_serialise_as_their_normal_form() {
        let json = serde_json::to_string(&[p("[::1]"), p("*.Example.com")]).unwrap();
        assert_eq!(json, r#"["::1","*.example.com"]"#);
        let back: Vec<EgressPattern> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [p("::1"), p("*.example.com")]);
        assert!(serde_json::from_str::<EgressPattern>(r#""https://x""#).is_err());
    }

    /// A label of a host name.
    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?"
    }

    /// A host name: labels, the last one not all digits.
    fn name() -> impl Strategy<Value = String> {
        (
            prop::collection::vec(label(), 0..4),
            "[a-z]([a-z0-9-]{0,10}[a-z0-9])?",
        )
            .prop_map(|(mut labels, last)| {
                labels.push(last);
                labels.join(".")
            })
    }

    /// Any valid pattern.
    fn pattern() -> impl Strategy<Value = EgressPattern> {
        prop_oneof![
            name().prop_map(|n| EgressPattern(Kind::Name(n))),
            (label(), name()).prop_map(|(l, n)| EgressPattern(Kind::Wildcard(format!("{l}.{n}")))),
            any::<Ipv4Addr>().prop_map(|ip| EgressPattern::ip(IpAddr::V4(ip))),
            any::<Ipv6Addr>().prop_map(|ip| EgressPattern::ip(IpAddr::V6(ip))),
        ]
    }

    proptest! {
        #[test]
        fn a_displayed_pattern_parses_back_to_itself(pattern in pattern()) {
            prop_assert_eq!(EgressPattern::parse(&pattern.to_string()), Ok(pattern.clone()));
            prop_assert_eq!(
                EgressPattern::parse(&pattern.to_string().to_ascii_uppercase()),
                Ok(pattern.clone())
            );
        }

        #[test]
        fn any_text_parses_to_a_normal_form_or_a_reason(text in "\\PC{0,40}|[a-zA-Z0-9.:*\\[\\]-]{0,40}") {
            if let Ok(pattern) = EgressPattern::parse(&text) {
                prop_assert_eq!(EgressPattern::parse(&pattern.to_string()), Ok(pattern));
            }
        }
    }
}
