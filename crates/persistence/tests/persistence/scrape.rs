//! The rollups `/metrics` reads (crates/persistence/src/scrape.rs): kept in the writing
//! transactions equal to the run ledger and the refusal ledger, filled from them by the
//! migration, and naming connected repositories only.

use crate::common::*;
use agentry_domain::{Task, Tokens};
use agentry_persistence::repos::Repository;
use agentry_persistence::tasks::{self, Run};
use agentry_persistence::{AnyConnection, Db, budgets, metering, rollups, scrape};
use diesel::RunQueryDsl;
use time::OffsetDateTime;
use time::macros::datetime;
use uuid::Uuid;

fn run(
    task: Uuid,
    attempt: i32,
    model: Option<&str>,
    cost: Option<&str>,
    finished: Option<OffsetDateTime>,
) -> Run {
    Run {
        model: model.map(str::to_owned),
        cost_usd: cost.map(usd),
        tokens: Tokens {
            input: 1,
            output: 1,
            ..Tokens::default()
        },
        finished_at: finished,
        sandboxed: Some(true),
        ..agentry_persistence::test_support::succeeded_run(task, attempt, T0)
    }
}

type Figures = (Vec<(rollups::Combo, i64)>, Vec<i64>, Vec<(String, i64)>);

/// The rollups' figures: all-time totals, this month's spend (all, and per repository) and
/// the refusals per repository.
fn figures(conn: &mut AnyConnection, repos: &[Uuid], now: OffsetDateTime) -> Figures {
    let mut spent = vec![scrape::month_spent_nanos(conn, None, now).unwrap()];
    for r in repos {
        spent.push(scrape::month_spent_nanos(conn, Some(*r), now).unwrap());
    }
    use agentry_persistence::schema::egress_blocked_repo as ebr;
    use diesel::prelude::*;
    let blocked = ebr::table
        .select((ebr::repo_url, ebr::count))
        .order(ebr::repo_url.asc())
        .load::<(String, i64)>(conn)
        .unwrap();
    (scrape::run_cost_totals(conn).unwrap(), spent, blocked)
}

/// Runs the backfills of the migrations that fill the rollups from the ledgers: the
/// `INSERT` statements of the one that created them, then the rebuild of `run_cost_rollup`
/// that puts lost runs in the month they started (000026).
fn backfill(conn: &mut AnyConnection) {
    let created = include_str!("../../../../migrations/2026-11-26-000003_metrics_rollups/up.sql");
    let rebuilt = include_str!("../../../../migrations/2026-11-29-000026_lost_run_month/up.sql");
    let statements = agentry_testkit::sql::statements_starting_with(created, "INSERT")
        .chain(agentry_testkit::sql::statements_starting_with(
            rebuilt, "DELETE",
        ))
        .chain(agentry_testkit::sql::statements_starting_with(
            rebuilt, "INSERT",
        ));
    for statement in statements {
        diesel::sql_query(statement).execute(conn).unwrap();
    }
}

/// Connects the test repository and `https://github.com/o/{other}` and creates a task on
/// each at `T0`; returns the repositories and the tasks, in that order.
fn two_repositories(db: &Db, other: &str) -> ([Repository; 2], [Task; 2]) {
    let (first, second) = (repo(db), connect(db, "o", other));
    let tasks = [create(db, &first, T0), create(db, &second, T0)];
    ([first, second], tasks)
}

agentry_persistence::backend_tests! {
    // Each recorded run adds its cost to its month, repository, type and model; the totals
    // equal the ledger's, the month's spend equals the budgets' own figure, and the
    // migrations' backfills compute the same rows from the ledgers.
    fn the_rollups_equal_the_ledgers_and_the_backfill(db) {
        let ([web, api], [a, b]) = two_repositories(db, "api");
        let mut conn = db.conn().unwrap();
        let now = datetime!(2026-01-20 00:00 UTC);
        let last_month = Some(datetime!(2025-12-31 23:59:59.999 UTC));
        for r in [
            run(a.id, 1, Some("opus"), Some("0.1"), Some(at(5))),
            run(a.id, 1, Some("opus"), Some("0.2"), Some(at(6))),
            run(a.id, 2, None, Some("0.000000001"), Some(at(7))),
            run(a.id, 2, Some("opus"), Some("7"), last_month),
            run(a.id, 3, Some("opus"), Some("1"), None),
            run(a.id, 3, Some("opus"), None, Some(at(8))),
            run(b.id, 1, Some("haiku"), Some("12345.678901234"), Some(at(9))),
        ] {
            tasks::record_run(&mut conn, &r).unwrap();
        }
        for (task, host) in [(a.id, "x.example"), (a.id, "x.example"), (a.id, "y.example"), (b.id, "x.example")] {
            metering::record_blocked(&mut conn, task, 1, host, 443, at(3)).unwrap();
        }
        let (totals, spent, blocked) = figures(&mut conn, &[web.id, api.id], now);
        assert_eq!(totals, rollups::run_cost_totals(&mut conn).unwrap());
        assert_eq!(
            totals,
            [
                (("https://github.com/o/api".into(), "coding".into(), "haiku".into()), 12_345_678_901_234),
                (("https://github.com/o/r".into(), "coding".into(), "".into()), 1),
                (("https://github.com/o/r".into(), "coding".into(), "opus".into()), 8_300_000_000),
            ]
        );
        let expected_spent: Vec<i64> = [None, Some(web.id), Some(api.id)]
            .into_iter()
            .map(|r| budgets::spent_nanos(&mut conn, r, now).unwrap())
            .collect();
        assert_eq!(spent, expected_spent);
        // The lost run (no end time, $1) counts in the month it started.
        assert_eq!(spent, [12_346_978_901_235, 1_300_000_001, 12_345_678_901_234]);
        assert_eq!(blocked, [("https://github.com/o/api".to_owned(), 1), ("https://github.com/o/r".to_owned(), 3)]);

        // The migration's backfill, from the ledgers, gives the same rows.
        diesel::sql_query("DELETE FROM run_cost_rollup").execute(&mut conn).unwrap();
        diesel::sql_query("DELETE FROM egress_blocked_repo").execute(&mut conn).unwrap();
        backfill(&mut conn);
        assert_eq!(figures(&mut conn, &[web.id, api.id], now), (totals, spent, blocked));
    }

    // A scrape names connected repositories only; the budgets carry the month's spend.
    fn a_scrape_names_connected_repositories_only(db) {
        let ([_, gone], [a, b]) = two_repositories(db, "gone");
        let mut conn = db.conn().unwrap();
        tasks::record_run(&mut conn, &run(a.id, 1, Some("opus"), Some("0.5"), Some(at(1)))).unwrap();
        tasks::record_run(&mut conn, &run(b.id, 1, Some("opus"), Some("2"), Some(at(1)))).unwrap();
        metering::record_blocked(&mut conn, a.id, 1, "x.example", 443, at(1)).unwrap();
        metering::record_blocked(&mut conn, b.id, 1, "x.example", 443, at(1)).unwrap();
        budgets::set_instance_budget(&mut conn, Some(usd("10")), at(1)).unwrap();
        agentry_persistence::repos::disconnect_repository(&mut conn, gone.id, at(2)).unwrap();
        let s = scrape::scrape(&mut conn, at(3)).unwrap();
        assert_eq!(
            s.costs,
            [(("https://github.com/o/r".into(), "coding".into(), "opus".into()), 500_000_000)]
        );
        assert_eq!(s.egress_blocked, [("https://github.com/o/r".to_owned(), 1)]);
        assert_eq!(s.budgets.len(), 1);
        assert_eq!(s.budgets[0].repo_url, None);
        assert_eq!(s.budgets[0].spent, usd("2.5"));
        assert_eq!(s.budgets, budgets::all_set(&mut conn, None, at(3)).unwrap());
    }
}
