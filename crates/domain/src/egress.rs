//! The egress allow-list of sandboxed agents.
//!
//! A sandboxed agent reaches the network only through agentry's egress proxy, which lets a
//! connection through when its host is allowed. What is allowed is a list of
//! [`EgressPattern`]s, the union of the repository's `egressAllow` setting and the
//! instance's `AGENTRY_EGRESS_ALLOW`, held as an [`EgressAllow`].
//!
//! A pattern is a host, optionally followed by `:port`; the host is one of:
//!
//! - an exact host name, `api.github.com`, which matches that host only;
//! - an IP address, `127.0.0.1` or `::1` (`[::1]` is accepted too), which matches that
//!   address only;
//! - a wildcard, `*.example.com`, which matches any host strictly below `example.com`
//!   (`a.example.com`, `a.b.example.com`), not `example.com` itself.
//!
//! A pattern allows its host on one port: the one it names (`pypi.org:8080`,
//! `*.example.com:8443`, `10.0.0.7:5432`, `[::1]:8080`: an IPv6 address with a port is
//! written in brackets), else [`DEFAULT_PORT`] (443) only. A host needed on several ports is
//! listed once per port.
//!
//! Patterns are parsed case-insensitively and kept in a normal form: lower case, without a
//! trailing dot, IPv6 without brackets unless a port follows, an IPv4-mapped IPv6 address as
//! the IPv4 address, and `:443` left out.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The port a pattern without one allows: HTTPS.
pub const DEFAULT_PORT: u16 = 443;

/// The longest host name, in characters (RFC 1035).
const MAX_NAME_CHARS: usize = 253;
/// The longest label of a host name, in characters (RFC 1035).
const MAX_LABEL_CHARS: usize = 63;

/// One entry of an egress allow-list: an exact host name, an IP address or a wildcard
/// `*.example.com`, with the one port it allows (443 unless named), in normal form (see the
/// [module documentation](self)).
///
/// Every value is valid: the only ways to make one are [`EgressPattern::parse`] and its
/// [`FromStr`](std::str::FromStr) and [`Deserialize`](serde::Deserialize) forms. It is
/// displayed (and serialised) in normal form, which parses back to the same pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressPattern {
    host: Kind,
    port: u16,
}

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
    /// The text after the host's `:` is not a port from 1 to 65535.
    #[error(
        "{0:?} is not a port: give host:port with a port from 1 to 65535, e.g. \
         \"pypi.org:8080\", or the host alone for port 443"
    )]
    Port(String),
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
    /// two labels; then optionally `:port`), case-insensitively, into its normal form. An
    /// IPv6 address with a port is written in brackets, `[::1]:8080`; without a port the
    /// pattern allows [`DEFAULT_PORT`] (443).
    ///
    /// Refused, with a reason: an empty text, white space, a URL (`://`, `/`, `@`, `?`,
    /// `#`), a port that is not a number from 1 to 65535 (`host:`, `host:0`, `host:https`),
    /// `*` alone or anywhere but a leading `*.`, a wildcard over a single label (`*.com`),
    /// labels other than RFC 1123's (letters, digits and `-`, not at either end, at most 63
    /// characters), a name over 253 characters, and a last label of digits only that is not
    /// part of an IPv4 address.
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
            let Some((inner, tail)) = rest.split_once(']') else {
                return Err(EgressPatternError::InvalidIpv6(text.to_owned()));
            };
            let port = match tail {
                "" => DEFAULT_PORT,
                _ => match tail.strip_prefix(':') {
                    Some(port) => parse_port(port)?,
                    None => return Err(EgressPatternError::InvalidIpv6(text.to_owned())),
                },
            };
            let ip = inner
                .parse::<Ipv6Addr>()
                .map_err(|_| EgressPatternError::InvalidIpv6(text.to_owned()))?;
            return Ok(EgressPattern::ip(IpAddr::V6(ip), port));
        }
        if lower.contains(':') {
            if let Ok(ip) = lower.parse::<Ipv6Addr>() {
                return Ok(EgressPattern::ip(IpAddr::V6(ip), DEFAULT_PORT));
            }
            return match lower.split_once(':') {
                Some((host, port)) if !port.contains(':') => {
                    let port = parse_port(port)?;
                    Ok(EgressPattern {
                        host: parse_host(host, text)?,
                        port,
                    })
                }
                _ => Err(EgressPatternError::InvalidIpv6(text.to_owned())),
            };
        }
        Ok(EgressPattern {
            host: parse_host(&lower, text)?,
            port: DEFAULT_PORT,
        })
    }

    /// The pattern of exactly this address (an IPv4-mapped IPv6 address becomes IPv4).
    fn ip(ip: IpAddr, port: u16) -> EgressPattern {
        EgressPattern {
            host: Kind::Ip(ip.to_canonical()),
            port,
        }
    }

    /// Whether this is a wildcard `*.example.com`.
    pub fn is_wildcard(&self) -> bool {
        matches!(self.host, Kind::Wildcard(_))
    }

    /// The address, when this pattern is an IP address.
    pub fn ip_addr(&self) -> Option<IpAddr> {
        match self.host {
            Kind::Ip(ip) => Some(ip),
            _ => None,
        }
    }

    /// The port this pattern allows (443 when it names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host part in normal form, without the port: `pypi.org`, `*.example.com`,
    /// `127.0.0.1`, `::1` (no brackets).
    pub fn host(&self) -> String {
        match &self.host {
            Kind::Name(name) => name.clone(),
            Kind::Ip(ip) => ip.to_string(),
            Kind::Wildcard(domain) => format!("*.{domain}"),
        }
    }

    /// Whether this pattern's host matches `host` (a host that is not a wildcard, in normal
    /// form): an exact name or address matches itself, a wildcard the names strictly below
    /// its domain. Ports aside.
    fn covers(&self, host: &Kind) -> bool {
        match (&self.host, host) {
            (Kind::Wildcard(domain), Kind::Name(name)) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Kind::Wildcard(_), _) => false,
            (exact, other) => exact == other,
        }
    }
}

/// The host of a pattern (`lower`, lower case, without a port): a name, an IPv4 address or a
/// wildcard. `text` is the whole pattern, for the error.
fn parse_host(lower: &str, text: &str) -> Result<Kind, EgressPatternError> {
    if lower.contains(':') {
        return Err(EgressPatternError::InvalidIpv6(text.to_owned()));
    }
    let name = lower.strip_suffix('.').unwrap_or(lower);
    if name.is_empty() {
        return Err(EgressPatternError::Empty);
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Kind::Ip(IpAddr::V4(ip)));
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
        Ok(Kind::Wildcard(domain.to_owned()))
    } else {
        Ok(Kind::Name(domain.to_owned()))
    }
}

/// A port: decimal digits only, from 1 to 65535.
fn parse_port(text: &str) -> Result<u16, EgressPatternError> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| EgressPatternError::Port(text.to_owned()))
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
    /// The normal form: the host, then `:port` unless the port is 443; an IPv6 address with
    /// a port in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (Kind::Ip(IpAddr::V6(ip)), DEFAULT_PORT) => write!(f, "{ip}"),
            (Kind::Ip(IpAddr::V6(ip)), port) => write!(f, "[{ip}]:{port}"),
            (_, DEFAULT_PORT) => f.write_str(&self.host()),
            (_, port) => write!(f, "{}:{port}", self.host()),
        }
    }
}

text_form!(
    EgressPattern,
    EgressPatternError,
    "an egress pattern such as \"pypi.org\", \"*.example.com\" or \"example.com:8080\""
);

/// `host:port` as a member of egressAllow that allows exactly it: `pypi.org` for port 443,
/// `pypi.org:8080`, `[::1]:8080` (`host` in normal form, an IPv6 address without brackets).
pub fn allow_member(host: &str, port: u16) -> String {
    match (host.contains(':'), port) {
        (_, DEFAULT_PORT) => host.to_owned(),
        (true, port) => format!("[{host}]:{port}"),
        (false, port) => format!("{host}:{port}"),
    }
}

/// The host of `text` (a name or an address, in any case, with or without a trailing dot,
/// an IPv6 address with or without brackets; no port and no wildcard), or `None`.
fn host_of(text: &str) -> Option<Kind> {
    let lower = text.to_ascii_lowercase();
    let bare = match lower.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']')?,
        None => lower.as_str(),
    };
    if let Ok(ip) = bare.parse::<Ipv6Addr>() {
        return Some(Kind::Ip(IpAddr::V6(ip).to_canonical()));
    }
    if bare.len() != lower.len() || text.chars().any(char::is_whitespace) {
        return None;
    }
    if text.contains(['/', '@', '?', '#']) {
        return None;
    }
    match parse_host(bare, text).ok()? {
        Kind::Wildcard(_) => None,
        host => Some(host),
    }
}

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
    /// trailing dot, an IPv6 address with or without brackets; no port) is allowed on
    /// `port`, and how: [`EgressMatch::Literal`] when it is listed itself with that port,
    /// [`EgressMatch::Wildcard`] when only a wildcard with that port covers it, `None` when
    /// nothing does or `host` is not a valid host name or address. An IP address is
    /// allowed only when listed itself.
    pub fn check(&self, host: &str, port: u16) -> Option<EgressMatch> {
        let host = host_of(host)?;
        let on_port = || self.patterns.iter().filter(|p| p.port == port);
        if on_port().any(|p| p.host == host) {
            Some(EgressMatch::Literal)
        } else if on_port().any(|p| p.covers(&host)) {
            Some(EgressMatch::Wildcard)
        } else {
            None
        }
    }

    /// The ports on which `host` (as for [`EgressAllow::check`]) is allowed, ascending,
    /// each once; empty when on none.
    pub fn ports_of(&self, host: &str) -> Vec<u16> {
        let Some(host) = host_of(host) else {
            return Vec::new();
        };
        let mut ports: Vec<u16> = self
            .patterns
            .iter()
            .filter(|p| p.covers(&host))
            .map(|p| p.port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
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
            ("pypi.org:443", "pypi.org"),
            ("PyPI.org.:8080", "pypi.org:8080"),
            ("*.Example.com:8443", "*.example.com:8443"),
            ("127.0.0.1:80", "127.0.0.1:80"),
            ("127.0.0.1:443", "127.0.0.1"),
            ("[::1]:8080", "[::1]:8080"),
            ("[::1]:443", "::1"),
            ("[::ffff:10.0.0.1]:5432", "10.0.0.1:5432"),
            ("localhost:65535", "localhost:65535"),
            ("a.org:1", "a.org:1"),
        ] {
            assert_eq!(p(text).to_string(), normal, "{text}");
        }
        assert!(p("*.example.com").is_wildcard());
        assert!(!p("example.com").is_wildcard());
        assert_eq!(p("[::1]").ip_addr(), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(p("example.com").ip_addr(), None);
        assert_eq!("a.b".parse::<EgressPattern>(), Ok(p("a.b")));
        assert_eq!((p("pypi.org").port(), p("pypi.org:80").port()), (443, 80));
        assert_eq!(p("[::1]:8080").host(), "::1");
        assert_eq!(p("*.a.org:81").host(), "*.a.org");
        assert_eq!(p("pypi.org:443"), p("pypi.org"));
        assert_ne!(p("pypi.org:80"), p("pypi.org"));
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
            ("pypi.org:", E::Port("".into())),
            ("pypi.org:0", E::Port("0".into())),
            ("pypi.org:65536", E::Port("65536".into())),
            ("pypi.org:+443", E::Port("+443".into())),
            ("pypi.org:https", E::Port("https".into())),
            ("127.0.0.1:-1", E::Port("-1".into())),
            ("[::1]:", E::Port("".into())),
            ("[::1]:x", E::Port("x".into())),
            ("[::1]443", E::InvalidIpv6("[::1]443".into())),
            ("[pypi.org]:443", E::InvalidIpv6("[pypi.org]:443".into())),
            ("*:443", E::Everything),
            ("*.com:443", E::WildcardTooBroad),
            ("a_b.com:443", E::InvalidLabel("a_b".into())),
            (":443", E::Empty),
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
        let check = |host: &str| allow.check(host, 443);
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
            ("[a.example.com]", None),
            ("[::1", None),
            ("", None),
        ] {
            assert_eq!(check(host), expected, "{host:?}");
        }
        // Listed itself and covered by a wildcard: literal.
        let both = EgressAllow::new([p("*.example.com"), p("a.example.com")]);
        assert_eq!(both.check("a.example.com", 443), Some(EgressMatch::Literal));
        assert_eq!(EgressAllow::default().check("a.example.com", 443), None);
        assert!(EgressAllow::default().is_empty());
    }

    /// A pattern allows its own port only: the one it names, else 443.
    #[test]
    fn a_pattern_allows_its_port_only() {
        let allow = EgressAllow::new([
            p("pypi.org"),
            p("pypi.org:8080"),
            p("*.example.com:8443"),
            p("a.example.com"),
            p("10.0.0.7:5432"),
            p("[::1]:8080"),
        ]);
        for (host, port, expected) in [
            ("pypi.org", 443, Some(EgressMatch::Literal)),
            ("pypi.org", 8080, Some(EgressMatch::Literal)),
            ("pypi.org", 80, None),
            ("pypi.org", 8443, None),
            ("b.example.com", 8443, Some(EgressMatch::Wildcard)),
            ("b.example.com", 443, None),
            ("a.example.com", 443, Some(EgressMatch::Literal)),
            // Listed itself on 443 only; on 8443 a wildcard covers it.
            ("a.example.com", 8443, Some(EgressMatch::Wildcard)),
            ("10.0.0.7", 5432, Some(EgressMatch::Literal)),
            ("10.0.0.7", 443, None),
            ("::1", 8080, Some(EgressMatch::Literal)),
            ("[::1]", 8080, Some(EgressMatch::Literal)),
            ("::1", 443, None),
        ] {
            assert_eq!(allow.check(host, port), expected, "{host}:{port}");
        }
        assert_eq!(allow.ports_of("PyPI.org"), [443, 8080]);
        assert_eq!(allow.ports_of("a.example.com"), [443, 8443]);
        assert_eq!(allow.ports_of("[::1]"), [8080]);
        assert!(allow.ports_of("evil.example").is_empty());
        assert_eq!(allow_member("pypi.org", 443), "pypi.org");
        assert_eq!(allow_member("pypi.org", 80), "pypi.org:80");
        assert_eq!(allow_member("::1", 8080), "[::1]:8080");
        assert_eq!(allow_member("::1", 443), "::1");
        for (host, port) in [("pypi.org", 80), ("::1", 8080), ("10.0.0.7", 443)] {
            let member = p(&allow_member(host, port));
            assert_eq!(
                EgressAllow::new([member]).check(host, port),
                Some(EgressMatch::Literal)
            );
        }
    }

    #[test]
    fn an_allow_list_holds_each_pattern_once_in_order() {
        let allow: EgressAllow = ["b.org", "A.org", "B.ORG:443", "a.org.", "a.org:80"]
            .iter()
            .map(|t| p(t))
            .collect();
        assert_eq!(allow.patterns(), [p("b.org"), p("a.org"), p("a.org:80")]);
    }

    #[test]
    fn patterns_serialise_as_their_normal_form() {
        let json = serde_json::to_string(&[p("[::1]"), p("*.Example.com"), p("[::1]:81")]).unwrap();
        assert_eq!(json, r#"["::1","*.example.com","[::1]:81"]"#);
        let back: Vec<EgressPattern> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [p("::1"), p("*.example.com"), p("[::1]:81")]);
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

    /// Any valid pattern's host.
    fn host() -> impl Strategy<Value = Kind> {
        prop_oneof![
            name().prop_map(Kind::Name),
            (label(), name()).prop_map(|(l, n)| Kind::Wildcard(format!("{l}.{n}"))),
            any::<Ipv4Addr>().prop_map(|ip| Kind::Ip(IpAddr::V4(ip))),
            any::<Ipv6Addr>().prop_map(|ip| Kind::Ip(IpAddr::V6(ip).to_canonical())),
        ]
    }

    /// Any valid pattern.
    fn pattern() -> impl Strategy<Value = EgressPattern> {
        (host(), prop_oneof![Just(DEFAULT_PORT), 1..=u16::MAX])
            .prop_map(|(host, port)| EgressPattern { host, port })
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
