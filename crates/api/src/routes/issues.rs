//! `GET /api/issues`, `POST /api/issues/sync`, `POST /api/issues/assign` (SPEC §3.6–3.7).

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, get, post, web};
use agentry_domain::{AgentType, Role};
use agentry_persistence::issues::{self, IssueView};
use agentry_persistence::repos;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::codehost;
use crate::dto::TaskDto;
use crate::error::{ApiError, ErrorBody};
use crate::query::Query;
use crate::state::AppState;

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

/// The issues view.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssueListDto {
    /// Open issues: unassigned first, then most recently updated.
    pub issues: Vec<IssueDto>,
    /// When each repository was last synced successfully (repository id → time).
    #[schema(value_type = Object)]
    pub synced_at: BTreeMap<Uuid, String>,
    /// Repositories whose last sync failed.
    pub errors: Vec<SyncErrorDto>,
}

/// Reads the issues view from the synced copy.
async fn issue_list(state: &AppState, repo_id: Option<Uuid>) -> Result<IssueListDto, ApiError> {
    state
        .db(move |conn| {
            let states = repos::issue_sync_states(conn)?;
            if let Some(id) = repo_id
                && !states.iter().any(|(r, _)| r.id == id)
            {
                return Err(ApiError::not_found(format!(
                    "repository {id} is not connected"
                )));
            }
            let list = issues::open_issues(conn, repo_id)?;
            let mut synced_at = BTreeMap::new();
            let mut errors = Vec::new();
            for (repo, sync) in states {
                if repo_id.is_some_and(|id| id != repo.id) {
                    continue;
                }
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
                issues: list.into_iter().map(IssueDto::from).collect(),
                synced_at,
                errors,
            })
        })
        .await
}

fn repo_filter(req: &HttpRequest) -> Result<Option<Uuid>, ApiError> {
    let q = Query::parse(req.query_string(), &["repoId"])?;
    q.get("repoId")
        .map(|v| {
            Uuid::parse_str(v).map_err(|_| ApiError::invalid_parameter("repoId", "must be a UUID"))
        })
        .transpose()
}

/// Open issues of the connected repositories (or of one), with their linked tasks, from the
/// service's synced copy: it never waits on the code host.
#[utoipa::path(
    tag = "issues",
    params(("repoId" = Option<Uuid>, Query, description = "Only this repository")),
    responses(
        (status = 200, body = IssueListDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
#[get("/issues")]
pub async fn list_issues(
    _caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<IssueListDto>, ApiError> {
    let repo_id = repo_filter(&req)?;
    Ok(web::Json(issue_list(&state, repo_id).await?))
}

/// Syncs the issues of every connected repository (or of one) now, then answers the view.
#[utoipa::path(
    tag = "issues",
    params(("repoId" = Option<Uuid>, Query, description = "Only this repository")),
    responses(
        (status = 200, body = IssueListDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 412, description = "No CODEHOST_TOKEN stored", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
#[post("/issues/sync")]
pub async fn sync_issues(
    caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<IssueListDto>, ApiError> {
    caller.require(Role::Member)?;
    let repo_id = repo_filter(&req)?;
    if let Some(id) = repo_id {
        // 404 before any code-host call.
        issue_list(&state, Some(id)).await?;
    }
    codehost::sync_issues(&state, repo_id).await?;
    Ok(web::Json(issue_list(&state, repo_id).await?))
}

/// An issue to assign. Unknown members are ignored.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignIssue {
    /// The issue's number (≥ 1).
    pub issue_number: i64,
    /// A connected repository.
    pub repo_id: Uuid,
    /// The task's title (non-blank).
    pub title: String,
    /// The task's prompt (default empty).
    #[serde(default)]
    pub body: String,
    /// `claude-code` or `codex` (default: the repository's).
    #[schema(value_type = Option<String>, example = "claude-code")]
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
#[utoipa::path(
    tag = "issues",
    request_body = AssignIssue,
    responses(
        (status = 201, description = "The task was created", body = AssignedDto),
        (status = 200, description = "The issue already had a task", body = AssignedDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
#[post("/issues/assign")]
pub async fn assign_issue(
    caller: Caller,
    state: web::Data<AppState>,
    body: JsonBody<AssignIssue>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Role::Member)?;
    let AssignIssue {
        issue_number,
        repo_id,
        title,
        body,
        agent_type,
    } = body.0;
    if issue_number < 1 {
        return Err(ApiError::invalid_parameter(
            "issueNumber",
            "must be an integer of at least 1",
        ));
    }
    let title = crate::routes::tasks::task_title(&title)?;
    let (task, created) = state
        .db(move |conn| {
            let repo = crate::routes::tasks::connected_repository(conn, repo_id)?;
            let agent = agent_type.unwrap_or(repo.settings.agent_type);
            Ok(codehost::assign(
                conn,
                &repo,
                issue_number,
                &title,
                &body,
                agent,
                agentry_persistence::now(),
            )?)
        })
        .await?;
    if created {
        tracing::info!(task = %task.id, issue = issue_number, by = %caller.token_id, "issue assigned");
        state.codehost.wake_outbox();
        state.runs.wake();
    }
    let dto = AssignedDto {
        task: task.into(),
        created,
    };
    Ok(if created {
        HttpResponse::Created().json(dto)
    } else {
        HttpResponse::Ok().json(dto)
    })
}
