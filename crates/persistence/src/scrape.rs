//! What `/metrics` reads at each scrape (docs/contract.md#311-metrics), from small rollup
//! tables kept in the writing transactions, never from the run ledger or the task table:
//!
//! - `run_cost_rollup`: the recorded cost of agent runs per month the run finished in (a
//!   lost run, whose end is not known, in the month it started),
//!   repository, task type and run model, added to by [`crate::tasks::record_run`];
//! - `egress_blocked_repo`: the connections the egress proxy refused, per repository URL,
//!   added to by [`crate::metering::record_blocked_batch`].
//!
//! A scrape reads these, the budgets and the connected repositories: its cost depends on the
//! number of repositories, models and months, not on the number of runs.

use std::collections::{BTreeMap, BTreeSet};

use agentry_domain::Task;
use diesel::prelude::*;
use time::{OffsetDateTime, UtcOffset};

use crate::budgets::{self, SetBudget};
use crate::connection::native_execute;
use crate::rollups::Combo;
use crate::schema::{egress_blocked_repo as ebr, repositories, run_cost_rollup as rcr, tasks};
use crate::{AnyConnection, DbError};

/// Everything a scrape reports, for connected repositories only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scrape {
    /// The exact recorded run cost in nano-dollars per (repository URL, task type, model;
    /// `""` = unknown), for connected repositories, ordered.
    pub costs: Vec<(Combo, i64)>,
    /// Every monthly budget that is set (as [`budgets::all_set`]), with this month's spend.
    pub budgets: Vec<SetBudget>,
    /// Refused egress connections per connected repository URL, ordered by URL.
    pub egress_blocked: Vec<(String, i64)>,
}

/// The `YYYY-MM` (UTC) month key of a time.
fn month_key(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

/// Adds a recorded run's cost to `run_cost_rollup`, in the caller's transaction. `task` is
/// the run's task (its repository and type), `model` the run's model, `month_of` the time
/// whose month the cost counts in ([`crate::tasks::Run::spend_time`]).
pub(crate) fn add_run_cost(
    conn: &mut AnyConnection,
    task: &Task,
    model: Option<&str>,
    cost_nanos: i64,
    month_of: OffsetDateTime,
) -> Result<(), DbError> {
    let row = (
        rcr::month.eq(month_key(month_of)),
        rcr::repo_id.eq(task.repo_id.map(|id| id.to_string()).unwrap_or_default()),
        rcr::repo_url.eq(task.repo_url.as_str().to_owned()),
        rcr::task_type.eq(task.task_type.as_str().to_owned()),
        rcr::model.eq(model.unwrap_or_default().to_owned()),
        rcr::cost_nanos.eq(cost_nanos),
    );
    let key = (
        rcr::month,
        rcr::repo_id,
        rcr::repo_url,
        rcr::task_type,
        rcr::model,
    );
    let add = rcr::cost_nanos.eq(rcr::cost_nanos + cost_nanos);
    native_execute(
        conn,
        diesel::insert_into(rcr::table)
            .values(row)
            .on_conflict(key)
            .do_update()
            .set(add),
    )?;
    Ok(())
}

/// Adds `count` refused connections of a task's run to `egress_blocked_repo`, in the
/// caller's transaction.
pub(crate) fn add_blocked(
    conn: &mut AnyConnection,
    task_id: &str,
    count: i64,
) -> Result<(), DbError> {
    let url: Option<String> = tasks::table
        .find(task_id)
        .select(tasks::repo_url)
        .first(conn)
        .optional()?;
    // A refusal of an unknown task fails on the ledger's own insert; nothing to count here.
    let Some(url) = url else { return Ok(()) };
    let row = (ebr::repo_url.eq(url), ebr::count.eq(count));
    let add = ebr::count.eq(ebr::count + count);
    native_execute(
        conn,
        diesel::insert_into(ebr::table)
            .values(row)
            .on_conflict(ebr::repo_url)
            .do_update()
            .set(add),
    )?;
    Ok(())
}

/// The exact recorded cost of every agent run, summed per (repository URL, task type,
/// model) over all months, every repository included, ordered.
pub fn run_cost_totals(conn: &mut AnyConnection) -> Result<Vec<(Combo, i64)>, DbError> {
    type Row = (String, String, String, i64);
    let rows: Vec<Row> = rcr::table
        .select((rcr::repo_url, rcr::task_type, rcr::model, rcr::cost_nanos))
        .load(conn)?;
    let mut sums: BTreeMap<Combo, i64> = BTreeMap::new();
    for (repo, task_type, model, nanos) in rows {
        let s = sums.entry((repo, task_type, model)).or_default();
        *s = s
            .checked_add(nanos)
            .ok_or_else(|| DbError::Conflict("run cost total overflow".into()))?;
    }
    Ok(sums.into_iter().collect())
}

/// Nano-dollars spent by runs that finished in `now`'s UTC month, of one repository (by id)
/// or of all: the same figure as [`budgets::spent_nanos`], read from the rollup.
pub fn month_spent_nanos(
    conn: &mut AnyConnection,
    repo: Option<uuid::Uuid>,
    now: OffsetDateTime,
) -> Result<i64, DbError> {
    let mut q = rcr::table
        .filter(rcr::month.eq(month_key(now)))
        .select(rcr::cost_nanos)
        .into_boxed();
    if let Some(repo) = repo {
        q = q.filter(rcr::repo_id.eq(repo.to_string()));
    }
    let costs: Vec<i64> = q.load(conn)?;
    Ok(costs.into_iter().fold(0i64, i64::saturating_add))
}

/// What a scrape at `now` reports: see [`Scrape`].
pub fn scrape(conn: &mut AnyConnection, now: OffsetDateTime) -> Result<Scrape, DbError> {
    let connected: BTreeSet<String> = repositories::table
        .filter(repositories::disconnected_at.is_null())
        .select(repositories::url)
        .load::<String>(conn)?
        .into_iter()
        .collect();
    let costs = run_cost_totals(conn)?
        .into_iter()
        .filter(|((repo, _, _), _)| connected.contains(repo))
        .collect();
    let budgets = budgets::all_set_with(conn, None, now, month_spent_nanos)?;
    let egress_blocked: Vec<(String, i64)> = ebr::table
        .select((ebr::repo_url, ebr::count))
        .order(ebr::repo_url.asc())
        .load::<(String, i64)>(conn)?
        .into_iter()
        .filter(|(repo, _)| connected.contains(repo))
        .collect();
    Ok(Scrape {
        costs,
        budgets,
        egress_blocked,
    })
}
