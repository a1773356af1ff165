//! Cost rollups: per-day and cumulative sums that the cost report reads instead of the task
//! table, so that its cost does not grow with the number of tasks.
//!
//! Every task contributes to one day (its UTC creation day), one repository and one
//! (repository, task type, model) combination. Each write that changes a contributing field
//! (creation, cost, tokens, model, state) computes the task's contribution before and after
//! and applies the difference here, in the same transaction ([`Deltas::change`], [`apply`]).
//!
//! `cost_cumulative` is dense: every combination has a row for every day from its first task
//! through the latest rolled-up day `D` (the greatest creation day seen). A window's sums are
//! then `row(min(end, D)) − row(min(start − 1, D))`: two equality lookups per combination.
//!
//! The same rows also carry the outcome sums of the report's `outcomes` member
//! ([`OutcomeSums`]). An outcome unit is a coding task with its review subtasks; every task
//! of a unit contributes to the combination and day of the unit's head (the coding task), in
//! the class the head ended in (merged, failed or cancelled, still open). A review task's
//! outcome contribution therefore depends on its parent, and a change of a coding task's
//! class or model moves its reviews' contributions along: [`apply`] resolves both with the
//! writing transaction's connection, after taking the rollup lock.

use std::collections::BTreeMap;

use agentry_domain::{Task, TaskState, TaskType};
use diesel::prelude::*;
use time::{Date, Duration, OffsetDateTime, PrimitiveDateTime, UtcOffset};
use uuid::Uuid;

use crate::schema::{cost_cumulative as cc, cost_daily as cd, report_generation as rg, tasks};
use crate::{AnyConnection, DbError};

/// Key of the PostgreSQL transaction-level advisory lock that serialises rollup writers
/// (their read-modify-write of running totals must not interleave).
const ROLLUP_LOCK_KEY: i64 = 0x6167_656e_7472_7902;

/// The one row of `report_generation`.
const GENERATION_ROW: i32 = 1;

/// `a + sign × b`, checked: an overflow is a [`DbError::Conflict`].
fn signed_add(a: i64, b: i64, sign: i64) -> Result<i64, DbError> {
    b.checked_mul(sign)
        .and_then(|b| a.checked_add(b))
        .ok_or_else(|| DbError::Conflict("cost rollup overflow".into()))
}

/// Implements `combine(self, o, sign)` for a struct of `i64` sums: field by field,
/// `self + sign × o`, checked ([`signed_add`]).
macro_rules! combine_fields {
    ($ty:ident: $($field:ident),+) => {
        impl $ty {
            fn combine(self, o: $ty, sign: i64) -> Result<$ty, DbError> {
                Ok($ty {
                    $($field: signed_add(self.$field, o.$field, sign)?,)+
                })
            }
        }
    };
}

/// Sums over a set of tasks, as stored in the rollups. `tasks` counts every task; the other
/// members cover costed tasks (a recorded cost, zero included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Queryable, Selectable, Insertable)]
#[diesel(table_name = cc)]
pub struct Sums {
    /// All tasks.
    pub tasks: i64,
    /// Tasks with a recorded cost.
    pub costed: i64,
    /// Their exact cost in nano-dollars.
    pub cost_nanos: i64,
    /// Costed tasks in `pr_opened` or `completed`.
    pub succeeded: i64,
    /// Input tokens of costed tasks.
    pub input_tokens: i64,
    /// Output tokens of costed tasks.
    pub output_tokens: i64,
    /// The part of `cost_nanos` that is imported history (tasks of `agentry import`): no
    /// budget counts it.
    pub imported_cost_nanos: i64,
}

combine_fields!(Sums: tasks, costed, cost_nanos, succeeded, input_tokens, output_tokens,
    imported_cost_nanos);

/// Outcome sums over the units whose head is in a combination (docs/analytics.md): what a
/// cumulative row holds besides [`Sums`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Queryable, Selectable, Insertable)]
#[diesel(table_name = cc)]
pub struct OutcomeSums {
    /// Merged pull requests: coding heads in `completed`.
    #[diesel(column_name = outcome_merged)]
    pub merged: i64,
    /// Costed tasks of the units (heads and review subtasks).
    #[diesel(column_name = outcome_costed)]
    pub costed: i64,
    /// The exact cost of the units' tasks, in nano-dollars.
    #[diesel(column_name = outcome_cost_nanos)]
    pub cost_nanos: i64,
    /// The cost of the units whose head is merged.
    pub merged_cost_nanos: i64,
    /// The cost of the units whose head is `failed` or `cancelled`.
    pub failed_cost_nanos: i64,
    /// The revision rounds of the merged heads (their `revisions`).
    pub merged_revisions: i64,
    /// What the revision runs of the units' tasks cost (every class), in nano-dollars; part
    /// of `cost_nanos`.
    pub revision_cost_nanos: i64,
}

combine_fields!(OutcomeSums: merged, costed, cost_nanos, merged_cost_nanos, failed_cost_nanos,
    merged_revisions, revision_cost_nanos);

/// What the tasks of one unit (or one task of it) add to its outcome: costed tasks, their
/// cost, the revision rounds (of the head only) and what the revision runs cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct UnitPart {
    costed: i64,
    cost_nanos: i64,
    revisions: i64,
    revision_cost_nanos: i64,
}

impl UnitPart {
    fn of(task: &Task, sums: &Sums) -> UnitPart {
        UnitPart {
            costed: sums.costed,
            cost_nanos: sums.cost_nanos,
            revisions: i64::from(task.revisions),
            revision_cost_nanos: task.revision_cost_usd.to_nanos(),
        }
    }
}

/// How a unit ended, decided by its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Merged,
    Failed,
    Open,
}

impl Class {
    fn of(task_type: TaskType, state: TaskState) -> Class {
        match (task_type, state) {
            (TaskType::Coding, TaskState::Completed) => Class::Merged,
            (_, TaskState::Failed | TaskState::Cancelled) => Class::Failed,
            _ => Class::Open,
        }
    }
}

impl OutcomeSums {
    /// The tasks of `part` in a unit of class `class`; `merged_head` when the head itself is
    /// among them (only the head's revision rounds count, and only once it is merged).
    fn new(class: Class, merged_head: bool, part: UnitPart) -> OutcomeSums {
        let merged = merged_head && class == Class::Merged;
        OutcomeSums {
            merged: i64::from(merged),
            costed: part.costed,
            cost_nanos: part.cost_nanos,
            merged_cost_nanos: if class == Class::Merged {
                part.cost_nanos
            } else {
                0
            },
            failed_cost_nanos: if class == Class::Failed {
                part.cost_nanos
            } else {
                0
            },
            merged_revisions: if merged { part.revisions } else { 0 },
            revision_cost_nanos: part.revision_cost_nanos,
        }
    }

    /// `self − other`, checked.
    pub fn minus(self, other: OutcomeSums) -> Result<OutcomeSums, DbError> {
        self.combine(other, -1)
    }
}

/// One cumulative row's figures: the task sums and the outcome sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Queryable, Selectable, Insertable)]
#[diesel(table_name = cc)]
pub(crate) struct Cum {
    #[diesel(embed)]
    pub(crate) sums: Sums,
    #[diesel(embed)]
    pub(crate) outcome: OutcomeSums,
}

impl Cum {
    fn combine(self, o: Cum, sign: i64) -> Result<Cum, DbError> {
        Ok(Cum {
            sums: self.sums.combine(o.sums, sign)?,
            outcome: self.outcome.combine(o.outcome, sign)?,
        })
    }

    fn is_zero(&self) -> bool {
        *self == Cum::default()
    }
}

/// What one task adds to the rollups.
pub(crate) struct Contribution<'a> {
    pub(crate) created_at: OffsetDateTime,
    pub(crate) repo_url: &'a str,
    pub(crate) task_type: TaskType,
    pub(crate) model: Option<&'a str>,
    /// The task's state; where [`Deltas::add_parts`] places the outcome, the task is the head
    /// of its own outcome unit (it has no parent).
    pub(crate) state: TaskState,
    pub(crate) sums: Sums,
}

/// The fields of a task that place an outcome unit: its head's combination, day and class.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    combo: Combo,
    day: Date,
    class: Class,
}

impl Head {
    fn of(task: &Task) -> Head {
        Head {
            combo: combo_of(
                task.repo_url.as_str(),
                task.task_type,
                task.model_used.as_deref(),
            ),
            day: utc_day(task.created_at),
            class: Class::of(task.task_type, task.state),
        }
    }
}

/// A review task's outcome contribution, placed once its parent is read in [`apply`].
#[derive(Debug)]
struct ReviewPart {
    parent: Uuid,
    own: Head,
    part: UnitPart,
    sign: i64,
}

impl Sums {
    fn of(task: &Task) -> Sums {
        Sums::from_parts(
            task.cost_usd,
            task.state,
            task.input_tokens,
            task.output_tokens,
            task.imported,
        )
    }

    /// The sums of one task with this cost, state and token counts; `imported` for imported
    /// history.
    pub(crate) fn from_parts(
        cost: Option<agentry_domain::Usd>,
        state: TaskState,
        input_tokens: i64,
        output_tokens: i64,
        imported: bool,
    ) -> Sums {
        let costed = cost.is_some();
        let cost_nanos = cost.map_or(0, |u| u.to_nanos());
        Sums {
            tasks: 1,
            costed: i64::from(costed),
            cost_nanos,
            succeeded: i64::from(
                costed && matches!(state, TaskState::PrOpened | TaskState::Completed),
            ),
            input_tokens: if costed { input_tokens } else { 0 },
            output_tokens: if costed { output_tokens } else { 0 },
            imported_cost_nanos: if imported { cost_nanos } else { 0 },
        }
    }

    /// `self + other`, checked.
    pub fn plus(self, other: Sums) -> Result<Sums, DbError> {
        self.combine(other, 1)
    }

    /// `self − other`, checked.
    pub fn minus(self, other: Sums) -> Result<Sums, DbError> {
        self.combine(other, -1)
    }

    fn is_zero(&self) -> bool {
        *self == Sums::default()
    }
}

/// A (repository, task type, model) combination; model `""` is unknown.
pub type Combo = (String, String, String);

/// The combination of a repository, a task type and a model (`None`: unknown).
fn combo_of(repo_url: &str, task_type: TaskType, model: Option<&str>) -> Combo {
    (
        repo_url.to_owned(),
        task_type.as_str().to_owned(),
        model.unwrap_or_default().to_owned(),
    )
}

/// The UTC calendar day of a time.
pub fn utc_day(t: OffsetDateTime) -> Date {
    t.to_offset(UtcOffset::UTC).date()
}

fn day_text(d: Date) -> String {
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

fn parse_day(s: &str) -> Result<Date, DbError> {
    let bad = || DbError::Corrupt(format!("invalid rollup day {s:?}"));
    let mut parts = s.splitn(3, '-');
    let (Some(y), Some(m), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let month = time::Month::try_from(m.parse::<u8>().map_err(|_| bad())?).map_err(|_| bad())?;
    Date::from_calendar_date(
        y.parse().map_err(|_| bad())?,
        month,
        d.parse().map_err(|_| bad())?,
    )
    .map_err(|_| bad())
}

/// Rollup changes collected by a write, applied with [`apply`].
#[derive(Debug, Default)]
pub struct Deltas {
    cumulative: BTreeMap<(Combo, Date), Cum>,
    daily: BTreeMap<(Date, String), Sums>,
    /// Outcome contributions of review tasks, placed by their parent in [`apply`].
    reviews: Vec<ReviewPart>,
    /// Coding tasks whose unit moved (class or model): their review subtasks' outcome
    /// contributions move from the first head to the second in [`apply`].
    moves: Vec<(Uuid, Head, Head)>,
    /// A task with a recorded cost changed: the report's task lists (which show only costed
    /// tasks, with their state and title) may show the change even when no sum moves.
    shown: bool,
}

impl Deltas {
    /// The change of a task from `old` to `new` (`None` = does not exist).
    ///
    /// Besides the task's own contribution, a coding task whose outcome class or model
    /// changes moves its review subtasks' outcome contributions with it (read in [`apply`]).
    pub fn change(old: Option<&Task>, new: Option<&Task>) -> Result<Deltas, DbError> {
        let mut d = Deltas {
            shown: old.is_some_and(|t| t.cost_usd.is_some())
                || new.is_some_and(|t| t.cost_usd.is_some()),
            ..Deltas::default()
        };
        if let Some(t) = old {
            d.add(t, -1)?;
        }
        if let Some(t) = new {
            d.add(t, 1)?;
        }
        // A review whose outcome contribution did not change (a claim, a start) needs no
        // look-up of its parent.
        if let [.., a, b] = d.reviews.as_slice()
            && a.parent == b.parent
            && a.own == b.own
            && a.part == b.part
        {
            d.reviews.clear();
        }
        if let (Some(o), Some(n)) = (old, new)
            && o.task_type == TaskType::Coding
        {
            let (from, to) = (Head::of(o), Head::of(n));
            if from != to {
                d.moves.push((n.id, from, to));
            }
        }
        Ok(d)
    }

    /// Adds (`sign` 1) or removes (`sign` −1) one task's own contribution (a coding task's
    /// review subtasks are not included: they contribute by themselves).
    pub fn add(&mut self, task: &Task, sign: i64) -> Result<(), DbError> {
        let sums = Sums::of(task);
        let own = Contribution {
            created_at: task.created_at,
            repo_url: task.repo_url.as_str(),
            task_type: task.task_type,
            model: task.model_used.as_deref(),
            state: task.state,
            sums,
        };
        self.add_sums(&own, OutcomeSums::default(), sign)?;
        let head = Head::of(task);
        let part = UnitPart::of(task, &sums);
        match (task.task_type, task.parent_task_id) {
            (TaskType::Review, Some(parent)) => {
                self.reviews.push(ReviewPart {
                    parent,
                    own: head,
                    part,
                    sign,
                });
                Ok(())
            }
            _ => {
                let outcome = OutcomeSums::new(head.class, true, part);
                self.add_outcome(head.combo, head.day, outcome, sign)
            }
        }
    }

    /// Adds or removes a contribution given by its parts (a task without a parent).
    ///
    /// The task heads its own outcome unit, so its sums and its outcome go to the same
    /// cumulative row: one update (an import adds a million of these).
    pub(crate) fn add_parts(&mut self, c: Contribution<'_>, sign: i64) -> Result<(), DbError> {
        let class = Class::of(c.task_type, c.state);
        // Imported history has no revision rounds and no runs.
        let part = UnitPart {
            costed: c.sums.costed,
            cost_nanos: c.sums.cost_nanos,
            ..UnitPart::default()
        };
        self.add_sums(&c, OutcomeSums::new(class, true, part), sign)
    }

    /// Adds or removes a task's sums, with `outcome`, at its combination and day, and its
    /// sums at its repository and day.
    fn add_sums(
        &mut self,
        c: &Contribution<'_>,
        outcome: OutcomeSums,
        sign: i64,
    ) -> Result<(), DbError> {
        let day = utc_day(c.created_at);
        let combo = combo_of(c.repo_url, c.task_type, c.model);
        let e = self.cumulative.entry((combo, day)).or_default();
        *e = e.combine(
            Cum {
                sums: c.sums,
                outcome,
            },
            sign,
        )?;
        let d = self.daily.entry((day, c.repo_url.to_owned())).or_default();
        *d = d.combine(c.sums, sign)?;
        Ok(())
    }

    fn add_outcome(
        &mut self,
        combo: Combo,
        day: Date,
        outcome: OutcomeSums,
        sign: i64,
    ) -> Result<(), DbError> {
        let e = self.cumulative.entry((combo, day)).or_default();
        *e = e.combine(
            Cum {
                outcome,
                ..Cum::default()
            },
            sign,
        )?;
        Ok(())
    }

    /// Places the review contributions and the moves of review subtasks, reading parents and
    /// subtasks with `conn` (call with the rollup lock held).
    fn resolve(&mut self, conn: &mut AnyConnection) -> Result<(), DbError> {
        for part in std::mem::take(&mut self.reviews) {
            let parent: Option<(String, String, String, Option<String>, PrimitiveDateTime)> =
                tasks::table
                    .find(part.parent.to_string())
                    .select((
                        tasks::repo_url,
                        tasks::task_type,
                        tasks::state,
                        tasks::model_used,
                        tasks::created_at,
                    ))
                    .first(conn)
                    .optional()?;
            let head = match parent {
                Some((repo, task_type, state, model, created_at))
                    if task_type == TaskType::Coding.as_str() =>
                {
                    let state: TaskState = state
                        .parse()
                        .map_err(|_| DbError::Corrupt(format!("task state {state:?}")))?;
                    Head {
                        combo: (repo, task_type, model.unwrap_or_default()),
                        day: created_at.date(),
                        class: Class::of(TaskType::Coding, state),
                    }
                }
                // Not a coding task's review: a unit by itself.
                _ => part.own,
            };
            let outcome = OutcomeSums::new(head.class, false, part.part);
            self.add_outcome(head.combo, head.day, outcome, part.sign)?;
        }
        for (id, from, to) in std::mem::take(&mut self.moves) {
            // Summed here with overflow checks (a task has few review subtasks). A revision
            // cost is part of a recorded cost, so uncosted reviews have none.
            let costs: Vec<(i64, i64)> = tasks::table
                .filter(tasks::parent_task_id.eq(id.to_string()))
                .filter(tasks::task_type.eq(TaskType::Review.as_str()))
                .filter(tasks::cost_nanos.is_not_null())
                .select((
                    tasks::cost_nanos.assume_not_null(),
                    tasks::revision_cost_nanos,
                ))
                .load(conn)?;
            if costs.is_empty() {
                continue;
            }
            let overflow = || DbError::Conflict("cost rollup overflow".into());
            let mut part = UnitPart {
                costed: i64::try_from(costs.len()).map_err(|_| overflow())?,
                ..UnitPart::default()
            };
            for (cost, revision_cost) in costs {
                part.cost_nanos = part.cost_nanos.checked_add(cost).ok_or_else(overflow)?;
                part.revision_cost_nanos = part
                    .revision_cost_nanos
                    .checked_add(revision_cost)
                    .ok_or_else(overflow)?;
            }
            let moved = |class| OutcomeSums::new(class, false, part);
            self.add_outcome(from.combo, from.day, moved(from.class), -1)?;
            self.add_outcome(to.combo, to.day, moved(to.class), 1)?;
        }
        Ok(())
    }

    fn prune(&mut self) {
        self.cumulative.retain(|_, s| !s.is_zero());
        self.daily.retain(|_, s| !s.is_zero());
    }
}

/// A row of `cost_cumulative`, as read and as written: a combination, a day (`YYYY-MM-DD`)
/// and the cumulative figures through that day.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = cc)]
pub(crate) struct CumRecord {
    pub(crate) repo_url: String,
    pub(crate) task_type: String,
    pub(crate) model: String,
    pub(crate) day: String,
    #[diesel(embed)]
    pub(crate) cum: Cum,
}

impl CumRecord {
    fn new(combo: &Combo, day: Date, cum: Cum) -> CumRecord {
        let (repo_url, task_type, model) = combo.clone();
        CumRecord {
            repo_url,
            task_type,
            model,
            day: day_text(day),
            cum,
        }
    }

    fn combo(&self) -> Combo {
        (
            self.repo_url.clone(),
            self.task_type.clone(),
            self.model.clone(),
        )
    }
}

/// The latest rolled-up day, if any task has been rolled up.
pub fn latest_day(conn: &mut AnyConnection) -> Result<Option<Date>, DbError> {
    let max: Option<String> = cc::table.select(diesel::dsl::max(cc::day)).first(conn)?;
    max.as_deref().map(parse_day).transpose()
}

/// Applies collected changes. Call inside the transaction of the write that caused them,
/// as its last step (on PostgreSQL it takes a transaction-level lock on the rollups).
///
/// A change the cost report can show also raises the report generation ([`report_stamp`])
/// in that transaction: one that moves a sum, or any change of a task with a recorded cost
/// (the report's task lists show its state and title). Every write of a task's contributing
/// fields comes through here; a change of an uncosted task that moves no sum (the claim of
/// a queued task) leaves the generation, so kept reports stay valid.
pub fn apply(conn: &mut AnyConnection, mut deltas: Deltas) -> Result<(), DbError> {
    let pg = matches!(conn, AnyConnection::Postgresql(_));
    let lock = |conn: &mut AnyConnection| -> Result<(), DbError> {
        diesel::sql_query(format!("SELECT pg_advisory_xact_lock({ROLLUP_LOCK_KEY})"))
            .execute(conn)?;
        Ok(())
    };
    // Parents and review subtasks are read under the lock: a concurrent writer's change to
    // either is then either fully before this read or fully after this transaction.
    let locked = pg && !(deltas.reviews.is_empty() && deltas.moves.is_empty());
    if locked {
        lock(conn)?;
    }
    deltas.resolve(conn)?;
    deltas.prune();
    let unchanged = deltas.cumulative.is_empty() && deltas.daily.is_empty();
    if unchanged && !deltas.shown {
        return Ok(());
    }
    // The generation's row is always taken after the rollup lock, so two writers take
    // both in the same order.
    if pg && !locked {
        lock(conn)?;
    }
    bump_generation(conn)?;
    if unchanged {
        return Ok(());
    }
    apply_daily(conn, &deltas.daily)?;

    // Extend every combination through the newest day of this change (carry forward).
    let newest = deltas.cumulative.keys().map(|(_, d)| *d).max();
    let mut latest = latest_day(conn)?;
    if let (Some(from), Some(to)) = (latest, newest)
        && to > from
    {
        carry_forward(conn, from, to)?;
    }
    latest = match (latest, newest) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let Some(end) = latest else { return Ok(()) };

    // Per combination: rewrite its rows from its first changed day through `end`.
    let mut by_combo: BTreeMap<&Combo, Vec<(Date, Cum)>> = BTreeMap::new();
    for ((combo, day), s) in &deltas.cumulative {
        by_combo.entry(combo).or_default().push((*day, *s));
    }
    for (combo, changes) in by_combo {
        rewrite_combo(conn, combo, &changes, end)?;
    }
    Ok(())
}

/// Raises the report generation by one (creating its row if it is missing).
fn bump_generation(conn: &mut AnyConnection) -> Result<(), DbError> {
    let updated = diesel::update(rg::table.find(GENERATION_ROW))
        .set(rg::generation.eq(rg::generation + 1))
        .execute(conn)?;
    if updated == 0 {
        diesel::insert_into(rg::table)
            .values((rg::id.eq(GENERATION_ROW), rg::generation.eq(1)))
            .execute(conn)?;
    }
    Ok(())
}

/// What a computed cost report was derived from, besides the day and its parameters: read
/// before computing a report and compared before serving it again. Two equal stamps mean
/// that no write that feeds the report committed in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportStamp {
    /// The report generation: raised by every write of the rollups or of a task's
    /// contribution ([`apply`]), committed with it; `-1` when its row is missing.
    pub generation: i64,
    /// The instance's monthly budget in nano-dollars, if set.
    pub instance_budget_nanos: Option<i64>,
    /// The monthly budgets set on connected repositories: (URL, nano-dollars), by URL.
    pub repository_budgets: Vec<(String, i64)>,
}

/// The current [`ReportStamp`]: three reads of one row or a few (the generation, the
/// instance budget, the repositories with a budget).
pub fn report_stamp(conn: &mut AnyConnection) -> Result<ReportStamp, DbError> {
    use crate::schema::instance_budget;

    let generation: Option<i64> = rg::table
        .find(GENERATION_ROW)
        .select(rg::generation)
        .first(conn)
        .optional()?;
    let instance_budget_nanos: Option<Option<i64>> = instance_budget::table
        .find(1)
        .select(instance_budget::monthly_budget_nanos)
        .first(conn)
        .optional()?;
    let repository_budgets = crate::budgets::repository_budgets(conn, None)?;
    Ok(ReportStamp {
        generation: generation.unwrap_or(-1),
        instance_budget_nanos: instance_budget_nanos.flatten(),
        repository_budgets: repository_budgets
            .into_iter()
            .map(|(_, url, budget)| (url, budget))
            .collect(),
    })
}

/// Copies every combination's row of day `from` to each day after it through `to`.
fn carry_forward(conn: &mut AnyConnection, from: Date, to: Date) -> Result<(), DbError> {
    let rows: Vec<CumRecord> = cc::table
        .filter(cc::day.eq(day_text(from)))
        .select(CumRecord::as_select())
        .load(conn)?;
    let mut day = from;
    while day < to {
        day = day
            .next_day()
            .ok_or_else(|| DbError::Conflict("date overflow".into()))?;
        let inserts: Vec<CumRecord> = rows
            .iter()
            .map(|r| CumRecord::new(&r.combo(), day, r.cum))
            .collect();
        insert_cumulative(conn, &inserts)?;
    }
    Ok(())
}

fn insert_cumulative(conn: &mut AnyConnection, rows: &[CumRecord]) -> Result<(), DbError> {
    match conn {
        AnyConnection::Sqlite(c) => {
            for row in rows {
                diesel::insert_into(cc::table).values(row).execute(c)?;
            }
        }
        AnyConnection::Postgresql(c) => {
            for chunk in rows.chunks(1_000) {
                diesel::insert_into(cc::table).values(chunk).execute(c)?;
            }
        }
    }
    Ok(())
}

/// Whether a `cost_cumulative` row is of `combo`.
#[diesel::dsl::auto_type]
fn is_combo<'a>(repo: &'a str, task_type: &'a str, model: &'a str) -> _ {
    cc::repo_url
        .eq(repo)
        .and(cc::task_type.eq(task_type))
        .and(cc::model.eq(model))
}

fn rewrite_combo(
    conn: &mut AnyConnection,
    combo: &Combo,
    changes: &[(Date, Cum)],
    end: Date,
) -> Result<(), DbError> {
    let (repo, task_type, model) = combo;
    let Some(first) = changes.iter().map(|(d, _)| *d).min() else {
        return Ok(());
    };
    let base: Option<Cum> = cc::table
        .filter(is_combo(repo, task_type, model))
        .filter(cc::day.lt(day_text(first)))
        .order(cc::day.desc())
        .select(Cum::as_select())
        .first(conn)
        .optional()?;
    let existing: Vec<CumRecord> = cc::table
        .filter(is_combo(repo, task_type, model))
        .filter(cc::day.ge(day_text(first)))
        .order(cc::day.asc())
        .select(CumRecord::as_select())
        .load(conn)?;
    let mut old: BTreeMap<Date, Cum> = BTreeMap::new();
    for r in &existing {
        old.insert(parse_day(&r.day)?, r.cum);
    }
    let mut carried = base.unwrap_or_default();
    let mut added = Cum::default();
    let mut changes = changes.to_vec();
    changes.sort_by_key(|(d, _)| *d);
    let mut pending = changes.iter().peekable();
    let mut rows = Vec::new();
    let mut day = first;
    loop {
        if let Some(s) = old.get(&day) {
            carried = *s;
        }
        while let Some((d, s)) = pending.peek() {
            if *d > day {
                break;
            }
            added = added.combine(*s, 1)?;
            pending.next();
        }
        let s = carried.combine(added, 1)?;
        rows.push(CumRecord::new(combo, day, s));
        if day >= end {
            break;
        }
        day = day
            .next_day()
            .ok_or_else(|| DbError::Conflict("date overflow".into()))?;
    }
    diesel::delete(
        cc::table
            .filter(is_combo(repo, task_type, model))
            .filter(cc::day.ge(day_text(first))),
    )
    .execute(conn)?;
    insert_cumulative(conn, &rows)
}

fn apply_daily(
    conn: &mut AnyConnection,
    daily: &BTreeMap<(Date, String), Sums>,
) -> Result<(), DbError> {
    for ((day, repo), s) in daily {
        let day = day_text(*day);
        let updated = diesel::update(
            cd::table
                .filter(cd::day.eq(&day))
                .filter(cd::repo_url.eq(repo)),
        )
        .set((
            cd::tasks.eq(cd::tasks + s.tasks),
            cd::costed.eq(cd::costed + s.costed),
            cd::cost_nanos.eq(cd::cost_nanos + s.cost_nanos),
        ))
        .execute(conn)?;
        if updated == 0 {
            diesel::insert_into(cd::table)
                .values((
                    cd::day.eq(&day),
                    cd::repo_url.eq(repo),
                    cd::tasks.eq(s.tasks),
                    cd::costed.eq(s.costed),
                    cd::cost_nanos.eq(s.cost_nanos),
                ))
                .execute(conn)?;
        }
    }
    Ok(())
}

/// The cumulative sums of every combination at each of `days` (each clamped to the latest
/// rolled-up day; a combination with no row at a day had no tasks by then: zero).
pub fn cumulative_at(
    conn: &mut AnyConnection,
    days: &[Date],
) -> Result<Vec<(Date, Combo, Sums)>, DbError> {
    Ok(cumulative_with_outcomes_at(conn, days)?
        .into_iter()
        .map(|(day, combo, sums, _)| (day, combo, sums))
        .collect())
}

/// [`cumulative_at`] with each row's [`OutcomeSums`]: the outcome sums of the units whose
/// head is in the combination and was created on or before the day.
pub fn cumulative_with_outcomes_at(
    conn: &mut AnyConnection,
    days: &[Date],
) -> Result<Vec<(Date, Combo, Sums, OutcomeSums)>, DbError> {
    let Some(latest) = latest_day(conn)? else {
        return Ok(Vec::new());
    };
    let clamped: Vec<String> = days.iter().map(|d| day_text((*d).min(latest))).collect();
    let rows: Vec<CumRecord> = cc::table
        .filter(cc::day.eq_any(&clamped))
        .select(CumRecord::as_select())
        .load(conn)?;
    let mut out = Vec::with_capacity(rows.len() * days.len());
    for r in &rows {
        let stored = parse_day(&r.day)?;
        for d in days {
            if (*d).min(latest) == stored {
                out.push((*d, r.combo(), r.cum.sums, r.cum.outcome));
            }
        }
    }
    Ok(out)
}

/// Per-day totals `(day, sums)` over `[from, to]`, all repositories or one.
pub fn daily_between(
    conn: &mut AnyConnection,
    from: Date,
    to: Date,
    repo_url: Option<&str>,
) -> Result<Vec<(Date, Sums)>, DbError> {
    let mut q = cd::table
        .filter(cd::day.ge(day_text(from)))
        .filter(cd::day.le(day_text(to)))
        .select((cd::day, cd::tasks, cd::costed, cd::cost_nanos))
        .into_boxed();
    if let Some(repo) = repo_url {
        q = q.filter(cd::repo_url.eq(repo.to_owned()));
    }
    let rows: Vec<(String, i64, i64, i64)> = q.load(conn)?;
    let mut by_day: BTreeMap<Date, Sums> = BTreeMap::new();
    for (day, tasks, costed, cost) in rows {
        let s = by_day.entry(parse_day(&day)?).or_default();
        *s = s.combine(
            Sums {
                tasks,
                costed,
                cost_nanos: cost,
                ..Sums::default()
            },
            1,
        )?;
    }
    Ok(by_day.into_iter().collect())
}

/// Recomputes both rollups from the task table (repair, and the reference in tests).
pub fn rebuild(conn: &mut AnyConnection) -> Result<(), DbError> {
    diesel::delete(cc::table).execute(conn)?;
    diesel::delete(cd::table).execute(conn)?;
    let mut deltas = Deltas {
        shown: true,
        ..Deltas::default()
    };
    let mut after: Option<crate::tasks::TaskCursor> = None;
    loop {
        let page = crate::tasks::list_tasks(
            conn,
            &crate::tasks::TaskFilter::default(),
            5_000,
            after.as_ref(),
        )?;
        for t in &page.tasks {
            deltas.add(t, 1)?;
        }
        match page.next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    apply(conn, deltas)
}

/// The day before `d`.
pub fn day_before(d: Date) -> Date {
    d.checked_sub(Duration::days(1)).unwrap_or(d)
}

/// The exact recorded cost of every agent run (the run ledger), summed per repository, task
/// type and model of the run (`""` = unknown), computed by a scan of the ledger: the
/// reference for [`crate::scrape::run_cost_totals`], which `/metrics` reads instead.
///
/// Runs are never changed once recorded, so each sum only grows. Imported tasks carry a cost
/// but no runs, so they are not part of it. The sums are exact integers: a sum beyond the
/// `BIGINT` range fails (SQLite's integer `SUM` and the cast on PostgreSQL both refuse it)
/// rather than wrapping or turning into a float.
pub fn run_cost_totals(conn: &mut AnyConnection) -> Result<Vec<(Combo, i64)>, DbError> {
    use diesel::sql_types::{BigInt, Text};

    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        repo_url: String,
        #[diesel(sql_type = Text)]
        task_type: String,
        #[diesel(sql_type = Text)]
        model: String,
        #[diesel(sql_type = BigInt)]
        cost_nanos: i64,
    }
    const SQL: &str = "SELECT t.repo_url AS repo_url, t.task_type AS task_type, \
         COALESCE(r.model, '') AS model, CAST(SUM(r.cost_nanos) AS BIGINT) AS cost_nanos \
         FROM task_runs r JOIN tasks t ON t.id = r.task_id \
         WHERE r.cost_nanos IS NOT NULL \
         GROUP BY t.repo_url, t.task_type, COALESCE(r.model, '') \
         ORDER BY 1, 2, 3";
    let rows: Vec<Row> = crate::connection::native_load(conn, diesel::sql_query(SQL))?;
    Ok(rows
        .into_iter()
        .map(|r| ((r.repo_url, r.task_type, r.model), r.cost_nanos))
        .collect())
}
