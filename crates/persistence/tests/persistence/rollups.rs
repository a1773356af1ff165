//! The cost rollups are maintained exactly: after any mix of creations, runs, transitions
//! and imports, the incrementally maintained tables equal a rebuild from the task table, and
//! the sums of any window read from them equal the same sums computed from the tasks.

use std::collections::BTreeMap;

use crate::common::*;
use agentry_domain::{AgentType, RepoUrl, Task, TaskState, TaskType, Tokens, Trigger, Usd};
use agentry_persistence::repos::Repository;
use agentry_persistence::rollups::{self, Sums};
use agentry_persistence::tasks::{
    self, ImportTask, Run, RunOutcome, TaskCursor, TaskFilter, TransitionDetails,
};
use agentry_persistence::{AnyConnection, Db, DbError, backend_tests, write_tx};
use agentry_testkit::SplitMix64;
use diesel::prelude::*;
use time::{Date, Duration};
use uuid::Uuid;

fn all_tasks(conn: &mut AnyConnection) -> Vec<Task> {
    let mut out = Vec::new();
    let mut after: Option<TaskCursor> = None;
    loop {
        let page = tasks::list_tasks(conn, &TaskFilter::default(), 200, after.as_ref()).unwrap();
        out.extend(page.tasks);
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
}

type Snapshot = (
    Vec<(String, String, i64, i64, i64)>,
    Vec<(String, String, String, String, Vec<i64>)>,
);

fn snapshot(conn: &mut AnyConnection) -> Snapshot {
    use agentry_persistence::schema::cost_daily as cd;
    let daily = cd::table
        .order((cd::day, cd::repo_url))
        .select((cd::day, cd::repo_url, cd::tasks, cd::costed, cd::cost_nanos))
        .load(conn)
        .unwrap();
    // A combination whose tasks all moved elsewhere (a model set by a run) keeps rows of
    // zeros; they read as zero, so the comparison ignores them.
    let cum = agentry_persistence::test_support::cumulative_rows_with_imported(conn)
        .into_iter()
        .map(|(repo, kind, model, day, sums)| (repo, kind, model, day, sums.to_vec()))
        .filter(|r| r.4.iter().any(|v| *v != 0))
        .collect();
    let daily = daily
        .into_iter()
        .filter(|r: &(String, String, i64, i64, i64)| r.2 != 0 || r.3 != 0 || r.4 != 0)
        .collect();
    (daily, cum)
}

/// Asserts the incrementally kept rollups equal a rebuild from the task table (which then
/// replaces them: the same rows).
pub(crate) fn assert_rollups_rebuild_the_same(conn: &mut AnyConnection) {
    let incremental = snapshot(conn);
    write_tx::<_, DbError, _>(conn, rollups::rebuild).unwrap();
    assert_eq!(
        snapshot(conn),
        incremental,
        "the rollups differ from a rebuild"
    );
}

/// The rollup combination a task counts in: its repository, type and model (`""` for none).
fn combo(t: &Task) -> rollups::Combo {
    (
        t.repo_url.to_string(),
        t.task_type.as_str().to_owned(),
        t.model_used.clone().unwrap_or_default(),
    )
}

fn brute_sums(tasks: &[Task], through: Date) -> BTreeMap<(String, String, String), Sums> {
    let mut m: BTreeMap<(String, String, String), Sums> = BTreeMap::new();
    for t in tasks
        .iter()
        .filter(|t| rollups::utc_day(t.created_at) <= through)
    {
        let costed = t.cost_usd.is_some();
        let s = m.entry(combo(t)).or_default();
        s.tasks += 1;
        if costed {
            s.costed += 1;
            s.cost_nanos += t.cost_usd.unwrap().to_nanos();
            if t.imported {
                s.imported_cost_nanos += t.cost_usd.unwrap().to_nanos();
            }
            s.succeeded += i64::from(matches!(
                t.state,
                TaskState::PrOpened | TaskState::Completed
            ));
            s.input_tokens += t.input_tokens;
            s.output_tokens += t.output_tokens;
        }
    }
    m.retain(|_, s| s.tasks > 0);
    m
}

fn run_of(task: &Task, rng: &mut SplitMix64) -> Run {
    const MODELS: [Option<&str>; 4] = [None, Some("sonnet"), Some("haiku"), Some("gpt-5")];
    Run {
        id: Uuid::new_v4(),
        task_id: task.id,
        attempt: task.attempt,
        agent_type: AgentType::ClaudeCode,
        model: MODELS[rng.below(4) as usize].map(str::to_owned),
        cost_usd: match rng.below(5) {
            0 => None,
            1 => Some(Usd::ZERO),
            _ => Some(Usd::from_nanos(rng.below(5_000_000_000) as i64 + 1).unwrap()),
        },
        tokens: Tokens::from_uncached(
            rng.below(1000) as i64,
            rng.below(100) as i64,
            rng.below(100) as i64,
            rng.below(500) as i64,
        ),
        turns: Some(3),
        outcome: RunOutcome::Succeeded,
        exit_code: Some(0),
        error_message: None,
        started_at: task.created_at,
        finished_at: Some(task.created_at),
        sandboxed: None,
        model_calls: None,
        reported_cost_usd: None,
    }
}

/// The next step of a task along the way a coding task goes, revision rounds included: the
/// trigger to apply in its state (`None`: leave it).
fn next_step(task: &Task, rng: &mut SplitMix64) -> Option<Trigger> {
    Some(match task.state {
        TaskState::Queued => Trigger::Claim,
        TaskState::Provisioning => Trigger::AgentStarted,
        TaskState::Running if task.task_type == TaskType::Review => Trigger::ReviewPosted,
        TaskState::Running => match rng.below(6) {
            0 => Trigger::Fail,
            // Merged while a revision round runs (the pull request stands).
            1 if task.revision().is_some() => Trigger::PullRequestMerged,
            _ => Trigger::PullRequestOpened,
        },
        TaskState::PrOpened => match rng.below(10) {
            0..=5 => Trigger::RevisionRequested,
            6..=8 => Trigger::PullRequestMerged,
            _ => Trigger::PullRequestClosed,
        },
        TaskState::Failed | TaskState::Cancelled => Trigger::Retry,
        TaskState::Completed => return None,
    })
}

/// The revision figures from the tasks: per head combination (a review with a coding
/// parent counts at its parent), the revision rounds of merged heads and the cost of the
/// revision runs of every task.
fn brute_revisions(tasks: &[Task]) -> BTreeMap<(String, String, String), (i64, i64)> {
    let by_id: BTreeMap<Uuid, &Task> = tasks.iter().map(|t| (t.id, t)).collect();
    let mut m: BTreeMap<(String, String, String), (i64, i64)> = BTreeMap::new();
    for t in tasks {
        let head = match (t.task_type, t.parent_task_id.and_then(|p| by_id.get(&p))) {
            (TaskType::Review, Some(p)) if p.task_type == TaskType::Coding => *p,
            _ => t,
        };
        let e = m.entry(combo(head)).or_default();
        if t.id == head.id && t.task_type == TaskType::Coding && t.state == TaskState::Completed {
            e.0 += i64::from(t.revisions);
        }
        e.1 += t.revision_cost_usd.to_nanos();
    }
    m.retain(|_, v| *v != (0, 0));
    m
}

/// Transition details naming pull request `number` of the test repository.
fn pull_request(number: i64) -> TransitionDetails {
    TransitionDetails {
        pull_request: Some(agentry_domain::PullRequestRef {
            url: format!("https://github.com/o/r/pull/{number}"),
            number,
        }),
        ..Default::default()
    }
}

/// Applies a random workload and checks the invariants; returns how many revision runs
/// with a cost it recorded.
fn workload(db: &Db, seed: u64) -> usize {
    let mut rng = SplitMix64::new(seed);
    let repos = [
        connect(db, "acme", "web"),
        connect(db, "acme", "api"),
        connect(db, "o", "r"),
    ];
    let mut conn = db.conn().unwrap();
    apply_random_writes(&mut conn, &repos, &mut rng);
    let tasks = all_tasks(&mut conn);
    let incremental = snapshot(&mut conn);
    let costed_revision_runs = check_revision_costs(&mut conn, &tasks);
    let latest = rollups::latest_day(&mut conn).unwrap().unwrap();
    check_dense(&incremental, latest);
    check_window_sums(&mut conn, &tasks, latest);
    // The incremental tables equal a rebuild from the task table.
    write_tx::<_, DbError, _>(&mut conn, rollups::rebuild).unwrap();
    let rebuilt = snapshot(&mut conn);
    let only_incremental: Vec<_> = incremental
        .1
        .iter()
        .filter(|r| !rebuilt.1.contains(r))
        .take(5)
        .collect();
    let only_rebuilt: Vec<_> = rebuilt
        .1
        .iter()
        .filter(|r| !incremental.1.contains(r))
        .take(5)
        .collect();
    assert!(
        only_incremental.is_empty() && only_rebuilt.is_empty(),
        "cumulative differs: {only_incremental:?} vs {only_rebuilt:?}"
    );
    assert!(incremental.0 == rebuilt.0, "daily differs");

    // The migration that added the imported cost computes it from the tasks alone: undone
    // and applied again on these tables, it finds what the writes kept.
    let imported_costs = |rows: &[(String, String, String, String, Vec<i64>)]| -> Vec<i64> {
        rows.iter().map(|r| r.4[13]).collect()
    };
    assert!(
        imported_costs(&incremental.1).iter().any(|c| *c > 0),
        "the workload imported costed history"
    );
    redo_imported_cost_migration(&mut conn);
    let backfilled = snapshot(&mut conn);
    assert_eq!(backfilled.1.len(), incremental.1.len());
    assert_eq!(
        imported_costs(&backfilled.1),
        imported_costs(&incremental.1),
        "backfilled imported cost"
    );
    assert!(
        backfilled == incremental,
        "the backfill changed another column"
    );
    costed_revision_runs
}

/// 200 random writes: tasks created (days out of order), runs recorded, transitions tried
/// (refused ones included), tasks taken a few steps further with runs, history imported.
fn apply_random_writes(conn: &mut AnyConnection, repos: &[Repository], rng: &mut SplitMix64) {
    let mut created: Vec<Uuid> = Vec::new();
    for step in 0..200 {
        match rng.below(13) {
            0..=3 => {
                let repo = &repos[rng.below(3) as usize];
                // Days out of order, including days before and after earlier ones.
                let mut new = new_task(repo, T0 + Duration::hours(rng.below(24 * 12) as i64));
                if rng.below(3) == 0 {
                    new.task_type = TaskType::Review;
                }
                created.push(tasks::create_task(conn, &new, "test").unwrap().id);
            }
            4..=5 if !created.is_empty() => {
                let id = created[rng.below(created.len() as u64) as usize];
                let task = tasks::get_task(conn, id).unwrap();
                let run = run_of(&task, rng);
                write_tx::<_, DbError, _>(conn, |c| tasks::record_run(c, &run)).unwrap();
            }
            6..=8 if !created.is_empty() => {
                let id = created[rng.below(created.len() as u64) as usize];
                let trigger = Trigger::ALL[rng.below(Trigger::ALL.len() as u64) as usize];
                let details = pull_request(1);
                // Refused transitions are part of the workload: they must change nothing.
                let _ = tasks::transition_task(conn, id, trigger, &details, at(step));
            }
            // A task (most often a coding task) a few steps further along, revision rounds
            // included, with runs of its attempts (revision runs within a round).
            10..=12 if !created.is_empty() => {
                let id = created[rng.below(created.len() as u64) as usize];
                for _ in 0..rng.range(1, 6) {
                    let task = tasks::get_task(conn, id).unwrap();
                    if let Some(trigger) = next_step(&task, rng) {
                        let details = pull_request(2);
                        let _ = tasks::transition_task(conn, id, trigger, &details, at(step));
                    }
                    if rng.below(2) == 0 {
                        let task = tasks::get_task(conn, id).unwrap();
                        let run = run_of(&task, rng);
                        write_tx::<_, DbError, _>(conn, |c| tasks::record_run(c, &run)).unwrap();
                    }
                }
            }
            _ => {
                let records = import_batch(rng);
                tasks::import_tasks(conn, records).unwrap();
            }
        }
    }
}

/// A random batch of imported history (up to 29 tasks, some costed, some reviews).
fn import_batch(rng: &mut SplitMix64) -> Vec<Result<ImportTask, DbError>> {
    (0..rng.below(30))
        .map(|i| {
            Ok(ImportTask {
                id: Uuid::new_v4(),
                title: format!("imported {i}"),
                repo_url: RepoUrl::parse(
                    ["https://github.com/acme/web", "https://github.com/x/y"][(i % 2) as usize],
                )
                .unwrap(),
                task_type: if i % 3 == 0 {
                    TaskType::Review
                } else {
                    TaskType::Coding
                },
                state: TaskState::ALL[(i % 7) as usize],
                agent_type: AgentType::Codex,
                model_used: [None, Some("gpt-5".to_owned())][(i % 2) as usize].clone(),
                cost_usd: if i % 4 == 0 {
                    None
                } else {
                    Some(Usd::from_nanos(i as i64 * 1_234_567).unwrap())
                },
                input_tokens: i as i64,
                output_tokens: 2 * i as i64,
                created_at: T0 - Duration::days(5) + Duration::hours(7 * i as i64),
                pr_url: None,
                pr_number: None,
                issue_number: None,
            })
        })
        .collect()
}

/// Each task's revision cost is the cost of its runs recorded as revision runs, and the
/// outcome sums at the latest day hold every unit's revision figures; gives how many revision
/// runs have a cost.
fn check_revision_costs(conn: &mut AnyConnection, tasks: &[Task]) -> usize {
    // Each task's revision cost is the cost of its runs recorded as revision runs.
    let runs: Vec<(String, String, Option<i64>)> = {
        use agentry_persistence::schema::task_runs as r;
        r::table
            .select((r::task_id, r::run_trigger, r::cost_nanos))
            .load(conn)
            .unwrap()
    };
    let mut revision_runs: BTreeMap<String, i64> = BTreeMap::new();
    let mut costed_revision_runs = 0;
    for (task_id, trigger, cost) in &runs {
        if trigger == "revision" {
            *revision_runs.entry(task_id.clone()).or_default() += cost.unwrap_or(0);
            costed_revision_runs += usize::from(cost.is_some_and(|c| c > 0));
        }
    }
    for t in tasks {
        assert_eq!(
            t.revision_cost_usd.to_nanos(),
            revision_runs.get(&t.id.to_string()).copied().unwrap_or(0),
            "revision cost of {}",
            t.id
        );
        assert!(t.revision_cost_usd <= t.cost_usd.unwrap_or(Usd::ZERO));
    }
    // The outcome sums at the latest day hold every unit's revision figures.
    let latest_day = rollups::latest_day(conn).unwrap().unwrap();
    let mut read: BTreeMap<(String, String, String), (i64, i64)> = BTreeMap::new();
    for (_, combo, _, o) in rollups::cumulative_with_outcomes_at(conn, &[latest_day]).unwrap() {
        if (o.merged_revisions, o.revision_cost_nanos) != (0, 0) {
            read.insert(combo, (o.merged_revisions, o.revision_cost_nanos));
        }
    }
    assert_eq!(read, brute_revisions(tasks), "revision outcome sums");
    costed_revision_runs
}

/// Dense: every combination has a row for every day from its first through the latest.
fn check_dense(incremental: &Snapshot, latest: Date) {
    let mut per_combo: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for (repo, tt, model, day, _) in &incremental.1 {
        per_combo
            .entry((repo.clone(), tt.clone(), model.clone()))
            .or_default()
            .push(day.clone());
    }
    for (combo, days) in &per_combo {
        assert_eq!(
            days.last().unwrap(),
            &latest.to_string(),
            "{combo:?} does not reach the latest day"
        );
        for pair in days.windows(2) {
            let a: Date = Date::parse(
                &pair[0],
                time::macros::format_description!("[year]-[month]-[day]"),
            )
            .unwrap();
            let b: Date = Date::parse(
                &pair[1],
                time::macros::format_description!("[year]-[month]-[day]"),
            )
            .unwrap();
            assert_eq!(a.next_day(), Some(b), "{combo:?} has a gap");
        }
    }
}

/// Window sums equal brute force at every day (before, inside and after the data), and the
/// daily sums of one repository equal its tasks'.
fn check_window_sums(conn: &mut AnyConnection, tasks: &[Task], latest: Date) {
    let first = tasks
        .iter()
        .map(|t| rollups::utc_day(t.created_at))
        .min()
        .unwrap();
    let mut day = first - Duration::days(2);
    while day <= latest + Duration::days(2) {
        let mut read: BTreeMap<(String, String, String), Sums> = BTreeMap::new();
        for (_, combo, sums) in rollups::cumulative_at(conn, &[day]).unwrap() {
            if sums.tasks > 0 {
                read.insert(combo, sums);
            }
        }
        assert_eq!(read, brute_sums(tasks, day), "cumulative sums at {day}");
        day = day.next_day().unwrap();
    }
    let daily =
        rollups::daily_between(conn, first, latest, Some("https://github.com/acme/web")).unwrap();
    for (day, s) in daily {
        let on_day: Vec<&Task> = tasks
            .iter()
            .filter(|t| {
                rollups::utc_day(t.created_at) == day
                    && t.repo_url.as_str() == "https://github.com/acme/web"
            })
            .collect();
        assert_eq!(s.tasks, on_day.len() as i64);
        assert_eq!(
            s.costed,
            on_day.iter().filter(|t| t.cost_usd.is_some()).count() as i64
        );
        assert_eq!(
            s.cost_nanos,
            on_day
                .iter()
                .filter_map(|t| t.cost_usd)
                .map(Usd::to_nanos)
                .sum::<i64>()
        );
    }
}

/// Undoes the migration that added `cost_cumulative.imported_cost_nanos` and applies it
/// again (its backfill then computes the column from the tasks).
fn redo_imported_cost_migration(conn: &mut AnyConnection) {
    use agentry_persistence::connection::MIGRATIONS;
    use diesel::migration::MigrationSource;
    use diesel_migrations::MigrationHarness as _;

    let all =
        MigrationSource::<<AnyConnection as diesel::Connection>::Backend>::migrations(&MIGRATIONS)
            .unwrap();
    let migration = all
        .iter()
        .find(|m| m.name().to_string().ends_with("_imported_cost"))
        .expect("the migration is embedded");
    conn.revert_migration(migration.as_ref()).unwrap();
    conn.run_migration(migration.as_ref()).unwrap();
}

backend_tests! {
    fn rollups_follow_every_write_exactly(db) {
        let mut revision_runs = 0;
        for seed in [1_u64, 2, 3] {
            revision_runs += workload(db, seed);
            let mut conn = db.conn().unwrap();
            // Start the next seed from empty tables of the same database.
            diesel::sql_query("DELETE FROM revision_feedback").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM cost_cumulative").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM cost_daily").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM task_runs").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM task_events").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM tasks").execute(&mut conn).unwrap();
            diesel::sql_query("DELETE FROM repositories").execute(&mut conn).unwrap();
        }
        // The histories held revision rounds with costed revision runs.
        assert!(revision_runs > 0);
    }

    fn a_refused_write_leaves_the_rollups_unchanged(db) {
        let (task, mut conn) = a_task(db);
        let before = snapshot(&mut conn);
        let refused = tasks::transition_task(&mut conn, task.id, Trigger::PullRequestMerged, &TransitionDetails::default(), T0);
        assert!(matches!(refused, Err(DbError::InvalidTransition(_))));
        let bad_run = Run { tokens: Tokens { input: -1, ..Tokens::default() }, ..run_of(&task, &mut SplitMix64::new(7)) };
        assert!(write_tx::<_, DbError, _>(&mut conn, |c| tasks::record_run(c, &bad_run)).is_err());
        assert_eq!(snapshot(&mut conn), before);
    }
}
