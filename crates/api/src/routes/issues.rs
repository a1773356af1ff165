//! `GET /api/issues`, `POST /api/issues/sync`, `POST /api/issues/assign` (docs/contract.md#36-issues-view–#37-assign).

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, get, post, web};
use agentry_domain::AgentType;
use agentry_persistence::issues::{IssueView, IssueViewCursor};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::{Caller, MemberRole};
use crate::body::JsonBody;
use crate::dto::TaskDto;
use crate::error::{ApiError, ErrorBody};
use crate::query::Query;
use crate::routes::page::{Limit, OpaqueCursor};
use crate::routes::{
    Authorized, BodyErrors, ChangeErrors, CodeHostErrors, LookupErrors, TokenErrors,
    created_or_existing, cursor,
};
use crate::state::AppState;
use agentry_service::tasks::Assignment;
use agentry_service::views::IssuesView;

/// A label on an issue.
#[derive(Serialize, ToSchema)]
pub struct LabelDto {
    /// Name.
    pub name: String,
    /// Colour, six hex digits.
    pub color: String,
}

/// The task linked to an issue.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkedTaskDto {
    /// Task id.
    pub id: Uuid,
    /// Its state.
    #[schema(example = "queued")]
    pub state: String,
    /// Its pull request, once opened.
    pub pr_url: Option<String>,
}

/// An open issue of a connected repository, from the synced copy.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssueDto {
    /// The repository.
    pub repo_id: Uuid,
    /// Its normalised URL.
    pub repo_url: String,
    /// Issue number.
    pub number: i64,
    /// Title.
    pub title: String,
    /// Body (empty when the issue has none).
    pub body: String,
    /// The issue's page on the code host.
    pub html_url: String,
    /// The author's login.
    pub author: String,
    /// Current labels.
    pub labels: Vec<LabelDto>,
    /// Creation time on the code host.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last update on the code host.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The linked task, if the issue is assigned.
    pub task: Option<LinkedTaskDto>,
}

impl From<IssueView> for IssueDto {
    fn from(v: IssueView) -> Self {
        IssueDto {
            repo_id: v.repo_id,
            repo_url: v.repo_url.to_string(),
            number: v.issue.number,
            title: v.issue.title,
            body: v.issue.body,
            html_url: v.issue.html_url,
            author: v.issue.author,
            labels: v
                .issue
                .labels
                .into_iter()
                .map(|l| LabelDto {
                    name: l.name,
                    color: l.color,
                })
                .collect(),
            created_at: v.issue.created_at,
            updated_at: v.issue.updated_at,
            task: v.task.map(|t| LinkedTaskDto {
                id: t.id,
                state: t.state.to_string(),
                pr_url: t.pr_url,
            }),
        }
    }
}

/// A repository whose last sync failed.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncErrorDto {
    /// The repository.
    pub repo_id: Uuid,
    /// Why its last sync failed.
    pub message: String,
}

/// One page of the issues view.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssueListDto {
    /// Open issues: unassigned first, then most recently updated, then by repository URL
    /// and number; at most `limit`.
    pub issues: Vec<IssueDto>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// When each repository was last synced successfully (repository id → time).
    #[schema(value_type = Object)]
    pub synced_at: BTreeMap<Uuid, String>,
    /// Repositories whose last sync failed.
    pub errors: Vec<SyncErrorDto>,
}

/// Default page size of the issues view.
pub const DEFAULT_LIMIT: i64 = 100;
/// Largest page size of the issues view.
pub const MAX_LIMIT: i64 = 200;
/// The issues view's `limit`.
type PageLimit = Limit<DEFAULT_LIMIT, MAX_LIMIT>;

/// Encodes a position of the issues view as an opaque cursor.
pub fn encode_cursor(c: &IssueViewCursor) -> String {
    cursor::encode(format!(
        "{}:{}:{}:{}",
        u8::from(c.linked),
        cursor::micros(c.updated_at),
        c.number,
        c.repo_url
    ))
}

/// Decodes a cursor made by [`encode_cursor`]; anything else is refused.
pub fn decode_cursor(s: &str) -> Result<IssueViewCursor, ApiError> {
    let text = cursor::decode(s)?;
    let mut parts = text.splitn(4, ':');
    let mut next = || parts.next().ok_or_else(cursor::malformed);
    let linked = match next()? {
        "0" => false,
        "1" => true,
        _ => return Err(cursor::malformed()),
    };
    let updated_at = cursor::time(next()?)?;
    let number: i64 = cursor::field(next()?)?;
    let repo_url = next()?.to_owned();
    if repo_url.is_empty() || number < 1 {
        return Err(cursor::malformed());
    }
    Ok(IssueViewCursor {
        linked,
        updated_at,
        repo_url,
        number,
    })
}

/// What the view is asked for: the repository filter and the page.
struct ViewQuery {
    repo_id: Option<Uuid>,
    limit: i64,
    cursor: Option<IssueViewCursor>,
}

/// Reads one page of the issues view from the synced copy.
async fn issue_list(state: &AppState, view: ViewQuery) -> Result<IssueListDto, ApiError> {
    let ViewQuery {
        repo_id,
        limit,
        cursor,
    } = view;
    let IssuesView { page, sync_states } =
        state.service.issues_view(repo_id, limit, cursor).await?;
    let mut synced_at = BTreeMap::new();
    let mut errors = Vec::new();
    for (repo, sync) in sync_states {
        if let Some(at) = sync.synced_at {
            synced_at.insert(repo.id, crate::dto::rfc3339(at));
        }
        if let Some(message) = sync.error {
            errors.push(SyncErrorDto {
                repo_id: repo.id,
                message,
            });
        }
    }
    Ok(IssueListDto {
        issues: page.issues.into_iter().map(IssueDto::from).collect(),
        next_cursor: page.next.as_ref().map(encode_cursor),
        synced_at,
        errors,
    })
}

/// The view's query string: `repoId`, `limit` (1–200), `cursor` (`sync`: no cursor, the
/// first page).
fn view_query(req: &HttpRequest, paged: bool) -> Result<ViewQuery, ApiError> {
    let allowed: &[&str] = if paged {
        &["repoId", "limit", "cursor"]
    } else {
        &["repoId", "limit"]
    };
    let q = Query::parse(req.query_string(), allowed)?;
    let repo_id = q.uuid("repoId")?;
    let limit = PageLimit::read(&q)?;
    let cursor = q.get("cursor").map(decode_cursor).transpose()?;
    Ok(ViewQuery {
        repo_id,
        limit,
        cursor,
    })
}

/// Open issues of the connected repositories (or of one), with their linked tasks, from the
/// service's synced copy: it never waits on the code host. Cursor-paginated.
#[utoipa::path(
    tag = "issues",
    params(
        ("repoId" = Option<Uuid>, Query, description = "Only this repository"),
        PageLimit,
        OpaqueCursor,
    ),
    responses((status = 200, body = IssueListDto), LookupErrors),
)]
#[get("/issues")]
pub async fn list_issues(
    _caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<IssueListDto>, ApiError> {
    let view = view_query(&req, true)?;
    Ok(web::Json(issue_list(&state, view).await?))
}

/// Syncs the issues of every connected repository (or of one) now, then answers the first
/// page of the view.
#[utoipa::path(
    tag = "issues",
    params(
        ("repoId" = Option<Uuid>, Query, description = "Only this repository"),
        PageLimit,
    ),
    responses(
        (status = 200, body = IssueListDto),
        ChangeErrors,
        TokenErrors,
    ),
)]
#[post("/issues/sync")]
pub async fn sync_issues(
    _member: Authorized<MemberRole>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<IssueListDto>, ApiError> {
    let view = view_query(&req, false)?;
    let repo_id = view.repo_id;
    if let Some(id) = repo_id {
        // 404 before any code-host call.
        issue_list(
            &state,
            ViewQuery {
                repo_id: Some(id),
                limit: 1,
                cursor: None,
            },
        )
        .await?;
    }
    state.service.sync_issues(repo_id).await?;
    Ok(web::Json(issue_list(&state, view).await?))
}

/// An issue to assign. Unknown members are ignored.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignIssue {
    /// The issue's number (≥ 1).
    #[schema(minimum = 1)]
    pub issue_number: i64,
    /// A connected repository.
    pub repo_id: Uuid,
    /// The task's title (non-blank).
    #[schema(min_length = 1, max_length = 500, pattern = r"[^\s\u0085]")]
    pub title: String,
    /// The task's prompt (default empty).
    #[serde(default)]
    pub body: String,
    /// `claude-code` or `codex` (default: the repository's).
    #[schema(value_type = Option<crate::dto::names::AgentTypeName>, example = "claude-code")]
    pub agent_type: Option<AgentType>,
}

/// The task of an assignment.
#[derive(Serialize, ToSchema)]
pub struct AssignedDto {
    /// The issue's task.
    pub task: TaskDto,
    /// Whether it was created by this call.
    pub created: bool,
}

/// Assigns an issue: creates its coding task (201), or returns the task already linked to it
/// (200) without changing anything. The label and the one comment follow through the outbox.
/// The number must be an open issue of the repository (never a pull request): one the
/// synced view lacks is looked up with a sync of that repository first; 404 if the code
/// host does not list it either, and nothing is written.
#[utoipa::path(
    tag = "issues",
    request_body = AssignIssue,
    responses(
        (status = 201, description = "The task was created", body = AssignedDto),
        (status = 200, description = "The issue already had a task", body = AssignedDto),
        BodyErrors,
        (status = 404, description = "Unknown repository, or not an open issue of it", body = ErrorBody),
        TokenErrors,
        CodeHostErrors,
    ),
)]
#[post("/issues/assign")]
pub async fn assign_issue(
    Authorized { caller, body, .. }: Authorized<MemberRole, JsonBody<AssignIssue>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let AssignIssue {
        issue_number,
        repo_id,
        title,
        body,
        agent_type,
    } = body.0;
    let (task, created) = state
        .service
        .assign_issue(Assignment {
            repo_id,
            issue_number,
            title,
            body,
            agent_type,
        })
        .await?;
    if created {
        tracing::info!(task = %task.id, issue = issue_number, by = %caller.token_id, "issue assigned");
    }
    let dto = AssignedDto {
        task: task.into(),
        created,
    };
    Ok(created_or_existing(created, dto))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = IssueViewCursor {
            linked: true,
            updated_at: time::macros::datetime!(2026-01-02 03:04:05.123456 UTC),
            repo_url: "https://github.com/a-b/c.d".into(),
            number: 42,
        };
        assert_eq!(decode_cursor(&encode_cursor(&c)).ok(), Some(c));
        for bad in [
            "",
            "%%",
            "bm90IGEgY3Vyc29y",
            &cursor::encode("2:1:1:https://github.com/a/b"),
            &cursor::encode("0:x:1:https://github.com/a/b"),
            &cursor::encode("0:1:0:https://github.com/a/b"),
            &cursor::encode("0:1:1:"),
            &cursor::encode("0:1:1"),
            &cursor::encode(format!("0:{}:1:u", i128::MAX)),
        ] {
            assert_eq!(
                decode_cursor(bad).map_err(|e| e.code()).err(),
                Some("invalid_parameter"),
                "{bad}"
            );
        }
    }
}
