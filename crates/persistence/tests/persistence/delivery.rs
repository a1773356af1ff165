//! The leased delivery queue, once for both of its tables (the outbox and the budget alerts)
//! and both backends: a claim leases, a dead worker's entries are claimed by another worker
//! when the lease runs out, failures are retried on the backoff schedule, and the marks
//! commit or roll back with the caller's transaction.

use std::time::Duration as StdDuration;

use crate::alerts::{set_budget, spend};
use crate::common::*;
use agentry_domain::backoff::Backoff;
use agentry_persistence::delivery::{Entry, Queue};
use agentry_persistence::outbox::{self, Action, NewEffect};
use agentry_persistence::{AnyConnection, Db, DbError, alerts, write_tx};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

/// Writes one entry of the outbox, due at `due`; returns its id.
fn effect_due(db: &Db, due: OffsetDateTime) -> Uuid {
    let repo = repo(db);
    let task = create(db, &repo, T0);
    let mut conn = db.conn().unwrap();
    let effect = NewEffect {
        task_id: Some(task.id),
        repo_id: repo.id,
        action: Action::CloseIssue { issue_number: 7 },
    };
    assert!(outbox::enqueue(&mut conn, &effect, due).unwrap());
    outbox::effects_of_task(&mut conn, task.id).unwrap()[0].id
}

/// Records one budget alert, due at `due`; returns its id.
fn alert_due(db: &Db, due: OffsetDateTime) -> Uuid {
    let web = repo(db);
    set_budget(db, &web, "1");
    spend(db, &web, "0.5", due - Duration::seconds(1));
    let recorded = alerts::check(&mut db.conn().unwrap(), due, true).unwrap();
    assert_eq!(recorded.len(), 1);
    recorded[0].id
}

fn ids<T: Entry>(entries: &[T]) -> Vec<Uuid> {
    entries.iter().map(Entry::id).collect()
}

/// The lease of every claim in these tests.
const LEASE: Duration = Duration::seconds(60);

/// Claims up to 10 due entries of `queue` at `now`, leased for [`LEASE`].
fn claim<T: Entry>(queue: &Queue<T>, conn: &mut AnyConnection, now: OffsetDateTime) -> Vec<T> {
    queue.claim_due(conn, now, LEASE, 10).unwrap()
}

/// Worker A claims an entry and stalls; worker B (another connection: another replica)
/// finds it leased until the lease ends, then claims it. A can no longer renew the lease
/// (so it does not send), and its late reports change nothing: neither B's lease nor, once
/// B delivered it, the delivery.
fn lease_expiry<T: Entry>(db: &Db, queue: &Queue<T>, id: Uuid) {
    let (mut a, mut b) = (db.conn().unwrap(), db.conn().unwrap());
    let claimed = claim(queue, &mut a, at(1));
    assert_eq!(ids(&claimed), [id]);
    let held = claimed[0].next_attempt_at();
    assert_eq!(held, at(61));
    assert_eq!(queue.next_due(&mut b).unwrap(), Some(at(61)));
    assert!(claim(queue, &mut b, at(60)).is_empty(), "leased");
    let reclaimed = claim(queue, &mut b, at(61));
    assert_eq!(ids(&reclaimed), [id]);
    assert_eq!(
        reclaimed[0].attempts(),
        0,
        "a lost lease is no failed attempt"
    );
    assert!(claim(queue, &mut a, at(62)).is_empty(), "B's lease");
    assert_eq!(
        queue.renew(&mut a, id, held, at(62), LEASE).unwrap(),
        None,
        "A's lease is lost"
    );
    queue.mark_failed(&mut a, id, held, "late", at(63)).unwrap();
    assert_eq!(
        queue.next_due(&mut b).unwrap(),
        Some(at(121)),
        "B's lease stands"
    );
    let renewed = queue.renew(&mut b, id, at(121), at(64), LEASE).unwrap();
    assert_eq!(renewed, Some(at(124)));
    assert!(claim(queue, &mut a, at(122)).is_empty(), "renewed");
    queue.mark_delivered(&mut b, id, at(65)).unwrap();
    queue.mark_failed(&mut a, id, held, "late", at(66)).unwrap();
    queue.mark_delivered(&mut a, id, at(67)).unwrap();
    assert_eq!(
        queue.renew(&mut b, id, at(124), at(68), LEASE).unwrap(),
        None,
        "delivered"
    );
    assert_eq!(queue.next_due(&mut a).unwrap(), None);
    assert!(claim(queue, &mut a, at(10_000)).is_empty());
}

/// Each failure counts an attempt and makes the entry due at the backoff's retry time.
fn retry_backoff<T: Entry>(db: &Db, queue: &Queue<T>, id: Uuid) {
    let backoff = Backoff {
        base: StdDuration::from_secs(5),
        max: StdDuration::from_secs(20),
    };
    let mut conn = db.conn().unwrap();
    let mut now = at(1);
    for (failed, delay) in [(0, 5), (1, 10), (2, 20), (3, 20)] {
        let claimed = claim(queue, &mut conn, now);
        assert_eq!((ids(&claimed), claimed[0].attempts()), (vec![id], failed));
        let retry_at = backoff.retry_at(claimed[0].attempts(), now);
        assert_eq!(retry_at, now + Duration::seconds(delay));
        let held = claimed[0].next_attempt_at();
        queue
            .mark_failed(&mut conn, id, held, "HTTP 502", retry_at)
            .unwrap();
        assert_eq!(queue.next_due(&mut conn).unwrap(), Some(retry_at));
        let early = retry_at - Duration::microseconds(1);
        assert!(claim(queue, &mut conn, early).is_empty());
        now = retry_at;
    }
    let last = claim(queue, &mut conn, now);
    assert_eq!(last[0].attempts(), 4);
}

/// The marks are writes of the caller's transaction when called inside one: rolled back
/// with it, the entry is as before; committed, it is delivered.
fn marks_in_transaction<T: Entry>(db: &Db, queue: &Queue<T>, id: Uuid) {
    let mut conn = db.conn().unwrap();
    assert_eq!(ids(&claim(queue, &mut conn, at(1))), [id]);
    let rolled_back = write_tx::<(), DbError, _>(&mut conn, |conn| {
        queue.mark_failed(conn, id, at(61), "HTTP 500", at(5))?;
        queue.mark_delivered(conn, id, at(6))?;
        Err(DbError::Conflict("the caller gives up".into()))
    });
    assert!(matches!(rolled_back, Err(DbError::Conflict(_))));
    assert_eq!(
        queue.next_due(&mut conn).unwrap(),
        Some(at(61)),
        "still leased, pending"
    );
    let again = claim(queue, &mut conn, at(61));
    assert_eq!((ids(&again), again[0].attempts()), (vec![id], 0));
    write_tx::<(), DbError, _>(&mut conn, |conn| queue.mark_delivered(conn, id, at(62))).unwrap();
    assert_eq!(queue.next_due(&mut conn).unwrap(), None);
    for unknown in [
        queue.mark_delivered(&mut conn, Uuid::new_v4(), at(1)),
        queue.mark_failed(&mut conn, Uuid::new_v4(), at(1), "x", at(1)),
    ] {
        assert!(matches!(unknown, Err(DbError::NotFound)));
    }
}

/// Each behaviour, once for each queue: the outbox's (on an effect) and the alerts' (on an
/// alert), due at `at(0)`; `check: outbox_test, alert_test;` names the two tests of `check`.
macro_rules! on_both_queues {
    ($($check:ident: $outbox_test:ident, $alert_test:ident;)*) => {
        agentry_persistence::backend_tests! {
            $(
                fn $outbox_test(db) {
                    $check(db, &outbox::QUEUE, effect_due(db, at(0)));
                }
                fn $alert_test(db) {
                    $check(db, &alerts::QUEUE, alert_due(db, at(0)));
                }
            )*
        }
    };
}

on_both_queues! {
    lease_expiry:
        outbox_lease_expiry_hands_an_effect_to_another_worker,
        alert_lease_expiry_hands_an_alert_to_another_worker;
    retry_backoff:
        outbox_failures_retry_on_the_backoff_schedule,
        alert_failures_retry_on_the_backoff_schedule;
    marks_in_transaction:
        outbox_marks_commit_with_the_callers_transaction,
        alert_marks_commit_with_the_callers_transaction;
}
