//! The cost report as the service computes it: equivalence of the rollup-fed report with
//! the straightforward one computed from every task, on a randomized data set (both
//! backends), the empty report, the kept report and the revision outcomes. The
//! straightforward path is itself checked against an independent reference implementation
//! in agentry-analytics' tests; `GET /api/analytics/costs`'s parameters are tested in
//! `agentry-api`.

use agentry_analytics::{ReportInputs, TaskFact, Window, report};
use agentry_domain::{RepoUrl, TaskState, TaskType, Trigger, Usd};
use agentry_persistence::tasks::{self, TaskCursor, TaskFilter};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{AnyConnection, Db, DbError, rollups, write_tx};
use agentry_service::Service;
use agentry_testkit::SplitMix64;
use agentry_testkit::json::{COST_REPORT_LISTS, elements_of};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use crate::cost_data::{MODELS, REPOS, pay, seed, start, step};
use crate::rig::{create, new_task, service_of};

/// The cost report of the last `days` days (of repository `repo`) as JSON, as the API
/// serves it.
async fn report_of(service: &Service, days: u32, repo: Option<&str>) -> Value {
    let window = agentry_service::costs::window_ending_now(days).unwrap();
    let repo = repo.map(|r| RepoUrl::parse(r).unwrap());
    serde_json::to_value(service.cost_report(window, repo).await.unwrap()).unwrap()
}

/// Live outcome units through the real write paths: coding tasks with review subtasks
/// (created on a later day than their coding task, costed before and after the coding task
/// ends), revision rounds with costed revision runs, merges, closes, retries after a
/// failure, cancellations, a model that changes after the reviews cost something, and
/// reviews without a parent.
fn seed_outcomes(db: &Db, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let now = OffsetDateTime::now_utc();
    let mut conn = db.conn().unwrap();
    for i in 0..32 {
        let created = now - Duration::hours(rng.below(24 * 20) as i64);
        let mut new = new_task(REPOS[i % 4], TaskType::Coding, created);
        new.title = format!("unit {i}");
        let coding = create(db, &new).id;
        let model = MODELS[rng.below(5) as usize];
        start(&mut conn, coding);
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
            start(&mut conn, coding);
            pay(&mut conn, coding, model, rng.below(2_000_000_000) as i64);
        }
        step(&mut conn, coding, Trigger::PullRequestOpened);
        // Revision rounds: review feedback sends the task back; each round's run costs.
        for _ in 0..rng.below(3) {
            step(&mut conn, coding, Trigger::RevisionRequested);
            start(&mut conn, coding);
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
            start(&mut conn, review);
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
        start(&mut conn, review);
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
    let service = service_of(&db.db);
    let facts = all_facts(&db.db);
    for days in [1_u32, 7, 30, 45, 90, 365] {
        for repo in [
            None,
            Some(REPOS[0]),
            Some(REPOS[3]),
            Some("https://github.com/nobody/none"),
        ] {
            let asked = format!("days={days} repo={repo:?}");
            let body = report_of(&service, days, repo).await;
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
            assert!(differing.is_empty(), "{asked}:\n{}", differing.join("\n"));
            assert_eq!(body, expected, "{asked}");
        }
    }
    // The data set exercises what it should.
    let body = report_of(&service, 90, None).await;
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
        elements_of(&body, "costByModel")
            .iter()
            .any(|m| m["model"] == "unknown")
    );
}

#[tokio::test]
async fn a_filter_that_matches_nothing_gives_zeros_and_thirty_zero_days() {
    let db = TestDb::sqlite();
    seed(&db.db, 7);
    let service = service_of(&db.db);
    let body = report_of(&service, 30, Some("git@github.com:Nobody/None.git")).await;
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
    for member in COST_REPORT_LISTS {
        assert_eq!(body[member], json!([]), "{member}");
    }
    // And the default (all repositories) is not empty on the same data.
    let body = report_of(&service, 30, None).await;
    assert_ne!(body["summary"]["taskCount"], json!(0));
    assert_eq!(body["dailyCosts"].as_array().unwrap().len(), 30);
    let _: Value = body;
}

#[tokio::test]
async fn an_empty_database_gives_an_all_zero_report() {
    let db = TestDb::sqlite();
    let service = service_of(&db.db);
    for days in [1, 30, 365] {
        let body = report_of(&service, days, None).await;
        assert_eq!(body["summary"]["totalCost"], "0.0000");
        assert_eq!(body["summary"]["taskCount"], 0);
        assert_eq!(body["forecast"]["forecastedMonthTotal"], "0.0000");
        assert_eq!(
            body["dailyCosts"].as_array().unwrap().len(),
            usize::try_from(days).unwrap()
        );
        assert_eq!(body["topTasks"], json!([]));
    }
}

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
    let service = service_of(&db.db);
    let now = OffsetDateTime::now_utc();
    let mut conn = db.db.conn().unwrap();
    let id = create(&db.db, &new_task(REPOS[0], TaskType::Coding, now)).id;
    let uncosted = create(&db.db, &new_task(REPOS[1], TaskType::Coding, now)).id;
    step(&mut conn, id, Trigger::Claim);
    pay(&mut conn, id, Some("opus"), 100_000_000);
    let first = report_of(&service, 30, None).await;
    let (total, title, state) = total_and_top(&first);
    assert_eq!((total, title), (json!("0.1000"), json!("A task")));

    // An edit behind the write paths' back (no rollup write): the kept report is served.
    conn.batch_execute("UPDATE tasks SET title = 'Renamed by hand'")
        .unwrap();
    let again = report_of(&service, 30, None).await;
    assert_eq!(again, first, "served from the kept report");
    // Other parameters are another report, computed now.
    let other = report_of(&service, 7, None).await;
    assert_eq!(total_and_top(&other).1, json!("Renamed by hand"));

    // A recorded run: the next report shows it.
    pay(&mut conn, id, Some("opus"), 200_000_000);
    let paid = report_of(&service, 30, None).await;
    assert_eq!(
        total_and_top(&paid),
        (json!("0.3000"), json!("Renamed by hand"), state.clone())
    );

    // A state change that moves no sum (provisioning → running): the top task's state is
    // new.
    step(&mut conn, id, Trigger::AgentStarted);
    let opened = report_of(&service, 30, None).await;
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
    let budgeted = report_of(&service, 30, None).await;

    // The claim of a task without a cost moves nothing the report shows: still kept.
    conn.batch_execute("UPDATE tasks SET title = 'Renamed again'")
        .unwrap();
    step(&mut conn, uncosted, Trigger::Claim);
    let claimed = report_of(&service, 30, None).await;
    assert_eq!(claimed, budgeted, "served from the kept report");
    assert_eq!(
        budgeted["budgets"].as_array().map(Vec::len),
        Some(1),
        "{budgeted}"
    );
}

/// Revision rounds through the persistence write paths (feedback → queued → a revision run →
/// the pull request again), then the merge or the close: `outcomes.revisionCost` and
/// `avgRevisionsPerMergedPullRequest`, overall and per repository, and the merged pull
/// request's cost still holding every run.
async fn revision_outcomes(db: TestDb) {
    use agentry_persistence::schema::task_runs as r;
    use diesel::prelude::*;
    let service = service_of(&db.db);
    let now = OffsetDateTime::now_utc();
    let mut conn = db.db.conn().unwrap();
    let opened = |conn: &mut AnyConnection, repo: &str, nanos: i64| {
        let id = create(&db.db, &new_task(repo, TaskType::Coding, now)).id;
        start(conn, id);
        pay(conn, id, Some("opus"), nanos);
        step(conn, id, Trigger::PullRequestOpened);
        id
    };
    let revise = |conn: &mut AnyConnection, id: Uuid, nanos: i64| {
        step(conn, id, Trigger::RevisionRequested);
        start(conn, id);
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

    let body = report_of(&service, 30, None).await;
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
        elements_of(o, "byRepo")
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

async fn the_report_from_rollups_equals_the_report_from_every_task(db: TestDb) {
    equivalence(db).await;
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    the_report_from_rollups_equals_the_report_from_every_task
);

async fn a_kept_report_is_served_until_a_write_feeds_it(db: TestDb) {
    kept_report(db).await;
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_kept_report_is_served_until_a_write_feeds_it
);

async fn revision_cost_and_rounds_per_merged_pull_request(db: TestDb) {
    revision_outcomes(db).await;
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    revision_cost_and_rounds_per_merged_pull_request
);
