//! Databases for tests: a fresh SQLite file, or a fresh database on the PostgreSQL server
//! named by `AGENTRY_TEST_PG_URL` (e.g. `postgres://postgres@127.0.0.1:31432/postgres`).
//!
//! When `AGENTRY_TEST_REQUIRE_PG=1` (CI sets it), a missing or unreachable server fails the
//! test instead of skipping it, so the PostgreSQL suite can never silently not run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use diesel::prelude::*;
use uuid::Uuid;

use crate::{Backend, Db, DbError};

/// Names the server the PostgreSQL variants of the tests run on.
pub const PG_URL_VAR: &str = "AGENTRY_TEST_PG_URL";
/// When set to `1`, the PostgreSQL variants fail instead of skipping without a server.
pub const REQUIRE_PG_VAR: &str = "AGENTRY_TEST_REQUIRE_PG";

/// A migrated, empty database that is deleted when dropped.
pub struct TestDb {
    /// The pool to use in the test.
    pub db: Db,
    /// The URL of this database (to start a binary on it).
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { server_url: String, name: String },
}

impl TestDb {
    /// A fresh SQLite database file in a temporary directory.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("agentry.db").display());
        let db = Db::connect(&url, 8).expect("open SQLite");
        db.migrate().expect("migrate SQLite");
        TestDb {
            db,
            url,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    /// A fresh database on the test PostgreSQL server, or `None` (with a note on stderr)
    /// when no server is configured and none is required.
    pub fn postgres() -> Option<TestDb> {
        let server_url = match std::env::var(PG_URL_VAR) {
            Ok(url) if !url.is_empty() => url,
            _ => {
                if pg_required() {
                    panic!("{REQUIRE_PG_VAR}=1 but {PG_URL_VAR} is not set");
                }
                eprintln!("note: {PG_URL_VAR} not set; skipping the PostgreSQL variant");
                return None;
            }
        };
        let name = format!("agentry_test_{}", Uuid::new_v4().simple());
        let url = fresh_database(&server_url, &name)
            .unwrap_or_else(|e| panic!("cannot create a test database on {server_url}: {e}"));
        let db = Db::connect(&url, 8).expect("connect to the test database");
        db.migrate().expect("migrate PostgreSQL");
        assert_eq!(db.backend(), Backend::Postgres);
        Some(TestDb {
            db,
            url,
            cleanup: Cleanup::Postgres { server_url, name },
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Postgres { server_url, name } = &self.cleanup
            && let Ok(mut admin) = PgConnection::establish(server_url)
        {
            let _ = drop_database(&mut admin, name);
        }
    }
}

/// A new, empty database `name` (a plain identifier) on the PostgreSQL server at
/// `server_url`, dropped first if it exists (its connections ended); its URL. For tests and
/// the benchmarks' `--pg`.
///
/// # Errors
///
/// The server cannot be reached or refuses the statements.
pub fn fresh_database(server_url: &str, name: &str) -> Result<String, DbError> {
    let mut admin =
        PgConnection::establish(server_url).map_err(|e| DbError::Connect(e.to_string()))?;
    drop_database(&mut admin, name)?;
    diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut admin)?;
    Ok(database_url(server_url, name))
}

/// Drops `name` if it exists; connections of a pool may still be open, and FORCE ends them
/// (PostgreSQL 13+).
fn drop_database(admin: &mut PgConnection, name: &str) -> Result<usize, diesel::result::Error> {
    diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(admin)
}

fn pg_required() -> bool {
    std::env::var(REQUIRE_PG_VAR).is_ok_and(|v| v == "1")
}

/// `server_url` with its database name replaced by `name`.
pub fn database_url(server_url: &str, name: &str) -> String {
    let (base, query) = match server_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (server_url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut url = format!("{}/{}", &base[..authority_end], name);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// Defines each test once per backend: `mod sqlite { #[test] fn name() }` and
/// `mod postgres { #[test] fn name() }`. The body gets `db: &Db`.
///
/// When this crate was built without `AGENTRY_TEST_PG_URL` (and without
/// `AGENTRY_TEST_REQUIRE_PG=1`), the PostgreSQL variants are `#[ignore]`d, so `cargo test`
/// reports them as ignored rather than passed (the build script sets the cfg
/// `agentry_pg_skipped`; it is known to this crate's tests only, where the macro is used).
/// Cargo rebuilds the crate when either variable changes, so the marks follow the
/// environment of each `cargo test`.
#[macro_export]
macro_rules! backend_tests {
    ($( $(#[$meta:meta])* fn $name:ident($db:ident) $body:block )*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test] fn $name() {
                let test_db = $crate::test_support::TestDb::sqlite();
                let $db: &$crate::Db = &test_db.db;
                $body
            } )*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $( $(#[$meta])* #[test]
            #[cfg_attr(
                agentry_pg_skipped,
                ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
            )]
            fn $name() {
                let Some(test_db) = $crate::test_support::TestDb::postgres() else { return };
                let $db: &$crate::Db = &test_db.db;
                $body
            } )*
        }
    };
}

/// Takes a queued task through a run that opened pull request `number` (claim, agent
/// started, pull request opened, all at `now`), as the runner would; returns the task in
/// `pr_opened`. For tests and benchmarks of pull-request tracking.
pub fn open_pull_request(
    conn: &mut crate::AnyConnection,
    task_id: Uuid,
    number: i64,
    now: time::OffsetDateTime,
) -> Result<agentry_domain::Task, crate::DbError> {
    use crate::tasks::{TransitionDetails, get_task, transition_task};
    use agentry_domain::Trigger;
    let none = TransitionDetails::default();
    transition_task(conn, task_id, Trigger::Claim, &none, now)?;
    transition_task(conn, task_id, Trigger::AgentStarted, &none, now)?;
    let url = format!("{}/pull/{number}", get_task(conn, task_id)?.repo_url);
    let details = TransitionDetails {
        pull_request: Some(agentry_domain::PullRequestRef { url, number }),
        ..TransitionDetails::default()
    };
    Ok(transition_task(conn, task_id, Trigger::PullRequestOpened, &details, now)?.0)
}

/// A run of `task_id` at `attempt` on Claude Code that started and finished at `at` and
/// succeeded (exit code 0), with no model, cost, tokens or turns reported. Tests and
/// benchmarks set what they exercise with struct update syntax
/// (`Run { cost_usd, ..succeeded_run(task, 1, at) }`) and pass it to
/// [`record_run`](crate::tasks::record_run).
pub fn succeeded_run(task_id: Uuid, attempt: i32, at: time::OffsetDateTime) -> crate::tasks::Run {
    use crate::tasks::{Run, RunOutcome};
    Run {
        exit_code: Some(0),
        finished_at: Some(at),
        ..Run::new(
            task_id,
            attempt,
            agentry_domain::AgentType::ClaudeCode,
            RunOutcome::Succeeded,
            at,
        )
    }
}

/// A completed metered call of attempt `attempt` of `task`: 100 input and 1,000 output tokens
/// of claude-sonnet-5, costing `cost`.
pub fn model_call(
    task: Uuid,
    attempt: i32,
    cost: agentry_domain::Usd,
) -> crate::metering::ModelCall {
    crate::metering::ModelCall {
        id: Uuid::now_v7(),
        task_id: task,
        attempt,
        provider: "anthropic".into(),
        model: Some("claude-sonnet-5".into()),
        status: 200,
        outcome: "completed".into(),
        tokens: agentry_domain::Tokens::from_uncached(100, 0, 0, 1000),
        reasoning_tokens: 0,
        cost_usd: Some(cost),
        started_at: crate::now(),
        duration_ms: 1000,
    }
}

/// A new coding task on `repo` for Claude Code, created at `created_at`, titled "A task"
/// with an empty prompt, no issue and no parent; tests set what they need with struct
/// update syntax and pass it to [`create_task`](crate::tasks::create_task).
pub fn coding_task(
    repo: &crate::repos::Repository,
    created_at: time::OffsetDateTime,
) -> crate::tasks::NewTask {
    crate::tasks::NewTask {
        id: Uuid::new_v4(),
        title: "A task".into(),
        prompt: String::new(),
        repo_id: Some(repo.id),
        repo_url: repo.url.clone(),
        task_type: agentry_domain::TaskType::Coding,
        agent_type: agentry_domain::AgentType::ClaudeCode,
        issue_number: None,
        parent_task_id: None,
        created_at,
    }
}

/// Creates `n` queued coding tasks on `repo` ("Task 0", "Task 1", …, prompt "Do it"), in
/// the order of their time-ordered ids; returns the ids.
pub fn create_coding_tasks(
    conn: &mut crate::AnyConnection,
    repo: &crate::repos::Repository,
    n: usize,
    created_at: time::OffsetDateTime,
) -> Result<Vec<Uuid>, crate::DbError> {
    (0..n)
        .map(|i| {
            let task = crate::tasks::NewTask {
                id: Uuid::now_v7(),
                title: format!("Task {i}"),
                prompt: "Do it".into(),
                ..coding_task(repo, created_at)
            };
            crate::tasks::create_task(conn, &task, "created")?;
            Ok(task.id)
        })
        .collect()
}

/// A row of the cumulative cost rollup: repository URL, task type, model, day, and its
/// thirteen sums in column order (tasks, costed, cost, succeeded, input tokens, output
/// tokens, then the outcome columns: merged, costed, cost, merged cost, failed cost, merged
/// revisions, revision cost).
pub type CumulativeRow = (String, String, String, String, [i64; 13]);

/// Every row of the cumulative cost rollup, in key order, for tests that compare what the
/// rollup holds with what it should.
pub fn cumulative_rows(conn: &mut crate::AnyConnection) -> Vec<CumulativeRow> {
    cumulative_rows_with_imported(conn)
        .into_iter()
        .map(|(repo, kind, model, day, sums)| {
            let mut first = [0; 13];
            first.copy_from_slice(&sums[..13]);
            (repo, kind, model, day, first)
        })
        .collect()
}

/// [`cumulative_rows`] with a fourteenth figure: the imported cost (the part of the cost
/// that is imported history).
pub fn cumulative_rows_with_imported(
    conn: &mut crate::AnyConnection,
) -> Vec<(String, String, String, String, [i64; 14])> {
    use crate::schema::cost_cumulative as cc;
    let rows: Vec<crate::rollups::CumRecord> = cc::table
        .order((cc::repo_url, cc::task_type, cc::model, cc::day))
        .select(crate::rollups::CumRecord::as_select())
        .load(conn)
        .unwrap();
    rows.into_iter()
        .map(|r| {
            let (s, o) = (r.cum.sums, r.cum.outcome);
            let sums = [
                s.tasks,
                s.costed,
                s.cost_nanos,
                s.succeeded,
                s.input_tokens,
                s.output_tokens,
                o.merged,
                o.costed,
                o.cost_nanos,
                o.merged_cost_nanos,
                o.failed_cost_nanos,
                o.merged_revisions,
                o.revision_cost_nanos,
                s.imported_cost_nanos,
            ];
            (r.repo_url, r.task_type, r.model, r.day, sums)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn database_url_replaces_only_the_name() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:55432/postgres", "x"),
            "postgres://postgres@127.0.0.1:55432/x"
        );
        assert_eq!(
            database_url("postgres://u:p@h/db?sslmode=require", "y"),
            "postgres://u:p@h/y?sslmode=require"
        );
        assert_eq!(database_url("postgres://h", "z"), "postgres://h/z");
    }
}
