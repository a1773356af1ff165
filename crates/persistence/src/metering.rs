//! What the model gateway and the egress proxy record about sandboxed runs
//! (docs/contract.md#68-model-gateway): every metered model call, written as it finishes, and
//! every connection the egress proxy refused.
//!
//! A run's metered cost is the sum of its calls ([`run_totals`]): whoever records the run
//! (the process that ran it, or the replica that recovered its task after a crash) reads the
//! same rows, under the task's lock, and a call written after the run is on record is added
//! to it ([`record_held_call`]), so no call is lost or counted twice.

use agentry_domain::{TaskState, Tokens, Usd};
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, from_db, to_db};
use crate::fetch::Fetch;
use crate::schema::{egress_blocked, model_calls, tasks};
use crate::{AnyConnection, DbError, write_tx};

/// The most calls [`task_calls`] returns.
pub const MAX_CALLS_LISTED: i64 = 10_000;

/// The [`ModelCall::outcome`] of a call the gateway refused: never sent, it costs nothing.
pub const REFUSED: &str = "refused";

/// One model call of a run, as the gateway metered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall {
    /// Call id.
    pub id: Uuid,
    /// The task.
    pub task_id: Uuid,
    /// The run's attempt.
    pub attempt: i32,
    /// `anthropic` or `openai`.
    pub provider: String,
    /// The model the provider answered with (else the one asked for).
    pub model: Option<String>,
    /// The HTTP status the agent got.
    pub status: i32,
    /// How the call ended: `completed`, `refused` (by the gateway: budget, bad request),
    /// `upstream_error` (the provider answered an error), `interrupted` (the stream broke
    /// off, or the agent hung up before it ended).
    pub outcome: String,
    /// Its tokens (all input, its cache reads and writes, output with reasoning).
    pub tokens: Tokens,
    /// The part of the output spent on reasoning, where the provider says.
    pub reasoning_tokens: i64,
    /// Its priced cost; `None` when the model has no price.
    pub cost_usd: Option<Usd>,
    /// When the gateway received it.
    pub started_at: OffsetDateTime,
    /// How long until its response ended, in milliseconds.
    pub duration_ms: i64,
}

#[derive(Queryable, Selectable, Insertable)]
#[diesel(table_name = model_calls)]
struct CallRow {
    id: String,
    task_id: String,
    attempt: i32,
    provider: String,
    model: Option<String>,
    status: i32,
    outcome: String,
    input_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    output_tokens: i64,
    reasoning_tokens: i64,
    cost_nanos: Option<i64>,
    started_at: PrimitiveDateTime,
    duration_ms: i64,
}

impl TryFrom<CallRow> for ModelCall {
    type Error = DbError;
    fn try_from(r: CallRow) -> Result<Self, DbError> {
        Ok(ModelCall {
            id: convert::uuid(&r.id)?,
            task_id: convert::uuid(&r.task_id)?,
            attempt: r.attempt,
            provider: r.provider,
            model: r.model,
            status: r.status,
            outcome: r.outcome,
            tokens: Tokens::from_uncached(
                r.input_tokens,
                r.cache_read_tokens,
                r.cache_write_tokens,
                r.output_tokens,
            ),
            reasoning_tokens: r.reasoning_tokens,
            cost_usd: convert::usd(r.cost_nanos)?,
            started_at: from_db(r.started_at),
            duration_ms: r.duration_ms,
        })
    }
}

/// Records one finished model call of a run that holds its budgets per call
/// ([`crate::budgets::Holding::PerCall`]), and in the same transaction replaces what the call
/// held ([`crate::budgets::hold_call`]; zero if it held nothing) by its cost in the run's
/// hold, while the attempt is in progress and holds anything. The hold is then the run's
/// metered spend plus its calls in flight.
///
/// A call of a run already on record (still being written when the run's recorder stopped
/// waiting for its calls, or made by an agent that lived on after its run was recovered as
/// `lost`) is added to that run, its task's totals and the month's spend instead, so that no
/// metered call goes uncounted. The task's row is locked first: a recorder reads a run's
/// calls under the same lock, so each call is either among those it reads or finds the run
/// on record.
pub fn record_held_call(
    conn: &mut AnyConnection,
    call: &ModelCall,
    held: Usd,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        crate::revisions::lock_task(conn, call.task_id)?;
        record_call(conn, call)?;
        // A call the gateway refused was never sent: it has nothing to add to a run.
        if call.outcome != REFUSED && crate::tasks::add_late_call(conn, call)? {
            return Ok(());
        }
        let cost = call.cost_usd.map_or(0, Usd::to_nanos);
        let delta = cost.saturating_sub(held.to_nanos());
        if delta != 0 {
            diesel::update(
                tasks::table
                    .filter(tasks::id.eq(call.task_id.to_string()))
                    .filter(tasks::attempt.eq(call.attempt))
                    .filter(tasks::state.eq_any([
                        TaskState::Provisioning.as_str(),
                        TaskState::Running.as_str(),
                    ]))
                    .filter(tasks::budget_reserve_nanos.is_not_null()),
            )
            .set(tasks::budget_reserve_nanos.eq(tasks::budget_reserve_nanos + Some(delta)))
            .execute(conn)?;
        }
        Ok(())
    })
}

/// Records one finished model call.
pub fn record_call(conn: &mut AnyConnection, call: &ModelCall) -> Result<(), DbError> {
    diesel::insert_into(model_calls::table)
        .values(CallRow {
            id: call.id.to_string(),
            task_id: call.task_id.to_string(),
            attempt: call.attempt,
            provider: call.provider.clone(),
            model: call.model.clone(),
            status: call.status,
            outcome: call.outcome.clone(),
            input_tokens: call.tokens.uncached().max(0),
            cache_read_tokens: call.tokens.cache_read.max(0),
            cache_write_tokens: call.tokens.cache_write.max(0),
            output_tokens: call.tokens.output.max(0),
            reasoning_tokens: call.reasoning_tokens.max(0),
            cost_nanos: call.cost_usd.map(Usd::to_nanos),
            started_at: to_db(call.started_at),
            duration_ms: call.duration_ms.max(0),
        })
        .execute(conn)?;
    Ok(())
}

/// The calls of a task (of one attempt, if given), oldest first, at most
/// [`MAX_CALLS_LISTED`].
pub fn task_calls(
    conn: &mut AnyConnection,
    task_id: Uuid,
    attempt: Option<i32>,
) -> Result<Vec<ModelCall>, DbError> {
    let mut query = model_calls::table
        .filter(model_calls::task_id.eq(task_id.to_string()))
        .into_boxed();
    if let Some(attempt) = attempt {
        query = query.filter(model_calls::attempt.eq(attempt));
    }
    query
        .order((
            model_calls::attempt.asc(),
            model_calls::started_at.asc(),
            model_calls::id.asc(),
        ))
        .limit(MAX_CALLS_LISTED)
        .select(CallRow::as_select())
        .load_as(conn)
}

/// What the metered calls of one run add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunTotals {
    /// How many calls.
    pub calls: i64,
    /// Their summed cost; `None` when a call that used tokens has no price.
    pub cost_usd: Option<Usd>,
    /// The models of calls that used tokens but have no price.
    pub unpriced: Vec<String>,
    /// Their summed tokens.
    pub tokens: Tokens,
}

impl RunTotals {
    /// Makes `run`'s cost, tokens and call count those of its metered calls, keeping what
    /// the agent printed as `reported_cost_usd`; a cost unknown for want of a price gets a
    /// note in its error message. Returns the printed cost.
    pub fn meter(&self, run: &mut crate::tasks::Run) -> Option<Usd> {
        let reported = run.cost_usd;
        run.reported_cost_usd = reported;
        run.model_calls = Some(self.calls);
        run.cost_usd = self.cost_usd;
        run.tokens = self.tokens;
        if self.cost_usd.is_none() {
            let why = format!(
                "its cost is unknown: model {} has no price (add it to AGENTRY_PRICES_FILE)",
                self.unpriced.join(", ")
            );
            run.error_message = Some(match run.error_message.take() {
                Some(message) => format!("{message}; {why}"),
                None => why,
            });
        }
        reported
    }
}

/// How many calls [`run_totals`] reads at once.
const TOTALS_PAGE: i64 = 10_000;

/// The totals of the metered calls of one run: every call, however many (read a page at a
/// time, in the order of the run's index), summed here exactly.
pub fn run_totals(
    conn: &mut AnyConnection,
    task_id: Uuid,
    attempt: i32,
) -> Result<RunTotals, DbError> {
    let mut totals = RunTotals {
        cost_usd: Some(Usd::ZERO),
        ..RunTotals::default()
    };
    let mut after: Option<(PrimitiveDateTime, String)> = None;
    loop {
        let mut page = model_calls::table
            .filter(model_calls::task_id.eq(task_id.to_string()))
            .filter(model_calls::attempt.eq(attempt))
            .into_boxed();
        if let Some((at, id)) = after.take() {
            page = page.filter(
                model_calls::started_at
                    .gt(at)
                    .or(model_calls::started_at.eq(at).and(model_calls::id.gt(id))),
            );
        }
        let rows: Vec<CallRow> = page
            .order((model_calls::started_at.asc(), model_calls::id.asc()))
            .limit(TOTALS_PAGE)
            .select(CallRow::as_select())
            .load(conn)?;
        let full = rows.len() as i64 == TOTALS_PAGE;
        after = rows.last().map(|r| (r.started_at, r.id.clone()));
        for row in rows {
            add_to_totals(&mut totals, ModelCall::try_from(row)?)?;
        }
        if !full {
            return Ok(totals);
        }
    }
}

/// Adds one call to a run's totals.
fn add_to_totals(totals: &mut RunTotals, call: ModelCall) -> Result<(), DbError> {
    let overflow = || DbError::Conflict("metered total overflow".into());
    totals.calls += 1;
    totals.tokens = totals
        .tokens
        .checked_add(call.tokens)
        .ok_or_else(overflow)?;
    let used = call.tokens.input + call.tokens.output > 0;
    match call.cost_usd {
        Some(cost) => {
            totals.cost_usd = match totals.cost_usd {
                Some(sum) => Some(sum.checked_add(cost).ok_or_else(overflow)?),
                None => None,
            }
        }
        None if used => {
            totals.cost_usd = None;
            let model = call.model.unwrap_or_else(|| "(unknown)".to_owned());
            if !totals.unpriced.contains(&model) {
                totals.unpriced.push(model);
            }
        }
        None => {}
    }
    Ok(())
}

/// The most destinations listed per run in `egress_blocked`; refusals to any further
/// destination are summed in the run's [`OTHER_HOST`] row, so an agent trying many hosts
/// and ports keeps the task's record small.
pub const MAX_BLOCKED_TARGETS: usize = 32;

/// The host of a run's row that sums the refusals to destinations beyond its first
/// [`MAX_BLOCKED_TARGETS`]; its port is [`OTHER_PORT`]. Never a valid host name.
pub const OTHER_HOST: &str = "*";

/// The port of the [`OTHER_HOST`] row.
pub const OTHER_PORT: u16 = 0;

/// Connections the egress proxy refused to one destination during one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressBlocked {
    /// The run's attempt.
    pub attempt: i32,
    /// The host asked for (a name or an IP literal), or [`OTHER_HOST`] for the
    /// destinations beyond the run's first [`MAX_BLOCKED_TARGETS`].
    pub host: String,
    /// The port asked for ([`OTHER_PORT`] for the [`OTHER_HOST`] row).
    pub port: i32,
    /// How many attempts were refused.
    pub count: i64,
    /// The first one.
    pub first_at: OffsetDateTime,
    /// The last one.
    pub last_at: OffsetDateTime,
}

impl EgressBlocked {
    /// Whether this row sums the destinations beyond the run's first
    /// [`MAX_BLOCKED_TARGETS`].
    pub fn is_other(&self) -> bool {
        self.host == OTHER_HOST
    }
}

/// Refused connections of one run to one destination, counted in memory since the last
/// write ([`record_blocked_batch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedTally {
    /// The host (normal form), or [`OTHER_HOST`] for refusals the caller already counts
    /// beyond the run's listed destinations.
    pub host: String,
    /// The port ([`OTHER_PORT`] with [`OTHER_HOST`]).
    pub port: u16,
    /// How many were refused; at least 1.
    pub count: i64,
    /// The first of them.
    pub first_at: OffsetDateTime,
    /// The last of them.
    pub last_at: OffsetDateTime,
}

/// Counts one refused connection of a run to `host:port` ([`record_blocked_batch`] of one).
pub fn record_blocked(
    conn: &mut AnyConnection,
    task_id: Uuid,
    attempt: i32,
    host: &str,
    port: u16,
    at: OffsetDateTime,
) -> Result<(), DbError> {
    let tally = BlockedTally {
        host: host.to_owned(),
        port,
        count: 1,
        first_at: at,
        last_at: at,
    };
    record_blocked_batch(conn, task_id, attempt, std::slice::from_ref(&tally))
}

/// Adds `tallies` (refused connections of one run, counted in memory) to the run's rows in
/// one write transaction, and their sum to the repository's counter
/// (`agentry_egress_blocked_total`). A destination already listed for the run gets its count
/// added and its last time moved on; a new one gets a row while the run lists fewer than
/// [`MAX_BLOCKED_TARGETS`], else its refusals join the run's [`OTHER_HOST`] row (as do
/// tallies of [`OTHER_HOST`] itself). A tally with a count below 1 is skipped.
pub fn record_blocked_batch(
    conn: &mut AnyConnection,
    task_id: Uuid,
    attempt: i32,
    tallies: &[BlockedTally],
) -> Result<(), DbError> {
    let tallies: Vec<&BlockedTally> = tallies.iter().filter(|t| t.count > 0).collect();
    if tallies.is_empty() {
        return Ok(());
    }
    let task = task_id.to_string();
    let write = |conn: &mut AnyConnection| {
        write_tx(conn, |conn| write_tallies(conn, &task, attempt, &tallies))
    };
    match write(conn) {
        // A concurrent writer of the same run inserted a row first: count on it.
        Err(e) if e.is_unique_violation() => write(conn),
        other => other,
    }
}

/// [`record_blocked_batch`] within the caller's transaction.
fn write_tallies(
    conn: &mut AnyConnection,
    task: &str,
    attempt: i32,
    tallies: &[&BlockedTally],
) -> Result<(), DbError> {
    let run = egress_blocked::table
        .filter(egress_blocked::task_id.eq(task))
        .filter(egress_blocked::attempt.eq(attempt));
    let listed: i64 = run
        .filter(egress_blocked::host.ne(OTHER_HOST))
        .count()
        .get_result(conn)?;
    let mut listed = usize::try_from(listed).unwrap_or(usize::MAX);
    let mut other: Option<(i64, OffsetDateTime, OffsetDateTime)> = None;
    let mut total: i64 = 0;
    let overflow = || DbError::Conflict("refused connection count overflow".into());
    for tally in tallies {
        total = total.checked_add(tally.count).ok_or_else(overflow)?;
        let is_other = tally.host == OTHER_HOST;
        if !is_other && add_to_row(conn, task, attempt, tally)? {
            continue;
        }
        if !is_other && listed < MAX_BLOCKED_TARGETS {
            insert_row(conn, task, attempt, tally)?;
            listed += 1;
            continue;
        }
        other = Some(match other {
            None => (tally.count, tally.first_at, tally.last_at),
            Some((count, first, last)) => (
                count.checked_add(tally.count).ok_or_else(overflow)?,
                first.min(tally.first_at),
                last.max(tally.last_at),
            ),
        });
    }
    if let Some((count, first_at, last_at)) = other {
        let tally = BlockedTally {
            host: OTHER_HOST.to_owned(),
            port: OTHER_PORT,
            count,
            first_at,
            last_at,
        };
        if !add_to_row(conn, task, attempt, &tally)? {
            insert_row(conn, task, attempt, &tally)?;
        }
    }
    crate::scrape::add_blocked(conn, task, total)
}

/// Adds `tally` to the run's row of its `host:port`; whether there was one.
fn add_to_row(
    conn: &mut AnyConnection,
    task: &str,
    attempt: i32,
    tally: &BlockedTally,
) -> Result<bool, DbError> {
    let key = egress_blocked::table
        .filter(egress_blocked::task_id.eq(task))
        .filter(egress_blocked::attempt.eq(attempt))
        .filter(egress_blocked::host.eq(&tally.host))
        .filter(egress_blocked::port.eq(i32::from(tally.port)));
    let updated = diesel::update(key)
        .set((
            egress_blocked::count.eq(egress_blocked::count + tally.count),
            egress_blocked::last_at.eq(to_db(tally.last_at)),
        ))
        .execute(conn)?;
    if updated > 0 {
        // An earlier first time (a tally written late) moves the first time back.
        diesel::update(key.filter(egress_blocked::first_at.gt(to_db(tally.first_at))))
            .set(egress_blocked::first_at.eq(to_db(tally.first_at)))
            .execute(conn)?;
    }
    Ok(updated > 0)
}

/// The run's new row of `tally`'s `host:port`.
fn insert_row(
    conn: &mut AnyConnection,
    task: &str,
    attempt: i32,
    tally: &BlockedTally,
) -> Result<(), DbError> {
    diesel::insert_into(egress_blocked::table)
        .values((
            egress_blocked::task_id.eq(task),
            egress_blocked::attempt.eq(attempt),
            egress_blocked::host.eq(&tally.host),
            egress_blocked::port.eq(i32::from(tally.port)),
            egress_blocked::count.eq(tally.count),
            egress_blocked::first_at.eq(to_db(tally.first_at)),
            egress_blocked::last_at.eq(to_db(tally.last_at)),
        ))
        .execute(conn)?;
    Ok(())
}

/// The refused destinations of a task's runs, by attempt, then first refusal; each run's
/// [`OTHER_HOST`] row last. At most [`MAX_BLOCKED_TARGETS`] + 1 rows per run.
pub fn task_blocked(
    conn: &mut AnyConnection,
    task_id: Uuid,
) -> Result<Vec<EgressBlocked>, DbError> {
    type Row = (i32, String, i32, i64, PrimitiveDateTime, PrimitiveDateTime);
    let rows: Vec<Row> = egress_blocked::table
        .filter(egress_blocked::task_id.eq(task_id.to_string()))
        .select((
            egress_blocked::attempt,
            egress_blocked::host,
            egress_blocked::port,
            egress_blocked::count,
            egress_blocked::first_at,
            egress_blocked::last_at,
        ))
        .load(conn)?;
    let mut blocked: Vec<EgressBlocked> = rows
        .into_iter()
        .map(|(attempt, host, port, count, first, last)| EgressBlocked {
            attempt,
            host,
            port,
            count,
            first_at: from_db(first),
            last_at: from_db(last),
        })
        .collect();
    blocked.sort_by(|a, b| {
        (a.attempt, a.is_other(), a.first_at, &a.host, a.port).cmp(&(
            b.attempt,
            b.is_other(),
            b.first_at,
            &b.host,
            b.port,
        ))
    });
    Ok(blocked)
}

/// Refused connections of all runs, summed by repository URL (for the counter
/// `agentry_egress_blocked_total{repo}`), ordered by URL.
pub fn blocked_by_repo(conn: &mut AnyConnection) -> Result<Vec<(String, i64)>, DbError> {
    use crate::schema::tasks;
    use diesel::dsl::sql;
    use diesel::sql_types::BigInt;
    Ok(egress_blocked::table
        .inner_join(tasks::table.on(tasks::id.eq(egress_blocked::task_id)))
        .group_by(tasks::repo_url)
        .select((
            tasks::repo_url,
            sql::<BigInt>("CAST(COALESCE(SUM(egress_blocked.count), 0) AS BIGINT)"),
        ))
        .order_by(tasks::repo_url)
        .load(conn)?)
}
