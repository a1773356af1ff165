//! `GET /api/analytics/costs`: validation, the empty report, and equivalence of the
//! rollup-fed report with the straightforward one computed from every task, on a randomized
//! data set (both backends). The straightforward path is itself checked against an
//! independent reference implementation in agentry-analytics' tests.

use crate::common::*;
use agentry_analytics::{ReportInputs, TaskFact, Window, report};
use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Trigger, Usd};
use agentry_persistence::tasks::{
    self, ImportTask, Run, TaskCursor, TaskFilter, TransitionDetails,
};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{AnyConnection, Db, DbError, rollups, write_tx};
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
            model: MODELS[rng.below(5) as usize].map(str::to_owned),
            cost_usd: Some(Usd::from_nanos(rng.below(2_000_000_000) as i64).unwrap()),
            input_tokens: 100,
            cache_read_tokens: 10,
            cache_write_tokens: 1,
            output_tokens: 50,
            turns: Some(4),
            ..agentry_persistence::test_support::succeeded_run(task.id, 1, now)
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

fn step(conn: &mut AnyConnection, id: Uuid, trigger: Trigger) {
    tasks::transition_task(
        conn,
        id,
        trigger,
        &TransitionDetails {
            pull_request: (trigger == Trigger::PullRequestOpened).then(|| {
                agentry_domain::PullRequestRef {
                    url: "https://github.com/acme/web/pull/2".into(),
                    number: 2,
                }
            }),
            ..Default::default()
        },
        OffsetDateTime::now_utc(),
    )
    .unwrap();
}

fn pay(conn: &mut AnyConnection, id: Uuid, model: Option<&str>, nanos: i64) {
    let attempt = tasks::get_task(conn, id).unwrap().attempt;
    let now = OffsetDateTime::now_utc();
    tasks::record_run(
        conn,
        &Run {
            model: model.map(str::to_owned),
            cost_usd: Some(Usd::from_nanos(nanos).unwrap()),
            input_tokens: 10,
            output_tokens: 5,
            turns: Some(1),
            ..agentry_persistence::test_support::succeeded_run(id, attempt, now)
        },
    )
    .unwrap();
}

/// Live outcome units through the real write paths: coding tasks with review subtasks
/// (created on a later day than their coding task, costed before and after the coding task
/// ends), revision rounds with costed revision runs, merges, closes, retries after a
/// failure, cancellations, a model that changes after the reviews cost something, and
/// reviews without a parent.
fn seed_outcomes(db: &Db, seed: u64) {
    let mut rng = Rng(seed);
    let now = OffsetDateTime::now_utc();
    let mut conn = db.conn().unwrap();
    for i in 0..32 {
        let created = now - Duration::hours(rng.below(24 * 20) as i64);
        let mut new = new_task(REPOS[i % 4], TaskType::Coding, created);
        new.title = format!("unit {i}");
        let coding = create(db, &new).id;
        let model = MODELS[rng.below(5) as usize];
        step(&mut conn, coding, Trigger::Claim);
        step(&mut conn, coding, Trigger::AgentStarted);
        pay(
            &mut conn,
            coding,
            model,
            rng.below(3_000_000_000) as i64 + 1,
        );
        if rng.below(6) == 0 {
            step(&mut conn, coding, Trigger::Cancel);
            continue;
        }
        if rng.below(4) == 0 {
            // A failed attempt, then a retry that goes on.
            step(&mut conn, coding, Trigger::Fail);
            if rng.below(3) == 0 {
                continue;
            }
            step(&mut conn, coding, Trigger::Retry);
            step(&mut conn, coding, Trigger::Claim);
            step(&mut conn, coding, Trigger::AgentStarted);
            pay(&mut conn, coding, model, rng.below(2_000_000_000) as i64);
        }
        step(&mut conn, coding, Trigger::PullRequestOpened);
        // Revision rounds: review feedback sends the task back; each round's run costs.
        for _ in 0..rng.below(3) {
            step(&mut conn, coding, Trigger::RevisionRequested);
            step(&mut conn, coding, Trigger::Claim);
            step(&mut conn, coding, Trigger::AgentStarted);
            pay(&mut conn, coding, model, rng.below(1_000_000_000) as i64);
            step(&mut conn, coding, Trigger::PullRequestOpened);
        }
        let mut reviews = Vec::new();
        for _ in 0..rng.below(3) {
            let mut review = new_task(
                REPOS[i % 4],
                TaskType::Review,
                now - Duration::minutes(rng.below(60) as i64),
            );
            review.parent_task_id = Some(coding);
            let review = create(db, &review).id;
            step(&mut conn, review, Trigger::Claim);
            step(&mut conn, review, Trigger::AgentStarted);
            pay(
                &mut conn,
                review,
                Some("haiku"),
                rng.below(500_000_000) as i64,
            );
            reviews.push(review);
        }
        if rng.below(4) == 0 {
            // The coding task's model changes after its reviews cost something.
            pay(&mut conn, coding, Some("o3"), rng.below(100_000_000) as i64);
        }
        match rng.below(3) {
            0 => step(&mut conn, coding, Trigger::PullRequestMerged),
            1 => step(&mut conn, coding, Trigger::PullRequestClosed),
            _ => {}
        }
        // Reviews finish (and cost more) after the coding task ended.
        for review in reviews {
            if rng.below(2) == 0 {
                pay(
                    &mut conn,
                    review,
                    Some("haiku"),
                    rng.below(300_000_000) as i64,
                );
            }
            let end = if rng.below(3) == 0 {
                Trigger::Fail
            } else {
                Trigger::ReviewPosted
            };
            step(&mut conn, review, end);
        }
    }
    for repo in REPOS {
        // Reviews without a parent: units by themselves.
        let review = create(db, &new_task(repo, TaskType::Review, now)).id;
        step(&mut conn, review, Trigger::Claim);
        step(&mut conn, review, Trigger::AgentStarted);
        pay(&mut conn, review, Some("haiku"), 123_456_789);
        step(&mut conn, review, Trigger::Fail);
    }
}

/// The outcome columns of the cumulative rollup, in key order.
fn outcome_columns(db: &Db) -> Vec<(String, String, String, String, [i64; 7])> {
    agentry_persistence::test_support::cumulative_rows(&mut db.conn().unwrap())
        .into_iter()
        .map(|(repo, kind, model, day, sums)| {
            let mut outcomes = [0; 7];
            outcomes.copy_from_slice(&sums[6..]);
            (repo, kind, model, day, outcomes)
        })
        .filter(|r| r.4 != [0; 7])
        .collect()
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
    seed_outcomes(&db.db, 43);
    // The maintained outcome rollups equal a rebuild from the task table.
    let maintained = outcome_columns(&db.db);
    write_tx::<_, DbError, _>(&mut db.db.conn().unwrap(), rollups::rebuild).unwrap();
    assert_eq!(
        outcome_columns(&db.db),
        maintained,
        "outcome rollups vs a rebuild"
    );
    // The migration's backfill of existing data gives the same columns (the five it fills:
    // the revision columns came later, without a backfill, when no revision had happened).
    let backfilled = |rows: Vec<(String, String, String, String, [i64; 7])>| {
        rows.into_iter()
            .map(|(a, b, c, d, s)| (a, b, c, d, [s[0], s[1], s[2], s[3], s[4]]))
            .filter(|r| r.4 != [0; 5])
            .collect::<Vec<_>>()
    };
    {
        use diesel::connection::SimpleConnection;
        let up = include_str!("../../../../migrations/2026-11-23-000010_outcome_rollups/up.sql");
        let (_, backfill) = up.split_once("-- Backfill").unwrap();
        let (_, backfill) = backfill.split_once('\n').unwrap();
        let mut conn = db.db.conn().unwrap();
        conn.batch_execute(
            "UPDATE cost_cumulative SET outcome_merged = 0, outcome_costed = 0, \
             outcome_cost_nanos = 0, merged_cost_nanos = 0, failed_cost_nanos = 0",
        )
        .unwrap();
        assert!(backfilled(outcome_columns(&db.db)).is_empty());
        conn.batch_execute(backfill).unwrap();
    }
    assert_eq!(
        backfilled(outcome_columns(&db.db)),
        backfilled(maintained),
        "outcome rollups vs the backfill"
    );
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
    let (_, body) = client(&app, &t.viewer).report("days=90").await;
    assert!(
        !body["anomalies"].as_array().unwrap().is_empty(),
        "no anomaly in the data set"
    );
    assert_eq!(body["topTasks"].as_array().unwrap().len(), 10);
    let outcomes = &body["outcomes"];
    assert!(
        outcomes["mergedPullRequests"].as_i64().unwrap() > 0,
        "{outcomes}"
    );
    assert_ne!(outcomes["failedCost"], "0.0000", "{outcomes}");
    assert!(
        outcomes["byModel"].as_array().unwrap().len() > 2,
        "{outcomes}"
    );
    assert!(
        body["costByModel"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["model"] == "unknown")
    );
}

on_both_backends!(the_report_from_rollups_equals_the_report_from_every_task => equivalence);

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
        let (code, body) = client(&app, &t.viewer).report(query).await;
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
    let (_, body) = client(&app, &t.viewer).report("").await;
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
        let (code, body) = client(&app, &t.viewer)
            .report(&format!("days={days}"))
            .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["summary"]["totalCost"], "0.0000");
        assert_eq!(body["summary"]["taskCount"], 0);
        assert_eq!(body["forecast"]["forecastedMonthTotal"], "0.0000");
        assert_eq!(body["dailyCosts"].as_array().unwrap().len(), days);
        assert_eq!(body["topTasks"], json!([]));
    }
}

async fn metrics_text<S: TestApp>(app: &S, token: &str) -> String {
    let res = actix_web::test::call_service(app, get("/metrics", token)).await;
    assert_eq!(res.status(), 200);
    String::from_utf8(actix_web::test::read_body(res).await.to_vec()).unwrap()
}

/// The value of the `agentry_cost_usd_total` series with these labels, if exposed.
fn cost_series(text: &str, repo: &str, model: &str, task_type: &str) -> Option<String> {
    let labels = format!(r#"{{model="{model}",repo="{repo}",task_type="{task_type}"}}"#);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("agentry_cost_usd_total{labels} ")))
        .map(str::to_owned)
}

async fn run_cost_counter(db: TestDb) {
    let app = service(&db.db).await;
    let t = tokens(&db.db);
    // Per-repository series name connected repositories only.
    let repo_ids: Vec<Uuid> = REPOS.iter().map(|r| connect_url(&db.db, r)).collect();
    // Nothing recorded yet: no series.
    assert!(
        !metrics_text(&app, &t.viewer)
            .await
            .contains("agentry_cost_usd_total{")
    );

    let now = OffsetDateTime::now_utc();
    let mut conn = db.db.conn().unwrap();
    let coding = create(&db.db, &new_task(REPOS[0], TaskType::Coding, now)).id;
    step(&mut conn, coding, Trigger::Claim);
    step(&mut conn, coding, Trigger::AgentStarted);
    // 0.1 + 0.2 is exactly 0.3 (in floating point it would be 0.30000000000000004).
    pay(&mut conn, coding, Some("opus"), 100_000_000);
    pay(&mut conn, coding, Some("opus"), 200_000_000);
    pay(&mut conn, coding, None, 1);
    let review = create(&db.db, &new_task(REPOS[1], TaskType::Review, now)).id;
    pay(&mut conn, review, Some("haiku"), 1_234_567_891);

    let text = metrics_text(&app, &t.viewer).await;
    assert!(
        text.contains("# TYPE agentry_cost_usd_total counter"),
        "{text}"
    );
    assert_eq!(
        cost_series(&text, REPOS[0], "opus", "coding").as_deref(),
        Some("0.3"),
        "{text}"
    );
    assert_eq!(
        cost_series(&text, REPOS[0], "unknown", "coding").as_deref(),
        Some("0.000000001"),
        "{text}"
    );
    assert_eq!(
        cost_series(&text, REPOS[1], "haiku", "review").as_deref(),
        Some("1.234567891"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("agentry_cost_usd_total{"))
            .count(),
        3,
        "{text}"
    );

    // Imported costs are not run costs; `seed` also records 40 live runs: each series is
    // the exact sum of the ledger, and there is no other.
    seed(&db.db, 5);
    let text = metrics_text(&app, &t.viewer).await;
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("agentry_cost_usd_total{"))
        .collect();
    let runs: Vec<(String, String, Option<String>, i64)> = {
        use agentry_persistence::schema::{task_runs as tr, tasks as t};
        use diesel::prelude::*;
        tr::table
            .inner_join(t::table.on(t::id.eq(tr::task_id)))
            .filter(tr::cost_nanos.is_not_null())
            .select((
                t::repo_url,
                t::task_type,
                tr::model,
                tr::cost_nanos.assume_not_null(),
            ))
            .load(&mut conn)
            .unwrap()
    };
    let mut expected: std::collections::BTreeMap<(String, String, String), i64> =
        std::collections::BTreeMap::new();
    for (repo, task_type, model, nanos) in runs {
        let model = model.unwrap_or_else(|| "unknown".to_owned());
        *expected.entry((repo, model, task_type)).or_default() += nanos;
    }
    assert!(expected.len() > 5, "{expected:?}");
    for ((repo, model, task_type), nanos) in &expected {
        let exact = rust_decimal::Decimal::from_i128_with_scale(i128::from(*nanos), 9).normalize();
        let shown: f64 = cost_series(&text, repo, model, task_type)
            .unwrap_or_else(|| panic!("no series for {repo} {model} {task_type}: {text}"))
            .parse()
            .unwrap();
        assert_eq!(shown, exact.to_string().parse::<f64>().unwrap());
    }
    assert_eq!(series.len(), expected.len(), "{series:?}");

    // A disconnected repository's series are gone; the others stay as they were.
    agentry_persistence::repos::disconnect_repository(
        &mut conn,
        repo_ids[3],
        agentry_persistence::now(),
    )
    .unwrap();
    let after = metrics_text(&app, &t.viewer).await;
    assert!(!after.contains(REPOS[3]), "{after}");
    let kept: Vec<&str> = series
        .iter()
        .copied()
        .filter(|l| !l.contains(REPOS[3]))
        .collect();
    let now_series: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("agentry_cost_usd_total{"))
        .collect();
    assert_eq!(now_series, kept);
}

on_both_backends!(the_recorded_run_cost_is_a_prometheus_counter => run_cost_counter);

/// The summary's total and the top task's (title, state) of a report answer.
fn total_and_top(body: &Value) -> (Value, Value, Value) {
    let top = &body["topTasks"][0];
    (
        body["summary"]["totalCost"].clone(),
        top["title"].clone(),
        top["state"].clone(),
    )
}

/// A computed report is served again while nothing it is computed from changed, and never
/// after a write that feeds it: a recorded run, a state change that moves no sum, a budget.
async fn kept_report(db: TestDb) {
    use diesel::connection::SimpleConnection;
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    let now = OffsetDateTime::now_utc();
    let mut conn = db.db.conn().unwrap();
    let id = create(&db.db, &new_task(REPOS[0], TaskType::Coding, now)).id;
    let uncosted = create(&db.db, &new_task(REPOS[1], TaskType::Coding, now)).id;
    step(&mut conn, id, Trigger::Claim);
    pay(&mut conn, id, Some("opus"), 100_000_000);
    let uri = "/api/analytics/costs?days=30";
    let (code, first) = call(&app, get(uri, &t.viewer)).await;
    assert_eq!(code, 200, "{first}");
    let (total, title, state) = total_and_top(&first);
    assert_eq!((total, title), (json!("0.1000"), json!("A task")));

    // An edit behind the write paths' back (no rollup write): the kept report is served.
    conn.batch_execute("UPDATE tasks SET title = 'Renamed by hand'")
        .unwrap();
    let (_, again) = call(&app, get(uri, &t.viewer)).await;
    assert_eq!(again, first, "served from the kept report");
    // Other parameters are another report, computed now.
    let (_, other) = client(&app, &t.viewer).report("days=7").await;
    assert_eq!(total_and_top(&other).1, json!("Renamed by hand"));

    // A recorded run: the next report shows it.
    pay(&mut conn, id, Some("opus"), 200_000_000);
    let (_, paid) = call(&app, get(uri, &t.viewer)).await;
    assert_eq!(
        total_and_top(&paid),
        (json!("0.3000"), json!("Renamed by hand"), state.clone())
    );

    // A state change that moves no sum (provisioning → running): the top task's state is
    // new.
    step(&mut conn, id, Trigger::AgentStarted);
    let (_, opened) = call(&app, get(uri, &t.viewer)).await;
    assert_ne!(total_and_top(&opened).2, state, "{opened}");
    assert_eq!(total_and_top(&opened).0, json!("0.3000"));

    // A budget set: the report's budgets show it.
    assert_eq!(opened["budgets"], json!([]));
    agentry_persistence::budgets::set_instance_budget(
        &mut conn,
        Some(Usd::parse("10").unwrap()),
        now,
    )
    .unwrap();
    let (_, budgeted) = call(&app, get(uri, &t.viewer)).await;

    // The claim of a task without a cost moves nothing the report shows: still kept.
    conn.batch_execute("UPDATE tasks SET title = 'Renamed again'")
        .unwrap();
    step(&mut conn, uncosted, Trigger::Claim);
    let (_, claimed) = call(&app, get(uri, &t.viewer)).await;
    assert_eq!(claimed, budgeted, "served from the kept report");
    assert_eq!(
        budgeted["budgets"].as_array().map(Vec::len),
        Some(1),
        "{budgeted}"
    );
}

on_both_backends!(a_kept_report_is_served_until_a_write_feeds_it => kept_report);

/// Revision rounds through the persistence write paths (feedback → queued → a revision run →
/// the pull request again), then the merge or the close: `outcomes.revisionCost` and
/// `avgRevisionsPerMergedPullRequest`, overall and per repository, and the merged pull
/// request's cost still holding every run.
async fn revision_outcomes(db: TestDb) {
    use agentry_persistence::schema::task_runs as r;
    use diesel::prelude::*;
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    let now = OffsetDateTime::now_utc();
    let mut conn = db.db.conn().unwrap();
    let opened = |conn: &mut AnyConnection, repo: &str, nanos: i64| {
        let id = create(&db.db, &new_task(repo, TaskType::Coding, now)).id;
        step(conn, id, Trigger::Claim);
        step(conn, id, Trigger::AgentStarted);
        pay(conn, id, Some("opus"), nanos);
        step(conn, id, Trigger::PullRequestOpened);
        id
    };
    let revise = |conn: &mut AnyConnection, id: Uuid, nanos: i64| {
        step(conn, id, Trigger::RevisionRequested);
        step(conn, id, Trigger::Claim);
        step(conn, id, Trigger::AgentStarted);
        pay(conn, id, Some("opus"), nanos);
    };
    // Two rounds (0.25 and 0.125), merged while the second runs: 1.375 in all.
    let twice = opened(&mut conn, REPOS[0], 1_000_000_000);
    revise(&mut conn, twice, 250_000_000);
    step(&mut conn, twice, Trigger::PullRequestOpened);
    revise(&mut conn, twice, 125_000_000);
    step(&mut conn, twice, Trigger::PullRequestMerged);
    // Merged without a round.
    let plain = opened(&mut conn, REPOS[0], 500_000_000);
    step(&mut conn, plain, Trigger::PullRequestMerged);
    // One round (0.1), then the pull request was closed.
    let closed = opened(&mut conn, REPOS[1], 200_000_000);
    revise(&mut conn, closed, 100_000_000);
    step(&mut conn, closed, Trigger::PullRequestClosed);

    let twice_task = tasks::get_task(&mut conn, twice).unwrap();
    assert_eq!(twice_task.state, TaskState::Completed);
    assert_eq!(twice_task.revisions, 2);
    assert_eq!(twice_task.revision_cost_usd, Usd::parse("0.375").unwrap());
    assert_eq!(twice_task.cost_usd, Some(Usd::parse("1.375").unwrap()));
    let triggers: Vec<String> = r::table
        .filter(r::task_id.eq(twice.to_string()))
        .order(r::attempt)
        .select(r::run_trigger)
        .load(&mut conn)
        .unwrap();
    assert_eq!(triggers, ["assignment", "revision", "revision"]);

    let (code, body) = client(&app, &t.viewer).report("days=30").await;
    assert_eq!(code, 200, "{body}");
    let o = &body["outcomes"];
    assert_eq!(o["mergedPullRequests"], json!(2), "{o}");
    // Every run of the merged tasks, revision runs included: 1.375 + 0.5.
    assert_eq!(o["mergedCost"], json!("1.8750"), "{o}");
    assert_eq!(o["costPerMergedPullRequest"], json!("0.9375"), "{o}");
    assert_eq!(o["failedCost"], json!("0.3000"), "{o}");
    // The revision runs of every unit: 0.25 + 0.125 + 0.1.
    assert_eq!(o["revisionCost"], json!("0.4750"), "{o}");
    // 2 rounds over 2 merged pull requests (the closed one's round is not counted).
    assert_eq!(o["avgRevisionsPerMergedPullRequest"], json!(1.0), "{o}");
    let repo = |url: &str| {
        o["byRepo"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["repoUrl"] == url)
            .unwrap_or_else(|| panic!("{o}"))
            .clone()
    };
    assert_eq!(repo(REPOS[0])["revisionCost"], json!("0.3750"), "{o}");
    assert_eq!(
        repo(REPOS[0])["avgRevisionsPerMergedPullRequest"],
        json!(1.0)
    );
    assert_eq!(repo(REPOS[1])["revisionCost"], json!("0.1000"), "{o}");
    assert_eq!(
        repo(REPOS[1])["avgRevisionsPerMergedPullRequest"],
        json!(null)
    );
    let opus = &o["byModel"][0];
    assert_eq!(opus["model"], json!("opus"), "{o}");
    assert_eq!(opus["revisionCost"], json!("0.4750"), "{o}");
    assert_eq!(opus["avgRevisionsPerMergedPullRequest"], json!(1.0), "{o}");

    // The maintained rollups equal a rebuild from the task table.
    let maintained = outcome_columns(&db.db);
    write_tx::<_, DbError, _>(&mut db.db.conn().unwrap(), rollups::rebuild).unwrap();
    assert_eq!(outcome_columns(&db.db), maintained);
}

on_both_backends!(revision_cost_and_rounds_per_merged_pull_request => revision_outcomes);
