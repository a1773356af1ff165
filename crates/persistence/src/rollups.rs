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

use std::collections::BTreeMap;

use agentry_domain::{Task, TaskState, TaskType};
use diesel::prelude::*;
use time::{Date, Duration, OffsetDateTime, UtcOffset};

use crate::schema::{cost_cumulative as cc, cost_daily as cd};
use crate::{AnyConnection, DbError};

/// Key of the PostgreSQL transaction-level advisory lock that serialises rollup writers
/// (their read-modify-write of running totals must not interleave).
const ROLLUP_LOCK_KEY: i64 = 0x6167_656e_7472_7902;

/// Sums over a set of tasks, as stored in the rollups. `tasks` counts every task; the other
/// members cover costed tasks (a recorded cost, zero included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
}

/// What one task adds to the rollups.
pub(crate) struct Contribution<'a> {
    pub(crate) created_at: OffsetDateTime,
    pub(crate) repo_url: &'a str,
    pub(crate) task_type: TaskType,
    pub(crate) model: Option<&'a str>,
    pub(crate) sums: Sums,
}

impl Sums {
    fn of(task: &Task) -> Sums {
        Sums::from_parts(
            task.cost_usd,
            task.state,
            task.input_tokens,
            task.output_tokens,
        )
    }

    /// The sums of one task with this cost, state and token counts.
    pub(crate) fn from_parts(
        cost: Option<agentry_domain::Usd>,
        state: TaskState,
        input_tokens: i64,
        output_tokens: i64,
    ) -> Sums {
        let costed = cost.is_some();
        Sums {
            tasks: 1,
            costed: i64::from(costed),
            cost_nanos: cost.map_or(0, |u| u.to_nanos()),
            succeeded: i64::from(
                costed && matches!(state, TaskState::PrOpened | TaskState::Completed),
            ),
            input_tokens: if costed { input_tokens } else { 0 },
            output_tokens: if costed { output_tokens } else { 0 },
        }
    }

    fn combine(self, o: Sums, sign: i64) -> Result<Sums, DbError> {
        let f = |a: i64, b: i64| {
            b.checked_mul(sign)
                .and_then(|b| a.checked_add(b))
                .ok_or_else(|| DbError::Conflict("cost rollup overflow".into()))
        };
        Ok(Sums {
            tasks: f(self.tasks, o.tasks)?,
            costed: f(self.costed, o.costed)?,
            cost_nanos: f(self.cost_nanos, o.cost_nanos)?,
            succeeded: f(self.succeeded, o.succeeded)?,
            input_tokens: f(self.input_tokens, o.input_tokens)?,
            output_tokens: f(self.output_tokens, o.output_tokens)?,
        })
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
    cumulative: BTreeMap<(Combo, Date), Sums>,
    daily: BTreeMap<(Date, String), Sums>,
}

impl Deltas {
    /// The change of a task from `old` to `new` (`None` = does not exist).
    pub fn change(old: Option<&Task>, new: Option<&Task>) -> Result<Deltas, DbError> {
        let mut d = Deltas::default();
        if let Some(t) = old {
            d.add(t, -1)?;
        }
        if let Some(t) = new {
            d.add(t, 1)?;
        }
        Ok(d)
    }

    /// Adds (`sign` 1) or removes (`sign` −1) one task's contribution.
    pub fn add(&mut self, task: &Task, sign: i64) -> Result<(), DbError> {
        self.add_parts(
            Contribution {
                created_at: task.created_at,
                repo_url: task.repo_url.as_str(),
                task_type: task.task_type,
                model: task.model_used.as_deref(),
                sums: Sums::of(task),
            },
            sign,
        )
    }

    /// Adds or removes a contribution given by its parts.
    pub(crate) fn add_parts(&mut self, c: Contribution<'_>, sign: i64) -> Result<(), DbError> {
        let day = utc_day(c.created_at);
        let combo = (
            c.repo_url.to_owned(),
            c.task_type.as_str().to_owned(),
            c.model.unwrap_or_default().to_owned(),
        );
        let e = self.cumulative.entry((combo, day)).or_default();
        *e = e.combine(c.sums, sign)?;
        let d = self.daily.entry((day, c.repo_url.to_owned())).or_default();
        *d = d.combine(c.sums, sign)?;
        Ok(())
    }

    fn prune(&mut self) {
        self.cumulative.retain(|_, s| !s.is_zero());
        self.daily.retain(|_, s| !s.is_zero());
    }
}

type CumRow = (String, String, String, String, i64, i64, i64, i64, i64, i64);

/// The columns of a [`CumRow`], in order.
const CUM_COLUMNS: (
    cc::repo_url,
    cc::task_type,
    cc::model,
    cc::day,
    cc::tasks,
    cc::costed,
    cc::cost_nanos,
    cc::succeeded,
    cc::input_tokens,
    cc::output_tokens,
) = (
    cc::repo_url,
    cc::task_type,
    cc::model,
    cc::day,
    cc::tasks,
    cc::costed,
    cc::cost_nanos,
    cc::succeeded,
    cc::input_tokens,
    cc::output_tokens,
);

fn sums_of(r: &CumRow) -> Sums {
    Sums {
        tasks: r.4,
        costed: r.5,
        cost_nanos: r.6,
        succeeded: r.7,
        input_tokens: r.8,
        output_tokens: r.9,
    }
}

#[derive(Insertable)]
#[diesel(table_name = cc)]
struct CumInsert<'a> {
    repo_url: &'a str,
    task_type: &'a str,
    model: &'a str,
    day: String,
    tasks: i64,
    costed: i64,
    cost_nanos: i64,
    succeeded: i64,
    input_tokens: i64,
    output_tokens: i64,
}

/// The latest rolled-up day, if any task has been rolled up.
pub fn latest_day(conn: &mut AnyConnection) -> Result<Option<Date>, DbError> {
    let max: Option<String> = cc::table.select(diesel::dsl::max(cc::day)).first(conn)?;
    max.as_deref().map(parse_day).transpose()
}

/// Applies collected changes. Call inside the transaction of the write that caused them,
/// as its last step (on PostgreSQL it takes a transaction-level lock on the rollups).
pub fn apply(conn: &mut AnyConnection, mut deltas: Deltas) -> Result<(), DbError> {
    deltas.prune();
    if deltas.cumulative.is_empty() && deltas.daily.is_empty() {
        return Ok(());
    }
    if matches!(conn, AnyConnection::Postgresql(_)) {
        diesel::sql_query(format!("SELECT pg_advisory_xact_lock({ROLLUP_LOCK_KEY})"))
            .execute(conn)?;
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
    let mut by_combo: BTreeMap<&Combo, Vec<(Date, Sums)>> = BTreeMap::new();
    for ((combo, day), s) in &deltas.cumulative {
        by_combo.entry(combo).or_default().push((*day, *s));
    }
    for (combo, changes) in by_combo {
        rewrite_combo(conn, combo, &changes, end)?;
    }
    Ok(())
}

/// Copies every combination's row of day `from` to each day after it through `to`.
fn carry_forward(conn: &mut AnyConnection, from: Date, to: Date) -> Result<(), DbError> {
    let rows: Vec<CumRow> = cc::table
        .filter(cc::day.eq(day_text(from)))
        .select(CUM_COLUMNS)
        .load(conn)?;
    let mut day = from;
    while day < to {
        day = day
            .next_day()
            .ok_or_else(|| DbError::Conflict("date overflow".into()))?;
        let text = day_text(day);
        let inserts: Vec<CumInsert> = rows
            .iter()
            .map(|r| {
                let s = sums_of(r);
                CumInsert {
                    repo_url: &r.0,
                    task_type: &r.1,
                    model: &r.2,
                    day: text.clone(),
                    tasks: s.tasks,
                    costed: s.costed,
                    cost_nanos: s.cost_nanos,
                    succeeded: s.succeeded,
                    input_tokens: s.input_tokens,
                    output_tokens: s.output_tokens,
                }
            })
            .collect();
        insert_cumulative(conn, &inserts)?;
    }
    Ok(())
}

fn insert_cumulative(conn: &mut AnyConnection, rows: &[CumInsert]) -> Result<(), DbError> {
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

fn rewrite_combo(
    conn: &mut AnyConnection,
    combo: &Combo,
    changes: &[(Date, Sums)],
    end: Date,
) -> Result<(), DbError> {
    let (repo, task_type, model) = combo;
    let Some(first) = changes.iter().map(|(d, _)| *d).min() else {
        return Ok(());
    };
    let base: Option<CumRow> = cc::table
        .filter(cc::repo_url.eq(repo))
        .filter(cc::task_type.eq(task_type))
        .filter(cc::model.eq(model))
        .filter(cc::day.lt(day_text(first)))
        .order(cc::day.desc())
        .select(CUM_COLUMNS)
        .first(conn)
        .optional()?;
    let existing: Vec<CumRow> = cc::table
        .filter(cc::repo_url.eq(repo))
        .filter(cc::task_type.eq(task_type))
        .filter(cc::model.eq(model))
        .filter(cc::day.ge(day_text(first)))
        .order(cc::day.asc())
        .select(CUM_COLUMNS)
        .load(conn)?;
    let mut old: BTreeMap<Date, Sums> = BTreeMap::new();
    for r in &existing {
        old.insert(parse_day(&r.3)?, sums_of(r));
    }
    let mut carried = base.as_ref().map(sums_of).unwrap_or_default();
    let mut added = Sums::default();
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
        rows.push(CumInsert {
            repo_url: repo,
            task_type,
            model,
            day: day_text(day),
            tasks: s.tasks,
            costed: s.costed,
            cost_nanos: s.cost_nanos,
            succeeded: s.succeeded,
            input_tokens: s.input_tokens,
            output_tokens: s.output_tokens,
        });
        if day >= end {
            break;
        }
        day = day
            .next_day()
            .ok_or_else(|| DbError::Conflict("date overflow".into()))?;
    }
    diesel::delete(
        cc::table
            .filter(cc::repo_url.eq(repo))
            .filter(cc::task_type.eq(task_type))
            .filter(cc::model.eq(model))
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
    let Some(latest) = latest_day(conn)? else {
        return Ok(Vec::new());
    };
    let clamped: Vec<String> = days.iter().map(|d| day_text((*d).min(latest))).collect();
    let rows: Vec<CumRow> = cc::table
        .filter(cc::day.eq_any(&clamped))
        .select(CUM_COLUMNS)
        .load(conn)?;
    let mut out = Vec::with_capacity(rows.len() * days.len());
    for r in &rows {
        let stored = parse_day(&r.3)?;
        for d in days {
            if (*d).min(latest) == stored {
                out.push((*d, (r.0.clone(), r.1.clone(), r.2.clone()), sums_of(r)));
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
    let mut deltas = Deltas::default();
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
