//! Task transitions (docs/contract.md#22-states-and-transitions): compare-and-set on the state, with their events.

use crate::common::*;
use agentry_domain::{MAX_ATTEMPTS, Task, TaskState, TaskType, Trigger, transition};
use agentry_persistence::tasks::{self, NewTask, TransitionDetails};
use agentry_persistence::{AnyConnection, DbError};
use time::OffsetDateTime;
use uuid::Uuid;

/// Applies `trigger` with no details.
fn apply(conn: &mut AnyConnection, id: Uuid, trigger: Trigger, now: OffsetDateTime) -> Task {
    apply_with(conn, id, trigger, &TransitionDetails::default(), now)
}

/// Applies `trigger` with `details`.
fn apply_with(
    conn: &mut AnyConnection,
    id: Uuid,
    trigger: Trigger,
    details: &TransitionDetails,
    now: OffsetDateTime,
) -> Task {
    tasks::transition_task(conn, id, trigger, details, now)
        .unwrap_or_else(|e| panic!("{trigger}: {e}"))
        .0
}

/// Applies `trigger` with the error `message` at `now`; asserts that the task failed then,
/// with that message.
fn fails_with(
    conn: &mut AnyConnection,
    id: Uuid,
    trigger: Trigger,
    message: &str,
    now: OffsetDateTime,
) -> Task {
    let details = TransitionDetails {
        error_message: Some(message.into()),
        ..Default::default()
    };
    let t = apply_with(conn, id, trigger, &details, now);
    assert_eq!(t.state, TaskState::Failed);
    assert_eq!(t.error_message.as_deref(), Some(message));
    assert_eq!(t.finished_at, Some(now));
    t
}

/// A state on a task's way, in a test that walks it: the triggers refused there, then the
/// steps (trigger, at second) that lead on.
type Stage = (&'static [Trigger], &'static [(Trigger, i64)]);

/// Asserts that `trigger` is refused on the task and that nothing changed.
fn assert_refused(conn: &mut AnyConnection, id: Uuid, trigger: Trigger) {
    let before = tasks::get_task(conn, id).unwrap();
    let events_before = tasks::task_events(conn, id).unwrap();
    let details = TransitionDetails {
        reason: Some("should not be recorded".into()),
        error_message: Some("should not be recorded".into()),
        pull_request: Some(agentry_domain::PullRequestRef {
            url: "https://github.com/o/r/pull/999".into(),
            number: 999,
        }),
    };
    match tasks::transition_task(conn, id, trigger, &details, at(3600)) {
        Err(DbError::InvalidTransition(e)) => {
            assert_eq!((e.from, e.trigger), (before.state, trigger));
        }
        other => panic!(
            "{trigger} on {}: expected InvalidTransition, got {other:?}",
            before.state
        ),
    }
    assert_eq!(
        tasks::get_task(conn, id).unwrap(),
        before,
        "{trigger} changed the task"
    );
    assert_eq!(tasks::task_events(conn, id).unwrap(), events_before);
}

/// Replays the task's events through the state machine from `queued` and checks they end
/// in the stored state and attempt.
fn assert_events_replay_to_state(conn: &mut AnyConnection, task: &Task, triggers: &[Trigger]) {
    let events = tasks::task_events(conn, task.id).unwrap();
    assert_eq!((events[0].from, events[0].to), (None, TaskState::Queued));
    assert_eq!(events.len(), triggers.len() + 1);
    let (mut state, mut attempt) = (TaskState::Queued, 1);
    for (event, trigger) in events[1..].iter().zip(triggers) {
        assert_eq!(event.from, Some(state), "events chain: {events:?}");
        let t = transition(state, *trigger, task.task_type, attempt).unwrap();
        assert_eq!(event.to, t.to);
        (state, attempt) = (t.to, t.attempt);
    }
    assert_eq!((state, attempt), (task.state, task.attempt));
}

agentry_persistence::backend_tests! {
    // A run recorded while a transition of its task is being decided (a cancel as the agent
    // ends, a merge during a revision round) is counted once in the cost rollups: the
    // transition locks the row before reading it (before, on PostgreSQL, it read the task
    // before the run's cost, wrote after it, and the rollups added that cost a second time).
    fn a_transition_racing_a_recorded_run_counts_its_cost_once(db) {
        let db = wide_pool(db, 4);
        let repo = repo(&db);
        let task = create(&db, &repo, agentry_persistence::now());
        let run = sonnet_run(task.id, 1, "1.5", agentry_persistence::now());
        let (recording, recorded) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let db = &db;
            let recorder = s.spawn(move || {
                let mut conn = db.conn().unwrap();
                agentry_persistence::write_tx::<_, DbError, _>(&mut conn, |conn| {
                    tasks::record_run(conn, &run)?;
                    recording.send(()).unwrap();
                    // On PostgreSQL the transaction stays open until the cancel below waits
                    // for the task's row (which it does before reading the task, or, before
                    // the fix, after): so the cancel is decided while the run is recorded.
                    if matches!(conn, AnyConnection::Postgresql(_)) {
                        agentry_testkit::wait::eventually(
                            std::time::Duration::from_secs(20),
                            "the cancel to wait for the task's row",
                            || lock_waiters(conn) > 0,
                        );
                    }
                    Ok(())
                })
                .unwrap();
            });
            let mut conn = db.conn().unwrap();
            if matches!(&*conn, AnyConnection::Postgresql(_)) {
                recorded.recv().unwrap();
            }
            apply(&mut conn, task.id, Trigger::Cancel, agentry_persistence::now());
            recorder.join().unwrap();
        });
        use agentry_persistence::schema::{cost_daily, tasks as task_rows};
        use diesel::prelude::*;
        let mut conn = db.conn().unwrap();
        let daily: Vec<i64> = cost_daily::table.select(cost_daily::cost_nanos).load(&mut *conn).unwrap();
        let costs: Vec<Option<i64>> = task_rows::table.select(task_rows::cost_nanos).load(&mut *conn).unwrap();
        assert_eq!(daily.iter().sum::<i64>(), 1_500_000_000);
        assert_eq!(costs.iter().flatten().sum::<i64>(), 1_500_000_000);
    }

    // queued → provisioning → running → pr_opened → completed, with the pull request, the
    // start and finish times and one event per step (reason = trigger name by default).
    fn happy_path_records_every_step(db) {
        let (task, mut conn) = a_task(db);

        let (t, tr) = tasks::transition_task(
            &mut conn,
            task.id,
            Trigger::Claim,
            &TransitionDetails::default(),
            at(1),
        )
        .unwrap();
        assert_eq!(
            (tr.from, tr.to, tr.attempt),
            (TaskState::Queued, TaskState::Provisioning, 1)
        );
        assert_eq!(t.state, TaskState::Provisioning);
        assert_eq!(t.started_at, Some(at(1)));
        assert_eq!(t.updated_at, at(1));
        assert_eq!(t.finished_at, None);
        assert_eq!(t.created_at, T0);

        let t = apply(&mut conn, task.id, Trigger::AgentStarted, at(2));
        assert_eq!(t.state, TaskState::Running);
        assert_eq!(t.started_at, Some(at(1)), "started_at is the claim time");

        let details = TransitionDetails {
            reason: Some("pull request #17 opened".into()),
            pull_request: Some(agentry_domain::PullRequestRef { url: "https://github.com/o/r/pull/17".into(), number: 17 }),
            ..Default::default()
        };
        let t = apply_with(&mut conn, task.id, Trigger::PullRequestOpened, &details, at(3));
        assert_eq!(t.state, TaskState::PrOpened);
        assert_eq!(t.pr_url.as_deref(), Some("https://github.com/o/r/pull/17"));
        assert_eq!(t.pr_number, Some(17));
        assert_eq!(t.finished_at, None);

        let t = apply(&mut conn, task.id, Trigger::PullRequestMerged, at(4));
        assert_eq!(t.state, TaskState::Completed);
        assert_eq!(t.finished_at, Some(at(4)));
        assert_eq!(t.updated_at, at(4));
        assert_eq!(t.pr_number, Some(17), "the pull request stays recorded");
        assert_eq!(t.error_message, None);
        assert_eq!(t.attempt, 1);
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap(), t);

        let events: Vec<_> = tasks::task_events(&mut conn, task.id)
            .unwrap()
            .into_iter()
            .map(|e| (e.from, e.to, e.reason, e.at))
            .collect();
        use TaskState::*;
        assert_eq!(
            events,
            vec![
                (None, Queued, "created".to_owned(), T0),
                (Some(Queued), Provisioning, "claim".to_owned(), at(1)),
                (
                    Some(Provisioning),
                    Running,
                    "agent_started".to_owned(),
                    at(2)
                ),
                (
                    Some(Running),
                    PrOpened,
                    "pull request #17 opened".to_owned(),
                    at(3)
                ),
                (
                    Some(PrOpened),
                    Completed,
                    "pull_request_merged".to_owned(),
                    at(4)
                ),
            ]
        );
    }

    // Events recorded within the same microsecond still come back in the order applied.
    fn events_at_the_same_instant_keep_their_order(db) {
        let (task, mut conn) = a_task(db);
        for trigger in [
            Trigger::Claim,
            Trigger::Fail,
            Trigger::Retry,
            Trigger::Claim,
            Trigger::AgentStarted,
            Trigger::Cancel,
            Trigger::Retry,
        ] {
            apply(&mut conn, task.id, trigger, T0);
        }
        let reasons: Vec<_> = tasks::task_events(&mut conn, task.id)
            .unwrap()
            .into_iter()
            .map(|e| e.reason)
            .collect();
        assert_eq!(
            reasons,
            [
                "created",
                "claim",
                "fail",
                "retry",
                "claim",
                "agent_started",
                "cancel",
                "retry"
            ]
        );
    }

    // A review task completes from running when its review is posted; it cannot open a
    // pull request, and a coding task cannot post a review.
    fn review_task_completes_on_review_posted(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let review = NewTask {
            task_type: TaskType::Review,
            ..new_task(&repo, T0)
        };
        tasks::create_task(&mut conn, &review, "review launched").unwrap();
        apply(&mut conn, review.id, Trigger::Claim, at(1));
        apply(&mut conn, review.id, Trigger::AgentStarted, at(2));
        assert_refused(&mut conn, review.id, Trigger::PullRequestOpened);
        let t = apply(&mut conn, review.id, Trigger::ReviewPosted, at(3));
        assert_eq!(t.state, TaskState::Completed);
        assert_eq!(t.finished_at, Some(at(3)));

        let coding = create(db, &repo, T0);
        apply(&mut conn, coding.id, Trigger::Claim, at(1));
        apply(&mut conn, coding.id, Trigger::AgentStarted, at(2));
        assert_refused(&mut conn, coding.id, Trigger::ReviewPosted);
    }

    // Refused transitions change nothing: state, updated_at, fields, events.
    fn refused_transitions_change_nothing(db) {
        let (task, mut conn) = a_task(db);
        let stages: [Stage; 3] = [
            (
                &[
                    Trigger::PullRequestMerged,
                    Trigger::PullRequestClosed,
                    Trigger::Retry,
                    Trigger::Fail,
                    Trigger::AgentStarted,
                    Trigger::LeaseExpired,
                    Trigger::PullRequestOpened,
                    Trigger::ReviewPosted,
                ],
                &[
                    (Trigger::Claim, 1),
                    (Trigger::AgentStarted, 2),
                    (Trigger::PullRequestOpened, 3),
                ],
            ),
            (
                &[
                    Trigger::Claim,
                    Trigger::Cancel,
                    Trigger::Fail,
                    Trigger::Retry,
                    Trigger::LeaseExpired,
                    Trigger::AgentStarted,
                ],
                &[(Trigger::PullRequestMerged, 4)],
            ),
            // Every trigger is refused on a completed task.
            (&Trigger::ALL, &[]),
        ];
        for (refused, steps) in stages {
            for trigger in refused {
                assert_refused(&mut conn, task.id, *trigger);
            }
            for (trigger, secs) in steps {
                apply(&mut conn, task.id, *trigger, at(*secs));
            }
        }
        assert_eq!(tasks::task_events(&mut conn, task.id).unwrap().len(), 5);
    }

    // Fail stores the error message (a default one when none is given); Retry re-queues with
    // attempt + 1 and clears the error and the finish time.
    fn fail_then_retry(db) {
        let (task, mut conn) = a_task(db);
        apply(&mut conn, task.id, Trigger::Claim, at(1));
        apply(&mut conn, task.id, Trigger::AgentStarted, at(2));
        fails_with(&mut conn, task.id, Trigger::Fail, "the agent made no changes", at(3));
        assert_eq!(
            tasks::task_events(&mut conn, task.id)
                .unwrap()
                .last()
                .unwrap()
                .reason,
            "fail"
        );

        let t = apply(&mut conn, task.id, Trigger::Retry, at(4));
        assert_eq!(t.state, TaskState::Queued);
        assert_eq!(t.attempt, 2);
        assert_eq!(t.error_message, None);
        assert_eq!(t.finished_at, None);
        assert_eq!(t.updated_at, at(4));

        // Second attempt: claimed again (new start time), fails without a message.
        let t = apply(&mut conn, task.id, Trigger::Claim, at(5));
        assert_eq!(t.started_at, Some(at(5)));
        assert_eq!(t.attempt, 2);
        let t = apply(&mut conn, task.id, Trigger::Fail, at(6));
        assert_eq!(t.state, TaskState::Failed);
        assert!(t.error_message.as_deref().is_some_and(|m| !m.is_empty()));

        // Cancel then retry.
        let t = apply(&mut conn, task.id, Trigger::Retry, at(7));
        assert_eq!((t.state, t.attempt), (TaskState::Queued, 3));
        let t = apply(&mut conn, task.id, Trigger::Cancel, at(8));
        assert_eq!(
            (t.state, t.finished_at, t.error_message.clone()),
            (TaskState::Cancelled, Some(at(8)), None)
        );
        let t = apply(&mut conn, task.id, Trigger::Retry, at(9));
        assert_eq!(
            (t.state, t.attempt, t.finished_at),
            (TaskState::Queued, 4, None)
        );
        assert_events_replay_to_state(
            &mut conn,
            &t,
            &[
                Trigger::Claim,
                Trigger::AgentStarted,
                Trigger::Fail,
                Trigger::Retry,
                Trigger::Claim,
                Trigger::Fail,
                Trigger::Retry,
                Trigger::Cancel,
                Trigger::Retry,
            ],
        );
    }

    // A closed (unmerged) pull request fails the task with a message.
    fn closed_pull_request_fails_the_task(db) {
        let (task, mut conn) = a_task(db);
        apply(&mut conn, task.id, Trigger::Claim, at(1));
        apply(&mut conn, task.id, Trigger::AgentStarted, at(2));
        let pr = TransitionDetails {
            pull_request: Some(agentry_domain::PullRequestRef { url: "https://github.com/o/r/pull/3".into(), number: 3 }),
            ..Default::default()
        };
        apply_with(&mut conn, task.id, Trigger::PullRequestOpened, &pr, at(3));
        let message = "the pull request was closed without being merged";
        let t = fails_with(&mut conn, task.id, Trigger::PullRequestClosed, message, at(4));
        assert_eq!(t.pr_number, Some(3));
    }

    // Expired leases re-queue with attempt + 1 until MAX_ATTEMPTS; at attempt 3 the task fails
    // (attempt unchanged).
    fn lease_expiry_requeues_then_fails_at_max_attempts(db) {
        let (task, mut conn) = a_task(db);
        let mut triggers = vec![];
        for attempt in 1..MAX_ATTEMPTS {
            apply(
                &mut conn,
                task.id,
                Trigger::Claim,
                at(10 * i64::from(attempt)),
            );
            let t = apply(
                &mut conn,
                task.id,
                Trigger::LeaseExpired,
                at(10 * i64::from(attempt) + 1),
            );
            assert_eq!((t.state, t.attempt), (TaskState::Queued, attempt + 1));
            assert_eq!(t.finished_at, None);
            triggers.extend([Trigger::Claim, Trigger::LeaseExpired]);
        }
        apply(&mut conn, task.id, Trigger::Claim, at(100));
        let t = apply(&mut conn, task.id, Trigger::AgentStarted, at(101));
        assert_eq!(t.attempt, MAX_ATTEMPTS);
        let t = apply(&mut conn, task.id, Trigger::LeaseExpired, at(102));
        assert_eq!((t.state, t.attempt), (TaskState::Failed, MAX_ATTEMPTS));
        assert_eq!(t.finished_at, Some(at(102)));
        assert!(t.error_message.is_some());
        triggers.extend([Trigger::Claim, Trigger::AgentStarted, Trigger::LeaseExpired]);
        assert_events_replay_to_state(&mut conn, &t, &triggers);
        let last = tasks::task_events(&mut conn, task.id)
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(
            (last.from, last.to, last.reason.as_str()),
            (Some(TaskState::Running), TaskState::Failed, "lease_expired")
        );
    }

    // An unknown task id is NotFound, and no event is written for it.
    fn transition_of_unknown_task_is_not_found(db) {
        let mut conn = db.conn().unwrap();
        let id = Uuid::new_v4();
        let result = tasks::transition_task(
            &mut conn,
            id,
            Trigger::Claim,
            &TransitionDetails::default(),
            T0,
        );
        assert!(matches!(result, Err(DbError::NotFound)), "{result:?}");
        assert_eq!(row_count(db, "task_events"), 0);
    }

    // 20 actors apply "merged" to one pr_opened task at once: exactly one succeeds, the others
    // are refused, and exactly one pr_opened → completed event exists.
    fn concurrent_merges_apply_exactly_once(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        {
            let mut conn = db.conn().unwrap();
            apply(&mut conn, task.id, Trigger::Claim, at(1));
            apply(&mut conn, task.id, Trigger::AgentStarted, at(2));
            apply(&mut conn, task.id, Trigger::PullRequestOpened, at(3));
        }
        let wide = wide_pool(db, 20);
        let results = race(&wide, 20, |i, conn| {
            tasks::transition_task(
                conn,
                task.id,
                Trigger::PullRequestMerged,
                &TransitionDetails {
                    reason: Some(format!("actor {i}")),
                    ..Default::default()
                },
                at(10 + i as i64),
            )
        });
        let mut ok = 0;
        for r in &results {
            match r {
                Ok((t, tr)) => {
                    ok += 1;
                    assert_eq!(
                        (tr.from, tr.to),
                        (TaskState::PrOpened, TaskState::Completed)
                    );
                    assert_eq!(t.state, TaskState::Completed);
                }
                Err(DbError::InvalidTransition(e)) => assert_eq!(e.from, TaskState::Completed),
                Err(e) => panic!("unexpected error: {e:?}"),
            }
        }
        assert_eq!(ok, 1, "exactly one actor applies the merge");
        let mut conn = db.conn().unwrap();
        let events = tasks::task_events(&mut conn, task.id).unwrap();
        let merges: Vec<_> = events
            .iter()
            .filter(|e| e.from == Some(TaskState::PrOpened) && e.to == TaskState::Completed)
            .collect();
        assert_eq!(merges.len(), 1, "{events:?}");
        assert_eq!(events.len(), 5);
        // The stored finish time is the winner's.
        let winner = results.iter().position(Result::is_ok).unwrap();
        assert_eq!(merges[0].reason, format!("actor {winner}"));
        assert_eq!(
            tasks::get_task(&mut conn, task.id).unwrap().finished_at,
            Some(at(10 + winner as i64))
        );
    }

    // 10 cancels race 10 claims on one queued task. Claim-then-cancel is legal, so there may
    // be one or two winners; whatever happened, the event log replays through the state
    // machine to the stored state, and there is one event per successful call (+ creation).
    fn concurrent_cancel_and_claim_stay_consistent(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        let wide = wide_pool(db, 20);
        let results = race(&wide, 20, |i, conn| {
            let trigger = if i % 2 == 0 {
                Trigger::Cancel
            } else {
                Trigger::Claim
            };
            let result = tasks::transition_task(
                conn,
                task.id,
                trigger,
                &TransitionDetails::default(),
                at(1),
            );
            (trigger, result)
        });
        let mut succeeded = vec![];
        for (trigger, r) in &results {
            match r {
                Ok((_, tr)) => succeeded.push((*trigger, tr.from, tr.to)),
                Err(DbError::InvalidTransition(_)) => {}
                Err(e) => panic!("unexpected error: {e:?}"),
            }
        }
        let mut conn = db.conn().unwrap();
        let stored = tasks::get_task(&mut conn, task.id).unwrap();
        let events = tasks::task_events(&mut conn, task.id).unwrap();
        assert_eq!(events.len(), succeeded.len() + 1, "{events:?}");
        // Cancel is legal from queued and provisioning, so a cancel only loses once the task
        // is cancelled: exactly one cancel wins, at most one claim (before it), and the task
        // ends cancelled.
        assert!(
            succeeded.iter().filter(|s| s.0 == Trigger::Claim).count() <= 1,
            "{succeeded:?}"
        );
        assert_eq!(
            succeeded.iter().filter(|s| s.0 == Trigger::Cancel).count(),
            1,
            "{succeeded:?}"
        );
        assert_eq!(stored.state, TaskState::Cancelled);
        // Replay the log in order.
        let mut state = TaskState::Queued;
        for e in &events[1..] {
            assert_eq!(e.from, Some(state));
            let trigger = match e.to {
                TaskState::Provisioning => Trigger::Claim,
                TaskState::Cancelled => Trigger::Cancel,
                other => panic!("unexpected event to {other}"),
            };
            state = transition(state, trigger, TaskType::Coding, 1).unwrap().to;
        }
        assert_eq!(state, stored.state);
        // The successful calls' transitions chain into the same history.
        let mut from_calls: Vec<_> = succeeded.iter().map(|s| (s.1, s.2)).collect();
        from_calls.sort_by_key(|(from, _)| *from);
        let mut from_events: Vec<_> = events[1..]
            .iter()
            .map(|e| (e.from.unwrap(), e.to))
            .collect();
        from_events.sort_by_key(|(from, _)| *from);
        assert_eq!(from_calls, from_events);
    }
}
