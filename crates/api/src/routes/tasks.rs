//! `GET /api/tasks`, `GET /api/tasks/{id}`, `POST /api/tasks`, `POST /api/tasks/import`,
//! `POST /api/tasks/{id}/cancel`, `POST /api/tasks/{id}/retry`, `GET /api/tasks/{id}/log`,
//! `GET /api/tasks/{id}/calls`.

use actix_web::{HttpRequest, HttpResponse, get, post, web};
use agentry_domain::{AgentType, TaskState, TaskType, Usd};
use agentry_persistence::tasks::{TaskCursor, TaskFilter};
use serde::Deserialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::{AdminRole, AnyRole, Caller, MemberRole};
use crate::body::{JsonBody, read_limited, require_content_type};
use crate::dto::names::{AgentTypeName, TaskStateName, TaskTypeName};
use crate::dto::{
    EgressBlockedDto, EventDto, FeedbackDto, ImportResultDto, IssueRefDto, ModelCallDto,
    ModelCallListDto, RunDto, TaskDetailDto, TaskDto, TaskListDto, TaskSummaryDto,
};
use crate::error::{ApiError, ErrorBody};
use crate::query::Query;
use crate::routes::page::{Limit, OpaqueCursor};
use crate::routes::{
    Authorized, BodyChangeErrors, LookupErrors, QueryErrors, Target, TaskId, TransitionErrors,
    cursor,
};
use crate::state::AppState;
use agentry_service::tasks::{NewCodingTask, OutputTail};
use agentry_service::views::TaskDetail;

/// Default page size of the task list.
pub const DEFAULT_LIMIT: i64 = 50;
/// Largest page size of the task list.
pub const MAX_LIMIT: i64 = 200;
/// The task list's `limit`.
type PageLimit = Limit<DEFAULT_LIMIT, MAX_LIMIT>;
/// Largest import body accepted over HTTP (the CLI has no limit).
pub const IMPORT_LIMIT: usize = 256 * 1024 * 1024;

/// Encodes a list position as an opaque cursor.
pub fn encode_cursor(c: &TaskCursor) -> String {
    cursor::encode(format!("{}:{}", cursor::micros(c.created_at), c.id))
}

/// Decodes a cursor made by [`encode_cursor`]; anything else is refused.
pub fn decode_cursor(s: &str) -> Result<TaskCursor, ApiError> {
    let text = cursor::decode(s)?;
    let (micros, id) = text.split_once(':').ok_or_else(cursor::malformed)?;
    Ok(TaskCursor {
        created_at: cursor::time(micros)?,
        id: cursor::field(id)?,
    })
}

/// Lists tasks, newest first, with cursor pagination.
#[utoipa::path(
    tag = "tasks",
    params(
        ("state" = Option<TaskStateName>, Query, description = "Only tasks in this state"),
        ("repoId" = Option<Uuid>, Query, description = "Only tasks of this repository"),
        ("taskType" = Option<TaskTypeName>, Query, description = "`coding` or `review`"),
        PageLimit,
        OpaqueCursor,
    ),
    responses((status = 200, body = TaskListDto), QueryErrors),
)]
#[get("/tasks")]
pub async fn list_tasks(
    _caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<TaskListDto>, ApiError> {
    let q = Query::parse(
        req.query_string(),
        &["state", "repoId", "taskType", "limit", "cursor"],
    )?;
    let filter = TaskFilter {
        state: q.parsed::<TaskState>("state")?,
        repo_id: q.uuid("repoId")?,
        task_type: q.parsed::<TaskType>("taskType")?,
    };
    let limit = PageLimit::read(&q)?;
    let cursor = q.get("cursor").map(decode_cursor).transpose()?;
    let page = state.service.tasks(filter, limit, cursor).await?;
    Ok(web::Json(TaskListDto {
        next_cursor: page.next.as_ref().map(encode_cursor),
        tasks: page.tasks.into_iter().map(TaskSummaryDto::from).collect(),
    }))
}

/// `/api/tasks/import` is not a task: a GET of it is answered 405 (it takes POST only), as
/// the document lists it, rather than as a malformed task id.
fn not_the_import_path(ctx: &actix_web::guard::GuardContext<'_>) -> bool {
    ctx.head().uri.path() != "/api/tasks/import"
}

/// One task with its runs, state history, linked issue and review subtasks.
#[utoipa::path(
    tag = "tasks",
    params(TaskId),
    responses((status = 200, body = TaskDetailDto), LookupErrors),
)]
#[get("/tasks/{id}", guard = "not_the_import_path")]
pub async fn get_task(
    Target { id, .. }: Target<AnyRole, TaskId>,
    state: web::Data<AppState>,
) -> Result<web::Json<TaskDetailDto>, ApiError> {
    let TaskDetail {
        task,
        runs,
        events,
        reviews,
        egress_blocked: blocked,
        run_triggers,
        feedback,
    } = state.service.task_detail(id).await?;
    let mut triggers: std::collections::HashMap<_, _> = run_triggers.into_iter().collect();
    let issue = task.issue_number.map(|number| IssueRefDto {
        number,
        html_url: format!("{}/issues/{number}", task.repo_url),
    });
    Ok(web::Json(TaskDetailDto {
        task: TaskDto::from(task),
        runs: runs
            .into_iter()
            .map(|r| {
                let trigger = triggers.remove(&r.id);
                RunDto::with_trigger(r, trigger)
            })
            .collect(),
        events: events.into_iter().map(EventDto::from).collect(),
        issue,
        reviews: reviews.into_iter().map(TaskSummaryDto::from).collect(),
        egress_blocked: blocked.into_iter().map(EgressBlockedDto::from).collect(),
        feedback: feedback.into_iter().map(FeedbackDto::from).collect(),
    }))
}

/// The model calls of a task's runs as the model gateway metered them (time, model,
/// tokens, cost, status, duration), oldest first by attempt; runs that did not go through
/// the gateway (unsandboxed) have none.
#[utoipa::path(
    tag = "tasks",
    params(
        TaskId,
        ("attempt" = Option<i32>, Query, minimum = 1,
            description = "Only the calls of this attempt"),
    ),
    responses((status = 200, body = ModelCallListDto), LookupErrors),
)]
#[get("/tasks/{id}/calls")]
pub async fn task_calls(
    Target { id, .. }: Target<AnyRole, TaskId>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<ModelCallListDto>, ApiError> {
    let q = Query::parse(req.query_string(), &["attempt"])?;
    let attempt = q
        .int_in("attempt", 1, i64::from(i32::MAX))?
        .and_then(|n| i32::try_from(n).ok());
    let calls = state.service.task_calls(id, attempt).await?;
    let mut total = Some(Usd::ZERO);
    for call in &calls {
        total = match (total, call.cost_usd) {
            (Some(sum), Some(cost)) => sum.checked_add(cost),
            _ => None,
        };
    }
    Ok(web::Json(ModelCallListDto {
        calls: calls.into_iter().map(ModelCallDto::from).collect(),
        total_cost_usd: total.map(|t| t.to_string()),
    }))
}

pub use agentry_service::tasks::{MAX_PROMPT_BYTES, MAX_TITLE_CHARS};

/// A manual coding task. Unknown members are ignored.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateTask {
    /// A connected repository.
    pub repo_id: Uuid,
    /// The task's title (non-blank, at most 500 characters).
    #[schema(min_length = 1, max_length = 500, pattern = r"[^\s\u0085]")]
    pub title: String,
    /// The instructions for the agent (at most 256 KiB; default empty).
    #[serde(default)]
    #[schema(max_length = 262144)]
    pub prompt: String,
    /// `claude-code` or `codex` (default: the repository's).
    #[schema(value_type = Option<AgentTypeName>, example = "claude-code")]
    pub agent_type: Option<AgentType>,
}

/// Creates a manual coding task in `queued` (member).
#[utoipa::path(
    tag = "tasks",
    request_body = CreateTask,
    responses((status = 201, body = TaskDto), BodyChangeErrors),
)]
#[post("/tasks")]
pub async fn create_task(
    Authorized { caller, body, .. }: Authorized<MemberRole, JsonBody<CreateTask>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let CreateTask {
        repo_id,
        title,
        prompt,
        agent_type,
    } = body.0;
    let task = state
        .service
        .create_task(NewCodingTask {
            repo_id,
            title,
            prompt,
            agent_type,
        })
        .await?;
    tracing::info!(task = %task.id, by = %caller.token_id, "task created");
    Ok(HttpResponse::Created().json(TaskDto::from(task)))
}

/// Cancels a queued, provisioning or running task (member); a running agent's process group
/// is killed. Any other state → 409 `invalid_transition`.
#[utoipa::path(
    tag = "tasks",
    params(TaskId),
    responses((status = 200, body = TaskDto), TransitionErrors),
)]
#[post("/tasks/{id}/cancel")]
pub async fn cancel_task(
    Target { caller, id, .. }: Target<MemberRole, TaskId>,
    state: web::Data<AppState>,
) -> Result<web::Json<TaskDto>, ApiError> {
    let reason = format!("cancelled by token {}", caller.token_id);
    let task = state.service.cancel_task(id, reason).await?;
    tracing::info!(task = %id, by = %caller.token_id, "task cancelled");
    Ok(web::Json(task.into()))
}

/// Queues a failed or cancelled task again with its attempt + 1 (member). Its earlier runs'
/// costs stay: the new run's cost adds to them.
#[utoipa::path(
    tag = "tasks",
    params(TaskId),
    responses((status = 200, body = TaskDto), TransitionErrors),
)]
#[post("/tasks/{id}/retry")]
pub async fn retry_task(
    Target { caller, id, .. }: Target<MemberRole, TaskId>,
    state: web::Data<AppState>,
) -> Result<web::Json<TaskDto>, ApiError> {
    let reason = format!("retried by token {}", caller.token_id);
    let task = state.service.retry_task(id, reason).await?;
    tracing::info!(task = %id, attempt = task.attempt, by = %caller.token_id, "task retried");
    Ok(web::Json(task.into()))
}

/// The agent output of the task's latest run as text: the live output while a run is in
/// progress on this replica, else the stored log of the last recorded run; either way at
/// most its last 8 MiB. The header
/// `X-Agentry-Log-Truncated: true` says the head of an oversized output was dropped.
#[utoipa::path(
    tag = "tasks",
    params(TaskId),
    responses(
        (status = 200, content_type = "text/plain", body = String),
        LookupErrors,
    ),
)]
#[get("/tasks/{id}/log")]
pub async fn task_log(
    Target { id, .. }: Target<AnyRole, TaskId>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let Some(OutputTail { content, truncated }) = state.service.task_output(id).await? else {
        return Err(ApiError::not_found(format!("task {id} has no run log yet")));
    };
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header(("X-Agentry-Log-Truncated", truncated.to_string()))
        .body(content))
}

/// Imports historical task records (JSON Lines, `application/x-ndjson`): all lines are
/// validated first; one bad line rejects the whole import, naming the line.
#[utoipa::path(
    tag = "tasks",
    request_body(content = String, content_type = "application/x-ndjson",
        description = "One task record per line"),
    responses(
        (status = 200, body = ImportResultDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody),
    ),
)]
#[post("/tasks/import")]
pub async fn import_tasks(
    _admin: Authorized<AdminRole>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<web::Json<ImportResultDto>, ApiError> {
    require_content_type(&req, "application/x-ndjson")?;
    let body = read_limited(payload, IMPORT_LIMIT).await?;
    let outcome = state.service.import(body.to_vec()).await?;
    Ok(web::Json(ImportResultDto {
        imported: outcome.imported,
        skipped: outcome.skipped,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::OffsetDateTime;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = TaskCursor {
            created_at: OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_000)
                .unwrap(),
            id: Uuid::new_v4(),
        };
        assert_eq!(decode_cursor(&encode_cursor(&c)).unwrap(), c);
        for bad in [
            "",
            "!!",
            "bm9wZQ",
            &cursor::encode("12:not-a-uuid"),
            &cursor::encode(format!("x:{}", c.id)),
        ] {
            assert_eq!(
                decode_cursor(bad).unwrap_err().code(),
                "invalid_parameter",
                "{bad}"
            );
        }
    }
}
