//! Repository URLs.
//!
//! [`RepoUrl`] is a code-host repository URL in the normalised form
//! `https://HOST[:PORT]/OWNER/NAME`, all lower case, parsed from the usual
//! ways of writing one:
//!
//! | input                                   | normalised                          |
//! |-----------------------------------------|-------------------------------------|
//! | `https://github.com/Org/Repo`           | `https://github.com/org/repo`       |
//! | `https://github.com/org/repo.git/`      | `https://github.com/org/repo`       |
//! | `http://github.com/org/repo`            | `https://github.com/org/repo`       |
//! | `git@github.com:org/repo.git`           | `https://github.com/org/repo`       |
//! | `ssh://git@github.com:22/org/repo.git`  | `https://github.com/org/repo`       |
//! | `https://ghe.local:8443/A/B`            | `https://ghe.local:8443/a/b`        |
//!
//! URLs carrying credentials are refused, so a token is never stored.

use std::fmt;

use url::Url;

/// The longest allowed owner or repository name, in characters.
const MAX_PART_CHARS: usize = 100;

/// The prefix of every normalised URL.
const HTTPS_PREFIX: &str = "https://";

/// Why a text is not an acceptable repository URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoUrlError {
    /// The text is empty or only whitespace.
    #[error("repository URL must not be empty")]
    Empty,
    /// The text is not in any accepted form.
    #[error("not a repository URL: expected https://HOST/OWNER/REPO or git@HOST:OWNER/REPO.git")]
    NotARepoUrl,
    /// The URL has a scheme other than `https`, `http` or `ssh`.
    #[error("unsupported URL scheme {0:?}: expected https, http or ssh")]
    UnsupportedScheme(String),
    /// The URL embeds credentials (a user name on http(s), or a password).
    #[error(
        "repository URL must not contain credentials; configure a token instead of putting it in the URL"
    )]
    Credentials,
    /// The URL has a query (`?…`) or a fragment (`#…`).
    #[error("repository URL must not have a query or fragment")]
    QueryOrFragment,
    /// The URL has no host, or an unusable one.
    #[error("repository URL must have a valid host")]
    InvalidHost,
    /// The path is not exactly two segments.
    #[error("repository URL path must be exactly OWNER/REPO, found {0} segment(s)")]
    SegmentCount(usize),
    /// The path has an empty segment (`//`).
    #[error("repository URL path must not have empty segments")]
    EmptySegment,
    /// The owner or name contains a character outside `[A-Za-z0-9._-]`.
    #[error("repository {part} may contain only letters, digits, '.', '_' and '-'")]
    InvalidCharacter {
        /// `"owner"` or `"name"`.
        part: &'static str,
    },
    /// The owner or name is `.` or `..`, or the name is empty after removing
    /// `.git` or still ends in `.git`.
    #[error("repository {part} {value:?} is not allowed")]
    InvalidName {
        /// `"owner"` or `"name"`.
        part: &'static str,
        /// The refused owner or name.
        value: String,
    },
    /// The owner or name is longer than 100 characters.
    #[error("repository {part} must be at most 100 characters long")]
    TooLong {
        /// `"owner"` or `"name"`.
        part: &'static str,
    },
}

/// A normalised code-host repository URL, `https://HOST[:PORT]/OWNER/NAME`,
/// all lower case, without `.git`.
///
/// Build one with [`RepoUrl::parse`] (or `FromStr`). Serialised as the
/// normalised string; deserialised through [`RepoUrl::parse`], so any
/// accepted form is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoUrl {
    /// The normalised URL.
    url: String,
    /// Byte offset of the `/` between host and owner.
    host_end: usize,
    /// Byte offset of the `/` between owner and name.
    owner_end: usize,
}

impl RepoUrl {
    /// Parses and normalises a repository URL.
    ///
    /// Leading and trailing whitespace is ignored. Accepted forms:
    ///
    /// - `https://HOST[:PORT]/OWNER/NAME[.git][/]` — an explicit non-default
    ///   port is kept;
    /// - `http://…` in the same shape, normalised to `https` (port 80 and
    ///   443 are dropped, any other port kept);
    /// - `ssh://[USER@]HOST[:PORT]/OWNER/NAME[.git][/]` — the port is ignored;
    /// - scp-like `[USER@]HOST:OWNER/NAME[.git][/]`.
    ///
    /// Everything is lower-cased and `.git` is removed from the name. Refused:
    /// empty text; other schemes; credentials (any user name on http(s), a
    /// password on ssh); a query or fragment; a path other than two segments;
    /// empty, `.` or `..` segments; characters outside `[A-Za-z0-9._-]` in the
    /// owner or name; a name that is empty after removing `.git` or still
    /// ends in `.git`; an owner or name longer than 100 characters; a missing
    /// or invalid host.
    pub fn parse(input: &str) -> Result<RepoUrl, RepoUrlError> {
        let text = input.trim();
        if text.is_empty() {
            return Err(RepoUrlError::Empty);
        }
        // Whitespace and control characters would be silently removed by the
        // URL parser; backslashes would be read as slashes; percent-encoding
        // could hide dot segments. None of them belong in a repository URL.
        if text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '\\' || c == '%')
        {
            return Err(RepoUrlError::NotARepoUrl);
        }

        let (host, path) = if text.contains("://") {
            split_url(text)?
        } else {
            split_scp(text)?
        };
        RepoUrl::from_parts(&host, path)
    }

    /// The normalised URL, e.g. `"https://github.com/org/repo"`.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The host, including an explicit non-default port if there is one,
    /// e.g. `"github.com"` or `"ghe.local:8443"`.
    pub fn host(&self) -> &str {
        &self.url[HTTPS_PREFIX.len()..self.host_end]
    }

    /// The owner (user or organisation), lower case.
    pub fn owner(&self) -> &str {
        &self.url[self.host_end + 1..self.owner_end]
    }

    /// The repository name, lower case, without `.git`.
    pub fn name(&self) -> &str {
        &self.url[self.owner_end + 1..]
    }

    /// `"OWNER/NAME"`, e.g. `"org/repo"`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner(), self.name())
    }

    /// Validates the path (`OWNER/NAME[.git][/]`, without a leading slash)
    /// and assembles the normalised URL on the already normalised `host`.
    fn from_parts(host: &str, path: &str) -> Result<RepoUrl, RepoUrlError> {
        let path = path.strip_suffix('/').unwrap_or(path);
        if path.is_empty() {
            return Err(RepoUrlError::SegmentCount(0));
        }
        let segments: Vec<&str> = path.split('/').collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(RepoUrlError::EmptySegment);
        }
        let [owner, name] = segments[..] else {
            return Err(RepoUrlError::SegmentCount(segments.len()));
        };

        let owner = owner.to_ascii_lowercase();
        let name = name.to_ascii_lowercase();
        let name = name.strip_suffix(".git").unwrap_or(&name);
        check_part("owner", &owner)?;
        check_part("name", name)?;
        if name.is_empty() || name.ends_with(".git") {
            return Err(RepoUrlError::InvalidName {
                part: "name",
                value: name.to_owned(),
            });
        }

        let url = format!("{HTTPS_PREFIX}{host}/{owner}/{name}");
        let host_end = HTTPS_PREFIX.len() + host.len();
        let owner_end = host_end + 1 + owner.len();
        Ok(RepoUrl {
            url,
            host_end,
            owner_end,
        })
    }
}

/// Checks an owner or name (already lower-cased, `.git` removed).
fn check_part(part: &'static str, value: &str) -> Result<(), RepoUrlError> {
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(RepoUrlError::InvalidCharacter { part });
    }
    if value.len() > MAX_PART_CHARS {
        return Err(RepoUrlError::TooLong { part });
    }
    if value == "." || value == ".." {
        return Err(RepoUrlError::InvalidName {
            part,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Splits a `scheme://…` URL into normalised host (with port where kept)
/// and path without the leading `/`.
fn split_url(text: &str) -> Result<(String, &str), RepoUrlError> {
    let url = Url::parse(text).map_err(|_| {
        // Report an unsupported scheme even when the rest does not parse.
        match text.split_once("://") {
            Some((scheme, _)) if !is_supported_scheme(&scheme.to_ascii_lowercase()) => {
                RepoUrlError::UnsupportedScheme(scheme.to_owned())
            }
            _ => RepoUrlError::NotARepoUrl,
        }
    })?;
    let scheme = url.scheme();
    if !is_supported_scheme(scheme) {
        return Err(RepoUrlError::UnsupportedScheme(scheme.to_owned()));
    }
    // The URL parser skips extra slashes before the host of http(s) URLs
    // (`https:///org/repo` has host `org`); refuse them, so that the path
    // taken from the text below is the one after the host.
    let (raw_scheme, after_scheme) = text.split_once("://").unwrap_or_default();
    if !raw_scheme.eq_ignore_ascii_case(scheme) {
        return Err(RepoUrlError::NotARepoUrl);
    }
    if after_scheme.starts_with('/') {
        return Err(RepoUrlError::InvalidHost);
    }
    let is_ssh = scheme == "ssh";
    if url.password().is_some() || (!is_ssh && !url.username().is_empty()) {
        return Err(RepoUrlError::Credentials);
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(RepoUrlError::QueryOrFragment);
    }
    let host = url.host_str().ok_or(RepoUrlError::InvalidHost)?;
    let host = normalise_host(host)?;
    let host = match url.port() {
        Some(port) if !is_ssh && port != 80 && port != 443 => format!("{host}:{port}"),
        _ => host,
    };

    // Take the path from the original text rather than from `url.path()`,
    // which has dot segments resolved; `text` has no '?' or '#' (checked
    // above), so the path runs from the first '/' after the authority.
    let path = after_scheme
        .find('/')
        .map_or("", |slash| &after_scheme[slash + 1..]);
    Ok((host, path))
}

/// Splits a scp-like `[user@]host:path` into normalised host and path.
fn split_scp(text: &str) -> Result<(String, &str), RepoUrlError> {
    let (authority, path) = text.split_once(':').ok_or(RepoUrlError::NotARepoUrl)?;
    // As in git: a slash before the first colon means a local path.
    if authority.contains('/') {
        return Err(RepoUrlError::NotARepoUrl);
    }
    let host = match authority.rsplit_once('@') {
        Some((user, host)) => {
            if user.is_empty() || user.contains('@') {
                return Err(RepoUrlError::NotARepoUrl);
            }
            host
        }
        None => authority,
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err(RepoUrlError::InvalidHost);
    }
    Ok((normalise_host(host)?, path))
}

/// Whether `scheme` (lower case) is one of the accepted schemes.
fn is_supported_scheme(scheme: &str) -> bool {
    matches!(scheme, "https" | "http" | "ssh")
}

/// Normalises a host name (without port) the way an `https` URL does: lower
/// case, IDNA to punycode, IPv4 canonical form, IPv6 in brackets.
fn normalise_host(host: &str) -> Result<String, RepoUrlError> {
    let url =
        Url::parse(&format!("{HTTPS_PREFIX}{host}/")).map_err(|_| RepoUrlError::InvalidHost)?;
    let normalised = url.host_str().ok_or(RepoUrlError::InvalidHost)?;
    let plain = normalised
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    let ipv6 = normalised.starts_with('[')
        && normalised.ends_with(']')
        && normalised[1..normalised.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
    if url.port().is_some() || url.path() != "/" || !(plain || ipv6) {
        return Err(RepoUrlError::InvalidHost);
    }
    Ok(normalised.to_owned())
}

impl fmt::Display for RepoUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

text_form!(
    RepoUrl,
    RepoUrlError,
    "a repository URL such as \"https://github.com/org/repo\""
);

#[cfg(test)]
mod tests {

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepted_forms() {
        for (input, expected) in [
            ("https://github.com/Org/Repo", "https://github.com/org/repo"),
            (
                "https://github.com/org/repo.git",
                "https://github.com/org/repo",
            ),
            (
                "https://github.com/org/repo/",
                "https://github.com/org/repo",
            ),
            (
                "https://github.com/org/repo.git/",
                "https://github.com/org/repo",
            ),
            (
                "  https://github.com/org/repo\n",
                "https://github.com/org/repo",
            ),
            (
                "HTTPS://GitHub.COM/Org/Repo.GIT",
                "https://github.com/org/repo",
            ),
            ("git@github.com:org/repo.git", "https://github.com/org/repo"),
            ("git@github.com:org/repo", "https://github.com/org/repo"),
            ("git@github.com:org/repo/", "https://github.com/org/repo"),
            (
                "deploy@GitHub.com:Org/Repo.git",
                "https://github.com/org/repo",
            ),
            ("github.com:org/repo.git", "https://github.com/org/repo"),
            (
                "ssh://git@github.com/org/repo.git",
                "https://github.com/org/repo",
            ),
            (
                "ssh://git@github.com:2222/org/repo.git",
                "https://github.com/org/repo",
            ),
            ("ssh://github.com/org/repo/", "https://github.com/org/repo"),
            ("http://github.com/org/repo", "https://github.com/org/repo"),
            (
                "http://github.com:80/org/repo",
                "https://github.com/org/repo",
            ),
            (
                "http://github.com:443/org/repo",
                "https://github.com/org/repo",
            ),
            (
                "https://github.com:443/org/repo",
                "https://github.com/org/repo",
            ),
            (
                "https://ghe.example.com/Org/Repo",
                "https://ghe.example.com/org/repo",
            ),
            ("https://ghe.local:8443/a/b", "https://ghe.local:8443/a/b"),
            (
                "https://ghe.local:8443/a/b.git/",
                "https://ghe.local:8443/a/b",
            ),
            ("http://ghe.local:8080/a/b", "https://ghe.local:8080/a/b"),
            (
                "git@ghe.example.com:team/tool.git",
                "https://ghe.example.com/team/tool",
            ),
            ("https://10.0.0.1/a/b", "https://10.0.0.1/a/b"),
            ("https://[::1]:8443/a/b", "https://[::1]:8443/a/b"),
            (
                "https://github.com/my-org_1/my.repo-2_x",
                "https://github.com/my-org_1/my.repo-2_x",
            ),
            (
                "https://github.com/o/.github",
                "https://github.com/o/.github",
            ),
            ("https://github.com/o/a..b", "https://github.com/o/a..b"),
        ] {
            let parsed = RepoUrl::parse(input);
            assert_eq!(
                parsed.as_ref().map(RepoUrl::as_str),
                Ok(expected),
                "{input:?}"
            );
        }
    }

    #[test]
    fn accessors() {
        let url = RepoUrl::parse("git@GHE.local:Team/Tool.git").unwrap();
        assert_eq!(url.host(), "ghe.local");
        assert_eq!(url.owner(), "team");
        assert_eq!(url.name(), "tool");
        assert_eq!(url.full_name(), "team/tool");
        assert_eq!(url.to_string(), "https://ghe.local/team/tool");

        let url: RepoUrl = "https://ghe.local:8443/a/b".parse().unwrap();
        assert_eq!(url.host(), "ghe.local:8443");
        assert_eq!(url.owner(), "a");
        assert_eq!(url.name(), "b");
    }

    #[test]
    fn refused_forms() {
        use RepoUrlError as E;
        let long = "a".repeat(101);
        let long_owner = format!("https://github.com/{long}/r");
        let long_name = format!("https://github.com/o/{long}");
        let long_ssh_name = format!("git@github.com:o/{long}.git");
        let invalid_name = |part, value: &str| E::InvalidName {
            part,
            value: value.into(),
        };
        let scheme = |s: &str| E::UnsupportedScheme(s.into());
        let invalid_character = |part| E::InvalidCharacter { part };
        let cases: Vec<(&str, RepoUrlError)> = vec![
            ("", E::Empty),
            ("   ", E::Empty),
            ("github.com/org/repo", E::NotARepoUrl),
            ("org/repo", E::NotARepoUrl),
            ("https://github.com/org /repo", E::NotARepoUrl),
            ("https://github.com/org/re\tpo", E::NotARepoUrl),
            ("https://github.com\\org\\repo", E::NotARepoUrl),
            ("https://github.com/org/%2e%2e", E::NotARepoUrl),
            ("./org:repo", E::NotARepoUrl),
            ("@github.com:org/repo", E::NotARepoUrl),
            ("ftp://github.com/org/repo", scheme("ftp")),
            ("file:///org/repo", scheme("file")),
            ("git://github.com/org/repo", scheme("git")),
            ("https://user:tok@github.com/o/r", E::Credentials),
            ("https://ghp_token@github.com/o/r", E::Credentials),
            ("https://user:@github.com/o/r", E::Credentials),
            ("ssh://git:secret@github.com/o/r", E::Credentials),
            ("https://github.com/o/r?tab=readme", E::QueryOrFragment),
            ("https://github.com/o/r#readme", E::QueryOrFragment),
            ("https://github.com/o/r?", E::QueryOrFragment),
            ("https:///o/r", E::InvalidHost),
            ("https:////o/r", E::InvalidHost),
            ("ssh:///o/r", E::InvalidHost),
            ("https:x://github.com/o/r", E::NotARepoUrl),
            ("https://github.com/org", E::SegmentCount(1)),
            ("https://github.com/org/", E::SegmentCount(1)),
            ("https://github.com", E::SegmentCount(0)),
            ("https://github.com/", E::SegmentCount(0)),
            ("https://github.com/org/repo/issues/1", E::SegmentCount(4)),
            ("https://github.com/org/repo/tree", E::SegmentCount(3)),
            ("https://github.com/org/repo//", E::EmptySegment),
            ("git@github.com:org", E::SegmentCount(1)),
            ("https://github.com//repo", E::EmptySegment),
            ("git@github.com:/org/repo", E::EmptySegment),
            ("https://github.com/org//", E::EmptySegment),
            ("https://github.com/or~g/repo", invalid_character("owner")),
            ("https://github.com/org/re+po", invalid_character("name")),
            ("https://github.com/org/répo", invalid_character("name")),
            ("git@github.com:org/re:po", invalid_character("name")),
            ("https://github.com/org/..", invalid_name("name", "..")),
            ("https://github.com/./repo", invalid_name("owner", ".")),
            ("https://github.com/x/../org/repo", E::SegmentCount(4)),
            ("https://github.com/org/.git", invalid_name("name", "")),
            (
                "https://github.com/org/x.git.git",
                invalid_name("name", "x.git"),
            ),
            ("https://github.com/org/...git", invalid_name("name", "..")),
            (&long_owner, E::TooLong { part: "owner" }),
            (&long_name, E::TooLong { part: "name" }),
            (&long_ssh_name, E::TooLong { part: "name" }),
            ("git@:org/repo", E::InvalidHost),
            ("git@git?hub.com:org/repo", E::InvalidHost),
            ("https://exa mple.com/o/r", E::NotARepoUrl),
        ];
        for (input, expected) in cases {
            assert_eq!(RepoUrl::parse(input), Err(expected), "{input:?}");
        }
    }

    #[test]
    fn length_limit_is_inclusive() {
        let hundred = "a".repeat(100);
        let url = RepoUrl::parse(&format!("https://github.com/{hundred}/{hundred}.git")).unwrap();
        assert_eq!(url.owner(), hundred);
        assert_eq!(url.name(), hundred);
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            RepoUrlError::NotARepoUrl.to_string(),
            "not a repository URL: expected https://HOST/OWNER/REPO or git@HOST:OWNER/REPO.git"
        );
        // The credentials are not echoed back.
        let err = RepoUrl::parse("https://user:s3cret@github.com/o/r").unwrap_err();
        assert!(!err.to_string().contains("s3cret"));
    }

    #[test]
    fn serde_round_trip() {
        let url = RepoUrl::parse("git@github.com:Org/Repo.git").unwrap();
        let json = serde_json::to_string(&url).unwrap();
        assert_eq!(json, "\"https://github.com/org/repo\"");
        assert_eq!(serde_json::from_str::<RepoUrl>(&json).unwrap(), url);
        assert_eq!(
            serde_json::from_str::<RepoUrl>("\"git@github.com:Org/Repo.git\"").unwrap(),
            url
        );
        let err = serde_json::from_str::<RepoUrl>("\"https://github.com/org\"").unwrap_err();
        assert!(err.to_string().contains("OWNER/REPO"), "{err}");
    }

    #[test]
    fn punycode_labels_are_checked() {
        assert!(RepoUrl::parse("https://xn--/a/b").is_err());
        assert!(RepoUrl::parse("git@xn--:a/b.git").is_err());
        assert_eq!(
            RepoUrl::parse("https://xn--bcher-kva.example/a/b").map(|u| u.to_string()),
            Ok("https://xn--bcher-kva.example/a/b".to_owned())
        );
    }

    fn part() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}".prop_filter("no dot segments or .git names", |s| {
            s != "." && s != ".." && !s.to_ascii_lowercase().ends_with(".git")
        })
    }

    proptest! {
        #[test]
        fn all_forms_normalise_alike_and_idempotently(
            // Labels starting `xn--` are IDNA (punycode) and must be valid punycode; the
            // URL parser refuses invalid ones, which `punycode_labels_are_checked` pins.
            host in "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}"
                .prop_filter("no punycode labels", |h| !h.split('.').any(|l| l.starts_with("xn--"))),
            owner in part(),
            name in part(),
            git in any::<bool>(),
            slash in any::<bool>(),
            upper_host in any::<bool>(),
        ) {
            let suffix = format!("{}{}", if git { ".git" } else { "" }, if slash { "/" } else { "" });
            let host_text = if upper_host { host.to_ascii_uppercase() } else { host.clone() };
            let expected = format!(
                "https://{host}/{}/{}",
                owner.to_ascii_lowercase(),
                name.to_ascii_lowercase()
            );
            for input in [
                format!("https://{host_text}/{owner}/{name}{suffix}"),
                format!("http://{host_text}/{owner}/{name}{suffix}"),
                format!("ssh://git@{host_text}:22/{owner}/{name}{suffix}"),
                format!("git@{host_text}:{owner}/{name}{suffix}"),
            ] {
                let url = RepoUrl::parse(&input).unwrap();
                prop_assert_eq!(url.as_str(), expected.as_str(), "{}", input);
                let again = RepoUrl::parse(url.as_str()).unwrap();
                prop_assert_eq!(&again, &url);
                prop_assert_eq!(url.full_name(), format!("{}/{}", url.owner(), url.name()));
                prop_assert_eq!(url.host(), host.as_str());
            }
        }

        #[test]
        fn parse_never_panics(text in ".*") {
            if let Ok(url) = RepoUrl::parse(&text) {
                prop_assert_eq!(RepoUrl::parse(url.as_str()), Ok(url.clone()));
            }
        }

        #[test]
        fn parse_never_panics_on_url_like_text(
            text in "(https?|ssh|git)?(://)?([a-z]+(:[a-z]*)?@)?[a-zA-Z0-9.:\\[\\]-]{0,12}(:[0-9]{0,6})?[/:]?[A-Za-z0-9._/?#@:-]{0,30}"
        ) {
            if let Ok(url) = RepoUrl::parse(&text) {
                prop_assert_eq!(RepoUrl::parse(url.as_str()), Ok(url.clone()));
            }
        }
    }
}
