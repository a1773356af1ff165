//! API tokens: stored by hash, revocation, and the one-time first admin token.

use crate::common::*;
use agentry_domain::Role;
use agentry_persistence::AnyConnection;
use agentry_persistence::tokens::{self, ApiToken};
use uuid::Uuid;

/// A distinct fake SHA-256 hex digest.
fn hash(n: u32) -> String {
    format!("{n:064x}")
}

/// `token` was issued as `name` with `role` at `T0`, and its hash `hash(n)` finds it, every
/// field intact.
fn assert_issued(conn: &mut AnyConnection, token: &ApiToken, name: &str, role: Role, n: u32) {
    assert_eq!(
        (token.name.as_str(), token.role, token.created_at),
        (name, role, T0)
    );
    assert_eq!(
        tokens::find_by_hash(conn, &hash(n)).unwrap(),
        Some(token.clone())
    );
}

agentry_persistence::backend_tests! {
    // A created token is found by its hash with every field intact; unknown hashes find
    // nothing; a second token with the same hash is refused.
    fn create_and_find_by_hash(db) {
        let mut conn = db.conn().unwrap();
        let token = tokens::create_token(&mut conn, "ci", Role::Member, &hash(1), T0).unwrap();
        assert_issued(&mut conn, &token, "ci", Role::Member, 1);
        assert_eq!(tokens::find_by_hash(&mut conn, &hash(2)).unwrap(), None);
        assert_eq!(tokens::find_by_hash(&mut conn, "").unwrap(), None);
        for role in Role::ALL {
            let t =
                tokens::create_token(&mut conn, role.as_str(), role, &hash(10 + role as u32), T0)
                    .unwrap();
            assert_eq!(
                tokens::find_by_hash(&mut conn, &hash(10 + role as u32))
                    .unwrap()
                    .unwrap()
                    .role,
                role
            );
            assert_eq!(t.role, role);
        }
        let dup = tokens::create_token(&mut conn, "copy", Role::Admin, &hash(1), T0).unwrap_err();
        assert!(dup.is_unique_violation(), "{dup:?}");
        assert_eq!(
            tokens::find_by_hash(&mut conn, &hash(1)).unwrap(),
            Some(token)
        );
    }

    // Revoking makes the token unusable at once; revoking again (or an unknown id) is false;
    // other tokens are unaffected.
    fn revoke_is_final(db) {
        let mut conn = db.conn().unwrap();
        let a = tokens::create_token(&mut conn, "a", Role::Admin, &hash(1), T0).unwrap();
        let b = tokens::create_token(&mut conn, "b", Role::Viewer, &hash(2), T0).unwrap();
        assert!(tokens::revoke(&mut conn, a.id, at(1)).unwrap());
        assert_eq!(tokens::find_by_hash(&mut conn, &hash(1)).unwrap(), None);
        assert!(!tokens::revoke(&mut conn, a.id, at(2)).unwrap());
        assert!(!tokens::revoke(&mut conn, Uuid::new_v4(), at(2)).unwrap());
        assert_eq!(
            tokens::find_by_hash(&mut conn, &hash(2)).unwrap(),
            Some(b.clone())
        );
        assert_eq!(tokens::list_active(&mut conn).unwrap(), vec![b]);
    }

    // Active tokens are listed oldest first (ties by id), without revoked ones.
    fn list_active_is_oldest_first(db) {
        let mut conn = db.conn().unwrap();
        let newest =
            tokens::create_token(&mut conn, "newest", Role::Member, &hash(1), at(30)).unwrap();
        let oldest =
            tokens::create_token(&mut conn, "oldest", Role::Admin, &hash(2), at(10)).unwrap();
        let revoked =
            tokens::create_token(&mut conn, "revoked", Role::Admin, &hash(3), at(5)).unwrap();
        let mut same_time: Vec<_> = (0..3)
            .map(|i| {
                tokens::create_token(
                    &mut conn,
                    &format!("tie {i}"),
                    Role::Viewer,
                    &hash(10 + i),
                    at(20),
                )
                .unwrap()
            })
            .collect();
        same_time.sort_by_key(|t| t.id);
        assert!(tokens::revoke(&mut conn, revoked.id, at(40)).unwrap());
        let mut expected = vec![oldest];
        expected.extend(same_time);
        expected.push(newest);
        assert_eq!(tokens::list_active(&mut conn).unwrap(), expected);
    }

    // The first admin token is issued once: on an empty database, not again, and never
    // when a token already exists (even after every token is revoked).
    fn bootstrap_admin_only_once(db) {
        let mut conn = db.conn().unwrap();
        let admin = tokens::bootstrap_admin(&mut conn, "admin", &hash(1), T0)
            .unwrap()
            .unwrap();
        assert_issued(&mut conn, &admin, "admin", Role::Admin, 1);
        assert_eq!(
            tokens::bootstrap_admin(&mut conn, "admin", &hash(2), at(1)).unwrap(),
            None
        );
        assert_eq!(tokens::find_by_hash(&mut conn, &hash(2)).unwrap(), None);
        // Even with every token revoked, the installation was bootstrapped already.
        assert!(tokens::revoke(&mut conn, admin.id, at(2)).unwrap());
        assert_eq!(
            tokens::bootstrap_admin(&mut conn, "admin", &hash(3), at(3)).unwrap(),
            None
        );
        assert_eq!(tokens::list_active(&mut conn).unwrap(), vec![]);
        assert_eq!(row_count(db, "api_tokens"), 1);
    }

    // An installation that already has a token (created another way) gets no bootstrap token.
    fn bootstrap_admin_skipped_when_a_token_exists(db) {
        let mut conn = db.conn().unwrap();
        let existing = tokens::create_token(&mut conn, "ops", Role::Viewer, &hash(1), T0).unwrap();
        assert_eq!(
            tokens::bootstrap_admin(&mut conn, "admin", &hash(2), at(1)).unwrap(),
            None
        );
        assert_eq!(tokens::list_active(&mut conn).unwrap(), vec![existing]);
    }

    // Replicas starting together on a fresh database: exactly one issues the admin token.
    fn concurrent_bootstraps_issue_exactly_one_token(db) {
        let wide = wide_pool(db, 8);
        let results = race(&wide, 8, |i, conn| {
            tokens::bootstrap_admin(conn, &format!("admin {i}"), &hash(i as u32), T0).unwrap()
        });
        let issued: Vec<_> = results.iter().flatten().collect();
        assert_eq!(issued.len(), 1, "{results:?}");
        let mut conn = db.conn().unwrap();
        assert_eq!(
            tokens::list_active(&mut conn).unwrap(),
            vec![issued[0].clone()]
        );
        assert_eq!(row_count(db, "api_tokens"), 1);
    }
}
