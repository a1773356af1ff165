//! Claims, leases, lease recovery and run logs (docs/contract.md#22-states-and-transitions, #61-runner), on both backends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::common::*;
use crate::rollups::assert_rollups_rebuild_the_same;
use agentry_domain::{TaskState, Tokens, Trigger};
use agentry_persistence::runner::{self, MAX_LOG_BYTES, RunLog, RunRecorded};
use agentry_persistence::tasks::{self, Run, RunOutcome, TransitionDetails};
use time::Duration;
use uuid::Uuid;

const LEASE: Duration = Duration::seconds(60);

fn lost_run(task: &agentry_domain::Task, cost: Option<&str>) -> Run {
    Run {
        cost_usd: cost.map(usd),
        tokens: Tokens {
            input: 10,
            output: 5,
            ..Tokens::default()
        },
        outcome: RunOutcome::Lost,
        exit_code: None,
        error_message: Some("the runner died".into()),
        finished_at: None,
        ..agentry_persistence::test_support::succeeded_run(task.id, task.attempt, at(1))
    }
}

/// The only queued task claimed by "slow" at 10 s, recovered once its lease expired (no run
/// salvaged), then claimed again by "other" at 80 s: the task at its first and second
/// attempts.
fn recovered_and_claimed_again(
    conn: &mut agentry_persistence::AnyConnection,
) -> (agentry_domain::Task, agentry_domain::Task) {
    let first = runner::claim_next(conn, "slow", at(10), LEASE)
        .unwrap()
        .unwrap();
    let expired = runner::expired_leases(conn, at(71), 10).unwrap();
    runner::recover_expired(conn, &expired[0], at(71), None, at(72))
        .unwrap()
        .unwrap();
    let second = runner::claim_next(conn, "other", at(80), LEASE)
        .unwrap()
        .unwrap();
    (first, second)
}

agentry_persistence::backend_tests! {
    // Oldest queued first; the claim moves it to provisioning with the lease, a `claim`
    // event and startedAt; nothing queued → None.
    fn claims_oldest_queued_first(db) {
        let repo = repo(db);
        let newer = create(db, &repo, at(20));
        let older = create(db, &repo, at(10));
        let mut conn = db.conn().unwrap();
        let first = runner::claim_next(&mut conn, "me", at(100), LEASE).unwrap().unwrap();
        assert_eq!(first.id, older.id);
        assert_eq!(first.state, TaskState::Provisioning);
        assert_eq!(first.started_at, Some(at(100)));
        let events = tasks::task_events(&mut conn, older.id).unwrap();
        assert_eq!(events.last().unwrap().reason, "claim");
        assert_eq!(events.last().unwrap().from, Some(TaskState::Queued));
        let second = runner::claim_next(&mut conn, "me", at(101), LEASE).unwrap().unwrap();
        assert_eq!(second.id, newer.id);
        assert!(runner::claim_next(&mut conn, "me", at(102), LEASE).unwrap().is_none());
    }

    // Eight claimers racing over 20 queued tasks: every task is claimed exactly once.
    fn concurrent_claims_never_share_a_task(db) {
        let repo = repo(db);
        for i in 0..20 {
            create(db, &repo, at(i));
        }
        let pool = wide_pool(db, 8);
        let seen = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            for w in 0..8 {
                let pool = pool.clone();
                let seen = seen.clone();
                s.spawn(move || {
                    let mut conn = pool.conn().unwrap();
                    while let Some(t) =
                        runner::claim_next(&mut conn, &format!("w{w}"), at(100), LEASE).unwrap()
                    {
                        seen.lock().unwrap().push(t.id);
                    }
                });
            }
        });
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 20);
        assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 20);
    }

    // Renewal works for the owner while the task is being worked on, and stops working once
    // the task was cancelled or the lease belongs to someone else.
    fn renewal_is_the_owners_and_stops_on_cancel(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        // The lease stays through provisioning → running.
        tasks::transition_task(&mut conn, task.id, Trigger::AgentStarted, &TransitionDetails::default(), at(11)).unwrap();
        assert!(runner::renew_lease(&mut conn, task.id, 1, "me", at(200)).unwrap());
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "other", at(200)).unwrap());
        // Not expired at 150 any more: the renewal moved it to 200.
        assert!(runner::expired_leases(&mut conn, at(150), 10).unwrap().is_empty());
        tasks::transition_task(&mut conn, task.id, Trigger::Cancel, &TransitionDetails::default(), at(20)).unwrap();
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "me", at(300)).unwrap());
        // Retried and claimed again by the same owner (one process claims under one name):
        // the cancelled attempt's renewal is still refused, its agent stopped; the new one's
        // is not. The old run's own transitions leave the new attempt alone.
        tasks::transition_task(&mut conn, task.id, Trigger::Retry, &TransitionDetails::default(), at(21)).unwrap();
        let again = runner::claim_next(&mut conn, "me", at(22), LEASE).unwrap().unwrap();
        assert_eq!((again.id, again.attempt), (task.id, 2));
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "me", at(300)).unwrap());
        assert!(runner::renew_lease(&mut conn, task.id, 2, "me", at(300)).unwrap());
        let stale = tasks::transition_task_at(&mut conn, task.id, 1, Trigger::AgentStarted, &TransitionDetails::default(), at(23));
        assert!(stale.unwrap().is_none());
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::Provisioning);
        let (moved, _) = tasks::transition_task_at(&mut conn, task.id, 2, Trigger::AgentStarted, &TransitionDetails::default(), at(24))
            .unwrap()
            .unwrap();
        assert_eq!(moved.state, TaskState::Running);
    }

    // An expired lease is recovered once: the lost run (with the cost its output showed) and
    // its log are recorded with the transition back to queued (attempt 2); a second
    // recoverer gets None.
    fn expired_lease_is_recovered_once_with_its_cost(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        runner::claim_next(&mut conn, "dead", at(10), LEASE).unwrap().unwrap();
        assert!(runner::expired_leases(&mut conn, at(69), 10).unwrap().is_empty());
        let expired = runner::expired_leases(&mut conn, at(71), 10).unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].owner, "dead");
        let run = lost_run(&expired[0].task, Some("0.25"));
        let log = RunLog::of("partial output\n");
        let (after, t) = runner::recover_expired(&mut conn, &expired[0], at(71), Some((&run, Some(&log))), at(72))
            .unwrap()
            .unwrap();
        assert_eq!(t.to, TaskState::Queued);
        assert_eq!(after.attempt, 2);
        assert_eq!(after.cost_usd.unwrap().to_string(), "0.25");
        assert_eq!(after.input_tokens, 10);
        let (run_id, attempt, stored) = runner::latest_run_log(&mut conn, task.id).unwrap().unwrap();
        assert_eq!((run_id, attempt), (run.id, 1));
        assert_eq!(stored, log);
        assert!(runner::recover_expired(&mut conn, &expired[0], at(71), None, at(73)).unwrap().is_none());
        // The old owner can no longer renew.
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "dead", at(500)).unwrap());
    }

    // A run that ends after its task was cancelled (the cancel came while its work was being
    // committed or pushed) is recorded, its cost counted, but it is not the runner's to
    // publish: `Stopped`, not `Current`.
    fn a_run_recorded_after_its_task_was_cancelled_publishes_nothing(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        let claimed = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        tasks::transition_task(&mut conn, task.id, Trigger::Cancel, &TransitionDetails::default(), at(20)).unwrap();
        let run = Run { finished_at: Some(at(21)), ..lost_run(&claimed, Some("0.4")) };
        let run = Run { outcome: RunOutcome::Succeeded, ..run };
        assert_eq!(
            runner::record_finished_run(&mut conn, &run, &RunLog::of("done"), at(21)).unwrap(),
            RunRecorded::Stopped
        );
        let after = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!((after.state, after.cost_usd.unwrap().to_string()), (TaskState::Cancelled, "0.4".to_owned()));
    }

    // A finished run is recorded at once, before publishing (its reserve released), and
    // exactly once per attempt: recording it again, or a recoverer salvaging the same
    // attempt's output, adds nothing; the task's cost is that run's.
    fn a_finished_run_is_recorded_once_per_attempt(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        let claimed = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        let mut run = lost_run(&claimed, Some("0.5"));
        run.outcome = RunOutcome::Succeeded;
        run.finished_at = Some(at(20));
        let log = RunLog::of("result\n");
        assert_eq!(runner::record_finished_run(&mut conn, &run, &log, at(20)).unwrap(), RunRecorded::Current);
        let again = Run { id: Uuid::new_v4(), ..run.clone() };
        assert_eq!(runner::record_finished_run(&mut conn, &again, &log, at(21)).unwrap(), RunRecorded::AlreadyRecorded);
        let during = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(during.state, TaskState::Provisioning, "recording changes no state");
        assert_eq!(during.cost_usd.unwrap().to_string(), "0.5");
        // The runner dies while publishing; a recoverer salvages the same output.
        let expired = runner::expired_leases(&mut conn, at(71), 10).unwrap();
        let salvaged = lost_run(&expired[0].task, Some("0.5"));
        let (after, t) = runner::recover_expired(&mut conn, &expired[0], at(71), Some((&salvaged, None)), at(72))
            .unwrap()
            .unwrap();
        assert_eq!((t.to, after.attempt), (TaskState::Queued, 2));
        assert_eq!(after.cost_usd.unwrap().to_string(), "0.5", "the salvaged run was counted twice");
        let runs = tasks::task_runs(&mut conn, task.id).unwrap();
        assert_eq!(runs.iter().map(|r| (r.attempt, r.id)).collect::<Vec<_>>(), vec![(1, run.id)]);
    }

    // A run that ends after its task was recovered elsewhere (no output salvaged) is still
    // recorded, its cost counted, but it is late: the current attempt and its reserve are
    // the recoverer's.
    fn a_late_run_is_recorded_but_not_current(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        let (first, _) = recovered_and_claimed_again(&mut conn);
        let mut late = lost_run(&first, Some("0.75"));
        late.outcome = RunOutcome::Succeeded;
        assert_eq!(runner::record_finished_run(&mut conn, &late, &RunLog::of("late"), at(90)).unwrap(), RunRecorded::Late);
        let now = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!((now.state, now.attempt), (TaskState::Provisioning, 2));
        assert_eq!(now.cost_usd.unwrap().to_string(), "0.75");
        assert!(runner::renew_lease(&mut conn, task.id, 2, "other", at(100)).unwrap());
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "other", at(100)).unwrap());
    }

    // A late run of an earlier attempt adds its cost but leaves the task's model that of its
    // current attempt (before, whichever run was written last set it, moving the task's whole
    // cost and outcome to the old model in the report); a blank model is no model.
    fn a_late_run_does_not_take_the_task_back_to_its_model(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        let (first, second) = recovered_and_claimed_again(&mut conn);
        let mut current = lost_run(&second, Some("1"));
        current.model = Some("model-b".into());
        current.outcome = RunOutcome::Succeeded;
        runner::record_finished_run(&mut conn, &current, &RunLog::of(""), at(90)).unwrap();
        let mut late = lost_run(&first, Some("2"));
        late.model = Some("model-a".into());
        late.outcome = RunOutcome::Succeeded;
        assert_eq!(runner::record_finished_run(&mut conn, &late, &RunLog::of(""), at(95)).unwrap(), RunRecorded::Late);
        let now = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(now.model_used.as_deref(), Some("model-b"));
        assert_eq!(now.cost_usd.unwrap().to_string(), "3");
        assert_rollups_rebuild_the_same(&mut conn);

        // A run that reports a blank model records none.
        let other = create(db, &repo, at(100));
        let claimed = runner::claim_next(&mut conn, "me", at(110), LEASE).unwrap().unwrap();
        assert_eq!(claimed.id, other.id);
        let mut blank = lost_run(&claimed, Some("0.5"));
        blank.model = Some("  ".into());
        blank.outcome = RunOutcome::Succeeded;
        runner::record_finished_run(&mut conn, &blank, &RunLog::of(""), at(120)).unwrap();
        assert_eq!(tasks::get_task(&mut conn, other.id).unwrap().model_used, None);
        let runs = tasks::task_runs(&mut conn, other.id).unwrap();
        assert_eq!(runs[0].model, None);
        assert_rollups_rebuild_the_same(&mut conn);
    }

    // A cancel keeps the attempt's lease for its run: the live runner renews it while it
    // stops the agent (so recovery does not take it for dead), and recording the run
    // releases it. Before, the lease went with the cancel and could not be renewed, and a
    // runner slower to stop than the lease was taken for a dead one.
    fn a_cancelled_runs_lease_is_kept_until_its_run_is_recorded(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        let claimed = runner::claim_next(&mut conn, "me", at(10), LEASE).unwrap().unwrap();
        tasks::transition_task(&mut conn, task.id, Trigger::Cancel, &TransitionDetails::default(), at(20)).unwrap();
        assert!(!runner::renew_lease(&mut conn, task.id, 1, "me", at(100)).unwrap());
        assert!(!runner::renew_stopped_lease(&mut conn, task.id, 1, "other", at(100)).unwrap());
        assert!(runner::renew_stopped_lease(&mut conn, task.id, 1, "me", at(100)).unwrap());
        // Renewed: not abandoned at 71 s, as the first lease would have been.
        assert!(runner::abandoned_leases(&mut conn, at(71), 10).unwrap().is_empty());
        assert_eq!(runner::abandoned_leases(&mut conn, at(101), 10).unwrap().len(), 1);
        let mut run = lost_run(&claimed, Some("0.5"));
        run.outcome = RunOutcome::Cancelled;
        assert_eq!(runner::record_finished_run(&mut conn, &run, &RunLog::of(""), at(90)).unwrap(), RunRecorded::Stopped);
        assert!(runner::abandoned_leases(&mut conn, at(1000), 10).unwrap().is_empty());
        assert!(!runner::renew_stopped_lease(&mut conn, task.id, 1, "me", at(200)).unwrap());
    }

    // After the third attempt dies the task fails with a message instead of looping.
    fn third_lost_attempt_fails_the_task(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        for round in 0..3 {
            let base = round * 1000;
            runner::claim_next(&mut conn, "dead", at(base), LEASE).unwrap().unwrap();
            let expired = runner::expired_leases(&mut conn, at(base + 61), 10).unwrap();
            runner::recover_expired(&mut conn, &expired[0], at(base + 61), None, at(base + 62)).unwrap().unwrap();
        }
        let task = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(task.state, TaskState::Failed);
        assert_eq!(task.attempt, 3);
        assert!(task.error_message.unwrap().contains("3 attempts"));
    }

    // Logs keep the end of oversized output and lose NULs; the latest run's log is served.
    fn run_logs_keep_the_end(db) {
        let repo = repo(db);
        let task = create(db, &repo, at(0));
        let mut conn = db.conn().unwrap();
        assert!(runner::latest_run_log(&mut conn, task.id).unwrap().is_none());
        let big = format!("{}é{}", "x".repeat(MAX_LOG_BYTES), "THE END");
        let log = RunLog::of(&big);
        assert!(log.truncated);
        assert!(log.content.len() <= MAX_LOG_BYTES);
        assert!(log.content.ends_with("éTHE END"));
        assert_eq!(RunLog::of("a\0b").content, "ab");
        let first = lost_run(&task, None);
        let mut second = lost_run(&task, None);
        second.started_at = at(5);
        agentry_persistence::write_tx(&mut conn, |conn| {
            tasks::record_run(conn, &first)?;
            runner::save_run_log(conn, first.id, task.id, &RunLog::of("first"), at(2))?;
            tasks::record_run(conn, &second)?;
            runner::save_run_log(conn, second.id, task.id, &log, at(6))
        })
        .unwrap();
        let (id, _, stored) = runner::latest_run_log(&mut conn, task.id).unwrap().unwrap();
        assert_eq!(id, second.id);
        assert_eq!(stored, log);
    }
}
