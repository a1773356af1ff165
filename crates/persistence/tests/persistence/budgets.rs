//! Monthly budgets (docs/contract.md#67-budgets): what a claim reserves, which tasks are
//! blocked, and when they are candidates again; on both backends.

use crate::common::*;
use agentry_domain::{BudgetScope, TaskState, Trigger};
use agentry_persistence::budgets::{self, MonthToDate};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::runner;
use agentry_persistence::tasks::{self, Run, RunOutcome, TransitionDetails};
use agentry_persistence::{AnyConnection, Db, DbError};
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
    // Imported history is never claimed: a spent budget blocks the queued tasks it keeps
    // from running, never an imported `queued` record.
    fn a_spent_budget_never_blocks_imported_tasks(db) {
        let repo = repo(db);
        let waiting = create(db, &repo, at(1));
        let mut conn = db.conn().unwrap();
        let record = agentry_persistence::tasks::ImportTask {
            id: Uuid::new_v4(),
            title: "history".into(),
            repo_url: repo.url.clone(),
            task_type: agentry_domain::TaskType::Coding,
            state: TaskState::Queued,
            agent_type: agentry_domain::AgentType::ClaudeCode,
            model_used: None,
            cost_usd: None,
            input_tokens: 0,
            output_tokens: 0,
            created_at: at(0),
            pr_url: None,
            pr_number: None,
            issue_number: None,
        };
        let imported = record.id;
        tasks::import_tasks::<DbError, _>(&mut conn, [Ok(record)]).unwrap();
        budgets::set_instance_budget(&mut conn, Some(usd("0")), at(2)).unwrap();
        assert!(runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().is_none());
        let blocked = |conn: &mut AnyConnection, id| tasks::get_task(conn, id).unwrap().blocked_by;
        assert_eq!(blocked(&mut conn, waiting.id), Some(BudgetScope::Instance));
        assert_eq!(blocked(&mut conn, imported), None);
    }

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

    // A budget's block belongs to a stay in the queue: a cancelled task loses it, and its
    // retry is claimed as soon as there is money (here the budget is removed). Before, the
    // mark survived the cancel, the budget's removal skipped the cancelled task, and the
    // retried task waited behind a block nothing would lift before the month turned.
    fn a_block_goes_with_the_stay_in_the_queue(db) {
        let repo = repo(db);
        let waiting = create(db, &repo, at(1));
        set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "0"}));
        let mut conn = db.conn().unwrap();
        assert!(runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().is_none());
        let t = tasks::get_task(&mut conn, waiting.id).unwrap();
        assert_eq!(t.blocked_by, Some(BudgetScope::Repository));
        let none = TransitionDetails::default();
        tasks::transition_task(&mut conn, waiting.id, Trigger::Cancel, &none, at(11)).unwrap();
        let t = tasks::get_task(&mut conn, waiting.id).unwrap();
        assert_eq!((t.state, t.blocked_by), (TaskState::Cancelled, None));
        drop(conn);
        set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": null}));
        let mut conn = db.conn().unwrap();
        tasks::transition_task(&mut conn, waiting.id, Trigger::Retry, &none, at(12)).unwrap();
        let t = runner::claim_next(&mut conn, "me", at(13), LEASE).unwrap();
        assert_eq!(t.map(|t| t.id), Some(waiting.id));
    }

    // Money freed while a claim is deciding to block: the unblock waits for that claim's
    // decision (the budget row's lock) and lifts the blocks it made. Before, on PostgreSQL,
    // the unblock ran beside the claim, found nothing blocked yet, and the claim's blocks
    // then stayed until the month turned. (SQLite's transactions run one at a time.)
    fn an_unblock_waits_for_the_claim_deciding_to_block(db) {
        if !matches!(*db.conn().unwrap(), AnyConnection::Postgresql(_)) {
            return;
        }
        let repo = repo(db);
        let spender = create(db, &repo, at(1));
        let next = create(db, &repo, at(2));
        let held = create(db, &repo, at(3));
        set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "1"}));
        let mut conn = db.conn().unwrap();
        let claimed = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        assert_eq!(claimed.id, spender.id);
        drop(conn);
        let db = wide_pool(db, 4);
        let unblocked = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let db = &db;
            let (locked, holding) = std::sync::mpsc::channel();
            let (release, released) = std::sync::mpsc::channel::<()>();
            // Holds one queued task's row, so that the claim's blocking waits on it.
            let holder = s.spawn(move || {
                let mut conn = db.conn().unwrap();
                agentry_persistence::write_tx::<_, DbError, _>(&mut conn, |conn| {
                    agentry_persistence::revisions::lock_task(conn, held.id)?;
                    locked.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(())
                })
                .unwrap();
            });
            holding.recv().unwrap();
            let claimer = s.spawn(move || {
                let mut conn = db.conn().unwrap();
                runner::claim_next(&mut conn, "other", at(11), LEASE).unwrap()
            });
            let mut conn = db.conn().unwrap();
            agentry_testkit::wait::eventually(
                std::time::Duration::from_secs(20),
                "the claim to wait for the held task's row",
                || lock_waiters(&mut conn) > 0,
            );
            // The spender's run ends under its reserve: $0.60 is free again.
            settle(&mut conn, spender.id, "0.4", at(12));
            let unblocked = &unblocked;
            let unblocker = s.spawn(move || {
                let mut conn = db.conn().unwrap();
                budgets::unblock(&mut conn, Some(repo.id)).unwrap();
                unblocked.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            agentry_testkit::wait::eventually(
                std::time::Duration::from_secs(20),
                "the unblock to end or to wait for the claim",
                || unblocked.load(std::sync::atomic::Ordering::SeqCst) || lock_waiters(&mut conn) > 1,
            );
            release.send(()).unwrap();
            holder.join().unwrap();
            assert!(claimer.join().unwrap().is_none());
            unblocker.join().unwrap();
        });
        let mut conn = db.conn().unwrap();
        let t = runner::claim_next(&mut conn, "me", at(13), LEASE).unwrap();
        assert_eq!(t.map(|t| t.id), Some(next.id), "the freed money runs the next task");
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

/// Runs that hold their budgets per call (metered runs).
mod per_call {
    use super::*;

    /// A metered call of `task`'s attempt 1 that cost `cost`.
    fn metered_call(task: Uuid, cost: &str) -> agentry_persistence::metering::ModelCall {
        agentry_persistence::test_support::model_call(task, 1, usd(cost))
    }

    /// The run of `attempt` of `task` as its recorder writes it: the cost, tokens and count
    /// of its metered calls so far, finished at `finished`.
    fn metered_run(
        conn: &mut AnyConnection,
        task: Uuid,
        attempt: i32,
        finished: time::OffsetDateTime,
    ) -> Run {
        let totals = agentry_persistence::metering::run_totals(conn, task, attempt).unwrap();
        Run {
            cost_usd: totals.cost_usd,
            model_calls: Some(totals.calls),
            tokens: totals.tokens,
            ..sonnet_run(task, attempt, "0", finished)
        }
    }

    /// The lease of `claimed` (claimed at 10 s) expires and a recoverer takes it, recording
    /// the run `lost` as a recovering replica does: the metered totals, no end time. Returns
    /// when it recovered it.
    fn recover_lost(
        conn: &mut AnyConnection,
        claimed: &agentry_domain::Task,
    ) -> time::OffsetDateTime {
        let expired = at(10) + LEASE + Duration::seconds(1);
        let [lease] = &runner::expired_leases(conn, expired, 10).unwrap()[..] else {
            panic!("one expired lease");
        };
        let run = Run {
            sandboxed: Some(true),
            finished_at: None,
            outcome: RunOutcome::Lost,
            started_at: claimed.started_at.unwrap(),
            ..metered_run(conn, claimed.id, claimed.attempt, expired)
        };
        let log = runner::RunLog::of("");
        runner::recover_expired(conn, lease, expired, Some((&run, Some(&log))), expired)
            .unwrap()
            .unwrap();
        expired
    }

    /// A task on the default repository (with a monthly `budget`, if any), claimed holding
    /// per call at 10 s and running at 11 s; the repository, the task and a connection.
    fn running(
        db: &Db,
        budget: Option<&str>,
    ) -> (
        Repository,
        agentry_domain::Task,
        agentry_persistence::PooledConnection,
    ) {
        let repo = repo(db);
        if let Some(budget) = budget {
            set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": budget}));
        }
        let task = create(db, &repo, at(1));
        let mut conn = db.conn().unwrap();
        claim_per_call(&mut conn, "me").unwrap();
        tasks::transition_task(
            &mut conn,
            task.id,
            Trigger::AgentStarted,
            &TransitionDetails::default(),
            at(11),
        )
        .unwrap();
        (repo, task, conn)
    }

    fn claim_per_call(conn: &mut AnyConnection, owner: &str) -> Option<agentry_domain::Task> {
        runner::claim_next_holding(conn, owner, at(10), LEASE, budgets::Holding::PerCall).unwrap()
    }

    fn hold(conn: &mut AnyConnection, task: Uuid, amount: &str) -> budgets::CallHold {
        budgets::hold_call(conn, task, 1, usd(amount), at(30)).unwrap()
    }

    agentry_persistence::backend_tests! {
        // Runs that hold per call share a $1 budget without a per-task cap: all three are
        // claimed at once, each holding nothing; each call holds its largest cost while it is in
        // flight, a call that does not fit what is left is refused (naming the budget, with its
        // figures), and a recorded call's hold becomes its cost, which frees the rest.
        fn runs_share_a_budget_and_each_call_holds_what_it_may_cost(db) {
            let repo = repo(db);
            let other = connect(db, "acme", "other");
            let ids: Vec<Uuid> = (0..3).map(|i| create(db, &repo, at(i)).id).collect();
            let free = create(db, &other, at(4));
            set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "1"}));
            let mut conn = db.conn().unwrap();
            for id in &ids {
                let t = claim_per_call(&mut conn, "me").unwrap();
                assert_eq!(t.id, *id);
                assert_eq!(reserve(&mut conn, t.id).as_deref(), Some("0"));
            }
            assert_eq!(claim_per_call(&mut conn, "me").unwrap().id, free.id);
            assert_eq!(reserve(&mut conn, free.id), None);

            assert_eq!(hold(&mut conn, ids[0], "0.4"), budgets::CallHold::Held);
            assert_eq!(hold(&mut conn, ids[1], "0.4"), budgets::CallHold::Held);
            let budgets::CallHold::Refused(short) = hold(&mut conn, ids[2], "0.4") else {
                panic!("a call over what is left must be refused");
            };
            assert_eq!(
                (short.scope, short.budget, short.spent, short.held, short.left()),
                (BudgetScope::Repository, usd("1"), usd("0"), usd("0.8"), usd("0.2"))
            );
            assert_eq!(reserve(&mut conn, ids[2]).as_deref(), Some("0"));
            assert_eq!(hold(&mut conn, ids[2], "0.2"), budgets::CallHold::Held);
            // The first call ends having cost $0.10: the run holds its cost, $0.30 comes back.
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(ids[0], "0.1"), usd("0.4")).unwrap();
            assert_eq!(reserve(&mut conn, ids[0]).as_deref(), Some("0.1"));
            assert_eq!(hold(&mut conn, ids[2], "0.3"), budgets::CallHold::Held);
            assert!(matches!(hold(&mut conn, ids[1], "0.000000001"), budgets::CallHold::Refused(_)));
            // A task without a budget holds nothing; a run that ended holds nothing more.
            assert_eq!(hold(&mut conn, free.id, "1000"), budgets::CallHold::Unbudgeted);
            settle(&mut conn, ids[0], "0.1", at(40));
            assert_eq!(hold(&mut conn, ids[0], "0.01"), budgets::CallHold::NotRunning);
            let month = budgets::repository_month(&mut conn, repo.id, at(41)).unwrap();
            assert_eq!((month.spent, month.reserved), (usd("0.1"), usd("0.9")));
            // Everything is spent or held: a queued task is not claimed, and is blocked.
            let waiting = create(db, &repo, at(42));
            assert!(claim_per_call(&mut conn, "me").is_none());
            let t = tasks::get_task(&mut conn, waiting.id).unwrap();
            assert_eq!(t.blocked_by, Some(BudgetScope::Repository));
        }

        // A run claimed while no budget applied holds nothing; once the instance's budget is
        // set, its first call's hold starts at what its recorded calls cost.
        fn a_hold_started_late_counts_the_runs_calls_so_far(db) {
            let repo = repo(db);
            let task = create(db, &repo, at(1));
            let mut conn = db.conn().unwrap();
            claim_per_call(&mut conn, "me").unwrap();
            assert_eq!(reserve(&mut conn, task.id), None);
            assert_eq!(hold(&mut conn, task.id, "5"), budgets::CallHold::Unbudgeted);
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.3"), usd("0")).unwrap();
            assert_eq!(reserve(&mut conn, task.id), None);
            budgets::set_instance_budget(&mut conn, Some(usd("1")), at(20)).unwrap();
            assert_eq!(hold(&mut conn, task.id, "0.5"), budgets::CallHold::Held);
            assert_eq!(reserve(&mut conn, task.id).as_deref(), Some("0.8"));
            let budgets::CallHold::Refused(short) = hold(&mut conn, task.id, "0.3") else {
                panic!("0.8 held and 0.3 more is over the dollar");
            };
            assert_eq!((short.scope, short.held, short.left()), (BudgetScope::Instance, usd("0.8"), usd("0.2")));
            // A call that held nothing still adds its cost once the hold has started.
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.05"), usd("0")).unwrap();
            assert_eq!(reserve(&mut conn, task.id).as_deref(), Some("0.85"));
        }

        // A run whose replica died is recorded `lost`, without an end time, when its lease has
        // expired: its metered cost is spent in the month it started, not in no month at all
        // (before, the hold went and the money was neither held nor spent).
        fn a_lost_runs_cost_is_spent_in_the_month_it_started(db) {
            let repo = repo(db);
            set_settings(db, &repo, serde_json::json!({"monthlyBudgetUsd": "10"}));
            let task = create(db, &repo, at(1));
            let mut conn = db.conn().unwrap();
            let claimed = claim_per_call(&mut conn, "me").unwrap();
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::Held);
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.5"), usd("1")).unwrap();
            let expired = recover_lost(&mut conn, &claimed);
            assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().cost_usd, Some(usd("0.5")));
            let month = budgets::repository_month(&mut conn, repo.id, expired).unwrap();
            assert_eq!((month.spent, month.reserved), (usd("0.5"), usd("0")));
            let instance = budgets::instance_month(&mut conn, expired).unwrap();
            assert_eq!(instance.spent, usd("0.5"));
        }

        // A call that races its run's recording (the run's gateway closed, the task still
        // running while its pull request is published) holds nothing: before, the cleared
        // hold read as "not started" and came back as the run's cost plus the call, counted
        // a second time beside the spend.
        fn a_call_after_its_run_is_recorded_holds_nothing(db) {
            let (repo, task, mut conn) = running(db, Some("10"));
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::Held);
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.5"), usd("1")).unwrap();
            let run = sonnet_run(task.id, 1, "0.5", at(20));
            runner::record_finished_run(&mut conn, &run, &runner::RunLog::of(""), at(20)).unwrap();
            assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::Running);
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::NotRunning);
            assert_eq!(reserve(&mut conn, task.id), None);
            let month = budgets::repository_month(&mut conn, repo.id, at(31)).unwrap();
            assert_eq!((month.spent, month.reserved), (usd("0.5"), usd("0")));
        }

        // A metered call written after its run is on record (still being written when the
        // recorder stopped waiting for the run's calls) is added to that run, its task and
        // the month's spend: before, it was in the ledger and counted nowhere.
        fn a_call_written_after_its_run_is_recorded_is_added_to_it(db) {
            let (repo, task, mut conn) = running(db, Some("10"));
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.5"), usd("0")).unwrap();
            let run = metered_run(&mut conn, task.id, 1, at(20));
            runner::record_finished_run(&mut conn, &run, &runner::RunLog::of(""), at(20)).unwrap();
            let late = metered_call(task.id, "0.25");
            agentry_persistence::metering::record_held_call(&mut conn, &late, usd("0.3")).unwrap();
            let [run] = &tasks::task_runs(&mut conn, task.id).unwrap()[..] else {
                panic!("one run");
            };
            assert_eq!((run.cost_usd, run.model_calls), (Some(usd("0.75")), Some(2)));
            assert_eq!(run.tokens, late.tokens.checked_add(late.tokens).unwrap());
            let after = tasks::get_task(&mut conn, task.id).unwrap();
            assert_eq!((after.cost_usd, after.input_tokens, after.output_tokens), (Some(usd("0.75")), 200, 2000));
            let month = budgets::repository_month(&mut conn, repo.id, at(31)).unwrap();
            assert_eq!((month.spent, month.reserved), (usd("0.75"), usd("0")));
            assert_eq!(budgets::instance_month(&mut conn, at(31)).unwrap().spent, usd("0.75"));
        }

        // An agent that lives on after its run was recovered as `lost` (its replica stopped
        // renewing, but did not die) is refused further calls, even with no budget set; a
        // call it had in flight is added to the lost run, in the month the run started.
        fn an_agent_alive_after_its_run_was_lost_sends_nothing_more_and_its_last_call_counts(db) {
            let repo = repo(db);
            let task = create(db, &repo, at(1));
            let mut conn = db.conn().unwrap();
            let claimed = claim_per_call(&mut conn, "me").unwrap();
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::Unbudgeted);
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.5"), usd("0")).unwrap();
            let expired = recover_lost(&mut conn, &claimed);
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::NotRunning);
            // The refusal is written as a call, but adds nothing to the run: it was not sent.
            let refused = agentry_persistence::metering::ModelCall {
                outcome: agentry_persistence::metering::REFUSED.into(),
                status: 403,
                tokens: agentry_domain::Tokens::default(),
                cost_usd: None,
                ..metered_call(task.id, "0")
            };
            agentry_persistence::metering::record_held_call(&mut conn, &refused, usd("0")).unwrap();
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.2"), usd("0")).unwrap();
            let [lost] = &tasks::task_runs(&mut conn, task.id).unwrap()[..] else {
                panic!("one run");
            };
            assert_eq!((lost.outcome, lost.cost_usd, lost.model_calls), (RunOutcome::Lost, Some(usd("0.7")), Some(2)));
            assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().cost_usd, Some(usd("0.7")));
            // Spent in the month the lost run started.
            assert_eq!(budgets::instance_month(&mut conn, expired).unwrap().spent, usd("0.7"));
            let next_month = expired + Duration::days(40);
            assert_eq!(budgets::instance_month(&mut conn, next_month).unwrap().spent, usd("0"));
        }

        // With no budget set nothing is held, but a run that is over sends no call: a
        // cancelled run's agent spends for no one.
        fn a_cancelled_run_sends_no_call_even_without_a_budget(db) {
            let repo = repo(db);
            let task = create(db, &repo, at(1));
            let mut conn = db.conn().unwrap();
            claim_per_call(&mut conn, "me").unwrap();
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::Unbudgeted);
            tasks::transition_task(&mut conn, task.id, Trigger::Cancel, &TransitionDetails::default(), at(20)).unwrap();
            assert_eq!(hold(&mut conn, task.id, "1"), budgets::CallHold::NotRunning);
            assert_eq!(hold(&mut conn, Uuid::new_v4(), "1"), budgets::CallHold::NotRunning);
        }

        // A call written while its run is being recorded: the recorder has locked the task and
        // read the run's calls; the call waits for that lock (on SQLite, for the writer's
        // turn), then finds the run on record and adds itself to it. Before, on PostgreSQL,
        // it was written beside the recording and read by neither.
        fn a_call_racing_its_runs_recording_is_counted_once(db) {
            let (_, task, mut conn) = running(db, None);
            agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.5"), usd("0")).unwrap();
            drop(conn);
            let db = wide_pool(db, 2);
            std::thread::scope(|s| {
                let (read, calls_read) = std::sync::mpsc::channel();
                let db = &db;
                let recorder = s.spawn(move || {
                    let mut conn = db.conn().unwrap();
                    agentry_persistence::write_tx::<_, DbError, _>(&mut conn, |conn| {
                        agentry_persistence::revisions::lock_task(conn, task.id)?;
                        let run = metered_run(conn, task.id, 1, at(20));
                        read.send(()).unwrap();
                        if matches!(conn, AnyConnection::Postgresql(_)) {
                            agentry_testkit::wait::eventually(
                                std::time::Duration::from_secs(20),
                                "the call to wait for the task's row",
                                || lock_waiters(conn) > 0,
                            );
                        }
                        runner::record_finished_run(conn, &run, &runner::RunLog::of(""), at(20))?;
                        Ok(())
                    })
                    .unwrap();
                });
                calls_read.recv().unwrap();
                let mut conn = db.conn().unwrap();
                agentry_persistence::metering::record_held_call(&mut conn, &metered_call(task.id, "0.25"), usd("0")).unwrap();
                recorder.join().unwrap();
            });
            let mut conn = db.conn().unwrap();
            let [run] = &tasks::task_runs(&mut conn, task.id).unwrap()[..] else {
                panic!("one run");
            };
            assert_eq!((run.cost_usd, run.model_calls), (Some(usd("0.75")), Some(2)));
            assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().cost_usd, Some(usd("0.75")));
        }

        // Eight callers race over ten runs that share a $1 instance budget, each call holding
        // $0.03: the holds never add up to more than the dollar, whoever wins (33 calls, $0.99).
        fn racing_calls_never_hold_more_than_the_budget(db) {
            let repo = repo(db);
            let ids: Vec<Uuid> = (0..10).map(|i| create(db, &repo, at(i)).id).collect();
            {
                let mut conn = db.conn().unwrap();
                budgets::set_instance_budget(&mut conn, Some(usd("1")), T0).unwrap();
                while claim_per_call(&mut conn, "me").is_some() {}
            }
            let db = wide_pool(db, 8);
            let held = race(&db, 8, |i, conn| {
                let mut held = 0usize;
                for k in 0.. {
                    let task = ids[(i + k * 8) % ids.len()];
                    match hold(conn, task, "0.03") {
                        budgets::CallHold::Held => held += 1,
                        budgets::CallHold::Refused(_) => break,
                        other => panic!("{other:?}"),
                    }
                }
                held
            });
            assert_eq!(held.iter().sum::<usize>(), 33, "{held:?}");
            let mut conn = db.conn().unwrap();
            assert_eq!(budgets::reserved_nanos(&mut conn, None).unwrap(), 990_000_000);
        }
    }
}
