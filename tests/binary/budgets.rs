//! Budgets by the call (docs/budgets.md) through `agentry serve`, sandboxed: ten runs share
//! one monthly budget without a per-task cap. They run at once (the fake model API's
//! `[model:gather]` holds their first calls until all ten are in flight together, which a
//! whole-run reserve would never allow), each model call holds only what it may cost, and the
//! metered spend stops within the budget: on SQLite, on two replicas of one PostgreSQL, and
//! with a replica killed while its calls are in flight (their holds end with its lease).

use std::time::{Duration, SystemTime};

use agentry_testkit::wait::eventually;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use super::{Replicas, Server, World, connect_repo, create_task, error_of, get, sandboxed};

/// How many runs share the budget.
const RUNS: usize = 10;

/// The instance's monthly budget: room for the ten first calls in flight at once (each holds
/// about $0.0115: its 1,024 output tokens at $10 per million and its body's bytes as input
/// at the dearest input price), and for some twenty calls in all.
const BUDGET: &str = "0.2";

/// Each run: up to ten calls of claude-sonnet-5, each 100 input and 1,000 output tokens
/// ($0.0102), the first ten of all runs gathered, every call held 2 s by the upstream (so
/// several are in flight at any time): the budget runs out long before the calls do.
fn prompt() -> String {
    format!(
        "Share [fake:model-calls=10] [model:usage=100,1000,0,0] [model:gather={RUNS}] \
         [model:hold=2]"
    )
}

fn decimal(value: &Value) -> Decimal {
    value.as_str().unwrap_or("0").parse().unwrap()
}

/// The most model calls the upstream had in flight at once.
fn most_in_flight(calls: &[agentry_fake_models::Call]) -> usize {
    let mut edges: Vec<(SystemTime, i32)> = Vec::new();
    for call in calls {
        edges.push((call.received_at, 1));
        edges.push((call.answered_at.unwrap_or_else(SystemTime::now), -1));
    }
    // An answer and an arrival at the same instant: the answer first.
    edges.sort();
    let (mut now, mut most) = (0_i32, 0_i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Through `base`: sets the instance's monthly budget, connects `acme/web` and creates the
/// runs' tasks; returns their ids.
fn budget_and_tasks(base: &str, admin: &str, gh: &str) -> Vec<String> {
    let put = reqwest::blocking::Client::new()
        .put(format!("{base}/api/budget"))
        .bearer_auth(admin)
        .json(&json!({ "monthlyBudgetUsd": BUDGET }))
        .send()
        .unwrap();
    assert_eq!(put.status(), 200);
    let repo = connect_repo(base, admin, gh);
    (0..RUNS)
        .map(|i| create_task(base, admin, &repo, &format!("Share {i}"), &prompt()))
        .collect()
}

/// Waits until no task of `ids` runs any more (each failed, opened its pull request, or is
/// queued and blocked by the budget); returns them as the task list shows them.
fn all_ended(base: &str, admin: &str, ids: &[String]) -> Vec<Value> {
    eventually(Duration::from_secs(180), "every run to end", || {
        let (_, page) = get(base, "/api/tasks?limit=50", admin);
        let tasks: Vec<Value> = page["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| ids.iter().any(|id| t["id"] == id.as_str()))
            .cloned()
            .collect();
        let ended = tasks.len() == ids.len()
            && tasks.iter().all(|t| {
                matches!(
                    t["state"].as_str(),
                    Some("failed" | "pr_opened" | "cancelled")
                ) || (t["state"] == "queued" && !t["blockedBy"].is_null())
            });
        if ended {
            Ok(tasks)
        } else {
            Err(Value::Array(tasks))
        }
    })
}

/// What every scenario shows once the runs ended: ten calls were in flight at once, the
/// tasks' metered spend is within the budget, the budget stopped runs by name, and nothing
/// is held any more.
fn assert_shared(base: &str, admin: &str, world: &World, tasks: &[Value], log: &str) {
    let calls = world.models.calls();
    assert_eq!(most_in_flight(&calls), RUNS, "{calls:#?}");
    let spent: Decimal = tasks.iter().map(|t| decimal(&t["costUsd"])).sum();
    let budget: Decimal = BUDGET.parse().unwrap();
    assert!(
        spent <= budget,
        "spent {spent} of {budget}\n{tasks:#?}\n{log}"
    );
    let stopped = tasks
        .iter()
        .filter(|t| {
            error_of(t).starts_with("budget reached: the instance's monthly budget of 0.2 USD")
        })
        .count();
    assert!(stopped >= 1, "{tasks:#?}");
    let (status, month) = get(base, "/api/budget", admin);
    assert_eq!(status, 200);
    assert_eq!(decimal(&month["reservedUsd"]), Decimal::ZERO, "{month}");
    assert_eq!(decimal(&month["monthToDateUsd"]), spent, "{month}");
}

/// One `serve` on SQLite with ten run slots.
#[test]
fn ten_runs_share_a_monthly_budget_at_once() {
    if !sandboxed() {
        return;
    }
    const GH: &str = "ghp_SharedBudgetToken0123456789abcdef";
    let world = World::new(
        GH,
        &[
            ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
            ("AGENTRY_MAX_CONCURRENT_RUNS", "10"),
        ],
    );
    let mut server = world.serve(false);
    let admin = server.read_token();
    let ids = budget_and_tasks(&server.base, &admin, GH);
    let tasks = all_ended(&server.base, &admin, &ids);
    // Every run made its first call (all ten were gathered), and spent within the budget.
    assert!(tasks.iter().all(|t| !t["costUsd"].is_null()), "{tasks:#?}");
    let spent: Decimal = tasks.iter().map(|t| decimal(&t["costUsd"])).sum();
    // The runs stopped only when what was left no longer fit a call beside the calls in
    // flight: at most ten holds of about $0.0115 short of the budget.
    assert!(spent >= "0.08".parse().unwrap(), "{spent}\n{tasks:#?}");
    assert_shared(
        &server.base,
        &admin,
        &world,
        &tasks,
        &server.stderr.so_far(),
    );
}

/// Two replicas on one PostgreSQL, five run slots each: the ten runs are split between them
/// and hold against one budget.
fn replicas_share(replicas: &Replicas) {
    if !sandboxed() {
        return;
    }
    let mut a = replicas.start("a");
    let admin = a.read_token();
    let b = replicas.start("b");
    let ids = budget_and_tasks(&a.base, &admin, &replicas.gh);
    let tasks = all_ended(&b.base, &admin, &ids);
    let log = format!("{}\n{}", a.stderr.so_far(), b.stderr.so_far());
    assert_shared(&b.base, &admin, replicas, &tasks, &log);
}

/// [`replicas_share`], with replica A killed while its five calls are in flight: its holds
/// count until its lease ends, then B recovers its tasks and the money A held is free again;
/// the spend stays within the budget.
fn a_replica_dies_mid_call(replicas: &Replicas) {
    if !sandboxed() {
        return;
    }
    let mut a = replicas.start("a");
    let admin = a.read_token();
    let b: Server = replicas.start("b");
    let ids = budget_and_tasks(&a.base, &admin, &replicas.gh);
    // The ten first calls gathered: A's are in flight (held 2 s by the upstream) now.
    assert!(
        replicas
            .models
            .wait_for(Duration::from_secs(90), |calls| calls.len() >= RUNS),
        "the first calls never arrived"
    );
    a.signal("KILL");
    let a_log = a.stderr.so_far();
    drop(a);
    let tasks = all_ended(&b.base, &admin, &ids);
    let log = format!("{a_log}\n{}", b.stderr.so_far());
    assert_shared(&b.base, &admin, replicas, &tasks, &log);
}

on_replicas!(replicas_share => ten_runs_on_two_replicas_share_a_monthly_budget_at_once,
    "AGENTRY_MAX_CONCURRENT_RUNS" = "5");

on_replicas!(a_replica_dies_mid_call => a_replica_killed_mid_call_frees_its_holds_with_its_lease,
    "AGENTRY_MAX_CONCURRENT_RUNS" = "5");
