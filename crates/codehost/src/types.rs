//! The values the client returns: small, owned, `time`-based views of GitHub's objects with
//! only the members agentry uses.

use serde::Deserialize;
use time::OffsetDateTime;

use crate::wire::{
    branch_or_main, branch_ref, ghost, login, login_or_ghost, main_branch, or_empty, utc,
    utc_option,
};

/// The answer to a conditional request (`If-None-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditional<T> {
    /// `304 Not Modified`: the data is what the given ETag names. It cost one request and no
    /// rate limit.
    NotModified,
    /// New data, with the ETag to send next time (`None` if GitHub sent none).
    Modified {
        /// The data.
        value: T,
        /// The `ETag` of the (first page of the) answer.
        etag: Option<String>,
    },
}

impl<T> Conditional<T> {
    /// The new value, or `None` when not modified.
    pub fn modified(self) -> Option<T> {
        match self {
            Conditional::NotModified => None,
            Conditional::Modified { value, .. } => Some(value),
        }
    }

    /// The same answer with `f` applied to the new value, if there is one.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Conditional<U> {
        match self {
            Conditional::NotModified => Conditional::NotModified,
            Conditional::Modified { value, etag } => Conditional::Modified {
                value: f(value),
                etag,
            },
        }
    }

    /// Whether the answer was `304 Not Modified`.
    pub fn is_not_modified(&self) -> bool {
        matches!(self, Conditional::NotModified)
    }
}

/// The authenticated user (`GET /user`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct User {
    /// Login name.
    pub login: String,
    /// Numeric user id.
    pub id: u64,
}

/// A repository (`GET /repos/{owner}/{repo}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RepoInfo {
    /// Numeric repository id.
    pub id: u64,
    /// Login of the owner.
    #[serde(deserialize_with = "login")]
    pub owner: String,
    /// Repository name.
    pub name: String,
    /// `owner/name`.
    pub full_name: String,
    /// The default branch, e.g. `main`.
    #[serde(default = "main_branch", deserialize_with = "branch_or_main")]
    pub default_branch: String,
    /// The HTTPS clone URL.
    #[serde(default, deserialize_with = "or_empty")]
    pub clone_url: String,
    /// The web page of the repository.
    pub html_url: String,
    /// Whether the repository is private.
    #[serde(default)]
    pub private: bool,
}

/// A label on an issue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "crate::wire::LabelJson")]
pub struct Label {
    /// Label name.
    pub name: String,
    /// Colour, six hex digits without `#` (empty when GitHub gave none).
    pub color: String,
}

/// An issue (never a pull request).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Issue {
    /// Issue number.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Markdown body (`""` when GitHub has none).
    #[serde(default, deserialize_with = "or_empty")]
    pub body: String,
    /// Web page of the issue.
    pub html_url: String,
    /// `open` or `closed`.
    pub state: String,
    /// Login of the author (`ghost` for a deleted account).
    #[serde(rename = "user")]
    #[serde(default = "ghost", deserialize_with = "login_or_ghost")]
    pub author: String,
    /// Labels, in GitHub's order.
    #[serde(default)]
    pub labels: Vec<Label>,
    /// Creation time (UTC).
    #[serde(deserialize_with = "utc")]
    pub created_at: OffsetDateTime,
    /// Last update time (UTC).
    #[serde(deserialize_with = "utc")]
    pub updated_at: OffsetDateTime,
    /// When it was closed (UTC), if it is.
    #[serde(default, deserialize_with = "utc_option")]
    pub closed_at: Option<OffsetDateTime>,
}

/// The issues that changed since a time, as [`crate::GitHub::issues_updated_since`] read
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueChanges {
    /// The issues read, open and closed, each once (its latest copy); pull requests are left
    /// out.
    pub issues: Vec<Issue>,
    /// The latest `updated_at` among everything read, pull requests included: what the next
    /// read may start from. `None` when the answer was empty.
    pub newest: Option<OffsetDateTime>,
    /// Pages read.
    pub pages: usize,
    /// Whether the answer's (first page's) ETag vouches for the whole answer from now on:
    /// fewer than a page of items share the newest second. Any later update has an
    /// `updated_at` at or after that second, so it sorts into the first page and changes
    /// its ETag, unless a full page of items ties with it (GitHub does not order one
    /// second's updates): then a 304 could hide it, and the query must be read again
    /// without `If-None-Match`.
    pub etag_covers_all: bool,
}

/// A comment on an issue or pull request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Comment {
    /// Comment id.
    pub id: u64,
    /// Markdown body.
    #[serde(default, deserialize_with = "or_empty")]
    pub body: String,
    /// Login of the author (`ghost` for a deleted account).
    #[serde(rename = "user")]
    #[serde(default = "ghost", deserialize_with = "login_or_ghost")]
    pub author: String,
    /// Creation time (UTC).
    #[serde(deserialize_with = "utc")]
    pub created_at: OffsetDateTime,
    /// Web page of the comment, e.g. `https://github.com/o/r/issues/7#issuecomment-1`
    /// (`/pull/7#…` on a pull request); `""` when GitHub gave none.
    #[serde(default, deserialize_with = "or_empty")]
    pub html_url: String,
}

/// A review of a pull request (`GET /repos/{owner}/{repo}/pulls/{number}/reviews`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Review {
    /// Review id.
    pub id: u64,
    /// Login of the reviewer (`ghost` for a deleted account).
    #[serde(rename = "user")]
    #[serde(default = "ghost", deserialize_with = "login_or_ghost")]
    pub author: String,
    /// The state as the REST API writes it, upper case: `CHANGES_REQUESTED`, `COMMENTED`,
    /// `APPROVED`, `DISMISSED` or `PENDING`.
    pub state: String,
    /// Markdown body (`""` when GitHub has none).
    #[serde(default, deserialize_with = "or_empty")]
    pub body: String,
    /// Web page of the review (`…/pull/{number}#pullrequestreview-{id}`); `""` when GitHub
    /// gave none.
    #[serde(default, deserialize_with = "or_empty")]
    pub html_url: String,
    /// When it was submitted (UTC); `None` for a pending review.
    #[serde(default, deserialize_with = "utc_option")]
    pub submitted_at: Option<OffsetDateTime>,
}

/// A review comment: a comment on a line of a pull request's diff
/// (`GET /repos/{owner}/{repo}/pulls/{number}/comments`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ReviewComment {
    /// Comment id.
    pub id: u64,
    /// Login of the author (`ghost` for a deleted account).
    #[serde(rename = "user")]
    #[serde(default = "ghost", deserialize_with = "login_or_ghost")]
    pub author: String,
    /// Markdown body.
    #[serde(default, deserialize_with = "or_empty")]
    pub body: String,
    /// The file it is on, relative to the repository root.
    #[serde(default, deserialize_with = "or_empty")]
    pub path: String,
    /// The line of the file it is on (`line`, or `original_line` when the line is no longer
    /// in the diff); `None` for a comment on the whole file.
    #[serde(default)]
    pub line: Option<u64>,
    /// Web page of the comment (`…/pull/{number}#discussion_r{id}`); `""` when GitHub gave
    /// none.
    #[serde(default, deserialize_with = "or_empty")]
    pub html_url: String,
    /// Creation time (UTC).
    #[serde(deserialize_with = "utc")]
    pub created_at: OffsetDateTime,
    /// The review it belongs to (`pull_request_review_id`).
    #[serde(default, rename = "pull_request_review_id")]
    pub review_id: Option<u64>,
}

/// A user's permission on a repository
/// (`GET /repos/{owner}/{repo}/collaborators/{username}/permission`), strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Full control.
    Admin,
    /// Manages the repository without access to sensitive actions.
    Maintain,
    /// May push.
    Write,
    /// May manage issues and pull requests, not push.
    Triage,
    /// May read and comment.
    Read,
    /// No access (or no such user).
    None,
}

impl Permission {
    /// Whether the user may push to the repository: [`Permission::Admin`],
    /// [`Permission::Maintain`] or [`Permission::Write`].
    pub fn can_write(self) -> bool {
        matches!(
            self,
            Permission::Admin | Permission::Maintain | Permission::Write
        )
    }

    /// GitHub's name of the role: `admin`, `maintain`, `write`, `triage`, `read` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Admin => "admin",
            Permission::Maintain => "maintain",
            Permission::Write => "write",
            Permission::Triage => "triage",
            Permission::Read => "read",
            Permission::None => "none",
        }
    }
}

/// What a reaction is added to ([`crate::GitHub::add_reaction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactionTarget {
    /// A comment on an issue or pull request (its conversation), by id.
    IssueComment(u64),
    /// A review comment (on a line of a pull request's diff), by id.
    ReviewComment(u64),
}

/// A pull request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PullRequest {
    /// Number (shared with issues).
    pub number: u64,
    /// Title.
    pub title: String,
    /// Markdown body (`""` when GitHub has none).
    #[serde(default, deserialize_with = "or_empty")]
    pub body: String,
    /// Web page of the pull request.
    pub html_url: String,
    /// `open` or `closed` (a merged pull request is `closed` with `merged_at` set).
    pub state: String,
    /// When it was merged (UTC), if it was.
    #[serde(default, deserialize_with = "utc_option")]
    pub merged_at: Option<OffsetDateTime>,
    /// When it was closed (UTC), merged or not.
    #[serde(default, deserialize_with = "utc_option")]
    pub closed_at: Option<OffsetDateTime>,
    /// Last update time (UTC).
    #[serde(deserialize_with = "utc")]
    pub updated_at: OffsetDateTime,
    /// Head branch name (`ref`, without an `owner:` prefix).
    #[serde(rename = "head", deserialize_with = "branch_ref")]
    pub head_ref: String,
    /// Base branch name.
    #[serde(rename = "base", deserialize_with = "branch_ref")]
    pub base_ref: String,
}
