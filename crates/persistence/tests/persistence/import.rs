//! Bulk import of task history (docs/contract.md#39-import): batches, skips, all-or-nothing.
#![allow(
    clippy::unwrap_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use std::collections::HashMap;

use crate::common::*;
use agentry_domain::{AgentType, RepoUrl, Task, TaskState, TaskType, Usd};
use agentry_persistence::tasks::{self, ImportOutcome, ImportTask, TaskFilter};
use agentry_persistence::{Db, DbError};
use uuid::Uuid;

/// The error type of a caller's record source (e.g. a bad NDJSON line).
#[derive(Debug)]
enum ImportError {
    BadLine(usize),
    #[allow(dead_code)] // read through Debug only
    Db(DbError),
}

impl From<DbError> for ImportError {
    fn from(e: DbError) -> Self {
        ImportError::Db(e)
    }
}

/// Record `i`: alternating repositories, states and types, with a distinct exact cost.
fn record(i: usize) -> ImportTask {
    let states = TaskState::ALL;
    ImportTask {
        id: Uuid::new_v4(),
        title: format!("imported task {i}"),
        repo_url: RepoUrl::parse(if i.is_multiple_of(2) {
            "https://github.com/o/r"
        } else {
            "https://github.com/elsewhere/old"
        })
        .unwrap(),
        task_type: if i.is_multiple_of(5) {
            TaskType::Review
        } else {
            TaskType::Coding
        },
        state: states[i % states.len()],
        agent_type: if i.is_multiple_of(3) {
            AgentType::Codex
        } else {
            AgentType::ClaudeCode
        },
        model_used: (!i.is_multiple_of(4)).then(|| format!("model-{}", i % 4)),
        // i nano-dollars plus i·0.1 USD: every record's cost is different and exact.
        cost_usd: (!i.is_multiple_of(7)).then(|| Usd::from_nanos(i as i64 * 100_000_001).unwrap()),
        input_tokens: i as i64 * 1_000,
        output_tokens: i as i64,
        created_at: at(i as i64) + time::Duration::microseconds(i as i64),
        pr_url: (i % 2 == 1).then(|| format!("https://github.com/elsewhere/old/pull/{i}")),
        pr_number: (i % 2 == 1).then_some(i as i64),
        issue_number: (i.is_multiple_of(10)).then_some(i as i64),
    }
}

fn import(db: &Db, records: &[ImportTask]) -> ImportOutcome {
    let mut conn = db.conn().unwrap();
    tasks::import_tasks::<DbError, _>(&mut conn, records.iter().cloned().map(Ok)).unwrap()
}

agentry_persistence::backend_tests! {
    // 2,500 records (three batches) are all imported, each with exactly the values given,
    // one event {from: null, to: state, reason: "imported"} at its creation time, and the
    // repository id of a connected repository with that URL (none otherwise).
    fn import_writes_every_record_exactly(db) {
        let repo = repo(db);
        let mut records: Vec<ImportTask> = (0..2_500).map(record).collect();
        // Amounts that f64 cannot hold exactly (2^62 + 1 and 9e18 + 1 nano-dollars); the
        // largest single amount is covered by the run tests, since the cost rollups must
        // also hold the sum of every task of a day.
        records[1].cost_usd = Some(Usd::from_nanos(4_611_686_018_427_387_905).unwrap());
        records[2].cost_usd = Some(Usd::from_nanos(9_000_000_000_000_000_001).unwrap());
        let outcome = import(db, &records);
        assert_eq!(
            outcome,
            ImportOutcome {
                imported: 2_500,
                skipped: 0
            }
        );
        assert_eq!(task_count(db), 2_500);
        assert_eq!(row_count(db, "task_events"), 2_500);
        assert_eq!(
            row_count(db, "issue_links"),
            0,
            "imports create no issue link"
        );

        let mut conn = db.conn().unwrap();
        let stored: HashMap<Uuid, Task> =
            tasks::list_tasks(&mut conn, &TaskFilter::default(), 3_000, None)
                .unwrap()
                .tasks
                .into_iter()
                .map(|t| (t.id, t))
                .collect();
        assert_eq!(stored.len(), 2_500);
        for (i, r) in records.iter().enumerate() {
            let t = &stored[&r.id];
            assert_eq!(t.title, r.title);
            assert_eq!(t.prompt, "");
            assert_eq!(t.repo_url, r.repo_url);
            let expected_repo = (r.repo_url == repo.url).then_some(repo.id);
            assert_eq!(t.repo_id, expected_repo, "record {i}");
            assert_eq!(t.task_type, r.task_type);
            assert_eq!(t.state, r.state);
            assert_eq!(t.agent_type, r.agent_type);
            assert_eq!(t.model_used, r.model_used);
            assert_eq!(t.cost_usd, r.cost_usd, "record {i}");
            assert_eq!(
                (t.input_tokens, t.output_tokens),
                (r.input_tokens, r.output_tokens)
            );
            assert_eq!(t.created_at, r.created_at, "record {i}");
            assert_eq!(t.updated_at, r.created_at);
            assert_eq!(
                (t.pr_url.clone(), t.pr_number, t.issue_number),
                (r.pr_url.clone(), r.pr_number, r.issue_number)
            );
            assert_eq!(t.attempt, 1);
            assert_eq!(t.parent_task_id, None);
            if i.is_multiple_of(250) {
                let events = tasks::task_events(&mut conn, r.id).unwrap();
                assert_eq!(events.len(), 1);
                assert_eq!((events[0].from, events[0].to), (None, r.state));
                assert_eq!(events[0].reason, "imported");
                assert_eq!(events[0].at, r.created_at);
            }
        }
        // Spot-check exact costs as text.
        let cost = |i: usize| stored[&records[i].id].cost_usd.unwrap().to_string();
        assert_eq!(cost(2_498), "249.800002498");
        assert_eq!(cost(1), "4611686018.427387905");
        assert_eq!(cost(2), "9000000000.000000001");
        // Half of the records belong to the connected repository.
        let page = tasks::list_tasks(
            &mut conn,
            &TaskFilter {
                repo_id: Some(repo.id),
                ..Default::default()
            },
            2_000,
            None,
        )
        .unwrap();
        assert_eq!(page.tasks.len(), 1_250);
    }

    // Importing the same records again skips every one of them and changes nothing;
    // a mix of old and new imports only the new ones.
    fn reimport_skips_existing_ids(db) {
        let records: Vec<ImportTask> = (0..2_500).map(record).collect();
        assert_eq!(import(db, &records).imported, 2_500);
        let mut conn = db.conn().unwrap();
        let before = tasks::get_task(&mut conn, records[1_234].id).unwrap();
        drop(conn);
        let changed: Vec<ImportTask> = records
            .iter()
            .cloned()
            .map(|r| ImportTask {
                title: "changed".into(),
                state: TaskState::Failed,
                ..r
            })
            .collect();
        assert_eq!(
            import(db, &changed),
            ImportOutcome {
                imported: 0,
                skipped: 2_500
            }
        );
        assert_eq!(task_count(db), 2_500);
        assert_eq!(row_count(db, "task_events"), 2_500);
        let mut conn = db.conn().unwrap();
        assert_eq!(
            tasks::get_task(&mut conn, records[1_234].id).unwrap(),
            before
        );
        drop(conn);

        let mut mixed: Vec<ImportTask> = (2_500..2_510).map(record).collect();
        mixed.extend(records[..5].iter().cloned());
        assert_eq!(
            import(db, &mixed),
            ImportOutcome {
                imported: 10,
                skipped: 5
            }
        );
        assert_eq!(task_count(db), 2_510);
    }

    // A repeated id inside one import keeps the first record and skips the second, within a
    // batch and across the 1,000-record batch boundary.
    fn duplicate_ids_inside_one_import_are_skipped(db) {
        let mut records: Vec<ImportTask> = (0..1_500).map(record).collect();
        let same_batch = ImportTask {
            title: "second copy".into(),
            ..records[3].clone()
        };
        let next_batch = ImportTask {
            title: "copy in batch 2".into(),
            ..records[10].clone()
        };
        records.insert(5, same_batch);
        records.insert(1_200, next_batch);
        assert_eq!(
            import(db, &records),
            ImportOutcome {
                imported: 1_500,
                skipped: 2
            }
        );
        let mut conn = db.conn().unwrap();
        assert_eq!(
            tasks::get_task(&mut conn, records[3].id).unwrap().title,
            "imported task 3"
        );
        assert_eq!(
            tasks::get_task(&mut conn, records[11].id).unwrap().title,
            "imported task 10"
        );
        assert_eq!(
            tasks::task_events(&mut conn, records[3].id).unwrap().len(),
            1
        );
        assert_eq!(row_count(db, "task_events"), 1_500);
    }

    // Exactly 1,000 and 1,001 records (batch boundary) and an empty import.
    fn batch_boundaries(db) {
        assert_eq!(import(db, &[]), ImportOutcome::default());
        let records: Vec<ImportTask> = (0..1_000).map(record).collect();
        assert_eq!(import(db, &records).imported, 1_000);
        let records: Vec<ImportTask> = (0..1_001).map(record).collect();
        assert_eq!(import(db, &records).imported, 1_001);
        assert_eq!(task_count(db), 2_001);
        assert_eq!(row_count(db, "task_events"), 2_001);
    }

    // A record source that fails at record 1,700 (after a full batch was written inside the
    // transaction) makes the whole import fail with the source's own error, and nothing is
    // written: the all-or-nothing rule.
    fn failing_record_source_writes_nothing(db) {
        let existing = create(db, &repo(db), T0);
        let source = (0..2_500).map(|i| {
            if i == 1_700 {
                Err(ImportError::BadLine(i + 1))
            } else {
                Ok(record(i))
            }
        });
        let mut conn = db.conn().unwrap();
        let result = tasks::import_tasks(&mut conn, source);
        assert!(
            matches!(result, Err(ImportError::BadLine(1_701))),
            "{result:?}"
        );
        assert_eq!(task_count(db), 1, "only the task created before the import");
        assert_eq!(row_count(db, "task_events"), 1);
        assert_eq!(tasks::get_task(&mut conn, existing.id).unwrap(), existing);

        // The connection is usable afterwards, and a good import goes through.
        let ok = tasks::import_tasks::<ImportError, _>(&mut conn, (0..10).map(|i| Ok(record(i))))
            .unwrap();
        assert_eq!(ok.imported, 10);
    }

    // An error yielded as the very first record fails the import before anything is written.
    fn failing_first_record_writes_nothing(db) {
        let mut conn = db.conn().unwrap();
        let result = tasks::import_tasks(&mut conn, [Err(ImportError::BadLine(1)), Ok(record(1))]);
        assert!(matches!(result, Err(ImportError::BadLine(1))), "{result:?}");
        assert_eq!(task_count(db), 0);
    }

    // Imported records join the list with live tasks, in creation order.
    fn imported_tasks_are_listed_with_live_ones(db) {
        let repo = repo(db);
        let live = create(db, &repo, at(5) + time::Duration::microseconds(3));
        let records: Vec<ImportTask> = (0..10).map(record).collect();
        import(db, &records);
        let mut conn = db.conn().unwrap();
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 100, None).unwrap();
        let ids: Vec<Uuid> = page.tasks.iter().map(|t| t.id).collect();
        let pos: HashMap<Uuid, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        // record(i) is created at at(i) + i µs: records 5..10 are newer than `live`.
        assert_eq!(pos[&live.id], 5);
        assert_eq!(ids[0], records[9].id);
        assert_eq!(ids[10], records[0].id);
    }

    // Sums beyond the nano-dollar range cannot be accounted: such an import is refused as a
    // whole and writes nothing (no task, no event, no rollup row).
    fn an_import_whose_totals_overflow_is_refused_whole(db) {
        let mut records: Vec<ImportTask> = (0..3).map(record).collect();
        for r in &mut records {
            r.repo_url = RepoUrl::parse("https://github.com/o/r").unwrap();
            r.created_at = at(0);
            r.cost_usd = Some(Usd::from_nanos(i64::MAX / 2 + 1).unwrap());
        }
        let mut conn = db.conn().unwrap();
        let result = tasks::import_tasks::<DbError, _>(&mut conn, records.into_iter().map(Ok));
        assert!(matches!(result, Err(DbError::Conflict(_))), "{result:?}");
        drop(conn);
        assert_eq!(task_count(db), 0);
        assert_eq!(row_count(db, "task_events"), 0);
        assert_eq!(row_count(db, "cost_daily"), 0);
        assert_eq!(row_count(db, "cost_cumulative"), 0);
    }
}
