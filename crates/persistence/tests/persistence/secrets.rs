//! The secret store: AES-256-GCM with the name as associated data; plaintext never stored,
//! never printed by Debug; the master key from the environment or a generated 0600 file.

use crate::common::*;
use agentry_persistence::backend_tests;
use agentry_persistence::secrets::{self, MasterKey, SecretError, SecretValue};
use diesel::prelude::*;

const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
const OTHER_KEY: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

fn key() -> MasterKey {
    MasterKey::from_base64(KEY).unwrap()
}

#[test]
fn sealing_is_authenticated_bound_to_the_name_and_randomised() {
    let k = key();
    let v = SecretValue::new("ghp_exampletoken0123456789");
    let a = k.seal("CODEHOST_TOKEN", &v).unwrap();
    let b = k.seal("CODEHOST_TOKEN", &v).unwrap();
    assert_ne!(a, b, "a fresh nonce per value");
    assert!(!a.contains("ghp_"));
    assert_eq!(k.open("CODEHOST_TOKEN", &a).unwrap(), v);
    // Moved to another name, opened with another key, or altered: refused.
    assert!(matches!(
        k.open("OTHER", &a),
        Err(SecretError::Undecryptable(_))
    ));
    assert!(
        MasterKey::from_base64(OTHER_KEY)
            .unwrap()
            .open("CODEHOST_TOKEN", &a)
            .is_err()
    );
    let mut tampered = a.clone().into_bytes();
    let last = tampered.len() - 3;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    assert!(
        k.open("CODEHOST_TOKEN", &String::from_utf8(tampered).unwrap())
            .is_err()
    );
    for garbage in ["", "v1:", "v1:!!!", "v2:AAAA", "v1:AAAA"] {
        assert!(k.open("CODEHOST_TOKEN", garbage).is_err(), "{garbage}");
    }
}

#[test]
fn values_and_keys_never_show_in_debug_output() {
    let v = SecretValue::new("github_pat_secretvalue");
    assert_eq!(format!("{v:?}"), "SecretValue(<redacted>)");
    assert_eq!(format!("{v}"), "<redacted>");
    assert!(!format!("{:?}", key()).contains(KEY));
}

#[test]
fn bad_master_keys_are_refused() {
    for bad in ["", "not base64!", "c2hvcnQ=", &format!("{KEY}{KEY}")] {
        assert!(
            matches!(MasterKey::from_base64(bad), Err(SecretError::BadKey(_))),
            "{bad}"
        );
    }
}

#[test]
fn the_key_file_is_generated_once_private_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    let first = MasterKey::load_or_create(None, &path).unwrap();
    let sealed = first.seal("X", &SecretValue::new("v")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let again = MasterKey::load_or_create(None, &path).unwrap();
    assert_eq!(again.open("X", &sealed).unwrap().expose(), "v");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "not regenerated"
    );
    // A configured key wins over the file.
    let configured = MasterKey::load_or_create(Some(KEY), &path).unwrap();
    assert!(configured.open("X", &sealed).is_err());
    // Processes starting together end up with one key, and none reads a half-written file
    // (repeated, since the window is small).
    for _ in 0..50 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        let keys: Vec<MasterKey> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| MasterKey::load_or_create(None, &path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let sealed = keys[0].seal("X", &SecretValue::new("same")).unwrap();
        assert!(keys.iter().all(|k| k.open("X", &sealed).is_ok()));
        // Only the key file is left: no temporary file stays behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

backend_tests! {
    // Replicas storing the same new secret at once: each store succeeds (before, all but one
    // met the name's unique key: a 500), and the secret holds one of their values.
    fn racing_stores_of_a_new_secret_all_succeed(db) {
        let db = wide_pool(db, 8);
        for round in 0..10 {
            let name = format!("RACED_{round}");
            let stored = race(&db, 8, |i, conn| {
                secrets::put(conn, &key(), &name, &SecretValue::new(format!("value-{i}")), T0).is_ok()
            });
            assert_eq!(stored, [true; 8], "{name}");
            let mut conn = db.conn().unwrap();
            let value = secrets::get(&mut conn, &key(), &name).unwrap().unwrap();
            assert!(value.expose().starts_with("value-"));
        }
    }

    fn secrets_round_trip_encrypted_at_rest(db) {
        let k = key();
        let mut conn = db.conn().unwrap();
        let token = SecretValue::new("ghp_verysecretvalue");
        let info = secrets::put(&mut conn, &k, "CODEHOST_TOKEN", &token, T0).unwrap();
        assert_eq!((info.name.as_str(), info.created_at, info.updated_at), ("CODEHOST_TOKEN", T0, T0));
        assert_eq!(secrets::get(&mut conn, &k, "CODEHOST_TOKEN").unwrap(), Some(token));
        assert_eq!(secrets::get(&mut conn, &k, "MISSING").unwrap(), None);
        // Stored as ciphertext only.
        let stored: String = agentry_persistence::schema::secrets::table
            .select(agentry_persistence::schema::secrets::ciphertext)
            .first(&mut conn)
            .unwrap();
        assert!(stored.starts_with("v1:") && !stored.contains("verysecret"));
        // Replacing keeps the creation time and changes the value.
        let info = secrets::put(&mut conn, &k, "CODEHOST_TOKEN", &SecretValue::new("github_pat_new"), at(60)).unwrap();
        assert_eq!((info.created_at, info.updated_at), (T0, at(60)));
        assert_eq!(secrets::get(&mut conn, &k, "CODEHOST_TOKEN").unwrap().unwrap().expose(), "github_pat_new");
        secrets::put(&mut conn, &k, "A_SECOND", &SecretValue::new("x"), at(1)).unwrap();
        let names: Vec<String> = secrets::list(&mut conn).unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["A_SECOND", "CODEHOST_TOKEN"]);
        // Another key cannot read them.
        let other = MasterKey::from_base64(OTHER_KEY).unwrap();
        assert!(matches!(secrets::get(&mut conn, &other, "CODEHOST_TOKEN"), Err(SecretError::Undecryptable(_))));
        assert!(secrets::delete(&mut conn, "CODEHOST_TOKEN").unwrap());
        assert!(!secrets::delete(&mut conn, "CODEHOST_TOKEN").unwrap());
        assert_eq!(secrets::get(&mut conn, &k, "CODEHOST_TOKEN").unwrap(), None);
    }
}
