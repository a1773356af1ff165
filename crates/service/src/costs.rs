//! The cost report (docs/contract.md#4-cost-report) from storage: reads the rollups and two index-backed task
//! queries, assembles [`ReportInputs`], and lets `agentry-analytics` compute the report.
//! Shared by `GET /api/analytics/costs` and `agentry costs`.
//!
//! [`crate::Service::cost_report`] keeps the reports it computed (a few, per service) and
//! serves one again while nothing it was computed from changed: the request's parameters
//! and the UTC day are its key, and the [`ReportStamp`] read before computing it (the
//! report generation, which every rollup write raises in its own transaction, and the
//! budget settings) must be the same when it is served. That is one small read per request
//! instead of a computation, and a write committed anywhere (another replica included) is
//! in the next report.
//!
//! A miss computes the report once for everyone asking at the same time: the request takes
//! its key's gate, then looks again (with a stamp read after the wait) before computing.
//! While costs are being recorded every write misses, and without the gate each of the
//! requests in flight computed the same report at once: in the load run with agents at
//! work (docs/benchmarks.md) that took the server from 114 to 257 MB.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use agentry_analytics::{
    CostReport, OutcomeTotals, ReportInputs, TaskFact, Totals, Window, anomaly_threshold_nanos,
    report,
};
use agentry_domain::{RepoUrl, TaskType};
use agentry_persistence::rollups::{self, Combo, OutcomeSums, ReportStamp, Sums};
use agentry_persistence::tasks::{CostWindow, costliest_in_window};
use agentry_persistence::{AnyConnection, DbError};
use rust_decimal::Decimal;
use time::{Date, OffsetDateTime, Time};

/// How many tasks `topTasks` lists.
const TOP: usize = 10;

fn totals(s: Sums) -> Totals {
    Totals {
        tasks: s.tasks,
        costed: s.costed,
        cost: usd(s.cost_nanos),
        succeeded: s.succeeded,
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        imported_cost: usd(s.imported_cost_nanos),
    }
}

fn usd(nanos: i64) -> Decimal {
    Decimal::from_i128_with_scale(i128::from(nanos), 9)
}

fn outcome_totals(s: OutcomeSums) -> OutcomeTotals {
    OutcomeTotals {
        merged: s.merged,
        costed: s.costed,
        cost: usd(s.cost_nanos),
        merged_cost: usd(s.merged_cost_nanos),
        failed_cost: usd(s.failed_cost_nanos),
        merged_revisions: s.merged_revisions,
        revision_cost: usd(s.revision_cost_nanos),
    }
}

fn midnight(d: Date) -> OffsetDateTime {
    d.with_time(Time::MIDNIGHT).assume_utc()
}

/// The window of `days` days ending today (UTC).
pub fn window_ending_now(days: u32) -> Result<Window, agentry_analytics::WindowError> {
    Window::new(OffsetDateTime::now_utc().date(), days)
}

/// Reads everything the report needs for `window`, optionally for one repository.
pub fn load_inputs(
    conn: &mut AnyConnection,
    window: Window,
    repo: Option<&RepoUrl>,
) -> Result<ReportInputs, DbError> {
    let repo = repo.map(RepoUrl::as_str);
    let end = window.today();
    let before_start = rollups::day_before(window.start());
    let before_previous = rollups::day_before(window.previous_start());
    let before_month = rollups::day_before(window.month_start());
    let points = [end, before_start, before_previous, before_month];

    // Cumulative sums of every combination at the four points; outcome sums at the first
    // two (the period's units).
    let mut at: BTreeMap<Combo, [Sums; 4]> = BTreeMap::new();
    let mut outcome_at: BTreeMap<Combo, [OutcomeSums; 2]> = BTreeMap::new();
    for (day, combo, sums, outcome) in rollups::cumulative_with_outcomes_at(conn, &points)? {
        let outcome_slots = outcome_at.entry(combo.clone()).or_default();
        for (i, p) in points.iter().take(2).enumerate() {
            if *p == day {
                outcome_slots[i] = outcome;
            }
        }
        let slots = at.entry(combo).or_default();
        for (i, p) in points.iter().enumerate() {
            if *p == day {
                slots[i] = sums;
            }
        }
    }
    let mut outcomes = Vec::new();
    for ((repo_url, _, model), o) in &outcome_at {
        if repo.is_some_and(|r| r != repo_url) {
            continue;
        }
        let period = o[0].minus(o[1])?;
        if period != OutcomeSums::default() {
            let model = (!model.is_empty()).then(|| model.clone());
            outcomes.push((repo_url.clone(), model, outcome_totals(period)));
        }
    }

    let mut previous = Totals::default();
    let mut month_to_date = Totals::default();
    let mut by_repo: BTreeMap<String, Sums> = BTreeMap::new();
    let mut by_type: BTreeMap<TaskType, Totals> = BTreeMap::new();
    let mut by_model: BTreeMap<Option<String>, Totals> = BTreeMap::new();
    let mut coding_by_repo_model: BTreeMap<(String, String), Totals> = BTreeMap::new();
    let mut coding_by_model_all_repos: BTreeMap<String, Totals> = BTreeMap::new();
    for ((repo_url, task_type, model), s) in &at {
        let period_sums = s[0].minus(s[1])?;
        let period = totals(period_sums);
        let task_type: TaskType = task_type
            .parse()
            .map_err(|_| DbError::Corrupt(format!("rollup task type {task_type:?}")))?;
        let coding = task_type == TaskType::Coding && !model.is_empty();
        if coding {
            coding_by_model_all_repos
                .entry(model.clone())
                .or_default()
                .add(&period);
        }
        if repo.is_some_and(|r| r != repo_url) {
            continue;
        }
        previous.add(&totals(s[1].minus(s[2])?));
        month_to_date.add(&totals(s[0].minus(s[3])?));
        let r = by_repo.entry(repo_url.clone()).or_default();
        *r = r.plus(period_sums)?;
        by_type.entry(task_type).or_default().add(&period);
        let model_key = (!model.is_empty()).then(|| model.clone());
        by_model.entry(model_key).or_default().add(&period);
        if coding {
            coding_by_repo_model
                .entry((repo_url.clone(), model.clone()))
                .or_default()
                .add(&period);
        }
    }

    let daily = rollups::daily_between(conn, window.start(), end, repo)?
        .into_iter()
        .map(|(day, s)| (day, totals(s)))
        .collect();

    let from = midnight(window.start());
    let to = midnight(end) + time::Duration::days(1);
    // Anomaly candidates: per repository, its period's tasks at or above its threshold.
    let mut anomaly_candidates = Vec::new();
    for (repo_url, sums) in &by_repo {
        if let Some(threshold) = anomaly_threshold_nanos(sums.costed, sums.cost_nanos) {
            let period = CostWindow {
                from,
                to,
                repo_url: Some(repo_url),
                costed: sums.costed,
            };
            let found = costliest_in_window(conn, period, threshold, None)?;
            anomaly_candidates.extend(found.into_iter().map(TaskFact::from));
        }
    }
    let period = CostWindow {
        from,
        to,
        repo_url: repo,
        costed: by_repo.values().map(|s| s.costed).sum(),
    };
    let top_candidates = costliest_in_window(conn, period, 0, Some(TOP))?
        .into_iter()
        .map(TaskFact::from)
        .collect();

    Ok(ReportInputs {
        window,
        daily,
        previous,
        month_to_date,
        by_repo: by_repo.into_iter().map(|(r, s)| (r, totals(s))).collect(),
        by_type: by_type.into_iter().collect(),
        by_model: by_model.into_iter().collect(),
        coding_by_repo_model: coding_by_repo_model
            .into_iter()
            .map(|((r, m), t)| (r, m, t))
            .collect(),
        coding_by_model_all_repos: coding_by_model_all_repos.into_iter().collect(),
        anomaly_candidates,
        top_candidates,
        outcomes,
        // Budgets are always this month's (docs/contract.md#67-budgets), whatever the period.
        budgets: agentry_persistence::budgets::all_set(conn, repo, agentry_persistence::now())?
            .into_iter()
            .map(|b| agentry_analytics::budgets::BudgetInput {
                repo_url: b.repo_url.map(|u| u.to_string()),
                monthly_budget: b.budget.as_decimal(),
                month_to_date: b.spent.as_decimal(),
            })
            .collect(),
    })
}

/// The cost report for `window` and an optional repository.
pub fn cost_report(
    conn: &mut AnyConnection,
    window: Window,
    repo: Option<&RepoUrl>,
) -> Result<CostReport, DbError> {
    // One snapshot for every read: a write committed between two of them would give a
    // report that disagrees with itself (a total that is not the sum of its breakdown).
    let inputs = agentry_persistence::read_tx(conn, |conn| load_inputs(conn, window, repo))?;
    Ok(report(&inputs))
}

/// How many computed reports are kept (over every service of the process); the least
/// recently used one goes first.
const MEMO_ENTRIES: usize = 16;

/// What a kept report answers: the request's parameters and the UTC day (the budgets are
/// this month's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MemoKey {
    window: Window,
    repo: Option<String>,
    day: Date,
}

struct MemoEntry {
    /// The service that computed it: its database is what the stamp describes. A `Weak`
    /// keeps the allocation, so no other service can have the same address while it lives.
    owner: Weak<crate::Parts>,
    key: MemoKey,
    stamp: ReportStamp,
    report: CostReport,
    used: u64,
}

struct Memo {
    entries: Vec<MemoEntry>,
    clock: u64,
}

static MEMO: Mutex<Memo> = Mutex::new(Memo {
    entries: Vec::new(),
    clock: 0,
});

/// How many gates computations are spread over: two keys share a gate only by chance (their
/// hash), and then one waits for the other's computation.
const GATES: usize = 16;

/// One computation per key at a time: see the module's documentation.
static GATE: [tokio::sync::Mutex<()>; GATES] = [const { tokio::sync::Mutex::const_new(()) }; GATES];

/// The gate of a key (the service's address is part of it: services do not share reports).
fn gate(owner: &Weak<crate::Parts>, key: &MemoKey) -> &'static tokio::sync::Mutex<()> {
    // DefaultHasher::new has fixed keys: one key always lands on the same gate.
    let mut h = std::hash::DefaultHasher::new();
    (owner.as_ptr() as usize).hash(&mut h);
    key.hash(&mut h);
    // The modulo keeps the index below GATES, so the conversion cannot truncate a valid index.
    &GATE[(h.finish() % GATES as u64) as usize]
}

impl Memo {
    fn get(
        &mut self,
        owner: &Weak<crate::Parts>,
        key: &MemoKey,
        stamp: &ReportStamp,
    ) -> Option<CostReport> {
        self.clock += 1;
        let now = self.clock;
        let entry = self
            .entries
            .iter_mut()
            .find(|e| Weak::ptr_eq(&e.owner, owner) && e.key == *key)?;
        if entry.stamp != *stamp {
            return None;
        }
        entry.used = now;
        Some(entry.report.clone())
    }

    fn put(
        &mut self,
        owner: Weak<crate::Parts>,
        key: MemoKey,
        stamp: ReportStamp,
        report: CostReport,
    ) {
        self.clock += 1;
        let used = self.clock;
        self.entries.retain(|e| {
            e.owner.strong_count() > 0 && !(Weak::ptr_eq(&e.owner, &owner) && e.key == key)
        });
        while self.entries.len() >= MEMO_ENTRIES {
            let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            else {
                break;
            };
            self.entries.swap_remove(oldest);
        }
        self.entries.push(MemoEntry {
            owner,
            key,
            stamp,
            report,
            used,
        });
    }
}

impl crate::Service {
    /// The cost report for `window` and an optional repository (docs/contract.md#4-cost-report).
    ///
    /// Served from the reports this service computed while its [`ReportStamp`] is unchanged
    /// (see the module's documentation); computed otherwise.
    pub async fn cost_report(
        &self,
        window: Window,
        repo: Option<RepoUrl>,
    ) -> Result<CostReport, crate::ServiceError> {
        let owner = Arc::downgrade(&self.parts);
        let key = MemoKey {
            window,
            repo: repo.as_ref().map(|r| r.as_str().to_owned()),
            day: agentry_persistence::now().date(),
        };
        let (o, k) = (owner.clone(), key.clone());
        let kept = self
            .db(move |conn| Ok(kept_report(conn, &o, &k)?.ok()))
            .await?;
        if let Some(report) = kept {
            return Ok(report);
        }
        // Whoever computes this key now holds the gate; once in, the report it kept is
        // served if nothing changed meanwhile (the stamp is read again, after the wait).
        let _computing = gate(&owner, &key).lock().await;
        self.db(move |conn| {
            let stamp = match kept_report(conn, &owner, &key)? {
                Ok(report) => return Ok(report),
                Err(stamp) => stamp,
            };
            let report = cost_report(conn, window, repo.as_ref())?;
            if let Some(parts) = owner.upgrade() {
                parts.reports_computed.fetch_add(1, Ordering::Relaxed);
            }
            MEMO.lock().put(owner, key, stamp, report.clone());
            Ok(report)
        })
        .await
    }

    /// How many cost reports this service computed rather than served from the ones it kept
    /// (see the module's documentation): with the request count, the memo's miss rate.
    pub fn cost_reports_computed(&self) -> u64 {
        self.parts.reports_computed.load(Ordering::Relaxed)
    }
}

/// The kept report for `key` if its stamp is the current one; else the current stamp, which
/// a report computed next is kept under. The stamp is read before the report: a write
/// committed after this read raises it, so a report computed from older data is never served
/// past it.
fn kept_report(
    conn: &mut AnyConnection,
    owner: &Weak<crate::Parts>,
    key: &MemoKey,
) -> Result<Result<CostReport, ReportStamp>, DbError> {
    let stamp = rollups::report_stamp(conn)?;
    let kept = MEMO.lock().get(owner, key, &stamp);
    Ok(kept.ok_or(stamp))
}
