//! The run ledger (docs/contract.md#21-task, #23-money): exact costs, token sums, retries add.

use crate::common::*;
use agentry_domain::{AgentType, Task, Tokens, Trigger, Usd};
use agentry_persistence::tasks::{self, Run, RunOutcome, TransitionDetails};
use agentry_persistence::{AnyConnection, Db, DbError, write_tx};
use uuid::Uuid;

/// A succeeded run of `task` started at `at(secs)`, with the given cost.
fn run(task: &Task, secs: i64, cost: Option<&str>) -> Run {
    Run {
        model: Some("claude-sonnet-4".into()),
        cost_usd: cost.map(usd),
        turns: Some(3),
        finished_at: Some(at(secs + 1)),
        ..agentry_persistence::test_support::succeeded_run(task.id, task.attempt, at(secs))
    }
}

/// `bad` is refused and changes nothing: its task is still `before`, with its one run.
fn assert_refused(conn: &mut AnyConnection, bad: &Run, before: &Task) {
    let result = record(conn, bad);
    assert!(result.is_err(), "{bad:?} must be refused");
    assert_eq!(
        &tasks::get_task(conn, bad.task_id).unwrap(),
        before,
        "{bad:?}"
    );
    assert_eq!(
        tasks::task_runs(conn, bad.task_id).unwrap().len(),
        1,
        "{bad:?}"
    );
}

/// After a run of `cost` with 10 input and 10 output tokens, a run of `cost` with each of
/// `bad`'s token counts (input, cache read, cache write, output) is refused and changes
/// nothing.
fn assert_token_counts_refused(db: &Db, cost: Option<&str>, bad: &[[i64; 4]]) {
    let (task, mut conn) = a_task(db);
    let first = Run {
        tokens: Tokens {
            input: 10,
            output: 10,
            ..Tokens::default()
        },
        ..run(&task, 0, cost)
    };
    record(&mut conn, &first).unwrap();
    let before = tasks::get_task(&mut conn, task.id).unwrap();
    for &tokens in bad {
        let mut bad = run(&task, 10, cost);
        let [input, cache_read, cache_write, output] = tokens;
        bad.tokens = Tokens::from_uncached(input, cache_read, cache_write, output);
        assert_refused(&mut conn, &bad, &before);
    }
}

/// Records `run` in its own write transaction.
fn record(conn: &mut AnyConnection, run: &Run) -> Result<(), DbError> {
    write_tx(conn, |conn| tasks::record_run(conn, run))
}

agentry_persistence::backend_tests! {
    // A task and its runs read in one `read_tx` are one snapshot: a run recorded by another
    // connection between the two reads is in neither (never a run the task's cost does not
    // count yet), and both afterwards.
    fn a_task_and_its_runs_read_together_are_consistent(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        let mut reader = db.conn().unwrap();
        let mut writer = db.conn().unwrap();
        let (cost, runs) = agentry_persistence::read_tx(&mut reader, |conn| {
            let cost = tasks::get_task(conn, task.id)?.cost_usd;
            tasks::record_run(&mut writer, &run(&task, 0, Some("0.25")))?;
            let runs = tasks::task_runs(conn, task.id)?.len();
            Ok::<_, DbError>((cost, runs))
        })
        .unwrap();
        assert_eq!((cost, runs), (None, 0));
        let (cost, runs) = agentry_persistence::read_tx(&mut reader, |conn| {
            Ok::<_, DbError>((
                tasks::get_task(conn, task.id)?.cost_usd,
                tasks::task_runs(conn, task.id)?.len(),
            ))
        })
        .unwrap();
        assert_eq!((cost, runs), (Some(usd("0.25")), 1));
    }

    // Recording a run and its log needs no transaction of the caller's: each wraps itself.
    fn a_run_and_its_log_are_recorded_without_a_callers_transaction(db) {
        let (task, mut conn) = a_task(db);
        let run = run(&task, 0, Some("0.25"));
        tasks::record_run(&mut conn, &run).unwrap();
        let log = agentry_persistence::runner::RunLog::of("output");
        agentry_persistence::runner::save_run_log(&mut conn, run.id, task.id, &log, at(1)).unwrap();
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().cost_usd, Some(usd("0.25")));
        let (run_id, _, stored) =
            agentry_persistence::runner::latest_run_log(&mut conn, task.id).unwrap().unwrap();
        assert_eq!((run_id, stored.content.as_str()), (run.id, "output"));
    }

    // An agent's text may hold NUL characters, which PostgreSQL's text cannot: a run's error
    // and model, and the failed task's error and event reason, are stored without them on
    // both backends, rather than the write failing (and the run being recorded lost and
    // started again).
    fn text_with_nul_characters_is_stored_without_them(db) {
        let (task, mut conn) = a_task(db);
        let claim = tasks::transition_task(
            &mut conn, task.id, Trigger::Claim, &TransitionDetails::default(), at(1),
        );
        claim.unwrap();
        let run = Run {
            model: Some("son\0net".into()),
            error_message: Some("the agent failed; stderr: a\0b".into()),
            ..run(&task, 2, Some("0.1"))
        };
        record(&mut conn, &run).unwrap();
        let details = TransitionDetails {
            reason: Some("failed: a\0b".into()),
            error_message: Some("failed: a\0b".into()),
            pull_request: None,
        };
        let (failed, _) =
            tasks::transition_task(&mut conn, task.id, Trigger::Fail, &details, at(3)).unwrap();
        assert_eq!(failed.error_message.as_deref(), Some("failed: ab"));
        let stored = &tasks::task_runs(&mut conn, task.id).unwrap()[0];
        assert_eq!(stored.error_message.as_deref(), Some("the agent failed; stderr: ab"));
        assert_eq!(stored.model.as_deref(), Some("sonnet"));
        let events = tasks::task_events(&mut conn, task.id).unwrap();
        assert_eq!(events.last().unwrap().reason, "failed: ab");
    }

    // Review feedback is anybody's text with write access: a NUL in it is left out rather
    // than failing the poll of the whole repository on PostgreSQL.
    fn feedback_text_is_stored_without_nul_characters(db) {
        use agentry_persistence::revisions::{self, FeedbackOutcome, FeedbackSource, NewFeedback};
        let (task, mut conn) = a_task(db);
        let new = NewFeedback {
            repo_id: task.repo_id.unwrap(),
            source: FeedbackSource::ReviewComment,
            external_id: "7".into(),
            task_id: task.id,
            pr_number: 3,
            author: "rev\0iewer".into(),
            body: "please\0 fix".into(),
            path: Some("src/\0lib.rs".into()),
            line: Some(4),
            url: "https://github.com/o/r/pull/3#discussion_r7\0".into(),
        };
        assert!(revisions::insert(&mut conn, &new, FeedbackOutcome::Waiting, at(1)).unwrap());
        let [stored] = &revisions::of_task(&mut conn, task.id).unwrap()[..] else {
            panic!("one feedback")
        };
        assert_eq!(
            (&*stored.author, &*stored.body, stored.path.as_deref(), &*stored.url),
            ("reviewer", "please fix", Some("src/lib.rs"), "https://github.com/o/r/pull/3#discussion_r7")
        );
    }

    // A task's title and prompt and a token's name, as given to the API, are stored without
    // NUL characters too (before, PostgreSQL refused them and the API answered 500).
    fn task_and_token_text_is_stored_without_nul_characters(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let new = agentry_persistence::tasks::NewTask {
            title: "ti\0tle".into(),
            prompt: "\0do it\0".into(),
            ..new_task(&repo, at(1))
        };
        let task = tasks::create_task(&mut conn, &new, "created").unwrap();
        assert_eq!((task.title.as_str(), task.prompt.as_str()), ("title", "do it"));
        let token = agentry_persistence::tokens::create_token(
            &mut conn, "na\0me", agentry_domain::Role::Member, "hash-of-a-token", at(2),
        )
        .unwrap();
        assert_eq!(token.name, "name");
        let listed = agentry_persistence::tokens::list_active(&mut conn).unwrap();
        assert_eq!(listed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["name"]);
    }

    // Whether a run was sandboxed is kept as recorded: yes, no, or not known.
    fn the_sandbox_flag_round_trips(db) {
        let (task, mut conn) = a_task(db);
        for (i, sandboxed) in [Some(true), Some(false), None].into_iter().enumerate() {
            let run = Run { sandboxed, ..run(&task, i as i64 * 10, Some("0.1")) };
            record(&mut conn, &run).unwrap();
        }
        let flags: Vec<_> = tasks::task_runs(&mut conn, task.id)
            .unwrap()
            .iter()
            .map(|r| r.sandboxed)
            .collect();
        assert_eq!(flags, [Some(true), Some(false), None]);
    }

    // Costs add exactly in nano-dollars: 0.123456789 + 0.000000001 + 1.1 = 1.22345679,
    // displayed normalised; every run keeps its own exact cost.
    fn run_costs_sum_exactly(db) {
        let (task, mut conn) = a_task(db);
        let costs = ["0.123456789", "0.000000001", "1.1"];
        for (i, cost) in costs.iter().enumerate() {
            record(&mut conn, &run(&task, i as i64 * 10, Some(cost))).unwrap();
        }
        let stored = tasks::get_task(&mut conn, task.id).unwrap();
        let total = stored.cost_usd.unwrap();
        assert_eq!(total, usd("1.223456790"));
        assert_eq!(total.to_nanos(), 1_223_456_790);
        assert_eq!(total.to_string(), "1.22345679");
        let runs = tasks::task_runs(&mut conn, task.id).unwrap();
        let run_costs: Vec<_> = runs
            .iter()
            .map(|r| r.cost_usd.unwrap().to_string())
            .collect();
        assert_eq!(run_costs, ["0.123456789", "0.000000001", "1.1"]);
    }

    // A run without a cost leaves the task's cost as it was: None stays None until a run
    // reports one, and Some + None = Some.
    fn runs_without_cost_do_not_change_the_total(db) {
        let (task, mut conn) = a_task(db);
        record(&mut conn, &run(&task, 0, None)).unwrap();
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().cost_usd, None);
        record(&mut conn, &run(&task, 10, Some("0"))).unwrap();
        assert_eq!(
            tasks::get_task(&mut conn, task.id).unwrap().cost_usd,
            Some(Usd::ZERO)
        );
        assert_eq!(
            tasks::get_task(&mut conn, task.id)
                .unwrap()
                .cost_usd
                .unwrap()
                .to_string(),
            "0"
        );
        record(&mut conn, &run(&task, 20, Some("0.25"))).unwrap();
        record(&mut conn, &run(&task, 30, None)).unwrap();
        let stored = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(stored.cost_usd, Some(usd("0.25")));
        let runs = tasks::task_runs(&mut conn, task.id).unwrap();
        let run_costs: Vec<_> = runs.iter().map(|r| r.cost_usd).collect();
        assert_eq!(run_costs, [None, Some(Usd::ZERO), Some(usd("0.25")), None]);
    }

    // Task input tokens = Σ(input + cache read + cache write), output summed; the ledger keeps
    // the split; the task's model is the latest run's (kept when a run reports none).
    fn tokens_sum_and_model_follows_the_runs(db) {
        let (task, mut conn) = a_task(db);
        // (start second, model, cost, tokens [input, cache read, cache write, output]) of
        // each run, then the task's (input, output) tokens and model after it.
        let cases = [
            (0, Some("claude-sonnet-4"), Some("0.5"), [100, 2_000, 30_000, 400], (32_100, 400), "claude-sonnet-4"),
            (10, Some("claude-opus-4"), Some("0.5"), [5, 60, 700, 8_000], (32_865, 8_400), "claude-opus-4"),
            // The model is kept when a run reports none.
            (20, None, None, [0, 0, 0, 1], (32_865, 8_401), "claude-opus-4"),
        ];
        let mut recorded = Vec::new();
        for (secs, model, cost, [input, cache_read, cache_write, output], totals, model_after) in cases {
            let r = Run {
                tokens: Tokens::from_uncached(input, cache_read, cache_write, output),
                model: model.map(str::to_owned),
                ..run(&task, secs, cost)
            };
            record(&mut conn, &r).unwrap();
            recorded.push(r);
            let t = tasks::get_task(&mut conn, task.id).unwrap();
            assert_eq!((t.input_tokens, t.output_tokens), totals, "after the run at {secs}");
            assert_eq!(t.model_used.as_deref(), Some(model_after), "after the run at {secs}");
            assert_eq!(t.updated_at, at(secs + 1), "updated at the run's end");
        }
        let t = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(t.cost_usd, Some(usd("1")));

        // The ledger keeps each run as recorded, oldest first.
        assert_eq!(tasks::task_runs(&mut conn, task.id).unwrap(), recorded);
    }

    // Every field of a run round-trips, including a failed run without a finish time.
    fn run_fields_round_trip(db) {
        let (task, mut conn) = a_task(db);
        let lost = Run {
            agent_type: AgentType::Codex,
            model: None,
            cost_usd: Some(usd("0.000123")),
            tokens: Tokens::from_uncached(1, 2, 3, 4),
            turns: None,
            outcome: RunOutcome::Lost,
            exit_code: None,
            error_message: Some("the runner died".into()),
            finished_at: None,
            sandboxed: None,
            model_calls: None,
            reported_cost_usd: None,
            started_at: time::macros::datetime!(2026-01-15 10:20:30.999999 UTC),
            ..run(&task, 0, None)
        };
        record(&mut conn, &lost).unwrap();
        let timed_out = Run {
            outcome: RunOutcome::TimedOut,
            exit_code: Some(137),
            error_message: Some("time limit".into()),
            ..run(&task, 100, Some("2"))
        };
        record(&mut conn, &timed_out).unwrap();
        assert_eq!(
            tasks::task_runs(&mut conn, task.id).unwrap(),
            vec![lost.clone(), timed_out]
        );
        // Without a finish time the task's updated_at is the run's start.
        record(
            &mut conn,
            &Run {
                started_at: at(500),
                finished_at: None,
                ..run(&task, 0, None)
            },
        )
        .unwrap();
        assert_eq!(
            tasks::get_task(&mut conn, task.id).unwrap().updated_at,
            at(500)
        );
        assert_eq!(tasks::task_runs(&mut conn, Uuid::new_v4()).unwrap(), vec![]);
    }

    // A retried task's runs add to the totals of the first attempt; nothing is overwritten.
    // The run is recorded in the same transaction as the transition it ends in.
    fn retries_add_to_the_totals(db) {
        let (task, mut conn) = a_task(db);
        let no_details = TransitionDetails::default();
        tasks::transition_task(&mut conn, task.id, Trigger::Claim, &no_details, at(1)).unwrap();
        tasks::transition_task(
            &mut conn,
            task.id,
            Trigger::AgentStarted,
            &no_details,
            at(2),
        )
        .unwrap();
        let attempt1 = Run {
            outcome: RunOutcome::Failed,
            tokens: Tokens { input: 10, output: 20, ..Tokens::default() },
            model: Some("sonnet".into()),
            ..run(&task, 2, Some("0.3"))
        };
        write_tx::<_, DbError, _>(&mut conn, |conn| {
            tasks::record_run(conn, &attempt1)?;
            tasks::transition_task(conn, task.id, Trigger::Fail, &no_details, at(3))
        })
        .unwrap();
        let t = tasks::transition_task(&mut conn, task.id, Trigger::Retry, &no_details, at(4))
            .unwrap()
            .0;
        assert_eq!(t.attempt, 2);
        assert_eq!(
            t.cost_usd,
            Some(usd("0.3")),
            "retry keeps the cost of attempt 1"
        );
        tasks::transition_task(&mut conn, task.id, Trigger::Claim, &no_details, at(5)).unwrap();
        let attempt2 = Run {
            attempt: 2,
            tokens: Tokens { input: 1, output: 2, ..Tokens::default() },
            model: Some("opus".into()),
            ..run(&task, 6, Some("0.7"))
        };
        write_tx::<_, DbError, _>(&mut conn, |conn| tasks::record_run(conn, &attempt2)).unwrap();
        let t = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(t.cost_usd, Some(usd("1")));
        assert_eq!(t.cost_usd.unwrap().to_string(), "1");
        assert_eq!((t.input_tokens, t.output_tokens), (11, 22));
        assert_eq!(t.model_used.as_deref(), Some("opus"));
        let attempts: Vec<_> = tasks::task_runs(&mut conn, task.id)
            .unwrap()
            .iter()
            .map(|r| r.attempt)
            .collect();
        assert_eq!(attempts, [1, 2]);
    }

    // Recording a run and a transition in one write_tx: if the transition is refused, the
    // run is rolled back with it (the cost is not counted).
    fn run_rolls_back_with_a_refused_transition(db) {
        let (task, mut conn) = a_task(db);
        let result = write_tx::<_, DbError, _>(&mut conn, |conn| {
            tasks::record_run(conn, &run(&task, 0, Some("5")))?;
            // Merged is refused on a queued task.
            tasks::transition_task(
                conn,
                task.id,
                Trigger::PullRequestMerged,
                &TransitionDetails::default(),
                at(1),
            )
        });
        assert!(
            matches!(result, Err(DbError::InvalidTransition(_))),
            "{result:?}"
        );
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap(), task);
        assert_eq!(row_count(db, "task_runs"), 0);
    }

    // Amounts near the top of the nano-dollar range (9e18 nanos = 9,000,000,000 USD) and the
    // largest storable amount round-trip exactly: no floating point on the way.
    fn huge_costs_round_trip_exactly(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let big = create(db, &repo, T0);
        let nine_billion = Usd::from_nanos(9_000_000_000_000_000_000).unwrap();
        record(&mut conn, &run(&big, 0, Some("9000000000"))).unwrap();
        let t = tasks::get_task(&mut conn, big.id).unwrap();
        assert_eq!(t.cost_usd, Some(nine_billion));
        assert_eq!(t.cost_usd.unwrap().to_nanos(), 9_000_000_000_000_000_000);
        // One nano-dollar more is still exact (f64 would lose it: 2^53 < 9e18).
        record(&mut conn, &run(&big, 10, Some("0.000000001"))).unwrap();
        let t = tasks::get_task(&mut conn, big.id).unwrap();
        assert_eq!(t.cost_usd.unwrap().to_nanos(), 9_000_000_000_000_000_001);
        assert_eq!(t.cost_usd.unwrap().to_string(), "9000000000.000000001");

        // i64::MAX nano-dollars, the largest amount there is (in a repository of its own:
        // the cost rollups hold per-repository sums, which must fit too).
        let other = connect(db, "big", "spender");
        let max = create(db, &other, T0);
        record(&mut conn, &run(&max, 0, Some("9223372036.854775807"))).unwrap();
        let t = tasks::get_task(&mut conn, max.id).unwrap();
        assert_eq!(t.cost_usd.unwrap().to_nanos(), i64::MAX);
        let runs = tasks::task_runs(&mut conn, max.id).unwrap();
        assert_eq!(
            runs[0].cost_usd.unwrap().to_string(),
            "9223372036.854775807"
        );
        // Beyond it the total would overflow: refused, nothing written.
        let result = record(&mut conn, &run(&max, 10, Some("0.000000001")));
        assert!(result.is_err(), "{result:?}");
        assert_eq!(tasks::get_task(&mut conn, max.id).unwrap(), t);
        assert_eq!(tasks::task_runs(&mut conn, max.id).unwrap().len(), 1);
    }

    // Negative token counts of any kind are refused and nothing is written (no run row, no
    // change to the task's totals).
    fn negative_token_counts_are_refused(db) {
        assert_token_counts_refused(
            db,
            Some("1"),
            &[[-1, 0, 0, 0], [0, -5, 0, 0], [0, 0, -7, 0], [0, 0, 0, -1], [i64::MIN, 1, 0, 0]],
        );
    }

    // A run of an unknown task is NotFound and writes nothing.
    fn run_of_unknown_task_is_not_found(db) {
        let (task, mut conn) = a_task(db);
        let orphan = Run {
            task_id: Uuid::new_v4(),
            ..run(&task, 0, Some("1"))
        };
        assert!(matches!(record(&mut conn, &orphan), Err(DbError::NotFound)));
        assert_eq!(row_count(db, "task_runs"), 0);
    }

    // Token totals that would overflow are refused and nothing is written (on SQLite an
    // overflowing integer sum would silently become a float).
    fn token_total_overflow_is_refused(db) {
        assert_token_counts_refused(
            db,
            None,
            &[[i64::MAX - 5, 0, 0, 0], [0, 0, 0, i64::MAX - 5], [i64::MAX, 0, 1, 0]],
        );
    }

    // Runs of one task recorded concurrently (each in its own transaction on its own
    // connection) all count: the total cost, tokens and run count are exact sums, no lost
    // update.
    fn concurrent_runs_all_count(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        let wide = wide_pool(db, 16);
        let results = race(&wide, 16, |i, conn| {
            let r = Run {
                tokens: Tokens::from_uncached(1, 10, 0, 100),
                ..run(&task, i as i64, Some("0.000000001"))
            };
            record(conn, &r)
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let mut conn = db.conn().unwrap();
        let t = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(tasks::task_runs(&mut conn, task.id).unwrap().len(), 16);
        assert_eq!(t.cost_usd.map(Usd::to_nanos), Some(16));
        assert_eq!((t.input_tokens, t.output_tokens), (16 * 11, 1600));
    }
}
