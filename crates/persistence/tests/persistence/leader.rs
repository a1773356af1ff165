//! The leader lock (docs/contract.md#55-pull-request-tracking, #8-scale-out): on PostgreSQL one holder per key among the processes
//! sharing the database, lost with its session; on SQLite always held.

use std::time::Duration;

use agentry_persistence::DbError;
use agentry_persistence::leader::LeaderLock;
use agentry_persistence::test_support::TestDb;
use agentry_testkit::wait::eventually;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer};

const KEY: i64 = 0x0070_6f6c_6c65_7201;

/// How long a test waits for a session or lock to change.
const PATIENCE: Duration = Duration::from_secs(10);

/// A plain connection to the test database, to watch and kill sessions.
fn admin(test_db: &TestDb) -> PgConnection {
    PgConnection::establish(&test_db.url).unwrap()
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// The server process of the session holding the leader lock `key` in this database.
fn holder(admin: &mut PgConnection, key: i64) -> Option<i32> {
    // Two-int4 advisory keys appear as (classid, objid) = (high, low) with objsubid 2.
    let (high, low) = ((key >> 32) as i32, key as i32);
    let rows: Vec<Pid> = diesel::sql_query(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
         AND classid::bigint = $1 AND objid::bigint = $2 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind::<BigInt, _>(i64::from(high as u32))
    .bind::<BigInt, _>(i64::from(low as u32))
    .load(admin)
    .unwrap();
    assert!(rows.len() <= 1);
    rows.first().map(|r| r.pid)
}

/// `url` with an `application_name`, to find its session in `pg_stat_activity`.
fn with_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// Ends a session as an operator (or a failing network) would, and waits until it is gone.
fn kill(admin: &mut PgConnection, pid: i32) {
    diesel::sql_query(format!("SELECT pg_terminate_backend({pid})"))
        .execute(admin)
        .unwrap();
    eventually(PATIENCE, "the killed session to end", || {
        let alive: Vec<Pid> = diesel::sql_query(format!(
            "SELECT pid FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .load(admin)
        .unwrap();
        alive.is_empty()
    });
}

#[test]
fn sqlite_always_holds() {
    let test_db = TestDb::sqlite();
    let mut a = LeaderLock::new(&test_db.url, KEY).unwrap();
    let mut b = LeaderLock::new(&test_db.url, KEY).unwrap();
    assert!(a.is_held());
    assert!(a.try_hold().unwrap());
    assert!(b.try_hold().unwrap());
    a.release();
    assert!(a.try_hold().unwrap());
    assert_eq!(a.key(), KEY);
    // The SQLite variant opens nothing: even a path that cannot exist is fine.
    let mut c = LeaderLock::new("sqlite:///nonexistent/dir/agentry.db", KEY).unwrap();
    assert!(c.try_hold().unwrap());
}

#[test]
fn invalid_urls_are_refused() {
    for url in [
        "",
        "mysql://localhost/db",
        "host=localhost dbname=x",
        "sqlite://",
    ] {
        assert!(
            matches!(LeaderLock::new(url, KEY), Err(DbError::InvalidUrl(_))),
            "{url:?}"
        );
    }
}

#[test]
fn postgres_unreachable_server_is_an_error_not_a_role() {
    // Port 1 on localhost: nothing listens there.
    let mut lock = LeaderLock::new(
        "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2",
        KEY,
    )
    .unwrap();
    assert!(matches!(lock.try_hold(), Err(DbError::Connect(_))));
    assert!(!lock.is_held());
    // Debug output never shows the URL (it may carry a password).
    let shown = format!("{lock:?}");
    assert!(!shown.contains("127.0.0.1"), "{shown}");
}

/// Tests of PostgreSQL only: each body gets `test_db`, a fresh PostgreSQL [`TestDb`]. Like
/// the PostgreSQL half of `backend_tests!`, they are ignored when the build has no
/// PostgreSQL URL, and pass without running when it has none at run time.
macro_rules! postgres_tests {
    ($( fn $name:ident($db:ident) $body:block )*) => {
        $(
            #[test]
            #[cfg_attr(
                agentry_pg_skipped,
                ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
            )]
            fn $name() {
                let Some($db) = TestDb::postgres() else {
                    return;
                };
                $body
            }
        )*
    };
}

postgres_tests! {
    fn postgres_one_holder_per_key(test_db) {
        let mut admin = admin(&test_db);
        let mut a = LeaderLock::new(&test_db.url, KEY).unwrap();
        let mut b = LeaderLock::new(&test_db.url, KEY).unwrap();
        assert!(!a.is_held());
        assert_eq!(holder(&mut admin, KEY), None);

        assert!(a.try_hold().unwrap());
        assert!(!b.try_hold().unwrap());
        // Asking again changes nothing, on either side.
        assert!(a.try_hold().unwrap());
        assert!(!b.try_hold().unwrap());
        assert!(a.is_held() && !b.is_held());
        let a_pid = holder(&mut admin, KEY).unwrap();

        // Released: the other takes it at once, and the first no longer can.
        a.release();
        assert!(!a.is_held());
        assert!(b.try_hold().unwrap());
        assert!(!a.try_hold().unwrap());
        assert_ne!(holder(&mut admin, KEY), Some(a_pid));

        // Dropping the holder closes its session, which frees the lock.
        drop(b);
        eventually(PATIENCE, "the dropped holder's lock to be freed", || {
            a.try_hold().unwrap()
        });

        // Other keys (negative halves included) are other roles.
        for key in [KEY + 1, -2, i64::MIN, 1] {
            let mut c = LeaderLock::new(&test_db.url, key).unwrap();
            let mut d = LeaderLock::new(&test_db.url, key).unwrap();
            assert!(c.try_hold().unwrap(), "key {key}");
            assert!(!d.try_hold().unwrap(), "key {key}");
            assert!(holder(&mut admin, key).is_some(), "key {key}");
            assert!(a.try_hold().unwrap());
        }
    }

    fn postgres_killed_session_loses_the_role(test_db) {
        let mut admin = admin(&test_db);
        let mut a = LeaderLock::new(&test_db.url, KEY).unwrap();
        let mut b = LeaderLock::new(&test_db.url, KEY).unwrap();
        assert!(a.try_hold().unwrap());
        assert!(!b.try_hold().unwrap());

        // The holder's session is killed: the server frees the lock, the other takes it, and the
        // former holder notices (its session does not answer) instead of still claiming the role.
        let killed = holder(&mut admin, KEY).unwrap();
        kill(&mut admin, killed);
        eventually(PATIENCE, "the other to take the role", || {
            b.try_hold().unwrap()
        });
        assert!(!a.try_hold().unwrap());
        assert!(!a.is_held());
        assert!(b.try_hold().unwrap());

        // The new holder's session is killed while nobody else wants the role: its next
        // try_hold opens a fresh session and takes the role again.
        let killed = holder(&mut admin, KEY).unwrap();
        a.release();
        kill(&mut admin, killed);
        eventually(
            PATIENCE,
            "the lock of the killed session to be freed",
            || holder(&mut admin, KEY).is_none(),
        );
        assert!(b.try_hold().unwrap());
        let now = holder(&mut admin, KEY).unwrap();
        assert_ne!(now, killed);
        assert!(!a.try_hold().unwrap());

        // A follower whose idle session was killed still answers (reconnecting), without error.
        let mut c = LeaderLock::new(&with_name(&test_db.url, "agentry-follower"), KEY).unwrap();
        assert!(!c.try_hold().unwrap());
        let follower = {
            let rows: Vec<Pid> = diesel::sql_query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'agentry-follower' \
                 AND datname = current_database()",
            )
            .load(&mut admin)
            .unwrap();
            assert_eq!(rows.len(), 1);
            rows[0].pid
        };
        kill(&mut admin, follower);
        assert!(!c.try_hold().unwrap());
        b.release();
        assert!(c.try_hold().unwrap());
        assert!(!a.try_hold().unwrap());
    }

    fn postgres_leader_lock_never_blocks_migrations(test_db) {
        // The key of the migration lock (connection.rs): even a leader with that key lives in
        // another key space, so a replica starting while the poller runs can still migrate.
        let mut leader = LeaderLock::new(&test_db.url, 0x6167_656e_7472_7901).unwrap();
        assert!(leader.try_hold().unwrap());
        let db = test_db.db.clone();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(db.migrate().map(|applied| applied.len()));
        });
        let applied = finished
            .recv_timeout(Duration::from_secs(10))
            .expect("migrations waited for the leader lock");
        assert_eq!(applied.unwrap(), 0);
        assert!(leader.try_hold().unwrap());
    }
}
