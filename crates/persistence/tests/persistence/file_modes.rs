//! The SQLite database and its `-wal`/`-shm` files are readable by the service's user alone
//! (docs/security.md#where-the-secrets-live-and-who-can-read-them): new files are 0600
//! whatever the process's umask, and an existing database of an older installation is
//! tightened when the pool opens it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;
use agentry_persistence::{Db, webhooks};

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Records one webhook delivery, so that SQLite writes its WAL and shared-memory files.
fn write_something(db: &Db, id: &str) {
    let mut conn = db.conn().unwrap();
    assert!(webhooks::record_delivery(&mut conn, id, "ping", None, at(1)).unwrap());
}

#[test]
fn a_new_database_and_its_wal_and_shm_are_0600() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db");
    let db = migrated_sqlite_file(&path);
    write_something(&db, "d-1");
    for suffix in ["", "-wal", "-shm"] {
        let file = dir.path().join(format!("agentry.db{suffix}"));
        assert!(file.is_file(), "{} was not written", file.display());
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
}

#[test]
fn an_existing_database_readable_by_others_is_tightened_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db");
    let url = format!("sqlite://{}", path.display());
    let db = Db::connect(&url, 2).unwrap();
    db.migrate().unwrap();
    write_something(&db, "d-1");
    // Held open, so the WAL and shm files stay; then made world-readable, as SQLite's
    // default mode (0644) left them on older installations.
    let wal = dir.path().join("agentry.db-wal");
    let shm = dir.path().join("agentry.db-shm");
    for file in [&path, &wal, &shm] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o664)).unwrap();
    }
    let reopened = Db::connect(&url, 2).unwrap();
    for file in [&path, &wal, &shm] {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    // The data is still there and still writable.
    write_something(&reopened, "d-2");
    drop(db);
}
