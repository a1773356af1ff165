//! Cost data for tests of the cost report and the cost metrics: a randomized history of
//! imported and live tasks, and the write paths a test uses to move a task and record what a
//! run cost.
//!
//! Used by the test binaries of `agentry-service` (the report) and `agentry-api` (the
//! `/metrics` counters).

use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Trigger, Usd};
use agentry_persistence::tasks::{self, ImportTask, Run, TransitionDetails};
use agentry_persistence::{AnyConnection, Db, DbError, write_tx};
use agentry_testkit::SplitMix64;
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use crate::rig::{create, new_task, opening_pull};

/// The repositories of the data.
pub const REPOS: [&str; 4] = [
    "https://github.com/acme/web",
    "https://github.com/acme/api",
    "https://github.com/acme/docs",
    "https://github.com/other/tool",
];
/// The models of the data (`None`: no model recorded).
pub const MODELS: [Option<&str>; 5] = [
    None,
    Some("opus"),
    Some("sonnet"),
    Some("haiku"),
    Some("gpt-5"),
];

/// A randomized history over the last ~100 days: imported records with every state, model
/// and cost shape (none, zero, 9 decimals), plus live tasks that go through runs and
/// transitions, including an outlier per repository so anomalies appear.
pub fn seed(db: &Db, seed: u64) {
    let mut rng = SplitMix64::new(seed);
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
        start_at(&mut conn, task.id, now);
        let run = Run {
            model: MODELS[rng.below(5) as usize].map(str::to_owned),
            cost_usd: Some(Usd::from_nanos(rng.below(2_000_000_000) as i64).unwrap()),
            tokens: agentry_domain::Tokens::from_uncached(100, 10, 1, 50),
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
            tasks::transition_task(c, task.id, trigger, &opening_pull("acme/web", 1), now)?;
            Ok(())
        })
        .unwrap();
    }
}

/// Claims task `id` and starts its agent, both at `at`: the task is running.
pub fn start_at(conn: &mut AnyConnection, id: Uuid, at: OffsetDateTime) {
    for trigger in [Trigger::Claim, Trigger::AgentStarted] {
        tasks::transition_task(conn, id, trigger, &TransitionDetails::default(), at).unwrap();
    }
}

/// [`start_at`] now.
pub fn start(conn: &mut AnyConnection, id: Uuid) {
    start_at(conn, id, OffsetDateTime::now_utc());
}

/// Moves task `id` by `trigger` now (opening pull request #2 where it opens one).
pub fn step(conn: &mut AnyConnection, id: Uuid, trigger: Trigger) {
    tasks::transition_task(
        conn,
        id,
        trigger,
        &if trigger == Trigger::PullRequestOpened {
            opening_pull("acme/web", 2)
        } else {
            TransitionDetails::default()
        },
        OffsetDateTime::now_utc(),
    )
    .unwrap();
}

/// Records a succeeded run of task `id`'s current attempt with `model`, costing `nanos`
/// billionths of a dollar.
pub fn pay(conn: &mut AnyConnection, id: Uuid, model: Option<&str>, nanos: i64) {
    let attempt = tasks::get_task(conn, id).unwrap().attempt;
    let now = OffsetDateTime::now_utc();
    tasks::record_run(
        conn,
        &Run {
            model: model.map(str::to_owned),
            cost_usd: Some(Usd::from_nanos(nanos).unwrap()),
            tokens: agentry_domain::Tokens::from_uncached(10, 0, 0, 5),
            turns: Some(1),
            ..agentry_persistence::test_support::succeeded_run(id, attempt, now)
        },
    )
    .unwrap();
}
