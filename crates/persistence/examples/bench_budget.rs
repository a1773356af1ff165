//! Benchmark of budgets by the call (docs/benchmarks.md, "Budgets by the call"): what the
//! per-call budget decision adds to a model call, and claims per second with each way of
//! holding a budget.
//!
//! On a fresh database with a repository budget and an instance budget (both large, so
//! nothing is refused and every decision does its whole work), `--runs` tasks (default 50)
//! are claimed holding per call: the runs in flight. Then `--calls` model calls (default
//! 4,000) are decided and recorded as the gateway does it:
//!
//! - `hold`: [`budgets::hold_call`], before the call goes out: the latency it adds to the
//!   call;
//! - `record`: [`metering::record_held_call`], after the answer (off the agent's path): the
//!   call's row and its hold replaced by its cost in one transaction, beside
//!   [`metering::record_call`], the row alone, as it was written before.
//!
//! Each with one caller (the runs take turns) and with one caller per run at once (every run
//! calling back to back: far more than agents do, whose calls take seconds). Then claims:
//! `--claims` queued tasks (default 2,000) claimed one after the other under the same
//! budgets, holding the whole run and holding per call, each on a fresh database.
//!
//! ```text
//! cargo run --release -p agentry-persistence --example bench_budget -- \
//!     [--runs 50] [--calls 4000] [--claims 2000] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```
//! Without `--pg` only SQLite is measured.

use std::time::{Duration, Instant};

use agentry_domain::{RepoUrl, Usd};
use agentry_persistence::budgets::{self, CallHold, Holding};
use agentry_persistence::metering::{self, ModelCall};
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::{Db, runner};
use agentry_testkit::stats::quantile;
use clap::builder::RangedU64ValueParser;
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Runs in flight, each with its own task.
    #[arg(long, default_value_t = 50, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    runs: usize,
    /// Model calls decided and recorded.
    #[arg(long, default_value_t = 4_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    calls: usize,
    /// Claims timed.
    #[arg(long, default_value_t = 2_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    claims: usize,
    /// A PostgreSQL server's URL: measure there too.
    #[arg(long)]
    pg: Option<String>,
}

/// A fresh, migrated database named after `label`: a file in `dir`, or a new database on
/// the PostgreSQL server `pg`.
fn fresh(pg: Option<&str>, label: &str, dir: &std::path::Path) -> Result<Db, Error> {
    let url = match pg {
        None => format!("sqlite://{}", dir.join(format!("{label}.db")).display()),
        Some(server) => agentry_persistence::test_support::fresh_database(
            server,
            &format!("agentry_bench_{label}"),
        )?,
    };
    let db = Db::connect(&url, 16)?;
    db.migrate()?;
    Ok(db)
}

/// A repository with a large monthly budget (and a \$5 cap per task), the instance's budget set as large, and `n`
/// queued tasks on the repository; their ids.
fn seed(db: &Db, n: usize) -> Result<(Repository, Vec<Uuid>), Error> {
    let mut conn = db.conn()?;
    let now = agentry_persistence::now();
    let (repo, _) = repos::connect_repository(
        &mut conn,
        &NewRepository {
            url: RepoUrl::parse("https://github.com/bench/budget")?,
            default_branch: "main".into(),
            clone_url: "https://github.com/bench/budget.git".into(),
            codehost_id: None,
        },
        now,
    )?;
    // A per-task cap, so that runs holding their whole run fit side by side too.
    let patch = serde_json::json!({ "monthlyBudgetUsd": "1000000", "maxCostPerTaskUsd": "5" });
    repos::patch_settings(&mut conn, repo.id, now, |s| s.apply_patch(&patch))?
        .map_err(|e| format!("{e:?}"))?;
    budgets::set_instance_budget(&mut conn, Some(usd("1000000")?), now)?;
    let ids = agentry_persistence::test_support::create_coding_tasks(&mut conn, &repo, n, now)?;
    Ok((repo, ids))
}

fn usd(text: &str) -> Result<Usd, Error> {
    Ok(text.parse::<Usd>().map_err(|e| format!("{e:?}"))?)
}

/// A finished call of `task` that cost $0.0102.
fn call_of(task: Uuid) -> Result<ModelCall, Error> {
    Ok(agentry_persistence::test_support::model_call(
        task,
        1,
        usd("0.0102")?,
    ))
}

/// The timings of one load.
#[derive(Default)]
struct Timings {
    hold: Vec<Duration>,
    record_held: Vec<Duration>,
    record: Vec<Duration>,
}

impl Timings {
    fn extend(&mut self, other: Timings) {
        self.hold.extend(other.hold);
        self.record_held.extend(other.record_held);
        self.record.extend(other.record);
    }
}

/// `calls` calls of the runs `tasks` (taking turns), each held, recorded with its hold, and
/// recorded once more the old way (the row alone) for comparison.
fn calls(db: &Db, tasks: &[Uuid], calls: usize) -> Result<Timings, Error> {
    let mut conn = db.conn()?;
    let reservation = usd("0.0115")?;
    let mut t = Timings::default();
    for i in 0..calls {
        let task = tasks[i % tasks.len()];
        let start = Instant::now();
        let held = budgets::hold_call(&mut conn, task, 1, reservation, agentry_persistence::now())?;
        t.hold.push(start.elapsed());
        if held != CallHold::Held {
            return Err(format!("call {i} was not held: {held:?}").into());
        }
        let call = call_of(task)?;
        let start = Instant::now();
        metering::record_held_call(&mut conn, &call, reservation)?;
        t.record_held.push(start.elapsed());
        let call = call_of(task)?;
        let start = Instant::now();
        metering::record_call(&mut conn, &call)?;
        t.record.push(start.elapsed());
    }
    Ok(t)
}

fn line(what: &str, v: &mut [Duration]) {
    let p = |v: &mut [Duration], q: f64| quantile(v, q).unwrap_or_default().as_secs_f64() * 1_000.0;
    println!(
        "  {what:<34} p50 {:>7.3} ms   p99 {:>7.3} ms   ({} calls)",
        p(v, 0.50),
        p(v, 0.99),
        v.len()
    );
}

fn report(load: &str, mut t: Timings) {
    println!(" {load}");
    line("hold (before the call goes out)", &mut t.hold);
    line("record with its hold (after)", &mut t.record_held);
    line("record, the row alone (before)", &mut t.record);
}

/// Claims per second of `n` queued tasks under the budgets, holding as `holding` says.
fn claims(db: &Db, n: usize, holding: Holding) -> Result<f64, Error> {
    let mut conn = db.conn()?;
    let lease = time::Duration::seconds(600);
    let start = Instant::now();
    let mut claimed = 0;
    while runner::claim_next_holding(
        &mut conn,
        "bench",
        agentry_persistence::now(),
        lease,
        holding,
    )?
    .is_some()
    {
        claimed += 1;
    }
    let elapsed = start.elapsed();
    if claimed != n {
        return Err(format!("claimed {claimed} of {n} tasks").into());
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

fn backend(args: &Args, pg: Option<&str>, dir: &std::path::Path) -> Result<(), Error> {
    let name = if pg.is_some() { "PostgreSQL" } else { "SQLite" };
    println!("{name}: {} runs in flight, {} calls", args.runs, args.calls);
    let db = fresh(pg, "budget_calls", dir)?;
    let (_, ids) = seed(&db, args.runs)?;
    {
        let mut conn = db.conn()?;
        let lease = time::Duration::seconds(3_600);
        for _ in 0..args.runs {
            runner::claim_next_holding(
                &mut conn,
                "bench",
                agentry_persistence::now(),
                lease,
                Holding::PerCall,
            )?
            .ok_or("a run could not be claimed")?;
        }
    }
    report("one caller", calls(&db, &ids, args.calls)?);
    let per_run = args.calls.div_ceil(args.runs);
    let all = std::thread::scope(|s| {
        let workers: Vec<_> = ids
            .iter()
            .map(|id| {
                let db = db.clone();
                s.spawn(move || calls(&db, std::slice::from_ref(id), per_run))
            })
            .collect();
        let mut all = Timings::default();
        for w in workers {
            all.extend(w.join().map_err(|_| "a caller panicked")??);
        }
        Ok::<_, Error>(all)
    })?;
    report(&format!("{} callers at once", args.runs), all);
    for (label, holding) in [
        ("whole_run", Holding::WholeRun),
        ("per_call", Holding::PerCall),
    ] {
        let db = fresh(pg, &format!("budget_claims_{label}"), dir)?;
        seed(&db, args.claims)?;
        let rate = claims(&db, args.claims, holding)?;
        println!(
            " claims holding {label:<10} {rate:>8.0} claims/s ({} tasks)",
            args.claims
        );
    }
    Ok(())
}

fn main() -> Result<(), Error> {
    let args = <Args as clap::Parser>::parse();
    let dir = tempfile::tempdir()?;
    backend(&args, None, dir.path())?;
    if let Some(pg) = args.pg.clone() {
        backend(&args, Some(&pg), dir.path())?;
    }
    Ok(())
}
