//! GitHub's JSON, read with serde straight into the public types of [`crate::types`] (their
//! `#[serde(...)]` attributes name the helpers here), with only the members the client uses,
//! so a missing optional member or a new one never breaks parsing. Times are RFC 3339, read
//! with `time` and moved to UTC; a `null` text is `""`, a missing or `null` user `ghost`.
//!
//! A wire struct is kept only where the mapping is more than a rename: [`IssueItem`] (an
//! item of the issues list may be a pull request), [`ReviewCommentItem`] (`line` falls back
//! to `original_line`), [`LabelJson`] (a label may be a bare name), [`PermissionJson`] (a
//! role name or the legacy summary) and [`ErrorJson`].

use serde::{Deserialize, Deserializer};
use time::{OffsetDateTime, UtcOffset};

use crate::types::{Issue, Label, Permission, ReviewComment};

/// GitHub shows a deleted account as this user.
const GHOST: &str = "ghost";

/// A user reference (`simple-user`); only the login is used.
#[derive(Debug, Deserialize)]
struct UserRef {
    login: String,
}

/// `#[serde(deserialize_with)]`: an RFC 3339 time, moved to UTC.
pub(crate) fn utc<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
    time::serde::rfc3339::deserialize(d).map(|t| t.to_offset(UtcOffset::UTC))
}

/// `#[serde(default, deserialize_with)]`: an RFC 3339 time or `null`, moved to UTC.
pub(crate) fn utc_option<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<OffsetDateTime>, D::Error> {
    time::serde::rfc3339::option::deserialize(d).map(|t| t.map(|t| t.to_offset(UtcOffset::UTC)))
}

/// `#[serde(default, deserialize_with)]`: a text, `""` when `null`.
pub(crate) fn or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Option::<String>::deserialize(d).map(Option::unwrap_or_default)
}

/// `#[serde(deserialize_with)]`: a user object, read as its login.
pub(crate) fn login<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    UserRef::deserialize(d).map(|u| u.login)
}

/// `#[serde(default = "ghost", deserialize_with)]`: a user object as its login, `ghost` (a
/// deleted account) when `null`.
pub(crate) fn login_or_ghost<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Option::<UserRef>::deserialize(d).map(|u| u.map_or_else(ghost, |u| u.login))
}

/// The login of a missing user: `ghost`.
pub(crate) fn ghost() -> String {
    GHOST.to_owned()
}

/// `#[serde(default = "main_branch", deserialize_with)]`: a default branch, `main` when
/// `null`.
pub(crate) fn branch_or_main<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Option::<String>::deserialize(d).map(|b| b.unwrap_or_else(main_branch))
}

/// The default branch of a repository that names none: `main`.
pub(crate) fn main_branch() -> String {
    "main".to_owned()
}

/// `#[serde(deserialize_with)]`: the `head` or `base` of a pull request, read as its `ref`
/// (the branch name).
pub(crate) fn branch_ref<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    /// The `head` or `base` object.
    #[derive(Deserialize)]
    struct BranchJson {
        #[serde(rename = "ref")]
        ref_name: String,
    }
    BranchJson::deserialize(d).map(|b| b.ref_name)
}

/// A label: an object, or (allowed by GitHub's schema for issues) a bare name.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum LabelJson {
    Object {
        name: String,
        #[serde(default)]
        color: Option<String>,
    },
    Name(String),
}

impl From<LabelJson> for Label {
    fn from(l: LabelJson) -> Self {
        match l {
            LabelJson::Object { name, color } => Label {
                name,
                color: color.unwrap_or_default(),
            },
            LabelJson::Name(name) => Label {
                name,
                color: String::new(),
            },
        }
    }
}

/// An item of `GET /repos/{owner}/{repo}/issues`: an issue, or a pull request (GitHub lists
/// both there).
#[derive(Debug, Deserialize)]
pub(crate) struct IssueItem {
    #[serde(flatten)]
    pub issue: Issue,
    /// Present (an object) when the item is a pull request.
    #[serde(default)]
    pull_request: Option<serde::de::IgnoredAny>,
}

impl IssueItem {
    /// Whether this item of the issues list is a pull request.
    pub fn is_pull_request(&self) -> bool {
        self.pull_request.is_some()
    }
}

impl From<IssueItem> for Issue {
    fn from(item: IssueItem) -> Self {
        item.issue
    }
}

/// A review comment (`pull-request-review-comment`) with the `original_line` its `line`
/// falls back to when the line is no longer in the diff.
#[derive(Debug, Deserialize)]
pub(crate) struct ReviewCommentItem {
    #[serde(flatten)]
    comment: ReviewComment,
    #[serde(default)]
    original_line: Option<u64>,
}

impl From<ReviewCommentItem> for ReviewComment {
    fn from(item: ReviewCommentItem) -> Self {
        ReviewComment {
            line: item.comment.line.or(item.original_line),
            ..item.comment
        }
    }
}

/// `GET /repos/{owner}/{repo}/collaborators/{username}/permission`
/// (`repository-collaborator-permission`).
#[derive(Debug, Deserialize)]
pub(crate) struct PermissionJson {
    /// The legacy summary: `admin`, `write`, `read` or `none` (maintain counts as write,
    /// triage as read).
    #[serde(default)]
    pub permission: Option<String>,
    /// The role: `admin`, `maintain`, `write`, `triage`, `read`, or an organisation's custom
    /// role name.
    #[serde(default)]
    pub role_name: Option<String>,
}

impl PermissionJson {
    /// The permission: `role_name` when it is one of GitHub's base roles, else
    /// `permission`; `None` when neither says anything known.
    pub fn permission(&self) -> Option<Permission> {
        let known = |name: &str| match name.trim().to_ascii_lowercase().as_str() {
            "admin" => Some(Permission::Admin),
            "maintain" => Some(Permission::Maintain),
            "write" | "push" => Some(Permission::Write),
            "triage" => Some(Permission::Triage),
            "read" | "pull" => Some(Permission::Read),
            "none" => Some(Permission::None),
            _ => None,
        };
        self.role_name
            .as_deref()
            .and_then(known)
            .or_else(|| self.permission.as_deref().and_then(known))
    }
}

/// GitHub's error body: `{"message", "errors": [...]}`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorJson {
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub errors: Vec<serde_json::Value>,
}

impl ErrorJson {
    /// Parses an error body; anything else gives an empty one.
    pub fn parse(body: &str) -> Self {
        serde_json::from_str(body).unwrap_or_default()
    }

    /// Whether one of the `errors` has this `code` (e.g. `already_exists`).
    pub fn has_code(&self, code: &str) -> bool {
        self.errors
            .iter()
            .any(|e| e.get("code").and_then(serde_json::Value::as_str) == Some(code))
    }

    /// The message with the error details, e.g. `Validation Failed (Label.name:
    /// already_exists)`; `fallback` (the status's reason) when there is no message.
    pub fn describe(&self, fallback: &str) -> String {
        let mut out = self
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(fallback)
            .to_owned();
        let details: Vec<String> = self
            .errors
            .iter()
            .take(5)
            .map(|e| match e {
                serde_json::Value::String(s) => s.clone(),
                other => {
                    let field = |k: &str| other.get(k).and_then(serde_json::Value::as_str);
                    match (
                        field("message"),
                        field("resource"),
                        field("field"),
                        field("code"),
                    ) {
                        (Some(m), _, _, _) => m.to_owned(),
                        (None, r, f, Some(c)) => {
                            let place: Vec<&str> = [r, f].into_iter().flatten().collect();
                            if place.is_empty() {
                                c.to_owned()
                            } else {
                                format!("{}: {c}", place.join("."))
                            }
                        }
                        _ => other.to_string(),
                    }
                }
            })
            .collect();
        if !details.is_empty() {
            out.push_str(" (");
            out.push_str(&details.join("; "));
            out.push(')');
        }
        out
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::types::Review;

    #[test]
    fn an_issue_with_nulls_and_missing_members_parses() {
        let json = r#"{"number": 7, "title": "t", "body": null, "html_url": "h", "state": "open",
            "user": null, "labels": ["bug", {"name": "agentry", "color": "6f42c1"}],
            "created_at": "2024-01-02T03:04:05Z", "updated_at": "2024-01-02T04:04:05+01:00"}"#;
        let issue: IssueItem = serde_json::from_str(json).unwrap();
        assert!(!issue.is_pull_request());
        let issue = Issue::from(issue);
        assert_eq!(issue.body, "");
        assert_eq!(issue.author, "ghost");
        assert_eq!(issue.closed_at, None);
        assert_eq!(issue.labels[0].name, "bug");
        assert_eq!(issue.labels[1].color, "6f42c1");
        assert_eq!(issue.updated_at, issue.created_at);
        assert_eq!(issue.updated_at.offset(), UtcOffset::UTC);
    }

    #[test]
    fn pull_requests_and_repositories_parse_into_the_public_types() {
        let item: IssueItem = serde_json::from_str(
            r#"{"number": 8, "title": "p", "html_url": "h", "state": "open",
                "user": {"login": "u"}, "created_at": "2024-01-02T03:04:05Z",
                "updated_at": "2024-01-02T03:04:05Z", "pull_request": {"url": "x"}}"#,
        )
        .unwrap();
        assert!(item.is_pull_request());
        assert_eq!(item.issue.author, "u");
        let pull: crate::types::PullRequest = serde_json::from_str(
            r#"{"number": 8, "title": "p", "body": null, "html_url": "h", "state": "closed",
                "merged_at": "2024-01-02T04:04:05+01:00", "closed_at": null,
                "updated_at": "2024-01-02T03:04:05Z",
                "head": {"ref": "agentry/x", "sha": "1"}, "base": {"ref": "main"}}"#,
        )
        .unwrap();
        assert_eq!(
            (pull.head_ref.as_str(), pull.base_ref.as_str()),
            ("agentry/x", "main")
        );
        assert_eq!(pull.merged_at, Some(pull.updated_at));
        assert_eq!(
            pull.merged_at.map(OffsetDateTime::offset),
            Some(UtcOffset::UTC)
        );
        assert_eq!((pull.body.as_str(), pull.closed_at), ("", None));
        let repo: crate::types::RepoInfo = serde_json::from_str(
            r#"{"id": 1, "owner": {"login": "o"}, "name": "r", "full_name": "o/r",
                "default_branch": null, "html_url": "h"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                repo.owner.as_str(),
                repo.default_branch.as_str(),
                repo.clone_url.as_str()
            ),
            ("o", "main", "")
        );
        assert!(!repo.private);
    }

    #[test]
    fn reviews_and_review_comments_with_nulls_parse() {
        let review: Review = serde_json::from_str(
            r#"{"id": 3, "user": null, "state": "PENDING", "body": null, "html_url": "h"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                review.author.as_str(),
                review.body.as_str(),
                review.submitted_at
            ),
            ("ghost", "", None)
        );
        let comment: ReviewCommentItem = serde_json::from_str(
            r#"{"id": 4, "user": {"login": "u"}, "body": "b", "path": "src/a.rs", "line": null,
                "original_line": 12, "created_at": "2024-01-02T03:04:05Z",
                "pull_request_review_id": 3}"#,
        )
        .unwrap();
        let comment = ReviewComment::from(comment);
        assert_eq!(comment.line, Some(12));
        assert_eq!(comment.review_id, Some(3));
        assert_eq!(comment.html_url, "");
    }

    #[test]
    fn permissions_prefer_the_role_name() {
        let of = |json: &str| {
            serde_json::from_str::<PermissionJson>(json)
                .unwrap()
                .permission()
        };
        assert_eq!(
            of(r#"{"permission": "write", "role_name": "maintain"}"#),
            Some(Permission::Maintain)
        );
        assert_eq!(
            of(r#"{"permission": "read", "role_name": "triage"}"#),
            Some(Permission::Triage)
        );
        // A custom role: the legacy summary decides.
        assert_eq!(
            of(r#"{"permission": "write", "role_name": "release-manager"}"#),
            Some(Permission::Write)
        );
        assert_eq!(of(r#"{"permission": "admin"}"#), Some(Permission::Admin));
        assert_eq!(of(r#"{"permission": "none"}"#), Some(Permission::None));
        assert_eq!(of(r#"{}"#), None);
        assert_eq!(of(r#"{"permission": "owner"}"#), None);
    }

    #[test]
    fn error_bodies_are_described() {
        let e = ErrorJson::parse(
            r#"{"message":"Validation Failed","errors":[{"resource":"Label","field":"name","code":"already_exists"}]}"#,
        );
        assert!(e.has_code("already_exists"));
        assert_eq!(
            e.describe("x"),
            "Validation Failed (Label.name: already_exists)"
        );
        assert_eq!(
            ErrorJson::parse("<html>").describe("Bad Gateway"),
            "Bad Gateway"
        );
    }
}
