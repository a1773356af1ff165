//! Revisions (docs/contract.md#57-revisions): the review feedback that asks for changes on a
//! pull request agentry opened, kept once per code-host id, the quiet period before a round
//! starts, and why each run happened.
//!
//! The service decides what counts as feedback and composes what agentry says on the code
//! host; these functions store it, inside the caller's transaction (each goes through
//! [`write_tx`](crate::write_tx) or is a single statement, so it nests as a savepoint).

use agentry_domain::Task;
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::connection::insert_once;
use crate::convert::{self, from_db, opt_text, text, to_db};
use crate::error::touched;
use crate::fetch::Fetch;
use crate::schema::{revision_feedback, task_runs, tasks};
use crate::{AnyConnection, DbError};

/// Where a piece of feedback comes from; stored as `review`, `issue_comment`,
/// `review_comment` or `agent_review`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeedbackSource {
    /// A pull-request review submitted with "changes requested".
    Review,
    /// A comment on the pull request's conversation that mentions agentry.
    IssueComment,
    /// A comment on a line of the pull request's diff that mentions agentry.
    ReviewComment,
    /// The findings of agentry's own review agent (repository setting
    /// `reviseOnAgentReview`).
    AgentReview,
}

agentry_domain::wire_enum!(FeedbackSource, "feedback source", [
    Review => "review",
    IssueComment => "issue_comment",
    ReviewComment => "review_comment",
    AgentReview => "agent_review",
]);

/// What became of a piece of feedback; stored as `waiting`, `taken`, `over_limit` or
/// `dropped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeedbackOutcome {
    /// It waits for the next revision round.
    Waiting,
    /// A revision round took it (`round_attempt` says which).
    Taken,
    /// The repository's `maxRevisions` was reached: nothing runs for it.
    OverLimit,
    /// The pull request was merged or closed before a round took it.
    Dropped,
}

agentry_domain::wire_enum!(FeedbackOutcome, "feedback outcome", [
    Waiting => "waiting",
    Taken => "taken",
    OverLimit => "over_limit",
    Dropped => "dropped",
]);

/// Feedback to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFeedback {
    /// The repository.
    pub repo_id: Uuid,
    /// Where it comes from.
    pub source: FeedbackSource,
    /// Its id on the code host (a review task's id for [`FeedbackSource::AgentReview`]).
    pub external_id: String,
    /// The coding task whose pull request it is on.
    pub task_id: Uuid,
    /// The pull request.
    pub pr_number: i64,
    /// Who wrote it (a code-host login; `agentry` for its own review agent).
    pub author: String,
    /// What it says.
    pub body: String,
    /// The file a review comment is on.
    pub path: Option<String>,
    /// The line a review comment is on.
    pub line: Option<i64>,
    /// Its web address.
    pub url: String,
}

/// Recorded feedback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// Where it comes from.
    pub source: FeedbackSource,
    /// Its id on the code host.
    pub external_id: String,
    /// The pull request.
    pub pr_number: i64,
    /// Who wrote it.
    pub author: String,
    /// What it says.
    pub body: String,
    /// The file a review comment is on.
    pub path: Option<String>,
    /// The line a review comment is on.
    pub line: Option<i64>,
    /// Its web address.
    pub url: String,
    /// When agentry received it.
    pub received_at: OffsetDateTime,
    /// The first attempt of the revision round that took it.
    pub round_attempt: Option<i32>,
    /// What became of it.
    pub outcome: FeedbackOutcome,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = revision_feedback)]
struct FeedbackRow {
    source: String,
    external_id: String,
    pr_number: i64,
    author: String,
    body: String,
    path: Option<String>,
    line: Option<i64>,
    url: String,
    received_at: PrimitiveDateTime,
    round_attempt: Option<i32>,
    outcome: String,
}

impl TryFrom<FeedbackRow> for Feedback {
    type Error = DbError;

    fn try_from(r: FeedbackRow) -> Result<Feedback, DbError> {
        Ok(Feedback {
            source: r.source.parse()?,
            external_id: r.external_id,
            pr_number: r.pr_number,
            author: r.author,
            body: r.body,
            path: r.path,
            line: r.line,
            url: r.url,
            received_at: from_db(r.received_at),
            round_attempt: r.round_attempt,
            outcome: r.outcome.parse()?,
        })
    }
}

/// Whether feedback with this key is already recorded (so the poller need not ask the code
/// host about its author again).
pub fn is_recorded(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    source: FeedbackSource,
    external_id: &str,
) -> Result<bool, DbError> {
    let found = revision_feedback::table
        .find((repo_id.to_string(), source.as_str(), external_id))
        .select(revision_feedback::external_id)
        .first::<String>(conn)
        .optional()?;
    Ok(found.is_some())
}

/// Records feedback as `outcome`, unless feedback with its key is already there: `false`
/// then, and nothing changes. A concurrent insert of the same key (another replica, the
/// webhook and the poller at once) also gives `false` and leaves the caller's transaction
/// usable.
pub fn insert(
    conn: &mut AnyConnection,
    new: &NewFeedback,
    outcome: FeedbackOutcome,
    now: OffsetDateTime,
) -> Result<bool, DbError> {
    if is_recorded(conn, new.repo_id, new.source, &new.external_id)? {
        return Ok(false);
    }
    insert_once(conn, |conn| {
        diesel::insert_into(revision_feedback::table)
            .values((
                revision_feedback::repo_id.eq(new.repo_id.to_string()),
                revision_feedback::source.eq(new.source.as_str()),
                revision_feedback::external_id.eq(&new.external_id),
                revision_feedback::task_id.eq(new.task_id.to_string()),
                revision_feedback::pr_number.eq(new.pr_number),
                revision_feedback::author.eq(text(&new.author)),
                revision_feedback::body.eq(text(&new.body)),
                revision_feedback::path.eq(opt_text(new.path.as_deref())),
                revision_feedback::line.eq(new.line),
                revision_feedback::url.eq(text(&new.url)),
                revision_feedback::received_at.eq(to_db(now)),
                revision_feedback::round_attempt.eq(None::<i32>),
                revision_feedback::outcome.eq(outcome.as_str()),
            ))
            .execute(conn)
    })
}

/// Locks the task's row until the caller's transaction ends (PostgreSQL; SQLite's writer
/// lock already serialises), so decisions on its feedback (is this the first over the
/// limit?) see every earlier one. `NotFound` when there is no such task.
pub fn lock_task(conn: &mut AnyConnection, task_id: Uuid) -> Result<(), DbError> {
    touched(
        diesel::update(tasks::table.find(task_id.to_string()))
            .set(tasks::updated_at.eq(tasks::updated_at))
            .execute(conn)?,
    )
}

/// How many of the task's feedback have `outcome`.
pub fn count(
    conn: &mut AnyConnection,
    task_id: Uuid,
    outcome: FeedbackOutcome,
) -> Result<i64, DbError> {
    Ok(revision_feedback::table
        .filter(revision_feedback::task_id.eq(task_id.to_string()))
        .filter(revision_feedback::outcome.eq(outcome.as_str()))
        .count()
        .get_result(conn)?)
}

/// Sets when the task's next revision round may start (the end of the quiet period after
/// its latest feedback).
pub fn set_due(
    conn: &mut AnyConnection,
    task_id: Uuid,
    due_at: Option<OffsetDateTime>,
) -> Result<(), DbError> {
    diesel::update(tasks::table.find(task_id.to_string()))
        .set(tasks::revision_due_at.eq(due_at.map(to_db)))
        .execute(conn)?;
    Ok(())
}

/// The tasks whose quiet period ended by `now`, at most `limit`, earliest first.
pub fn due_tasks(
    conn: &mut AnyConnection,
    now: OffsetDateTime,
    limit: i64,
) -> Result<Vec<Uuid>, DbError> {
    let ids: Vec<String> = tasks::table
        .filter(tasks::revision_due_at.le(to_db(now)))
        .order(tasks::revision_due_at.asc())
        .select(tasks::id)
        .limit(limit)
        .load(conn)?;
    ids.iter().map(|id| convert::uuid(id)).collect()
}

/// The earliest time a task's quiet period ends, if any waits.
pub fn next_due(conn: &mut AnyConnection) -> Result<Option<OffsetDateTime>, DbError> {
    let at: Option<Option<PrimitiveDateTime>> = tasks::table
        .filter(tasks::revision_due_at.is_not_null())
        .order(tasks::revision_due_at.asc())
        .select(tasks::revision_due_at)
        .first(conn)
        .optional()?;
    Ok(at.flatten().map(from_db))
}

/// Which of a task's feedback to read.
enum Which {
    All,
    Outcome(FeedbackOutcome),
    Round(i32),
}

/// The task's feedback that `which` selects, oldest first.
fn load(conn: &mut AnyConnection, task_id: Uuid, which: Which) -> Result<Vec<Feedback>, DbError> {
    let mut query = revision_feedback::table
        .filter(revision_feedback::task_id.eq(task_id.to_string()))
        .order((
            revision_feedback::received_at.asc(),
            revision_feedback::external_id.asc(),
        ))
        .select(FeedbackRow::as_select())
        .into_boxed();
    query = match which {
        Which::All => query,
        Which::Outcome(outcome) => query.filter(revision_feedback::outcome.eq(outcome.as_str())),
        Which::Round(attempt) => query.filter(revision_feedback::round_attempt.eq(attempt)),
    };
    query.load_as(conn)
}

/// The task's feedback with `outcome`, oldest first.
pub fn with_outcome(
    conn: &mut AnyConnection,
    task_id: Uuid,
    outcome: FeedbackOutcome,
) -> Result<Vec<Feedback>, DbError> {
    load(conn, task_id, Which::Outcome(outcome))
}

/// The feedback the revision round that started at `round_attempt` took, oldest first.
pub fn of_round(
    conn: &mut AnyConnection,
    task_id: Uuid,
    round_attempt: i32,
) -> Result<Vec<Feedback>, DbError> {
    load(conn, task_id, Which::Round(round_attempt))
}

/// All of the task's feedback, oldest first.
pub fn of_task(conn: &mut AnyConnection, task_id: Uuid) -> Result<Vec<Feedback>, DbError> {
    load(conn, task_id, Which::All)
}

/// Moves every waiting feedback of the task to `outcome` (with `round_attempt` for
/// [`FeedbackOutcome::Taken`]); returns how many moved.
pub fn settle_waiting(
    conn: &mut AnyConnection,
    task_id: Uuid,
    outcome: FeedbackOutcome,
    round_attempt: Option<i32>,
) -> Result<usize, DbError> {
    Ok(diesel::update(
        revision_feedback::table
            .filter(revision_feedback::task_id.eq(task_id.to_string()))
            .filter(revision_feedback::outcome.eq(FeedbackOutcome::Waiting.as_str())),
    )
    .set((
        revision_feedback::outcome.eq(outcome.as_str()),
        revision_feedback::round_attempt.eq(round_attempt),
    ))
    .execute(conn)?)
}

/// Why a run happened; stored as `assignment`, `retry` or `revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunTriggerKind {
    /// The task's first attempt.
    Assignment,
    /// A later attempt: a user's retry or a recovery after a lost run.
    Retry,
    /// A revision round.
    Revision,
}

agentry_domain::wire_enum!(RunTriggerKind, "run trigger", [
    Assignment => "assignment",
    Retry => "retry",
    Revision => "revision",
]);

/// Why a run happened, with the feedback that started a revision round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTrigger {
    /// Assignment, retry or revision.
    pub kind: RunTriggerKind,
    /// The web address of the round's first feedback (revisions).
    pub url: Option<String>,
    /// Its author (revisions).
    pub author: Option<String>,
}

/// Why the run of `attempt` of `task` happened, from the task as it is now: a revision when
/// the task's latest revision round started at or before `attempt` (a retry clears the
/// round), a retry for any other attempt after the first.
pub fn trigger_of(
    conn: &mut AnyConnection,
    task: &Task,
    attempt: i32,
) -> Result<RunTrigger, DbError> {
    match task.revision_attempt {
        Some(round) if attempt >= round => {
            let first = of_round(conn, task.id, round)?.into_iter().next();
            Ok(RunTrigger {
                kind: RunTriggerKind::Revision,
                url: first.as_ref().map(|f| f.url.clone()),
                author: first.map(|f| f.author),
            })
        }
        _ => Ok(RunTrigger {
            kind: if attempt > 1 {
                RunTriggerKind::Retry
            } else {
                RunTriggerKind::Assignment
            },
            url: None,
            author: None,
        }),
    }
}

/// Why each run of the task happened, by run id.
pub fn run_triggers(
    conn: &mut AnyConnection,
    task_id: Uuid,
) -> Result<Vec<(Uuid, RunTrigger)>, DbError> {
    let rows: Vec<(String, String, Option<String>, Option<String>)> = task_runs::table
        .filter(task_runs::task_id.eq(task_id.to_string()))
        .select((
            task_runs::id,
            task_runs::run_trigger,
            task_runs::trigger_url,
            task_runs::trigger_author,
        ))
        .load(conn)?;
    rows.into_iter()
        .map(|(id, kind, url, author)| {
            Ok((
                convert::uuid(&id)?,
                RunTrigger {
                    kind: kind.parse()?,
                    url,
                    author,
                },
            ))
        })
        .collect()
}
