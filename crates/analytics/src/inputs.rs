//! The report's input contract: [`ReportInputs`], its [`Totals`] and [`TaskFact`]s.

use std::collections::{BTreeMap, HashMap};
use std::iter::Sum;
use std::ops::AddAssign;

use agentry_domain::{Task, TaskState, TaskType, Usd};
use rust_decimal::Decimal;
use time::{Date, OffsetDateTime, UtcOffset};
use uuid::Uuid;

use crate::window::Window;

/// Sums over a group of tasks.
///
/// `tasks` counts every task; the other members cover costed tasks only (tasks whose cost is
/// recorded; a cost of 0 counts as recorded). Sums saturate instead of overflowing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Every task of the group, costed or not.
    pub tasks: i64,
    /// The costed tasks of the group.
    pub costed: i64,
    /// The exact sum of the recorded costs, in USD.
    pub cost: Decimal,
    /// Costed tasks whose state is `pr_opened` or `completed`.
    pub succeeded: i64,
    /// Input tokens over the costed tasks.
    pub input_tokens: i64,
    /// Output tokens over the costed tasks.
    pub output_tokens: i64,
    /// The part of `cost` that is imported history ([`TaskFact::imported`]): no budget
    /// counts it.
    pub imported_cost: Decimal,
}

impl Totals {
    /// The totals of a group holding only `task`.
    pub fn of(task: &TaskFact) -> Totals {
        match task.cost {
            None => Totals {
                tasks: 1,
                ..Totals::default()
            },
            Some(cost) => Totals {
                tasks: 1,
                costed: 1,
                cost: cost.as_decimal(),
                succeeded: i64::from(task.succeeded()),
                input_tokens: task.input_tokens,
                output_tokens: task.output_tokens,
                imported_cost: if task.imported {
                    cost.as_decimal()
                } else {
                    Decimal::ZERO
                },
            },
        }
    }
}

/// `add` (member by member, saturating) and `+=` for a struct of sums; every member must be
/// listed.
macro_rules! saturating_sums {
    ($sums:ident { $($member:ident),+ $(,)? }) => {
        impl $sums {
            /// Adds `other` into `self`, member by member.
            pub fn add(&mut self, other: &$sums) {
                let $sums { $($member),+ } = other;
                $(self.$member = self.$member.saturating_add(*$member);)+
            }
        }

        impl AddAssign for $sums {
            fn add_assign(&mut self, other: $sums) {
                self.add(&other);
            }
        }
    };
}

saturating_sums!(Totals {
    tasks,
    costed,
    cost,
    succeeded,
    input_tokens,
    output_tokens,
    imported_cost,
});

impl AddAssign<&Totals> for Totals {
    fn add_assign(&mut self, other: &Totals) {
        self.add(other);
    }
}

impl Sum for Totals {
    fn sum<I: Iterator<Item = Totals>>(iter: I) -> Totals {
        iter.fold(Totals::default(), |mut acc, t| {
            acc.add(&t);
            acc
        })
    }
}

impl<'a> Sum<&'a Totals> for Totals {
    fn sum<I: Iterator<Item = &'a Totals>>(iter: I) -> Totals {
        iter.fold(Totals::default(), |mut acc, t| {
            acc.add(t);
            acc
        })
    }
}

/// One task as the report sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFact {
    /// The task's identifier.
    pub id: Uuid,
    /// The task's title.
    pub title: String,
    /// The normalised repository URL (docs/contract.md#24-repository-urls).
    pub repo_url: String,
    /// Coding or review.
    pub task_type: TaskType,
    /// The task's current state.
    pub state: TaskState,
    /// The model used, as stored (`None` when unknown).
    pub model_used: Option<String>,
    /// The exact recorded cost; `None` while no run reported one.
    pub cost: Option<Usd>,
    /// Input tokens over the task's runs.
    pub input_tokens: i64,
    /// Output tokens over the task's runs.
    pub output_tokens: i64,
    /// When the task was created.
    pub created_at: OffsetDateTime,
    /// The coding task a review task reviews (`None` for coding tasks and for review tasks
    /// without a parent).
    pub parent_task_id: Option<Uuid>,
    /// The revision rounds started on the task's pull request (docs/contract.md#57-revisions).
    pub revisions: i32,
    /// What the task's revision runs cost, exactly; part of `cost`.
    pub revision_cost: Usd,
    /// History brought in by an import (docs/contract.md#39-import): its cost is in the
    /// report, but no budget counts it.
    pub imported: bool,
}

/// The report's view of a stored task: its identity, repository (as the normalised URL
/// string), kind, state, model, exact cost, tokens, creation time, parent, revisions and
/// whether it was imported; the rest is dropped.
impl From<Task> for TaskFact {
    fn from(t: Task) -> TaskFact {
        TaskFact {
            id: t.id,
            title: t.title,
            repo_url: t.repo_url.to_string(),
            task_type: t.task_type,
            state: t.state,
            model_used: t.model_used,
            cost: t.cost_usd,
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            created_at: t.created_at,
            parent_task_id: t.parent_task_id,
            revisions: t.revisions,
            revision_cost: t.revision_cost_usd,
            imported: t.imported,
        }
    }
}

/// Sums over the outcome units of a group (the `outcomes` member of the report).
///
/// An outcome unit is a coding task with its review subtasks (a task without a coding
/// parent is a unit by itself). Each unit belongs to the day, repository and model of its
/// head (the coding task) and ends as its head does: merged (a coding head in `completed`),
/// failed (`failed` or `cancelled`), or still open. Sums use exact decimals and saturate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutcomeTotals {
    /// Merged pull requests: coding heads in `completed`.
    pub merged: i64,
    /// Costed tasks of the units (heads and subtasks).
    pub costed: i64,
    /// The exact cost of every task of the units, in USD.
    pub cost: Decimal,
    /// The cost of the units that ended merged.
    pub merged_cost: Decimal,
    /// The cost of the units that ended `failed` or `cancelled`.
    pub failed_cost: Decimal,
    /// The revision rounds of the merged units (their heads' revision rounds).
    pub merged_revisions: i64,
    /// What the revision runs of the units cost, whatever their outcome; part of `cost`.
    pub revision_cost: Decimal,
}

impl OutcomeTotals {
    /// What `task` adds to the unit of `head` (`head` is `task` itself for a head).
    pub fn of(task: &TaskFact, head: &TaskFact) -> OutcomeTotals {
        let cost = task.cost.map_or(Decimal::ZERO, Usd::as_decimal);
        let merged = head.task_type == TaskType::Coding && head.state == TaskState::Completed;
        let failed = matches!(head.state, TaskState::Failed | TaskState::Cancelled);
        OutcomeTotals {
            merged: i64::from(merged && task.id == head.id),
            costed: i64::from(task.cost.is_some()),
            cost,
            merged_cost: if merged { cost } else { Decimal::ZERO },
            failed_cost: if failed { cost } else { Decimal::ZERO },
            merged_revisions: if merged && task.id == head.id {
                i64::from(task.revisions)
            } else {
                0
            },
            revision_cost: task.revision_cost.as_decimal(),
        }
    }
}

saturating_sums!(OutcomeTotals {
    merged,
    costed,
    cost,
    merged_cost,
    failed_cost,
    merged_revisions,
    revision_cost,
});

impl TaskFact {
    /// The UTC calendar day of `created_at`, the day the task belongs to.
    pub fn day(&self) -> Date {
        self.created_at
            .checked_to_offset(UtcOffset::UTC)
            .unwrap_or(self.created_at)
            .date()
    }

    /// Whether the task succeeded: its state is `pr_opened` or `completed`.
    pub fn succeeded(&self) -> bool {
        matches!(self.state, TaskState::PrOpened | TaskState::Completed)
    }
}

/// Everything the report is computed from.
///
/// All figures are already restricted to the repository filter, except
/// `coding_by_model_all_repos`. Lists of totals may repeat a key: repeated entries are added
/// together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportInputs {
    /// The report's window.
    pub window: Window,
    /// Per day of the period; days not listed are zero. Entries outside the period are
    /// ignored.
    pub daily: Vec<(Date, Totals)>,
    /// Totals of the previous period.
    pub previous: Totals,
    /// Totals of the tasks created in today's month (from its first day through today).
    pub month_to_date: Totals,
    /// Period totals per repository URL.
    pub by_repo: Vec<(String, Totals)>,
    /// Period totals per task type.
    pub by_type: Vec<(TaskType, Totals)>,
    /// Period totals per model (`None` = unknown model), all task types.
    pub by_model: Vec<(Option<String>, Totals)>,
    /// Period totals of coding tasks with a known model, per (repository, model).
    pub coding_by_repo_model: Vec<(String, String, Totals)>,
    /// Period totals of coding tasks with a known model, per model, over all repositories
    /// (the candidates of model suggestions, never restricted by the repository filter).
    pub coding_by_model_all_repos: Vec<(String, Totals)>,
    /// Costed tasks of the period that may be anomalies. A superset of the anomalies is fine
    /// (storage passes the tasks at or above each repository's
    /// [threshold](anomaly_threshold_nanos)); the rule is applied again by the report, and
    /// duplicates, uncosted tasks and tasks outside the period are ignored.
    pub anomaly_candidates: Vec<TaskFact>,
    /// A superset of the 10 costliest costed tasks of the period (duplicates, uncosted tasks
    /// and tasks outside the period are ignored).
    pub top_candidates: Vec<TaskFact>,
    /// Outcome sums of the units whose head was created in the period, per (repository,
    /// model of the head; `None` = unknown), restricted to the repository filter (see
    /// [`OutcomeTotals`]).
    pub outcomes: Vec<(String, Option<String>, OutcomeTotals)>,
    /// The monthly budgets that are set, with this month's spend (the instance's first, then
    /// the repositories' by URL; restricted to the filter's repository and the instance).
    pub budgets: Vec<crate::budgets::BudgetInput>,
}

impl ReportInputs {
    /// The straightforward path: builds the inputs from every task.
    ///
    /// `tasks` covers all repositories; `repo_filter` is the normalised repository URL, or
    /// `None` for all. Membership in the period, the previous period and the month is by the
    /// UTC day of `created_at` ([`TaskFact::day`]); the month's tasks are those with
    /// `month_start ≤ day ≤ today` (repository filter applies, `days` does not).
    /// `coding_by_model_all_repos` ignores the filter. Both candidate lists hold every costed
    /// task of the period (filtered). A review task whose `parent_task_id` names a coding task
    /// of `tasks` counts in that task's outcome unit ([`OutcomeTotals`]); the units of
    /// `outcomes` are those whose head's day is in the period. Used by tests and by the
    /// benchmark baseline.
    pub fn from_tasks(
        window: Window,
        repo_filter: Option<&str>,
        tasks: &[TaskFact],
    ) -> ReportInputs {
        let mut daily: BTreeMap<Date, Totals> = BTreeMap::new();
        let mut previous = Totals::default();
        let mut month_to_date = Totals::default();
        let mut by_repo: BTreeMap<String, Totals> = BTreeMap::new();
        let mut by_type: BTreeMap<TaskType, Totals> = BTreeMap::new();
        let mut by_model: BTreeMap<Option<String>, Totals> = BTreeMap::new();
        let mut coding_by_repo_model: BTreeMap<(String, String), Totals> = BTreeMap::new();
        let mut coding_by_model_all_repos: BTreeMap<String, Totals> = BTreeMap::new();
        let mut candidates = Vec::new();
        let mut outcomes: BTreeMap<(String, Option<String>), OutcomeTotals> = BTreeMap::new();
        let coding: HashMap<Uuid, &TaskFact> = tasks
            .iter()
            .filter(|t| t.task_type == TaskType::Coding)
            .map(|t| (t.id, t))
            .collect();

        for task in tasks {
            let head = match (task.task_type, task.parent_task_id) {
                (TaskType::Review, Some(parent)) => coding.get(&parent).copied().unwrap_or(task),
                _ => task,
            };
            if window.contains(head.day()) && repo_filter.is_none_or(|f| f == head.repo_url) {
                *outcomes
                    .entry((head.repo_url.clone(), head.model_used.clone()))
                    .or_default() += OutcomeTotals::of(task, head);
            }

            let day = task.day();
            let in_period = window.contains(day);
            let totals = Totals::of(task);
            let coding_model = match (&task.model_used, task.task_type) {
                (Some(model), TaskType::Coding) => Some(model),
                _ => None,
            };
            if in_period && let Some(model) = coding_model {
                *coding_by_model_all_repos.entry(model.clone()).or_default() += totals;
            }
            if repo_filter.is_some_and(|filter| filter != task.repo_url) {
                continue;
            }
            if window.in_previous(day) {
                previous += totals;
            }
            if window.in_month_to_date(day) {
                month_to_date += totals;
            }
            if !in_period {
                continue;
            }
            *daily.entry(day).or_default() += totals;
            *by_repo.entry(task.repo_url.clone()).or_default() += totals;
            *by_type.entry(task.task_type).or_default() += totals;
            *by_model.entry(task.model_used.clone()).or_default() += totals;
            if let Some(model) = coding_model {
                *coding_by_repo_model
                    .entry((task.repo_url.clone(), model.clone()))
                    .or_default() += totals;
            }
            if task.cost.is_some() {
                candidates.push(task.clone());
            }
        }

        ReportInputs {
            window,
            daily: daily.into_iter().collect(),
            previous,
            month_to_date,
            by_repo: by_repo.into_iter().collect(),
            by_type: by_type.into_iter().collect(),
            by_model: by_model.into_iter().collect(),
            coding_by_repo_model: coding_by_repo_model
                .into_iter()
                .map(|((repo, model), totals)| (repo, model, totals))
                .collect(),
            coding_by_model_all_repos: coding_by_model_all_repos.into_iter().collect(),
            anomaly_candidates: candidates.clone(),
            top_candidates: candidates,
            outcomes: outcomes
                .into_iter()
                .map(|((repo, model), totals)| (repo, model, totals))
                .collect(),
            budgets: Vec::new(),
        }
    }
}

/// The lowest cost, in whole nano-dollars, at which a costed task of a repository with
/// `costed` costed tasks summing to `cost_nanos` in the period is an anomaly; `None` when the
/// repository cannot have anomalies (fewer than 3 costed tasks).
///
/// A task of cost `c` is an anomaly when `c ≥ 3 × (S − c) / (n − 1)` (three times the
/// average of the others), which is `c × (n + 2) ≥ 3 × S`, so the threshold is
/// `⌈3S / (n + 2)⌉` (rounded up: costs are whole nano-dollars). Computed on `i128`, exactly.
///
/// Storage uses it to fetch anomaly candidates with an index. The report still checks the
/// rule's other condition, "average of the others > 0" (e.g. with `S = 0` the threshold is 0
/// yet no task is an anomaly).
pub fn anomaly_threshold_nanos(costed: i64, cost_nanos: i64) -> Option<i64> {
    if costed < 3 {
        return None;
    }
    let numerator = 3 * i128::from(cost_nanos);
    let denominator = i128::from(costed) + 2;
    // Ceiling division for a positive denominator, any numerator sign.
    let threshold = -((-numerator).div_euclid(denominator));
    // |3S / (n + 2)| ≤ 3|S| / 5 < |S|, so it fits; saturate defensively anyway.
    Some(i64::try_from(threshold).unwrap_or(if threshold < 0 { i64::MIN } else { i64::MAX }))
}
