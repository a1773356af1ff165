//! What the agent runner needs from storage (docs/contract.md#22-states-and-transitions, #61-runner): claiming the oldest queued
//! task under a lease, renewing the lease while the run goes on, finding and recovering
//! tasks whose lease expired (their runner died), and the output log of each recorded run.
//!
//! A lease is the pair (`lease_owner`, `lease_expires_at`) on the task row. The owner is an
//! id the claiming process chose for itself; the expiry is pushed forward by
//! [`renew_lease`]. A transition out of `provisioning`/`running` made by the runner, or by
//! recovery, clears it ([`crate::tasks::transition_task`]); one made by someone else (a
//! cancel, the pull request merged or closed during a revision round) keeps it for the
//! attempt's run: its live runner renews it with [`renew_stopped_lease`] until it records
//! the run ([`record_finished_run`] then clears it), and once a dead runner's lease expired
//! recovery records what the attempt cost ([`release_abandoned`]).
//!
//! Claiming is safe among several replicas: on PostgreSQL the candidate row is read with
//! `FOR UPDATE SKIP LOCKED` (a competitor skips it instead of waiting), and the update is a
//! compare-and-set on `state = 'queued'` in any case; SQLite's immediate transaction
//! serialises claimers.

use agentry_domain::{BudgetScope, Task, TaskState, Transition, Trigger};
use diesel::prelude::*;
use time::{Duration, OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::budgets;
use crate::convert::{self, from_db, to_db};
use crate::rollups::{self, Deltas};
use crate::schema::{run_logs, task_events, task_runs, tasks};
use crate::tasks::{self as task_store, Run, RunOutcome, TransitionDetails};
use crate::{AnyConnection, DbError, write_tx};

/// The most bytes of agent output stored per run; beyond it the head is dropped (the end,
/// which holds the agent's final result, is kept).
pub const MAX_LOG_BYTES: usize = 8 * 1024 * 1024;

/// Claims the oldest `queued` task for `owner` with a lease until `now + lease`: moves it to
/// `provisioning` (event `claim`, `startedAt` set) and returns it, or `None` when nothing is
/// queued that a budget lets run.
///
/// Under monthly budgets (docs/contract.md#67-budgets) the claim takes the task's allowance
/// (what is left of its repository's and the instance's month, net of what runs in progress
/// hold) as the run's hold for its whole life, in the same transaction
/// ([`budgets::Holding::WholeRun`]; see [`claim_next_holding`] for the other way); a task no
/// budget can pay for is not claimed, and its repository's queued tasks (or every queued
/// task, for the instance's budget) are marked blocked until money is available again.
pub fn claim_next(
    conn: &mut AnyConnection,
    owner: &str,
    now: OffsetDateTime,
    lease: Duration,
) -> Result<Option<Task>, DbError> {
    claim_next_holding(conn, owner, now, lease, budgets::Holding::WholeRun)
}

/// [`claim_next`], the run holding its budgets' money as `holding` says: its whole allowance
/// from the claim on ([`budgets::Holding::WholeRun`], a run no gateway meters), or only what
/// its model calls may cost, call by call ([`budgets::Holding::PerCall`], a metered run:
/// its hold starts at zero and [`budgets::hold_call`] adds each call). Either way a task
/// whose budgets have nothing left is not claimed.
pub fn claim_next_holding(
    conn: &mut AnyConnection,
    owner: &str,
    now: OffsetDateTime,
    lease: Duration,
    holding: budgets::Holding,
) -> Result<Option<Task>, DbError> {
    let at = to_db(now);
    let until = to_db(now + lease);
    write_tx(conn, |conn| {
        // Candidates, oldest first: another claimer may win the compare-and-set on one
        // (possible on PostgreSQL between our read and our update only without the row lock,
        // i.e. never with SKIP LOCKED; kept as a guard), and a repository whose budget is
        // spent has all its queued tasks blocked at once, so each round skips a whole
        // repository.
        budgets::lock_for_claim(conn)?;
        for _ in 0..MAX_CANDIDATES {
            let Some(id) = oldest_queued(conn, now)? else {
                return Ok(None);
            };
            let before = task_store::get_task(conn, convert::uuid(&id)?)?;
            let reserve = match budgets::allowance(conn, &before, now)? {
                budgets::Allowance::Unlimited => None,
                budgets::Allowance::Reserve(nanos) => Some(match holding {
                    budgets::Holding::WholeRun => nanos.max(0),
                    budgets::Holding::PerCall => 0,
                }),
                budgets::Allowance::Exhausted(scope) => {
                    budgets::block(conn, scope, before.repo_id, now)?;
                    if scope == BudgetScope::Instance {
                        return Ok(None);
                    }
                    continue;
                }
            };
            let updated = diesel::update(
                tasks::table
                    .filter(tasks::id.eq(&id))
                    .filter(tasks::state.eq(TaskState::Queued.as_str())),
            )
            .set((
                tasks::state.eq(TaskState::Provisioning.as_str()),
                tasks::lease_owner.eq(owner),
                tasks::lease_expires_at.eq(until),
                tasks::started_at.eq(at),
                tasks::updated_at.eq(at),
                tasks::blocked_by.eq(None::<String>),
                tasks::blocked_at.eq(None::<time::PrimitiveDateTime>),
                tasks::budget_reserve_nanos.eq(reserve),
            ))
            .execute(conn)?;
            if updated == 0 {
                continue;
            }
            diesel::insert_into(task_events::table)
                .values((
                    task_events::id.eq(Uuid::now_v7().to_string()),
                    task_events::task_id.eq(&id),
                    task_events::from_state.eq(Some(TaskState::Queued.as_str())),
                    task_events::to_state.eq(TaskState::Provisioning.as_str()),
                    task_events::reason.eq(Trigger::Claim.as_str()),
                    task_events::at.eq(at),
                ))
                .execute(conn)?;
            let after = task_store::get_task(conn, before.id)?;
            rollups::apply(conn, Deltas::change(Some(&before), Some(&after))?)?;
            return Ok(Some(after));
        }
        Ok(None)
    })
}

/// Candidates one claim looks at before giving up until the next round.
const MAX_CANDIDATES: usize = 16;

/// The id of the oldest queued task no budget blocks this month, locked for this
/// transaction on PostgreSQL (skipping rows other claimers hold). A task blocked in an
/// earlier month is a candidate again.
///
/// Imported tasks are history and never candidates. The condition is written as the literal
/// predicate of the partial index `tasks_queue`, so a claim reads that index from its start,
/// however many imported tasks sit in `queued`: PostgreSQL's planner matches it (with its
/// statistics the partial index is the small one); SQLite, without statistics, would take
/// the `state` index for its equality, so it is named with `INDEXED BY` (a statement that
/// could not use it fails instead of scanning).
fn oldest_queued(conn: &mut AnyConnection, now: OffsetDateTime) -> Result<Option<String>, DbError> {
    let month = to_db(budgets::month_start(now));
    let id = match conn {
        AnyConnection::Postgresql(pg) => tasks::table
            .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                "state = 'queued' AND NOT imported",
            ))
            .filter(tasks::blocked_at.is_null().or(tasks::blocked_at.lt(month)))
            .order((tasks::created_at.asc(), tasks::id.asc()))
            .select(tasks::id)
            .limit(1)
            .for_update()
            .skip_locked()
            .first::<String>(pg)
            .optional()?,
        AnyConnection::Sqlite(lite) => {
            #[derive(QueryableByName)]
            struct Candidate {
                #[diesel(sql_type = diesel::sql_types::Text)]
                id: String,
            }
            diesel::sql_query(
                "SELECT id FROM tasks INDEXED BY tasks_queue \
                 WHERE state = 'queued' AND NOT imported \
                 AND (blocked_at IS NULL OR blocked_at < ?) \
                 ORDER BY created_at, id LIMIT 1",
            )
            .bind::<diesel::sql_types::Timestamp, _>(month)
            .get_result::<Candidate>(lite)
            .optional()?
            .map(|c| c.id)
        }
    };
    Ok(id)
}

/// Pushes the lease `owner` holds on attempt `attempt` of a task to `until`. Returns `false`
/// when the lease is no longer this run's: the task left `provisioning`/`running` (it was
/// cancelled, or its lease expired and another runner recovered it), or it is at another
/// attempt (cancelled, retried and claimed again, perhaps by the same owner: one process
/// claims under one name). The runner must then stop its run.
pub fn renew_lease(
    conn: &mut AnyConnection,
    id: Uuid,
    attempt: i32,
    owner: &str,
    until: OffsetDateTime,
) -> Result<bool, DbError> {
    push_lease(conn, (id, attempt, owner), until, true)
}

/// Renews the lease its runner keeps on attempt `attempt` of a task moved away from it (a
/// cancel; the pull request merged or closed during a round) while that attempt has no run
/// on record: the runner is stopping the agent and recording its run, and is alive. `false`
/// when the lease is not `owner`'s any more, the run is recorded, or the task is in progress
/// (then [`renew_lease`] is the one).
pub fn renew_stopped_lease(
    conn: &mut AnyConnection,
    id: Uuid,
    attempt: i32,
    owner: &str,
    until: OffsetDateTime,
) -> Result<bool, DbError> {
    write_tx(conn, |conn| {
        if attempt_recorded(conn, id, attempt)? {
            return Ok(false);
        }
        push_lease(conn, (id, attempt, owner), until, false)
    })
}

/// Moves the expiry of `owner`'s lease on attempt `attempt` of task `id` to `until`, if the
/// task is in progress (`provisioning`/`running`) or, with `in_progress` false, if it is
/// not; whether it did.
fn push_lease(
    conn: &mut AnyConnection,
    (id, attempt, owner): (Uuid, i32, &str),
    until: OffsetDateTime,
    in_progress: bool,
) -> Result<bool, DbError> {
    let working = [
        TaskState::Provisioning.as_str(),
        TaskState::Running.as_str(),
    ];
    let query = diesel::update(tasks::table)
        .filter(tasks::id.eq(id.to_string()))
        .filter(tasks::attempt.eq(attempt))
        .filter(tasks::lease_owner.eq(owner))
        .into_boxed();
    let query = if in_progress {
        query.filter(tasks::state.eq_any(working))
    } else {
        query.filter(tasks::state.ne_all(working))
    };
    let updated = query
        .set(tasks::lease_expires_at.eq(to_db(until)))
        .execute(conn)?;
    Ok(updated == 1)
}

/// Before a task whose attempt was moved away from its runner (its lease kept: see the
/// module docs) is queued again (a retry, the next revision round): when no run of that
/// attempt is on record yet, records one from the attempt's metered calls, if it made any,
/// as `lost`. The new attempt's claim replaces the lease, so recovery could not do it any
/// more; a live runner's own record then finds the attempt on record. Call it with the task
/// locked, in the transition's transaction.
pub(crate) fn record_stopped_attempt(
    conn: &mut AnyConnection,
    id: Uuid,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    let task = task_store::get_task(conn, id)?;
    let owner: Option<String> = tasks::table
        .find(id.to_string())
        .select(tasks::lease_owner)
        .first(conn)?;
    let in_progress = matches!(task.state, TaskState::Provisioning | TaskState::Running);
    if owner.is_none() || in_progress || attempt_recorded(conn, id, task.attempt)? {
        return Ok(());
    }
    let totals = crate::metering::run_totals(conn, id, task.attempt)?;
    if totals.calls == 0 {
        return Ok(());
    }
    let mut run = Run {
        // Only sandboxed runs go through the gateway.
        sandboxed: Some(true),
        error_message: Some(
            "the run was stopped, and its runner had not recorded it when the task was queued \
             again; its cost is that of its metered model calls"
                .to_owned(),
        ),
        ..Run::new(
            id,
            task.attempt,
            task.agent_type,
            RunOutcome::Lost,
            task.started_at.unwrap_or(now),
        )
    };
    totals.meter(&mut run);
    task_store::record_run(conn, &run)
}

/// A task whose runner's lease ran out.
#[derive(Debug, Clone)]
pub struct ExpiredLease {
    /// The task: still in `provisioning` or `running` ([`expired_leases`]), or moved away
    /// from its runner ([`abandoned_leases`]).
    pub task: Task,
    /// Who held the lease.
    pub owner: String,
    /// When it expired.
    pub expired_at: OffsetDateTime,
}

/// Tasks in `provisioning`/`running` whose lease expired before `before`, oldest expiry
/// first, at most `limit`. Tasks without a lease (imported history) are never returned.
pub fn expired_leases(
    conn: &mut AnyConnection,
    before: OffsetDateTime,
    limit: i64,
) -> Result<Vec<ExpiredLease>, DbError> {
    leases_expired_before(conn, before, limit, true)
}

/// The tasks no longer in progress whose lease expired before `before`, oldest expiry first,
/// at most `limit`: a user cancelled the task, or its pull request was merged or closed
/// during a revision round, while its runner held the lease. A live runner records its
/// run when it stops; a dead one never does: [`release_abandoned`] then records what its
/// attempt cost.
pub fn abandoned_leases(
    conn: &mut AnyConnection,
    before: OffsetDateTime,
    limit: i64,
) -> Result<Vec<ExpiredLease>, DbError> {
    leases_expired_before(conn, before, limit, false)
}

/// The leases expired before `before` of the tasks in progress (`provisioning`/`running`)
/// or of the others, oldest expiry first, at most `limit`, their tasks read.
fn leases_expired_before(
    conn: &mut AnyConnection,
    before: OffsetDateTime,
    limit: i64,
    in_progress: bool,
) -> Result<Vec<ExpiredLease>, DbError> {
    let working = [
        TaskState::Provisioning.as_str(),
        TaskState::Running.as_str(),
    ];
    let query = tasks::table
        .filter(tasks::lease_expires_at.lt(to_db(before)))
        .into_boxed();
    let query = if in_progress {
        query.filter(tasks::state.eq_any(working))
    } else {
        query.filter(tasks::state.ne_all(working))
    };
    let rows: Vec<(String, Option<String>, Option<PrimitiveDateTime>)> = query
        .order((tasks::lease_expires_at.asc(), tasks::id.asc()))
        .select((tasks::id, tasks::lease_owner, tasks::lease_expires_at))
        .limit(limit)
        .load(conn)?;
    rows.into_iter()
        .filter_map(|(id, owner, expires)| Some((id, owner?, expires?)))
        .map(|(id, owner, expires)| {
            Ok(ExpiredLease {
                task: task_store::get_task(conn, convert::uuid(&id)?)?,
                owner,
                expired_at: from_db(expires),
            })
        })
        .collect()
}

/// Releases the expired lease of a task no longer in progress ([`abandoned_leases`]), in one
/// transaction: records `lost_run` (what the attempt cost, from its metered calls or its
/// runner's output) unless a run of the attempt is on record, and clears the lease. No
/// state changes. `false` when the lease is no longer expired or no longer `owner`'s.
pub fn release_abandoned(
    conn: &mut AnyConnection,
    abandoned: &ExpiredLease,
    before: OffsetDateTime,
    lost_run: Option<(&Run, Option<&RunLog>)>,
    now: OffsetDateTime,
) -> Result<bool, DbError> {
    write_tx(conn, |conn| {
        let taken = diesel::update(
            tasks::table
                .filter(tasks::id.eq(abandoned.task.id.to_string()))
                .filter(tasks::lease_owner.eq(&abandoned.owner))
                .filter(tasks::lease_expires_at.lt(to_db(before)))
                .filter(tasks::attempt.eq(abandoned.task.attempt)),
        )
        .set((
            tasks::lease_owner.eq(None::<String>),
            tasks::lease_expires_at.eq(None::<PrimitiveDateTime>),
        ))
        .execute(conn)?;
        if taken == 0 {
            return Ok(false);
        }
        record_lost(conn, lost_run, now)?;
        Ok(true)
    })
}

/// Recovers a task whose lease (held by `owner`) expired before `before`, in one
/// transaction: records `lost_run` (the dead runner's run, with whatever its output showed)
/// and its log, and applies [`Trigger::LeaseExpired`]: back to `queued` with the next
/// attempt, or `failed` after the last attempt. Returns `None` when the lease is no longer
/// expired or no longer `owner`'s (it was renewed, or someone else recovered it).
pub fn recover_expired(
    conn: &mut AnyConnection,
    expired: &ExpiredLease,
    before: OffsetDateTime,
    lost_run: Option<(&Run, Option<&RunLog>)>,
    now: OffsetDateTime,
) -> Result<Option<(Task, Transition)>, DbError> {
    write_tx(conn, |conn| {
        // Take the lease away first: this row update is the compare-and-set that makes one
        // recoverer win, and it locks the row for the rest of the transaction.
        let taken = diesel::update(
            tasks::table
                .filter(tasks::id.eq(expired.task.id.to_string()))
                .filter(tasks::lease_owner.eq(&expired.owner))
                .filter(tasks::lease_expires_at.lt(to_db(before)))
                .filter(tasks::attempt.eq(expired.task.attempt))
                .filter(tasks::state.eq_any([
                    TaskState::Provisioning.as_str(),
                    TaskState::Running.as_str(),
                ])),
        )
        .set(tasks::lease_owner.eq(None::<String>))
        .execute(conn)?;
        if taken == 0 {
            return Ok(None);
        }
        // The dead runner may have recorded its run before it died (a run is recorded as
        // soon as its agent ends, before publishing): one run per attempt.
        record_lost(conn, lost_run, now)?;
        let attempt = expired.task.attempt;
        let details = TransitionDetails {
            reason: Some(format!(
                "the runner of attempt {attempt} stopped renewing its lease"
            )),
            error_message: Some(format!(
                "the runner died during each of {attempt} attempts; not retried again"
            )),
            pull_request: None,
        };
        let (task, t) = task_store::transition_task(
            conn,
            expired.task.id,
            Trigger::LeaseExpired,
            &details,
            now,
        )?;
        Ok(Some((task, t)))
    })
}

/// Records `lost_run` (a dead runner's run and its log, if any) unless a run of its attempt
/// is on record: one run per attempt (the runner may have recorded it before it died).
fn record_lost(
    conn: &mut AnyConnection,
    lost_run: Option<(&Run, Option<&RunLog>)>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    if let Some((run, log)) = lost_run
        && !attempt_recorded(conn, run.task_id, run.attempt)?
    {
        task_store::record_run(conn, run)?;
        if let Some(log) = log {
            save_run_log(conn, run.id, run.task_id, log, now)?;
        }
    }
    Ok(())
}

/// What [`record_finished_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunRecorded {
    /// Recorded, and its attempt is still the task's current one: its outcome is the
    /// recording runner's to publish.
    Current,
    /// Recorded, but the task was recovered meanwhile and its current attempt is another:
    /// the cost counts (it was spent), the outcome is not published.
    Late,
    /// Recorded, and its attempt is the task's current one, but the task left
    /// `provisioning`/`running` meanwhile (it was cancelled while the agent's work was being
    /// committed or pushed): the cost counts, nothing is published.
    Stopped,
    /// Nothing written: a run of that attempt is already on record (a recoverer salvaged
    /// it from the same output), or the task is gone.
    AlreadyRecorded,
}

/// Records the run of an agent that just ended, with its output log, as soon as its result
/// is known and before anything is published: its cost must not depend on this process
/// living on, nor on which replica recovers the task if it does not.
///
/// One run per attempt: nothing is written when a run of `run.attempt` is already recorded.
/// For the task's current attempt the budget reserve is released in the same transaction,
/// since the run's cost now counts as spent.
pub fn record_finished_run(
    conn: &mut AnyConnection,
    run: &Run,
    log: &RunLog,
    now: OffsetDateTime,
) -> Result<RunRecorded, DbError> {
    write_tx(conn, |conn| {
        // Lock the task row first: on PostgreSQL a concurrent recoverer (which takes the
        // lease with an update of this row) waits for this transaction, then sees the run.
        let locked = diesel::update(tasks::table.find(run.task_id.to_string()))
            .set(tasks::updated_at.eq(tasks::updated_at))
            .execute(conn)?;
        if locked == 0 || attempt_recorded(conn, run.task_id, run.attempt)? {
            return Ok(RunRecorded::AlreadyRecorded);
        }
        let current = diesel::update(
            tasks::table
                .filter(tasks::id.eq(run.task_id.to_string()))
                .filter(tasks::attempt.eq(run.attempt)),
        )
        .set(tasks::budget_reserve_nanos.eq(None::<i64>))
        .execute(conn)?
            > 0;
        let state: String = tasks::table
            .find(run.task_id.to_string())
            .select(tasks::state)
            .first(conn)?;
        let in_progress =
            state == TaskState::Provisioning.as_str() || state == TaskState::Running.as_str();
        task_store::record_run(conn, run)?;
        save_run_log(conn, run.id, run.task_id, log, now)?;
        if current && !in_progress {
            // The lease kept for this run while it was being stopped has served.
            diesel::update(tasks::table.find(run.task_id.to_string()))
                .set((
                    tasks::lease_owner.eq(None::<String>),
                    tasks::lease_expires_at.eq(None::<PrimitiveDateTime>),
                ))
                .execute(conn)?;
        }
        Ok(match (current, in_progress) {
            (true, true) => RunRecorded::Current,
            (true, false) => RunRecorded::Stopped,
            (false, _) => RunRecorded::Late,
        })
    })
}

/// Whether a run of `attempt` of the task is recorded.
pub fn attempt_recorded(
    conn: &mut AnyConnection,
    task_id: Uuid,
    attempt: i32,
) -> Result<bool, DbError> {
    let n: i64 = task_runs::table
        .filter(task_runs::task_id.eq(task_id.to_string()))
        .filter(task_runs::attempt.eq(attempt))
        .count()
        .get_result(conn)?;
    Ok(n > 0)
}

/// The output of one run, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLog {
    /// The agent's output (at most [`MAX_LOG_BYTES`]).
    pub content: String,
    /// Whether the head of the output was dropped to fit.
    pub truncated: bool,
}

impl RunLog {
    /// The log of `output`: NUL characters removed (PostgreSQL text cannot hold them), and
    /// cut to its last [`MAX_LOG_BYTES`] bytes at a character boundary.
    pub fn of(output: &str) -> RunLog {
        let clean = crate::convert::text(output);
        if clean.len() <= MAX_LOG_BYTES {
            return RunLog {
                content: clean.into_owned(),
                truncated: false,
            };
        }
        RunLog {
            content: agentry_domain::quote::tail(&clean, MAX_LOG_BYTES).to_owned(),
            truncated: true,
        }
    }
}

/// Stores the log of a recorded run: in its own transaction, or as a savepoint of the
/// caller's (call it in the transaction that records the run, so both commit together).
pub fn save_run_log(
    conn: &mut AnyConnection,
    run_id: Uuid,
    task_id: Uuid,
    log: &RunLog,
    at: OffsetDateTime,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        diesel::insert_into(run_logs::table)
            .values((
                run_logs::run_id.eq(run_id.to_string()),
                run_logs::task_id.eq(task_id.to_string()),
                run_logs::content.eq(&log.content),
                run_logs::truncated.eq(log.truncated),
                run_logs::created_at.eq(to_db(at)),
            ))
            .execute(conn)?;
        Ok(())
    })
}

/// The log of the task's latest recorded run (by start time) that has one, with the run's
/// id and attempt.
pub fn latest_run_log(
    conn: &mut AnyConnection,
    task_id: Uuid,
) -> Result<Option<(Uuid, i32, RunLog)>, DbError> {
    let row: Option<(String, i32, String, bool)> = run_logs::table
        .inner_join(task_runs::table)
        .filter(run_logs::task_id.eq(task_id.to_string()))
        .order((task_runs::started_at.desc(), task_runs::id.desc()))
        .select((
            run_logs::run_id,
            task_runs::attempt,
            run_logs::content,
            run_logs::truncated,
        ))
        .first(conn)
        .optional()?;
    row.map(|(id, attempt, content, truncated)| {
        Ok((convert::uuid(&id)?, attempt, RunLog { content, truncated }))
    })
    .transpose()
}
