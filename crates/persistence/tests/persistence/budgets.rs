//! Monthly budgets (docs/contract.md#67-budgets): what a claim reserves, which tasks are
//! blocked, and when they are candidates again; on both backends.

use crate::common::*;
use agentry_domain::{BudgetScope, TaskState, Trigger};
use agentry_persistence::budgets::{self, MonthToDate};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::runner;
use agentry_persistence::tasks::{self, Run, RunOutcome, TransitionDetails};
use agentry_persistence::{AnyConnection, Db};
use time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::seconds(600);

fn set_settings(db: &Db, repo: &Repository, patch: serde_json::Value) {
    let mut conn = db.conn().unwrap();
    repos::patch_settings(&mut conn, repo.id, T0, |s| s.apply_patch(&patch))
        .unwrap()
        .unwrap();
}

/// Settles a claimed task as failed with one run that cost `cost`, finished at `finished`.
fn settle(conn: &mut AnyConnection, task: Uuid, cost: &str, finished: time::OffsetDateTime) {
    let current = tasks::get_task(conn, task).unwrap();
    tasks::record_run(
        conn,
        &Run {
            outcome: RunOutcome::Failed,
            exit_code: Some(1),
            error_message: Some("budget reached".into()),
            ..sonnet_run(task, current.attempt, cost, finished)
        },
    )
    .unwrap();
    tasks::transition_task(
        conn,
        task,
        Trigger::Fail,
        &TransitionDetails::default(),
        finished,
    )
    .unwrap();
}

fn reserve(conn: &mut AnyConnection, task: Uuid) -> Option<String> {
    budgets::reserve_of(conn, task)
        .unwrap()
        .map(|u| u.to_string())
}

agentry_persistence::backend_tests! {
    // A $1 repository budget: the first claim reserves the whole dollar, so the second finds
    // nothing left and blocks the repository's queued tasks; when the first run ends having
    // spent $0.40, the others are candidates again and the next claim reserves the $0.60
    // left. Without a budget nothing is reserved.
    fn a_claim_reserves_what_is_left_and_blocks_the_rest(db) {
        let repo = repo(db);
        let other = connect(db, "acme", "other");
        let first = create(db, &repo, at(1));
        let second = create(db, &repo, at(2));
        let third = create(db, &repo, at(3));
        let free = create(db, &other, at(4));
        set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "1"}));
        let mut conn = db.conn().unwrap();

        let claimed = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        assert_eq!(claimed.id, first.id);
        assert_eq!(reserve(&mut conn, first.id).as_deref(), Some("1"));
        // The repository's money is all reserved: its tasks are blocked and skipped, and the
        // other repository's task (no budget) is claimed without a reserve.
        let claimed = runner::claim_next(&mut conn, "me", at(11), LEASE).unwrap().unwrap();
        assert_eq!(claimed.id, free.id);
        assert_eq!(reserve(&mut conn, free.id), None);
        for id in [second.id, third.id] {
            let t = tasks::get_task(&mut conn, id).unwrap();
            assert_eq!((t.state, t.blocked_by), (TaskState::Queued, Some(BudgetScope::Repository)));
        }
        assert!(runner::claim_next(&mut conn, "me", at(12), LEASE).unwrap().is_none());

        settle(&mut conn, first.id, "0.40", at(20));
        let month = budgets::repository_month(&mut conn, repo.id, at(21)).unwrap();
        assert_eq!(month, MonthToDate { budget: Some(usd("1")), spent: usd("0.40"), reserved: usd("0") });
        assert_eq!(budgets::unblock(&mut conn, None).unwrap(), 2);
        let claimed = runner::claim_next(&mut conn, "me", at(22), LEASE).unwrap().unwrap();
        assert_eq!(claimed.id, second.id);
        assert_eq!(claimed.blocked_by, None);
        assert_eq!(reserve(&mut conn, second.id).as_deref(), Some("0.6"));
    }

    // The instance budget counts every repository; the smaller remainder wins, and a task's
    // own cap bounds its reserve so that several runs fit under one budget.
    fn the_instance_budget_and_the_task_cap_bound_the_reserve(db) {
        let repo = repo(db);
        let tasks: Vec<_> = (0..4).map(|i| create(db, &repo, at(i))).collect();
        set_settings(
            db,
            &repo,
            serde_json::json!({"monthlyBudgetUsd": "5", "maxCostPerTaskUsd": "0.40"}),
        );
        let mut conn = db.conn().unwrap();
        budgets::set_instance_budget(&mut conn, Some(usd("1")), T0).unwrap();
        let mut reserves = Vec::new();
        while let Some(t) = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap() {
            reserves.push(reserve(&mut conn, t.id).unwrap());
        }
        assert_eq!(reserves, ["0.4", "0.4", "0.2"]);
        let last = tasks::get_task(&mut conn, tasks[3].id).unwrap();
        assert_eq!(last.blocked_by, Some(BudgetScope::Instance));
        let month = budgets::instance_month(&mut conn, at(10)).unwrap();
        assert_eq!((month.spent, month.reserved), (usd("0"), usd("1")));
        // Raising the budget makes the blocked task a candidate at once.
        budgets::set_instance_budget(&mut conn, Some(usd("2")), at(11)).unwrap();
        let t = runner::claim_next(&mut conn, "me", at(12), LEASE).unwrap().unwrap();
        assert_eq!(t.id, tasks[3].id);
        assert_eq!(reserve(&mut conn, t.id).as_deref(), Some("0.4"));
    }

    // Eight claimers race over ten tasks with $1 left and a $0.40 cap: the reserves never
    // add up to more than the dollar (0.40 + 0.40 + 0.20), whoever wins.
    fn racing_claims_never_share_the_last_dollar(db) {
        let repo = repo(db);
        for i in 0..10 {
            create(db, &repo, at(i));
        }
        set_settings(
            db,
            &repo,
            serde_json::json!({"monthlyBudgetUsd": "1", "maxCostPerTaskUsd": "0.40"}),
        );
        let db = wide_pool(db, 8);
        let claimed = race(&db, 8, |i, conn| {
            let mut mine = Vec::new();
            while let Some(t) = runner::claim_next(conn, &format!("r{i}"), at(20), LEASE).unwrap() {
                mine.push(budgets::reserve_of(conn, t.id).unwrap().unwrap().to_nanos());
            }
            mine
        });
        let reserves: Vec<i64> = claimed.into_iter().flatten().collect();
        assert_eq!(reserves.len(), 3, "{reserves:?}");
        assert_eq!(reserves.iter().sum::<i64>(), 1_000_000_000);
        let mut conn = db.conn().unwrap();
        assert_eq!(budgets::reserved_nanos(&mut conn, Some(repo.id)).unwrap(), 1_000_000_000);
    }

    // What January spent does not count in February: a task blocked in January is a
    // candidate again when the month turns, with the whole budget to reserve.
    fn the_month_turning_unblocks(db) {
        let repo = repo(db);
        let spent = create(db, &repo, at(1));
        let waiting = create(db, &repo, at(2));
        set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "1"}));
        let mut conn = db.conn().unwrap();
        runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        settle(&mut conn, spent.id, "1", at(20));
        assert!(runner::claim_next(&mut conn, "me", at(30), LEASE).unwrap().is_none());
        let t = tasks::get_task(&mut conn, waiting.id).unwrap();
        assert_eq!(t.blocked_by, Some(BudgetScope::Repository));
        // Still January: still blocked, and not even looked at again.
        assert!(runner::claim_next(&mut conn, "me", at(3600), LEASE).unwrap().is_none());
        let february = time::macros::datetime!(2026-02-01 00:00:01 UTC);
        let t = runner::claim_next(&mut conn, "me", february, LEASE).unwrap().unwrap();
        assert_eq!(t.id, waiting.id);
        assert_eq!(reserve(&mut conn, t.id).as_deref(), Some("1"));
        assert_eq!(budgets::repository_month(&mut conn, repo.id, february).unwrap().spent, usd("0"));
    }
}
