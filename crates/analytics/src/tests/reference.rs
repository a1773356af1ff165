//! The key test: `report(&ReportInputs::from_tasks(..))` against an independent,
//! obviously-correct reference written directly from the task list and docs/contract.md#4-cost-report, on random
//! data sets. The reference shares no aggregation code with the crate: it loops over the
//! tasks, sums integer nano-dollars in `i128`, compares fractions by cross-multiplying
//! integers and rounds with integer division.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use agentry_domain::{TaskState, TaskType, Usd};
use agentry_testkit::SplitMix64;
use rust_decimal::Decimal;
use time::macros::date;
use time::{Date, UtcOffset};
use uuid::Uuid;

use crate::*;

/// Number of random data sets.
const CASES: u64 = 400;

/// One random data set.
struct Case {
    today: Date,
    days: u32,
    filter: Option<String>,
    tasks: Vec<TaskFact>,
}

fn generate(seed: u64) -> Case {
    let mut rng = SplitMix64::new(seed);
    let specials = [
        date!(2024 - 12 - 31),
        date!(2025 - 01 - 01),
        date!(2024 - 02 - 28),
        date!(2024 - 02 - 29),
        date!(2023 - 02 - 28),
        date!(2024 - 03 - 01),
        date!(2024 - 04 - 30),
        date!(2024 - 01 - 31),
        date!(2025 - 06 - 01),
    ];
    let today = if rng.chance(25) {
        *rng.pick(&specials)
    } else {
        let first = date!(2023 - 01 - 01).to_julian_day();
        Date::from_julian_day(first + rng.below(4 * 365) as i32).unwrap()
    };
    let days = if rng.chance(5) {
        rng.range(61, 365)
    } else {
        rng.range(1, 60)
    } as u32;
    let repos: Vec<String> = (0..rng.range(1, 6))
        .map(|i| format!("https://github.com/org/repo{i}"))
        .collect();
    let all_models = ["opus", "sonnet", "haiku", "gpt-5", "o3"];
    let rotate = rng.below(5) as usize;
    let models: Vec<&str> = (0..rng.range(1, 5) as usize)
        .map(|i| all_models[(i + rotate) % 5])
        .collect();
    let tie_costs = ["0.5", "1", "2", "3", "4", "0.25", "0.1", "0.2", "0.3"];
    // Spiky cases: mostly cheap tasks and some very expensive ones, so that many
    // anomalies (more than the 20 listed) occur.
    let spiky = rng.chance(20);
    let count = if spiky {
        rng.range(300, 600) as u64
    } else {
        rng.below(301)
    };
    let mut tasks = Vec::new();
    for i in 0..count {
        let offset = if rng.chance(if spiky { 90 } else { 50 }) {
            rng.range(-i64::from(days) + 1, 0)
        } else {
            rng.range(-115, 5)
        };
        let day = Date::from_julian_day(today.to_julian_day() + offset as i32).unwrap();
        let mut created_at = day.midnight().assume_utc()
            + time::Duration::seconds(rng.below(86_400) as i64)
            + time::Duration::nanoseconds(if rng.chance(20) {
                rng.below(1_000_000_000) as i64
            } else {
                0
            });
        if rng.chance(20) {
            let quarter_hours = rng.range(-14 * 4, 14 * 4) as i32;
            created_at =
                created_at.to_offset(UtcOffset::from_whole_seconds(quarter_hours * 900).unwrap());
        }
        let cost = match rng.below(100) {
            0..20 => None,
            20..28 => Some(Usd::ZERO),
            28..42 => Some(rng.pick(&tie_costs).parse::<Usd>().unwrap()),
            _ if spiky => {
                let nanos = if rng.chance(20) {
                    rng.range(10_000_000_000, 100_000_000_000)
                } else {
                    rng.range(1_000_000, 10_000_000)
                };
                Some(Usd::from_nanos(nanos).unwrap())
            }
            _ => {
                // Log-spread magnitudes (up to $1000) with 0–9 decimals.
                let magnitude = 10_u64.pow(rng.range(1, 12) as u32);
                let mut nanos = rng.below(magnitude + 1);
                let decimals = rng.below(10) as u32;
                nanos -= nanos % 10_u64.pow(9 - decimals);
                Some(Usd::from_nanos(nanos as i64).unwrap())
            }
        };
        tasks.push(TaskFact {
            id: Uuid::from_u128((u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64())),
            title: format!("task {i}"),
            repo_url: rng.pick(&repos).clone(),
            task_type: if rng.chance(65) {
                TaskType::Coding
            } else {
                TaskType::Review
            },
            state: *rng.pick(&TaskState::ALL),
            model_used: if rng.chance(12) {
                None
            } else {
                Some(rng.pick(&models).to_string())
            },
            cost,
            input_tokens: rng.below(1_000_000) as i64,
            output_tokens: rng.below(100_000) as i64,
            created_at,
            parent_task_id: None,
            revisions: 0,
            revision_cost: Usd::ZERO,
            imported: rng.chance(15),
        });
    }
    // Review subtasks: most of a coding task (any day, any repository: the data is random),
    // some of a review task or of a task that is not there (their own units).
    let ids: Vec<(Uuid, TaskType)> = tasks.iter().map(|t| (t.id, t.task_type)).collect();
    if !ids.is_empty() {
        for t in tasks.iter_mut().filter(|t| t.task_type == TaskType::Review) {
            t.parent_task_id = match rng.below(10) {
                0..6 => {
                    let coding: Vec<Uuid> = ids
                        .iter()
                        .filter(|(_, ty)| *ty == TaskType::Coding)
                        .map(|(id, _)| *id)
                        .collect();
                    if coding.is_empty() {
                        None
                    } else {
                        Some(*rng.pick(&coding))
                    }
                }
                6 => Some(rng.pick(&ids).0),
                7 => Some(Uuid::from_u128(u128::from(rng.next_u64()))),
                _ => None,
            };
        }
    }
    // Revision rounds of coding tasks, in any state (a round may start and the pull request
    // be merged or closed later); their revision runs cost part of the task's cost.
    for t in tasks.iter_mut().filter(|t| t.task_type == TaskType::Coding) {
        if rng.chance(40) {
            t.revisions = rng.range(1, 6) as i32;
            if let Some(cost) = t.cost {
                let nanos = cost.to_nanos() as u64;
                t.revision_cost = Usd::from_nanos(rng.below(nanos + 1) as i64).unwrap();
            }
        }
    }
    let filter = match rng.below(if spiky { 4 } else { 10 }) {
        0..3 => None,
        3..9 => Some(rng.pick(&repos).clone()),
        _ => Some("https://github.com/org/none".to_owned()),
    };
    Case {
        today,
        days,
        filter,
        tasks,
    }
}

// ---------------------------------------------------------------------------------------
// The reference.

/// Nano-dollars per unit of the 4th decimal.
const NANOS_PER_4DP: i128 = 100_000;

fn nanos(t: &TaskFact) -> Option<i128> {
    t.cost.map(|c| i128::from(c.to_nanos()))
}

fn usd(nanos: i128) -> Decimal {
    Decimal::from_i128_with_scale(nanos, 9)
}

fn utc_day(t: &TaskFact) -> Date {
    t.created_at.to_offset(UtcOffset::UTC).date()
}

fn add_days(d: Date, n: i64) -> Date {
    Date::from_julian_day(d.to_julian_day() + n as i32).unwrap()
}

/// `num / den` rounded half away from zero to an integer; `den > 0`.
fn round_half_away(num: i128, den: i128) -> i128 {
    assert!(den > 0);
    let (q, r) = (num.abs() / den, num.abs() % den);
    let q = if 2 * r >= den { q + 1 } else { q };
    if num < 0 { -q } else { q }
}

/// `units × 10^-dp` with exactly `dp` decimals.
fn fixed(units: i128, dp: u32) -> String {
    let a = units.unsigned_abs();
    let p = 10_u128.pow(dp);
    let text = format!("{}.{:0width$}", a / p, a % p, width = dp as usize);
    if units < 0 { format!("-{text}") } else { text }
}

/// Sums of a group of costed tasks, in nano-dollars.
#[derive(Debug, Default, Clone, Copy)]
struct Sum {
    n: i128,
    cost: i128,
    ok: i128,
    input: i64,
    output: i64,
}

impl Sum {
    fn push(&mut self, t: &TaskFact, cost: i128) {
        self.n += 1;
        self.cost += cost;
        if matches!(t.state, TaskState::PrOpened | TaskState::Completed) {
            self.ok += 1;
        }
        self.input += t.input_tokens;
        self.output += t.output_tokens;
    }
}

/// Rows of a cost chart: cost desc, count desc, key asc.
fn chart<K: Ord + Clone>(groups: &BTreeMap<K, Sum>) -> Vec<(K, Sum)> {
    let mut rows: Vec<(K, Sum)> = groups.iter().map(|(k, s)| (k.clone(), *s)).collect();
    rows.sort_by(|(ka, a), (kb, b)| b.cost.cmp(&a.cost).then(b.n.cmp(&a.n)).then(ka.cmp(kb)));
    rows
}

/// The rows of a cost chart made by `row` from each group's key, costs and sums.
fn chart_rows<T>(
    groups: &BTreeMap<String, Sum>,
    row: impl Fn(String, ChartCost, &Sum) -> T,
) -> Vec<T> {
    chart(groups)
        .into_iter()
        .map(|(key, s)| {
            let cost = ChartCost {
                total_cost: usd(s.cost),
                task_count: s.n as i64,
            };
            row(key, cost, &s)
        })
        .collect()
}

/// Anomalies: each costed task at least three times its repository's leave-one-out average
/// (the repository's other costed tasks), highest ratio first, at most 20.
fn reference_anomalies(
    costed: &[(&TaskFact, i128)],
    by_repo: &BTreeMap<String, Sum>,
) -> Vec<Anomaly> {
    let mut flagged: Vec<(&TaskFact, i128, i128, i128)> = Vec::new(); // (task, c, n − 1, S − c)
    for (t, c) in costed {
        let repo = by_repo[&t.repo_url];
        if repo.n < 3 {
            continue;
        }
        let others = repo.cost - c;
        let k = repo.n - 1;
        if others > 0 && *c * k >= 3 * others {
            flagged.push((t, *c, k, others));
        }
    }
    flagged.sort_by(|a, b| {
        // ratio = c·k / others
        (b.1 * b.2 * a.3)
            .cmp(&(a.1 * a.2 * b.3))
            .then(b.1.cmp(&a.1))
            .then(a.0.id.cmp(&b.0.id))
    });
    flagged
        .iter()
        .take(20)
        .map(|(t, c, k, others)| Anomaly {
            task: costed_task(t),
            repo_avg_cost: usd(*others) / Decimal::from(*k as i64),
            cost_ratio: usd(c * k) / usd(*others),
        })
        .collect()
}

/// Model suggestions: for each repository's coding model used at least 3 times, the cheapest
/// model as successful elsewhere (at least 5 uses), largest savings first, at most 10.
fn reference_suggestions(
    case: &Case,
    costed: &[(&TaskFact, i128)],
    in_period: impl Fn(&TaskFact) -> bool,
) -> Vec<ModelSuggestion> {
    let coding_model = |t: &TaskFact| {
        (t.task_type == TaskType::Coding)
            .then(|| t.model_used.clone())
            .flatten()
    };
    let mut current: BTreeMap<(String, String), Sum> = BTreeMap::new();
    for (t, c) in costed {
        if let Some(model) = coding_model(t) {
            current
                .entry((t.repo_url.clone(), model))
                .or_default()
                .push(t, *c);
        }
    }
    let mut everywhere: BTreeMap<String, Sum> = BTreeMap::new();
    for t in case.tasks.iter().filter(|t| in_period(t)) {
        if let (Some(model), Some(c)) = (coding_model(t), nanos(t)) {
            everywhere.entry(model).or_default().push(t, c);
        }
    }
    let mut rows: Vec<(ModelSuggestion, i128, i128)> = Vec::new(); // (row, savings num, den)
    for ((repo, model), s) in &current {
        if s.n < 3 {
            continue;
        }
        let mut options: Vec<(&String, &Sum)> = everywhere
            .iter()
            .filter(|(m, a)| {
                *m != model && a.n >= 5 && a.ok * s.n >= s.ok * a.n && a.cost * s.n < s.cost * a.n
            })
            .collect();
        options.sort_by(|(ma, a), (mb, b)| (a.cost * b.n).cmp(&(b.cost * a.n)).then(ma.cmp(mb)));
        let Some((best, a)) = options.first() else {
            continue;
        };
        // n × (cost/n − cost_a/m) = (cost·m − n·cost_a) / m
        let num = s.cost * a.n - s.n * a.cost;
        rows.push((
            ModelSuggestion {
                repo_url: repo.clone(),
                current_model: model.clone(),
                task_count: s.n as i64,
                avg_cost: usd(s.cost) / Decimal::from(s.n as i64),
                cheaper_model_avg_cost: usd(a.cost) / Decimal::from(a.n as i64),
                suggested_model: (*best).clone(),
                estimated_savings: usd(num) / Decimal::from(a.n as i64),
            },
            num,
            a.n,
        ));
    }
    rows.sort_by(|(ra, na, da), (rb, nb, db)| {
        (nb * da)
            .cmp(&(na * db))
            .then(ra.repo_url.cmp(&rb.repo_url))
            .then(ra.current_model.cmp(&rb.current_model))
    });
    rows.into_iter().take(10).map(|(r, _, _)| r).collect()
}

/// Top tasks: the 10 costliest, newest first among equals.
fn reference_top_tasks(costed: &[(&TaskFact, i128)]) -> Vec<TopTask> {
    let mut top = costed.to_vec();
    top.sort_by(|(ta, ca), (tb, cb)| {
        cb.cmp(ca)
            .then(tb.created_at.cmp(&ta.created_at))
            .then(ta.id.cmp(&tb.id))
    });
    top.iter()
        .take(10)
        .map(|(t, _)| TopTask {
            task: costed_task(t),
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
        })
        .collect()
}

fn reference(case: &Case) -> CostReport {
    let today = case.today;
    let days = i64::from(case.days);
    let start = add_days(today, -(days - 1));
    let prev_start = add_days(start, -days);
    let month_start = Date::from_calendar_date(today.year(), today.month(), 1).unwrap();
    let mut remaining: u32 = 0;
    let mut d = today;
    while let Some(next) = d.next_day() {
        if next.month() != today.month() {
            break;
        }
        remaining += 1;
        d = next;
    }

    let selected = |t: &TaskFact| case.filter.as_deref().is_none_or(|f| t.repo_url == f);
    let in_period = |t: &TaskFact| start <= utc_day(t) && utc_day(t) <= today;
    let period: Vec<&TaskFact> = case
        .tasks
        .iter()
        .filter(|t| selected(t) && in_period(t))
        .collect();
    let costed: Vec<(&TaskFact, i128)> = period
        .iter()
        .filter_map(|t| nanos(t).map(|c| (*t, c)))
        .collect();

    // Summary and forecast.
    let total: i128 = costed.iter().map(|(_, c)| c).sum();
    // The cost of the selected tasks created from `first` up to (not including) `end`.
    let cost_between = |first: Date, end: Date| -> i128 {
        let between = |t: &&TaskFact| first <= utc_day(t) && utc_day(t) < end;
        case.tasks
            .iter()
            .filter(|t| selected(t))
            .filter(between)
            .filter_map(nanos)
            .sum()
    };
    let prev = cost_between(prev_start, start);
    let month = cost_between(month_start, add_days(today, 1));
    let month_imported: i128 = case
        .tasks
        .iter()
        .filter(|t| selected(t) && t.imported)
        .filter(|t| month_start <= utc_day(t) && utc_day(t) <= today)
        .filter_map(nanos)
        .sum();
    let n_costed = costed.len() as i128;
    let summary = Summary {
        total_cost: fixed(round_half_away(total, NANOS_PER_4DP), 4),
        task_count: period.len() as i64,
        tasks_with_cost: costed.len() as i64,
        avg_cost: if n_costed == 0 {
            "0.0000".to_owned()
        } else {
            fixed(round_half_away(total, n_costed * NANOS_PER_4DP), 4)
        },
        cost_trend: if prev == 0 {
            "0.0".to_owned()
        } else {
            fixed(round_half_away((total - prev) * 1000, prev), 1)
        },
        prev_period_cost: fixed(round_half_away(prev, NANOS_PER_4DP), 4),
        days: case.days,
    };
    let d128 = i128::from(days);
    let forecast = Forecast {
        daily_avg_cost: fixed(round_half_away(total, d128 * NANOS_PER_4DP), 4),
        month_cost_so_far: fixed(round_half_away(month, NANOS_PER_4DP), 4),
        month_imported_cost_so_far: fixed(round_half_away(month_imported, NANOS_PER_4DP), 4),
        forecasted_month_total: fixed(
            round_half_away(
                month * d128 + total * i128::from(remaining),
                d128 * NANOS_PER_4DP,
            ),
            4,
        ),
        days_remaining: remaining,
    };

    let daily_costs = (0..days)
        .map(|i| {
            let date = add_days(start, i);
            let of_day: Vec<i128> = costed
                .iter()
                .filter(|(t, _)| utc_day(t) == date)
                .map(|(_, c)| *c)
                .collect();
            DailyCost {
                date,
                cost: usd(of_day.iter().sum()),
                task_count: of_day.len() as i64,
            }
        })
        .collect();

    // Charts.
    let mut by_repo: BTreeMap<String, Sum> = BTreeMap::new();
    let mut by_type: BTreeMap<String, Sum> = BTreeMap::new();
    let mut by_model: BTreeMap<String, Sum> = BTreeMap::new();
    for (t, c) in &costed {
        by_repo.entry(t.repo_url.clone()).or_default().push(t, *c);
        by_type
            .entry(t.task_type.to_string())
            .or_default()
            .push(t, *c);
        let model = t.model_used.clone().unwrap_or_else(|| "unknown".to_owned());
        by_model.entry(model).or_default().push(t, *c);
    }
    let cost_by_repo = chart_rows(&by_repo, |repo_url, cost, _| RepoCost { repo_url, cost });
    let cost_by_type = chart_rows(&by_type, |name, cost, _| TypeCost {
        task_type: name.parse().unwrap(),
        cost,
    });
    let cost_by_model = chart_rows(&by_model, |model, cost, s| ModelCost {
        model,
        cost,
        success_rate: Decimal::from_i128_with_scale(round_half_away(s.ok * 1000, s.n), 1),
        avg_cost: usd(s.cost) / Decimal::from(s.n as i64),
        total_input_tokens: s.input,
        total_output_tokens: s.output,
    });

    // Anomalies: leave-one-out average of the repository's other costed tasks.
    let anomalies = reference_anomalies(&costed, &by_repo);

    // Model suggestions.
    let model_suggestions = reference_suggestions(case, &costed, in_period);

    // Top tasks.
    let top_tasks = reference_top_tasks(&costed);

    let outcomes = reference_outcomes(case, total);

    CostReport {
        summary,
        forecast,
        daily_costs,
        cost_by_repo,
        cost_by_type,
        cost_by_model,
        anomalies,
        model_suggestions,
        top_tasks,
        outcomes,
        budgets: Vec::new(),
    }
}

/// Outcome sums of a group of units, in nano-dollars.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    merged: i64,
    costed: i64,
    cost: i128,
    merged_cost: i128,
    failed_cost: i128,
    merged_revisions: i64,
    revision_cost: i128,
}

/// A costed task as the report lists it.
fn costed_task(t: &TaskFact) -> CostedTask {
    CostedTask {
        id: t.id,
        title: t.title.clone(),
        repo_url: t.repo_url.clone(),
        task_type: t.task_type,
        state: t.state,
        cost_usd: t.cost.unwrap(),
        model_used: t.model_used.clone(),
        created_at: t.created_at.to_offset(UtcOffset::UTC),
    }
}

/// The figures of a group, with the failed share of `total` nano-dollars.
fn figures(o: &Outcome, total: i128) -> OutcomeFigures {
    let money = |n: i128| fixed(round_half_away(n, NANOS_PER_4DP), 4);
    OutcomeFigures {
        merged_pull_requests: o.merged,
        cost_per_merged_pull_request: (o.merged > 0).then(|| {
            fixed(
                round_half_away(o.merged_cost, i128::from(o.merged) * NANOS_PER_4DP),
                4,
            )
        }),
        merged_cost: money(o.merged_cost),
        failed_cost: money(o.failed_cost),
        failed_share: if total == 0 {
            Decimal::ZERO
        } else {
            Decimal::from_i128_with_scale(round_half_away(o.failed_cost * 1000, total), 1)
        },
        revision_cost: money(o.revision_cost),
        avg_revisions_per_merged_pull_request: (o.merged > 0).then(|| {
            Decimal::from_i128_with_scale(
                round_half_away(i128::from(o.merged_revisions) * 100, i128::from(o.merged)),
                2,
            )
        }),
    }
}

/// The `outcomes` member straight from the task list: each task goes to the unit of its
/// coding parent when it is a review whose parent is a coding task of the list, else to its
/// own; the unit's head decides the day, repository, model and outcome.
fn reference_outcomes(case: &Case, total: i128) -> Outcomes {
    let today = case.today;
    let start = add_days(today, -(i64::from(case.days) - 1));
    let mut by_repo: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut by_model: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut all = Outcome::default();
    for t in &case.tasks {
        let head = case
            .tasks
            .iter()
            .find(|p| {
                t.task_type == TaskType::Review
                    && Some(p.id) == t.parent_task_id
                    && p.task_type == TaskType::Coding
            })
            .unwrap_or(t);
        let day = utc_day(head);
        if day < start || day > today {
            continue;
        }
        if case.filter.as_deref().is_some_and(|f| f != head.repo_url) {
            continue;
        }
        let merged = head.task_type == TaskType::Coding && head.state == TaskState::Completed;
        let failed = matches!(head.state, TaskState::Failed | TaskState::Cancelled);
        let cost = nanos(t).unwrap_or(0);
        let model = head
            .model_used
            .clone()
            .unwrap_or_else(|| "unknown".to_owned());
        for o in [
            &mut all,
            by_repo.entry(head.repo_url.clone()).or_default(),
            by_model.entry(model).or_default(),
        ] {
            if merged && t.id == head.id {
                o.merged += 1;
                o.merged_revisions += i64::from(t.revisions);
            }
            o.revision_cost += i128::from(t.revision_cost.to_nanos());
            if t.cost.is_some() {
                o.costed += 1;
            }
            o.cost += cost;
            if merged {
                o.merged_cost += cost;
            }
            if failed {
                o.failed_cost += cost;
            }
        }
    }
    let rows = |groups: BTreeMap<String, Outcome>| {
        let mut rows: Vec<(String, Outcome)> = groups.into_iter().collect();
        rows.retain(|(_, o)| o.merged > 0 || o.costed > 0);
        rows.sort_by_key(|(key, o)| (Reverse(o.cost), Reverse(o.merged), key.clone()));
        rows.into_iter().map(|(key, o)| (key, figures(&o, o.cost)))
    };
    Outcomes {
        figures: figures(&all, total),
        by_repo: rows(by_repo)
            .map(|(repo_url, figures)| RepoOutcome { repo_url, figures })
            .collect(),
        by_model: rows(by_model)
            .map(|(model, figures)| ModelOutcome { model, figures })
            .collect(),
    }
}

fn assert_same(got: &CostReport, expected: &CostReport, what: &str) {
    assert_eq!(got.summary, expected.summary, "{what}: summary");
    assert_eq!(got.forecast, expected.forecast, "{what}: forecast");
    assert_eq!(got.daily_costs, expected.daily_costs, "{what}: dailyCosts");
    assert_eq!(
        got.cost_by_repo, expected.cost_by_repo,
        "{what}: costByRepo"
    );
    assert_eq!(
        got.cost_by_type, expected.cost_by_type,
        "{what}: costByType"
    );
    assert_eq!(
        got.cost_by_model, expected.cost_by_model,
        "{what}: costByModel"
    );
    assert_eq!(got.anomalies, expected.anomalies, "{what}: anomalies");
    assert_eq!(
        got.model_suggestions, expected.model_suggestions,
        "{what}: modelSuggestions"
    );
    assert_eq!(got.top_tasks, expected.top_tasks, "{what}: topTasks");
    assert_eq!(got.outcomes, expected.outcomes, "{what}: outcomes");
    // Same wire form too (and it serialises).
    assert_eq!(
        serde_json::to_value(got).unwrap(),
        serde_json::to_value(expected).unwrap(),
        "{what}: JSON"
    );
}

/// Inputs with one entry per task in every list (repeated keys), plus daily entries outside
/// the period: the report must merge them to the same result.
fn per_task_inputs(case: &Case, window: Window) -> ReportInputs {
    let selected = |t: &&TaskFact| case.filter.as_deref().is_none_or(|f| t.repo_url == f);
    let mut inputs = ReportInputs {
        window,
        daily: Vec::new(),
        previous: Totals::default(),
        month_to_date: Totals::default(),
        by_repo: Vec::new(),
        by_type: Vec::new(),
        by_model: Vec::new(),
        coding_by_repo_model: Vec::new(),
        coding_by_model_all_repos: Vec::new(),
        anomaly_candidates: Vec::new(),
        top_candidates: Vec::new(),
        // One entry per task (repeated keys): the report must merge them.
        outcomes: ReportInputs::from_tasks(window, case.filter.as_deref(), &case.tasks)
            .outcomes
            .into_iter()
            .flat_map(|(repo, model, t)| {
                let half = OutcomeTotals {
                    merged: t.merged / 2,
                    costed: t.costed / 2,
                    cost: t.cost / Decimal::TWO,
                    merged_cost: t.merged_cost / Decimal::TWO,
                    failed_cost: t.failed_cost / Decimal::TWO,
                    merged_revisions: t.merged_revisions / 2,
                    revision_cost: t.revision_cost / Decimal::TWO,
                };
                let rest = OutcomeTotals {
                    merged: t.merged - half.merged,
                    costed: t.costed - half.costed,
                    cost: t.cost - half.cost,
                    merged_cost: t.merged_cost - half.merged_cost,
                    failed_cost: t.failed_cost - half.failed_cost,
                    merged_revisions: t.merged_revisions - half.merged_revisions,
                    revision_cost: t.revision_cost - half.revision_cost,
                };
                [(repo.clone(), model.clone(), half), (repo, model, rest)]
            })
            .collect(),
        budgets: Vec::new(),
    };
    for t in &case.tasks {
        let day = utc_day(t);
        let in_period = window.start() <= day && day <= window.today();
        let coding_model = t
            .model_used
            .clone()
            .filter(|_| t.task_type == TaskType::Coding);
        if in_period && let Some(model) = &coding_model {
            inputs
                .coding_by_model_all_repos
                .push((model.clone(), Totals::of(t)));
        }
        if !selected(&t) {
            continue;
        }
        // Every day, in the period or not: entries outside it must be ignored.
        inputs.daily.push((day, Totals::of(t)));
        if window.previous_start() <= day && day < window.start() {
            inputs.previous.add(&Totals::of(t));
        }
        if window.month_start() <= day && day <= window.today() {
            inputs.month_to_date.add(&Totals::of(t));
        }
        if !in_period {
            continue;
        }
        inputs.by_repo.push((t.repo_url.clone(), Totals::of(t)));
        inputs.by_type.push((t.task_type, Totals::of(t)));
        inputs.by_model.push((t.model_used.clone(), Totals::of(t)));
        if let Some(model) = coding_model {
            inputs
                .coding_by_repo_model
                .push((t.repo_url.clone(), model, Totals::of(t)));
        }
    }
    inputs
}

#[test]
fn report_matches_the_reference_on_random_data() {
    let mut with = BTreeMap::<&str, u32>::new();
    for seed in 0..CASES {
        let case = generate(seed);
        let what = format!(
            "seed {seed} (today {}, days {}, filter {:?}, {} tasks)",
            case.today,
            case.days,
            case.filter,
            case.tasks.len()
        );
        let window = Window::new(case.today, case.days).unwrap();
        let inputs = ReportInputs::from_tasks(window, case.filter.as_deref(), &case.tasks);
        let got = report(&inputs);
        let expected = reference(&case);
        assert_same(&got, &expected, &what);
        for (name, present) in [
            ("anomalies", !got.anomalies.is_empty()),
            ("suggestions", !got.model_suggestions.is_empty()),
            ("20 anomalies", got.anomalies.len() == 20),
            ("10 top tasks", got.top_tasks.len() == 10),
            ("costed", got.summary.tasks_with_cost > 0),
            ("negative trend", got.summary.cost_trend.starts_with('-')),
            ("merged", got.outcomes.figures.merged_pull_requests > 0),
            (
                "failed spend",
                got.outcomes.figures.failed_share > Decimal::ZERO,
            ),
            (
                "merged with reviews",
                case.tasks.iter().any(|r| {
                    r.parent_task_id.is_some_and(|p| {
                        case.tasks.iter().any(|c| {
                            c.id == p
                                && c.task_type == TaskType::Coding
                                && c.state == TaskState::Completed
                                && r.cost.is_some_and(|x| x != Usd::ZERO)
                        })
                    })
                }),
            ),
        ] {
            *with.entry(name).or_default() += u32::from(present);
        }

        let mut rng = SplitMix64::new(seed ^ 0xA5A5_A5A5);
        let selected = |t: &&TaskFact| case.filter.as_deref().is_none_or(|f| t.repo_url == f);

        // Supersets: out-of-period, uncosted and duplicated candidates (and, for anomalies,
        // other repositories' tasks), in any order.
        let mut padded = inputs.clone();
        padded.anomaly_candidates = case
            .tasks
            .iter()
            .chain(&inputs.anomaly_candidates)
            .cloned()
            .collect();
        rng.shuffle(&mut padded.anomaly_candidates);
        padded.top_candidates = case
            .tasks
            .iter()
            .filter(selected)
            .chain(&inputs.top_candidates)
            .cloned()
            .collect();
        rng.shuffle(&mut padded.top_candidates);
        assert_same(&report(&padded), &expected, &format!("{what}, padded"));

        // What storage passes: anomaly candidates at or above their repository's threshold,
        // and a few more than the 10 costliest tasks.
        let mut fetched = inputs.clone();
        let repo_totals: BTreeMap<&str, &Totals> = inputs
            .by_repo
            .iter()
            .map(|(repo, t)| (repo.as_str(), t))
            .collect();
        fetched.anomaly_candidates.retain(|t| {
            let totals = repo_totals[t.repo_url.as_str()];
            let sum = Usd::from_decimal(totals.cost).unwrap().to_nanos();
            anomaly_threshold_nanos(totals.costed, sum)
                .is_some_and(|threshold| t.cost.unwrap().to_nanos() >= threshold)
        });
        assert!(fetched.anomaly_candidates.len() >= got.anomalies.len());
        fetched
            .top_candidates
            .sort_by(|a, b| b.cost.cmp(&a.cost).then(b.created_at.cmp(&a.created_at)));
        fetched.top_candidates.truncate(10 + rng.below(5) as usize);
        rng.shuffle(&mut fetched.top_candidates);
        assert_same(&report(&fetched), &expected, &format!("{what}, fetched"));

        // Repeated keys and out-of-period daily entries.
        let mut split = per_task_inputs(&case, window);
        split.anomaly_candidates = inputs.anomaly_candidates.clone();
        split.top_candidates = inputs.top_candidates.clone();
        assert_same(&report(&split), &expected, &format!("{what}, per task"));
    }
    // The random data must exercise every rule.
    for name in [
        "anomalies",
        "suggestions",
        "20 anomalies",
        "10 top tasks",
        "costed",
        "negative trend",
        "merged",
        "failed spend",
        "merged with reviews",
    ] {
        let n = with.get(name).copied().unwrap_or(0);
        assert!(
            u64::from(n) >= CASES / 40,
            "only {n} of {CASES} cases have {name}: {with:?}"
        );
    }
}

#[test]
fn the_reference_rounds_like_the_spec() {
    assert_eq!(fixed(round_half_away(125_000, 10_000), 1), "1.3");
    assert_eq!(fixed(round_half_away(-125_000, 10_000), 1), "-1.3");
    assert_eq!(fixed(round_half_away(-4, 10), 1), "0.0");
    assert_eq!(fixed(round_half_away(1, 3), 4), "0.0000");
    assert_eq!(fixed(125_000, 4), "12.5000");
    assert_eq!(fixed(-333, 1), "-33.3");
}
