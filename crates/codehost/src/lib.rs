//! agentry's code-host integration: the one GitHub REST client, and webhook verification and
//! parsing.
//!
//! * [`GitHub`] (built from a [`ClientConfig`] and a token) is the only way the service talks
//!   to GitHub (docs/contract.md#51-token–#52-rate-limits-and-failures). Every request carries the token as `Authorization: Bearer`,
//!   a `User-Agent`, `Accept: application/vnd.github+json` and `X-GitHub-Api-Version`; 5xx
//!   answers, timeouts and connection errors are retried with capped exponential backoff and
//!   full jitter; rate limits (`Retry-After`, `X-RateLimit-Remaining`/`Reset`) are waited
//!   out instead of hammered, up to [`ClientConfig::max_rate_limit_wait`]; periodic reads
//!   are conditional (`If-None-Match`), and a 304 is [`Conditional::NotModified`]; lists
//!   follow every `Link: rel="next"` page. See [`client`] for the details.
//! * The values it returns ([`Issue`], [`PullRequest`], …) are small owned structs with
//!   `time` timestamps in UTC; serde reads GitHub's JSON straight into them (only the members
//!   used; the helpers for nulls, users and times are private), so octocrab's models (and
//!   chrono) never cross this crate's boundary.
//! * Failures are one [`CodeHostError`]; [`CodeHostError::is_transient`] says whether trying
//!   again later may help. No message ever contains the token.
//! * [`webhook`] (docs/contract.md#56-webhook) checks a delivery's `X-Hub-Signature-256` in constant time
//!   ([`webhook::verify_signature`]) and reads a verified body into a [`WebhookEvent`]
//!   ([`webhook::parse_event`]); pure functions, the HTTP endpoint lives in `agentry-api`.
//!
//! The fake GitHub the tests talk to is a crate of its own, `agentry-fake-github`, a
//! dev-dependency only: nothing of it is compiled into this crate.

pub mod client;
pub mod error;
mod policy;
pub mod types;
pub mod webhook;
mod wire;

pub use client::{ClientConfig, GitHub};
pub use error::CodeHostError;
pub use types::{
    Comment, Conditional, Issue, IssueChanges, Label, Permission, PullRequest, ReactionTarget,
    RepoInfo, Review, ReviewComment, User,
};
pub use webhook::{RepoRef, SignatureError, WebhookEvent, WebhookParseError};
