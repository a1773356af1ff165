//! Unit tests of the report: one test per rule and edge case, plus the randomized comparison
//! with an independent reference implementation in [`reference`].

mod reference;

use std::str::FromStr;

use agentry_domain::{TaskState, TaskType, Usd};
use agentry_testkit::json::COST_REPORT_LISTS;
use proptest::prelude::*;
use rust_decimal::Decimal;
use serde_json::json;
use time::macros::{date, datetime};
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::*;

const A: &str = "https://github.com/o/a";
const B: &str = "https://github.com/o/b";
const C: &str = "https://github.com/o/c";
const D: &str = "https://github.com/o/d";

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// A completed coding task by model `sonnet`, costing `cost` (`None`: uncosted); `id`
/// doubles as its title and sets its token counts. The builder methods below vary it.
fn coding(id: u128, repo: &str, cost: Option<&str>, created_at: OffsetDateTime) -> TaskFact {
    TaskFact {
        id: Uuid::from_u128(id),
        title: format!("task {id}"),
        repo_url: repo.to_owned(),
        task_type: TaskType::Coding,
        state: TaskState::Completed,
        model_used: Some("sonnet".to_owned()),
        cost: cost.map(|c| Usd::parse(c).unwrap()),
        input_tokens: 100 * id as i64,
        output_tokens: 10 * id as i64,
        created_at,
        parent_task_id: None,
        revisions: 0,
        revision_cost: Usd::ZERO,
        imported: false,
    }
}

/// Builder-style variations of a [`coding`] fixture.
impl TaskFact {
    /// The same task, of `task_type`.
    fn of_type(self, task_type: TaskType) -> TaskFact {
        TaskFact { task_type, ..self }
    }

    /// The same task, as a review.
    fn review(self) -> TaskFact {
        self.of_type(TaskType::Review)
    }

    /// The same task, in `state`.
    fn in_state(self, state: TaskState) -> TaskFact {
        TaskFact { state, ..self }
    }

    /// The same task, by `model` (`None`: no recorded model).
    fn by<'a>(self, model: impl Into<Option<&'a str>>) -> TaskFact {
        TaskFact {
            model_used: model.into().map(str::to_owned),
            ..self
        }
    }

    /// The same task, after `revisions` rounds whose runs cost `revision_cost`.
    fn with_revisions(self, revisions: i32, revision_cost: &str) -> TaskFact {
        TaskFact {
            revisions,
            revision_cost: Usd::parse(revision_cost).unwrap(),
            ..self
        }
    }
}

/// The last day of the report's window in most tests.
const TODAY: Date = date!(2024 - 05 - 10);

/// Noon UTC of [`TODAY`].
const NOON: OffsetDateTime = datetime!(2024-05-10 12:00 UTC);

/// Noon UTC of `day`.
fn noon(day: Date) -> OffsetDateTime {
    day.midnight().assume_utc() + time::Duration::hours(12)
}

/// The report of the `days` up to `today` on `tasks`, of the repository `filter` or all.
fn run(today: Date, days: u32, filter: Option<&str>, tasks: &[TaskFact]) -> CostReport {
    report(&ReportInputs::from_tasks(
        Window::new(today, days).unwrap(),
        filter,
        tasks,
    ))
}

/// The report of the 7 days up to [`TODAY`] on `tasks`, of all repositories.
fn last_week(tasks: &[TaskFact]) -> CostReport {
    run(TODAY, 7, None, tasks)
}

fn ids(ids: impl IntoIterator<Item = Uuid>) -> Vec<u128> {
    ids.into_iter().map(|id| id.as_u128()).collect()
}

/// A stored task becomes the fact the report reads: the normalised URL string, the exact
/// cost and every other member the report uses, unchanged.
#[test]
fn task_fact_from_a_stored_task() {
    use agentry_domain::{AgentType, RepoUrl, Task};
    let created_at = datetime!(2025-03-04 23:30 -2);
    let task = Task {
        id: Uuid::from_u128(9),
        title: "Fix the parser".to_owned(),
        prompt: "the prompt is not the report's".to_owned(),
        repo_id: None,
        repo_url: RepoUrl::parse("git@GitHub.com:Acme/Web.git").unwrap(),
        task_type: TaskType::Review,
        state: TaskState::PrOpened,
        agent_type: AgentType::ClaudeCode,
        model_used: Some("claude-opus-4-1".to_owned()),
        cost_usd: Some(Usd::parse("1.000000001").unwrap()),
        input_tokens: 12,
        output_tokens: 34,
        pr_url: None,
        pr_number: Some(5),
        issue_number: None,
        parent_task_id: Some(Uuid::from_u128(8)),
        attempt: 1,
        error_message: None,
        created_at,
        updated_at: created_at,
        started_at: None,
        finished_at: None,
        blocked_by: None,
        imported: true,
        revisions: 2,
        revision_attempt: None,
        revision_cost_usd: Usd::parse("0.25").unwrap(),
    };
    let fact = TaskFact::from(task);
    assert_eq!(
        fact,
        TaskFact {
            id: Uuid::from_u128(9),
            title: "Fix the parser".to_owned(),
            repo_url: "https://github.com/acme/web".to_owned(),
            task_type: TaskType::Review,
            state: TaskState::PrOpened,
            model_used: Some("claude-opus-4-1".to_owned()),
            cost: Some(Usd::parse("1.000000001").unwrap()),
            input_tokens: 12,
            output_tokens: 34,
            created_at,
            parent_task_id: Some(Uuid::from_u128(8)),
            revisions: 2,
            revision_cost: Usd::parse("0.25").unwrap(),
            imported: true,
        }
    );
    assert_eq!(fact.day(), date!(2025 - 03 - 05));
}

#[test]
fn empty_input() {
    let r = run(TODAY, 30, None, &[]);
    assert_eq!(
        r.summary,
        Summary {
            total_cost: "0.0000".into(),
            task_count: 0,
            tasks_with_cost: 0,
            avg_cost: "0.0000".into(),
            cost_trend: "0.0".into(),
            prev_period_cost: "0.0000".into(),
            days: 30,
        }
    );
    assert_eq!(
        r.forecast,
        Forecast {
            daily_avg_cost: "0.0000".into(),
            month_cost_so_far: "0.0000".into(),
            month_imported_cost_so_far: "0.0000".into(),
            forecasted_month_total: "0.0000".into(),
            days_remaining: 21,
        }
    );
    assert_eq!(r.daily_costs.len(), 30);
    assert_eq!(r.daily_costs[0].date, date!(2024 - 04 - 11));
    assert_eq!(r.daily_costs[29].date, date!(2024 - 05 - 10));
    assert!(
        r.daily_costs
            .iter()
            .all(|d| d.cost.is_zero() && d.task_count == 0)
    );
    assert!(r.cost_by_repo.is_empty());
    assert!(r.cost_by_type.is_empty());
    assert!(r.cost_by_model.is_empty());
    assert!(r.anomalies.is_empty());
    assert!(r.model_suggestions.is_empty());
    assert!(r.top_tasks.is_empty());
    assert_eq!(
        r.outcomes,
        Outcomes {
            figures: OutcomeFigures {
                merged_pull_requests: 0,
                cost_per_merged_pull_request: None,
                merged_cost: "0.0000".into(),
                failed_cost: "0.0000".into(),
                failed_share: Decimal::ZERO,
                revision_cost: "0.0000".into(),
                avg_revisions_per_merged_pull_request: None,
            },
            by_repo: Vec::new(),
            by_model: Vec::new(),
        }
    );
    let v = serde_json::to_value(&r).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut expected = [
        &["summary", "forecast", "dailyCosts"][..],
        &COST_REPORT_LISTS,
        &["outcomes", "budgets"],
    ]
    .concat();
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(
        v["dailyCosts"][0],
        json!({"date": "2024-04-11", "cost": 0.0, "taskCount": 0})
    );
}

#[test]
fn one_task_full_json() {
    let t = coding(7, A, Some("1.25"), datetime!(2024-05-09 12:00 UTC));
    let r = run(TODAY, 3, None, &[t]);
    let v = serde_json::to_value(&r).unwrap();
    let id = Uuid::from_u128(7).to_string();
    assert_eq!(
        v,
        json!({
            "budgets": [],
            "summary": {
                "totalCost": "1.2500", "taskCount": 1, "tasksWithCost": 1, "avgCost": "1.2500",
                "costTrend": "0.0", "prevPeriodCost": "0.0000", "days": 3
            },
            "forecast": {
                // 1.25 / 3 = 0.41666…; 1.25 + 21 × 1.25 / 3 = 10.0
                "dailyAvgCost": "0.4167", "monthCostSoFar": "1.2500",
                "monthImportedCostSoFar": "0.0000",
                "forecastedMonthTotal": "10.0000", "daysRemaining": 21
            },
            "dailyCosts": [
                {"date": "2024-05-08", "cost": 0.0, "taskCount": 0},
                {"date": "2024-05-09", "cost": 1.25, "taskCount": 1},
                {"date": "2024-05-10", "cost": 0.0, "taskCount": 0}
            ],
            "costByRepo": [{"repoUrl": A, "totalCost": 1.25, "taskCount": 1}],
            "costByType": [{"taskType": "coding", "totalCost": 1.25, "taskCount": 1}],
            "costByModel": [{
                "model": "sonnet", "totalCost": 1.25, "taskCount": 1, "successRate": 100.0,
                "avgCost": 1.25, "totalInputTokens": 700, "totalOutputTokens": 70
            }],
            "anomalies": [],
            "modelSuggestions": [],
            "topTasks": [{
                "id": id, "title": "task 7", "repoUrl": A, "taskType": "coding",
                "state": "completed", "costUsd": "1.25", "inputTokens": 700,
                "outputTokens": 70, "modelUsed": "sonnet", "createdAt": "2024-05-09T12:00:00Z"
            }],
            "outcomes": {
                "mergedPullRequests": 1, "costPerMergedPullRequest": "1.2500",
                "mergedCost": "1.2500", "failedCost": "0.0000", "failedShare": 0.0,
                "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": 0.0,
                "byRepo": [{
                    "repoUrl": A, "mergedPullRequests": 1, "costPerMergedPullRequest": "1.2500",
                    "mergedCost": "1.2500", "failedCost": "0.0000", "failedShare": 0.0,
                    "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": 0.0
                }],
                "byModel": [{
                    "model": "sonnet", "mergedPullRequests": 1,
                    "costPerMergedPullRequest": "1.2500", "mergedCost": "1.2500",
                    "failedCost": "0.0000", "failedShare": 0.0,
                    "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": 0.0
                }]
            }
        })
    );
}

#[test]
fn uncosted_tasks_count_only_in_task_count() {
    let tasks = [
        coding(1, A, None, NOON),
        coding(2, A, Some("0"), NOON),
        coding(3, A, Some("2"), NOON),
    ];
    let r = last_week(&tasks);
    assert_eq!(r.summary.task_count, 3);
    assert_eq!(r.summary.tasks_with_cost, 2);
    assert_eq!(r.summary.avg_cost, "1.0000");
    assert_eq!(r.daily_costs[6].task_count, 2);
    assert_eq!(r.cost_by_repo[0].cost.task_count, 2);
    assert_eq!(r.cost_by_model[0].total_input_tokens, 500);
    assert_eq!(ids(r.top_tasks.iter().map(|t| t.task.id)), [3, 2]);
    // A repository whose only tasks are uncosted has no row.
    let r = last_week(&[coding(1, A, None, NOON)]);
    assert!(r.cost_by_repo.is_empty() && r.cost_by_type.is_empty());
    assert!(r.cost_by_model.is_empty() && r.top_tasks.is_empty());
    assert_eq!(r.summary.task_count, 1);
}

#[test]
fn repository_of_free_tasks() {
    let tasks: Vec<_> = (1..=5).map(|i| coding(i, A, Some("0"), NOON)).collect();
    let r = last_week(&tasks);
    assert_eq!(r.summary.total_cost, "0.0000");
    assert_eq!(r.summary.avg_cost, "0.0000");
    assert!(r.anomalies.is_empty());
    assert_eq!(
        r.cost_by_repo,
        [RepoCost {
            repo_url: A.into(),
            cost: ChartCost {
                total_cost: Decimal::ZERO,
                task_count: 5
            }
        }]
    );
    assert_eq!(r.cost_by_model[0].avg_cost, Decimal::ZERO);
    assert_eq!(r.cost_by_model[0].success_rate, dec("100"));
    // One paid task among free ones: the others average 0, so no anomaly either.
    let mut tasks = tasks;
    tasks.push(coding(9, A, Some("5"), NOON));
    assert!(last_week(&tasks).anomalies.is_empty());
}

#[test]
fn anomaly_uses_the_average_of_the_others() {
    let t = |id, cost| coding(id, A, Some(cost), NOON);
    // 4 vs 1, 1: the average including itself is 2 (ratio 2), of the others 1 (ratio 4).
    let r = last_week(&[t(1, "4"), t(2, "1"), t(3, "1")]);
    assert_eq!(r.anomalies.len(), 1);
    let a = &r.anomalies[0];
    assert_eq!(a.task.id, Uuid::from_u128(1));
    assert_eq!(a.repo_avg_cost, dec("1"));
    assert_eq!(a.cost_ratio, dec("4"));
    assert_eq!(a.task.cost_usd.to_string(), "4");
    let v = serde_json::to_value(a).unwrap();
    assert_eq!(v["repoAvgCost"], json!(1.0));
    assert_eq!(v["costRatio"], json!(4.0));
    assert_eq!(v["costUsd"], json!("4"));
    assert_eq!(v["modelUsed"], json!("sonnet"));
    assert_eq!(v["state"], json!("completed"));
    assert_eq!(v["taskType"], json!("coding"));

    // Exactly 3 × is an anomaly; a nano-dollar less is not.
    let r = last_week(&[t(1, "3"), t(2, "1"), t(3, "1")]);
    assert_eq!(r.anomalies.len(), 1);
    assert_eq!(r.anomalies[0].cost_ratio, dec("3"));
    let r = last_week(&[t(1, "2.999999999"), t(2, "1"), t(3, "1")]);
    assert!(r.anomalies.is_empty());
    // Two costed tasks are not enough.
    assert!(last_week(&[t(1, "100"), t(2, "1")]).anomalies.is_empty());
    // Uncosted tasks do not count towards the three.
    let r = last_week(&[t(1, "100"), t(2, "1"), coding(3, A, None, NOON)]);
    assert!(r.anomalies.is_empty());
    // Tasks of other repositories and periods do not count.
    let r = last_week(&[
        t(1, "100"),
        t(2, "1"),
        coding(3, B, Some("1"), NOON),
        coding(4, A, Some("1"), noon(date!(2024 - 05 - 01))),
    ]);
    assert!(r.anomalies.is_empty());
    // A non-terminating leave-one-out average: 10 vs 1, 1, 2 → avg 4/3, ratio 7.5.
    let r = last_week(&[t(1, "10"), t(2, "1"), t(3, "1"), t(4, "2")]);
    assert_eq!(r.anomalies.len(), 1);
    assert_eq!(r.anomalies[0].repo_avg_cost, dec("4") / dec("3"));
    assert_eq!(r.anomalies[0].cost_ratio, dec("7.5"));
}

#[test]
fn anomaly_order_and_limit() {
    let mut tasks = Vec::new();
    let mut repo_of = |repo: &str, anomaly: (u128, &str), other: &str, next: &mut u128| {
        tasks.push(coding(anomaly.0, repo, Some(anomaly.1), NOON));
        for _ in 0..2 {
            *next += 1;
            tasks.push(coding(*next, repo, Some(other), NOON));
        }
    };
    let mut next = 1000;
    repo_of(A, (0x05, "4"), "1", &mut next); // ratio 4, cost 4, lowest id
    repo_of(B, (0x20, "8"), "2", &mut next); // ratio 4, cost 8, id 0x20
    repo_of(C, (0x10, "8"), "2", &mut next); // ratio 4, cost 8, id 0x10
    repo_of(D, (0x50, "10"), "1", &mut next); // ratio 10
    let r = last_week(&tasks);
    assert_eq!(
        ids(r.anomalies.iter().map(|a| a.task.id)),
        [0x50, 0x10, 0x20, 0x05]
    );
    let ratios: Vec<_> = r.anomalies.iter().map(|a| a.cost_ratio).collect();
    assert_eq!(ratios, [dec("10"), dec("4"), dec("4"), dec("4")]);

    // 25 anomalous repositories: the 20 highest ratios are listed.
    let mut tasks = Vec::new();
    for i in 0..25_u128 {
        let repo = format!("https://github.com/o/r{i:02}");
        tasks.push(coding(i, &repo, Some(&format!("{}", 10 + i)), NOON));
        tasks.push(coding(100 + i, &repo, Some("1"), NOON));
        tasks.push(coding(200 + i, &repo, Some("1"), NOON));
    }
    let r = last_week(&tasks);
    assert_eq!(r.anomalies.len(), 20);
    assert_eq!(
        ids(r.anomalies.iter().map(|a| a.task.id)),
        (5..25).rev().collect::<Vec<_>>()
    );
}

#[test]
fn repo_type_and_model_order() {
    let mk = |id, repo, ty, model: Option<&str>, cost| {
        coding(id, repo, Some(cost), NOON)
            .of_type(ty)
            .in_state(TaskState::Failed)
            .by(model)
    };
    use TaskType::{Coding, Review};
    let tasks = [
        mk(1, B, Coding, Some("b"), "1"),
        mk(2, B, Coding, Some("b"), "1"),
        mk(3, A, Review, Some("a"), "2"),
        mk(4, C, Review, None, "0.5"),
        mk(5, C, Review, None, "1.5"),
        mk(6, D, Coding, Some("z"), "3"),
    ];
    let r = last_week(&tasks);
    let repos: Vec<_> = r
        .cost_by_repo
        .iter()
        .map(|g| (g.repo_url.as_str(), g.cost.total_cost, g.cost.task_count))
        .collect();
    assert_eq!(
        repos,
        [
            (D, dec("3"), 1),
            (B, dec("2"), 2),
            (C, dec("2"), 2),
            (A, dec("2"), 1)
        ]
    );
    // coding 5 (3 tasks) vs review 4 (3 tasks).
    let types: Vec<_> = r
        .cost_by_type
        .iter()
        .map(|g| (g.task_type, g.cost.task_count))
        .collect();
    assert_eq!(types, [(Coding, 3), (Review, 3)]);
    // z 3; b 2 (2 tasks); unknown 2 (2 tasks); a 2 (1 task).
    let models: Vec<_> = r
        .cost_by_model
        .iter()
        .map(|g| (g.model.as_str(), g.cost.task_count))
        .collect();
    assert_eq!(models, [("z", 1), ("b", 2), ("unknown", 2), ("a", 1)]);
    assert!(r.cost_by_model.iter().all(|g| g.success_rate.is_zero()));

    // Type ties: equal cost and count → by name; equal cost → more tasks first.
    let r = last_week(&[mk(1, A, Review, None, "2"), mk(2, A, Coding, None, "2")]);
    let types: Vec<_> = r.cost_by_type.iter().map(|g| g.task_type).collect();
    assert_eq!(types, [Coding, Review]);
    let r = last_week(&[
        mk(1, A, Coding, None, "2"),
        mk(2, A, Review, None, "1"),
        mk(3, A, Review, None, "1"),
    ]);
    let types: Vec<_> = r.cost_by_type.iter().map(|g| g.task_type).collect();
    assert_eq!(types, [Review, Coding]);
    assert_eq!(
        serde_json::to_value(&r.cost_by_type[0]).unwrap(),
        json!({"taskType": "review", "totalCost": 2.0, "taskCount": 2})
    );
}

#[test]
fn cost_by_model_figures() {
    let mk = |id, state, model: Option<&str>, cost: Option<&str>| {
        coding(id, A, cost, NOON).in_state(state).by(model)
    };
    use TaskState::*;
    let tasks = [
        mk(1, Completed, Some("m"), Some("1")),
        mk(2, PrOpened, Some("m"), Some("1")),
        mk(3, Failed, Some("m"), Some("1")),
        mk(4, Completed, Some("m"), None), // uncosted: not counted anywhere here
        mk(5, Running, None, Some("0.1")),
        mk(6, Completed, None, Some("0.2")),
        mk(7, Cancelled, None, Some("0")),
    ];
    let r = last_week(&tasks);
    assert_eq!(
        r.cost_by_model[0],
        ModelCost {
            model: "m".into(),
            cost: ChartCost {
                total_cost: dec("3"),
                task_count: 3,
            },
            success_rate: dec("66.7"),
            avg_cost: dec("1"),
            total_input_tokens: 600,
            total_output_tokens: 60,
        }
    );
    let unknown = &r.cost_by_model[1];
    assert_eq!(unknown.model, "unknown");
    assert_eq!(unknown.cost.total_cost, dec("0.3"));
    assert_eq!(unknown.success_rate, dec("33.3"));
    assert_eq!(unknown.avg_cost, dec("0.1"));
    let v = serde_json::to_value(unknown).unwrap();
    assert_eq!(v["totalCost"], json!(0.3));
    assert_eq!(v["successRate"], json!(33.3));
    let text = serde_json::to_string(unknown).unwrap();
    assert!(text.contains("\"totalCost\":0.3,"), "{text}");
    // 1/8 = 12.5 %; 1/16 = 6.25 % → 6.3 (half away from zero).
    let mut tasks: Vec<_> = (0..16)
        .map(|i| mk(100 + i, Failed, Some("x"), Some("1")))
        .collect();
    tasks[0].state = Completed;
    let r = last_week(&tasks);
    assert_eq!(r.cost_by_model[0].success_rate, dec("6.3"));
    tasks.truncate(8);
    let r = last_week(&tasks);
    assert_eq!(r.cost_by_model[0].success_rate, dec("12.5"));
}

#[test]
fn a_model_named_unknown_shares_the_unknown_row() {
    let tasks = [
        coding(1, A, Some("1"), NOON).by(None),
        coding(2, A, Some("2"), NOON)
            .in_state(TaskState::Failed)
            .by("unknown"),
    ];
    let r = last_week(&tasks);
    assert_eq!(r.cost_by_model.len(), 1);
    assert_eq!(r.cost_by_model[0].cost.task_count, 2);
    assert_eq!(r.cost_by_model[0].success_rate, dec("50"));
}

#[test]
fn trend() {
    let trend = |now: &str, prev: &str| {
        let tasks = [
            coding(1, A, Some(now), NOON),
            coding(2, A, Some(prev), noon(date!(2024 - 05 - 01))),
        ];
        let r = last_week(&tasks);
        (r.summary.cost_trend, r.summary.prev_period_cost)
    };
    assert_eq!(trend("1", "0"), ("0.0".into(), "0.0000".into()));
    assert_eq!(trend("1.25", "1"), ("25.0".into(), "1.0000".into()));
    assert_eq!(trend("2", "3"), ("-33.3".into(), "3.0000".into()));
    assert_eq!(trend("1", "3"), ("-66.7".into(), "3.0000".into()));
    assert_eq!(trend("0", "3"), ("-100.0".into(), "3.0000".into()));
    assert_eq!(trend("3", "3"), ("0.0".into(), "3.0000".into()));
    assert_eq!(trend("2.0005", "2"), ("0.0".into(), "2.0000".into()));
    // 1.00005 / 1 − 1 = 0.005 % → "0.0"; 1.0005 → 0.05 % → "0.1" (half away from zero).
    assert_eq!(trend("1.0005", "1").0, "0.1");
    assert_eq!(trend("0.9995", "1").0, "-0.1");
    // No previous task at all.
    let r = last_week(&[coding(1, A, Some("1"), NOON)]);
    assert_eq!(r.summary.cost_trend, "0.0");
    // Previous period boundaries: [2024-04-27, 2024-05-04).
    let tasks = [
        coding(1, A, Some("1"), noon(date!(2024 - 04 - 26))),
        coding(2, A, Some("2"), noon(date!(2024 - 04 - 27))),
        coding(3, A, Some("4"), noon(date!(2024 - 05 - 03))),
        coding(4, A, Some("8"), noon(date!(2024 - 05 - 04))),
    ];
    let r = last_week(&tasks);
    assert_eq!(r.summary.prev_period_cost, "6.0000");
    assert_eq!(r.summary.total_cost, "8.0000");
}

/// The forecast of the `days` up to `today` on coding tasks of repository A, one a
/// (cost, day of creation).
fn forecast(today: Date, days: u32, tasks: &[(&str, Date)]) -> Forecast {
    let tasks: Vec<_> = tasks
        .iter()
        .zip(1..)
        .map(|(&(cost, day), id)| coding(id, A, Some(cost), noon(day)))
        .collect();
    run(today, days, None, &tasks).forecast
}

/// A forecast of `daily_avg_cost`, `month_cost_so_far`, `forecasted_month_total` and
/// `days_remaining`, in that order, without imported history.
fn expected_forecast(daily_avg: &str, so_far: &str, total: &str, days_remaining: u32) -> Forecast {
    Forecast {
        daily_avg_cost: daily_avg.into(),
        month_cost_so_far: so_far.into(),
        month_imported_cost_so_far: "0.0000".into(),
        forecasted_month_total: total.into(),
        days_remaining,
    }
}

#[test]
fn forecast_at_month_and_year_ends() {
    // Dec 31: nothing remains; the forecast is the month so far.
    let tasks = [("10", date!(2024 - 12 - 01)), ("5", date!(2024 - 11 - 30))];
    assert_eq!(
        forecast(date!(2024 - 12 - 31), 90, &tasks),
        expected_forecast("0.1667", "10.0000", "10.0000", 0)
    );
    // Jan 1: the month is one day old; December's costs count for the average only.
    let tasks = [("7", date!(2024 - 12 - 30)), ("7", date!(2025 - 01 - 01))];
    assert_eq!(
        forecast(date!(2025 - 01 - 01), 7, &tasks),
        expected_forecast("2.0000", "7.0000", "67.0000", 30)
    );
    // February of a leap year.
    let days_remaining = [
        (date!(2024 - 02 - 28), 1),
        (date!(2024 - 02 - 29), 0),
        (date!(2023 - 02 - 28), 0),
        (date!(2024 - 03 - 01), 30),
    ];
    for (today, remaining) in days_remaining {
        let nothing = expected_forecast("0.0000", "0.0000", "0.0000", remaining);
        assert_eq!(forecast(today, 30, &[]), nothing, "{today}");
    }
    let leap_day = date!(2024 - 02 - 29);
    assert_eq!(
        forecast(leap_day, 29, &[("2.9", leap_day)]),
        expected_forecast("0.1000", "2.9000", "2.9000", 0)
    );
    // The month figure ignores `days`: a 1-day window on the 20th still sums the month.
    let tasks = [
        ("1", date!(2024 - 05 - 01)),
        ("2", date!(2024 - 05 - 20)),
        ("4", date!(2024 - 04 - 30)),
        ("8", date!(2024 - 05 - 21)), // in the future
    ];
    assert_eq!(
        forecast(date!(2024 - 05 - 20), 1, &tasks),
        expected_forecast("2.0000", "3.0000", "25.0000", 11)
    );
}

#[test]
fn forecast_uses_the_exact_daily_average() {
    // total 1 over 3 days, 30 days remaining: 30 / 3 = 10 exactly, whereas the rounded
    // daily average would give 0.3333 × 30 = 9.999.
    assert_eq!(
        forecast(date!(2024 - 05 - 01), 3, &[("1", date!(2024 - 04 - 30))]),
        expected_forecast("0.3333", "0.0000", "10.0000", 30)
    );
}

#[test]
fn one_day_and_a_year() {
    let today = date!(2024 - 12 - 31);
    let tasks = [
        coding(1, A, Some("1"), noon(today)),
        coding(2, A, Some("2"), noon(date!(2024 - 12 - 30))),
        coding(3, A, Some("4"), noon(date!(2024 - 01 - 02))),
        coding(4, A, Some("8"), noon(date!(2024 - 01 - 01))),
        // The previous 365 days are [2023-01-02, 2024-01-02).
        coding(5, A, Some("16"), noon(date!(2023 - 01 - 02))),
        coding(6, A, Some("32"), noon(date!(2023 - 01 - 01))),
    ];
    let r = run(today, 1, None, &tasks);
    assert_eq!(r.summary.total_cost, "1.0000");
    assert_eq!(r.summary.prev_period_cost, "2.0000");
    assert_eq!(r.summary.cost_trend, "-50.0");
    assert_eq!(r.summary.days, 1);
    assert_eq!(r.daily_costs.len(), 1);
    assert_eq!(r.daily_costs[0].date, today);
    assert_eq!(r.forecast.daily_avg_cost, "1.0000");

    let r = run(today, 365, None, &tasks);
    assert_eq!(r.summary.total_cost, "7.0000");
    assert_eq!(r.summary.prev_period_cost, "24.0000");
    assert_eq!(r.summary.days, 365);
    assert_eq!(r.daily_costs.len(), 365);
    assert_eq!(r.daily_costs[0].date, date!(2024 - 01 - 02));
    assert_eq!(r.daily_costs[0].cost, dec("4"));
    assert_eq!(r.daily_costs[364].date, today);
    let dates: Vec<Date> = r.daily_costs.iter().map(|d| d.date).collect();
    assert!(dates.windows(2).all(|w| w[0].next_day() == Some(w[1])));
    assert_eq!(
        serde_json::to_value(&r.daily_costs[0]).unwrap(),
        json!({"date": "2024-01-02", "cost": 4.0, "taskCount": 1})
    );
}

#[test]
fn days_are_utc_days() {
    let tasks = [
        // 2024-05-09T20:00Z: yesterday in UTC.
        coding(1, A, Some("1"), datetime!(2024-05-10 01:00 +5)),
        // 2024-05-11T01:00Z: tomorrow in UTC, outside the period.
        coding(2, A, Some("2"), datetime!(2024-05-10 23:00 -2)),
        // 2024-05-10T23:59:59.999999999Z: today.
        coding(
            3,
            A,
            Some("4"),
            datetime!(2024-05-10 23:59:59.999999999 UTC),
        ),
        // The first instant of the period and the last one before it.
        coding(4, A, Some("8"), datetime!(2024-05-04 00:00 UTC)),
        coding(
            5,
            A,
            Some("16"),
            datetime!(2024-05-03 23:59:59.999999999 UTC),
        ),
    ];
    let r = last_week(&tasks);
    assert_eq!(r.summary.total_cost, "13.0000");
    assert_eq!(r.summary.prev_period_cost, "16.0000");
    assert_eq!(r.daily_costs[5].cost, dec("1"));
    assert_eq!(r.daily_costs[6].cost, dec("4"));
    assert_eq!(r.daily_costs[0].cost, dec("8"));
    let top = serde_json::to_value(&r.top_tasks).unwrap();
    let created: Vec<&str> = top
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["createdAt"].as_str().unwrap())
        .collect();
    assert_eq!(
        created,
        [
            "2024-05-04T00:00:00Z",
            "2024-05-10T23:59:59.999999999Z",
            "2024-05-09T20:00:00Z"
        ]
    );
}

#[test]
fn exact_sums_without_drift() {
    let mut tasks: Vec<_> = (0..1000)
        .map(|i| coding(i, A, Some("0.123456789"), NOON))
        .collect();
    tasks.extend((0..999).map(|i| coding(10_000 + i, B, Some("0.000000001"), NOON)));
    tasks.push(coding(20_000, C, Some("0.1"), noon(date!(2024 - 05 - 09))));
    tasks.push(coding(20_001, C, Some("0.2"), noon(date!(2024 - 05 - 09))));
    tasks.extend((0..3).map(|i| coding(30_000 + i, D, Some("0.33333333"), NOON)));
    let r = last_week(&tasks);
    // 123.456789 + 0.000000999 + 0.3 + 0.99999999
    assert_eq!(r.daily_costs[6].cost, dec("124.456789989"));
    assert_eq!(r.daily_costs[5].cost, dec("0.3"));
    assert_eq!(r.summary.total_cost, "124.7568");
    assert_eq!(r.summary.tasks_with_cost, 2004);
    let repo = |url: &str| {
        r.cost_by_repo
            .iter()
            .find(|g| g.repo_url == url)
            .unwrap()
            .cost
            .total_cost
    };
    assert_eq!(repo(A), dec("123.456789"));
    assert_eq!(repo(B), dec("0.000000999"));
    assert_eq!(repo(C), dec("0.3"));
    assert_eq!(repo(D), dec("0.99999999"));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["dailyCosts"][5]["cost"], json!(0.3));
    let text = serde_json::to_string(&r.daily_costs[5]).unwrap();
    assert_eq!(text, r#"{"date":"2024-05-09","cost":0.3,"taskCount":2}"#);
    let text = serde_json::to_string(&r.cost_by_repo).unwrap();
    assert!(text.contains(r#""totalCost":123.456789,"#), "{text}");
    assert!(text.contains(r#""totalCost":9.99e-7,"#), "{text}");
    assert_eq!(r.cost_by_model.len(), 1);
    assert_eq!(r.cost_by_model[0].cost.total_cost, dec("124.756789989"));
    assert_eq!(r.cost_by_model[0].cost.task_count, 2004);
}

#[test]
fn top_tasks_order() {
    let mut tasks = vec![
        coding(3, A, Some("5"), datetime!(2024-05-10 10:00 UTC)),
        coding(2, A, Some("5"), datetime!(2024-05-10 11:00 UTC)),
        coding(1, B, Some("5"), datetime!(2024-05-10 11:00 UTC)),
        coding(4, A, Some("5.000000001"), datetime!(2024-05-01 11:00 UTC)), // previous period
        coding(5, A, None, datetime!(2024-05-10 11:00 UTC)),
        coding(6, A, Some("0"), datetime!(2024-05-09 11:00 UTC)),
    ];
    tasks.extend((10..20).map(|i| coding(i, C, Some("1"), datetime!(2024-05-08 11:00 UTC))));
    let r = last_week(&tasks);
    assert_eq!(
        ids(r.top_tasks.iter().map(|t| t.task.id)),
        [1, 2, 3, 10, 11, 12, 13, 14, 15, 16]
    );
    let r = run(TODAY, 7, Some(A), &tasks);
    assert_eq!(ids(r.top_tasks.iter().map(|t| t.task.id)), [2, 3, 6]);
    let v = serde_json::to_value(&r.top_tasks[2]).unwrap();
    assert_eq!(v["costUsd"], json!("0"));
    assert_eq!(v["inputTokens"], json!(600));
    assert_eq!(v["outputTokens"], json!(60));
    // A null model stays null.
    let t = coding(1, A, Some("0.000000001"), NOON)
        .review()
        .in_state(TaskState::Failed)
        .by(None);
    let r = last_week(&[t]);
    let v = serde_json::to_value(&r.top_tasks[0]).unwrap();
    assert_eq!(v["modelUsed"], json!(null));
    assert_eq!(v["costUsd"], json!("0.000000001"));
    assert_eq!(v["taskType"], json!("review"));
    assert_eq!(v["state"], json!("failed"));
}

#[test]
fn repository_filter() {
    let tasks = [
        coding(1, A, Some("1"), NOON),
        coding(2, B, Some("2"), NOON),
        coding(3, B, Some("4"), noon(date!(2024 - 05 - 01))),
        coding(4, A, Some("8"), noon(date!(2024 - 05 - 01))),
    ];
    let r = run(TODAY, 7, Some(B), &tasks);
    assert_eq!(r.summary.total_cost, "2.0000");
    assert_eq!(r.summary.prev_period_cost, "4.0000");
    assert_eq!(r.forecast.month_cost_so_far, "6.0000");
    assert_eq!(r.cost_by_repo.len(), 1);
    let r = run(TODAY, 7, Some("https://github.com/o/none"), &tasks);
    assert_eq!(r.summary.task_count, 0);
    assert_eq!(r.daily_costs.len(), 7);
    assert!(r.top_tasks.is_empty() && r.cost_by_repo.is_empty());
}

/// The tasks of one test, added batch by batch with ids handed out in order.
#[derive(Clone, Default)]
struct Tasks {
    last_id: u128,
    tasks: Vec<TaskFact>,
}

impl Tasks {
    /// Adds `count` coding tasks of `model` in `repo` created at [`NOON`], each costing
    /// `cost`, the first `succeeded` of them completed and the others failed.
    fn batch(
        &mut self,
        repo: &str,
        model: &str,
        count: usize,
        succeeded: usize,
        cost: &str,
    ) -> &mut Tasks {
        for i in 0..count {
            self.last_id += 1;
            let state = if i < succeeded {
                TaskState::Completed
            } else {
                TaskState::Failed
            };
            self.tasks.push(
                coding(self.last_id, repo, Some(cost), NOON)
                    .in_state(state)
                    .by(model),
            );
        }
        self
    }
}

impl std::ops::Deref for Tasks {
    type Target = Vec<TaskFact>;

    fn deref(&self) -> &Vec<TaskFact> {
        &self.tasks
    }
}

impl std::ops::DerefMut for Tasks {
    fn deref_mut(&mut self) -> &mut Vec<TaskFact> {
        &mut self.tasks
    }
}

/// The report's model suggestions as (repository, current model, suggested model, savings).
fn suggestions(r: &CostReport) -> Vec<(&str, &str, &str, Decimal)> {
    r.model_suggestions
        .iter()
        .map(|s| {
            (
                s.repo_url.as_str(),
                s.current_model.as_str(),
                s.suggested_model.as_str(),
                s.estimated_savings,
            )
        })
        .collect()
}

#[test]
fn suggestion_basics_and_ties() {
    let mut tasks = Tasks::default();
    // Two cheap models of D, 5 tasks at 1 each; pricier ones of A and B, 3 tasks at 2 each.
    for cheap in ["cheap-b", "cheap-a"] {
        tasks.batch(D, cheap, 5, 5, "1");
    }
    for (repo, pricey) in [(B, "pricey"), (A, "pricey2"), (A, "pricey")] {
        tasks.batch(repo, pricey, 3, 3, "2");
    }
    // Review tasks and unknown models never count.
    tasks.push(coding(900, A, Some("100"), NOON).review().by("pricey"));
    tasks.push(coding(901, A, Some("100"), NOON).by(None));
    let r = last_week(&tasks);
    // Equal savings (3) → repoUrl, then currentModel; equal candidate averages → name;
    // cheap-a and cheap-b (equal average 1) get no suggestion from each other.
    assert_eq!(
        suggestions(&r),
        [
            (A, "pricey", "cheap-a", dec("3")),
            (A, "pricey2", "cheap-a", dec("3")),
            (B, "pricey", "cheap-a", dec("3"))
        ]
    );
    assert_eq!(
        r.model_suggestions[0],
        ModelSuggestion {
            repo_url: A.into(),
            current_model: "pricey".into(),
            task_count: 3,
            avg_cost: dec("2"),
            cheaper_model_avg_cost: dec("1"),
            suggested_model: "cheap-a".into(),
            estimated_savings: dec("3"),
        }
    );
    assert_eq!(
        serde_json::to_value(&r.model_suggestions[0]).unwrap(),
        json!({
            "repoUrl": A, "currentModel": "pricey", "taskCount": 3, "avgCost": 2.0,
            "cheaperModelAvgCost": 1.0, "suggestedModel": "cheap-a", "estimatedSavings": 3.0
        })
    );
}

#[test]
fn suggestions_need_a_strictly_cheaper_candidate() {
    let mut tasks = Tasks::default();
    tasks.batch(A, "cur", 3, 3, "1");
    tasks.batch(B, "same", 5, 5, "1");
    assert!(last_week(&tasks).model_suggestions.is_empty());
    // A nano-dollar cheaper on average (5 × 0.999999999 / 5): suggested to both.
    tasks.batch(B, "less", 5, 5, "0.999999999");
    let r = last_week(&tasks);
    assert_eq!(
        suggestions(&r),
        [
            (B, "same", "less", dec("0.000000005")),
            (A, "cur", "less", dec("0.000000003"))
        ]
    );
    // Only 2 costed tasks of the current model: no suggestion.
    let mut few = Tasks::default();
    few.batch(A, "cur", 2, 2, "1");
    // An uncosted third task does not help.
    few.push(coding(5000, A, None, NOON).by("cur"));
    few.batch(B, "less", 5, 5, "0.5");
    assert!(last_week(&few).model_suggestions.is_empty());
}

#[test]
fn suggestion_candidates_need_five_costed_coding_tasks() {
    let mut tasks = Tasks::default();
    tasks.batch(A, "cur", 3, 0, "1");
    tasks.batch(B, "four", 4, 4, "0.1");
    // Uncosted and review tasks of the candidate do not count towards the five.
    tasks.push(coding(8000, B, None, NOON).by("four"));
    tasks.push(coding(8001, B, Some("0.1"), NOON).review().by("four"));
    assert!(last_week(&tasks).model_suggestions.is_empty());
    tasks.batch(C, "four", 1, 1, "0.1");
    let r = last_week(&tasks);
    assert_eq!(suggestions(&r), [(A, "cur", "four", dec("2.7"))]);
    assert_eq!(r.model_suggestions[0].cheaper_model_avg_cost, dec("0.1"));
    // Candidate tasks outside the period do not count either.
    let mut old = tasks.clone();
    old.last_mut().unwrap().created_at = noon(date!(2024 - 05 - 01));
    assert!(last_week(&old).model_suggestions.is_empty());
}

#[test]
fn suggestion_success_rates_compare_exactly() {
    let mut tasks = Tasks::default();
    // Current: 2 of 3 succeeded (66.666…%), average 3.
    tasks.batch(A, "big", 3, 2, "3");
    // 66.7 % at 1: accepted; 66.6 % at 0.5: rejected although cheapest; 4/6 = 2/3 at 0.75:
    // accepted (equal rate) and cheaper than 66.7 %.
    tasks.batch(B, "m667", 1000, 667, "1");
    tasks.batch(B, "m666", 1000, 666, "0.5");
    tasks.batch(B, "m46", 6, 4, "0.75");
    let r = last_week(&tasks);
    assert_eq!(suggestions(&r), [(A, "big", "m46", dec("6.75"))]);
    assert_eq!(r.model_suggestions[0].cheaper_model_avg_cost, dec("0.75"));
    // Without the 2/3 candidate, the 66.7 % one is suggested.
    let without: Vec<_> = tasks
        .iter()
        .filter(|t| t.model_used.as_deref() != Some("m46"))
        .cloned()
        .collect();
    let r = last_week(&without);
    assert_eq!(r.model_suggestions[0].suggested_model, "m667");
    assert_eq!(r.model_suggestions[0].estimated_savings, dec("6"));

    // Filtered to A: the candidates' figures still come from all repositories.
    let r = run(TODAY, 7, Some(A), &tasks);
    assert_eq!(r.model_suggestions.len(), 1);
    assert_eq!(r.model_suggestions[0].suggested_model, "m46");
    assert_eq!(r.cost_by_model.len(), 1);
    assert_eq!(r.cost_by_model[0].model, "big");
    assert_eq!(r.cost_by_model[0].success_rate, dec("66.7"));
    // Filtered to B: B's models get no rows from A's.
    let r = run(TODAY, 7, Some(B), &tasks);
    assert!(r.model_suggestions.iter().all(|s| s.repo_url == B));
}

#[test]
fn suggestion_order_and_limit() {
    let mut tasks = Tasks::default();
    tasks.batch("https://github.com/o/zz", "cheap", 5, 5, "1");
    // 12 repositories whose "big" model saves 3 × (1 + i/10 ... ) more each.
    for i in 0..12 {
        let repo = format!("https://github.com/o/r{i:02}");
        let cost = format!("{}", 2 + i);
        tasks.batch(&repo, "big", 3, 3, &cost);
    }
    let r = last_week(&tasks);
    assert_eq!(r.model_suggestions.len(), 10);
    let repos: Vec<_> = r
        .model_suggestions
        .iter()
        .map(|s| s.repo_url.as_str())
        .collect();
    let expected: Vec<String> = (2..12)
        .rev()
        .map(|i| format!("https://github.com/o/r{i:02}"))
        .collect();
    assert_eq!(repos, expected);
    assert_eq!(r.model_suggestions[0].estimated_savings, dec("36"));
    // Savings that are equal as fractions, written differently: 3 × (2 − 1) = 3 and
    // 4 × (1.75 − 1) = 3.
    let mut tasks = Tasks::default();
    tasks.batch(D, "cheap", 5, 5, "1");
    tasks.batch(B, "x", 3, 3, "2");
    tasks.batch(A, "y", 4, 4, "1.75");
    let r = last_week(&tasks);
    let rows: Vec<_> = r
        .model_suggestions
        .iter()
        .map(|s| (s.repo_url.as_str(), s.estimated_savings))
        .collect();
    assert_eq!(rows, [(A, dec("3")), (B, dec("3"))]);
}

#[test]
fn candidate_lists_may_be_supersets() {
    let tasks = [
        coding(1, A, Some("4"), NOON),
        coding(2, A, Some("1"), NOON),
        coding(3, A, Some("1"), NOON),
        coding(4, A, Some("100"), noon(date!(2024 - 05 - 01))),
        coding(5, A, None, NOON),
        coding(6, B, Some("50"), NOON),
    ];
    let window = Window::new(TODAY, 7).unwrap();
    let inputs = ReportInputs::from_tasks(window, Some(A), &tasks);
    let base = report(&inputs);
    assert_eq!(ids(base.anomalies.iter().map(|a| a.task.id)), [1]);
    let mut padded = inputs.clone();
    // Out of period, uncosted, duplicated, and (anomalies only) another repository.
    padded.anomaly_candidates = [&tasks[..], &tasks[..]].concat();
    padded.top_candidates = [&tasks[..5], &tasks[..5]].concat();
    padded.top_candidates.reverse();
    padded
        .daily
        .push((date!(2024 - 05 - 03), Totals::of(&tasks[3])));
    padded
        .daily
        .push((date!(2024 - 05 - 11), Totals::of(&tasks[3])));
    assert_eq!(report(&padded), base);
    // Candidates of a repository without totals are ignored.
    let mut unknown = inputs.clone();
    unknown.by_repo.clear();
    assert!(report(&unknown).anomalies.is_empty());
    // Repeated keys add up.
    let mut split = inputs.clone();
    split.by_repo = tasks[..3]
        .iter()
        .map(|t| (t.repo_url.clone(), Totals::of(t)))
        .collect();
    split.daily = tasks[..3]
        .iter()
        .chain(&tasks[4..5])
        .map(|t| (t.day(), Totals::of(t)))
        .collect();
    assert_eq!(report(&split), base);
}

#[test]
fn totals() {
    let t = coding(2, A, Some("1.5"), noon(date!(2024 - 05 - 10)));
    let of = Totals::of(&t);
    assert_eq!(
        of,
        Totals {
            tasks: 1,
            costed: 1,
            cost: dec("1.5"),
            succeeded: 1,
            input_tokens: 200,
            output_tokens: 20,
            imported_cost: Decimal::ZERO,
        }
    );
    let imported = TaskFact {
        imported: true,
        ..t.clone()
    };
    assert_eq!(
        Totals::of(&imported),
        Totals {
            imported_cost: dec("1.5"),
            ..of
        }
    );
    let mut failed = t.clone();
    failed.state = TaskState::Failed;
    assert_eq!(Totals::of(&failed).succeeded, 0);
    let mut uncosted = t.clone();
    uncosted.cost = None;
    assert_eq!(
        Totals::of(&uncosted),
        Totals {
            tasks: 1,
            ..Totals::default()
        }
    );
    let mut sum = of;
    sum.add(&Totals::of(&uncosted));
    sum += Totals::of(&failed);
    assert_eq!(sum.tasks, 3);
    assert_eq!(sum.costed, 2);
    assert_eq!(sum.cost, dec("3"));
    assert_eq!(sum.succeeded, 1);
    let total: Totals = [of, of].iter().sum();
    assert_eq!(total.cost, dec("3"));
    let total: Totals = [of, of].into_iter().sum();
    assert_eq!(total.tasks, 2);
    for state in TaskState::ALL {
        let mut s = t.clone();
        s.state = state;
        assert_eq!(
            s.succeeded(),
            matches!(state, TaskState::PrOpened | TaskState::Completed)
        );
    }
    let mut saturated = Totals {
        tasks: i64::MAX,
        ..Totals::default()
    };
    saturated.add(&of);
    assert_eq!(saturated.tasks, i64::MAX);
}

#[test]
fn from_tasks_inputs() {
    let tasks = [
        coding(1, A, Some("1"), NOON),
        coding(2, B, Some("2"), NOON),
        coding(3, A, None, NOON),
        coding(4, A, Some("4"), noon(date!(2024 - 05 - 01))),
        coding(5, B, Some("8"), noon(date!(2024 - 04 - 30))),
    ];
    let inputs = ReportInputs::from_tasks(Window::new(TODAY, 7).unwrap(), Some(A), &tasks);
    assert_eq!(inputs.daily.len(), 1);
    assert_eq!(inputs.daily[0].1.tasks, 2);
    assert_eq!(inputs.previous.cost, dec("4"));
    assert_eq!(inputs.month_to_date.cost, dec("5"));
    assert_eq!(inputs.by_repo.len(), 1);
    assert_eq!(
        inputs.coding_by_repo_model,
        [(A.to_owned(), "sonnet".to_owned(), {
            let mut t = Totals::of(&tasks[0]);
            t.add(&Totals::of(&tasks[2]));
            t
        })]
    );
    assert_eq!(inputs.coding_by_model_all_repos[0].1.cost, dec("3"));
    assert_eq!(ids(inputs.anomaly_candidates.iter().map(|t| t.id)), [1]);
    assert_eq!(ids(inputs.top_candidates.iter().map(|t| t.id)), [1]);
}

#[test]
fn anomaly_threshold_examples() {
    assert_eq!(anomaly_threshold_nanos(2, 1_000), None);
    assert_eq!(anomaly_threshold_nanos(0, 0), None);
    // 4, 1, 1: S = 6, n = 3 → 18 / 5 = 3.6 → 4 is an anomaly, 3 is not.
    assert_eq!(anomaly_threshold_nanos(3, 6), Some(4));
    assert_eq!(anomaly_threshold_nanos(3, 5), Some(3));
    assert_eq!(anomaly_threshold_nanos(3, 0), Some(0));
    // 3 × MAX / (MAX + 2) is just below 3.
    assert_eq!(anomaly_threshold_nanos(i64::MAX, i64::MAX), Some(3));
    assert_eq!(
        anomaly_threshold_nanos(3, i64::MAX),
        Some(((3 * i128::from(i64::MAX) + 4) / 5) as i64)
    );
}

proptest! {
    #[test]
    fn anomaly_threshold_agrees_with_the_rule(
        n in 3_i64..10_000,
        s in 0_i64..=i64::MAX / 4,
        c in 0_i64..=i64::MAX / 4,
    ) {
        let threshold = anomaly_threshold_nanos(n, s).unwrap();
        let rule = i128::from(c) * i128::from(n + 2) >= 3 * i128::from(s);
        prop_assert_eq!(c >= threshold, rule);
    }

    #[test]
    fn anomaly_threshold_agrees_on_small_values(n in 3_i64..50, s in 0_i64..2_000, c in 0_i64..2_000) {
        let threshold = anomaly_threshold_nanos(n, s).unwrap();
        prop_assert_eq!(c >= threshold, c * (n + 2) >= 3 * s);
        // …which is the leave-one-out rule c ≥ 3 × (S − c) / (n − 1) when c ≤ S.
        if c <= s {
            prop_assert_eq!(c >= threshold, c * (n - 1) >= 3 * (s - c));
        }
    }

    #[test]
    fn threshold_is_tight(n in 3_i64..1_000_000, s in 1_i64..=i64::MAX / 4) {
        let threshold = anomaly_threshold_nanos(n, s).unwrap();
        let rule = |c: i64| i128::from(c) * i128::from(n + 2) >= 3 * i128::from(s);
        prop_assert!(rule(threshold));
        prop_assert!(!rule(threshold - 1));
    }
}

#[test]
fn window_errors() {
    assert_eq!(
        Window::new(date!(2024 - 05 - 10), 0),
        Err(WindowError::DaysOutOfRange(0))
    );
    assert_eq!(
        Window::new(date!(2024 - 05 - 10), 366),
        Err(WindowError::DaysOutOfRange(366))
    );
}

#[test]
fn task_fact_day_is_utc() {
    let t = coding(1, A, None, datetime!(2024-05-10 01:00 +5));
    assert_eq!(t.day(), date!(2024 - 05 - 09));
    let t = coding(1, A, None, datetime!(2024-05-10 23:00 -2));
    assert_eq!(t.day(), date!(2024 - 05 - 11));
}

/// A review subtask of `parent`.
fn review_of(id: u128, parent: &TaskFact, state: TaskState, model: &str, cost: &str) -> TaskFact {
    TaskFact {
        parent_task_id: Some(parent.id),
        ..coding(
            id,
            &parent.repo_url,
            Some(cost),
            parent.created_at + time::Duration::hours(1),
        )
        .review()
        .in_state(state)
        .by(model)
    }
}

#[test]
fn outcomes_count_reviews_with_their_coding_task() {
    // Merged: 1.5 over its attempts, plus a review (0.25) and a failed review (0.05), the
    // reviews by another model and the failed one after the period's first day.
    let merged = coding(1, A, Some("1.5"), noon(date!(2024 - 05 - 01))).by("opus");
    let merged_review = review_of(2, &merged, TaskState::Completed, "haiku", "0.25");
    let failed_review = review_of(3, &merged, TaskState::Failed, "haiku", "0.05");
    // Second merged pull request, with no recorded cost.
    let free = coding(4, A, None, NOON).by("opus");
    // Failed and cancelled coding tasks (1 + 0.2 with its review), an open one (0.5).
    let failed = coding(5, B, Some("1"), NOON).in_state(TaskState::Failed);
    let failed_child = review_of(6, &failed, TaskState::Completed, "haiku", "0.2");
    let cancelled = coding(7, B, Some("0.3"), NOON)
        .in_state(TaskState::Cancelled)
        .by(None);
    let open = coding(8, B, Some("0.5"), NOON).in_state(TaskState::PrOpened);
    // A review without a parent is its own unit: failed, by its own model.
    let orphan = TaskFact {
        parent_task_id: Some(Uuid::from_u128(999)),
        ..coding(9, A, Some("0.1"), NOON)
            .review()
            .in_state(TaskState::Failed)
            .by("haiku")
    };
    // Merged before the period: its review, created in the period, stays with it.
    let old = coding(10, A, Some("2"), noon(date!(2024 - 04 - 01))).by("opus");
    let old_review = TaskFact {
        created_at: NOON,
        ..review_of(11, &old, TaskState::Completed, "haiku", "0.7")
    };
    let tasks = [
        merged,
        merged_review,
        failed_review,
        free,
        failed,
        failed_child,
        cancelled,
        open,
        orphan,
        old,
        old_review,
    ];
    let r = run(TODAY, 10, None, &tasks);
    // totalCost = 1.5 + 0.25 + 0.05 + 1 + 0.2 + 0.3 + 0.5 + 0.1 + 0.7 = 4.6
    assert_eq!(r.summary.total_cost, "4.6000");
    let v = serde_json::to_value(&r.outcomes).unwrap();
    assert_eq!(
        v,
        json!({
            "mergedPullRequests": 2,
            "costPerMergedPullRequest": "0.9000",
            "mergedCost": "1.8000",
            "failedCost": "1.6000",
            // 1.6 / 4.6 = 34.78…%
            "failedShare": 34.8,
            "revisionCost": "0.0000",
            "avgRevisionsPerMergedPullRequest": 0.0,
            "byRepo": [
                {"repoUrl": B, "mergedPullRequests": 0, "costPerMergedPullRequest": null,
                 "mergedCost": "0.0000", "failedCost": "1.5000", "failedShare": 75.0,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": null},
                {"repoUrl": A, "mergedPullRequests": 2, "costPerMergedPullRequest": "0.9000",
                 "mergedCost": "1.8000", "failedCost": "0.1000", "failedShare": 5.3,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": 0.0}
            ],
            "byModel": [
                {"model": "opus", "mergedPullRequests": 2, "costPerMergedPullRequest": "0.9000",
                 "mergedCost": "1.8000", "failedCost": "0.0000", "failedShare": 0.0,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": 0.0},
                {"model": "sonnet", "mergedPullRequests": 0, "costPerMergedPullRequest": null,
                 "mergedCost": "0.0000", "failedCost": "1.2000", "failedShare": 70.6,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": null},
                {"model": "unknown", "mergedPullRequests": 0, "costPerMergedPullRequest": null,
                 "mergedCost": "0.0000", "failedCost": "0.3000", "failedShare": 100.0,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": null},
                {"model": "haiku", "mergedPullRequests": 0, "costPerMergedPullRequest": null,
                 "mergedCost": "0.0000", "failedCost": "0.1000", "failedShare": 100.0,
                 "revisionCost": "0.0000", "avgRevisionsPerMergedPullRequest": null}
            ]
        })
    );
    // The repository filter applies to the units.
    let r = run(TODAY, 10, Some(B), &tasks);
    assert_eq!(r.outcomes.figures.merged_pull_requests, 0);
    assert_eq!(r.outcomes.figures.failed_cost, "1.5000");
    // 1.5 / 2.0
    assert_eq!(r.outcomes.figures.failed_share, dec("75.0"));
}

#[test]
fn outcomes_revision_cost_and_rounds_per_merged_pull_request() {
    // Merged after 2 rounds that cost 0.33333 of its 1.2; its review is no revision run.
    let head = coding(1, A, Some("1.2"), NOON)
        .by("opus")
        .with_revisions(2, "0.33333");
    let tasks = [
        review_of(2, &head, TaskState::Completed, "haiku", "0.1"),
        head,
        // Merged with no round, and merged with 1 round: 3 rounds over 3 merged = 1.00.
        coding(3, A, Some("0.5"), NOON).by("opus"),
        coding(4, A, Some("0.7"), NOON)
            .by("sonnet")
            .with_revisions(1, "0.000049"),
        // A round started, then the pull request was closed: its revision runs count in
        // revisionCost (all outcomes) but its round not in the merged average.
        coding(5, B, Some("0.9"), NOON)
            .in_state(TaskState::Failed)
            .by("sonnet")
            .with_revisions(1, "0.4"),
        // Still open, in its second round.
        coding(6, B, Some("0.2"), NOON)
            .in_state(TaskState::Queued)
            .by("sonnet")
            .with_revisions(2, "0.05"),
        // Created before the period: not one of its units.
        coding(7, A, Some("9"), noon(date!(2024 - 04 - 01)))
            .by("opus")
            .with_revisions(5, "4"),
    ];
    let r = run(TODAY, 10, None, &tasks);
    let o = &r.outcomes;
    assert_eq!(o.figures.merged_pull_requests, 3);
    // The cost of a merged pull request still holds its revision runs: 1.2 + 0.1 + 0.5 + 0.7.
    assert_eq!(o.figures.merged_cost, "2.5000");
    // 0.33333 + 0.000049 + 0.4 + 0.05 = 0.783379, rounded once.
    assert_eq!(o.figures.revision_cost, "0.7834");
    assert_eq!(
        o.figures.avg_revisions_per_merged_pull_request,
        Some(dec("1.00"))
    );
    let v = serde_json::to_value(o).unwrap();
    assert_eq!(v["revisionCost"], json!("0.7834"));
    assert_eq!(v["avgRevisionsPerMergedPullRequest"], json!(1.0));
    let repo = |url: &str| o.by_repo.iter().find(|g| g.repo_url == url).unwrap();
    // A: 2 + 0 + 1 rounds over 3 merged, 0.33333 + 0.000049 = 0.333379; B: nothing merged.
    assert_eq!(repo(A).figures.revision_cost, "0.3334");
    assert_eq!(
        repo(A).figures.avg_revisions_per_merged_pull_request,
        Some(dec("1.00"))
    );
    assert_eq!(repo(B).figures.revision_cost, "0.4500");
    assert_eq!(repo(B).figures.avg_revisions_per_merged_pull_request, None);
    let model = |name: &str| o.by_model.iter().find(|g| g.model == name).unwrap();
    assert_eq!(
        model("opus").figures.avg_revisions_per_merged_pull_request,
        Some(dec("1.00"))
    );
    // sonnet: 1 round over 1 merged; 0.000049 + 0.4 + 0.05 = 0.450049.
    assert_eq!(
        model("sonnet")
            .figures
            .avg_revisions_per_merged_pull_request,
        Some(dec("1.00"))
    );
    assert_eq!(model("sonnet").figures.revision_cost, "0.4500");
    let v = serde_json::to_value(&o.by_repo).unwrap();
    assert_eq!(v[1]["avgRevisionsPerMergedPullRequest"], json!(null), "{v}");
    assert_eq!(v[1]["revisionCost"], json!("0.4500"), "{v}");
}

#[test]
fn revisions_per_merged_pull_request_round_half_away_from_zero_to_2_decimals() {
    let merged = |id, revisions| {
        coding(id, A, Some("1"), NOON)
            .by("opus")
            .with_revisions(revisions, "0")
    };
    let avg = |tasks: &[TaskFact]| {
        let o = run(TODAY, 1, None, tasks).outcomes;
        (
            o.figures.avg_revisions_per_merged_pull_request,
            serde_json::to_value(&o).unwrap()["avgRevisionsPerMergedPullRequest"].clone(),
        )
    };
    // 2 / 3 = 0.666… → 0.67; 1 / 3 = 0.333… → 0.33.
    assert_eq!(
        avg(&[merged(1, 2), merged(2, 0), merged(3, 0)]),
        (Some(dec("0.67")), json!(0.67))
    );
    assert_eq!(
        avg(&[merged(1, 1), merged(2, 0), merged(3, 0)]),
        (Some(dec("0.33")), json!(0.33))
    );
    // 1 / 8 = 0.125 → 0.13 (half away from zero); 5 / 8 = 0.625 → 0.63.
    let eight = |rounds: &[i32]| -> Vec<TaskFact> {
        (0..8)
            .map(|i| merged(i + 1, rounds.get(i as usize).copied().unwrap_or(0)))
            .collect()
    };
    assert_eq!(avg(&eight(&[1])), (Some(dec("0.13")), json!(0.13)));
    assert_eq!(avg(&eight(&[5])), (Some(dec("0.63")), json!(0.63)));
    // 7 / 2 = 3.5.
    assert_eq!(
        avg(&[merged(1, 3), merged(2, 4)]),
        (Some(dec("3.50")), json!(3.5))
    );
    // Nothing merged: null, even with revision rounds on open or failed units.
    let open = coding(1, A, Some("1"), NOON)
        .in_state(TaskState::PrOpened)
        .by("opus")
        .with_revisions(3, "0.5");
    let closed = coding(2, A, Some("1"), NOON)
        .in_state(TaskState::Failed)
        .by("opus")
        .with_revisions(1, "0.25");
    let (value, wire) = avg(&[open.clone(), closed.clone()]);
    assert_eq!((value, wire), (None, json!(null)));
    let o = run(TODAY, 1, None, &[open, closed]).outcomes;
    assert_eq!(o.figures.revision_cost, "0.7500");
    assert_eq!(
        o.by_repo[0].figures.avg_revisions_per_merged_pull_request,
        None
    );
    assert_eq!(
        o.by_model[0].figures.avg_revisions_per_merged_pull_request,
        None
    );
}

#[test]
fn the_month_says_how_much_of_it_is_imported_history() {
    let imported = |t: TaskFact| TaskFact {
        imported: true,
        ..t
    };
    let tasks = [
        // This month: own runs 1.5 + 0.25 in A, 2 in B; imported 343.7 in A and 0.000049999
        // in B (one uncosted imported task adds nothing).
        coding(1, A, Some("1.5"), NOON),
        coding(2, A, Some("0.25"), noon(date!(2024 - 05 - 01))),
        coding(3, B, Some("2"), NOON),
        imported(coding(4, A, Some("343.7"), noon(date!(2024 - 05 - 02)))),
        imported(coding(5, B, Some("0.000049999"), NOON).review()),
        imported(coding(6, B, None, NOON)),
        // Before the month, in the period: imported, not this month's.
        imported(coding(7, A, Some("100"), noon(date!(2024 - 04 - 30)))),
    ];
    let r = run(TODAY, 30, None, &tasks);
    assert_eq!(r.forecast.month_cost_so_far, "347.4500");
    assert_eq!(r.forecast.month_imported_cost_so_far, "343.7000");
    assert_eq!(r.summary.total_cost, "447.4500");
    let r = run(TODAY, 30, Some(A), &tasks);
    assert_eq!(r.forecast.month_cost_so_far, "345.4500");
    assert_eq!(r.forecast.month_imported_cost_so_far, "343.7000");
    // Rounded once, at 4 decimals, like the month itself: 0.000049999 → 0.0000.
    let r = run(TODAY, 30, Some(B), &tasks);
    assert_eq!(r.forecast.month_cost_so_far, "2.0000");
    assert_eq!(r.forecast.month_imported_cost_so_far, "0.0000");
    // Without imported history the figure is zero.
    let own: Vec<TaskFact> = tasks.iter().filter(|t| !t.imported).cloned().collect();
    let r = run(TODAY, 30, None, &own);
    assert_eq!(r.forecast.month_cost_so_far, "3.7500");
    assert_eq!(r.forecast.month_imported_cost_so_far, "0.0000");
}
