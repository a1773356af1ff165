//! `GET /api/analytics/costs`: validation, the empty report, and equivalence of the
//! rollup-fed report with the straightforward one computed from every task, on a randomized
//! data set (both backends). The straightforward path is itself checked against an
//! independent reference implementation in agentry-analytics' tests.
#![allow(
    clippy::unwrap_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use crate::common::*;
use agentry_analytics::{ReportInputs, TaskFact, Window, report};
use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Trigger, Usd};
use agentry_persistence::tasks::{
    self, ImportTask, Run, RunOutcome, TaskCursor, TaskFilter, TransitionDetails,
};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{Db, DbError, write_tx};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const REPOS: [&str; 4] = [
    "https://github.com/acme/web",
    "https://github.com/acme/api",
    "https://github.com/acme/docs",
    "https://github.com/other/tool",
];
const MODELS: [Option<&str>; 5] = [
    None,
    Some("opus"),
    Some("sonnet"),
    Some("haiku"),
    Some("gpt-5"),
];

/// A randomized history over the last ~100 days: imported records with every state, model
/// and cost shape (none, zero, 9 decimals), plus live tasks that go through runs and
/// transitions, including an outlier per repository so anomalies appear.
fn seed(db: &Db, seed: u64) {
    let mut rng = Rng(seed);
    let now = OffsetDateTime::now_utc();
    let mut conn = db.conn().unwrap();
    let records: Vec<Result<ImportTask, DbError>> = (0..600)
        .map(|i| {
            let cost = match rng.below(10) {
                0 => None,
                1 => Some(Usd::ZERO),
                2 => {
                    Some(Usd::from_nanos(40_000_000_000 + rng.below(1_000_000_000) as i64).unwrap())
                }
                _ => Some(Usd::from_nanos(rng.below(3_000_000_000) as i64 + 1).unwrap()),
            };
            Ok(ImportTask {
                id: Uuid::new_v4(),
                title: format!("task {i}"),
                repo_url: RepoUrl::parse(REPOS[rng.below(4) as usize]).unwrap(),
                task_type: if rng.below(4) == 0 {
                    TaskType::Review
                } else {
                    TaskType::Coding
                },
                state: TaskState::ALL[rng.below(7) as usize],
                agent_type: AgentType::ClaudeCode,
                model_used: MODELS[rng.below(5) as usize].map(str::to_owned),
                cost_usd: cost,
                input_tokens: rng.below(100_000) as i64,
                output_tokens: rng.below(10_000) as i64,
                created_at: now - Duration::minutes(rng.below(100 * 24 * 60) as i64),
                pr_url: None,
                pr_number: None,
                issue_number: None,
            })
        })
        .collect();
    tasks::import_tasks(&mut conn, records).unwrap();
    for i in 0..40 {
        let mut new = new_task(
            REPOS[i % 4],
            TaskType::Coding,
            now - Duration::hours(rng.below(24 * 20) as i64),
        );
        new.title = format!("live {i}");
        let task = create(db, &new);
        for trigger in [Trigger::Claim, Trigger::AgentStarted] {
            tasks::transition_task(
                &mut conn,
                task.id,
                trigger,
                &TransitionDetails::default(),
                now,
            )
            .unwrap();
        }
        let run = Run {
            id: Uuid::new_v4(),
            task_id: task.id,
            attempt: 1,
            agent_type: AgentType::ClaudeCode,
            model: MODELS[rng.below(5) as usize].map(str::to_owned),
            cost_usd: Some(Usd::from_nanos(rng.below(2_000_000_000) as i64).unwrap()),
            input_tokens: 100,
            cache_read_tokens: 10,
            cache_write_tokens: 1,
            output_tokens: 50,
            turns: Some(4),
            outcome: RunOutcome::Succeeded,
            exit_code: Some(0),
            error_message: None,
            started_at: now,
            finished_at: Some(now),
            sandboxed: None,
        };
        write_tx::<_, DbError, _>(&mut conn, |c| {
            tasks::record_run(c, &run)?;
            let trigger = if rng.below(2) == 0 {
                Trigger::PullRequestOpened
            } else {
                Trigger::Fail
            };
            tasks::transition_task(
                c,
                task.id,
                trigger,
                &TransitionDetails {
                    pull_request: Some(agentry_domain::PullRequestRef {
                        url: "https://github.com/acme/web/pull/1".into(),
                        number: 1,
                    }),
                    ..Default::default()
                },
                now,
            )?;
            Ok(())
        })
        .unwrap();
    }
}

fn all_facts(db: &Db) -> Vec<TaskFact> {
    let mut conn = db.conn().unwrap();
    let mut out = Vec::new();
    let mut after: Option<TaskCursor> = None;
    loop {
        let page =
            tasks::list_tasks(&mut conn, &TaskFilter::default(), 200, after.as_ref()).unwrap();
        out.extend(page.tasks.into_iter().map(TaskFact::from));
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
}

async fn equivalence(db: TestDb) {
    seed(&db.db, 42);
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    let facts = all_facts(&db.db);
    for days in [1_u32, 7, 30, 45, 90, 365] {
        for repo in [
            None,
            Some(REPOS[0]),
            Some(REPOS[3]),
            Some("https://github.com/nobody/none"),
        ] {
            let mut uri = format!("/api/analytics/costs?days={days}");
            if let Some(r) = repo {
                uri.push_str(&format!("&repoUrl={r}"));
            }
            let (code, body) = call(&app, get(&uri, &t.viewer)).await;
            assert_eq!(code, 200, "{uri}: {body}");
            let window = Window::new(OffsetDateTime::now_utc().date(), days).unwrap();
            let expected =
                serde_json::to_value(report(&ReportInputs::from_tasks(window, repo, &facts)))
                    .unwrap();
            let differing: Vec<String> = expected
                .as_object()
                .unwrap()
                .keys()
                .filter(|m| body[m.as_str()] != expected[m.as_str()])
                .map(
                    |m| match (body[m.as_str()].as_array(), expected[m.as_str()].as_array()) {
                        (Some(a), Some(b)) => a
                            .iter()
                            .zip(b)
                            .position(|(x, y)| x != y)
                            .map(|i| format!("{m}[{i}]: {} vs {}", a[i], b[i]))
                            .unwrap_or(format!("{m}: lengths {} vs {}", a.len(), b.len())),
                        _ => format!("{m}: {} vs {}", body[m.as_str()], expected[m.as_str()]),
                    },
                )
                .collect();
            assert!(differing.is_empty(), "{uri}:\n{}", differing.join("\n"));
            assert_eq!(body, expected, "{uri}");
        }
    }
    // The data set exercises what it should.
    let (_, body) = call(&app, get("/api/analytics/costs?days=90", &t.viewer)).await;
    assert!(
        !body["anomalies"].as_array().unwrap().is_empty(),
        "no anomaly in the data set"
    );
    assert_eq!(body["topTasks"].as_array().unwrap().len(), 10);
    assert!(
        body["costByModel"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["model"] == "unknown")
    );
}

#[actix_web::test]
async fn the_report_from_rollups_equals_the_report_from_every_task_on_sqlite() {
    equivalence(TestDb::sqlite()).await;
}

#[actix_web::test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
async fn the_report_from_rollups_equals_the_report_from_every_task_on_postgresql() {
    let Some(db) = TestDb::postgres() else { return };
    equivalence(db).await;
}

#[actix_web::test]
async fn bad_parameters_are_refused_with_the_envelope() {
    let db = sqlite();
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    for (query, field) in [
        ("days=0", "days"),
        ("days=366", "days"),
        ("days=abc", "days"),
        ("days=7.5", "days"),
        ("days=-7", "days"),
        ("days=", "days"),
        ("days=7&days=7", "days"),
        ("repoUrl=not%20a%20repo", "repoUrl"),
        ("repoUrl=", "repoUrl"),
        (
            "repoUrl=https://github.com/a/b&repoUrl=https://github.com/a/b",
            "repoUrl",
        ),
        ("period=30", "period"),
    ] {
        let (code, body) = call(
            &app,
            get(&format!("/api/analytics/costs?{query}"), &t.viewer),
        )
        .await;
        assert_eq!(code, 400, "{query}");
        assert!(
            envelope(&body, "invalid_parameter").starts_with(&format!("{field}:")),
            "{query}: {body}"
        );
    }
    let (code, body) = call(
        &app,
        actix_web::test::TestRequest::get()
            .uri("/api/analytics/costs")
            .to_request(),
    )
    .await;
    assert_eq!(code, 401);
    envelope(&body, "unauthenticated");
}

#[actix_web::test]
async fn a_filter_that_matches_nothing_gives_zeros_and_thirty_zero_days() {
    let db = sqlite();
    seed(&db.db, 7);
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    let (code, body) = call(
        &app,
        get(
            "/api/analytics/costs?repoUrl=git@github.com:Nobody/None.git",
            &t.viewer,
        ),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["summary"],
        json!({"totalCost": "0.0000", "taskCount": 0, "tasksWithCost": 0, "avgCost": "0.0000",
               "costTrend": "0.0", "prevPeriodCost": "0.0000", "days": 30})
    );
    let daily = body["dailyCosts"].as_array().unwrap();
    assert_eq!(daily.len(), 30);
    assert!(
        daily
            .iter()
            .all(|d| d["cost"].as_f64() == Some(0.0) && d["taskCount"] == json!(0)),
        "{daily:?}"
    );
    let today = OffsetDateTime::now_utc().date();
    assert_eq!(daily[29]["date"], today.to_string());
    for member in [
        "costByRepo",
        "costByType",
        "costByModel",
        "anomalies",
        "modelSuggestions",
        "topTasks",
    ] {
        assert_eq!(body[member], json!([]), "{member}");
    }
    // And the default (all repositories) is not empty on the same data.
    let (_, body) = call(&app, get("/api/analytics/costs", &t.viewer)).await;
    assert_ne!(body["summary"]["taskCount"], json!(0));
    assert_eq!(body["dailyCosts"].as_array().unwrap().len(), 30);
    let _: Value = body;
}

#[actix_web::test]
async fn an_empty_database_gives_an_all_zero_report() {
    let db = sqlite();
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    for days in [1, 30, 365] {
        let (code, body) = call(
            &app,
            get(&format!("/api/analytics/costs?days={days}"), &t.viewer),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["summary"]["totalCost"], "0.0000");
        assert_eq!(body["summary"]["taskCount"], 0);
        assert_eq!(body["forecast"]["forecastedMonthTotal"], "0.0000");
        assert_eq!(body["dailyCosts"].as_array().unwrap().len(), days);
        assert_eq!(body["topTasks"], json!([]));
    }
}
