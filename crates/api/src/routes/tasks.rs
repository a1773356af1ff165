//! `GET /api/tasks`, `GET /api/tasks/{id}`, `POST /api/tasks/import`.

use actix_web::{HttpRequest, get, post, web};
use agentry_domain::{Role, TaskState, TaskType};
use agentry_persistence::tasks::{self, TaskCursor, TaskFilter};
use base64::Engine;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::auth::Caller;
use crate::body::{read_limited, require_content_type};
use crate::dto::{
    EventDto, ImportResultDto, IssueRefDto, RunDto, TaskDetailDto, TaskDto, TaskListDto,
};
use crate::error::{ApiError, ErrorBody};
use crate::import::{self, ImportError};
use crate::query::Query;
use crate::routes::path_uuid;
use crate::state::AppState;

/// Default page size of the task list.
pub const DEFAULT_LIMIT: i64 = 50;
/// Largest page size of the task list.
pub const MAX_LIMIT: i64 = 200;
/// Largest import body accepted over HTTP (the CLI has no limit).
pub const IMPORT_LIMIT: usize = 256 * 1024 * 1024;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Encodes a list position as an opaque cursor.
pub fn encode_cursor(c: &TaskCursor) -> String {
    let micros = c.created_at.unix_timestamp_nanos() / 1_000;
    B64.encode(format!("{micros}:{}", c.id))
}

/// Decodes a cursor made by [`encode_cursor`]; anything else is refused.
pub fn decode_cursor(s: &str) -> Result<TaskCursor, ApiError> {
    let bad =
        || ApiError::invalid_parameter("cursor", "malformed cursor; pass nextCursor unchanged");
    let text = String::from_utf8(B64.decode(s).map_err(|_| bad())?).map_err(|_| bad())?;
    let (micros, id) = text.split_once(':').ok_or_else(bad)?;
    let micros: i128 = micros.parse().map_err(|_| bad())?;
    let created_at =
        OffsetDateTime::from_unix_timestamp_nanos(micros.checked_mul(1_000).ok_or_else(bad)?)
            .map_err(|_| bad())?;
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(TaskCursor { created_at, id })
}

/// Lists tasks, newest first, with cursor pagination.
#[utoipa::path(
    tag = "tasks",
    params(
        ("state" = Option<String>, Query, description = "Only tasks in this state"),
        ("repoId" = Option<Uuid>, Query, description = "Only tasks of this repository"),
        ("taskType" = Option<String>, Query, description = "`coding` or `review`"),
        ("limit" = Option<i64>, Query, description = "Page size, 1 to 200 (default 50)"),
        ("cursor" = Option<String>, Query, description = "`nextCursor` of the previous page"),
    ),
    responses(
        (status = 200, body = TaskListDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = []))
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
        repo_id: q
            .get("repoId")
            .map(|v| path_uuid("repoId", v))
            .transpose()?,
        task_type: q.parsed::<TaskType>("taskType")?,
    };
    let limit = q.int_in("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT);
    let cursor = q.get("cursor").map(decode_cursor).transpose()?;
    let page = state
        .db(move |conn| Ok(tasks::list_tasks(conn, &filter, limit, cursor.as_ref())?))
        .await?;
    Ok(web::Json(TaskListDto {
        next_cursor: page.next.as_ref().map(encode_cursor),
        tasks: page.tasks.into_iter().map(TaskDto::from).collect(),
    }))
}

/// One task with its runs, state history, linked issue and review subtasks.
#[utoipa::path(
    tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, body = TaskDetailDto),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
#[get("/tasks/{id}")]
pub async fn get_task(
    _caller: Caller,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<web::Json<TaskDetailDto>, ApiError> {
    let id = path_uuid("id", &path)?;
    let detail = state
        .db(move |conn| {
            let task = tasks::find_task(conn, id)?
                .ok_or_else(|| ApiError::not_found(format!("task {id} not found")))?;
            let runs = tasks::task_runs(conn, id)?;
            let events = tasks::task_events(conn, id)?;
            let reviews = tasks::review_tasks(conn, id)?;
            Ok((task, runs, events, reviews))
        })
        .await?;
    let (task, runs, events, reviews) = detail;
    let issue = task.issue_number.map(|number| IssueRefDto {
        number,
        html_url: format!("{}/issues/{number}", task.repo_url),
    });
    Ok(web::Json(TaskDetailDto {
        task: TaskDto::from(task),
        runs: runs.into_iter().map(RunDto::from).collect(),
        events: events.into_iter().map(EventDto::from).collect(),
        issue,
        reviews: reviews.into_iter().map(TaskDto::from).collect(),
    }))
}

impl From<ImportError> for ApiError {
    fn from(e: ImportError) -> Self {
        match e {
            ImportError::BadLine { .. } => ApiError::invalid_request(e.to_string()),
            ImportError::Db(db) => ApiError::from(db),
        }
    }
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
    security(("bearer" = []))
)]
#[post("/tasks/import")]
pub async fn import_tasks(
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<web::Json<ImportResultDto>, ApiError> {
    caller.require(Role::Admin)?;
    require_content_type(&req, "application/x-ndjson")?;
    let body = read_limited(payload, IMPORT_LIMIT).await?;
    let outcome = state
        .db(move |conn| Ok(import::import(conn, &body)?))
        .await?;
    Ok(web::Json(ImportResultDto {
        imported: outcome.imported,
        skipped: outcome.skipped,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
            &B64.encode("12:not-a-uuid"),
            &B64.encode(format!("x:{}", c.id)),
        ] {
            assert_eq!(
                decode_cursor(bad).unwrap_err().code(),
                "invalid_parameter",
                "{bad}"
            );
        }
    }
}
