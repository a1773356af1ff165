//! The model gateway's records (docs/contract.md#68-model-gateway): metered calls summed
//! exactly per run, refused connections counted per destination, notes in the history.

use crate::common::*;
use agentry_domain::{AgentType, TaskState, Tokens};
use agentry_persistence::metering::{self, BlockedTally, ModelCall};
use agentry_persistence::tasks::{self, EventKind, Run};
use uuid::Uuid;

fn call(task: uuid::Uuid, attempt: i32, secs: i64, model: &str, cost: Option<&str>) -> ModelCall {
    ModelCall {
        id: Uuid::now_v7(),
        task_id: task,
        attempt,
        provider: "anthropic".into(),
        model: Some(model.into()),
        status: 200,
        outcome: "completed".into(),
        tokens: Tokens::from_uncached(10, 100, 5, 20),
        reasoning_tokens: 0,
        cost_usd: cost.map(usd),
        started_at: at(secs),
        duration_ms: 1500,
    }
}

agentry_persistence::backend_tests! {
    // A run's metered cost is the exact sum of its calls; other attempts do not count.
    fn calls_sum_exactly_per_run(db) {
        let (task, mut conn) = a_task(db);
        let first = call(task.id, 1, 0, "claude-sonnet-5", Some("0.000000001"));
        metering::record_call(&mut conn, &first).unwrap();
        for (i, cost) in ["0.1", "0.2", "12345.678901234"].iter().enumerate() {
            metering::record_call(&mut conn, &call(task.id, 1, i as i64 + 1, "claude-sonnet-5", Some(cost))).unwrap();
        }
        metering::record_call(&mut conn, &call(task.id, 2, 9, "claude-sonnet-5", Some("5"))).unwrap();
        let totals = metering::run_totals(&mut conn, task.id, 1).unwrap();
        assert_eq!(totals.calls, 4);
        assert_eq!(totals.cost_usd, Some(usd("12345.978901235")));
        assert_eq!(totals.tokens, Tokens::from_uncached(40, 400, 20, 80));
        let listed = metering::task_calls(&mut conn, task.id, None).unwrap();
        assert_eq!(listed.len(), 5);
        assert_eq!(listed[0], first);
        assert_eq!(listed.iter().map(|c| c.attempt).collect::<Vec<_>>(), [1, 1, 1, 1, 2]);
        assert_eq!(metering::task_calls(&mut conn, task.id, Some(2)).unwrap().len(), 1);
        assert_eq!(metering::run_totals(&mut conn, task.id, 3).unwrap().calls, 0);
    }

    // Every call counts, however many a run makes: its totals are read a page at a time
    // (before, only the first 10,000 calls were summed, and a run's calls past them were
    // free). Calls that started at the same time straddle the pages' ends.
    fn a_runs_totals_count_every_call(db) {
        let (task, mut conn) = a_task(db);
        agentry_persistence::write_tx::<_, agentry_persistence::DbError, _>(&mut conn, |conn| {
            for i in 0..20_005i64 {
                let cost = if i >= 20_000 { "1" } else { "0.001" };
                metering::record_call(conn, &call(task.id, 1, i / 7, "claude-sonnet-5", Some(cost)))?;
            }
            Ok(())
        })
        .unwrap();
        let totals = metering::run_totals(&mut conn, task.id, 1).unwrap();
        assert_eq!((totals.calls, totals.cost_usd), (20_005, Some(usd("25"))));
        assert_eq!(totals.tokens, Tokens::from_uncached(200_050, 2_000_500, 100_025, 400_100));
    }

    // One unpriced call that used tokens makes the run's cost unknown, naming the model.
    fn an_unpriced_call_makes_the_cost_unknown(db) {
        let (task, mut conn) = a_task(db);
        metering::record_call(&mut conn, &call(task.id, 1, 0, "claude-sonnet-5", Some("0.5"))).unwrap();
        metering::record_call(&mut conn, &call(task.id, 1, 1, "mystery-model", None)).unwrap();
        let totals = metering::run_totals(&mut conn, task.id, 1).unwrap();
        assert_eq!(totals.cost_usd, None);
        assert_eq!(totals.unpriced, vec!["mystery-model".to_owned()]);
    }

    // Refusals are counted per run and destination, first and last time kept.
    fn refused_connections_are_counted_per_destination(db) {
        let (task, mut conn) = a_task(db);
        metering::record_blocked(&mut conn, task.id, 1, "169.254.169.254", 80, at(1)).unwrap();
        metering::record_blocked(&mut conn, task.id, 1, "169.254.169.254", 80, at(5)).unwrap();
        metering::record_blocked(&mut conn, task.id, 1, "evil.example", 443, at(3)).unwrap();
        metering::record_blocked(&mut conn, task.id, 2, "evil.example", 443, at(7)).unwrap();
        let blocked = metering::task_blocked(&mut conn, task.id).unwrap();
        let summary: Vec<_> = blocked
            .iter()
            .map(|b| (b.attempt, b.host.as_str(), b.port, b.count, b.first_at, b.last_at))
            .collect();
        assert_eq!(
            summary,
            [
                (1, "169.254.169.254", 80, 2, at(1), at(5)),
                (1, "evil.example", 443, 1, at(3), at(3)),
                (2, "evil.example", 443, 1, at(7), at(7)),
            ]
        );
    }

    // A batch adds its counts in one go; a run lists at most MAX_BLOCKED_TARGETS
    // destinations, the rest summed in its "*" row (last of the run), exactly.
    fn refusals_are_written_in_batches_and_bounded_per_run(db) {
        let (task, mut conn) = a_task(db);
        let tally = |host: &str, port: u16, count: i64, first: i64, last: i64| BlockedTally {
            host: host.into(),
            port,
            count,
            first_at: at(first),
            last_at: at(last),
        };
        metering::record_blocked_batch(&mut conn, task.id, 1, &[
            tally("evil.example", 443, 20_000, 1, 2),
            tally("a.example", 80, 0, 1, 1),
        ]).unwrap();
        metering::record_blocked_batch(&mut conn, task.id, 1, &[tally("evil.example", 443, 5, 3, 4)])
            .unwrap();
        // 40 more destinations: 31 fit beside evil.example, 9 go to the "*" row.
        let many: Vec<BlockedTally> =
            (0..40).map(|i| tally(&format!("h{i:02}.example"), 443, 2, 5 + i, 5 + i)).collect();
        metering::record_blocked_batch(&mut conn, task.id, 1, &many).unwrap();
        // Listed ones still count on their own row; new ones and "*" tallies join "*".
        metering::record_blocked_batch(&mut conn, task.id, 1, &[
            tally("h00.example", 443, 1, 60, 60),
            tally("late.example", 8080, 3, 61, 62),
            tally(metering::OTHER_HOST, metering::OTHER_PORT, 7, 63, 64),
        ]).unwrap();
        metering::record_blocked(&mut conn, task.id, 2, "evil.example", 443, at(70)).unwrap();
        let blocked = metering::task_blocked(&mut conn, task.id).unwrap();
        let first_run: Vec<_> = blocked.iter().filter(|b| b.attempt == 1).collect();
        assert_eq!(first_run.len(), metering::MAX_BLOCKED_TARGETS + 1);
        assert_eq!(
            (first_run[0].host.as_str(), first_run[0].count, first_run[0].first_at, first_run[0].last_at),
            ("evil.example", 20_005, at(1), at(4))
        );
        assert_eq!((first_run[1].host.as_str(), first_run[1].count), ("h00.example", 3));
        let other = first_run.last().unwrap();
        assert!(other.is_other());
        assert_eq!(
            (other.port, other.count, other.first_at, other.last_at),
            (0, 9 * 2 + 3 + 7, at(36), at(64))
        );
        assert!(first_run[..first_run.len() - 1].iter().all(|b| !b.is_other()));
        let total: i64 = first_run.iter().map(|b| b.count).sum();
        assert_eq!(total, 20_005 + 80 + 1 + 3 + 7);
        assert_eq!(blocked.last().map(|b| (b.attempt, b.count)), Some((2, 1)));
    }

    // A note changes no state: it lands in the history as from = to = the current state.
    fn a_note_joins_the_history_without_a_transition(db) {
        let (task, mut conn) = a_task(db);
        tasks::record_note(&mut conn, task.id, EventKind::CostMismatch, "cost_mismatch: x", at(2)).unwrap();
        let events = tasks::task_events(&mut conn, task.id).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].kind, EventKind::Transition);
        let note = &events[1];
        assert_eq!((note.from, note.to, note.kind), (Some(TaskState::Queued), TaskState::Queued, EventKind::CostMismatch));
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::Queued);
    }

    // A metered run keeps its call count and the agent's own figure beside the cost.
    fn metered_run_fields_round_trip(db) {
        let (task, mut conn) = a_task(db);
        let run = Run {
            agent_type: AgentType::Codex,
            model: Some("gpt-6.1-sol".into()),
            cost_usd: Some(usd("0.42")),
            tokens: Tokens { input: 1, output: 1, ..Tokens::default() },
            finished_at: Some(at(1)),
            sandboxed: Some(true),
            model_calls: Some(7),
            reported_cost_usd: Some(usd("0.000001")),
            ..agentry_persistence::test_support::succeeded_run(task.id, 1, at(0))
        };
        tasks::record_run(&mut conn, &run).unwrap();
        assert_eq!(tasks::task_runs(&mut conn, task.id).unwrap(), vec![run]);
    }
}
