//! The reads of the load benchmark that must stay range reads however large the tables grow:
//! a deep page of the task list and a page of the issues view. Their plans are checked on
//! SQLite with `EXPLAIN QUERY PLAN` of the statements the functions actually send; the pages
//! themselves are checked on both backends against the reference order.

use std::sync::{Arc, Mutex};

use crate::common::*;
use agentry_domain::TaskState;
use agentry_persistence::issues::{self, IssueView, IssueViewCursor, SyncedIssue};
use agentry_persistence::tasks::{self, TaskCursor, TaskFilter};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{AnyConnection, repos};
use diesel::connection::{Connection, InstrumentationEvent};
use diesel::prelude::*;
use diesel::sql_types::Text;

/// Runs `f` and returns what it returned with the SQL of every statement it sent (binds
/// left as placeholders).
fn statements<T>(
    conn: &mut AnyConnection,
    f: impl FnOnce(&mut AnyConnection) -> T,
) -> (T, Vec<String>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&sent);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            let text = query.to_string();
            let sql = text.split(" -- binds:").next().unwrap_or("").to_owned();
            sink.lock().unwrap().push(sql);
        }
    });
    let out = f(conn);
    conn.set_instrumentation(|_: InstrumentationEvent<'_>| {});
    let sent = sent.lock().unwrap().clone();
    (out, sent)
}

#[derive(QueryableByName)]
struct PlanRow {
    #[diesel(sql_type = Text)]
    detail: String,
}

/// SQLite's plan of `sql`, one line per step (unbound parameters: the plan does not depend
/// on their values).
fn plan(conn: &mut AnyConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(format!("EXPLAIN QUERY PLAN {sql}"))
        .load::<PlanRow>(conn)
        .unwrap()
        .into_iter()
        .map(|r| r.detail)
        .collect()
}

/// An SQLite test database with `n` tasks on the default repository ([`repo`]), created at
/// `at(0)`, `at(1)`, ….
fn sqlite_with_tasks(n: i64) -> (TestDb, repos::Repository) {
    let test_db = TestDb::sqlite();
    let repo = repo(&test_db.db);
    for i in 0..n {
        create(&test_db.db, &repo, at(i));
    }
    (test_db, repo)
}

/// Asserts that SQLite's plan of `sql` has a step that is `expected` and none that is
/// `refused`.
fn assert_plan(
    conn: &mut AnyConnection,
    sql: &str,
    expected: impl Fn(&str) -> bool,
    refused: impl Fn(&str) -> bool,
) {
    let steps = plan(conn, sql);
    assert!(steps.iter().any(|s| expected(s)), "{sql}: {steps:?}");
    assert!(!steps.iter().any(|s| refused(s)), "{sql}: {steps:?}");
}

/// Whether a plan step sorts (a temporary B-tree) instead of reading in index order.
fn sorts(step: &str) -> bool {
    step.contains("TEMP B-TREE")
}

/// (repository URL, issue number) of each entry, in order.
fn keys(views: &[IssueView]) -> Vec<(String, i64)> {
    views
        .iter()
        .map(|v| (v.repo_url.to_string(), v.issue.number))
        .collect()
}

/// Every page of the view with `limit`, concatenated; checks each page's size.
fn all_pages(conn: &mut AnyConnection, repo: Option<uuid::Uuid>, limit: i64) -> Vec<IssueView> {
    let mut seen = Vec::new();
    let mut cursor: Option<IssueViewCursor> = None;
    loop {
        let page = issues::open_issues_page(conn, repo, limit, cursor.as_ref()).unwrap();
        assert!(page.issues.len() <= limit as usize);
        let last = page.issues.len();
        seen.extend(page.issues);
        match page.next {
            Some(next) => {
                assert_eq!(last, limit as usize, "only the last page is short");
                cursor = Some(next);
            }
            None => break,
        }
    }
    seen
}

// The page 50,000 tasks deep reads a range of the creation-time index, not the index from
// the newest task down to the cursor; with a state or repository filter, the index of that
// filter.
#[test]
fn a_deep_task_cursor_is_an_index_range() {
    let (test_db, repo) = sqlite_with_tasks(5);
    let mut conn = test_db.db.conn().unwrap();
    let first = tasks::list_tasks(&mut conn, &TaskFilter::default(), 2, None).unwrap();
    let cursor: TaskCursor = first.next.unwrap();
    let filters = [
        (TaskFilter::default(), "tasks_created"),
        (
            TaskFilter {
                state: Some(TaskState::Queued),
                ..TaskFilter::default()
            },
            "tasks_state_created",
        ),
        (
            TaskFilter {
                repo_id: Some(repo.id),
                ..TaskFilter::default()
            },
            "tasks_repo_created",
        ),
    ];
    for (filter, index) in filters {
        let (page, sent) = statements(&mut conn, |c| {
            tasks::list_tasks(c, &filter, 2, Some(&cursor)).unwrap()
        });
        assert_eq!(page.tasks.len(), 2);
        let select = sent
            .iter()
            .find(|s| s.contains("FROM `tasks`") || s.contains("FROM \"tasks\""))
            .expect("the page's statement");
        assert_plan(
            &mut conn,
            select,
            |s| s.starts_with("SEARCH") && s.contains(index) && s.contains("created_at<?"),
            sorts,
        );
    }
}

// Unblocking after a run reads the budget-blocked tasks through their partial index, not
// every queued task (a backlog made each run's end a scan of the whole queue).
#[test]
fn unblocking_reads_only_the_blocked_tasks() {
    let (test_db, _) = sqlite_with_tasks(3);
    let mut conn = test_db.db.conn().unwrap();
    let (unblocked, sent) = statements(&mut conn, |c| {
        agentry_persistence::budgets::unblock(c, None).unwrap()
    });
    assert_eq!(unblocked, 0);
    let reads: Vec<&String> = sent
        .iter()
        .filter(|s| s.contains("FROM `tasks`") || s.contains("FROM \"tasks\""))
        .collect();
    assert!(!reads.is_empty(), "{sent:?}");
    for read in reads {
        assert_plan(
            &mut conn,
            read,
            |s| s.contains("tasks_blocked"),
            |s| s.starts_with("SCAN") || s.contains("tasks_state_created"),
        );
    }
}

// A claim reads the queue's partial index from its start: no scan of the queued tasks an
// import left (they are history), no sort.
#[test]
fn a_claim_reads_the_queue_index() {
    let test_db = TestDb::sqlite();
    let db = &test_db.db;
    let repo = repo(db);
    create(db, &repo, at(1));
    let mut conn = db.conn().unwrap();
    let lease = time::Duration::seconds(60);
    let (claimed, sent) = statements(&mut conn, |c| {
        agentry_persistence::runner::claim_next(c, "me", at(2), lease).unwrap()
    });
    assert!(claimed.is_some());
    let pick = sent
        .iter()
        .find(|s| s.contains("NOT imported"))
        .expect("the claim's candidate query");
    assert_plan(
        &mut conn,
        pick,
        |s| {
            s.starts_with("SCAN") && s.contains("tasks_queue")
                || s.starts_with("SEARCH") && s.contains("tasks_queue")
        },
        sorts,
    );
}

// A page of the issues view reads ranges of the index on the view's order (no scan of every
// open issue, no sort), with and without a repository filter, from the start and after a
// cursor.
#[test]
fn an_issues_view_page_is_an_index_range() {
    let test_db = TestDb::sqlite();
    let db = &test_db.db;
    let a = connect(db, "a", "x");
    let b = connect(db, "b", "y");
    let mut conn = db.conn().unwrap();
    let list: Vec<SyncedIssue> = (1..=30).map(|n| synced_issue(n, n % 7, &[])).collect();
    issues::replace_open_issues(&mut conn, a.id, &list, None, at(100)).unwrap();
    issues::replace_open_issues(&mut conn, b.id, &list, None, at(100)).unwrap();
    link_issue(db, &a, 3);
    let first = issues::open_issues_page(&mut conn, None, 5, None).unwrap();
    let cursor = first.next.unwrap();
    let mut group_reads = 0;
    for repo in [None, Some(a.id)] {
        for after in [None, Some(&cursor)] {
            let (page, sent) = statements(&mut conn, |c| {
                issues::open_issues_page(c, repo, 5, after).unwrap()
            });
            assert_eq!(page.issues.len(), 5);
            // The page's issues are read by key (repo_id, number), not by reading every open
            // issue of their repository and keeping the page's numbers.
            let loads: Vec<&String> = sent.iter().filter(|s| s.contains("body")).collect();
            assert!(!loads.is_empty(), "{sent:?}");
            for sql in loads {
                assert_plan(
                    &mut conn,
                    sql,
                    |s| {
                        s.starts_with("SEARCH synced_issues USING")
                            && s.contains("(repo_id=? AND number=?)")
                    },
                    |_| false,
                );
            }
            // The repositories of a timestamp's group: one seek each, never the whole group.
            for sql in sent.iter().filter(|s| s.contains("MIN(repo_id)")) {
                group_reads += 1;
                assert_plan(
                    &mut conn,
                    sql,
                    |s| s.contains("INDEX synced_issues_view (") && s.contains("repo_id>?"),
                    |_| false,
                );
            }
            let key_reads: Vec<&String> = sent.iter().filter(|s| s.contains("linked")).collect();
            assert!(!key_reads.is_empty());
            for sql in key_reads {
                assert_plan(
                    &mut conn,
                    sql,
                    |s| {
                        s.starts_with("SEARCH synced_issues USING")
                            && s.contains("INDEX synced_issues_")
                            && s.contains("_view (")
                    },
                    |s| sorts(s) || s.starts_with("SCAN synced_issues"),
                );
            }
        }
    }
    assert!(group_reads > 0, "no page read a timestamp's group");
}

agentry_persistence::backend_tests! {
    // Pages of the view equal the reference order (`open_issues`, sorted in Rust over the
    // links themselves) for every page size: many issues share a timestamp across three
    // repositories, an issue linked before it entered the copy, one linked after, one closed
    // and reopened after it was linked, and a disconnected repository that stays out.
    fn view_pages_keep_the_order_through_ties_and_links(db) {
        let a = connect(db, "a", "x");
        let b = connect(db, "b", "y");
        let c = connect(db, "c", "z");
        let gone = connect(db, "d", "w");
        let mut conn = db.conn().unwrap();
        // Linked before the sync stored the issue.
        link_issue(db, &b, 4);
        let list: Vec<SyncedIssue> = (1..=15).map(|n| synced_issue(n, n % 3, &[])).collect();
        for r in [&a, &b, &c, &gone] {
            issues::replace_open_issues(&mut conn, r.id, &list, None, at(100)).unwrap();
        }
        // Linked after.
        link_issue(db, &a, 7);
        link_issue(db, &c, 9);
        // Closed, then reopened by an incremental sync, after its link.
        issues::apply_issue_changes(&mut conn, c.id, &[], &[(9, at(50))], None, None, at(110)).unwrap();
        assert!(!issues::is_open_issue(&mut conn, c.id, 9).unwrap());
        issues::apply_issue_changes(&mut conn, c.id, &[synced_issue(9, 60, &[])], &[], None, None, at(120)).unwrap();
        repos::disconnect_repository(&mut conn, gone.id, at(130)).unwrap();

        let all = issues::open_issues(&mut conn, None).unwrap();
        assert_eq!(all.len(), 45);
        let linked: Vec<(String, i64)> =
            keys(&all).into_iter().skip(42).collect();
        assert_eq!(
            linked,
            vec![
                ("https://github.com/c/z".to_owned(), 9),
                ("https://github.com/a/x".to_owned(), 7),
                ("https://github.com/b/y".to_owned(), 4),
            ],
            "the linked ones last, newest first"
        );
        for limit in [1, 2, 3, 4, 7, 14, 15, 16, 44, 45, 46, 200] {
            let seen = all_pages(&mut conn, None, limit);
            assert_eq!(keys(&seen), keys(&all), "limit {limit}");
            assert_eq!(seen, all, "limit {limit}");
        }
        for r in [&a, &b, &c] {
            let one = issues::open_issues(&mut conn, Some(r.id)).unwrap();
            assert_eq!(one.len(), 15);
            for limit in [1, 4, 5, 15, 16] {
                assert_eq!(all_pages(&mut conn, Some(r.id), limit), one, "limit {limit}");
            }
        }
        // A task listed as the view's linked task is the one the link names.
        let reopened = all.iter().find(|v| v.repo_id == c.id && v.issue.number == 9).unwrap();
        assert_eq!(reopened.task.as_ref().map(|t| t.state), Some(TaskState::Queued));
        assert!(all.iter().all(|v| v.repo_id != gone.id));
        let coding = all.iter().filter_map(|v| v.task.as_ref()).count();
        assert_eq!(coding, 3);
    }
}
