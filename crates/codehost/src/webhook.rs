//! GitHub webhooks (docs/contract.md#56-webhook): signature verification and typed parsing of the events agentry
//! acts on. Pure functions, no I/O: the HTTP endpoint reads the body and the headers, calls
//! [`verify_signature`] first and [`parse_event`] only on a verified body.
//!
//! * A delivery is signed with `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw
//!   body under the webhook secret. [`verify_signature`] compares it in constant time (the
//!   `hmac` crate's `verify_slice`); [`sign`] builds the header for tests and tools.
//! * [`parse_event`] reads only the members it needs into private serde structs, so GitHub
//!   adding, removing or changing any other member never breaks it. Every JSON value it reads
//!   an object from must be an object (never an array standing in for one). Events and
//!   actions agentry does not act on become [`WebhookEvent::Other`]; only a body that is not
//!   a JSON object, or a recognised event/action missing a member it needs, is an error.

use std::fmt;
use std::marker::PhantomData;

use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor, value::MapAccessDeserializer};
use sha2::Sha256;
use time::{OffsetDateTime, UtcOffset};

/// The header carrying the body's signature: `sha256=` + hex HMAC-SHA256 (see [`sign`]).
pub const SIGNATURE_HEADER: &str = "X-Hub-Signature-256";
/// The header naming the event (`ping`, `issues`, `pull_request`, …); [`parse_event`]'s `event`.
pub const EVENT_HEADER: &str = "X-GitHub-Event";
/// The header carrying the delivery's unique id (a GUID; the same for a redelivery).
pub const DELIVERY_HEADER: &str = "X-GitHub-Delivery";
/// What the value of [`SIGNATURE_HEADER`] starts with, before the hex digest.
pub const SIGNATURE_PREFIX: &str = "sha256=";

type HmacSha256 = Hmac<Sha256>;

/// Length of an HMAC-SHA256 digest in bytes (64 hex digits).
const DIGEST_LEN: usize = 32;

/// Why a delivery's signature was refused. Every variant means "do not process the body".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-Hub-Signature-256` header.
    #[error("the X-Hub-Signature-256 header is missing")]
    Missing,
    /// The header is not `sha256=` followed by exactly 64 hex digits.
    #[error("the X-Hub-Signature-256 header is not `sha256=` followed by 64 hex digits")]
    Malformed,
    /// Well formed, but not the HMAC-SHA256 of this body under our secret.
    #[error("the X-Hub-Signature-256 signature does not match the body")]
    Mismatch,
}

/// The HMAC-SHA256 state keyed with `secret`. HMAC accepts keys of any length (longer ones
/// are hashed first), so `None` never happens; it is kept as an `Option` so that no code path
/// of [`verify_signature`] can panic.
fn keyed(secret: &[u8]) -> Option<HmacSha256> {
    <HmacSha256 as KeyInit>::new_from_slice(secret).ok()
}

/// Checks `header` (the value of [`SIGNATURE_HEADER`]: `sha256=` + 64 lower- or upper-case
/// hex digits of HMAC-SHA256(secret, body)) against `body`.
///
/// The digest is compared in constant time with the `hmac` crate's `verify_slice`, never with
/// `==`. An empty secret is accepted here (the caller refuses to run without one). The order
/// of checks is: header present ([`SignatureError::Missing`]), well formed
/// ([`SignatureError::Malformed`]: other algorithm such as `sha1=`, wrong length, a non-hex
/// digit, surrounding whitespace), then the MAC ([`SignatureError::Mismatch`]).
pub fn verify_signature(
    secret: &[u8],
    body: &[u8],
    header: Option<&str>,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let hex = header
        .strip_prefix(SIGNATURE_PREFIX)
        .ok_or(SignatureError::Malformed)?;
    let expected = decode_digest(hex).ok_or(SignatureError::Malformed)?;
    let mut mac = keyed(secret).ok_or(SignatureError::Mismatch)?;
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)
}

/// The value of [`SIGNATURE_HEADER`] for `body` under `secret`: `sha256=` + 64 lower-case hex
/// digits. For tests and tools that send webhooks; [`verify_signature`] accepts it.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    #[allow(
        clippy::expect_used,
        reason = "HMAC takes a key of any length: new_from_slice cannot fail here"
    )]
    let mut mac = keyed(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!(
        "{SIGNATURE_PREFIX}{}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// Exactly 64 hex digits (either case) → the 32 bytes; anything else → `None`.
fn decode_digest(digits: &str) -> Option<[u8; DIGEST_LEN]> {
    let mut out = [0u8; DIGEST_LEN];
    hex::decode_to_slice(digits, &mut out).ok()?;
    Some(out)
}

/// A repository as a webhook payload names it (`payload.repository`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `repository.owner.login`.
    pub owner: String,
    /// `repository.name`.
    pub name: String,
    /// `repository.html_url`, e.g. `https://github.com/octo/hello` (what `RepoUrl` parses).
    pub html_url: String,
}

/// A verified delivery, reduced to what agentry acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookEvent {
    /// `ping`: sent once when the webhook is created.
    Ping {
        /// `hook_id`, when present and a non-negative integer.
        hook_id: Option<u64>,
        /// `zen`, GitHub's aphorism, when present and a string.
        zen: Option<String>,
    },
    /// `issues` with action `labeled`.
    IssueLabeled {
        /// The issue's repository.
        repo: RepoRef,
        /// `issue.number`.
        issue_number: u64,
        /// `label.name`: the label just added (the issue may carry others).
        label: String,
    },
    /// `pull_request` with action `closed`, merged or not.
    PullRequestClosed {
        /// The pull request's (base) repository.
        repo: RepoRef,
        /// `pull_request.number`.
        number: u64,
        /// Whether it was merged: `pull_request.merged` is `true` or `merged_at` is set
        /// (the poller's rule, docs/contract.md#55-pull-request-tracking, decides on `merged_at`).
        merged: bool,
        /// `pull_request.merged_at`, in UTC.
        merged_at: Option<OffsetDateTime>,
        /// `pull_request.html_url`.
        html_url: String,
        /// `pull_request.head.ref`: the branch the pull request was opened from.
        head_ref: String,
    },
    /// `pull_request_review` with action `submitted`: a review was submitted on a pull
    /// request.
    PullRequestReviewSubmitted {
        /// The pull request's (base) repository.
        repo: RepoRef,
        /// `pull_request.number`.
        number: u64,
        /// `review.id`.
        review_id: u64,
        /// `review.user.login`: the reviewer.
        author: String,
        /// `review.state`, upper case like the REST API's [`crate::Review::state`]
        /// (`CHANGES_REQUESTED`, `COMMENTED`, `APPROVED`): webhooks send it in lower case.
        state: String,
        /// `review.body` (`""` when null).
        body: String,
        /// `review.html_url`.
        html_url: String,
    },
    /// `issue_comment` with action `created`: a comment on an issue or on a pull request's
    /// conversation.
    IssueCommentCreated {
        /// The issue's repository.
        repo: RepoRef,
        /// `issue.number` (a pull request's number when `is_pull_request`).
        issue_number: u64,
        /// Whether the issue is a pull request (`issue.pull_request` is present and not null).
        is_pull_request: bool,
        /// `comment.id`.
        comment_id: u64,
        /// `comment.user.login`.
        author: String,
        /// `comment.body` (`""` when null).
        body: String,
        /// `comment.html_url`.
        html_url: String,
    },
    /// `pull_request_review_comment` with action `created`: a comment on a line of a pull
    /// request's diff.
    ReviewCommentCreated {
        /// The pull request's (base) repository.
        repo: RepoRef,
        /// `pull_request.number`.
        number: u64,
        /// `comment.id`.
        comment_id: u64,
        /// `comment.user.login`.
        author: String,
        /// `comment.body` (`""` when null).
        body: String,
        /// `comment.path`: the file, relative to the repository root.
        path: String,
        /// `comment.line`, or `comment.original_line` when that is null (like
        /// [`crate::ReviewComment::line`]); `None` for a comment on the whole file.
        line: Option<u64>,
        /// `comment.html_url`.
        html_url: String,
    },
    /// Anything else (other events, other actions): acknowledged and ignored.
    Other {
        /// The event name, as given.
        event: String,
        /// The payload's `action`, when present and a string.
        action: Option<String>,
    },
}

impl WebhookEvent {
    /// The payload's `action` (`labeled`, `closed`, …); `None` for a ping and for events
    /// without one.
    pub fn action(&self) -> Option<&str> {
        match self {
            WebhookEvent::Ping { .. } => None,
            WebhookEvent::IssueLabeled { .. } => Some("labeled"),
            WebhookEvent::PullRequestClosed { .. } => Some("closed"),
            WebhookEvent::PullRequestReviewSubmitted { .. } => Some("submitted"),
            WebhookEvent::IssueCommentCreated { .. }
            | WebhookEvent::ReviewCommentCreated { .. } => Some("created"),
            WebhookEvent::Other { action, .. } => action.as_deref(),
        }
    }
}

/// A verified body that [`parse_event`] could not read: not a JSON object, or a recognised
/// event missing a member agentry needs. The message names the member's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhook payload: {0}")]
pub struct WebhookParseError(pub String);

/// Parses a verified body for the event named by [`EVENT_HEADER`].
///
/// * `ping` → [`WebhookEvent::Ping`];
/// * `issues` with action `labeled` → [`WebhookEvent::IssueLabeled`];
/// * `pull_request` with action `closed` → [`WebhookEvent::PullRequestClosed`];
/// * `pull_request_review` with action `submitted` →
///   [`WebhookEvent::PullRequestReviewSubmitted`];
/// * `issue_comment` with action `created` → [`WebhookEvent::IssueCommentCreated`];
/// * `pull_request_review_comment` with action `created` →
///   [`WebhookEvent::ReviewCommentCreated`];
/// * any other event or action → [`WebhookEvent::Other`].
///
/// Only the members needed are read, so unknown or extra members never break it. A body that
/// is not a JSON object, or a payload of a recognised event and action missing a member it
/// needs (or holding one of the wrong type), is an error. Never panics.
pub fn parse_event(event: &str, body: &[u8]) -> Result<WebhookEvent, WebhookParseError> {
    // The body must be one JSON object whatever the event, so this pass runs for all of them.
    let envelope: EnvelopeJson = read(body).map_err(not_an_object)?;
    let action = envelope.action;
    match (event, action.as_deref()) {
        ("ping", _) => {
            let ping: PingJson = read_in(event, None, body)?;
            Ok(WebhookEvent::Ping {
                hook_id: ping.hook_id,
                zen: ping.zen,
            })
        }
        ("issues", Some("labeled")) => {
            let p: IssueLabeledJson = read_in(event, Some("labeled"), body)?;
            Ok(WebhookEvent::IssueLabeled {
                repo: p.repository.into(),
                issue_number: p.issue.number,
                label: p.label.name,
            })
        }
        ("pull_request", Some("closed")) => {
            let p: PullRequestClosedJson = read_in(event, Some("closed"), body)?;
            let pr = p.pull_request;
            let merged_at = pr.merged_at.map(|t| t.to_offset(UtcOffset::UTC));
            Ok(WebhookEvent::PullRequestClosed {
                repo: p.repository.into(),
                number: pr.number,
                merged: pr.merged == Some(true) || merged_at.is_some(),
                merged_at,
                html_url: pr.html_url,
                head_ref: pr.head.git_ref,
            })
        }
        ("pull_request_review", Some("submitted")) => {
            let p: ReviewSubmittedJson = read_in(event, Some("submitted"), body)?;
            let review = p.review;
            Ok(WebhookEvent::PullRequestReviewSubmitted {
                repo: p.repository.into(),
                number: p.pull_request.number,
                review_id: review.id,
                author: review.author,
                state: review.state.to_ascii_uppercase(),
                body: review.body,
                html_url: review.html_url,
            })
        }
        ("issue_comment", Some("created")) => {
            let p: IssueCommentCreatedJson = read_in(event, Some("created"), body)?;
            Ok(WebhookEvent::IssueCommentCreated {
                repo: p.repository.into(),
                issue_number: p.issue.number,
                is_pull_request: p.issue.pull_request.is_some(),
                comment_id: p.comment.id,
                author: p.comment.author,
                body: p.comment.body,
                html_url: p.comment.html_url,
            })
        }
        ("pull_request_review_comment", Some("created")) => {
            let p: ReviewCommentCreatedJson = read_in(event, Some("created"), body)?;
            let c = p.comment;
            Ok(WebhookEvent::ReviewCommentCreated {
                repo: p.repository.into(),
                number: p.pull_request.number,
                comment_id: c.id,
                author: c.author,
                body: c.body,
                path: c.path,
                line: c.line.or(c.original_line),
                html_url: c.html_url,
            })
        }
        _ => Ok(WebhookEvent::Other {
            event: event.to_owned(),
            action,
        }),
    }
}

type ReadError = serde_path_to_error::Error<serde_json::Error>;

/// Reads `body` as one JSON object (nothing after it) into `T`, tracking the path of a
/// failure.
fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, ReadError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let Object(value) = serde_path_to_error::deserialize(&mut de)?;
    // Trailing data after the object: an error at no particular member.
    de.end().map_err(|e| {
        serde_path_to_error::Error::new(serde_path_to_error::Track::new().path(), e)
    })?;
    Ok(value)
}

/// [`read`] for the payload of `event` with `action`, its error saying which.
fn read_in<T: DeserializeOwned>(
    event: &str,
    action: Option<&str>,
    body: &[u8],
) -> Result<T, WebhookParseError> {
    read(body).map_err(|e| in_event(event, action, e))
}

/// The first pass failed: the body is not (exactly) one JSON object.
fn not_an_object(e: ReadError) -> WebhookParseError {
    WebhookParseError(format!("not a valid JSON object: {}", e.inner()))
}

/// A recognised event's payload lacks a member (or has one of the wrong type): the message
/// names the event, the action and the member's path, e.g. ``pull_request.head: missing
/// field `ref` at line 1 column 80``.
fn in_event(event: &str, action: Option<&str>, e: ReadError) -> WebhookParseError {
    let what = match action {
        Some(action) => format!("`{event}` event, action `{action}`"),
        None => format!("`{event}` event"),
    };
    if e.path().iter().next().is_none() {
        WebhookParseError(format!("{what}: {}", e.inner()))
    } else {
        WebhookParseError(format!("{what}: {}: {}", e.path(), e.inner()))
    }
}

/// A `T` read from a JSON object only. serde's derived structs also accept an array of the
/// members in order; GitHub never sends one, so refusing it keeps the accepted shapes exact.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(Object)
    }
}

/// `#[serde(deserialize_with = "object")]`: a member that must be a JSON object.
fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    Object::deserialize(deserializer).map(|Object(value)| value)
}

/// `#[serde(default, deserialize_with = "lenient")]`: a member read if it has the expected
/// type and `None` otherwise (missing, `null`, or anything else), for members that are only
/// informative.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).ok())
}

/// What every payload is first read as: only `action` (all other members skipped).
#[derive(Deserialize)]
struct EnvelopeJson {
    #[serde(default, deserialize_with = "lenient")]
    action: Option<String>,
}

#[derive(Deserialize)]
struct PingJson {
    #[serde(default, deserialize_with = "lenient")]
    hook_id: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    zen: Option<String>,
}

#[derive(Deserialize)]
struct RepoJson {
    #[serde(deserialize_with = "login")]
    owner: String,
    name: String,
    html_url: String,
}

impl From<RepoJson> for RepoRef {
    fn from(r: RepoJson) -> Self {
        RepoRef {
            owner: r.owner,
            name: r.name,
            html_url: r.html_url,
        }
    }
}

/// `#[serde(deserialize_with = "login")]`: a user, which must be a JSON object, read as its
/// `login`.
fn login<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    /// A user object; only the login is read.
    #[derive(Deserialize)]
    struct LoginJson {
        login: String,
    }
    object(deserializer).map(|user: LoginJson| user.login)
}

#[derive(Deserialize)]
struct NumberJson {
    number: u64,
}

#[derive(Deserialize)]
struct NameJson {
    name: String,
}

#[derive(Deserialize)]
struct IssueLabeledJson {
    #[serde(deserialize_with = "object")]
    repository: RepoJson,
    #[serde(deserialize_with = "object")]
    issue: NumberJson,
    #[serde(deserialize_with = "object")]
    label: NameJson,
}

#[derive(Deserialize)]
struct PullRequestClosedJson {
    #[serde(deserialize_with = "object")]
    repository: RepoJson,
    #[serde(deserialize_with = "object")]
    pull_request: PullJson,
}

#[derive(Deserialize)]
struct PullJson {
    number: u64,
    #[serde(default)]
    merged: Option<bool>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    merged_at: Option<OffsetDateTime>,
    html_url: String,
    #[serde(deserialize_with = "object")]
    head: RefJson,
}

#[derive(Deserialize)]
struct RefJson {
    #[serde(rename = "ref")]
    git_ref: String,
}

#[derive(Deserialize)]
struct ReviewSubmittedJson {
    #[serde(deserialize_with = "object")]
    repository: RepoJson,
    #[serde(deserialize_with = "object")]
    pull_request: NumberJson,
    #[serde(deserialize_with = "object")]
    review: ReviewJson,
}

#[derive(Deserialize)]
struct ReviewJson {
    id: u64,
    #[serde(rename = "user", deserialize_with = "login")]
    author: String,
    state: String,
    #[serde(default, deserialize_with = "crate::wire::or_empty")]
    body: String,
    html_url: String,
}

#[derive(Deserialize)]
struct IssueCommentCreatedJson {
    #[serde(deserialize_with = "object")]
    repository: RepoJson,
    #[serde(deserialize_with = "object")]
    issue: CommentedIssueJson,
    #[serde(deserialize_with = "object")]
    comment: CommentJson,
}

#[derive(Deserialize)]
struct CommentedIssueJson {
    number: u64,
    /// An object when the issue is a pull request; absent or null otherwise.
    #[serde(default)]
    pull_request: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct CommentJson {
    id: u64,
    #[serde(rename = "user", deserialize_with = "login")]
    author: String,
    #[serde(default, deserialize_with = "crate::wire::or_empty")]
    body: String,
    html_url: String,
}

#[derive(Deserialize)]
struct ReviewCommentCreatedJson {
    #[serde(deserialize_with = "object")]
    repository: RepoJson,
    #[serde(deserialize_with = "object")]
    pull_request: NumberJson,
    #[serde(deserialize_with = "object")]
    comment: ReviewCommentJson,
}

#[derive(Deserialize)]
struct ReviewCommentJson {
    id: u64,
    #[serde(rename = "user", deserialize_with = "login")]
    author: String,
    #[serde(default, deserialize_with = "crate::wire::or_empty")]
    body: String,
    path: String,
    #[serde(default)]
    line: Option<u64>,
    #[serde(default)]
    original_line: Option<u64>,
    html_url: String,
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn sign_matches_a_known_vector() {
        // RFC 4231 test case 2 (HMAC-SHA256, key "Jefe").
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // GitHub's documented example (docs: "Validating webhook deliveries").
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn decode_digest_takes_exactly_64_hex_digits() {
        let lower = "00ff".repeat(16);
        let upper = "00FF".repeat(16);
        assert_eq!(decode_digest(&lower), decode_digest(&upper));
        assert_eq!(decode_digest(&lower).unwrap()[..2], [0x00, 0xff]);
        assert_eq!(decode_digest(&lower[1..]), None);
        assert_eq!(decode_digest(&format!("{lower}0")), None);
        assert_eq!(decode_digest(&format!("{}g", &lower[1..])), None);
        assert_eq!(decode_digest(&format!("{}+1", &lower[2..])), None);
        assert_eq!(decode_digest(""), None);
        // Non-ASCII: 64 bytes, but not hex.
        assert_eq!(decode_digest(&"é".repeat(32)), None);
    }

    #[test]
    fn members_read_as_objects_refuse_arrays() {
        assert!(read::<EnvelopeJson>(b"[]").is_err());
        assert!(read::<EnvelopeJson>(b"[\"labeled\"]").is_err());
        assert!(read::<EnvelopeJson>(b"{} {}").is_err());
        assert!(read::<EnvelopeJson>(b" \n{}\n ").is_ok());
        let repo: Result<RepoJson, _> = read(br#"{"owner": ["o"], "name": "n", "html_url": "u"}"#);
        assert_eq!(repo.err().unwrap().path().to_string(), "owner");
    }

    #[test]
    fn lenient_members_drop_values_of_the_wrong_type() {
        let ping: PingJson = read(br#"{"hook_id": -1, "zen": 7}"#).unwrap();
        assert_eq!((ping.hook_id, ping.zen), (None, None));
        let env: EnvelopeJson = read(br#"{"action": {"nested": [1, 2]}}"#).unwrap();
        assert_eq!(env.action, None);
        let env: EnvelopeJson = read(br#"{"action": null}"#).unwrap();
        assert_eq!(env.action, None);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let mut body = b"{\"a\":".to_vec();
        body.extend(std::iter::repeat_n(b'[', 100_000));
        assert!(parse_event("issues", &body).is_err());
        assert!(parse_event("ping", &body).is_err());
    }

    #[test]
    fn action_of_each_variant() {
        let other = WebhookEvent::Other {
            event: "push".into(),
            action: None,
        };
        assert_eq!(other.action(), None);
        let ping = WebhookEvent::Ping {
            hook_id: None,
            zen: None,
        };
        assert_eq!(ping.action(), None);
    }
}
