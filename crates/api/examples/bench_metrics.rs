//! Benchmark of `GET /metrics` (docs/benchmarks.md): the time of one scrape over HTTP at a
//! given number of recorded agent runs.
//!
//! For each size (default 100,000 and 1,000,000 runs; 10 runs per task, 60 repositories of
//! which 50 are connected and 10 with a monthly budget, 6 models and unknown, an instance
//! budget, a refused connection on every fourth task) and each backend, it fills a fresh
//! database with bulk SQL, fills the scrape's rollups with the migration's own backfill
//! statements (what `record_run` and `record_blocked` would have written one by one), serves
//! the real application on 127.0.0.1 (2 workers) and sends 5 warm-up scrapes, then
//! `--requests` timed ones with a viewer token, and prints the median and the 90th
//! percentile. Beside it, on the same database, the scrape as it was before the rollups
//! (the GROUP BY over the run ledger, the budgets' month scans and the refusals' join),
//! timed as a function call (no HTTP).
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_metrics -- \
//!     [--sizes 100000,1000000] [--requests 50] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```
//! Without `--pg` only SQLite is measured.

use std::time::Instant;

use agentry_domain::Usd;
use agentry_persistence::repos;
use agentry_persistence::{AnyConnection, Db};
use agentry_testkit::sql::statements_starting_with;
use diesel::prelude::*;
use time::OffsetDateTime;

#[path = "common/bench.rs"]
mod bench;

use bench::{Error, ms, percentile};

/// The migration that created the scrape's rollups; its `INSERT`s fill them from the ledgers.
const ROLLUP_MIGRATION: &str =
    include_str!("../../../migrations/2026-11-26-000003_metrics_rollups/up.sql");

const RUNS_PER_TASK: u64 = 10;
const REPOS: u64 = 60;
const CONNECTED: u64 = 50;

fn exec(conn: &mut AnyConnection, sql: &str) -> Result<(), Error> {
    match conn {
        AnyConnection::Sqlite(c) => diesel::sql_query(sql).execute(c)?,
        AnyConnection::Postgresql(c) => diesel::sql_query(sql).execute(c)?,
    };
    Ok(())
}

/// `INSERT INTO {head} SELECT {select} FROM <0..n as i> {tail}`, for either backend.
fn insert_range(
    conn: &mut AnyConnection,
    n: u64,
    head: &str,
    select: &str,
    tail: &str,
) -> Result<(), Error> {
    let last = n.saturating_sub(1);
    let sql = match conn {
        AnyConnection::Sqlite(_) => format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
             INSERT INTO {head} SELECT {select} FROM n {tail}"
        ),
        AnyConnection::Postgresql(_) => format!(
            "INSERT INTO {head} SELECT {select} FROM generate_series(CAST(0 AS BIGINT), {last}) AS n(i) {tail}"
        ),
    };
    exec(conn, &sql)
}

/// `runs` runs over `runs / 10` tasks, this month, and the rollups filled from them.
fn seed(db: &Db, runs: u64, now: OffsetDateTime) -> Result<(), Error> {
    let mut conn = db.conn()?;
    let mut ids = Vec::new();
    for k in 0..REPOS {
        let repo = bench::connect_repo(&mut conn, "bench", &format!("repo-{k}"), now)?;
        if k >= CONNECTED {
            repos::disconnect_repository(&mut conn, repo.id, now)?;
        }
        ids.push(repo.id);
    }
    exec(
        &mut conn,
        "CREATE TABLE bench_repos (k BIGINT PRIMARY KEY, id TEXT NOT NULL, url TEXT NOT NULL)",
    )?;
    for (k, id) in ids.iter().enumerate() {
        exec(
            &mut conn,
            &format!(
                "INSERT INTO bench_repos (k, id, url) VALUES ({k}, '{id}', \
                 'https://github.com/bench/repo-{k}')"
            ),
        )?;
    }
    exec(
        &mut conn,
        "UPDATE repositories SET monthly_budget_nanos = 1000000000000 \
         WHERE id IN (SELECT id FROM bench_repos WHERE k < 10)",
    )?;
    agentry_persistence::budgets::set_instance_budget(&mut conn, Some(Usd::parse("100000")?), now)?;
    let tasks = runs.div_ceil(RUNS_PER_TASK);
    let days = u64::from(now.day());
    let month = format!("{:04}-{:02}", now.year(), u8::from(now.month()));
    let ts = match &*conn {
        AnyConnection::Sqlite(_) => {
            format!("'{month}-' || printf('%02d', 1 + i % {days}) || ' 10:00:00'")
        }
        AnyConnection::Postgresql(_) => {
            format!("TIMESTAMP '{month}-01 10:00:00' + (i % {days}) * INTERVAL '1 day'")
        }
    };
    insert_range(
        &mut conn,
        tasks,
        "tasks (id, title, prompt, repo_id, repo_url, task_type, state, agent_type, \
         input_tokens, output_tokens, attempt, created_at, updated_at)",
        &format!(
            "'t' || i, 'A task', 'Do it', r.id, r.url, \
             CASE WHEN i % 4 = 3 THEN 'review' ELSE 'coding' END, 'completed', 'claude_code', \
             0, 0, 1, {ts}, {ts}"
        ),
        &format!("JOIN bench_repos r ON r.k = i % {REPOS}"),
    )?;
    insert_range(
        &mut conn,
        runs,
        "task_runs (id, task_id, attempt, agent_type, model, cost_nanos, input_tokens, \
         cache_read_tokens, cache_write_tokens, output_tokens, outcome, started_at, finished_at)",
        &format!(
            "'r' || i, 't' || (i % {tasks}), 1 + i / {tasks}, 'claude_code', \
             CASE i % 7 WHEN 0 THEN NULL WHEN 1 THEN 'opus' WHEN 2 THEN 'sonnet' \
             WHEN 3 THEN 'haiku' WHEN 4 THEN 'gpt-5' WHEN 5 THEN 'gpt-5-mini' ELSE 'o4' END, \
             1000 + (i * 7919) % 5000000, 1, 0, 0, 1, 'succeeded', {ts}, {ts}"
        ),
        "",
    )?;
    insert_range(
        &mut conn,
        tasks.div_ceil(4),
        "egress_blocked (task_id, attempt, host, port, count, first_at, last_at)",
        &format!("'t' || (i * 4), 1, 'evil.example', 443, 1 + i % 5, {ts}, {ts}"),
        "",
    )?;
    exec(&mut conn, "DROP TABLE bench_repos")?;
    exec(&mut conn, "DELETE FROM run_cost_rollup")?;
    exec(&mut conn, "DELETE FROM egress_blocked_repo")?;
    for backfill in statements_starting_with(ROLLUP_MIGRATION, "INSERT") {
        exec(&mut conn, &backfill)?;
    }
    if let AnyConnection::Postgresql(_) = &*conn {
        exec(&mut conn, "ANALYZE")?;
    }
    Ok(())
}

/// The scrape's reads as they were before the rollups: every run, the month's runs per
/// budget and every refusal, at each scrape.
fn before(conn: &mut AnyConnection, now: OffsetDateTime) -> Result<usize, Error> {
    let costs = agentry_persistence::rollups::run_cost_totals(conn)?;
    let budgets = agentry_persistence::budgets::all_set(conn, None, now)?;
    let egress = agentry_persistence::metering::blocked_by_repo(conn)?;
    Ok(costs.len() + budgets.len() + egress.len())
}

fn measure(backend: &str, url: &str, size: u64, requests: usize) -> Result<(), Error> {
    let db = Db::connect(url, 8)?;
    db.migrate()?;
    let now = OffsetDateTime::now_utc();
    let started = Instant::now();
    seed(&db, size, now)?;
    let seed_time = started.elapsed();
    let token = bench::viewer_token(&db)?;
    // A scrape never calls the code host. Benchmarks run no agents.
    let served = bench::serve(bench::offline_state(&db)?)?;
    let addr = served.addr;
    let client = reqwest::blocking::Client::new();
    let uri = format!("http://{addr}/metrics");
    let (mut times, text) = bench::timed_gets(&client, &uri, &token, requests)?;
    let unauthenticated = client.get(&uri).send()?.status();
    if unauthenticated.as_u16() != 401 {
        return Err(format!("a scrape without a token answered {unauthenticated}").into());
    }
    let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
    let (costs, budgets, egress) = (
        series("agentry_cost_usd_total{"),
        series("agentry_budget_used_ratio{"),
        series("agentry_egress_blocked_total{"),
    );
    if (CONNECTED..REPOS).any(|k| text.contains(&format!("repo-{k}\""))) {
        return Err("a disconnected repository is named".into());
    }
    let median = percentile(&mut times, 50);
    let p90 = percentile(&mut times, 90);
    let mut conn = db.conn()?;
    let mut old = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        before(&mut conn, now)?;
        old.push(t.elapsed());
    }
    println!(
        "{backend:8} {size:>9} runs (seeded in {:.1} s): median {:.2} ms, p90 {:.2} ms over \
         {requests} scrapes ({costs} cost, {budgets} budget, {egress} egress series, {} bytes); \
         the scans before the rollups: {:.1} ms",
        seed_time.as_secs_f64(),
        ms(median),
        ms(p90),
        text.len(),
        ms(percentile(&mut old, 50)),
    );
    served.stop()
}

fn main() -> Result<(), Error> {
    let args = bench::size_args(&[100_000, 1_000_000]);
    println!(
        "GET /metrics over HTTP with a viewer token ({} scrapes each)",
        args.requests
    );
    bench::each_backend_and_size(&args, "bench-metrics", measure)
}
