//! Monthly budgets (docs/contract.md#67-budgets): the instance-wide budget, what was spent
//! this month, what running tasks hold, and which queued tasks no budget can pay for.
//!
//! The month is the UTC calendar month. What a month spent is the cost of the runs that
//! finished in it (a lost run, whose end is not known, in the month it started); what is
//! held (`tasks.budget_reserve_nanos`, counted while the task is being provisioned or run,
//! so it goes away when the task leaves those states) is either a run's whole allowance,
//! taken by its claim ([`Holding::WholeRun`]), or a metered run's calls: their costs so far
//! and the reservations of those in flight ([`Holding::PerCall`], [`hold_call`]). Both are
//! decided in one transaction each against what is left, so parallel runs never share one
//! remainder.

use agentry_domain::{BudgetScope, Task, TaskState, Usd};
use diesel::prelude::*;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::convert::{self, to_db};
use crate::fetch::Fetch;
use crate::schema::{instance_budget, repositories, run_cost_rollup, tasks};
use crate::{AnyConnection, DbError, write_tx};

/// Midnight UTC of the first day of `now`'s month.
pub fn month_start(now: OffsetDateTime) -> OffsetDateTime {
    let now = now.to_offset(time::UtcOffset::UTC);
    now.replace_day(1)
        .map(|d| d.replace_time(time::Time::MIDNIGHT))
        .unwrap_or(now)
}

/// The instance-wide monthly budget, if one is set.
pub fn instance_budget(conn: &mut AnyConnection) -> Result<Option<Usd>, DbError> {
    let nanos: Option<Option<i64>> = instance_budget::table
        .find(1)
        .select(instance_budget::monthly_budget_nanos)
        .first(conn)
        .optional()?;
    convert::usd(nanos.flatten())
}

/// Sets (or with `None` removes) the instance-wide monthly budget. Queued tasks blocked by a
/// budget become candidates again: the next claim decides anew.
pub fn set_instance_budget(
    conn: &mut AnyConnection,
    budget: Option<Usd>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        // The budget row first, then the tasks: the order a claim locks them in.
        let updated = diesel::update(instance_budget::table.find(1))
            .set((
                instance_budget::monthly_budget_nanos.eq(budget.map(Usd::to_nanos)),
                instance_budget::updated_at.eq(to_db(now)),
            ))
            .execute(conn)?;
        if updated == 0 {
            diesel::insert_into(instance_budget::table)
                .values((
                    instance_budget::id.eq(1),
                    instance_budget::monthly_budget_nanos.eq(budget.map(Usd::to_nanos)),
                    instance_budget::updated_at.eq(to_db(now)),
                ))
                .execute(conn)?;
        }
        unblock(conn, None)?;
        Ok(())
    })
}

/// Nano-dollars spent in `now`'s month: the runs that finished in it (UTC), of one
/// repository or (`None`) of every task.
///
/// Read from the run-cost rollup that `tasks::record_run` adds to in its transaction
/// ([`crate::scrape::month_spent_nanos`]), so a claim's budget check costs the same at a
/// million runs as at ten: it reads one row per repository, task type and model of the
/// month, never the run ledger.
pub fn spent_nanos(
    conn: &mut AnyConnection,
    repo: Option<Uuid>,
    now: OffsetDateTime,
) -> Result<i64, DbError> {
    crate::scrape::month_spent_nanos(conn, repo, now)
}

/// Nano-dollars reserved by the tasks being provisioned or run, of one repository or of
/// every task.
pub fn reserved_nanos(conn: &mut AnyConnection, repo: Option<Uuid>) -> Result<i64, DbError> {
    let mut query = tasks::table
        .filter(tasks::state.eq_any([
            TaskState::Provisioning.as_str(),
            TaskState::Running.as_str(),
        ]))
        .filter(tasks::budget_reserve_nanos.is_not_null())
        .select(tasks::budget_reserve_nanos)
        .into_boxed();
    if let Some(repo) = repo {
        query = query.filter(tasks::repo_id.eq(repo.to_string()));
    }
    let reserves: Vec<Option<i64>> = query.load(conn)?;
    Ok(reserves
        .into_iter()
        .flatten()
        .fold(0i64, i64::saturating_add))
}

/// A budget with what its month has used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonthToDate {
    /// The monthly budget, if set.
    pub budget: Option<Usd>,
    /// Spent by runs that finished this month.
    pub spent: Usd,
    /// Reserved by runs in progress.
    pub reserved: Usd,
}

/// The instance-wide budget and its month so far.
pub fn instance_month(
    conn: &mut AnyConnection,
    now: OffsetDateTime,
) -> Result<MonthToDate, DbError> {
    Ok(MonthToDate {
        budget: instance_budget(conn)?,
        spent: usd(spent_nanos(conn, None, now)?)?,
        reserved: usd(reserved_nanos(conn, None)?)?,
    })
}

/// A repository's budget and its month so far.
pub fn repository_month(
    conn: &mut AnyConnection,
    repo: Uuid,
    now: OffsetDateTime,
) -> Result<MonthToDate, DbError> {
    let budget: Option<i64> = repositories::table
        .find(repo.to_string())
        .select(repositories::monthly_budget_nanos)
        .existing(conn)?;
    Ok(MonthToDate {
        budget: convert::usd(budget)?,
        spent: usd(spent_nanos(conn, Some(repo), now)?)?,
        reserved: usd(reserved_nanos(conn, Some(repo))?)?,
    })
}

fn usd(nanos: i64) -> Result<Usd, DbError> {
    convert::usd_of(nanos.max(0))
}

/// On PostgreSQL, when any monthly budget is set, takes the budget row's lock for the rest of
/// the claim's transaction, before any task row: claims of several replicas then decide on
/// the money one at a time, and every transaction that locks both takes the budget row
/// first (no deadlock). SQLite's immediate transactions are serialised already.
pub(crate) fn lock_for_claim(conn: &mut AnyConnection) -> Result<(), DbError> {
    let AnyConnection::Postgresql(_) = conn else {
        return Ok(());
    };
    let any_repository: Option<String> = repositories::table
        .filter(repositories::monthly_budget_nanos.is_not_null())
        .select(repositories::id)
        .first(conn)
        .optional()?;
    if any_repository.is_none() && instance_budget(conn)?.is_none() {
        return Ok(());
    }
    lock_budget_row(conn)
}

/// What a claim of a task may do under the budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowance {
    /// No monthly budget applies: run, reserving nothing.
    Unlimited,
    /// Run, reserving at most this many nano-dollars (> 0).
    Reserve(i64),
    /// This budget has nothing left this month.
    Exhausted(BudgetScope),
}

/// What a claim of `task` may reserve: what is left this month of the budgets it counts
/// against (its repository's and the instance's, minus the reserves of runs in progress),
/// and at most what is left of the task's own cap (`maxCostPerTaskUsd`), so runs with a cap
/// can run side by side under one budget. Called inside the claim's transaction (on
/// PostgreSQL after locking the budget row, so claims of several replicas take their
/// reserves one by one, see [`lock_for_claim`]).
pub(crate) fn allowance(
    conn: &mut AnyConnection,
    task: &Task,
    now: OffsetDateTime,
) -> Result<Allowance, DbError> {
    let repo = task.repo_id;
    let (repo_budget, cap) = match repo {
        Some(repo) => repositories::table
            .find(repo.to_string())
            .select((
                repositories::monthly_budget_nanos,
                repositories::max_cost_per_task_nanos,
            ))
            .first::<(Option<i64>, Option<i64>)>(conn)
            .optional()?
            .unwrap_or((None, None)),
        None => (None, None),
    };
    let instance = instance_budget(conn)?.map(Usd::to_nanos);
    if repo_budget.is_none() && instance.is_none() {
        return Ok(Allowance::Unlimited);
    }
    let repo_id = repo.map(|r| r.to_string());
    let Usage { spent, held } = month_usage(conn, repo_id.as_deref(), now)?;
    let mut left: Option<i64> = None;
    if let (Some(budget), Some(_)) = (repo_budget, repo) {
        let rest = budget.saturating_sub(spent.repo).saturating_sub(held.repo);
        if rest <= 0 {
            return Ok(Allowance::Exhausted(BudgetScope::Repository));
        }
        left = Some(rest);
    }
    if let Some(budget) = instance {
        let rest = budget.saturating_sub(spent.all).saturating_sub(held.all);
        if rest <= 0 {
            return Ok(Allowance::Exhausted(BudgetScope::Instance));
        }
        left = Some(left.map_or(rest, |l| l.min(rest)));
    }
    if let (Some(cap), Some(l)) = (cap, left) {
        let spent = task.cost_usd.map_or(0, Usd::to_nanos);
        // A task past its cap is failed by the runner; it reserves nothing meanwhile.
        left = Some(l.min(cap.saturating_sub(spent).max(0)));
    }
    Ok(left.map_or(Allowance::Unlimited, Allowance::Reserve))
}

/// How a claimed run holds its budgets' money ([`crate::runner::claim_next_holding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// The run holds its whole allowance from the claim until it ends: the only safe choice
    /// when nothing meters the run as it goes (an unsandboxed agent reports its cost only at
    /// its end).
    WholeRun,
    /// The run holds what its model calls may cost, call by call: zero at the claim, each
    /// call's reservation added before it is sent ([`hold_call`]) and replaced by its cost
    /// when it is recorded ([`crate::metering::record_call`]). Runs under one budget then
    /// run side by side.
    PerCall,
}

/// What the monthly budgets said about one model call ([`hold_call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallHold {
    /// No monthly budget applies to the run's task: nothing was held.
    Unbudgeted,
    /// The call fits: its reservation is now part of the run's hold.
    Held,
    /// The call does not fit what is left of this budget: nothing was held.
    Refused(Shortfall),
    /// The attempt is not a run in progress any more (recorded, recovered or cancelled):
    /// nothing was held.
    NotRunning,
}

/// A budget a call did not fit, as it stood when the call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// Which budget.
    pub scope: BudgetScope,
    /// The monthly budget.
    pub budget: Usd,
    /// Spent this month by the runs that finished.
    pub spent: Usd,
    /// Held by the runs in progress under this budget (this one included): their metered
    /// calls so far and the reservations of their calls in flight.
    pub held: Usd,
}

impl Shortfall {
    /// What is left of the budget for new calls (never below zero).
    pub fn left(&self) -> Usd {
        Usd::from_nanos(
            self.budget
                .to_nanos()
                .saturating_sub(self.spent.to_nanos())
                .saturating_sub(self.held.to_nanos())
                .max(0),
        )
        .unwrap_or(Usd::ZERO)
    }
}

/// Holds `amount` (a model call's largest cost) for attempt `attempt` of `task` against the
/// monthly budgets of its repository and of the instance, if it fits what each has left:
/// the budget minus what the month's finished runs spent minus what the runs in progress
/// hold, this one's hold included. The hold is the task's `budget_reserve_nanos`, so it
/// counts wherever reserves count (claims, `GET /api/budget`) and ends with the run.
///
/// One decision at a time across replicas: on PostgreSQL the budget row is locked first,
/// as a claim locks it; SQLite's immediate transaction serialises the
/// writers of its one process. A run claimed before any budget applied holds nothing yet;
/// its first held call starts its hold at the metered cost of its calls so far.
///
/// Reads only, without a write transaction, when no monthly budget applies.
pub fn hold_call(
    conn: &mut AnyConnection,
    task: Uuid,
    attempt: i32,
    amount: Usd,
    now: OffsetDateTime,
) -> Result<CallHold, DbError> {
    if !any_budget_for(conn, task)? {
        // Nothing to hold, but a run that is over sends nothing either: a cancelled run's
        // agent, or one that lives on after its task was recovered elsewhere, spends for
        // no one.
        return Ok(if still_running(conn, task, attempt)? {
            CallHold::Unbudgeted
        } else {
            CallHold::NotRunning
        });
    }
    write_tx(conn, |conn| {
        lock_budget_row(conn)?;
        // Then the task's row (one order with claims: the budget row first), so that the hold
        // read below is the last one: on PostgreSQL the run's recorded calls
        // ([`crate::metering::record_held_call`]) and its recording
        // ([`crate::runner::record_finished_run`]) change it under that row's lock, and wait
        // for this decision or are seen by it, never overwritten by it.
        match crate::revisions::lock_task(conn, task) {
            Err(DbError::NotFound) => return Ok(CallHold::NotRunning),
            locked => locked?,
        }
        // Few round trips while the lock is held: the task with its repository's budget,
        // the instance's budget, the month's spend and what runs hold, each read once.
        let row: Option<HoldRow> = tasks::table
            .left_join(repositories::table)
            .filter(tasks::id.eq(task.to_string()))
            .select((
                tasks::repo_id,
                tasks::state,
                tasks::attempt,
                tasks::budget_reserve_nanos,
                repositories::monthly_budget_nanos.nullable(),
            ))
            .first(conn)
            .optional()?;
        let Some((repo, state, current, hold, repo_budget)) = row else {
            return Ok(CallHold::NotRunning);
        };
        let in_progress =
            state == TaskState::Provisioning.as_str() || state == TaskState::Running.as_str();
        if !in_progress || current != attempt {
            return Ok(CallHold::NotRunning);
        }
        let repo_budget = repo_budget.filter(|_| repo.is_some());
        let instance = instance_budget(conn)?.map(Usd::to_nanos);
        if repo_budget.is_none() && instance.is_none() {
            return Ok(CallHold::Unbudgeted);
        }
        // A hold not started yet (claimed while no budget applied) starts at what the run
        // has spent so far; it is not among the holds summed below.
        let (hold, unlisted) = match hold {
            Some(hold) => (hold, 0),
            // The run is recorded (its hold cleared, its cost spent) while the task is still
            // running (publishing): a call that raced the recording holds nothing.
            None if crate::runner::attempt_recorded(conn, task, attempt)? => {
                return Ok(CallHold::NotRunning);
            }
            None => {
                let spent = crate::metering::run_totals(conn, task, attempt)?
                    .cost_usd
                    .map_or(0, Usd::to_nanos);
                (spent, spent)
            }
        };
        let Usage { spent, held } = month_usage(conn, repo.as_deref(), now)?;
        let amount = amount.to_nanos();
        let budgets = [
            (BudgetScope::Repository, repo_budget, spent.repo, held.repo),
            (BudgetScope::Instance, instance, spent.all, held.all),
        ];
        for (scope, budget, spent, held) in budgets {
            let Some(budget) = budget else {
                continue;
            };
            let held = held.saturating_add(unlisted);
            let left = budget.saturating_sub(spent).saturating_sub(held);
            if amount > left {
                return Ok(CallHold::Refused(Shortfall {
                    scope,
                    budget: usd(budget)?,
                    spent: usd(spent)?,
                    held: usd(held)?,
                }));
            }
        }
        diesel::update(tasks::table.find(task.to_string()))
            .set(tasks::budget_reserve_nanos.eq(Some(hold.saturating_add(amount))))
            .execute(conn)?;
        Ok(CallHold::Held)
    })
}

/// Whether attempt `attempt` of `task` is the task's current one, in progress and not on
/// record: the one run whose model calls may still be sent.
fn still_running(conn: &mut AnyConnection, task: Uuid, attempt: i32) -> Result<bool, DbError> {
    let row: Option<(String, i32)> = tasks::table
        .find(task.to_string())
        .select((tasks::state, tasks::attempt))
        .first(conn)
        .optional()?;
    let Some((state, current)) = row else {
        return Ok(false);
    };
    let in_progress =
        state == TaskState::Provisioning.as_str() || state == TaskState::Running.as_str();
    Ok(in_progress && current == attempt && !crate::runner::attempt_recorded(conn, task, attempt)?)
}

/// A task as [`hold_call`] reads it: its repository, state, attempt, hold, and its
/// repository's monthly budget.
type HoldRow = (Option<String>, String, i32, Option<i64>, Option<i64>);

/// What a month has spent and what the runs in progress hold.
struct Usage {
    /// Spent by the runs recorded in the month ([`crate::tasks::Run::spend_time`]).
    spent: Sums,
    /// Held by the tasks being provisioned or run.
    held: Sums,
}

/// What `now`'s month has spent and what runs in progress hold, of repository `repo` (by
/// id) and of all, read in **one** statement. On PostgreSQL (read committed: a snapshot per
/// statement) two reads could straddle a run's recording, which moves its cost from the
/// held to the spent in one transaction, and miss it in both.
fn month_usage(
    conn: &mut AnyConnection,
    repo: Option<&str>,
    now: OffsetDateTime,
) -> Result<Usage, DbError> {
    use diesel::dsl::sql;
    use diesel::sql_types::Bool;
    let spent = run_cost_rollup::table
        .filter(run_cost_rollup::month.eq(crate::alerts::month_key(now)))
        .select((
            run_cost_rollup::repo_id.nullable(),
            run_cost_rollup::cost_nanos,
            sql::<Bool>("FALSE"),
        ));
    let held = tasks::table
        .filter(tasks::state.eq_any([
            TaskState::Provisioning.as_str(),
            TaskState::Running.as_str(),
        ]))
        .filter(tasks::budget_reserve_nanos.is_not_null())
        .select((
            tasks::repo_id,
            tasks::budget_reserve_nanos.assume_not_null(),
            sql::<Bool>("TRUE"),
        ));
    let rows: Vec<(Option<String>, i64, bool)> =
        crate::connection::native_load(conn, spent.union_all(held))?;
    let (held, spent): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(_, _, held)| *held);
    let sums = |rows: Vec<(Option<String>, i64, bool)>| {
        by_repository(
            rows.into_iter()
                .map(|(id, nanos, _)| (id.unwrap_or_default(), nanos))
                .collect(),
            repo,
        )
    };
    Ok(Usage {
        spent: sums(spent),
        held: sums(held),
    })
}

/// Nano-dollars of one repository and of all.
struct Sums {
    repo: i64,
    all: i64,
}

/// Sums `rows` (repository id, nano-dollars): those of `repo`, and all of them.
fn by_repository(rows: Vec<(String, i64)>, repo: Option<&str>) -> Sums {
    rows.into_iter()
        .fold(Sums { repo: 0, all: 0 }, |sums, (id, nanos)| Sums {
            repo: if Some(id.as_str()) == repo {
                sums.repo.saturating_add(nanos)
            } else {
                sums.repo
            },
            all: sums.all.saturating_add(nanos),
        })
}

/// Whether a monthly budget may apply to `task`: the instance's, or its repository's.
fn any_budget_for(conn: &mut AnyConnection, task: Uuid) -> Result<bool, DbError> {
    if instance_budget(conn)?.is_some() {
        return Ok(true);
    }
    let budget: Option<Option<i64>> = tasks::table
        .inner_join(repositories::table)
        .filter(tasks::id.eq(task.to_string()))
        .select(repositories::monthly_budget_nanos)
        .first(conn)
        .optional()?;
    Ok(budget.flatten().is_some())
}

/// On PostgreSQL, locks the budget row for the rest of the transaction (see
/// [`lock_for_claim`]).
fn lock_budget_row(conn: &mut AnyConnection) -> Result<(), DbError> {
    if let AnyConnection::Postgresql(pg) = conn {
        instance_budget::table
            .find(1)
            .select(instance_budget::id)
            .for_update()
            .first::<i32>(pg)
            .optional()?;
    }
    Ok(())
}

/// Marks the queued tasks `scope` keeps from running as blocked: those of `repo` for a
/// repository's budget, every queued task for the instance's; never imported ones.
pub(crate) fn block(
    conn: &mut AnyConnection,
    scope: BudgetScope,
    repo: Option<Uuid>,
    now: OffsetDateTime,
) -> Result<usize, DbError> {
    // Imported history is never claimed, so no budget keeps it from running.
    let mut query = diesel::update(tasks::table)
        .filter(tasks::state.eq(TaskState::Queued.as_str()))
        .filter(tasks::imported.eq(false))
        .into_boxed();
    if scope == BudgetScope::Repository {
        let Some(repo) = repo else { return Ok(0) };
        query = query.filter(tasks::repo_id.eq(repo.to_string()));
    }
    Ok(query
        .set((
            tasks::blocked_by.eq(scope.as_str()),
            tasks::blocked_at.eq(to_db(now)),
        ))
        .execute(conn)?)
}

/// Makes the blocked queued tasks (of `repo`, or all) candidates again, after money may have
/// become available (a budget changed, a run ended under its reserve). Returns how many.
///
/// The blocked tasks are found through the partial index `tasks_blocked` (a query on
/// `blocked_at IS NOT NULL` alone, which both planners match to it), so the cost follows
/// the number of blocked tasks, not the length of the queue.
///
/// On PostgreSQL it takes the budget row's lock first, as claims do: a
/// claim deciding to block when the money came back then finishes first, and its blocks are
/// seen here and lifted (read beside it, they were not yet there, and stayed until the month
/// turned); the task rows are then locked in one order by every writer of blocks.
pub fn unblock(conn: &mut AnyConnection, repo: Option<Uuid>) -> Result<usize, DbError> {
    write_tx(conn, |conn| {
        lock_budget_row(conn)?;
        let blocked: Vec<(String, String, Option<String>)> = tasks::table
            .filter(tasks::blocked_at.is_not_null())
            .select((tasks::id, tasks::state, tasks::repo_id))
            .load(conn)?;
        let repo = repo.map(|r| r.to_string());
        let ids: Vec<String> = blocked
            .into_iter()
            .filter(|(_, state, task_repo)| {
                state == TaskState::Queued.as_str()
                    && repo.as_ref().is_none_or(|r| task_repo.as_ref() == Some(r))
            })
            .map(|(id, _, _)| id)
            .collect();
        let mut unblocked = 0;
        // Bound parameters stay far under SQLite's and PostgreSQL's limits.
        for chunk in ids.chunks(5_000) {
            unblocked += diesel::update(tasks::table)
                .filter(tasks::id.eq_any(chunk))
                .filter(tasks::state.eq(TaskState::Queued.as_str()))
                .filter(tasks::blocked_at.is_not_null())
                .set((
                    tasks::blocked_by.eq(None::<String>),
                    tasks::blocked_at.eq(None::<time::PrimitiveDateTime>),
                ))
                .execute(conn)?;
        }
        Ok(unblocked)
    })
}

/// The reserve of a claimed task, if a budget gave it one.
pub fn reserve_of(conn: &mut AnyConnection, task: Uuid) -> Result<Option<Usd>, DbError> {
    let nanos: Option<i64> = tasks::table
        .find(task.to_string())
        .select(tasks::budget_reserve_nanos)
        .existing(conn)?;
    convert::usd(nanos)
}

/// A monthly budget that is set, with the spend of `now`'s month.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetBudget {
    /// `None` for the instance's budget, else the connected repository's URL.
    pub repo_url: Option<agentry_domain::RepoUrl>,
    /// The budget.
    pub budget: Usd,
    /// What the runs that finished this month cost.
    pub spent: Usd,
}

/// The connected repositories with a monthly budget, by URL (only the repository whose
/// normalised URL is `only`, when given): (id, URL, budget in nano-dollars).
pub(crate) fn repository_budgets(
    conn: &mut AnyConnection,
    only: Option<&str>,
) -> Result<Vec<(String, String, i64)>, DbError> {
    let mut query = repositories::table
        .filter(repositories::monthly_budget_nanos.is_not_null())
        .filter(repositories::disconnected_at.is_null())
        .select((
            repositories::id,
            repositories::url,
            repositories::monthly_budget_nanos.assume_not_null(),
        ))
        .order(repositories::url.asc())
        .into_boxed();
    if let Some(url) = only {
        query = query.filter(repositories::url.eq(url.to_owned()));
    }
    Ok(query.load(conn)?)
}

/// Every monthly budget that is set: the instance's first, then those of connected
/// repositories by URL (only the repository whose normalised URL is `only`, when given).
pub fn all_set(
    conn: &mut AnyConnection,
    only: Option<&str>,
    now: OffsetDateTime,
) -> Result<Vec<SetBudget>, DbError> {
    all_set_with(conn, only, now, spent_nanos)
}

/// [`all_set`] with the month's spend of a repository (or of all, `None`) computed by
/// `spent` (e.g. from the run cost rollup, for `/metrics`).
pub fn all_set_with(
    conn: &mut AnyConnection,
    only: Option<&str>,
    now: OffsetDateTime,
    spent: fn(&mut AnyConnection, Option<Uuid>, OffsetDateTime) -> Result<i64, DbError>,
) -> Result<Vec<SetBudget>, DbError> {
    let spent_nanos = spent;
    let mut set = Vec::new();
    if let Some(budget) = instance_budget(conn)? {
        set.push(SetBudget {
            repo_url: None,
            budget,
            spent: usd(spent_nanos(conn, None, now)?)?,
        });
    }
    for (id, url, budget) in repository_budgets(conn, only)? {
        let Some(budget) = convert::usd(Some(budget))? else {
            continue;
        };
        set.push(SetBudget {
            repo_url: Some(convert::parse("repository URL", &url)?),
            budget,
            spent: usd(spent_nanos(conn, Some(convert::uuid(&id)?), now)?)?,
        });
    }
    Ok(set)
}
