//! Tasks: creation (with the issue link), compare-and-set transitions with their events, the
//! run ledger, listing with a keyset cursor, and bulk import ([`import_tasks`], in a module of
//! its own).

use agentry_domain::{
    AgentType, PullRequestRef, RepoUrl, Task, TaskState, TaskType, Tokens, Transition, Trigger,
    Usd, transition_in,
};
use diesel::prelude::*;
use std::collections::HashMap;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, from_db, opt_from_db, opt_to_db, text, to_db};
use crate::fetch::Fetch;
use crate::rollups::{self, Deltas};
use crate::schema::{issue_links, task_events, task_runs, tasks};
use crate::{AnyConnection, DbError, write_tx};

mod import;

pub use import::{ImportOutcome, ImportTask, import_tasks};

#[derive(Queryable, Selectable)]
#[diesel(table_name = tasks)]
struct TaskRow {
    id: String,
    title: String,
    prompt: String,
    repo_id: Option<String>,
    repo_url: String,
    task_type: String,
    state: String,
    agent_type: String,
    model_used: Option<String>,
    cost_nanos: Option<i64>,
    input_tokens: i64,
    output_tokens: i64,
    pr_url: Option<String>,
    pr_number: Option<i64>,
    issue_number: Option<i64>,
    parent_task_id: Option<String>,
    attempt: i32,
    error_message: Option<String>,
    created_at: PrimitiveDateTime,
    updated_at: PrimitiveDateTime,
    started_at: Option<PrimitiveDateTime>,
    finished_at: Option<PrimitiveDateTime>,
    blocked_by: Option<String>,
    imported: bool,
    revisions: i32,
    revision_attempt: Option<i32>,
    revision_cost_nanos: i64,
}

impl TryFrom<TaskRow> for Task {
    type Error = DbError;

    fn try_from(r: TaskRow) -> Result<Task, DbError> {
        Ok(Task {
            id: convert::uuid(&r.id)?,
            title: r.title,
            prompt: r.prompt,
            repo_id: convert::opt_uuid(r.repo_id.as_deref())?,
            repo_url: convert::parse::<RepoUrl>("repository URL", &r.repo_url)?,
            task_type: convert::parse("task type", &r.task_type)?,
            state: convert::parse("task state", &r.state)?,
            agent_type: convert::parse("agent type", &r.agent_type)?,
            model_used: r.model_used,
            cost_usd: convert::usd(r.cost_nanos)?,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            pr_url: r.pr_url,
            pr_number: r.pr_number,
            issue_number: r.issue_number,
            parent_task_id: convert::opt_uuid(r.parent_task_id.as_deref())?,
            attempt: r.attempt,
            error_message: r.error_message,
            created_at: from_db(r.created_at),
            updated_at: from_db(r.updated_at),
            started_at: opt_from_db(r.started_at),
            finished_at: opt_from_db(r.finished_at),
            blocked_by: r
                .blocked_by
                .as_deref()
                .map(|b| convert::parse("budget scope", b))
                .transpose()?,
            imported: r.imported,
            revisions: r.revisions,
            revision_attempt: r.revision_attempt,
            revision_cost_usd: Usd::from_nanos(r.revision_cost_nanos).map_err(|e| {
                DbError::Corrupt(format!("revision cost {}: {e}", r.revision_cost_nanos))
            })?,
        })
    }
}

#[derive(Insertable)]
#[diesel(table_name = tasks, treat_none_as_default_value = false)]
struct TaskInsert {
    id: String,
    title: String,
    prompt: String,
    repo_id: Option<String>,
    repo_url: String,
    task_type: &'static str,
    state: &'static str,
    agent_type: &'static str,
    model_used: Option<String>,
    cost_nanos: Option<i64>,
    input_tokens: i64,
    output_tokens: i64,
    pr_url: Option<String>,
    pr_number: Option<i64>,
    issue_number: Option<i64>,
    parent_task_id: Option<String>,
    attempt: i32,
    created_at: PrimitiveDateTime,
    updated_at: PrimitiveDateTime,
    /// History brought in by an import: never claimed, never retried.
    imported: bool,
}

#[derive(Insertable)]
#[diesel(table_name = task_events, treat_none_as_default_value = false)]
struct EventInsert {
    id: String,
    task_id: String,
    from_state: Option<&'static str>,
    to_state: &'static str,
    reason: String,
    at: PrimitiveDateTime,
}

impl EventInsert {
    fn new(
        task_id: Uuid,
        from: Option<TaskState>,
        to: TaskState,
        reason: &str,
        at: OffsetDateTime,
    ) -> Self {
        EventInsert {
            id: Uuid::now_v7().to_string(),
            task_id: task_id.to_string(),
            from_state: from.map(TaskState::as_str),
            to_state: to.as_str(),
            reason: reason.to_owned(),
            at: to_db(at),
        }
    }
}

/// A task to create in `queued`.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Its id (chosen by the caller, so a retried request can be idempotent).
    pub id: Uuid,
    /// Title (the issue title for issue tasks).
    pub title: String,
    /// Prompt given to the agent (the issue body for issue tasks).
    pub prompt: String,
    /// The repository it works on; `None` only for history whose repository is not connected.
    pub repo_id: Option<Uuid>,
    /// The repository's normalised URL.
    pub repo_url: RepoUrl,
    /// Coding or review.
    pub task_type: TaskType,
    /// The agent that will run it.
    pub agent_type: AgentType,
    /// The linked issue, for issue tasks.
    pub issue_number: Option<i64>,
    /// The coding task a review task reviews.
    pub parent_task_id: Option<Uuid>,
    /// Creation time.
    pub created_at: OffsetDateTime,
}

fn insert_new(conn: &mut AnyConnection, new: &NewTask, reason: &str) -> Result<(), DbError> {
    let at = to_db(new.created_at);
    diesel::insert_into(tasks::table)
        .values(TaskInsert {
            id: new.id.to_string(),
            title: text(&new.title).into_owned(),
            prompt: text(&new.prompt).into_owned(),
            repo_id: new.repo_id.map(|id| id.to_string()),
            repo_url: new.repo_url.to_string(),
            task_type: new.task_type.as_str(),
            state: TaskState::Queued.as_str(),
            agent_type: new.agent_type.as_str(),
            model_used: None,
            cost_nanos: None,
            input_tokens: 0,
            output_tokens: 0,
            pr_url: None,
            pr_number: None,
            issue_number: new.issue_number,
            parent_task_id: new.parent_task_id.map(|id| id.to_string()),
            attempt: 1,
            created_at: at,
            updated_at: at,
            imported: false,
        })
        .execute(conn)?;
    diesel::insert_into(task_events::table)
        .values(EventInsert::new(
            new.id,
            None,
            TaskState::Queued,
            reason,
            new.created_at,
        ))
        .execute(conn)?;
    Ok(())
}

/// Creates a task in `queued` with its creation event `{from: null, to: queued}`.
pub fn create_task(conn: &mut AnyConnection, new: &NewTask, reason: &str) -> Result<Task, DbError> {
    write_tx(conn, |conn| {
        insert_new(conn, new, reason)?;
        let task = get_task(conn, new.id)?;
        rollups::apply(conn, Deltas::change(None, Some(&task))?)?;
        Ok(task)
    })
}

/// Creates the coding task of an issue unless the issue is already linked to one.
///
/// Returns the linked task and whether it was created now. The link's primary key on
/// (repository, issue number) guarantees one task per issue even under concurrent calls on
/// several replicas: the loser of the race rolls back and returns the winner's task.
/// `in_tx` runs inside the creating transaction (for the effects that must commit with it).
pub fn create_issue_task<F>(
    conn: &mut AnyConnection,
    new: &NewTask,
    in_tx: F,
) -> Result<(Task, bool), DbError>
where
    F: FnOnce(&mut AnyConnection, &Task) -> Result<(), DbError>,
{
    let (Some(repo_id), Some(issue_number)) = (new.repo_id, new.issue_number) else {
        return Err(DbError::Conflict(
            "an issue task needs a repository and an issue number".into(),
        ));
    };
    let created = write_tx::<_, DbError, _>(conn, |conn| {
        if let Some(task) = linked_task(conn, repo_id, issue_number)? {
            return Ok((task, false));
        }
        insert_new(conn, new, "issue assigned")?;
        diesel::insert_into(issue_links::table)
            .values((
                issue_links::repo_id.eq(repo_id.to_string()),
                issue_links::issue_number.eq(issue_number),
                issue_links::task_id.eq(new.id.to_string()),
                issue_links::created_at.eq(to_db(new.created_at)),
            ))
            .execute(conn)?;
        crate::issues::mark_linked(conn, repo_id, issue_number)?;
        let task = get_task(conn, new.id)?;
        rollups::apply(conn, Deltas::change(None, Some(&task))?)?;
        in_tx(conn, &task)?;
        Ok((task, true))
    });
    match created {
        Err(e) if e.is_unique_violation() => {
            let task = linked_task(conn, repo_id, issue_number)?.ok_or(e)?;
            Ok((task, false))
        }
        other => other,
    }
}

/// The task linked to an issue, if any.
pub fn linked_task(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    issue_number: i64,
) -> Result<Option<Task>, DbError> {
    tasks::table
        .inner_join(issue_links::table.on(issue_links::task_id.eq(tasks::id)))
        .filter(issue_links::repo_id.eq(repo_id.to_string()))
        .filter(issue_links::issue_number.eq(issue_number))
        .select(TaskRow::as_select())
        .first_as(conn)
}

/// One task by id.
pub fn get_task(conn: &mut AnyConnection, id: Uuid) -> Result<Task, DbError> {
    find_task(conn, id)?.ok_or(DbError::NotFound)
}

/// One task by id, or `None`.
pub fn find_task(conn: &mut AnyConnection, id: Uuid) -> Result<Option<Task>, DbError> {
    tasks::table
        .find(id.to_string())
        .select(TaskRow::as_select())
        .first_as(conn)
}

/// What a transition records beside the new state.
#[derive(Debug, Clone, Default)]
pub struct TransitionDetails {
    /// The event's reason; the trigger's name when `None`.
    pub reason: Option<String>,
    /// Why the task failed (for transitions into `failed`).
    pub error_message: Option<String>,
    /// The pull request opened (for `PullRequestOpened`).
    pub pull_request: Option<PullRequestRef>,
}

#[derive(AsChangeset)]
#[diesel(table_name = tasks)]
struct TransitionChanges<'a> {
    state: &'static str,
    attempt: i32,
    updated_at: PrimitiveDateTime,
    started_at: Option<Option<PrimitiveDateTime>>,
    finished_at: Option<Option<PrimitiveDateTime>>,
    error_message: Option<Option<&'a str>>,
    pr_url: Option<Option<&'a str>>,
    pr_number: Option<Option<i64>>,
    lease_owner: Option<Option<&'a str>>,
    lease_expires_at: Option<Option<PrimitiveDateTime>>,
    revisions: Option<i32>,
    revision_attempt: Option<Option<i32>>,
    blocked_by: Option<Option<&'static str>>,
    blocked_at: Option<Option<PrimitiveDateTime>>,
}

/// Applies `trigger` to a task as a compare-and-set on its current state and attempt, and
/// records the task event in the same transaction.
///
/// Of two actors applying a transition to the same task at once (the poller and a webhook,
/// two replicas) exactly one succeeds; the other re-reads the task and gets
/// [`DbError::InvalidTransition`] when the new state no longer allows the trigger.
pub fn transition_task(
    conn: &mut AnyConnection,
    id: Uuid,
    trigger: Trigger,
    details: &TransitionDetails,
    now: OffsetDateTime,
) -> Result<(Task, Transition), DbError> {
    transition(conn, id, None, trigger, details, now)?
        .ok_or_else(|| DbError::Conflict(format!("task {id}: no attempt was asked for")))
}

/// [`transition_task`] for one attempt of the task: `None`, and nothing changes, when the
/// task is at another attempt by the time the transition is decided (a run's own
/// transitions: its task may have been cancelled, retried and claimed again meanwhile, and
/// the new attempt is not the old run's to move).
pub fn transition_task_at(
    conn: &mut AnyConnection,
    id: Uuid,
    attempt: i32,
    trigger: Trigger,
    details: &TransitionDetails,
    now: OffsetDateTime,
) -> Result<Option<(Task, Transition)>, DbError> {
    transition(conn, id, Some(attempt), trigger, details, now)
}

fn transition(
    conn: &mut AnyConnection,
    id: Uuid,
    attempt: Option<i32>,
    trigger: Trigger,
    details: &TransitionDetails,
    now: OffsetDateTime,
) -> Result<Option<(Task, Transition)>, DbError> {
    write_tx(conn, |conn| {
        // On PostgreSQL (READ COMMITTED) another transaction may commit between the read and
        // the conditional update; then the update matches no row and we decide again on the
        // fresh state. SQLite's immediate transaction makes the first pass final.
        if trigger == Trigger::Retry {
            let imported: bool = tasks::table
                .find(id.to_string())
                .select(tasks::imported)
                .existing(conn)?;
            if imported {
                return Err(DbError::Conflict(format!(
                    "task {id} was imported: it is history, with no prompt to run again"
                )));
            }
        }
        let error_message = convert::text(
            details
                .error_message
                .as_deref()
                .unwrap_or("the task failed"),
        );
        let reason = convert::text(details.reason.as_deref().unwrap_or(trigger.as_str()));
        // The row is locked before it is read: the state and attempt the update compares
        // are not all that may change under us. A run recorded meanwhile (its own
        // transaction, which locks the row too) changes the cost, and the rollups below add
        // the difference between the task read and the task written: read unlocked on
        // PostgreSQL, that run's cost was counted twice.
        crate::revisions::lock_task(conn, id)?;
        if matches!(trigger, Trigger::Retry | Trigger::RevisionRequested) {
            // Before the task and its rollups are read below: this may record a run.
            crate::runner::record_stopped_attempt(conn, id, now)?;
        }
        for _ in 0..8 {
            let current = get_task(conn, id)?;
            if attempt.is_some_and(|a| a != current.attempt) {
                return Ok(None);
            }
            let t = transition_in(
                current.state,
                trigger,
                current.task_type,
                current.attempt,
                current.revision(),
            )?;
            let at = to_db(now);
            // The runner's lease goes with the task out of provisioning/running (and stays
            // through provisioning → running).
            let leaving_work =
                matches!(current.state, TaskState::Provisioning | TaskState::Running)
                    && !matches!(t.to, TaskState::Provisioning | TaskState::Running);
            // Moved away from its runner by someone else (a user's cancel, the pull request
            // merged or closed during a round), the attempt's run is still to be recorded by
            // that runner: its lease stays until it expires, so that a dead runner's run is
            // recorded by recovery all the same (`runner::abandoned_leases`).
            // Back in the queue (a retry), any such lease goes: the next claim's is the task's.
            let clears_lease = (leaving_work
                && !matches!(
                    trigger,
                    Trigger::Cancel | Trigger::PullRequestMerged | Trigger::PullRequestClosed
                ))
                || t.to == TaskState::Queued;
            let queue_moved = (t.from == TaskState::Queued) != (t.to == TaskState::Queued);
            let changes = TransitionChanges {
                state: t.to.as_str(),
                attempt: t.attempt,
                updated_at: at,
                started_at: (t.to == TaskState::Provisioning).then_some(Some(at)),
                finished_at: match t.to {
                    TaskState::Completed | TaskState::Failed | TaskState::Cancelled => {
                        Some(Some(at))
                    }
                    TaskState::Queued => Some(None),
                    _ => None,
                },
                error_message: match t.to {
                    TaskState::Failed => Some(Some(error_message.as_ref())),
                    TaskState::Queued => Some(None),
                    _ => None,
                },
                pr_url: details
                    .pull_request
                    .as_ref()
                    .map(|pr| Some(pr.url.as_str())),
                pr_number: details.pull_request.as_ref().map(|pr| Some(pr.number)),
                lease_owner: clears_lease.then_some(None),
                lease_expires_at: clears_lease.then_some(None),
                // A revision round starts with its attempt; a retry starts the task afresh.
                revisions: (trigger == Trigger::RevisionRequested)
                    .then(|| current.revisions.saturating_add(1)),
                revision_attempt: match trigger {
                    Trigger::RevisionRequested => Some(Some(t.attempt)),
                    Trigger::Retry => Some(None),
                    _ => None,
                },
                // A budget's block is a queued task's: it goes when the task leaves the
                // queue (cancelled) and is never carried into a new stay (a retry, a round),
                // where the next claim decides afresh.
                blocked_by: queue_moved.then_some(None),
                blocked_at: queue_moved.then_some(None),
            };
            let updated = diesel::update(
                tasks::table
                    .filter(tasks::id.eq(id.to_string()))
                    .filter(tasks::state.eq(current.state.as_str()))
                    .filter(tasks::attempt.eq(current.attempt)),
            )
            .set(&changes)
            .execute(conn)?;
            if updated == 0 {
                continue;
            }
            diesel::insert_into(task_events::table)
                .values(EventInsert::new(id, Some(t.from), t.to, &reason, now))
                .execute(conn)?;
            revision_feedback_follows(conn, id, t, now)?;
            let after = get_task(conn, id)?;
            rollups::apply(conn, Deltas::change(Some(&current), Some(&after))?)?;
            return Ok(Some((after, t)));
        }
        Err(DbError::Conflict(format!(
            "task {id} kept changing; try again"
        )))
    })
}

/// What a transition means for the task's review feedback (docs/contract.md#57-revisions):
/// back at pr_opened with feedback waiting (it arrived during a round), the next round is
/// due at once; once the task is over, waiting feedback is dropped.
fn revision_feedback_follows(
    conn: &mut AnyConnection,
    id: Uuid,
    t: Transition,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    use crate::revisions::{self, FeedbackOutcome};
    let due = match t.to {
        TaskState::PrOpened => {
            (revisions::count(conn, id, FeedbackOutcome::Waiting)? > 0).then_some(Some(now))
        }
        TaskState::Completed | TaskState::Failed | TaskState::Cancelled => {
            (revisions::settle_waiting(conn, id, FeedbackOutcome::Dropped, None)? > 0)
                .then_some(None)
        }
        _ => None,
    };
    if let Some(due) = due {
        revisions::set_due(conn, id, due)?;
    }
    Ok(())
}

/// One recorded state change of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEvent {
    /// The state before; `None` for the creation event.
    pub from: Option<TaskState>,
    /// The state after.
    pub to: TaskState,
    /// Why it happened.
    pub reason: String,
    /// When it happened.
    pub at: OffsetDateTime,
    /// What kind of event: a state change ([`EventKind::Transition`], `from` → `to`) or a
    /// note on the task that changes no state (then `from` = `to`, its state at the time).
    pub kind: EventKind,
}

/// What a [`TaskEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A state change.
    Transition,
    /// A metered run whose cost differs from what its agent printed beyond rounding
    /// (docs/contract.md#68-model-gateway): the recorded cost is the metered one.
    CostMismatch,
}

impl EventKind {
    /// The stored and API name: `transition`, `cost_mismatch`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Transition => "transition",
            EventKind::CostMismatch => "cost_mismatch",
        }
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "transition" => Ok(EventKind::Transition),
            "cost_mismatch" => Ok(EventKind::CostMismatch),
            other => Err(format!("unknown event kind {other:?}")),
        }
    }
}

/// Adds a note to a task's history that changes no state (such as a
/// [`EventKind::CostMismatch`]): `from` and `to` are the task's current state.
pub fn record_note(
    conn: &mut AnyConnection,
    task_id: Uuid,
    kind: EventKind,
    reason: &str,
    at: OffsetDateTime,
) -> Result<(), DbError> {
    let state: String = tasks::table
        .find(task_id.to_string())
        .select(tasks::state)
        .first(conn)?;
    diesel::insert_into(task_events::table)
        .values((
            task_events::id.eq(Uuid::now_v7().to_string()),
            task_events::task_id.eq(task_id.to_string()),
            task_events::from_state.eq(Some(state.clone())),
            task_events::to_state.eq(state),
            task_events::reason.eq(reason),
            task_events::at.eq(to_db(at)),
            task_events::kind.eq(kind.as_str()),
        ))
        .execute(conn)?;
    Ok(())
}

/// The state history of a task, oldest first.
pub fn task_events(conn: &mut AnyConnection, task_id: Uuid) -> Result<Vec<TaskEvent>, DbError> {
    type Row = (Option<String>, String, String, PrimitiveDateTime, String);
    let rows: Vec<Row> = task_events::table
        .filter(task_events::task_id.eq(task_id.to_string()))
        .order((task_events::at.asc(), task_events::id.asc()))
        .select((
            task_events::from_state,
            task_events::to_state,
            task_events::reason,
            task_events::at,
            task_events::kind,
        ))
        .load(conn)?;
    rows.into_iter()
        .map(|(from, to, reason, at, kind)| {
            Ok(TaskEvent {
                from: from
                    .as_deref()
                    .map(|s| convert::parse("task state", s))
                    .transpose()?,
                to: convert::parse("task state", &to)?,
                reason,
                at: from_db(at),
                kind: convert::parse("event kind", &kind)?,
            })
        })
        .collect()
}

/// How an agent run ended; stored as `succeeded`, `failed`, `cancelled`, `timed_out` or
/// `lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The agent finished and reported success.
    Succeeded,
    /// The agent failed, or its output could not be used.
    Failed,
    /// The task was cancelled while the agent ran.
    Cancelled,
    /// The run hit its wall-time limit.
    TimedOut,
    /// The runner died; the run was found by lease recovery.
    Lost,
}

agentry_domain::wire_enum!(RunOutcome, "run outcome", [
    Succeeded => "succeeded",
    Failed => "failed",
    Cancelled => "cancelled",
    TimedOut => "timed_out",
    Lost => "lost",
]);

/// One agent run, as recorded in the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Run id.
    pub id: Uuid,
    /// The task it ran for.
    pub task_id: Uuid,
    /// The task's attempt number during the run.
    pub attempt: i32,
    /// The agent that ran.
    pub agent_type: AgentType,
    /// The model reported by the agent (or launched with).
    pub model: Option<String>,
    /// Its cost; `None` when the agent reported none (e.g. an unpriced model).
    pub cost_usd: Option<Usd>,
    /// Its tokens (all input, its cache reads and writes, output); the ledger's columns
    /// keep the uncached input apart.
    pub tokens: Tokens,
    /// Agent turns, when reported.
    pub turns: Option<i32>,
    /// How it ended.
    pub outcome: RunOutcome,
    /// The agent process's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// What went wrong, for runs that did not succeed.
    pub error_message: Option<String>,
    /// Start time.
    pub started_at: OffsetDateTime,
    /// End time.
    pub finished_at: Option<OffsetDateTime>,
    /// Whether the agent ran in the sandbox; `None` when not known (a run recovered after
    /// its service died, or recorded before this was kept).
    pub sandboxed: Option<bool>,
    /// How many model calls the model gateway metered for this run; `None` for a run whose
    /// calls did not go through the gateway (its cost is then the agent's own word).
    pub model_calls: Option<i64>,
    /// The cost the agent itself printed, kept beside the metered `cost_usd` of a metered
    /// run (and equal to it for a run that is not metered).
    pub reported_cost_usd: Option<Usd>,
}

impl Run {
    /// A run of `task_id` at `attempt` by `agent_type` that started at `started_at` and ended
    /// as `outcome`, with a new id and nothing else known: no model, cost, tokens, turns,
    /// exit code, error, end time, sandbox flag, metered calls or reported cost. Callers set
    /// what they know with struct update syntax (`Run { exit_code: Some(0), ..Run::new(…) }`).
    pub fn new(
        task_id: Uuid,
        attempt: i32,
        agent_type: AgentType,
        outcome: RunOutcome,
        started_at: OffsetDateTime,
    ) -> Run {
        Run {
            id: Uuid::new_v4(),
            task_id,
            attempt,
            agent_type,
            outcome,
            started_at,
            model: None,
            cost_usd: None,
            tokens: Tokens::default(),
            turns: None,
            exit_code: None,
            error_message: None,
            finished_at: None,
            sandboxed: None,
            model_calls: None,
            reported_cost_usd: None,
        }
    }

    /// The time whose UTC month the run's cost is spent in (docs/contract.md#67-budgets):
    /// its end, or for a run whose end is not known (a lost run) its start.
    pub fn spend_time(&self) -> OffsetDateTime {
        self.finished_at.unwrap_or(self.started_at)
    }
}

#[derive(Queryable, Selectable, Insertable)]
#[diesel(table_name = task_runs)]
struct RunRow {
    id: String,
    task_id: String,
    attempt: i32,
    agent_type: String,
    model: Option<String>,
    cost_nanos: Option<i64>,
    input_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    output_tokens: i64,
    turns: Option<i32>,
    outcome: String,
    exit_code: Option<i32>,
    error_message: Option<String>,
    started_at: PrimitiveDateTime,
    finished_at: Option<PrimitiveDateTime>,
    sandboxed: Option<bool>,
    model_calls: Option<i64>,
    reported_cost_nanos: Option<i64>,
    run_trigger: String,
    trigger_url: Option<String>,
    trigger_author: Option<String>,
}

impl TryFrom<RunRow> for Run {
    type Error = DbError;
    fn try_from(r: RunRow) -> Result<Run, DbError> {
        Ok(Run {
            id: convert::uuid(&r.id)?,
            task_id: convert::uuid(&r.task_id)?,
            attempt: r.attempt,
            agent_type: convert::parse("agent type", &r.agent_type)?,
            model: r.model,
            cost_usd: convert::usd(r.cost_nanos)?,
            tokens: Tokens::from_uncached(
                r.input_tokens,
                r.cache_read_tokens,
                r.cache_write_tokens,
                r.output_tokens,
            ),
            turns: r.turns,
            outcome: convert::parse("run outcome", &r.outcome)?,
            exit_code: r.exit_code,
            error_message: r.error_message,
            started_at: from_db(r.started_at),
            finished_at: opt_from_db(r.finished_at),
            sandboxed: r.sandboxed,
            model_calls: r.model_calls,
            reported_cost_usd: convert::usd(r.reported_cost_nanos)?,
        })
    }
}

fn non_negative(what: &str, n: i64) -> Result<i64, DbError> {
    if n < 0 {
        return Err(DbError::Conflict(format!("{what} must not be negative")));
    }
    Ok(n)
}

/// Records a finished agent run in the ledger and adds its cost and tokens to the task's
/// totals, atomically: in its own transaction, or as a savepoint of the caller's (call it
/// inside the [`write_tx`] of the transition the run ends in, so both commit together).
/// Retries add; nothing is ever overwritten.
pub fn record_run(conn: &mut AnyConnection, run: &Run) -> Result<(), DbError> {
    write_tx(conn, |conn| record_run_in(conn, run))
}

fn record_run_in(conn: &mut AnyConnection, run: &Run) -> Result<(), DbError> {
    // The model is what the agent reported: kept (in the run, the task and the rollups) as
    // a text column can hold it; a blank one is no model (the report's "unknown").
    let model = convert::opt_text(run.model.as_deref().filter(|m| !m.trim().is_empty()));
    let cache_read = non_negative("cache read tokens", run.tokens.cache_read)?;
    let cache_write = non_negative("cache write tokens", run.tokens.cache_write)?;
    let uncached = non_negative("input tokens", run.tokens.uncached())?;
    let output = non_negative("output tokens", run.tokens.output)?;
    uncached
        .checked_add(cache_read)
        .and_then(|n| n.checked_add(cache_write))
        .ok_or_else(|| DbError::Conflict("token count overflow".into()))?;
    // Lock the task's row before reading its totals: on PostgreSQL (READ COMMITTED) two runs
    // recorded at once would otherwise both add to the same old total and one would be lost.
    crate::revisions::lock_task(conn, run.task_id)?;
    let task = get_task(conn, run.task_id)?;
    let trigger = crate::revisions::trigger_of(conn, &task, run.attempt)?;
    diesel::insert_into(task_runs::table)
        .values(RunRow {
            id: run.id.to_string(),
            task_id: run.task_id.to_string(),
            attempt: run.attempt,
            agent_type: run.agent_type.as_str().to_owned(),
            model: model.clone(),
            cost_nanos: run.cost_usd.map(Usd::to_nanos),
            input_tokens: uncached,
            cache_read_tokens: cache_read,
            cache_write_tokens: cache_write,
            output_tokens: output,
            turns: run.turns,
            outcome: run.outcome.as_str().to_owned(),
            exit_code: run.exit_code,
            error_message: convert::opt_text(run.error_message.as_deref()),
            started_at: to_db(run.started_at),
            finished_at: opt_to_db(run.finished_at),
            sandboxed: run.sandboxed,
            model_calls: run.model_calls,
            reported_cost_nanos: run.reported_cost_usd.map(Usd::to_nanos),
            run_trigger: trigger.kind.as_str().to_owned(),
            trigger_url: trigger.url,
            trigger_author: trigger.author,
        })
        .execute(conn)?;
    add_spend(
        conn,
        &task,
        Spend {
            cost: run.cost_usd,
            tokens: Tokens::from_uncached(uncached, cache_read, cache_write, output),
            model: model.as_deref(),
            attempt: run.attempt,
            revision: trigger.kind == crate::revisions::RunTriggerKind::Revision,
            at: run.finished_at.unwrap_or(run.started_at),
            month_of: run.spend_time(),
        },
    )
}

/// What a recorded run, or a metered call added to one, adds to its task.
struct Spend<'a> {
    /// Its cost; `None` adds nothing (the task's cost sums the runs' known costs).
    cost: Option<Usd>,
    /// Its tokens, none negative.
    tokens: Tokens,
    /// The run's model, as stored.
    model: Option<&'a str>,
    /// The run's attempt: only a run of the task's current attempt (or the first model
    /// known) sets the task's `model_used`.
    attempt: i32,
    /// Whether the run is one of a revision round (its cost is also the task's
    /// `revision_cost_usd`).
    revision: bool,
    /// The task's new `updated_at`.
    at: OffsetDateTime,
    /// The time whose month the cost counts in ([`Run::spend_time`]).
    month_of: OffsetDateTime,
}

/// Adds `spend` to the totals of `task` (as read under its lock), and to the cost rollups and
/// `run_cost_rollup`, in the caller's transaction. Summed here with overflow checks: SQLite
/// would silently turn an overflowing sum into a float.
fn add_spend(conn: &mut AnyConnection, task: &Task, spend: Spend<'_>) -> Result<(), DbError> {
    let overflow = || DbError::Conflict("token count overflow".into());
    let cost_overflow = || DbError::Conflict("task cost overflow".into());
    let input_total = task
        .input_tokens
        .checked_add(spend.tokens.input)
        .ok_or_else(overflow)?;
    let output_total = task
        .output_tokens
        .checked_add(spend.tokens.output)
        .ok_or_else(overflow)?;
    let cost = match (task.cost_usd, spend.cost) {
        (Some(a), Some(b)) => Some(a.checked_add(b).ok_or_else(cost_overflow)?),
        (a, b) => a.or(b),
    };
    // A revision run's cost is also kept apart (docs/analytics.md: `revisionCost`).
    let revision_cost = match (spend.revision, spend.cost) {
        (true, Some(c)) => task
            .revision_cost_usd
            .checked_add(c)
            .ok_or_else(cost_overflow)?,
        _ => task.revision_cost_usd,
    };
    // A run of an earlier attempt recorded late (a replica that was only late, a leftover
    // recorded at start, a late metered call) does not take the task back to its model.
    let task_model = match spend.model {
        Some(model) if spend.attempt >= task.attempt || task.model_used.is_none() => {
            Some(model.to_owned())
        }
        _ => task.model_used.clone(),
    };
    diesel::update(tasks::table.find(task.id.to_string()))
        .set((
            tasks::cost_nanos.eq(cost.map(Usd::to_nanos)),
            tasks::revision_cost_nanos.eq(revision_cost.to_nanos()),
            tasks::input_tokens.eq(input_total),
            tasks::output_tokens.eq(output_total),
            tasks::model_used.eq(task_model),
            tasks::updated_at.eq(to_db(spend.at)),
        ))
        .execute(conn)?;
    let after = get_task(conn, task.id)?;
    rollups::apply(conn, Deltas::change(Some(task), Some(&after))?)?;
    // After the cost rollups: a run with a cost changed them, so on PostgreSQL this
    // transaction holds their lock before it takes the scrape rollup's row (one order for
    // every writer of both).
    if let Some(cost) = spend.cost {
        crate::scrape::add_run_cost(conn, task, spend.model, cost.to_nanos(), spend.month_of)?;
    }
    Ok(())
}

/// Adds a metered model call written after its run was recorded to that run, its task's
/// totals and the rollups, in the caller's transaction, which holds the task's lock
/// ([`crate::revisions::lock_task`]). Such a call was still being written when the run's
/// recorder stopped waiting for its calls, or was made by an agent still alive after its
/// run was recovered as `lost`. Returns whether a run of the call's attempt is on record;
/// when none is, nothing is changed (the attempt's recorder reads the call with the others).
///
/// Its cost adds to the run's when both are known. A run whose cost is unknown stays unknown
/// (its task's cost sums known costs only); a call whose model has no price adds its tokens
/// and a note to the run, never a guess.
pub(crate) fn add_late_call(
    conn: &mut AnyConnection,
    call: &crate::metering::ModelCall,
) -> Result<bool, DbError> {
    let row: Option<RunRow> = task_runs::table
        .filter(task_runs::task_id.eq(call.task_id.to_string()))
        .filter(task_runs::attempt.eq(call.attempt))
        .select(RunRow::as_select())
        .first(conn)
        .optional()?;
    let Some(row) = row else {
        return Ok(false);
    };
    let revision = row.run_trigger == crate::revisions::RunTriggerKind::Revision.as_str();
    let run = Run::try_from(row)?;
    let tokens = Tokens::from_uncached(
        call.tokens.uncached().max(0),
        call.tokens.cache_read.max(0),
        call.tokens.cache_write.max(0),
        call.tokens.output.max(0),
    );
    let used = tokens.input + tokens.output > 0;
    let overflow = || DbError::Conflict("metered total overflow".into());
    let (cost, added, note) = match (run.cost_usd, call.cost_usd) {
        (Some(a), Some(b)) => (Some(a.checked_add(b).ok_or_else(overflow)?), Some(b), None),
        (Some(a), None) if used => (
            Some(a),
            None,
            Some(format!(
                "a model call written after the run was recorded used model {}, which has \
                 no price: its cost is not included",
                call.model.as_deref().unwrap_or("(unknown)")
            )),
        ),
        (cost, _) => (cost, None, None),
    };
    let run_tokens = run.tokens.checked_add(tokens).ok_or_else(overflow)?;
    let message = match (run.error_message.clone(), note) {
        (Some(m), Some(n)) => Some(format!("{m}; {n}")),
        (m, n) => m.or(n),
    };
    diesel::update(task_runs::table.find(run.id.to_string()))
        .set((
            task_runs::cost_nanos.eq(cost.map(Usd::to_nanos)),
            task_runs::input_tokens.eq(run_tokens.uncached()),
            task_runs::cache_read_tokens.eq(run_tokens.cache_read),
            task_runs::cache_write_tokens.eq(run_tokens.cache_write),
            task_runs::output_tokens.eq(run_tokens.output),
            task_runs::model_calls.eq(Some(run.model_calls.unwrap_or(0).saturating_add(1))),
            task_runs::error_message.eq(convert::opt_text(message.as_deref())),
        ))
        .execute(conn)?;
    let task = get_task(conn, call.task_id)?;
    let ended = call.started_at + time::Duration::milliseconds(call.duration_ms.max(0));
    add_spend(
        conn,
        &task,
        Spend {
            cost: added,
            tokens,
            model: run.model.as_deref(),
            attempt: run.attempt,
            revision,
            at: ended.max(task.updated_at),
            month_of: run.spend_time(),
        },
    )?;
    Ok(true)
}

/// The runs of a task, oldest first.
pub fn task_runs(conn: &mut AnyConnection, task_id: Uuid) -> Result<Vec<Run>, DbError> {
    task_runs::table
        .filter(task_runs::task_id.eq(task_id.to_string()))
        .order((task_runs::started_at.asc(), task_runs::id.asc()))
        .select(RunRow::as_select())
        .load_as(conn)
}

/// The review subtasks of a coding task, oldest first.
pub fn review_tasks(conn: &mut AnyConnection, parent_id: Uuid) -> Result<Vec<Task>, DbError> {
    tasks::table
        .filter(tasks::parent_task_id.eq(parent_id.to_string()))
        .order((tasks::created_at.asc(), tasks::id.asc()))
        .select(TaskRow::as_select())
        .load_as(conn)
}

/// Filters of the task list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks of this repository.
    pub repo_id: Option<Uuid>,
    /// Only tasks of this type.
    pub task_type: Option<TaskType>,
}

/// Position in the newest-first task list: the last task of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskCursor {
    /// `createdAt` of the last task returned.
    pub created_at: OffsetDateTime,
    /// `id` of the last task returned (breaks ties of equal creation times).
    pub id: Uuid,
}

/// One page of the task list.
#[derive(Debug, Clone)]
pub struct TaskPage {
    /// The tasks, newest first.
    pub tasks: Vec<Task>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<TaskCursor>,
}

/// Lists tasks newest first (`createdAt` desc, then `id` desc), `limit` at a time, starting
/// after `after`. Keyset pagination: a page costs the same however deep it is.
pub fn list_tasks(
    conn: &mut AnyConnection,
    filter: &TaskFilter,
    limit: i64,
    after: Option<&TaskCursor>,
) -> Result<TaskPage, DbError> {
    let mut query = tasks::table.select(TaskRow::as_select()).into_boxed();
    if let Some(state) = filter.state {
        query = query.filter(tasks::state.eq(state.as_str()));
    }
    if let Some(repo_id) = filter.repo_id {
        query = query.filter(tasks::repo_id.eq(repo_id.to_string()));
    }
    if let Some(task_type) = filter.task_type {
        query = query.filter(tasks::task_type.eq(task_type.as_str()));
    }
    if let Some(c) = after {
        let at = to_db(c.created_at);
        // `created_at < at OR (created_at = at AND id < c.id)`, written with an explicit upper
        // bound so that both planners read a range of `tasks_created` (`created_at <= at`)
        // instead of walking the index from the newest task down to the cursor.
        query = query.filter(
            tasks::created_at
                .le(at)
                .and(tasks::created_at.lt(at).or(tasks::id.lt(c.id.to_string()))),
        );
    }
    let mut rows: Vec<TaskRow> = query
        .order((tasks::created_at.desc(), tasks::id.desc()))
        .limit(limit.saturating_add(1))
        .load(conn)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    let tasks: Vec<Task> = rows
        .into_iter()
        .map(Task::try_from)
        .collect::<Result<_, _>>()?;
    let next = if more {
        tasks.last().map(|t| TaskCursor {
            created_at: t.created_at,
            id: t.id,
        })
    } else {
        None
    };
    Ok(TaskPage { tasks, next })
}

/// At most this many costed tasks in a period, [`costliest_in_window`] reads the period's
/// tasks through the creation-time index (and sorts them) rather than the cost index.
pub const SPARSE_PERIOD_TASKS: i64 = 20_000;

/// Where [`costliest_in_window`] looks: tasks created in `[from, to)`, of one repository
/// (by URL) or of all, with `costed` costed tasks in that period and repository, as the
/// cost rollups count them (a count that is off only changes how fast the search is).
#[derive(Debug, Clone, Copy)]
pub struct CostWindow<'a> {
    /// The first instant of the period.
    pub from: OffsetDateTime,
    /// The instant after it.
    pub to: OffsetDateTime,
    /// One repository's URL, or `None` for all.
    pub repo_url: Option<&'a str>,
    /// How many costed tasks the period has there.
    pub costed: i64,
}

/// Costed tasks of `window` costing at least `min_cost_nanos`, costliest first (cost desc,
/// then creation desc, then id), at most `limit` when given: the report's top tasks and
/// anomaly candidates.
///
/// Two ways, chosen by how many costed tasks the period has. A period with none reads
/// nothing. A sparse one ([`SPARSE_PERIOD_TASKS`] or fewer) is read through the
/// creation-time index and sorted. In a dense one, the planners' choice with the period in
/// the SQL (the creation-time index, then a sort of every task of the period) takes
/// hundreds of milliseconds at a million tasks; instead the cost index (in exactly this
/// order) is read top-down in growing chunks, ids and creation times only, the period
/// applied here, so a call reads about `limit × (history / period)` index entries; then the
/// tasks found are read whole.
pub fn costliest_in_window(
    conn: &mut AnyConnection,
    window: CostWindow<'_>,
    min_cost_nanos: i64,
    limit: Option<usize>,
) -> Result<Vec<Task>, DbError> {
    if window.costed <= 0 || limit == Some(0) {
        return Ok(Vec::new());
    }
    let costliest = |repo_url: Option<&str>| {
        let mut q = tasks::table
            .filter(tasks::cost_nanos.is_not_null())
            .filter(tasks::cost_nanos.ge(min_cost_nanos))
            .order((
                tasks::cost_nanos.desc(),
                tasks::created_at.desc(),
                tasks::id.asc(),
            ))
            .into_boxed();
        if let Some(repo) = repo_url {
            q = q.filter(tasks::repo_url.eq(repo.to_owned()));
        }
        q
    };
    if window.costed <= SPARSE_PERIOD_TASKS {
        let mut q = costliest(window.repo_url)
            .filter(tasks::created_at.ge(to_db(window.from)))
            .filter(tasks::created_at.lt(to_db(window.to)))
            .select(TaskRow::as_select());
        if let Some(l) = limit {
            q = q.limit(i64::try_from(l).unwrap_or(i64::MAX));
        }
        return q
            .load::<TaskRow>(conn)?
            .into_iter()
            .map(Task::try_from)
            .collect();
    }
    let mut chunk: i64 = limit.map_or(i64::MAX, |l| (l as i64).saturating_mul(8).max(64));
    loop {
        let mut q = costliest(window.repo_url).select((tasks::id, tasks::created_at));
        if chunk < i64::MAX {
            q = q.limit(chunk);
        }
        let rows: Vec<(String, PrimitiveDateTime)> = q.load(conn)?;
        let exhausted = (rows.len() as i64) < chunk;
        let mut found: Vec<String> = rows
            .into_iter()
            .filter(|(_, created)| {
                let created = from_db(*created);
                created >= window.from && created < window.to
            })
            .map(|(id, _)| id)
            .collect();
        if exhausted || limit.is_some_and(|l| found.len() >= l) {
            if let Some(l) = limit {
                found.truncate(l);
            }
            return tasks_in_order(conn, &found);
        }
        chunk = chunk.saturating_mul(8);
    }
}

/// The tasks of `ids`, whole, in that order.
fn tasks_in_order(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<Task>, DbError> {
    let mut by_id: HashMap<String, Task> = HashMap::with_capacity(ids.len());
    // Bound parameters stay far under SQLite's and PostgreSQL's limits.
    for chunk in ids.chunks(5_000) {
        let rows: Vec<TaskRow> = tasks::table
            .filter(tasks::id.eq_any(chunk))
            .select(TaskRow::as_select())
            .load(conn)?;
        for row in rows {
            by_id.insert(row.id.clone(), Task::try_from(row)?);
        }
    }
    ids.iter()
        .map(|id| by_id.remove(id).ok_or(DbError::NotFound))
        .collect()
}
