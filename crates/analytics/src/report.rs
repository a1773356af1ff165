//! The cost report (docs/contract.md#4-cost-report): [`report`] and the [`CostReport`] it returns.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::ops::AddAssign;

use agentry_domain::{TaskState, TaskType, Usd, format_decimal};
use rust_decimal::Decimal;
use serde::Serialize;
use time::{Date, OffsetDateTime, UtcOffset};
use uuid::Uuid;

use crate::exact::{cmp_fractions, cmp_products, count, div_round, mul, quotient};
use crate::inputs::{OutcomeTotals, ReportInputs, TaskFact, Totals};
use crate::wire;

/// The most anomalies a report lists.
const MAX_ANOMALIES: usize = 20;
/// The most model suggestions a report lists.
const MAX_SUGGESTIONS: usize = 10;
/// The most top tasks a report lists.
const MAX_TOP_TASKS: usize = 10;
/// A repository needs this many costed tasks in the period to have anomalies.
const MIN_ANOMALY_REPO_TASKS: i64 = 3;
/// A task costing at least this many times the average of the others is an anomaly.
const ANOMALY_FACTOR: i64 = 3;
/// A (repository, model) needs this many costed coding tasks to get a suggestion.
const MIN_SUGGESTION_CURRENT_TASKS: i64 = 3;
/// A suggested model needs this many costed coding tasks over all repositories.
const MIN_SUGGESTION_CANDIDATE_TASKS: i64 = 5;
/// The `model` of tasks whose model is unknown.
const UNKNOWN_MODEL: &str = "unknown";

/// The cost report of docs/contract.md#4-cost-report: exactly the members listed in
/// docs/contract.md#42-members.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CostReport {
    /// The summary cards.
    pub summary: Summary,
    /// The month forecast.
    pub forecast: Forecast,
    /// One entry per day of the period, oldest first, zero-filled.
    pub daily_costs: Vec<DailyCost>,
    /// Costs per repository, highest first.
    pub cost_by_repo: Vec<RepoCost>,
    /// Costs per task type, highest first.
    pub cost_by_type: Vec<TypeCost>,
    /// Costs per model, highest first.
    pub cost_by_model: Vec<ModelCost>,
    /// Tasks costing at least three times the average of their repository's other tasks.
    pub anomalies: Vec<Anomaly>,
    /// Cheaper models with proven results, per repository and current model.
    pub model_suggestions: Vec<ModelSuggestion>,
    /// The ten costliest tasks of the period.
    pub top_tasks: Vec<TopTask>,
    /// Cost per outcome: merged pull requests, their cost, and the money spent on work
    /// that ended failed or cancelled.
    pub outcomes: Outcomes,
    /// Each monthly budget that is set, for the current UTC month whatever the period.
    pub budgets: Vec<crate::budgets::BudgetForecast>,
}

/// Cost per outcome over the period (docs/contract.md#42-members, docs/analytics.md).
///
/// An outcome unit is a coding task with its review subtasks; it belongs to the creation
/// day, repository and model of its coding task and ends as that task does. Money strings
/// have exactly 4 decimals, rounded half away from zero once from the exact value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Outcomes {
    /// The figures of all the units of the period; `failedShare` is a percent of
    /// `summary.totalCost`.
    #[serde(flatten)]
    pub figures: OutcomeFigures,
    /// The same figures per repository, highest spend first.
    pub by_repo: Vec<RepoOutcome>,
    /// The same figures per model of the coding task (`"unknown"` when null), highest spend
    /// first.
    pub by_model: Vec<ModelOutcome>,
}

/// The figures of a group of outcome units: the whole period (`failedShare` a percent of
/// `summary.totalCost`), one repository or one model (a percent of the group's spend on its
/// units).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct OutcomeFigures {
    /// Pull requests merged: coding tasks of the period in `completed`.
    pub merged_pull_requests: i64,
    /// `mergedCost / mergedPullRequests`; null when nothing was merged.
    pub cost_per_merged_pull_request: Option<String>,
    /// Everything the merged units cost: every run of their coding tasks (retries and
    /// failed attempts included) and of their review subtasks.
    pub merged_cost: String,
    /// Everything the units that ended `failed` or `cancelled` cost.
    pub failed_cost: String,
    /// `failedCost` as a percent of the group's spend (of `summary.totalCost` for the whole
    /// period), 1 decimal (a JSON number); 0 when nothing was spent.
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub failed_share: Decimal,
    /// What the revision runs of the units cost (runs answering review feedback on their
    /// pull requests, docs/contract.md#57-revisions), whatever the units' outcome. Part of
    /// `mergedCost`, `failedCost` and the open units' spend, not in addition to them.
    pub revision_cost: String,
    /// The revision rounds of the merged units divided by `mergedPullRequests`, 2 decimals
    /// (a JSON number); null when nothing was merged.
    #[serde(serialize_with = "wire::opt")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub avg_revisions_per_merged_pull_request: Option<Decimal>,
}

/// Cost per outcome of one repository. `failedShare` is a percent of the repository's
/// spend on the units of the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RepoOutcome {
    /// The normalised repository URL.
    pub repo_url: String,
    /// The repository's figures.
    #[serde(flatten)]
    pub figures: OutcomeFigures,
}

/// Cost per outcome of one model (the model of the units' coding tasks). `failedShare` is a
/// percent of the spend on the units of that model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelOutcome {
    /// The coding task's model, or `"unknown"`.
    pub model: String,
    /// The model's figures.
    #[serde(flatten)]
    pub figures: OutcomeFigures,
}

/// The summary cards. Money is a decimal string with exactly 4 decimals, rounded half away
/// from zero once from the exact value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Sum of the costs of the costed tasks of the period.
    pub total_cost: String,
    /// All tasks created in the period, costed or not.
    pub task_count: i64,
    /// Costed tasks of the period.
    pub tasks_with_cost: i64,
    /// `totalCost / tasksWithCost`; `"0.0000"` when no task is costed.
    pub avg_cost: String,
    /// `(total − prev) / prev × 100` with 1 decimal (`"25.0"`, `"-33.3"`); `"0.0"` when the
    /// previous period cost nothing.
    pub cost_trend: String,
    /// The same sum as `totalCost` over the previous period.
    pub prev_period_cost: String,
    /// The number of days of the period.
    pub days: u32,
}

/// The month forecast. Money is a decimal string with exactly 4 decimals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Forecast {
    /// `totalCost / days` (idle days count as zero).
    pub daily_avg_cost: String,
    /// Costs of the tasks created in the current UTC month (repository filter applies, `days`
    /// does not).
    pub month_cost_so_far: String,
    /// The part of `monthCostSoFar` that is imported history (tasks of `agentry import`,
    /// docs/contract.md#39-import), which no budget counts.
    pub month_imported_cost_so_far: String,
    /// `monthCostSoFar + (totalCost / days) × daysRemaining`, from the exact quotient, rounded
    /// once.
    pub forecasted_month_total: String,
    /// Days of the current UTC month after today (0 on its last day).
    pub days_remaining: u32,
}

/// One day of the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DailyCost {
    /// The UTC day, `YYYY-MM-DD` on the wire.
    #[serde(serialize_with = "wire::date")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = Date))]
    pub date: Date,
    /// Sum of the costs of the day's costed tasks (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub cost: Decimal,
    /// The day's costed tasks.
    pub task_count: i64,
}

/// The costs of a chart entry in the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChartCost {
    /// Sum of the costs of its costed tasks (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub total_cost: Decimal,
    /// Its costed tasks.
    pub task_count: i64,
}

impl ChartCost {
    /// The costs summed in `t`.
    fn of(t: &Totals) -> ChartCost {
        ChartCost {
            total_cost: t.cost,
            task_count: t.costed,
        }
    }
}

/// Costs of one repository in the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RepoCost {
    /// The normalised repository URL.
    pub repo_url: String,
    /// Its costs.
    #[serde(flatten)]
    pub cost: ChartCost,
}

/// Costs of one task type in the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TypeCost {
    /// `coding` or `review`.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "coding"))]
    pub task_type: TaskType,
    /// Its costs.
    #[serde(flatten)]
    pub cost: ChartCost,
}

/// Costs of one model in the period (all task types).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelCost {
    /// The model as stored, or `"unknown"`.
    pub model: String,
    /// Its costs.
    #[serde(flatten)]
    pub cost: ChartCost,
    /// Percent of its costed tasks in `pr_opened` or `completed`, rounded half away from
    /// zero to 1 decimal (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub success_rate: Decimal,
    /// `totalCost / taskCount` (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub avg_cost: Decimal,
    /// Input tokens of its costed tasks.
    pub total_input_tokens: i64,
    /// Output tokens of its costed tasks.
    pub total_output_tokens: i64,
}

/// A costed task of the period as the report lists it (in anomalies and the costliest
/// tasks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CostedTask {
    /// The task's id.
    pub id: Uuid,
    /// The task's title.
    pub title: String,
    /// The task's repository.
    pub repo_url: String,
    /// The task's type.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "coding"))]
    pub task_type: TaskType,
    /// The task's state.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "completed"))]
    pub state: TaskState,
    /// The task's exact cost, a plain decimal string.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "0.123456"))]
    pub cost_usd: Usd,
    /// The model used, or null.
    pub model_used: Option<String>,
    /// When the task was created, RFC 3339 UTC.
    #[serde(with = "time::serde::rfc3339")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: OffsetDateTime,
}

impl CostedTask {
    /// `task` with its exact `cost`.
    fn of(task: &TaskFact, cost: Usd) -> CostedTask {
        CostedTask {
            id: task.id,
            title: task.title.clone(),
            repo_url: task.repo_url.clone(),
            task_type: task.task_type,
            state: task.state,
            cost_usd: cost,
            model_used: task.model_used.clone(),
            created_at: utc(task.created_at),
        }
    }
}

/// A task costing at least three times the average of the other costed tasks of its
/// repository in the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Anomaly {
    /// The task.
    #[serde(flatten)]
    pub task: CostedTask,
    /// The leave-one-out average: the average cost of the repository's other costed tasks
    /// in the period (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub repo_avg_cost: Decimal,
    /// `costUsd / repoAvgCost` (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub cost_ratio: Decimal,
}

/// A cheaper model with proven results for a repository's current coding model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelSuggestion {
    /// The repository.
    pub repo_url: String,
    /// The model its coding tasks use.
    pub current_model: String,
    /// The costed coding tasks of this repository and model in the period.
    pub task_count: i64,
    /// Their average cost (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub avg_cost: Decimal,
    /// The suggested model's average cost over the coding tasks of all repositories (a JSON
    /// number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub cheaper_model_avg_cost: Decimal,
    /// The suggested model.
    pub suggested_model: String,
    /// `taskCount × (avgCost − cheaperModelAvgCost)` (a JSON number).
    #[serde(serialize_with = "wire::number")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub estimated_savings: Decimal,
}

/// One of the costliest tasks of the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TopTask {
    /// The task.
    #[serde(flatten)]
    pub task: CostedTask,
    /// The task's input tokens.
    pub input_tokens: i64,
    /// The task's output tokens.
    pub output_tokens: i64,
}

/// Computes the cost report (docs/contract.md#4-cost-report) from its inputs.
///
/// Pure and total: it never panics, whatever the inputs (sums saturate, divisions by zero
/// are avoided by the rules themselves).
///
/// Interpretations where docs/contract.md#4-cost-report leaves room:
///
/// - The summary is computed from `daily` (entries outside the period are ignored);
///   `costByRepo`, `costByType` and `costByModel` from `by_repo`, `by_type` and `by_model`.
///   Repeated keys in any list of the inputs are added together.
/// - Rounding: every string figure (summary, forecast) and `successRate` is the exact
///   rational value rounded half away from zero exactly once (no intermediate 28-digit
///   quotient is rounded again). The other array quotients (`avgCost`, `repoAvgCost`,
///   `costRatio`, `cheaperModelAvgCost`, `estimatedSavings`) are the exact rational values
///   (`costRatio = c·(n−1)/(S−c)`, `estimatedSavings = (cost·m − n·cost_m)/m`) divided once
///   to [`Decimal`]'s 28 significant digits before the conversion to a JSON number. Every
///   ordering and threshold compares the exact rationals, never rounded quotients or floats.
/// - `costByModel` groups by the displayed name: a model literally named `unknown` shares the
///   row of the unknown model (`None`).
/// - A model-suggestion candidate needs ≥ 5 *costed* coding tasks with that model in the
///   period over all repositories; every success rate of the report (current model,
///   candidates, `successRate`) is over costed tasks, because [`Totals::succeeded`] counts
///   costed tasks only.
/// - Anomaly and top-task candidates are deduplicated by id (the first entry that is a
///   costed task of the period wins); anomaly candidates of a repository without a `by_repo`
///   entry are ignored.
pub fn report(inputs: &ReportInputs) -> CostReport {
    let window = inputs.window;
    let mut daily: BTreeMap<Date, Totals> = BTreeMap::new();
    for (day, totals) in &inputs.daily {
        if window.contains(*day) {
            *daily.entry(*day).or_default() += totals;
        }
    }
    let period: Totals = daily.values().sum();

    CostReport {
        summary: summary(&period, &inputs.previous, window.days()),
        forecast: forecast(
            &period,
            &inputs.month_to_date,
            window.days(),
            window.days_remaining_in_month(),
        ),
        daily_costs: window
            .period_days()
            .map(|date| {
                let totals = daily.get(&date).copied().unwrap_or_default();
                DailyCost {
                    date,
                    cost: totals.cost,
                    task_count: totals.costed,
                }
            })
            .collect(),
        cost_by_repo: groups(inputs.by_repo.iter().map(|(repo, t)| (repo.clone(), *t)))
            .into_iter()
            .map(|(repo_url, t)| RepoCost {
                repo_url,
                cost: ChartCost::of(&t),
            })
            .collect(),
        // Keyed by (wire name, type) so that ties order by the name.
        cost_by_type: groups(
            inputs
                .by_type
                .iter()
                .map(|(ty, t)| ((ty.as_str(), *ty), *t)),
        )
        .into_iter()
        .map(|((_, task_type), t)| TypeCost {
            task_type,
            cost: ChartCost::of(&t),
        })
        .collect(),
        cost_by_model: groups(
            inputs
                .by_model
                .iter()
                .map(|(model, t)| (model.as_deref().unwrap_or(UNKNOWN_MODEL), *t)),
        )
        .into_iter()
        .map(|(model, t)| ModelCost {
            model: model.to_owned(),
            cost: ChartCost::of(&t),
            success_rate: div_round(
                mul(count(t.succeeded), Decimal::ONE_HUNDRED),
                count(t.costed),
                1,
            ),
            avg_cost: quotient(t.cost, count(t.costed)),
            total_input_tokens: t.input_tokens,
            total_output_tokens: t.output_tokens,
        })
        .collect(),
        anomalies: anomalies(inputs),
        model_suggestions: model_suggestions(inputs),
        top_tasks: top_tasks(inputs),
        outcomes: outcomes(inputs, period.cost),
        budgets: inputs
            .budgets
            .iter()
            .map(|b| crate::budgets::forecast(b, window.today()))
            .collect(),
    }
}

impl OutcomeFigures {
    /// The figures of the units summed in `t`, `failedShare` a percent of `total`.
    fn of(t: &OutcomeTotals, total: Decimal) -> OutcomeFigures {
        OutcomeFigures {
            merged_pull_requests: t.merged,
            cost_per_merged_pull_request: (t.merged > 0)
                .then(|| format_decimal(div_round(t.merged_cost, count(t.merged), 4), 4)),
            merged_cost: format_decimal(t.merged_cost, 4),
            failed_cost: format_decimal(t.failed_cost, 4),
            failed_share: if total.is_zero() {
                Decimal::ZERO
            } else {
                div_round(mul(t.failed_cost, Decimal::ONE_HUNDRED), total, 1)
            },
            revision_cost: format_decimal(t.revision_cost, 4),
            avg_revisions_per_merged_pull_request: (t.merged > 0)
                .then(|| div_round(count(t.merged_revisions), count(t.merged), 2)),
        }
    }
}

/// The `outcomes` member; `total_cost` is the summary's `totalCost` (exact).
fn outcomes(inputs: &ReportInputs, total_cost: Decimal) -> Outcomes {
    let mut all = OutcomeTotals::default();
    for (_, _, t) in &inputs.outcomes {
        all += *t;
    }
    let group = |(key, t): (&str, OutcomeTotals)| (key.to_owned(), OutcomeFigures::of(&t, t.cost));
    let by_repo = groups(inputs.outcomes.iter().map(|(r, _, t)| (r.as_str(), *t)))
        .into_iter()
        .map(group)
        .map(|(repo_url, figures)| RepoOutcome { repo_url, figures })
        .collect();
    let by_model = groups(
        inputs
            .outcomes
            .iter()
            .map(|(_, m, t)| (m.as_deref().unwrap_or(UNKNOWN_MODEL), *t)),
    )
    .into_iter()
    .map(group)
    .map(|(model, figures)| ModelOutcome { model, figures })
    .collect();
    Outcomes {
        figures: OutcomeFigures::of(&all, total_cost),
        by_repo,
        by_model,
    }
}

/// The summary cards from the period's and the previous period's totals.
fn summary(period: &Totals, previous: &Totals, days: u32) -> Summary {
    let total = period.cost;
    let prev = previous.cost;
    let avg = if period.costed > 0 {
        div_round(total, count(period.costed), 4)
    } else {
        Decimal::ZERO
    };
    let trend = if prev.is_zero() {
        Decimal::ZERO
    } else {
        div_round(
            mul(total.saturating_sub(prev), Decimal::ONE_HUNDRED),
            prev,
            1,
        )
    };
    Summary {
        total_cost: format_decimal(total, 4),
        task_count: period.tasks,
        tasks_with_cost: period.costed,
        avg_cost: format_decimal(avg, 4),
        cost_trend: format_decimal(trend, 1),
        prev_period_cost: format_decimal(prev, 4),
        days,
    }
}

/// The month forecast.
fn forecast(period: &Totals, month: &Totals, days: u32, days_remaining: u32) -> Forecast {
    let days_d = Decimal::from(days);
    // monthCostSoFar + total / days × remaining = (month × days + total × remaining) / days.
    let forecast_numerator =
        mul(month.cost, days_d).saturating_add(mul(period.cost, Decimal::from(days_remaining)));
    Forecast {
        daily_avg_cost: format_decimal(div_round(period.cost, days_d, 4), 4),
        month_cost_so_far: format_decimal(month.cost, 4),
        month_imported_cost_so_far: format_decimal(month.imported_cost, 4),
        forecasted_month_total: format_decimal(div_round(forecast_numerator, days_d, 4), 4),
        days_remaining,
    }
}

/// Sums of tasks grouped for a chart ([`Totals`]) or an outcome table ([`OutcomeTotals`]).
trait Group: Default + AddAssign {
    /// The group's order (greatest first), or `None` when it is not listed: its exact cost,
    /// then its costed tasks (a chart entry with some) or merged pull requests (an outcome
    /// group with a merged pull request or a costed task).
    fn order(&self) -> Option<(Decimal, i64)>;
}

impl Group for Totals {
    fn order(&self) -> Option<(Decimal, i64)> {
        (self.costed > 0).then_some((self.cost, self.costed))
    }
}

impl Group for OutcomeTotals {
    fn order(&self) -> Option<(Decimal, i64)> {
        (self.merged > 0 || self.costed > 0).then_some((self.cost, self.merged))
    }
}

/// Merges `(key, sums)` entries by key, keeps the listed groups and orders them by
/// [`Group::order`] desc, then key asc.
fn groups<K: Ord, T: Group>(entries: impl Iterator<Item = (K, T)>) -> Vec<(K, T)> {
    let mut groups: BTreeMap<K, T> = BTreeMap::new();
    for (key, sums) in entries {
        *groups.entry(key).or_default() += sums;
    }
    let mut rows: Vec<(K, T)> = groups
        .into_iter()
        .filter(|(_, t)| t.order().is_some())
        .collect();
    rows.sort_by(|(ka, a), (kb, b)| b.order().cmp(&a.order()).then_with(|| ka.cmp(kb)));
    rows
}

/// Whether `task` is a costed task of the period; returns its cost.
fn period_cost(inputs: &ReportInputs, task: &TaskFact) -> Option<Usd> {
    task.cost.filter(|_| inputs.window.contains(task.day()))
}

/// `created_at` in UTC.
fn utc(at: OffsetDateTime) -> OffsetDateTime {
    at.checked_to_offset(UtcOffset::UTC).unwrap_or(at)
}

/// The anomalies: costed tasks of the period costing at least 3 × the average of the other
/// costed tasks of their repository (leave-one-out, from `by_repo`).
fn anomalies(inputs: &ReportInputs) -> Vec<Anomaly> {
    let mut repos: BTreeMap<&str, Totals> = BTreeMap::new();
    for (repo, totals) in &inputs.by_repo {
        *repos.entry(repo.as_str()).or_default() += totals;
    }

    /// An anomaly with its exact figures: cost `c`, `n − 1` and `S − c`.
    struct Found<'a> {
        task: &'a TaskFact,
        cost: Usd,
        others_count: Decimal,
        others_cost: Decimal,
    }

    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for task in &inputs.anomaly_candidates {
        let Some(cost) = period_cost(inputs, task) else {
            continue;
        };
        let Some(repo) = repos.get(task.repo_url.as_str()) else {
            continue;
        };
        if repo.costed < MIN_ANOMALY_REPO_TASKS || !seen.insert(task.id) {
            continue;
        }
        let c = cost.as_decimal();
        let others_cost = repo.cost.saturating_sub(c);
        // The average of the others must be positive (n − 1 ≥ 2 > 0).
        if others_cost <= Decimal::ZERO {
            continue;
        }
        let others_count = count(repo.costed - 1);
        // c ≥ 3 × (S − c) / (n − 1)  ⇔  c × (n − 1) ≥ 3 × (S − c)
        if cmp_products(&[c, others_count], &[count(ANOMALY_FACTOR), others_cost]) == Ordering::Less
        {
            continue;
        }
        found.push(Found {
            task,
            cost,
            others_count,
            others_cost,
        });
    }

    // costRatio = c × (n − 1) / (S − c), compared exactly.
    found.sort_by(|a, b| {
        cmp_products(
            &[b.cost.as_decimal(), b.others_count, a.others_cost],
            &[a.cost.as_decimal(), a.others_count, b.others_cost],
        )
        .then_with(|| b.cost.cmp(&a.cost))
        .then_with(|| a.task.id.cmp(&b.task.id))
    });
    found.truncate(MAX_ANOMALIES);
    found
        .into_iter()
        .map(|f| Anomaly {
            task: CostedTask::of(f.task, f.cost),
            repo_avg_cost: quotient(f.others_cost, f.others_count),
            cost_ratio: quotient(mul(f.cost.as_decimal(), f.others_count), f.others_cost),
        })
        .collect()
}

/// The model suggestions (see the module docs and docs/contract.md#4-cost-report).
fn model_suggestions(inputs: &ReportInputs) -> Vec<ModelSuggestion> {
    let mut candidates: BTreeMap<&str, Totals> = BTreeMap::new();
    for (model, totals) in &inputs.coding_by_model_all_repos {
        *candidates.entry(model.as_str()).or_default() += totals;
    }
    candidates.retain(|_, t| t.costed >= MIN_SUGGESTION_CANDIDATE_TASKS);
    let mut current: BTreeMap<(&str, &str), Totals> = BTreeMap::new();
    for (repo, model, totals) in &inputs.coding_by_repo_model {
        *current.entry((repo.as_str(), model.as_str())).or_default() += totals;
    }

    /// A suggestion with the exact savings `numerator / denominator`.
    struct Found {
        row: ModelSuggestion,
        numerator: Decimal,
        denominator: Decimal,
    }

    let mut found = Vec::new();
    for ((repo, model), cur) in current {
        if cur.costed < MIN_SUGGESTION_CURRENT_TASKS {
            continue;
        }
        let n = count(cur.costed);
        let mut best: Option<(&str, &Totals)> = None;
        // Ascending names: on equal averages the first (lowest) name stays.
        for (name, cand) in &candidates {
            if *name == model {
                continue;
            }
            let m = count(cand.costed);
            // succeeded_cand / m ≥ succeeded_cur / n, exactly.
            let as_successful = i128::from(cand.succeeded) * i128::from(cur.costed)
                >= i128::from(cur.succeeded) * i128::from(cand.costed);
            // cost_cand / m < cost_cur / n, exactly.
            let cheaper = cmp_fractions(cand.cost, m, cur.cost, n) == Ordering::Less;
            if !(as_successful && cheaper) {
                continue;
            }
            let cheapest = best.is_none_or(|(_, b)| {
                cmp_fractions(cand.cost, m, b.cost, count(b.costed)) == Ordering::Less
            });
            if cheapest {
                best = Some((name, cand));
            }
        }
        let Some((suggested, cand)) = best else {
            continue;
        };
        let m = count(cand.costed);
        // n × (cost/n − cost_m/m) = (cost × m − n × cost_m) / m
        let numerator = mul(cur.cost, m).saturating_sub(mul(n, cand.cost));
        found.push(Found {
            row: ModelSuggestion {
                repo_url: repo.to_owned(),
                current_model: model.to_owned(),
                task_count: cur.costed,
                avg_cost: quotient(cur.cost, n),
                cheaper_model_avg_cost: quotient(cand.cost, m),
                suggested_model: suggested.to_owned(),
                estimated_savings: quotient(numerator, m),
            },
            numerator,
            denominator: m,
        });
    }

    found.sort_by(|a, b| {
        cmp_fractions(b.numerator, b.denominator, a.numerator, a.denominator)
            .then_with(|| a.row.repo_url.cmp(&b.row.repo_url))
            .then_with(|| a.row.current_model.cmp(&b.row.current_model))
    });
    found.truncate(MAX_SUGGESTIONS);
    found.into_iter().map(|f| f.row).collect()
}

/// The costliest costed tasks of the period: cost desc, then `createdAt` desc, then id.
fn top_tasks(inputs: &ReportInputs) -> Vec<TopTask> {
    let mut seen = HashSet::new();
    let mut tasks: Vec<(&TaskFact, Usd)> = inputs
        .top_candidates
        .iter()
        .filter_map(|task| period_cost(inputs, task).map(|cost| (task, cost)))
        .filter(|(task, _)| seen.insert(task.id))
        .collect();
    tasks.sort_by(|(a, ca), (b, cb)| {
        cb.cmp(ca)
            .then_with(|| b.created_at.cmp(&a.created_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    tasks.truncate(MAX_TOP_TASKS);
    tasks
        .into_iter()
        .map(|(task, cost)| TopTask {
            task: CostedTask::of(task, cost),
            input_tokens: task.input_tokens,
            output_tokens: task.output_tokens,
        })
        .collect()
}
