//! Webhook de-duplication (docs/contract.md#56-webhook): a delivery id is recorded once; the primary key decides
//! between concurrent requests and replicas.

use crate::common::*;
use agentry_persistence::webhooks::{self, Delivery};
use agentry_persistence::{DbError, write_tx};

agentry_persistence::backend_tests! {
    // First time true and stored as given; then false whatever the event, and the first
    // record is kept. Other ids are independent.
    fn record_delivery_once_per_id(db) {
        let mut conn = db.conn().unwrap();
        assert_eq!(webhooks::find_delivery(&mut conn, "d-1").unwrap(), None);
        assert!(webhooks::record_delivery(&mut conn, "d-1", "pull_request", Some("closed"), at(1)).unwrap());
        let first = Delivery {
            delivery_id: "d-1".into(),
            event: "pull_request".into(),
            action: Some("closed".into()),
            received_at: at(1),
        };
        assert_eq!(webhooks::find_delivery(&mut conn, "d-1").unwrap(), Some(first.clone()));
        assert!(!webhooks::record_delivery(&mut conn, "d-1", "pull_request", Some("closed"), at(2)).unwrap());
        assert!(!webhooks::record_delivery(&mut conn, "d-1", "ping", None, at(3)).unwrap());
        assert_eq!(webhooks::find_delivery(&mut conn, "d-1").unwrap(), Some(first));

        assert!(webhooks::record_delivery(&mut conn, "d-2", "ping", None, at(4)).unwrap());
        assert_eq!(webhooks::find_delivery(&mut conn, "d-2").unwrap().unwrap().action, None);
        // Ids are compared exactly.
        assert!(webhooks::record_delivery(&mut conn, "D-1", "ping", None, at(5)).unwrap());
        assert_eq!(row_count(db, "webhook_deliveries"), 3);
    }

    // Inside a caller's transaction: recorded only if the caller commits, so a delivery whose
    // processing failed is processed again when redelivered; a duplicate inside a transaction
    // leaves it usable.
    fn record_delivery_commits_with_the_caller(db) {
        let mut conn = db.conn().unwrap();
        let failed: Result<(), DbError> = write_tx(&mut conn, |conn| {
            assert!(webhooks::record_delivery(conn, "d-1", "pull_request", Some("closed"), at(1))?);
            Err(DbError::Conflict("processing failed".into()))
        });
        assert!(failed.is_err());
        assert_eq!(row_count(db, "webhook_deliveries"), 0);

        write_tx::<_, DbError, _>(&mut conn, |conn| {
            assert!(webhooks::record_delivery(conn, "d-1", "pull_request", Some("closed"), at(2))?);
            assert!(!webhooks::record_delivery(conn, "d-1", "pull_request", Some("closed"), at(2))?);
            assert!(webhooks::record_delivery(conn, "d-2", "ping", None, at(2))?);
            Ok(())
        })
        .unwrap();
        assert_eq!(row_count(db, "webhook_deliveries"), 2);
    }

    // Twenty requests with the same delivery id at once: exactly one records it. Each also
    // runs in its own outer transaction, as the webhook handler does, and that transaction
    // still commits its other work after losing the race.
    fn concurrent_deliveries_record_once(db) {
        let n = 20;
        let wide = wide_pool(db, n as u32);
        let results = race(&wide, n, |i, conn| {
            write_tx::<_, DbError, _>(conn, |conn| {
                let first = webhooks::record_delivery(conn, "same", "pull_request", Some("closed"), at(i as i64))?;
                assert!(webhooks::record_delivery(conn, &format!("own-{i}"), "ping", None, at(0))?);
                Ok(first)
            })
            .unwrap()
        });
        assert_eq!(results.iter().filter(|first| **first).count(), 1, "{results:?}");
        assert_eq!(row_count(db, "webhook_deliveries"), 1 + n as i64);

        // And without an outer transaction.
        let results = race(&wide, n, |_, conn| {
            webhooks::record_delivery(conn, "other", "ping", None, at(0)).unwrap()
        });
        assert_eq!(results.iter().filter(|first| **first).count(), 1, "{results:?}");
    }

    // Old ids can be forgotten; recent ones stay.
    fn forget_deliveries_before_prunes_old_ids(db) {
        let mut conn = db.conn().unwrap();
        for (id, secs) in [("a", 1), ("b", 2), ("c", 3)] {
            assert!(webhooks::record_delivery(&mut conn, id, "ping", None, at(secs)).unwrap());
        }
        assert_eq!(webhooks::forget_deliveries_before(&mut conn, at(3)).unwrap(), 2);
        assert_eq!(webhooks::find_delivery(&mut conn, "a").unwrap(), None);
        assert!(webhooks::find_delivery(&mut conn, "c").unwrap().is_some());
        assert_eq!(webhooks::forget_deliveries_before(&mut conn, at(3)).unwrap(), 0);
        // A forgotten id counts as new again.
        assert!(webhooks::record_delivery(&mut conn, "a", "ping", None, at(4)).unwrap());
    }
}
