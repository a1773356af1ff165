//! Helpers shared by the persistence integration tests.
#![allow(dead_code, clippy::panic)]

use agentry_domain::{RepoUrl, Tokens, Usd};
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::tasks::{self, NewTask};
use agentry_persistence::test_support::{PG_URL_VAR, database_url};
use agentry_persistence::{AnyConnection, Db, PooledConnection};
use diesel::prelude::*;
use diesel::sql_types::{Integer, Text};
use time::{Duration, OffsetDateTime, macros::datetime};

/// A fixed instant with a non-zero microsecond part, so that precision loss would show.
pub const T0: OffsetDateTime = datetime!(2026-01-15 10:20:30.123456 UTC);

/// The SQLite database in the file `path` (made if missing), migrated.
pub fn migrated_sqlite_file(path: &std::path::Path) -> Db {
    let db = Db::connect(&format!("sqlite://{}", path.display()), 2).unwrap();
    db.migrate().unwrap();
    db
}

/// `T0` plus `secs` seconds.
pub fn at(secs: i64) -> OffsetDateTime {
    T0 + Duration::seconds(secs)
}

/// Parses a dollar amount.
pub fn usd(text: &str) -> Usd {
    Usd::parse(text).unwrap()
}

/// A repository description for `https://github.com/{owner}/{name}`.
pub fn new_repo(owner: &str, name: &str) -> NewRepository {
    NewRepository {
        url: RepoUrl::parse(&format!("https://github.com/{owner}/{name}")).unwrap(),
        default_branch: "main".into(),
        clone_url: format!("https://github.com/{owner}/{name}.git"),
        codehost_id: Some(42),
    }
}

/// Connects `https://github.com/o/r`.
pub fn repo(db: &Db) -> Repository {
    connect(db, "o", "r")
}

/// Connects `https://github.com/{owner}/{name}`.
pub fn connect(db: &Db, owner: &str, name: &str) -> Repository {
    let mut conn = db.conn().unwrap();
    repos::connect_repository(&mut conn, &new_repo(owner, name), T0)
        .unwrap()
        .0
}

/// A run of `task` at `attempt` on sonnet that cost `cost` (one token in and out, one turn,
/// sandboxed) and finished at `finished`.
pub fn sonnet_run(
    task: uuid::Uuid,
    attempt: i32,
    cost: &str,
    finished: OffsetDateTime,
) -> tasks::Run {
    tasks::Run {
        model: Some("sonnet".into()),
        cost_usd: Some(usd(cost)),
        tokens: Tokens {
            input: 1,
            output: 1,
            ..Tokens::default()
        },
        turns: Some(1),
        sandboxed: Some(true),
        ..agentry_persistence::test_support::succeeded_run(task, attempt, finished)
    }
}

/// A coding task on `repo`, created at `created_at`.
pub fn new_task(repo: &Repository, created_at: OffsetDateTime) -> NewTask {
    NewTask {
        title: "Fix the flaky test".into(),
        prompt: "It fails one run in ten.".into(),
        ..agentry_persistence::test_support::coding_task(repo, created_at)
    }
}

/// The coding task of issue `issue_number` of `repo`.
pub fn issue_task(repo: &Repository, issue_number: i64) -> NewTask {
    NewTask {
        issue_number: Some(issue_number),
        ..new_task(repo, T0)
    }
}

/// Creates a coding task on `repo`.
pub fn create(db: &Db, repo: &Repository, created_at: OffsetDateTime) -> agentry_domain::Task {
    let mut conn = db.conn().unwrap();
    tasks::create_task(&mut conn, &new_task(repo, created_at), "created").unwrap()
}

/// A coding task created at T0 on the default repository ([`repo`]), and a connection.
pub fn a_task(db: &Db) -> (agentry_domain::Task, PooledConnection) {
    let repo = repo(db);
    let task = create(db, &repo, T0);
    (task, db.conn().unwrap())
}

/// Number of rows in `tasks`.
pub fn task_count(db: &Db) -> i64 {
    agentry_persistence::meta::task_count(&mut db.conn().unwrap()).unwrap()
}

/// Number of rows in a table (for "nothing was written" checks).
pub fn row_count(db: &Db, table: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = db.conn().unwrap();
    let sql = format!("SELECT COUNT(*) AS n FROM {table}");
    let rows: Vec<Count> = match &mut *conn {
        AnyConnection::Sqlite(c) => diesel::sql_query(sql).load(c).unwrap(),
        AnyConnection::Postgresql(c) => diesel::sql_query(sql).load(c).unwrap(),
    };
    rows[0].n
}

/// A second pool of up to `size` connections on the same database as `db`, so that many
/// threads can hold a connection at the same moment (the test pool has only 8).
pub fn wide_pool(db: &Db, size: u32) -> Db {
    #[derive(QueryableByName)]
    struct DbFile {
        #[diesel(sql_type = Integer)]
        #[allow(dead_code)]
        seq: i32,
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        file: String,
    }
    #[derive(QueryableByName)]
    struct DbName {
        #[diesel(sql_type = Text)]
        name: String,
    }
    let url = {
        let mut conn = db.conn().unwrap();
        match &mut *conn {
            AnyConnection::Sqlite(c) => {
                let files: Vec<DbFile> = diesel::sql_query("PRAGMA database_list").load(c).unwrap();
                let main = files.into_iter().find(|f| f.name == "main").unwrap();
                format!("sqlite://{}", main.file)
            }
            AnyConnection::Postgresql(c) => {
                let names: Vec<DbName> = diesel::sql_query("SELECT current_database() AS name")
                    .load(c)
                    .unwrap();
                let server = std::env::var(PG_URL_VAR).unwrap();
                database_url(&server, &names[0].name)
            }
        }
    };
    Db::connect(&url, size).unwrap()
}

/// Runs `f(i)` on `n` threads that each first take their own connection from `db` and then
/// wait for all the others, so that the calls really overlap. Returns the results in
/// thread order.
pub fn race<T: Send>(
    db: &Db,
    n: usize,
    f: impl Fn(usize, &mut AnyConnection) -> T + Sync,
) -> Vec<T> {
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    let mut conn = db.conn().unwrap();
                    barrier.wait();
                    f(i, &mut conn)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// An open issue numbered `number`, created at `T0` and updated `updated` seconds after it,
/// carrying labels with the given names (colour `ededed`).
pub fn synced_issue(
    number: i64,
    updated: i64,
    labels: &[&str],
) -> agentry_persistence::issues::SyncedIssue {
    agentry_persistence::issues::SyncedIssue {
        number,
        title: format!("Issue {number}"),
        body: format!("Body of issue {number}"),
        html_url: format!("https://github.com/o/r/issues/{number}"),
        author: "octocat".into(),
        labels: labels
            .iter()
            .map(|name| agentry_persistence::issues::IssueLabel {
                name: (*name).to_owned(),
                color: "ededed".into(),
            })
            .collect(),
        created_at: T0,
        updated_at: at(updated),
    }
}

/// Creates the coding task linked to issue `issue_number` of `repo` (no effects).
pub fn link_issue(db: &Db, repo: &Repository, issue_number: i64) -> agentry_domain::Task {
    let mut conn = db.conn().unwrap();
    let (task, created) =
        tasks::create_issue_task(&mut conn, &issue_task(repo, issue_number), |_, _| Ok(()))
            .unwrap();
    assert!(created);
    task
}

/// Takes `task` through claim, start and `PullRequestOpened` (pull request `pr_number` of
/// its repository, opened at `at(3)`), so that it waits in `pr_opened`.
pub fn open_pull(db: &Db, task: &agentry_domain::Task, pr_number: i64) -> agentry_domain::Task {
    agentry_persistence::test_support::open_pull_request(
        &mut db.conn().unwrap(),
        task.id,
        pr_number,
        at(3),
    )
    .unwrap()
}

/// How many lock requests wait in this PostgreSQL database.
pub fn lock_waiters(conn: &mut AnyConnection) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT COUNT(*) AS n FROM pg_locks WHERE NOT granted AND pid IN \
         (SELECT pid FROM pg_stat_activity WHERE datname = current_database())",
    )
    .get_result::<Waiting>(conn)
    .unwrap()
    .n
}
