//! Pull-request tracking (docs/contract.md#55-pull-request-tracking–#56-webhook): which repositories the poller visits and where each
//! poll stands, the task of a pull request, and the one write that applies a pull request's
//! fate to its task.
//!
//! [`apply_pull_outcome`] is what both the poller and the webhook call: a compare-and-set
//! transition (through [`crate::tasks::transition_task`]) plus, for a merge, the outbox effect that
//! closes the linked issue, in one transaction. Of two actors that see the same merge (the
//! poller and a webhook, two replicas) exactly one applies it, so the issue is closed once.

use agentry_domain::{Task, TaskState, TaskType, Trigger};
use diesel::dsl::exists;
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, opt_from_db, opt_to_db};
use crate::error::touched;
use crate::fetch::Fetch;
use crate::outbox::{self, Action, NewEffect};
use crate::repos::{self, Repository};
use crate::schema::{repositories, tasks};
use crate::tasks::TransitionDetails;
use crate::{AnyConnection, DbError, write_tx};

/// The error message of a task whose pull request was closed without being merged, when the
/// caller gives none.
pub const CLOSED_WITHOUT_MERGE: &str = "the pull request was closed without being merged";

/// Where a repository's pull-request poll stands (`repositories.pulls_etag` and
/// `repositories.pulls_watermark`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PullPollState {
    /// The ETag of the first page of the last successful poll, sent as `If-None-Match`.
    pub etag: Option<String>,
    /// The newest `updated_at` among the pull requests seen by the last successful poll:
    /// the next poll reads pages only until it reaches pull requests not updated since.
    /// `None` before the first successful poll.
    pub watermark: Option<OffsetDateTime>,
    /// Before the first successful poll (no watermark): where that poll starts, a day
    /// before the oldest task of the repository waiting on its pull request (in
    /// `pr_opened`, or in a revision round) was created. An
    /// agent's pull request is newer than its task, so nothing of ours is older; without
    /// it a first poll would read the repository's whole pull-request history. `None` once
    /// there is a watermark.
    pub first_since: Option<OffsetDateTime>,
}

/// How far before its task's creation a first poll starts (clock skew between the code
/// host and this database).
const FIRST_POLL_MARGIN: time::Duration = time::Duration::DAY;

/// The tasks that wait on their pull request: coding or review tasks in `pr_opened`, and
/// coding tasks in a revision round (queued, provisioning or running from the round's first
/// attempt on, as [`agentry_domain::Revision::of`] says), whose merge or close the poller is
/// to see. Imported history waits on nothing (docs/contract.md#39-import). Every such task
/// carries its pull request's number, which lets a lookup by repository use the partial
/// index `tasks_pull_request`.
macro_rules! waiting_on_pull {
    () => {
        tasks::imported
            .eq(false)
            .and(tasks::pr_number.is_not_null())
            .and(
                tasks::state
                    .eq(TaskState::PrOpened.as_str())
                    .or(tasks::state
                        .eq_any(ROUND_STATES)
                        .and(tasks::revision_attempt.is_not_null())
                        .and(tasks::attempt.ge(tasks::revision_attempt.assume_not_null()))),
            )
    };
}

/// The states of a task in a revision round.
const ROUND_STATES: [&str; 3] = [
    TaskState::Queued.as_str(),
    TaskState::Provisioning.as_str(),
    TaskState::Running.as_str(),
];

/// The creation of the repository's oldest task waiting on its pull request, if any.
fn oldest_waiting(conn: &mut AnyConnection, repo: Uuid) -> Result<Option<OffsetDateTime>, DbError> {
    let at: Option<PrimitiveDateTime> = tasks::table
        .filter(tasks::repo_id.eq(repo.to_string()))
        .filter(waiting_on_pull!())
        .select(diesel::dsl::min(tasks::created_at))
        .first(conn)?;
    Ok(opt_from_db(at))
}

/// Where a repository's first poll starts: nowhere once it has a watermark, else a day
/// before its oldest waiting task.
fn first_since(
    conn: &mut AnyConnection,
    repo: Uuid,
    watermark: Option<OffsetDateTime>,
) -> Result<Option<OffsetDateTime>, DbError> {
    Ok(match watermark {
        Some(_) => None,
        None => oldest_waiting(conn, repo)?.map(|at| at - FIRST_POLL_MARGIN),
    })
}

/// Connected repositories with at least one task waiting on its pull request (in
/// `pr_opened`, or in a revision round), by URL, with their poll state. Disconnected
/// repositories are never polled, whatever their tasks, and imported history is not
/// tracked (docs/contract.md#39-import).
pub fn repos_to_poll(
    conn: &mut AnyConnection,
) -> Result<Vec<(Repository, PullPollState)>, DbError> {
    let waiting: Vec<(String, Option<String>, Option<PrimitiveDateTime>)> = repositories::table
        .filter(repositories::disconnected_at.is_null())
        .filter(exists(
            tasks::table
                .filter(tasks::repo_id.eq(repositories::id.nullable()))
                .filter(waiting_on_pull!()),
        ))
        .select((
            repositories::id,
            repositories::pulls_etag,
            repositories::pulls_watermark,
        ))
        .load(conn)?;
    if waiting.is_empty() {
        return Ok(Vec::new());
    }
    let mut states = std::collections::HashMap::with_capacity(waiting.len());
    for (id, etag, watermark) in waiting {
        let id = convert::uuid(&id)?;
        let watermark = opt_from_db(watermark);
        // Only a repository never polled looks its oldest waiting task up.
        let first_since = first_since(conn, id, watermark)?;
        states.insert(
            id,
            PullPollState {
                etag,
                watermark,
                first_since,
            },
        );
    }
    // The repository rows themselves come from `repos` (ordered by URL); one disconnected
    // between the two reads is simply left out.
    Ok(repos::list_connected(conn)?
        .into_iter()
        .filter_map(|repo| states.remove(&repo.id).map(|state| (repo, state)))
        .collect())
}

/// The poll state of one repository (connected or not). [`DbError::NotFound`] for an
/// unknown id.
pub fn pull_poll_state(conn: &mut AnyConnection, repo_id: Uuid) -> Result<PullPollState, DbError> {
    let (etag, watermark) = repositories::table
        .find(repo_id.to_string())
        .select((repositories::pulls_etag, repositories::pulls_watermark))
        .existing::<(Option<String>, Option<PrimitiveDateTime>)>(conn)?;
    let watermark = opt_from_db(watermark);
    Ok(PullPollState {
        etag,
        watermark,
        first_since: first_since(conn, repo_id, watermark)?,
    })
}

/// Stores a repository's poll state: the first page's ETag and the new watermark, exactly as
/// given (`None` clears). Call it only after a successful poll whose outcomes are stored, so
/// a failed poll leaves the watermark where it was and the next one reads the same pull
/// requests again. [`DbError::NotFound`] for an unknown id.
pub fn record_pull_poll(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    etag: Option<&str>,
    watermark: Option<OffsetDateTime>,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        touched(
            diesel::update(repositories::table.find(repo_id.to_string()))
                .set((
                    repositories::pulls_etag.eq(etag),
                    repositories::pulls_watermark.eq(opt_to_db(watermark)),
                ))
                .execute(conn)?,
        )
    })
}

/// The coding task that opened pull request `pr_number` in the repository (`tasks.pr_number`,
/// served by the partial index `tasks_pull_request`), if any. Imported tasks are never the
/// answer: they are history from another system, which agentry neither tracks nor revises
/// (docs/contract.md#39-import), whatever their state and number. Should several coding
/// tasks carry the number (a retried task), the one in `pr_opened` wins, then the newest.
pub fn task_of_pull(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    pr_number: i64,
) -> Result<Option<Task>, DbError> {
    let candidates: Vec<(String, String)> = tasks::table
        .filter(tasks::repo_id.eq(repo_id.to_string()))
        .filter(tasks::pr_number.eq(pr_number))
        .filter(tasks::task_type.eq(TaskType::Coding.as_str()))
        .filter(tasks::imported.eq(false))
        .order((tasks::created_at.desc(), tasks::id.desc()))
        .select((tasks::id, tasks::state))
        .load(conn)?;
    let chosen = candidates
        .iter()
        .find(|(_, state)| state == TaskState::PrOpened.as_str())
        .or_else(|| candidates.first());
    match chosen {
        Some((id, _)) => crate::tasks::find_task(conn, convert::uuid(id)?),
        None => Ok(None),
    }
}

/// Applies a pull request's fate to its task, in one transaction (nested as a savepoint when
/// the caller has one open):
///
/// - `trigger` ([`Trigger::PullRequestMerged`] or [`Trigger::PullRequestClosed`]) is applied
///   as [`tasks::transition_task`](crate::tasks::transition_task) does: compare-and-set on
///   the task's state and attempt, the task event with `reason`, the cost rollups;
///   `error_message` (for a close; [`CLOSED_WITHOUT_MERGE`] when `None`) becomes the task's;
/// - for a merge of a task with an issue number and a repository, the outbox effect
///   [`Action::CloseIssue`] of its issue is enqueued.
///
/// The task is to be waiting on its pull request: in `pr_opened`, or in a revision round,
/// which the merge or close ends (its agent is the caller's to stop once this is
/// committed). Returns `Ok(Some(task after))` when this call applied it, and `Ok(None)` when
/// the task waits no more (typically another actor, the poller or a webhook on this or
/// another replica, applied it first); nothing is written then. [`DbError::NotFound`] for an unknown
/// task; [`DbError::Conflict`] for any other trigger.
pub fn apply_pull_outcome(
    conn: &mut AnyConnection,
    task_id: Uuid,
    trigger: Trigger,
    reason: &str,
    error_message: Option<&str>,
    now: OffsetDateTime,
) -> Result<Option<Task>, DbError> {
    let error_message = match trigger {
        Trigger::PullRequestMerged => None,
        Trigger::PullRequestClosed => Some(error_message.unwrap_or(CLOSED_WITHOUT_MERGE)),
        other => {
            return Err(DbError::Conflict(format!(
                "{} is not the outcome of a pull request",
                other.as_str()
            )));
        }
    };
    let details = TransitionDetails {
        reason: Some(reason.to_owned()),
        error_message: error_message.map(str::to_owned),
        pull_request: None,
    };
    let applied = write_tx(conn, |conn| {
        let (task, _) = crate::tasks::transition_task(conn, task_id, trigger, &details, now)?;
        if trigger == Trigger::PullRequestMerged
            && let (Some(repo_id), Some(issue_number)) = (task.repo_id, task.issue_number)
        {
            let effect = NewEffect {
                task_id: Some(task.id),
                repo_id,
                action: Action::CloseIssue { issue_number },
            };
            outbox::enqueue(conn, &effect, now)?;
        }
        Ok(task)
    });
    match applied {
        Ok(task) => Ok(Some(task)),
        Err(DbError::InvalidTransition(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
