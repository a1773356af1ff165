//! GitHub's JSON, read into small serde structs with only the members the client uses (so a
//! missing optional member or a new one never breaks parsing), then turned into the public
//! types of [`crate::types`]. Times are RFC 3339, read with `time` and moved to UTC.

use serde::Deserialize;
use time::{OffsetDateTime, UtcOffset};

use crate::types::{
    Comment, Issue, Label, Permission, PullRequest, RepoInfo, Review, ReviewComment, User,
};

/// GitHub shows a deleted account as this user.
const GHOST: &str = "ghost";

fn utc(t: OffsetDateTime) -> OffsetDateTime {
    t.to_offset(UtcOffset::UTC)
}

/// A user reference (`simple-user`); only the login is used.
#[derive(Debug, Deserialize)]
pub(crate) struct UserRef {
    pub login: String,
}

fn login_of(user: Option<UserRef>) -> String {
    user.map_or_else(|| GHOST.to_owned(), |u| u.login)
}

/// `GET /user`.
#[derive(Debug, Deserialize)]
pub(crate) struct UserJson {
    pub login: String,
    pub id: u64,
}

impl From<UserJson> for User {
    fn from(u: UserJson) -> Self {
        User {
            login: u.login,
            id: u.id,
        }
    }
}

/// `GET /repos/{owner}/{repo}`.
#[derive(Debug, Deserialize)]
pub(crate) struct RepoJson {
    pub id: u64,
    pub owner: UserRef,
    pub name: String,
    pub full_name: String,
    #[serde(default)]
    pub default_branch: Option<String>,
    #[serde(default)]
    pub clone_url: Option<String>,
    pub html_url: String,
    #[serde(default)]
    pub private: bool,
}

impl From<RepoJson> for RepoInfo {
    fn from(r: RepoJson) -> Self {
        RepoInfo {
            id: r.id,
            owner: r.owner.login,
            name: r.name,
            full_name: r.full_name,
            default_branch: r.default_branch.unwrap_or_else(|| "main".to_owned()),
            clone_url: r.clone_url.unwrap_or_default(),
            html_url: r.html_url,
            private: r.private,
        }
    }
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

/// An item of `GET /repos/{owner}/{repo}/issues` or `GET …/issues/{n}`.
#[derive(Debug, Deserialize)]
pub(crate) struct IssueJson {
    pub number: u64,
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    pub html_url: String,
    pub state: String,
    #[serde(default)]
    pub user: Option<UserRef>,
    #[serde(default)]
    pub labels: Vec<LabelJson>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub closed_at: Option<OffsetDateTime>,
    /// Present (an object) when the item is a pull request.
    #[serde(default)]
    pub pull_request: Option<serde::de::IgnoredAny>,
}

impl IssueJson {
    /// Whether this item of the issues list is a pull request.
    pub fn is_pull_request(&self) -> bool {
        self.pull_request.is_some()
    }
}

impl From<IssueJson> for Issue {
    fn from(i: IssueJson) -> Self {
        Issue {
            number: i.number,
            title: i.title,
            body: i.body.unwrap_or_default(),
            html_url: i.html_url,
            state: i.state,
            author: login_of(i.user),
            labels: i.labels.into_iter().map(Label::from).collect(),
            created_at: utc(i.created_at),
            updated_at: utc(i.updated_at),
            closed_at: i.closed_at.map(utc),
        }
    }
}

/// An issue comment.
#[derive(Debug, Deserialize)]
pub(crate) struct CommentJson {
    pub id: u64,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub user: Option<UserRef>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default)]
    pub html_url: Option<String>,
}

impl From<CommentJson> for Comment {
    fn from(c: CommentJson) -> Self {
        Comment {
            id: c.id,
            body: c.body.unwrap_or_default(),
            author: login_of(c.user),
            created_at: utc(c.created_at),
            html_url: c.html_url.unwrap_or_default(),
        }
    }
}

/// The `head` or `base` of a pull request.
#[derive(Debug, Deserialize)]
pub(crate) struct BranchJson {
    #[serde(rename = "ref")]
    pub ref_name: String,
}

/// A review of a pull request (`pull-request-review`).
#[derive(Debug, Deserialize)]
pub(crate) struct ReviewJson {
    pub id: u64,
    #[serde(default)]
    pub user: Option<UserRef>,
    pub state: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub html_url: Option<String>,
    /// Absent for a pending review.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub submitted_at: Option<OffsetDateTime>,
}

impl From<ReviewJson> for Review {
    fn from(r: ReviewJson) -> Self {
        Review {
            id: r.id,
            author: login_of(r.user),
            state: r.state,
            body: r.body.unwrap_or_default(),
            html_url: r.html_url.unwrap_or_default(),
            submitted_at: r.submitted_at.map(utc),
        }
    }
}

/// A review comment (`pull-request-review-comment`).
#[derive(Debug, Deserialize)]
pub(crate) struct ReviewCommentJson {
    pub id: u64,
    #[serde(default)]
    pub user: Option<UserRef>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub line: Option<u64>,
    #[serde(default)]
    pub original_line: Option<u64>,
    #[serde(default)]
    pub html_url: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default)]
    pub pull_request_review_id: Option<u64>,
}

impl From<ReviewCommentJson> for ReviewComment {
    fn from(c: ReviewCommentJson) -> Self {
        ReviewComment {
            id: c.id,
            author: login_of(c.user),
            body: c.body.unwrap_or_default(),
            path: c.path.unwrap_or_default(),
            line: c.line.or(c.original_line),
            html_url: c.html_url.unwrap_or_default(),
            created_at: utc(c.created_at),
            review_id: c.pull_request_review_id,
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

/// A pull request, list (`pull-request-simple`) or full shape.
#[derive(Debug, Deserialize)]
pub(crate) struct PullJson {
    pub number: u64,
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    pub html_url: String,
    pub state: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub merged_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub closed_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    pub head: BranchJson,
    pub base: BranchJson,
}

impl From<PullJson> for PullRequest {
    fn from(p: PullJson) -> Self {
        PullRequest {
            number: p.number,
            title: p.title,
            body: p.body.unwrap_or_default(),
            html_url: p.html_url,
            state: p.state,
            merged_at: p.merged_at.map(utc),
            closed_at: p.closed_at.map(utc),
            updated_at: utc(p.updated_at),
            head_ref: p.head.ref_name,
            base_ref: p.base.ref_name,
        }
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

    #[test]
    fn an_issue_with_nulls_and_missing_members_parses() {
        let json = r#"{"number": 7, "title": "t", "body": null, "html_url": "h", "state": "open",
            "user": null, "labels": ["bug", {"name": "agentry", "color": "6f42c1"}],
            "created_at": "2024-01-02T03:04:05Z", "updated_at": "2024-01-02T04:04:05+01:00"}"#;
        let issue: IssueJson = serde_json::from_str(json).unwrap();
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
    fn reviews_and_review_comments_with_nulls_parse() {
        let review: ReviewJson = serde_json::from_str(
            r#"{"id": 3, "user": null, "state": "PENDING", "body": null, "html_url": "h"}"#,
        )
        .unwrap();
        let review = Review::from(review);
        assert_eq!(
            (
                review.author.as_str(),
                review.body.as_str(),
                review.submitted_at
            ),
            ("ghost", "", None)
        );
        let comment: ReviewCommentJson = serde_json::from_str(
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
