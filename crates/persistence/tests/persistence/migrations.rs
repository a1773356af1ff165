//! Migrations, database URLs and connecting.

use std::time::{Duration, Instant};

use crate::common::migrated_sqlite_file;
use agentry_persistence::{Backend, DatabaseUrl, Db, DbError, meta};

agentry_persistence::backend_tests! {
    // Days and months are cast to text in SQL (the rollups' keys, in their migrations too):
    // a PostgreSQL database whose DateStyle is not ISO still gets ISO text on every
    // connection. Before, a `SQL, DMY` database gave '23/11/2026', and the migrations that
    // rebuild rollups matched no day and wrote months no budget reads.
    fn dates_are_iso_text_whatever_the_databases_date_style(db) {
        use diesel::RunQueryDsl as _;
        #[derive(diesel::QueryableByName)]
        struct Text {
            #[diesel(sql_type = diesel::sql_types::Text)]
            t: String,
        }
        let mut conn = db.conn().unwrap();
        let agentry_persistence::AnyConnection::Postgresql(pg) = &mut *conn else {
            return;
        };
        diesel::sql_query(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET DateStyle = ''SQL, DMY''', \
             current_database()); END $$",
        )
        .execute(pg)
        .unwrap();
        drop(conn);
        let fresh = crate::common::wide_pool(db, 1);
        let mut conn = fresh.conn().unwrap();
        let agentry_persistence::AnyConnection::Postgresql(pg) = &mut *conn else {
            unreachable!("the same database");
        };
        let row: Text = diesel::sql_query(
            "SELECT CAST(CAST('2026-11-23 10:00:00' AS TIMESTAMP) AS TEXT) AS t",
        )
        .get_result(pg)
        .unwrap();
        assert_eq!(row.t, "2026-11-23 10:00:00");
    }

    // The test database is already migrated: migrating again applies nothing, and the
    // database reports no pending migration.
    fn migrate_twice_applies_nothing(db) {
        assert_eq!(db.migrate().unwrap(), Vec::<String>::new());
        let mut conn = db.conn().unwrap();
        assert_eq!(
            meta::pending_migrations(&mut conn).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(meta::task_count(&mut conn).unwrap(), 0);
        db.ping().unwrap();
    }

    // Lost runs recorded before migration 000026 had their cost summed under month '', which
    // no budget reads; the migration rebuilds the rollup with them in the month they started
    // (and its down migration puts them back under '').
    fn the_lost_run_month_migration_moves_their_cost_into_a_month(db) {
        use agentry_persistence::connection::MIGRATIONS;
        use agentry_persistence::tasks::{self, Run, RunOutcome};
        use agentry_persistence::{budgets, runner};
        use diesel_migrations::MigrationHarness as _;

        let repo = crate::common::repo(db);
        let task = crate::common::create(db, &repo, crate::common::at(1));
        let mut conn = db.conn().unwrap();
        let started = crate::common::at(5);
        runner::claim_next(&mut conn, "me", started, time::Duration::seconds(60)).unwrap().unwrap();
        let lost = Run {
            cost_usd: Some(crate::common::usd("0.7")),
            ..Run::new(task.id, 1, task.agent_type, RunOutcome::Lost, started)
        };
        tasks::record_run(&mut conn, &lost).unwrap();
        let spent = |conn: &mut agentry_persistence::AnyConnection| {
            budgets::repository_month(conn, repo.id, started).unwrap().spent
        };
        assert_eq!(spent(&mut conn), crate::common::usd("0.7"));
        let reverted = conn.revert_last_migration(MIGRATIONS).unwrap();
        assert_eq!(reverted.to_string(), "20261129000026");
        assert_eq!(spent(&mut conn), crate::common::usd("0"));
        drop(conn);
        assert_eq!(db.migrate().unwrap().len(), 1);
        assert_eq!(spent(&mut db.conn().unwrap()), crate::common::usd("0.7"));
    }

    // Replicas starting together migrate one at a time (PostgreSQL advisory lock): several
    // concurrent `migrate` calls on an up-to-date database all succeed and apply nothing.
    fn concurrent_migrate_calls_are_harmless(db) {
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|_| s.spawn(|| db.migrate())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            assert_eq!(r.unwrap(), Vec::<String>::new());
        }
    }
}

// A fresh SQLite file gets the embedded migrations applied exactly once.
#[test]
fn fresh_sqlite_database_is_migrated_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
    let db = Db::connect(&url, 2).unwrap();
    assert_eq!(db.backend(), Backend::Sqlite);
    let mut conn = db.conn().unwrap();
    let pending = meta::pending_migrations(&mut conn).unwrap();
    assert!(!pending.is_empty());
    drop(conn);
    let applied = db.migrate().unwrap();
    assert_eq!(applied.len(), pending.len(), "{applied:?}");
    assert!(
        applied[0].replace('-', "").starts_with("20261122000001"),
        "{applied:?}"
    );
    assert!(db.migrate().unwrap().is_empty());
    assert!(
        meta::pending_migrations(&mut db.conn().unwrap())
            .unwrap()
            .is_empty()
    );
}

// A repository stored before the setting allowProviderTools existed has it off once the
// migration that adds it has run, and its other settings are as they were.
#[test]
fn repositories_stored_before_allow_provider_tools_have_it_off() {
    use agentry_persistence::connection::MIGRATIONS;
    use agentry_persistence::repos;
    use diesel::RunQueryDsl as _;
    use diesel_migrations::MigrationHarness as _;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let mut conn = DatabaseUrl::parse(&url).unwrap().connect().unwrap();
    let pending = conn.pending_migrations(MIGRATIONS).unwrap();
    let before: Vec<_> = pending
        .iter()
        .take_while(|m| !m.name().to_string().ends_with("_allow_provider_tools"))
        .collect();
    assert!(before.len() < pending.len(), "the migration is embedded");
    for migration in before {
        conn.run_migration(migration.as_ref()).unwrap();
    }
    let id = uuid::Uuid::new_v4();
    diesel::sql_query(format!(
        "INSERT INTO repositories (id, url, owner, name, default_branch, clone_url, \
         coding_model, review_model, max_turns_coding, max_turns_review, agent_type, \
         auto_review, connected_at, created_at, updated_at, revise_on_agent_review) \
         VALUES ('{id}', 'https://github.com/o/r', 'o', 'r', 'main', \
         'https://github.com/o/r.git', 'opus', 'haiku', 100, 30, 'claude-code', TRUE, \
         '2026-11-01 00:00:00', '2026-11-01 00:00:00', '2026-11-01 00:00:00', TRUE)"
    ))
    .execute(&mut conn)
    .unwrap();
    drop(conn);

    let db = Db::connect(&url, 2).unwrap();
    let applied = db.migrate().unwrap();
    assert!(
        applied[0].replace('-', "").starts_with("20261128000021"),
        "{applied:?}"
    );
    let repo = repos::get_repository(&mut db.conn().unwrap(), id).unwrap();
    assert!(!repo.settings.allow_provider_tools);
    assert_eq!(
        (
            repo.settings.coding_model.as_str(),
            repo.settings.revise_on_agent_review
        ),
        ("opus", true)
    );
}

/// The page size recorded in an SQLite file's header (bytes 16–17, big-endian; 1 means 65,536).
fn header_page_size(path: &std::path::Path) -> u32 {
    let header = std::fs::read(path).unwrap();
    match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u32::from(n),
    }
}

// A database the service creates gets its page size (16 KiB, for bulk writes); a file
// created before with SQLite's default 4 KiB keeps it, and migrates and works as before.
#[test]
fn new_sqlite_files_get_the_service_page_size_and_old_ones_keep_theirs() {
    use diesel::Connection as _;
    use diesel::connection::SimpleConnection as _;

    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.db");
    let db = migrated_sqlite_file(&fresh);
    drop(db);
    assert_eq!(
        header_page_size(&fresh),
        agentry_persistence::connection::SQLITE_PAGE_SIZE
    );

    let old = dir.path().join("old.db");
    let mut conn = diesel::SqliteConnection::establish(old.to_str().unwrap()).unwrap();
    conn.batch_execute(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; CREATE TABLE before (a INTEGER);",
    )
    .unwrap();
    drop(conn);
    let db = Db::connect(&format!("sqlite://{}", old.display()), 2).unwrap();
    assert!(!db.migrate().unwrap().is_empty());
    assert_eq!(meta::task_count(&mut db.conn().unwrap()).unwrap(), 0);
    drop(db);
    assert_eq!(header_page_size(&old), 4096);
}

// The write-ahead log is copied back into the database at about the same size whatever the
// file's page size: the checkpoint runs inside the commit that crosses the threshold, while
// that writer holds the write turn, so its size is the tail latency of every write. With
// SQLite's default of 1,000 pages, 16 KiB pages would let the log grow to 16 MiB.
#[test]
fn the_wal_is_checkpointed_at_the_same_size_whatever_the_page_size() {
    use agentry_persistence::connection::SQLITE_WAL_CHECKPOINT_BYTES;
    use diesel::Connection as _;
    use diesel::connection::SimpleConnection as _;

    for created_with in [None, Some(4096)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.db");
        if let Some(page_size) = created_with {
            let mut conn = diesel::SqliteConnection::establish(path.to_str().unwrap()).unwrap();
            conn.batch_execute(&format!(
                "PRAGMA page_size = {page_size}; PRAGMA journal_mode = WAL;"
            ))
            .unwrap();
        }
        let db = Db::connect(&format!("sqlite://{}", path.display()), 2).unwrap();
        let mut conn = db.conn().unwrap();
        conn.batch_execute("CREATE TABLE blobs (b BLOB)").unwrap();
        // 24 MiB in 64 KiB commits.
        for _ in 0..384 {
            conn.batch_execute("INSERT INTO blobs VALUES (randomblob(65536))")
                .unwrap();
        }
        let wal = std::fs::metadata(dir.path().join("wal.db-wal"))
            .unwrap()
            .len();
        let limit = u64::try_from(SQLITE_WAL_CHECKPOINT_BYTES).unwrap() + 512 * 1024;
        assert!(
            wal <= limit,
            "created with page size {created_with:?}: the WAL grew to {wal} bytes, past {limit}"
        );
        assert!(
            wal >= 1024 * 1024,
            "the test wrote through the WAL: {wal} bytes"
        );
    }
}

#[test]
fn database_url_accepts_sqlite_and_postgres_schemes() {
    assert_eq!(
        DatabaseUrl::parse("sqlite:///var/lib/agentry/agentry.db").unwrap(),
        DatabaseUrl::Sqlite("/var/lib/agentry/agentry.db".into())
    );
    assert_eq!(
        DatabaseUrl::parse("sqlite://agentry.db").unwrap(),
        DatabaseUrl::Sqlite("agentry.db".into())
    );
    for url in [
        "postgres://u:p@db.example:5432/agentry",
        "postgresql://u@localhost/agentry?sslmode=require",
    ] {
        // Passed to libpq unchanged.
        assert_eq!(
            DatabaseUrl::parse(url).unwrap(),
            DatabaseUrl::Postgres(url.into())
        );
        assert_eq!(
            DatabaseUrl::parse(url).unwrap().backend(),
            Backend::Postgres
        );
    }
    assert_eq!(
        DatabaseUrl::parse("sqlite://x.db").unwrap().backend(),
        Backend::Sqlite
    );
}

#[test]
fn database_url_refuses_everything_else() {
    for url in [
        "mysql://u@h/db",
        "host=x dbname=y",
        "sqlite://",
        "",
        "agentry.db",
        "sqlite:agentry.db",
        "postgres:/h/db",
        "SQLITE://x.db",
        "http://h/db",
    ] {
        assert!(
            matches!(DatabaseUrl::parse(url), Err(DbError::InvalidUrl(_))),
            "{url:?} must be refused"
        );
        assert!(
            matches!(Db::connect(url, 1), Err(DbError::InvalidUrl(_))),
            "Db::connect({url:?}) must refuse the URL"
        );
    }
}

// An unreachable PostgreSQL server is reported at once as a connection error: no hang, and no
// fallback that would create an SQLite file named like the URL.
#[test]
fn connect_to_unreachable_postgres_fails_fast() {
    let cwd_before = cwd_entries();
    let started = Instant::now();
    let result = Db::connect("postgres://postgres@127.0.0.1:1/agentry", 4);
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(DbError::Connect(_))), "{result:?}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(cwd_before, cwd_entries(), "connect must not create files");
    assert!(!std::path::Path::new("postgres:").exists());
}

fn cwd_entries() -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(".")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names
}

// A SQLite path in a directory that does not exist is a connection error too.
#[test]
fn connect_to_impossible_sqlite_path_fails() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}",
        dir.path().join("missing-dir").join("x.db").display()
    );
    let result = Db::connect(&url, 1);
    assert!(matches!(result, Err(DbError::Connect(_))), "{result:?}");
    assert!(!dir.path().join("missing-dir").exists());
}
