//! Benchmark of `GET /api/analytics/costs` (docs/contract.md#9-performance-targets; docs/benchmarks.md).
//!
//! For each size (default 10,000 / 100,000 / 1,000,000 tasks over 90 days, 50 repositories,
//! 6 models) and each backend, it imports the generated data with the real importer into a
//! fresh database, serves the real application on 127.0.0.1, and measures the median latency
//! of the endpoint over HTTP for `days=90` and `days=7`; beside it, on the same database, a
//! straightforward baseline: plain GROUP BY queries over the raw task table (the way a first
//! version would compute the report), timed as a function call (no HTTP, so the comparison
//! favours the baseline).
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_costs -- \
//!     [--sizes 10000,100000,1000000] [--requests 50] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```
//! Without `--pg` only SQLite is measured.

use std::time::Instant;

use agentry_analytics::{ReportInputs, Totals, Window, report};
use agentry_domain::{TaskState, TaskType};
use agentry_persistence::tasks::{CostWindow, costliest_in_window};
use agentry_persistence::{AnyConnection, Db};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamp};
use time::{OffsetDateTime, PrimitiveDateTime, Time};

#[path = "common/bench.rs"]
mod bench;
#[path = "common/demo.rs"]
mod demo;

use bench::{Error, ms, percentile};

#[derive(QueryableByName)]
struct Group {
    #[diesel(sql_type = Text)]
    day: String,
    #[diesel(sql_type = Text)]
    repo_url: String,
    #[diesel(sql_type = Text)]
    task_type: String,
    #[diesel(sql_type = Text)]
    model: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    tasks: i64,
    #[diesel(sql_type = BigInt)]
    costed: i64,
    #[diesel(sql_type = BigInt)]
    cost: i64,
    #[diesel(sql_type = BigInt)]
    input_tokens: i64,
    #[diesel(sql_type = BigInt)]
    output_tokens: i64,
    #[diesel(sql_type = BigInt)]
    imported_cost: i64,
}

fn midnight(d: time::Date) -> PrimitiveDateTime {
    PrimitiveDateTime::new(d, Time::MIDNIGHT)
}

/// The entries of a map keyed by pairs, as triples in key order.
fn flatten<A, B, V>(map: std::collections::BTreeMap<(A, B), V>) -> Vec<(A, B, V)> {
    map.into_iter().map(|((a, b), v)| (a, b, v)).collect()
}

/// The first-version way: GROUP BY over the raw task table for the whole span the report
/// needs, folded into the same inputs, then the same report.
fn baseline(
    conn: &mut AnyConnection,
    window: Window,
) -> Result<agentry_analytics::CostReport, Error> {
    let from = window.previous_start().min(window.month_start());
    let to = window.today().next_day().ok_or("date overflow")?;
    let select = |day: &str, p1: &str, p2: &str| {
        format!(
            "SELECT {day} AS day, repo_url, task_type, COALESCE(model_used, '') AS model, state, \
             COUNT(*) AS tasks, COUNT(cost_nanos) AS costed, \
             CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS cost, \
             CAST(COALESCE(SUM(CASE WHEN cost_nanos IS NOT NULL THEN input_tokens ELSE 0 END), 0) AS BIGINT) AS input_tokens, \
             CAST(COALESCE(SUM(CASE WHEN cost_nanos IS NOT NULL THEN output_tokens ELSE 0 END), 0) AS BIGINT) AS output_tokens, \
             CAST(COALESCE(SUM(CASE WHEN imported THEN cost_nanos ELSE 0 END), 0) AS BIGINT) AS imported_cost \
             FROM tasks WHERE created_at >= {p1} AND created_at < {p2} GROUP BY 1, 2, 3, 4, 5"
        )
    };
    let groups: Vec<Group> = match conn {
        AnyConnection::Sqlite(c) => {
            diesel::sql_query(select("substr(created_at, 1, 10)", "?", "?"))
                .bind::<Timestamp, _>(midnight(from))
                .bind::<Timestamp, _>(midnight(to))
                .load(c)?
        }
        AnyConnection::Postgresql(c) => {
            diesel::sql_query(select("to_char(created_at, 'YYYY-MM-DD')", "$1", "$2"))
                .bind::<Timestamp, _>(midnight(from))
                .bind::<Timestamp, _>(midnight(to))
                .load(c)?
        }
    };
    let mut inputs = ReportInputs::from_tasks(window, None, &[]);
    let mut by_repo = std::collections::BTreeMap::<String, Totals>::new();
    let mut by_type = std::collections::BTreeMap::<TaskType, Totals>::new();
    let mut by_model = std::collections::BTreeMap::<Option<String>, Totals>::new();
    let mut by_repo_model = std::collections::BTreeMap::<(String, String), Totals>::new();
    let mut by_model_all = std::collections::BTreeMap::<String, Totals>::new();
    let mut daily = std::collections::BTreeMap::<time::Date, Totals>::new();
    let mut outcomes = std::collections::BTreeMap::<
        (String, Option<String>),
        agentry_analytics::OutcomeTotals,
    >::new();
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    for g in groups {
        let day = time::Date::parse(&g.day, fmt)?;
        let state: TaskState = g.state.parse()?;
        let task_type: TaskType = g.task_type.parse()?;
        let t = Totals {
            tasks: g.tasks,
            costed: g.costed,
            cost: rust_decimal::Decimal::from_i128_with_scale(i128::from(g.cost), 9),
            succeeded: if matches!(state, TaskState::PrOpened | TaskState::Completed) {
                g.costed
            } else {
                0
            },
            input_tokens: g.input_tokens,
            output_tokens: g.output_tokens,
            imported_cost: rust_decimal::Decimal::from_i128_with_scale(
                i128::from(g.imported_cost),
                9,
            ),
        };
        if window.in_previous(day) {
            inputs.previous.add(&t);
        }
        if window.in_month_to_date(day) {
            inputs.month_to_date.add(&t);
        }
        if !window.contains(day) {
            continue;
        }
        // Imported tasks have no parent: each is an outcome unit by itself.
        let merged = task_type == TaskType::Coding && state == TaskState::Completed;
        let failed = matches!(state, TaskState::Failed | TaskState::Cancelled);
        let outcome = agentry_analytics::OutcomeTotals {
            merged: if merged { g.tasks } else { 0 },
            costed: t.costed,
            cost: t.cost,
            merged_cost: if merged {
                t.cost
            } else {
                rust_decimal::Decimal::ZERO
            },
            failed_cost: if failed {
                t.cost
            } else {
                rust_decimal::Decimal::ZERO
            },
            // Imported history has no revision rounds or runs.
            merged_revisions: 0,
            revision_cost: rust_decimal::Decimal::ZERO,
        };
        let outcome_model = (!g.model.is_empty()).then(|| g.model.clone());
        outcomes
            .entry((g.repo_url.clone(), outcome_model))
            .or_default()
            .add(&outcome);
        daily.entry(day).or_default().add(&t);
        by_repo.entry(g.repo_url.clone()).or_default().add(&t);
        by_type.entry(task_type).or_default().add(&t);
        let model = (!g.model.is_empty()).then(|| g.model.clone());
        by_model.entry(model).or_default().add(&t);
        if task_type == TaskType::Coding && !g.model.is_empty() {
            by_repo_model
                .entry((g.repo_url.clone(), g.model.clone()))
                .or_default()
                .add(&t);
            by_model_all.entry(g.model.clone()).or_default().add(&t);
        }
    }
    inputs.daily = daily.into_iter().collect();
    inputs.outcomes = flatten(outcomes);
    inputs.by_repo = by_repo.into_iter().collect();
    inputs.by_type = by_type.into_iter().collect();
    inputs.by_model = by_model.into_iter().collect();
    inputs.coding_by_repo_model = flatten(by_repo_model);
    inputs.coding_by_model_all_repos = by_model_all.into_iter().collect();
    let start = window.start().with_time(Time::MIDNIGHT).assume_utc();
    let end = to.with_time(Time::MIDNIGHT).assume_utc();
    let window = CostWindow {
        from: start,
        to: end,
        repo_url: None,
        costed: inputs.by_repo.iter().map(|(_, t)| t.costed).sum(),
    };
    inputs.top_candidates = costliest_in_window(conn, window, 0, Some(10))?
        .into_iter()
        .map(agentry_analytics::TaskFact::from)
        .collect();
    for (repo_url, t) in &inputs.by_repo {
        let nanos = (t.cost * rust_decimal::Decimal::from(1_000_000_000)).normalize();
        let Some(min) =
            agentry_analytics::anomaly_threshold_nanos(t.costed, nanos.to_string().parse()?)
        else {
            continue;
        };
        let window = CostWindow {
            from: start,
            to: end,
            repo_url: Some(repo_url),
            costed: t.costed,
        };
        let found = costliest_in_window(conn, window, min, None)?;
        inputs
            .anomaly_candidates
            .extend(found.into_iter().map(agentry_analytics::TaskFact::from));
    }
    Ok(report(&inputs))
}

fn measure(backend: &str, url: &str, size: u64, requests: usize) -> Result<(), Error> {
    let db = Db::connect(url, 8)?;
    db.migrate()?;
    let mut body = Vec::new();
    demo::write_tasks(&mut body, size, 90, OffsetDateTime::now_utc())?;
    let started = Instant::now();
    let imported = agentry_service::import::import(&mut *db.conn()?, &body)?;
    let import_time = started.elapsed();
    drop(body);
    let token = bench::viewer_token(&db)?;
    // The cost report never calls the code host. Benchmarks run no agents.
    let server = bench::serve(bench::offline_state(&db)?)?;
    let addr = server.addr;
    let client = reqwest::blocking::Client::new();
    let mut line = format!(
        "{backend:8} {size:>9} tasks (import {:.1} s)",
        import_time.as_secs_f64()
    );
    let window90 = Window::new(OffsetDateTime::now_utc().date(), 90)?;
    for days in [90, 7] {
        let uri = format!("http://{addr}/api/analytics/costs?days={days}");
        let (mut times, _) = bench::timed_gets(&client, &uri, &token, requests)?;
        line.push_str(&format!(
            "  days={days}: {:.2} ms",
            ms(percentile(&mut times, 50))
        ));
    }
    // The baseline on the same database; it must agree with the endpoint.
    let mut conn = db.conn()?;
    let mut times = Vec::new();
    let mut baseline_report = None;
    for _ in 0..5 {
        let t = Instant::now();
        baseline_report = Some(baseline(&mut conn, window90)?);
        times.push(t.elapsed());
    }
    let served: serde_json::Value = serde_json::from_slice(
        &client
            .get(format!("http://{addr}/api/analytics/costs?days=90"))
            .bearer_auth(&token)
            .send()?
            .bytes()?,
    )?;
    if serde_json::to_value(baseline_report)? != served {
        return Err("the baseline and the endpoint disagree".into());
    }
    line.push_str(&format!(
        "  baseline days=90: {:.1} ms  ({} imported)",
        ms(percentile(&mut times, 50)),
        imported.imported
    ));
    // The endpoint serves a kept report while nothing changed (a memo hit); this is the
    // computation behind a miss: the rollup reads and the report, as a function call.
    let mut times = Vec::with_capacity(requests);
    for _ in 0..requests {
        let t = Instant::now();
        let inputs = agentry_service::costs::load_inputs(&mut conn, window90, None)?;
        std::hint::black_box(report(&inputs));
        times.push(t.elapsed());
    }
    line.push_str(&format!(
        "  computed days=90: {:.2} ms",
        ms(percentile(&mut times, 50))
    ));
    println!("{line}");
    server.stop()
}

fn main() -> Result<(), Error> {
    let args = bench::size_args(&[10_000, 100_000, 1_000_000]);
    println!(
        "median latency of GET /api/analytics/costs over HTTP ({} requests each)",
        args.requests
    );
    bench::each_backend_and_size(&args, "bench", measure)
}
