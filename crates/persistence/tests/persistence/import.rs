//! Bulk import of task history (docs/contract.md#39-import): batches, skips, all-or-nothing.

use std::collections::HashMap;

use crate::common::*;
use agentry_domain::{AgentType, RepoUrl, Task, TaskState, TaskType, Usd};
use agentry_persistence::tasks::{self, ImportOutcome, ImportTask, TaskFilter};
use agentry_persistence::{AnyConnection, Db, DbError, rollups, write_tx};
use diesel::prelude::*;
use diesel::sql_types::Text;
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

/// Imports 12,500 records from a source that fails at record `fail` (0-based): the import
/// fails with the source's own error, for line `fail + 1`.
fn import_failing_at(conn: &mut AnyConnection, fail: usize) {
    let source = (0..12_500).map(|i| {
        if i == fail {
            Err(ImportError::BadLine(i + 1))
        } else {
            Ok(record(i))
        }
    });
    let result = tasks::import_tasks(conn, source);
    assert!(
        matches!(result, Err(ImportError::BadLine(line)) if line == fail + 1),
        "{result:?}"
    );
}

/// No task, no event and no rollup row is stored.
fn assert_nothing_written(db: &Db) {
    assert_tasks_and_events(db, 0);
    assert_eq!(row_count(db, "cost_daily"), 0);
    assert_eq!(row_count(db, "cost_cumulative"), 0);
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

/// Imports `records`: `imported` of them are written and `skipped` skipped.
fn assert_import(db: &Db, records: &[ImportTask], imported: u64, skipped: u64) {
    assert_eq!(import(db, records), ImportOutcome { imported, skipped });
}

/// `n` tasks are stored, and `n` task events (one creation event each).
fn assert_tasks_and_events(db: &Db, n: i64) {
    assert_eq!(task_count(db), n);
    assert_eq!(row_count(db, "task_events"), n);
}

/// The indexes of the tables an import writes, as (name, definition) in name order: what
/// the database itself reports, so a dropped, renamed or changed index shows.
fn import_indexes(db: &Db) -> Vec<(String, String)> {
    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        def: String,
    }
    let mut conn = db.conn().unwrap();
    let rows: Vec<Index> = match &mut *conn {
        AnyConnection::Sqlite(c) => diesel::sql_query(
            "SELECT name, COALESCE(sql, '') AS def FROM sqlite_schema \
             WHERE type = 'index' AND tbl_name IN ('tasks', 'task_events') ORDER BY name",
        )
        .load(c)
        .unwrap(),
        AnyConnection::Postgresql(c) => diesel::sql_query(
            "SELECT indexname::text AS name, indexdef::text AS def FROM pg_indexes \
             WHERE tablename IN ('tasks', 'task_events') ORDER BY indexname",
        )
        .load(c)
        .unwrap(),
    };
    rows.into_iter().map(|r| (r.name, r.def)).collect()
}

/// On SQLite, that every index holds exactly the entries of its table's rows
/// (`PRAGMA integrity_check`); PostgreSQL maintains its indexes itself during a COPY.
fn assert_indexes_match_rows(db: &Db) {
    #[derive(QueryableByName)]
    struct Check {
        #[diesel(sql_type = Text)]
        integrity_check: String,
    }
    let mut conn = db.conn().unwrap();
    if let AnyConnection::Sqlite(c) = &mut *conn {
        let rows: Vec<Check> = diesel::sql_query("PRAGMA integrity_check").load(c).unwrap();
        let found: Vec<&str> = rows.iter().map(|r| r.integrity_check.as_str()).collect();
        assert_eq!(found, ["ok"]);
    }
}

/// Every row of both cost rollups, as text.
fn rollup_rows(db: &Db) -> Vec<String> {
    use agentry_persistence::schema::cost_daily as cd;
    let mut conn = db.conn().unwrap();
    let daily: Vec<(String, String, i64, i64, i64)> = cd::table
        .order((cd::day, cd::repo_url))
        .load(&mut conn)
        .unwrap();
    let cumulative = agentry_persistence::test_support::cumulative_rows_with_imported(&mut conn);
    daily
        .iter()
        .map(|r| format!("{r:?}"))
        .chain(cumulative.iter().map(|r| format!("{r:?}")))
        .collect()
}

agentry_persistence::backend_tests! {
    // Imported tasks are history: a claim passes over imported `queued` tasks (older than
    // the service's own, so first in the queue's order) and takes the task the service
    // created; with only imported tasks left there is nothing to claim. A retry of an
    // imported failed task is refused and changes nothing.
    fn imported_tasks_are_never_claimed_or_retried(db) {
        let repo = repo(db);
        let mut queued = record(1);
        queued.state = TaskState::Queued;
        queued.repo_url = repo.url.clone();
        let mut failed = record(2);
        failed.state = TaskState::Failed;
        failed.repo_url = repo.url.clone();
        assert_eq!(import(db, &[queued.clone(), failed.clone()]).imported, 2);
        let own = create(db, &repo, at(10_000));
        let mut conn = db.conn().unwrap();
        let lease = time::Duration::seconds(60);
        let claimed = agentry_persistence::runner::claim_next(&mut conn, "me", at(10_001), lease)
            .unwrap()
            .unwrap();
        assert_eq!(claimed.id, own.id);
        assert!(
            agentry_persistence::runner::claim_next(&mut conn, "me", at(10_002), lease)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            tasks::get_task(&mut conn, queued.id).unwrap().state,
            TaskState::Queued
        );
        let refused = tasks::transition_task(
            &mut conn,
            failed.id,
            agentry_domain::Trigger::Retry,
            &tasks::TransitionDetails::default(),
            at(10_003),
        );
        assert!(matches!(refused, Err(DbError::Conflict(_))), "{refused:?}");
        let after = tasks::get_task(&mut conn, failed.id).unwrap();
        assert_eq!((after.state, after.attempt), (TaskState::Failed, 1));
    }

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
        assert_import(db, &records, 2_500, 0);
        assert_tasks_and_events(db, 2_500);
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
        assert_import(db, &changed, 0, 2_500);
        assert_tasks_and_events(db, 2_500);
        let mut conn = db.conn().unwrap();
        assert_eq!(
            tasks::get_task(&mut conn, records[1_234].id).unwrap(),
            before
        );
        drop(conn);

        let mut mixed: Vec<ImportTask> = (2_500..2_510).map(record).collect();
        mixed.extend(records[..5].iter().cloned());
        assert_import(db, &mixed, 10, 5);
        assert_eq!(task_count(db), 2_510);
    }

    // A repeated id inside one import keeps the first record and skips the second, within a
    // batch and across the 10,000-record batch boundary.
    fn duplicate_ids_inside_one_import_are_skipped(db) {
        let mut records: Vec<ImportTask> = (0..10_500).map(record).collect();
        let same_batch = ImportTask {
            title: "second copy".into(),
            ..records[3].clone()
        };
        let next_batch = ImportTask {
            title: "copy in batch 2".into(),
            ..records[10].clone()
        };
        records.insert(5, same_batch);
        records.insert(10_200, next_batch);
        assert_import(db, &records, 10_500, 2);
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
        assert_eq!(row_count(db, "task_events"), 10_500);
    }

    // Exactly 10,000 and 10,001 records (batch boundary) and an empty import.
    fn batch_boundaries(db) {
        assert_eq!(import(db, &[]), ImportOutcome::default());
        let records: Vec<ImportTask> = (0..10_000).map(record).collect();
        assert_eq!(import(db, &records).imported, 10_000);
        let records: Vec<ImportTask> = (0..10_001).map(record).collect();
        assert_eq!(import(db, &records).imported, 10_001);
        assert_tasks_and_events(db, 20_001);
    }

    // A record source that fails at record 11,700 (after a full batch was written inside the
    // transaction) makes the whole import fail with the source's own error, and nothing is
    // written: the all-or-nothing rule.
    fn failing_record_source_writes_nothing(db) {
        let existing = create(db, &repo(db), T0);
        let mut conn = db.conn().unwrap();
        import_failing_at(&mut conn, 11_700);
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
        assert_nothing_written(db);
    }

    // Into empty tables, the import builds the secondary indexes after the rows (SQLite): a
    // record source failing after a full batch was written, i.e. after the indexes were
    // dropped, leaves the database exactly as before: no task, no event, no rollup row, and
    // the same indexes with the same definitions. A good import afterwards keeps them too,
    // and every index holds exactly its rows' entries.
    fn a_failure_after_the_index_drop_leaves_the_database_as_before(db) {
        let indexes = import_indexes(db);
        assert!(
            indexes.iter().any(|(name, _)| name == "tasks_cost"),
            "{indexes:?}"
        );
        let mut conn = db.conn().unwrap();
        import_failing_at(&mut conn, 12_345);
        drop(conn);
        assert_nothing_written(db);
        assert_eq!(import_indexes(db), indexes);
        assert_indexes_match_rows(db);

        let records: Vec<ImportTask> = (0..12_500).map(record).collect();
        assert_eq!(import(db, &records).imported, 12_500);
        assert_eq!(import_indexes(db), indexes);
        assert_indexes_match_rows(db);
    }

    // Random-id imports, first into empty tables and then into a non-empty one with some
    // ids already stored, keep the rollups equal to a rebuild from the task table, and the
    // indexes complete.
    fn rollups_equal_a_rebuild_after_random_id_imports(db) {
        let spread = |i: usize| ImportTask {
            // About two weeks of history, several records a day, out of order.
            created_at: at((i as i64 * 7_919) % 1_209_600),
            ..record(i)
        };
        let first: Vec<ImportTask> = (0..12_000).map(spread).collect();
        assert_eq!(import(db, &first).imported, 12_000);
        let mut second: Vec<ImportTask> = (12_000..13_000).map(spread).collect();
        second.extend(first[5_000..5_100].iter().cloned());
        assert_import(db, &second, 1_000, 100);
        assert_tasks_and_events(db, 13_000);
        assert_indexes_match_rows(db);

        let incremental = rollup_rows(db);
        assert!(!incremental.is_empty());
        let mut conn = db.conn().unwrap();
        write_tx::<_, DbError, _>(&mut conn, rollups::rebuild).unwrap();
        drop(conn);
        assert_eq!(incremental, rollup_rows(db));
    }
}
