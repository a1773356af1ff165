//! SQLite writers of one process take turns in a FIFO queue before `BEGIN IMMEDIATE`
//! (docs/storage.md#transactions), so none of them polls SQLite's busy handler against the
//! others; a writer whose turn does not come in time, or that finds the file locked by
//! someone else, gets `DbError::Busy`.

use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use crate::common::*;
use agentry_persistence::{DatabaseUrl, Db, DbError, webhooks, write_tx};
use diesel::connection::SimpleConnection;
use diesel::{Connection, SqliteConnection};

/// A fresh, migrated SQLite file with a pool of `connections` and `busy_timeout`.
fn sqlite_file(connections: u32, busy_timeout: Duration) -> (tempfile::TempDir, String, Db) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db").display().to_string();
    let db = Db::connect_with(&format!("sqlite://{path}"), connections, busy_timeout).unwrap();
    db.migrate().unwrap();
    (dir, path, db)
}

// 16 threads, each on its own connection whose SQLite busy timeout is 1 ms, each recording
// 40 webhook deliveries (a read and an insert in one `write_tx`, as the webhook does): none
// is refused. Without the queue most of them would see `database is locked`, because a
// writer that finds the lock taken gives up after 1 ms.
#[test]
fn many_writers_on_one_file_never_see_busy() {
    let (_dir, path, db) = sqlite_file(1, Duration::from_secs(10));
    let url = DatabaseUrl::parse(&format!("sqlite://{path}")).unwrap();
    let threads = 16;
    let per_thread: i64 = 40;
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let mut conn = url.connect().unwrap();
            conn.batch_execute("PRAGMA busy_timeout = 1").unwrap();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut refused = Vec::new();
                for i in 0..per_thread {
                    let id = format!("d-{t}-{i}");
                    if let Err(e) = webhooks::record_delivery(&mut conn, &id, "ping", None, at(i)) {
                        refused.push(e.to_string());
                    }
                }
                refused
            })
        })
        .collect();
    let refused: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(
        refused.is_empty(),
        "{} refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
    assert_eq!(
        row_count(&db, "webhook_deliveries"),
        threads as i64 * per_thread
    );
}

// A writer whose turn does not come within the busy timeout (another writer of the process
// holds it) fails with `DbError::Busy` after about that long, and writes nothing; when the
// holder commits, writing works again.
#[test]
fn a_writer_whose_turn_does_not_come_is_busy() {
    let wait = Duration::from_millis(200);
    let (_dir, _path, db) = sqlite_file(2, wait);
    let (entered, holding) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let holder = {
        let db = db.clone();
        std::thread::spawn(move || {
            let mut conn = db.conn().unwrap();
            write_tx::<_, DbError, _>(&mut conn, |conn| {
                webhooks::record_delivery(conn, "held", "ping", None, at(0))?;
                entered.send(()).unwrap();
                released.recv().unwrap();
                Ok(())
            })
            .unwrap();
        })
    };
    holding.recv().unwrap();
    let mut conn = db.conn().unwrap();
    let began = Instant::now();
    let err = webhooks::record_delivery(&mut conn, "late", "ping", None, at(1)).unwrap_err();
    assert!(matches!(err, DbError::Busy(_)), "{err:?}");
    assert!(began.elapsed() >= wait, "{:?}", began.elapsed());
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    assert!(webhooks::record_delivery(&mut conn, "late", "ping", None, at(2)).unwrap());
    assert_eq!(row_count(&db, "webhook_deliveries"), 2);
}

// Another process (here a connection outside the queue) holding SQLite's write lock past the
// busy timeout: `DbError::Busy`, not an anonymous query error.
#[test]
fn a_file_locked_elsewhere_is_busy() {
    let (_dir, path, db) = sqlite_file(2, Duration::from_millis(100));
    let mut other = SqliteConnection::establish(&path).unwrap();
    other.batch_execute("BEGIN IMMEDIATE").unwrap();
    let err =
        webhooks::record_delivery(&mut db.conn().unwrap(), "d", "ping", None, at(0)).unwrap_err();
    assert!(matches!(err, DbError::Busy(_)), "{err:?}");
    other.batch_execute("ROLLBACK").unwrap();
    assert!(webhooks::record_delivery(&mut db.conn().unwrap(), "d", "ping", None, at(0)).unwrap());
}
