//! Budget alerts (docs/contract.md#67-budgets): each threshold of each budget recorded once
//! per month however often and by however many callers it is checked, and their delivery
//! leases; on both backends.

use crate::common::*;
use agentry_domain::BudgetScope;
use agentry_persistence::alerts::{self, BudgetAlert, Delivery};
use agentry_persistence::budgets;
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::tasks;
use agentry_persistence::{AnyConnection, Db};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

pub(crate) fn set_budget(db: &Db, repo: &Repository, budget: &str) {
    let mut conn = db.conn().unwrap();
    repos::patch_settings(&mut conn, repo.id, T0, |s| {
        s.apply_patch(&serde_json::json!({ "monthlyBudgetUsd": budget }))
    })
    .unwrap()
    .unwrap();
}

/// Records a run of a new task of `repo` that cost `cost` and finished at `finished`.
pub(crate) fn spend(db: &Db, repo: &Repository, cost: &str, finished: OffsetDateTime) {
    let task = create(db, repo, finished);
    let mut conn = db.conn().unwrap();
    tasks::record_run(
        &mut conn,
        &sonnet_run(task.id, task.attempt, cost, finished),
    )
    .unwrap();
}

fn check(db: &Db, now: OffsetDateTime) -> Vec<BudgetAlert> {
    alerts::check(&mut db.conn().unwrap(), now, true).unwrap()
}

/// `(scope, repository URL, month, threshold, spent, budget)` of each alert.
fn summary(
    alerts: &[BudgetAlert],
) -> Vec<(BudgetScope, Option<String>, String, i32, String, String)> {
    alerts
        .iter()
        .map(|a| {
            (
                a.scope,
                a.repo_url.as_ref().map(ToString::to_string),
                format!("{:04}-{:02}", a.month.year(), u8::from(a.month.month())),
                a.threshold,
                a.spent.to_string(),
                a.budget.to_string(),
            )
        })
        .collect()
}

fn row(
    scope: BudgetScope,
    repo: Option<&str>,
    month: &str,
    threshold: i32,
    spent: &str,
    budget: &str,
) -> (BudgetScope, Option<String>, String, i32, String, String) {
    (
        scope,
        repo.map(str::to_owned),
        month.to_owned(),
        threshold,
        spent.to_owned(),
        budget.to_owned(),
    )
}

fn all(conn: &mut AnyConnection) -> Vec<BudgetAlert> {
    alerts::list(conn, alerts::MAX_PAGE, None).unwrap()
}

#[test]
fn thresholds_are_compared_exactly() {
    let nanos = |s: &str| usd(s).to_nanos();
    assert_eq!(alerts::reached(0, nanos("1")), Vec::<i32>::new());
    assert_eq!(
        alerts::reached(nanos("0.499999999"), nanos("1")),
        Vec::<i32>::new()
    );
    assert_eq!(alerts::reached(nanos("0.5"), nanos("1")), [50]);
    assert_eq!(alerts::reached(nanos("0.799999999"), nanos("1")), [50]);
    assert_eq!(alerts::reached(nanos("0.8"), nanos("1")), [50, 80]);
    assert_eq!(alerts::reached(nanos("0.999999999"), nanos("1")), [50, 80]);
    assert_eq!(alerts::reached(nanos("1"), nanos("1")), [50, 80, 100]);
    assert_eq!(alerts::reached(nanos("7"), nanos("1")), [50, 80, 100]);
    // A zero budget: nothing spent reaches nothing; any spend reaches everything.
    assert_eq!(alerts::reached(0, 0), Vec::<i32>::new());
    assert_eq!(alerts::reached(1, 0), [50, 80, 100]);
    // No overflow at the largest amounts.
    assert_eq!(alerts::reached(i64::MAX, i64::MAX), [50, 80, 100]);
}

agentry_persistence::backend_tests! {
    // A $1 repository budget and a $2 instance budget, $0.40 runs: each threshold is
    // recorded once, when the month's spend reaches it, with the spend and budget of that
    // moment; checking again records nothing; the next month starts afresh.
    fn each_threshold_of_each_budget_is_recorded_once_a_month(db) {
        let web = connect(db, "acme", "web");
        let other = connect(db, "acme", "other");
        set_budget(db, &web, "1");
        budgets::set_instance_budget(&mut db.conn().unwrap(), Some(usd("2")), T0).unwrap();
        assert!(check(db, at(1)).is_empty(), "nothing spent");

        spend(db, &web, "0.4", at(10));
        assert!(check(db, at(11)).is_empty(), "40 % of the repository's");
        spend(db, &web, "0.4", at(20));
        let url = Some("https://github.com/acme/web");
        assert_eq!(
            summary(&check(db, at(21))),
            [
                row(BudgetScope::Repository, url, "2026-01", 50, "0.8", "1"),
                row(BudgetScope::Repository, url, "2026-01", 80, "0.8", "1"),
            ]
        );
        assert!(check(db, at(22)).is_empty(), "already recorded");
        // Another repository's spend counts for the instance only.
        spend(db, &other, "0.4", at(30));
        spend(db, &web, "0.4", at(40));
        assert_eq!(
            summary(&check(db, at(41))),
            [
                row(BudgetScope::Instance, None, "2026-01", 50, "1.6", "2"),
                row(BudgetScope::Instance, None, "2026-01", 80, "1.6", "2"),
                row(BudgetScope::Repository, url, "2026-01", 100, "1.2", "1"),
            ]
        );
        assert!(check(db, at(42)).is_empty());
        let mut conn = db.conn().unwrap();
        let recorded = all(&mut conn);
        assert_eq!(recorded.len(), 5);
        assert!(recorded.iter().all(|a| a.delivery == Delivery::Pending && a.attempts == 0));
        // Newest first.
        assert_eq!(recorded[0].threshold, 100);
        assert_eq!(recorded[4].threshold, 50);
        assert_eq!(recorded[4].scope, BudgetScope::Repository);
        drop(conn);

        // February: the spend starts from nothing again.
        let february = T0 + Duration::days(20);
        assert!(check(db, february).is_empty());
        spend(db, &web, "0.5", february);
        assert_eq!(
            summary(&check(db, february + Duration::seconds(1))),
            [row(BudgetScope::Repository, url, "2026-02", 50, "0.5", "1")]
        );
    }

    // A lowered budget may already be past a threshold: the next check records it. A
    // disconnected repository's budget, and budgets not set, are not checked; alerts
    // recorded without a webhook are `unsent`.
    fn a_lowered_budget_is_checked_and_unsent_alerts_stay_unsent(db) {
        let web = connect(db, "acme", "web");
        set_budget(db, &web, "10");
        spend(db, &web, "3", at(10));
        assert!(check(db, at(11)).is_empty());
        set_budget(db, &web, "5");
        let mut conn = db.conn().unwrap();
        let recorded = alerts::check(&mut conn, at(12), false).unwrap();
        assert_eq!(
            summary(&recorded),
            [row(BudgetScope::Repository, Some("https://github.com/acme/web"), "2026-01", 50, "3", "5")]
        );
        assert_eq!(recorded[0].delivery, Delivery::Unsent);
        assert!(alerts::QUEUE.claim_due(&mut conn, at(13), Duration::minutes(1), 10).unwrap().is_empty());
        assert_eq!(alerts::QUEUE.next_due(&mut conn).unwrap(), None);
        repos::disconnect_repository(&mut conn, web.id, at(14)).unwrap();
        drop(conn);
        spend(db, &web, "5", at(15));
        assert!(check(db, at(16)).is_empty(), "disconnected");
    }

    // Delivery: a claim leases a due alert (a second claim gets nothing until the lease
    // ends); a failure schedules the retry; a delivery is final and idempotent.
    fn pending_alerts_are_leased_retried_and_delivered_once(db) {
        let web = repo(db);
        set_budget(db, &web, "1");
        spend(db, &web, "0.5", at(0));
        let alert = check(db, at(1)).remove(0);
        let mut conn = db.conn().unwrap();
        let lease = Duration::seconds(60);
        assert_eq!(alerts::QUEUE.next_due(&mut conn).unwrap(), Some(at(1)));
        let claimed = alerts::QUEUE.claim_due(&mut conn, at(2), lease, 10).unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id, alert.id);
        assert_eq!(claimed[0].next_attempt_at, at(62));
        assert!(alerts::QUEUE.claim_due(&mut conn, at(3), lease, 10).unwrap().is_empty(), "leased");
        alerts::QUEUE.mark_failed(&mut conn, alert.id, at(62), "HTTP 500", at(10)).unwrap();
        let failed = alerts::get(&mut conn, alert.id).unwrap();
        assert_eq!((failed.attempts, failed.last_error.as_deref()), (1, Some("HTTP 500")));
        assert!(alerts::QUEUE.claim_due(&mut conn, at(9), lease, 10).unwrap().is_empty(), "not yet due");
        assert_eq!(alerts::QUEUE.claim_due(&mut conn, at(10), lease, 10).unwrap().len(), 1);
        alerts::QUEUE.mark_delivered(&mut conn, alert.id, at(11)).unwrap();
        alerts::QUEUE.mark_delivered(&mut conn, alert.id, at(12)).unwrap();
        alerts::QUEUE.mark_failed(&mut conn, alert.id, at(70), "late", at(13)).unwrap();
        let delivered = alerts::get(&mut conn, alert.id).unwrap();
        assert_eq!(delivered.delivery, Delivery::Delivered);
        assert_eq!(delivered.delivered_at, Some(at(11)));
        assert_eq!(delivered.attempts, 1);
        assert_eq!(alerts::QUEUE.next_due(&mut conn).unwrap(), None);
        assert!(alerts::QUEUE.claim_due(&mut conn, at(500), lease, 10).unwrap().is_empty());
        assert!(matches!(
            alerts::QUEUE.mark_delivered(&mut conn, Uuid::new_v4(), at(1)),
            Err(agentry_persistence::DbError::NotFound)
        ));
    }

    // Pages of the list, newest first, each starting after the last alert of the previous.
    fn alerts_are_listed_newest_first_in_pages(db) {
        let web = connect(db, "acme", "web");
        let api = connect(db, "acme", "api");
        set_budget(db, &web, "1");
        set_budget(db, &api, "1");
        spend(db, &web, "1", at(0));
        spend(db, &api, "1", at(0));
        assert_eq!(check(db, at(1)).len(), 6);
        let mut conn = db.conn().unwrap();
        let everything = all(&mut conn);
        let first = alerts::list(&mut conn, 4, None).unwrap();
        let second = alerts::list(&mut conn, 4, first.last().map(|a| a.id)).unwrap();
        assert_eq!((first.len(), second.len()), (4, 2));
        let paged: Vec<Uuid> = first.iter().chain(&second).map(|a| a.id).collect();
        assert_eq!(paged, everything.iter().map(|a| a.id).collect::<Vec<_>>());
        let mut sorted = paged.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(paged, sorted);
    }

    // Replicas (or a process and its restart) that check at the same moment record each
    // alert once: the unique key decides, and the losers get nothing back.
    fn concurrent_checks_record_each_alert_once(db) {
        let web = repo(db);
        set_budget(db, &web, "1");
        budgets::set_instance_budget(&mut db.conn().unwrap(), Some(usd("1")), T0).unwrap();
        spend(db, &web, "1", at(0));
        let pool = wide_pool(db, 8);
        for round in 0..3 {
            let results = race(&pool, 6, |_, conn| {
                alerts::check(conn, at(1 + round), true).unwrap().len()
            });
            let expected = if round == 0 { 6 } else { 0 };
            assert_eq!(results.iter().sum::<usize>(), expected, "round {round}: {results:?}");
        }
        assert_eq!(row_count(db, "budget_alerts"), 6);
    }
}
