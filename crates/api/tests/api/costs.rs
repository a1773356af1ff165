//! `GET /api/analytics/costs`'s parameters, the imported part of its month, and the cost
//! counter `/metrics` exposes. The report's other figures are tested where the service
//! computes them, in `agentry-service`.

use crate::common::cost_data::{REPOS, pay, seed, start};
use crate::common::*;
use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Usd};
use agentry_persistence::DbError;
use agentry_persistence::tasks::{self, ImportTask};
use agentry_persistence::test_support::TestDb;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

#[actix_web::test]
async fn bad_parameters_are_refused_with_the_envelope() {
    let (_db, t, app) = sqlite_app().await;
    let queries = [
        "days=0",
        "days=366",
        "days=abc",
        "days=7.5",
        "days=-7",
        "days=",
        "days=7&days=7",
        "repoUrl=not%20a%20repo",
        "repoUrl=",
        "repoUrl=https://github.com/a/b&repoUrl=https://github.com/a/b",
        "period=30",
    ];
    assert_bad_parameters(&app, &t.viewer, "/api/analytics/costs", &queries).await;
    assert_unauthenticated(&app, anonymous_get("/api/analytics/costs")).await;
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
    start(&mut conn, coding);
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

agentry_testkit::on_both_backends!(#[actix_web::test] the_recorded_run_cost_is_a_prometheus_counter => run_cost_counter);

/// An imported record of `repo` created at `at`, costing `cost` (`None`: no cost).
fn imported(repo: &str, cost: Option<&str>, at: OffsetDateTime) -> ImportTask {
    ImportTask {
        id: Uuid::new_v4(),
        title: "imported".into(),
        repo_url: RepoUrl::parse(repo).unwrap(),
        task_type: TaskType::Coding,
        state: TaskState::Completed,
        agent_type: AgentType::ClaudeCode,
        model_used: Some("opus".into()),
        cost_usd: cost.map(|c| Usd::parse(c).unwrap()),
        input_tokens: 10,
        output_tokens: 1,
        created_at: at,
        pr_url: None,
        pr_number: None,
        issue_number: None,
    }
}

async fn month_imported_cost(db: TestDb) {
    let app = service(&db.db).await;
    let t = tokens(&db.db);
    let (status, _) = client(&app, &t.admin)
        .send("PUT", "/api/budget", &json!({"monthlyBudgetUsd": "300"}))
        .await;
    assert_eq!(status, 200);
    let now = OffsetDateTime::now_utc();
    let month_start = now
        .replace_day(1)
        .unwrap()
        .replace_time(time::Time::MIDNIGHT);
    let mut conn = db.db.conn().unwrap();
    // agentry's own run this month: 1.25, on acme/web.
    let own = create(&db.db, &new_task(REPOS[0], TaskType::Coding, now)).id;
    start(&mut conn, own);
    pay(&mut conn, own, Some("opus"), 1_250_000_000);
    // Imported history: 343.70 (acme/web) and 0.50 (acme/api) this month, an uncosted record,
    // and 100 of last month.
    let records = [
        imported(REPOS[0], Some("343.70"), now),
        imported(REPOS[1], Some("0.5"), now),
        imported(REPOS[1], None, now),
        imported(REPOS[0], Some("100"), month_start - time::Duration::days(1)),
    ];
    tasks::import_tasks::<DbError, _>(&mut conn, records.into_iter().map(Ok)).unwrap();

    let viewer = client(&app, &t.viewer);
    let (status, r) = viewer.report("days=30").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["forecast"]["monthCostSoFar"], "345.4500");
    assert_eq!(r["forecast"]["monthImportedCostSoFar"], "344.2000");
    // The budget counts the own run only.
    assert_eq!(r["budgets"][0]["scope"], "instance");
    assert_eq!(r["budgets"][0]["monthToDateUsd"], "1.2500");
    let (_, r) = viewer.report(&format!("days=7&repoUrl={}", REPOS[0])).await;
    assert_eq!(r["forecast"]["monthCostSoFar"], "344.9500");
    assert_eq!(r["forecast"]["monthImportedCostSoFar"], "343.7000");
    let (_, r) = viewer.report(&format!("days=7&repoUrl={}", REPOS[2])).await;
    assert_eq!(r["forecast"]["monthCostSoFar"], "0.0000");
    assert_eq!(r["forecast"]["monthImportedCostSoFar"], "0.0000");
}

agentry_testkit::on_both_backends!(#[actix_web::test] the_report_says_how_much_of_the_month_is_imported => month_imported_cost);
