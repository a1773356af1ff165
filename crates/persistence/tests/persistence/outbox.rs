//! The outbox (docs/contract.md#54-effects-of-assignment): effects written with the change that causes them, at most one per
//! (task, kind), claimed under a lease by one worker at a time, retried until delivered.

use std::collections::HashSet;
use std::sync::Barrier;

use crate::common::*;
use agentry_persistence::outbox::{self, Action, Effect, EffectKind, NewEffect};
use agentry_persistence::repos::Repository;
use agentry_persistence::tasks;
use agentry_persistence::{Db, DbError, write_tx};
use time::Duration;
use uuid::Uuid;

fn action(kind: EffectKind, issue_number: i64) -> Action {
    match kind {
        EffectKind::AddLabel => Action::AddLabel {
            issue_number,
            label: "agentry".into(),
        },
        EffectKind::Comment => Action::Comment {
            issue_number,
            body: format!("on #{issue_number}"),
        },
        EffectKind::CloseIssue => Action::CloseIssue { issue_number },
        EffectKind::Reply => Action::Reply {
            issue_number,
            body: "revising <!-- m -->".into(),
            marker: "<!-- m -->".into(),
        },
        EffectKind::React => Action::React {
            issue_number,
            comment_id: 42,
            review_comment: true,
            content: "eyes".into(),
        },
    }
}

fn effect(repo: &Repository, task_id: Option<Uuid>, kind: EffectKind) -> NewEffect {
    NewEffect {
        task_id,
        repo_id: repo.id,
        action: action(kind, 7),
    }
}

/// Enqueues an effect written at `written` for a new task of its own (its issue number is
/// `written`'s Unix time); returns its id.
fn enqueue_at(db: &Db, repo: &Repository, written: time::OffsetDateTime) -> Uuid {
    let task = create(db, repo, T0);
    let mut conn = db.conn().unwrap();
    let new = NewEffect {
        action: Action::CloseIssue {
            issue_number: written.unix_timestamp(),
        },
        ..effect(repo, Some(task.id), EffectKind::CloseIssue)
    };
    assert!(outbox::enqueue(&mut conn, &new, written).unwrap());
    outbox::effects_of_task(&mut conn, task.id).unwrap()[0].id
}

fn ids(effects: &[Effect]) -> Vec<Uuid> {
    effects.iter().map(|e| e.id).collect()
}

#[test]
fn effect_kind_names_round_trip() {
    for kind in EffectKind::ALL {
        assert_eq!(kind.as_str().parse::<EffectKind>().unwrap(), kind);
        assert_eq!(kind.to_string(), kind.as_str());
    }
    assert_eq!(EffectKind::AddLabel.as_str(), "add_label");
    assert_eq!(EffectKind::Comment.as_str(), "comment");
    assert_eq!(EffectKind::CloseIssue.as_str(), "close_issue");
    assert!("Comment".parse::<EffectKind>().is_err());
    assert!("".parse::<EffectKind>().is_err());
}

/// The kind and payload columns of every outbox row, by kind.
fn stored_payloads(db: &Db) -> Vec<(String, String)> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        kind: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        payload: String,
    }
    let sql = "SELECT kind, payload FROM outbox ORDER BY kind";
    let mut conn = db.conn().unwrap();
    let rows: Vec<Row> = match &mut *conn {
        agentry_persistence::AnyConnection::Sqlite(c) => diesel::sql_query(sql).load(c).unwrap(),
        agentry_persistence::AnyConnection::Postgresql(c) => {
            diesel::sql_query(sql).load(c).unwrap()
        }
    };
    rows.into_iter().map(|r| (r.kind, r.payload)).collect()
}

agentry_persistence::backend_tests! {
    // The stored form of each action is the JSON the outbox has always written, so effects
    // already in a database are read back as typed actions.
    fn actions_are_stored_as_before(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        for kind in EffectKind::ALL {
            let task = create(db, &repo, T0);
            assert!(outbox::enqueue(&mut conn, &effect(&repo, Some(task.id), kind), at(1)).unwrap());
        }
        drop(conn);
        assert_eq!(
            stored_payloads(db),
            [
                ("add_label".to_owned(), r#"{"issueNumber":7,"label":"agentry"}"#.to_owned()),
                ("close_issue".to_owned(), r#"{"issueNumber":7}"#.to_owned()),
                ("comment".to_owned(), r#"{"issueNumber":7,"body":"on #7"}"#.to_owned()),
                (
                    "react".to_owned(),
                    r#"{"issueNumber":7,"commentId":42,"reviewComment":true,"content":"eyes"}"#
                        .to_owned()
                ),
                (
                    "reply".to_owned(),
                    r#"{"issueNumber":7,"body":"revising <!-- m -->","marker":"<!-- m -->"}"#
                        .to_owned()
                ),
            ]
        );
    }
    // An enqueued effect is due at once, with everything as given; a second effect of the
    // same kind for the task writes nothing; other kinds and other tasks are separate.
    fn enqueue_writes_once_per_task_and_kind(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        let other = create(db, &repo, T0);
        let mut conn = db.conn().unwrap();
        let label = NewEffect {
            action: Action::AddLabel { issue_number: 7, label: "agentry ü \"quoted\"".into() },
            ..effect(&repo, Some(task.id), EffectKind::AddLabel)
        };
        assert!(outbox::enqueue(&mut conn, &label, at(1)).unwrap());
        let stored = outbox::effects_of_task(&mut conn, task.id).unwrap();
        assert_eq!(stored.len(), 1);
        let e = &stored[0];
        assert_eq!(e.task_id, Some(task.id));
        assert_eq!(e.repo_id, repo.id);
        assert_eq!(e.kind(), EffectKind::AddLabel);
        assert_eq!(e.action, label.action);
        assert_eq!(e.attempts, 0);
        assert_eq!(e.next_attempt_at, at(1));
        assert_eq!(e.delivered_at, None);
        assert_eq!(e.last_error, None);
        assert_eq!(e.created_at, at(1));

        // The same (task, kind) again, even with another payload: nothing written.
        let again = NewEffect { action: action(EffectKind::AddLabel, 8), ..label.clone() };
        assert!(!outbox::enqueue(&mut conn, &again, at(2)).unwrap());
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap(), stored);
        // Also after delivery: at most once per task, ever.
        outbox::QUEUE.mark_delivered(&mut conn, e.id, at(3)).unwrap();
        assert!(!outbox::enqueue(&mut conn, &label, at(4)).unwrap());

        assert!(outbox::enqueue(&mut conn, &effect(&repo, Some(task.id), EffectKind::Comment), at(5)).unwrap());
        assert!(outbox::enqueue(&mut conn, &effect(&repo, Some(other.id), EffectKind::AddLabel), at(5)).unwrap());
        let kinds: Vec<EffectKind> =
            outbox::effects_of_task(&mut conn, task.id).unwrap().iter().map(Effect::kind).collect();
        assert_eq!(kinds, vec![EffectKind::AddLabel, EffectKind::Comment]);
        assert_eq!(outbox::effects_of_task(&mut conn, other.id).unwrap().len(), 1);
        // Effects without a task are not de-duplicated.
        assert!(outbox::enqueue(&mut conn, &effect(&repo, None, EffectKind::CloseIssue), at(6)).unwrap());
        assert!(outbox::enqueue(&mut conn, &effect(&repo, None, EffectKind::CloseIssue), at(6)).unwrap());
        assert_eq!(row_count(db, "outbox"), 5);
    }

    // The assignment's effects commit with the task, inside create_issue_task; assigning the
    // issue again writes no further effect.
    fn enqueue_inside_create_issue_task(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let assign = |conn: &mut agentry_persistence::AnyConnection| {
            tasks::create_issue_task(conn, &issue_task(&repo, 7), |conn, task| {
                let label = effect(&repo, Some(task.id), EffectKind::AddLabel);
                let comment = effect(&repo, Some(task.id), EffectKind::Comment);
                assert!(outbox::enqueue(conn, &label, T0)?);
                assert!(outbox::enqueue(conn, &comment, T0)?);
                // A repeat inside the same transaction writes nothing and breaks nothing.
                assert!(!outbox::enqueue(conn, &comment, T0)?);
                Ok(())
            })
            .unwrap()
        };
        let (task, created) = assign(&mut conn);
        assert!(created);
        let effects = outbox::effects_of_task(&mut conn, task.id).unwrap();
        let kinds: Vec<EffectKind> = effects.iter().map(Effect::kind).collect();
        assert_eq!(kinds, vec![EffectKind::AddLabel, EffectKind::Comment]);
        let (again, created) = assign(&mut conn);
        assert!(!created);
        assert_eq!(again.id, task.id);
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap(), effects);
        assert_eq!(row_count(db, "outbox"), 2);
    }

    // When the creating transaction fails after the effects were written, they are rolled
    // back with the task and its link.
    fn effects_roll_back_with_a_failed_create_issue_task(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let result = tasks::create_issue_task(&mut conn, &issue_task(&repo, 7), |conn, task| {
            assert!(outbox::enqueue(conn, &effect(&repo, Some(task.id), EffectKind::AddLabel), T0)?);
            assert!(outbox::enqueue(conn, &effect(&repo, Some(task.id), EffectKind::Comment), T0)?);
            Err(DbError::Conflict("the code host said no".into()))
        });
        assert!(matches!(result, Err(DbError::Conflict(_))));
        assert_eq!(row_count(db, "outbox"), 0);
        assert_eq!(task_count(db), 0);
        assert_eq!(row_count(db, "issue_links"), 0);
        assert_eq!(row_count(db, "task_events"), 0);
        // And the issue can be assigned afterwards, with its effects.
        let (task, created) = tasks::create_issue_task(&mut conn, &issue_task(&repo, 7), |conn, task| {
            assert!(outbox::enqueue(conn, &effect(&repo, Some(task.id), EffectKind::AddLabel), T0)?);
            Ok(())
        })
        .unwrap();
        assert!(created);
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap().len(), 1);
    }

    // Two transactions enqueue the same (task, kind) at once: the second sees nothing
    // committed yet, so on PostgreSQL its insert waits for the first and then hits the
    // unique key. It gets `false`, and its transaction stays usable and commits its other
    // writes.
    fn concurrent_enqueue_of_one_effect_keeps_the_loser_usable(db) {
        let repo = repo(db);
        let task = create(db, &repo, T0);
        let pool = wide_pool(db, 2);
        let inserted = Barrier::new(2);
        let label = effect(&repo, Some(task.id), EffectKind::AddLabel);
        let results = race(&pool, 2, |i, conn| {
            if i == 0 {
                write_tx::<_, DbError, _>(conn, |conn| {
                    let first = outbox::enqueue(conn, &label, at(1))?;
                    inserted.wait();
                    // Keep the row uncommitted while the other transaction runs into it.
                    std::thread::sleep(std::time::Duration::from_millis(400));
                    Ok((first, false))
                })
                .unwrap()
            } else {
                inserted.wait();
                write_tx::<_, DbError, _>(conn, |conn| {
                    let second = outbox::enqueue(conn, &label, at(2))?;
                    let comment = effect(&repo, Some(task.id), EffectKind::Comment);
                    let other = outbox::enqueue(conn, &comment, at(2))?;
                    Ok((second, other))
                })
                .unwrap()
            }
        });
        assert_eq!(results, vec![(true, false), (false, true)]);
        let mut conn = db.conn().unwrap();
        let effects = outbox::effects_of_task(&mut conn, task.id).unwrap();
        let kinds: Vec<(EffectKind, time::OffsetDateTime)> =
            effects.iter().map(|e| (e.kind(), e.created_at)).collect();
        assert_eq!(kinds, vec![(EffectKind::AddLabel, at(1)), (EffectKind::Comment, at(2))]);
    }

    // Due effects are claimed oldest first, `limit` at a time; a claimed effect is leased
    // (not claimed again) until the lease ends, and is due again after it.
    fn claim_due_orders_limits_and_leases(db) {
        let repo = repo(db);
        let e1 = enqueue_at(db, &repo, at(1));
        let e0 = enqueue_at(db, &repo, at(0));
        let e2 = enqueue_at(db, &repo, at(2));
        let later = enqueue_at(db, &repo, at(50)); // not yet due at 5
        let mut conn = db.conn().unwrap();
        let lease = Duration::seconds(60);

        let first = outbox::QUEUE.claim_due(&mut conn, at(5), lease, 2).unwrap();
        assert_eq!(ids(&first), vec![e0, e1]);
        assert!(first.iter().all(|e| e.next_attempt_at == at(65)));
        assert_eq!(first[0].action, Action::CloseIssue { issue_number: at(0).unix_timestamp() });
        assert_eq!(ids(&outbox::QUEUE.claim_due(&mut conn, at(5), lease, 2).unwrap()), vec![e2]);
        assert_eq!(outbox::QUEUE.claim_due(&mut conn, at(5), lease, 2).unwrap(), vec![]);
        // Leased: not claimed again before the lease ends (only `later` became due).
        assert_eq!(ids(&outbox::QUEUE.claim_due(&mut conn, at(64), lease, 10).unwrap()), vec![later]);
        assert_eq!(outbox::QUEUE.claim_due(&mut conn, at(64), lease, 10).unwrap(), vec![]);
        // The worker never reported: due again when the lease runs out, oldest first.
        let again = outbox::QUEUE.claim_due(&mut conn, at(65), lease, 10).unwrap();
        assert_eq!(ids(&again), vec![e0, e1, e2]);
        assert!(again.iter().all(|e| e.next_attempt_at == at(125) && e.attempts == 0));
        // A non-positive limit claims nothing.
        assert_eq!(outbox::QUEUE.claim_due(&mut conn, at(1_000), lease, 0).unwrap(), vec![]);
        // A zero lease still moves the due time strictly forward.
        let zero = outbox::QUEUE.claim_due(&mut conn, at(1_000), Duration::ZERO, 1).unwrap();
        assert_eq!(ids(&zero), vec![e0]);
        assert_eq!(zero[0].next_attempt_at, at(1_000) + Duration::microseconds(1));
    }

    // Failure schedules a retry and counts the attempt; delivery ends the effect; next_due
    // follows along. Both marks are refused for unknown effects.
    fn mark_failed_mark_delivered_and_next_due(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), None);
        let task = create(db, &repo, T0);
        outbox::enqueue(&mut conn, &effect(&repo, Some(task.id), EffectKind::Comment), at(10)).unwrap();
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), Some(at(10)));
        let claimed = outbox::QUEUE.claim_due(&mut conn, at(12), Duration::seconds(60), 10).unwrap();
        let id = claimed[0].id;
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), Some(at(72)));

        outbox::QUEUE.mark_failed(&mut conn, id, at(72), "502 Bad Gateway", at(30)).unwrap();
        let e = &outbox::effects_of_task(&mut conn, task.id).unwrap()[0];
        assert_eq!((e.attempts, e.last_error.as_deref()), (1, Some("502 Bad Gateway")));
        assert_eq!(e.next_attempt_at, at(30));
        assert_eq!(e.delivered_at, None);
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), Some(at(30)));
        assert_eq!(outbox::QUEUE.claim_due(&mut conn, at(29), Duration::seconds(60), 10).unwrap(), vec![]);
        let retried = outbox::QUEUE.claim_due(&mut conn, at(30), Duration::seconds(60), 10).unwrap();
        assert_eq!((ids(&retried), retried[0].attempts), (vec![id], 1));
        outbox::QUEUE.mark_failed(&mut conn, id, at(90), "timed out", at(40)).unwrap();
        let e = &outbox::effects_of_task(&mut conn, task.id).unwrap()[0];
        assert_eq!((e.attempts, e.last_error.as_deref()), (2, Some("timed out")));

        outbox::QUEUE.mark_delivered(&mut conn, id, at(41)).unwrap();
        let e = outbox::effects_of_task(&mut conn, task.id).unwrap()[0].clone();
        assert_eq!(e.delivered_at, Some(at(41)));
        assert_eq!(e.attempts, 2);
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), None);
        assert_eq!(outbox::QUEUE.claim_due(&mut conn, at(10_000), Duration::seconds(60), 10).unwrap(), vec![]);
        // Idempotent: the first delivery time stays; a late failure report changes nothing.
        outbox::QUEUE.mark_delivered(&mut conn, id, at(50)).unwrap();
        outbox::QUEUE.mark_failed(&mut conn, id, at(90), "late", at(60)).unwrap();
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap(), vec![e]);

        // next_due is the earliest pending one, even if it is already past.
        enqueue_at(db, &repo, at(500));
        let early = enqueue_at(db, &repo, at(400));
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), Some(at(400)));
        outbox::QUEUE.mark_failed(&mut conn, early, at(400), "x", at(900)).unwrap();
        assert_eq!(outbox::QUEUE.next_due(&mut conn).unwrap(), Some(at(500)));

        let unknown = Uuid::new_v4();
        assert!(matches!(outbox::QUEUE.mark_delivered(&mut conn, unknown, at(1)), Err(DbError::NotFound)));
        assert!(matches!(outbox::QUEUE.mark_failed(&mut conn, unknown, at(1), "x", at(1)), Err(DbError::NotFound)));
    }

    // Workers claiming at the same moment (threads here, replicas in production) never get
    // the same effect, and together they get all of them.
    fn concurrent_claims_never_share_an_effect(db) {
        let repo = repo(db);
        let mut expected = HashSet::new();
        for i in 0..60 {
            expected.insert(enqueue_at(db, &repo, at(i)));
        }
        let pool = wide_pool(db, 8);
        let claimed = race(&pool, 8, |_, conn| {
            let mut mine = Vec::new();
            loop {
                let batch = outbox::QUEUE.claim_due(conn, at(100), Duration::seconds(600), 4).unwrap();
                if batch.is_empty() {
                    break mine;
                }
                mine.extend(ids(&batch));
            }
        });
        let all: Vec<Uuid> = claimed.into_iter().flatten().collect();
        let unique: HashSet<Uuid> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len(), "an effect was claimed twice");
        assert_eq!(unique, expected);
    }
}
