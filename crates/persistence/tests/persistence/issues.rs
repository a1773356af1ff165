//! The synced copy of open issues (docs/contract.md#36-issues-view, #53-issue-sync): replacing it, the sync state on the
//! repository, the issues view and its order, and the labelled issues the sync assigns.

use crate::common::*;
use agentry_domain::{TaskState, Trigger};
use agentry_persistence::DbError;
use agentry_persistence::issues::{
    self, FullRead, IssueLabel, IssueSyncCursor, IssueView, IssueViewCursor, LinkedTaskRef,
    SyncedIssue,
};
use agentry_persistence::repos::{self, IssueSyncState};
use agentry_persistence::tasks::{self, TransitionDetails};
use uuid::Uuid;

/// The sync state of the repository `id`.
fn sync_state(db: &agentry_persistence::Db, id: Uuid) -> IssueSyncState {
    let mut conn = db.conn().unwrap();
    repos::issue_sync_states(&mut conn)
        .unwrap()
        .into_iter()
        .find(|(r, _)| r.id == id)
        .map(|(_, s)| s)
        .expect("a connected repository")
}

/// The synced issues of one repository as the view shows them, by number.
fn stored(db: &agentry_persistence::Db, repo_id: Uuid) -> Vec<SyncedIssue> {
    let mut conn = db.conn().unwrap();
    let mut list: Vec<SyncedIssue> = issues::open_issues(&mut conn, Some(repo_id))
        .unwrap()
        .into_iter()
        .map(|v| v.issue)
        .collect();
    list.sort_by_key(|i| i.number);
    list
}

/// (repository URL, issue number) of each entry, in order.
fn keys(views: &[IssueView]) -> Vec<(String, i64)> {
    views
        .iter()
        .map(|v| (v.repo_url.to_string(), v.issue.number))
        .collect()
}

/// The repository's issue sync state is this ETag, sync time and error.
fn assert_sync_state(
    db: &agentry_persistence::Db,
    id: Uuid,
    etag: Option<&str>,
    synced_at: Option<time::OffsetDateTime>,
    error: Option<&str>,
) {
    let expected = IssueSyncState {
        etag: etag.map(str::to_owned),
        synced_at,
        error: error.map(str::to_owned),
    };
    assert_eq!(sync_state(db, id), expected);
}

agentry_persistence::backend_tests! {
    // A 200 stores exactly the list: new issues inserted, changed ones updated, the ones no
    // longer open deleted; the repository gets the ETag, the sync time and no error.
    fn replace_inserts_updates_deletes_and_sets_sync_state(db) {
        let repo = repo(db);
        assert_eq!(sync_state(db, repo.id), IssueSyncState::default());
        let mut conn = db.conn().unwrap();
        let first = vec![
            synced_issue(1, 10, &["bug"]),
            synced_issue(2, 20, &[]),
            synced_issue(3, 30, &["agentry", "help wanted"]),
        ];
        issues::replace_open_issues(&mut conn, repo.id, &first, Some("\"e1\""), at(100)).unwrap();
        assert_eq!(stored(db, repo.id), first);
        assert_sync_state(db, repo.id, Some("\"e1\""), Some(at(100)), None);

        // A failure in between; the next 200 clears it.
        issues::mark_issues_sync_failed(&mut conn, repo.id, "502 from the code host").unwrap();
        let mut changed = synced_issue(2, 40, &["bug", "agentry"]);
        changed.title = "Issue 2, retitled".into();
        changed.body = String::new();
        changed.author = "hubot".into();
        let second = vec![synced_issue(4, 50, &[]), changed.clone(), synced_issue(3, 30, &["agentry", "help wanted"])];
        issues::replace_open_issues(&mut conn, repo.id, &second, Some("W/\"e2\""), at(200)).unwrap();
        assert_eq!(stored(db, repo.id), vec![changed, second[2].clone(), second[0].clone()]);
        assert_eq!(row_count(db, "synced_issues"), 3);
        assert_sync_state(db, repo.id, Some("W/\"e2\""), Some(at(200)), None);

        // An answer without an ETag stores none; an empty list empties the copy.
        issues::replace_open_issues(&mut conn, repo.id, &[], None, at(300)).unwrap();
        assert_eq!(stored(db, repo.id), vec![]);
        assert_eq!(row_count(db, "synced_issues"), 0);
        assert_sync_state(db, repo.id, None, Some(at(300)), None);
    }

    // Replacing one repository's issues leaves another repository's alone, even with the
    // same numbers.
    fn replace_touches_only_its_repository(db) {
        let a = connect(db, "a", "x");
        let b = connect(db, "b", "y");
        let mut conn = db.conn().unwrap();
        let list = vec![synced_issue(1, 1, &[]), synced_issue(2, 2, &[])];
        issues::replace_open_issues(&mut conn, a.id, &list, Some("a1"), at(10)).unwrap();
        issues::replace_open_issues(&mut conn, b.id, &list, Some("b1"), at(10)).unwrap();
        issues::replace_open_issues(&mut conn, a.id, &list[..1], Some("a2"), at(20)).unwrap();
        assert_eq!(stored(db, a.id), list[..1].to_vec());
        assert_eq!(stored(db, b.id), list);
        assert_eq!(sync_state(db, b.id).etag.as_deref(), Some("b1"));
        assert_eq!(sync_state(db, b.id).synced_at, Some(at(10)));
    }

    // A number listed twice (pagination shifting while the list was read) is stored once,
    // as the copy updated last.
    fn replace_keeps_the_latest_copy_of_a_repeated_number(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let mut newer = synced_issue(5, 60, &["agentry"]);
        newer.title = "newer".into();
        let older = synced_issue(5, 50, &[]);
        issues::replace_open_issues(&mut conn, repo.id, &[newer.clone(), older.clone()], None, at(100)).unwrap();
        assert_eq!(stored(db, repo.id), vec![newer.clone()]);
        issues::replace_open_issues(&mut conn, repo.id, &[older, newer.clone()], None, at(100)).unwrap();
        assert_eq!(stored(db, repo.id), vec![newer]);
    }

    // Titles, bodies and labels round-trip exactly, whatever characters they hold; times
    // at microsecond precision.
    fn issue_fields_round_trip(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let issue = SyncedIssue {
            number: 9_007_199_254_740_993,
            title: "Quotes \" and \\ backslashes, 'single', ünïcødé 🚀".into(),
            body: "line 1\r\nline 2\t<b>end</b>".into(),
            html_url: "https://github.com/o/r/issues/9007199254740993".into(),
            author: "dependabot[bot]".into(),
            labels: vec![
                IssueLabel { name: "needs \"triage\"".into(), color: "d73a4a".into() },
                IssueLabel { name: "área: ñ".into(), color: "".into() },
            ],
            created_at: time::macros::datetime!(2020-02-29 23:59:59.999999 UTC),
            updated_at: time::macros::datetime!(2026-01-01 00:00:00.000001 UTC),
        };
        issues::replace_open_issues(&mut conn, repo.id, std::slice::from_ref(&issue), None, at(1)).unwrap();
        assert_eq!(stored(db, repo.id), vec![issue]);
    }

    // A NUL character, which PostgreSQL's text cannot hold and anyone may put in an issue
    // on a public repository, is left out of the stored text instead of failing the sync of
    // the whole repository.
    fn issue_text_is_stored_without_nul_characters(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let issue = SyncedIssue {
            title: "a\0b".into(),
            body: "\0body\0".into(),
            author: "us\0er".into(),
            html_url: "https://github.com/o/r/issues/1\0".into(),
            ..synced_issue(1, 10, &["agentry"])
        };
        issues::replace_open_issues(&mut conn, repo.id, &[issue], None, at(1)).unwrap();
        let [stored] = &stored(db, repo.id)[..] else { panic!("one issue") };
        assert_eq!(
            (&*stored.title, &*stored.body, &*stored.author, &*stored.html_url),
            ("ab", "body", "user", "https://github.com/o/r/issues/1")
        );
    }

    // A 304 only moves the sync time (and clears an error); a failure only records its
    // message. Neither touches the copy or the ETag.
    fn unchanged_and_failure_leave_the_copy_intact(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let list = vec![synced_issue(1, 10, &["agentry"]), synced_issue(2, 20, &[])];
        issues::replace_open_issues(&mut conn, repo.id, &list, Some("e1"), at(100)).unwrap();

        issues::mark_issues_sync_failed(&mut conn, repo.id, "timed out").unwrap();
        assert_eq!(stored(db, repo.id), list);
        assert_sync_state(db, repo.id, Some("e1"), Some(at(100)), Some("timed out"));

        issues::mark_issues_unchanged(&mut conn, repo.id, at(200)).unwrap();
        assert_eq!(stored(db, repo.id), list);
        assert_sync_state(db, repo.id, Some("e1"), Some(at(200)), None);

        // A failure before any successful sync: no copy, no time, just the error.
        let other = connect(db, "o", "other");
        issues::mark_issues_sync_failed(&mut conn, other.id, "404").unwrap();
        assert_sync_state(db, other.id, None, None, Some("404"));
    }

    // Unknown repositories are refused and nothing is written.
    fn unknown_repository_is_not_found(db) {
        repo(db);
        let mut conn = db.conn().unwrap();
        let unknown = Uuid::new_v4();
        let list = vec![synced_issue(1, 1, &[])];
        assert!(matches!(
            issues::replace_open_issues(&mut conn, unknown, &list, Some("e"), at(1)),
            Err(DbError::NotFound)
        ));
        assert!(matches!(
            issues::mark_issues_unchanged(&mut conn, unknown, at(1)),
            Err(DbError::NotFound)
        ));
        assert!(matches!(
            issues::mark_issues_sync_failed(&mut conn, unknown, "x"),
            Err(DbError::NotFound)
        ));
        assert_eq!(row_count(db, "synced_issues"), 0);
    }

    // The view: unlinked issues first, then updatedAt descending, then repository URL, then
    // number; linked tasks appear with their state and pull request.
    fn open_issues_order_and_linked_tasks(db) {
        let a = connect(db, "a", "x");
        let b = connect(db, "b", "y");
        let mut conn = db.conn().unwrap();
        issues::replace_open_issues(
            &mut conn,
            a.id,
            &[
                synced_issue(1, 10, &[]),
                synced_issue(2, 30, &[]),
                synced_issue(3, 30, &[]), // same time as a#2 and b#1
                synced_issue(4, 50, &["agentry"]), // linked below
                synced_issue(5, 5, &[]),  // linked below
            ],
            None,
            at(100),
        )
        .unwrap();
        issues::replace_open_issues(
            &mut conn,
            b.id,
            &[
                synced_issue(1, 30, &[]),
                synced_issue(2, 40, &[]),
                synced_issue(3, 60, &[]), // linked below
            ],
            None,
            at(100),
        )
        .unwrap();
        let t_a4 = link_issue(db, &a, 4);
        let t_a5 = link_issue(db, &a, 5);
        let t_b3 = link_issue(db, &b, 3);
        // a#5's task opened a pull request.
        for trigger in [Trigger::Claim, Trigger::AgentStarted] {
            tasks::transition_task(&mut conn, t_a5.id, trigger, &TransitionDetails::default(), at(101)).unwrap();
        }
        let details = TransitionDetails {
            pull_request: Some(agentry_domain::PullRequestRef { url: "https://github.com/a/x/pull/77".into(), number: 77 }),
            ..TransitionDetails::default()
        };
        tasks::transition_task(&mut conn, t_a5.id, Trigger::PullRequestOpened, &details, at(102)).unwrap();
        // b#3's task was cancelled: still linked, still shown with its task.
        tasks::transition_task(&mut conn, t_b3.id, Trigger::Cancel, &TransitionDetails::default(), at(103)).unwrap();

        let ax = "https://github.com/a/x".to_owned();
        let by = "https://github.com/b/y".to_owned();
        let all = issues::open_issues(&mut conn, None).unwrap();
        assert_eq!(
            keys(&all),
            vec![
                (by.clone(), 2),
                (ax.clone(), 2),
                (ax.clone(), 3),
                (by.clone(), 1),
                (ax.clone(), 1),
                (by.clone(), 3),
                (ax.clone(), 4),
                (ax.clone(), 5),
            ]
        );
        let task_of = |repo_id: Uuid, number: i64| {
            all.iter()
                .find(|v| v.repo_id == repo_id && v.issue.number == number)
                .unwrap()
                .task
                .clone()
        };
        assert_eq!(task_of(a.id, 1), None);
        assert_eq!(
            task_of(a.id, 4),
            Some(LinkedTaskRef { id: t_a4.id, state: TaskState::Queued, pr_url: None })
        );
        assert_eq!(
            task_of(a.id, 5),
            Some(LinkedTaskRef {
                id: t_a5.id,
                state: TaskState::PrOpened,
                pr_url: Some("https://github.com/a/x/pull/77".into()),
            })
        );
        assert_eq!(
            task_of(b.id, 3),
            Some(LinkedTaskRef { id: t_b3.id, state: TaskState::Cancelled, pr_url: None })
        );
        // Every entry carries its repository.
        for v in &all {
            let expected = if v.repo_id == a.id { &a } else { &b };
            assert_eq!(v.repo_url, expected.url);
        }
        assert_eq!(all[1].issue, synced_issue(2, 30, &[]));

        // One repository: the same order restricted to it.
        let only_b = issues::open_issues(&mut conn, Some(b.id)).unwrap();
        assert_eq!(keys(&only_b), vec![(by.clone(), 2), (by.clone(), 1), (by.clone(), 3)]);
        assert!(only_b.iter().all(|v| v.repo_id == b.id));
        // An unknown repository has no issues.
        assert_eq!(issues::open_issues(&mut conn, Some(Uuid::new_v4())).unwrap(), vec![]);
    }

    // Disconnected repositories leave the view (their synced copy is kept for a reconnect).
    fn open_issues_excludes_disconnected_repositories(db) {
        let a = connect(db, "a", "x");
        let b = connect(db, "b", "y");
        let mut conn = db.conn().unwrap();
        issues::replace_open_issues(&mut conn, a.id, &[synced_issue(1, 1, &[])], None, at(1)).unwrap();
        issues::replace_open_issues(&mut conn, b.id, &[synced_issue(1, 1, &[])], None, at(1)).unwrap();
        repos::disconnect_repository(&mut conn, b.id, at(2)).unwrap();
        let all = issues::open_issues(&mut conn, None).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].repo_id, a.id);
        assert_eq!(issues::open_issues(&mut conn, Some(b.id)).unwrap(), vec![]);
        assert_eq!(row_count(db, "synced_issues"), 2);
        // Reconnected, its issues are back.
        repos::connect_repository(&mut conn, &new_repo("b", "y"), at(3)).unwrap();
        assert_eq!(issues::open_issues(&mut conn, None).unwrap().len(), 2);
    }

    // The issues the sync assigns: open, carrying exactly that label name, not linked, of
    // that repository, by number.
    fn unlinked_with_label_finds_labelled_unassigned_issues(db) {
        let repo = repo(db);
        let other = connect(db, "o", "other");
        let mut conn = db.conn().unwrap();
        let list = vec![
            synced_issue(7, 1, &["bug", "agentry"]),
            synced_issue(3, 2, &["agentry"]),
            synced_issue(4, 3, &["Agentry"]),         // different case
            synced_issue(5, 4, &["agentry-later"]),   // different name
            synced_issue(6, 5, &[]),
            synced_issue(8, 6, &["agentry"]),         // linked below
        ];
        issues::replace_open_issues(&mut conn, repo.id, &list, None, at(10)).unwrap();
        issues::replace_open_issues(&mut conn, other.id, &[synced_issue(1, 1, &["agentry"])], None, at(10)).unwrap();
        link_issue(db, &repo, 8);
        let found = issues::unlinked_with_label(&mut conn, repo.id, "agentry").unwrap();
        assert_eq!(found, vec![list[1].clone(), list[0].clone()]);
        assert_eq!(
            issues::unlinked_with_label(&mut conn, repo.id, "Agentry").unwrap(),
            vec![list[2].clone()]
        );
        assert_eq!(issues::unlinked_with_label(&mut conn, repo.id, "none").unwrap(), vec![]);
        // Once linked, an issue is no longer offered.
        link_issue(db, &repo, 3);
        let found = issues::unlinked_with_label(&mut conn, repo.id, "agentry").unwrap();
        assert_eq!(found, vec![list[0].clone()]);
    }

    // Concurrent syncs of one repository (two replicas) all succeed, and the copy is one of
    // the lists written, whole.
    fn concurrent_replaces_of_one_repository_succeed(db) {
        let repo = repo(db);
        let pool = wide_pool(db, 6);
        let lists: Vec<Vec<SyncedIssue>> = (0..6_i64)
            .map(|i| (1..=20).map(|n| synced_issue(n + i, i, &[])).collect())
            .collect();
        let results = race(&pool, 6, |i, conn| {
            issues::replace_open_issues(conn, repo.id, &lists[i], Some(&format!("e{i}")), at(i as i64))
        });
        for r in results {
            r.unwrap();
        }
        let copy = stored(db, repo.id);
        let etag = sync_state(db, repo.id).etag.unwrap();
        let i: usize = etag[1..].parse().unwrap();
        assert_eq!(copy, lists[i], "the copy is the list stored with the ETag");
    }

    // A full read stores the list, the watermark it saw and the time of the read; stored
    // issues it lacks leave the copy unless kept; the watermark never goes back.
    fn full_reads_store_the_watermark_and_keep_checked_issues(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        assert_eq!(issues::sync_cursor(&mut conn, repo.id).unwrap(), IssueSyncCursor::default());
        let first = vec![synced_issue(1, 10, &[]), synced_issue(2, 20, &[]), synced_issue(3, 30, &[])];
        let read = FullRead { issues: &first, keep: &[], etag: None, watermark: Some(at(30)) };
        issues::store_full_read(&mut conn, repo.id, &read, at(100)).unwrap();
        assert_eq!(
            issues::sync_cursor(&mut conn, repo.id).unwrap(),
            IssueSyncCursor { etag: None, watermark: Some(at(30)), full_synced_at: Some(at(100)) }
        );
        assert_eq!(issues::synced_numbers(&mut conn, repo.id).unwrap(), vec![1, 2, 3]);
        // Issue 2 is missing from the next read but was checked open: it stays; 3 leaves.
        let second = vec![synced_issue(1, 10, &[])];
        let read = FullRead { issues: &second, keep: &[2], etag: Some("e"), watermark: Some(at(10)) };
        issues::store_full_read(&mut conn, repo.id, &read, at(200)).unwrap();
        assert_eq!(issues::synced_numbers(&mut conn, repo.id).unwrap(), vec![1, 2]);
        assert_eq!(
            issues::sync_cursor(&mut conn, repo.id).unwrap(),
            IssueSyncCursor { etag: Some("e".into()), watermark: Some(at(30)), full_synced_at: Some(at(200)) }
        );
        assert!(matches!(issues::sync_cursor(&mut conn, Uuid::new_v4()), Err(DbError::NotFound)));
    }

    // Changes since the watermark: open issues upserted, closed ones removed, stale changes
    // (older than the stored copy) ignored, ETag and watermark stored, error cleared.
    fn changes_upsert_open_remove_closed_and_raise_the_watermark(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let list = vec![synced_issue(1, 10, &[]), synced_issue(2, 20, &[]), synced_issue(3, 30, &[])];
        let read = FullRead { issues: &list, keep: &[], etag: None, watermark: Some(at(30)) };
        issues::store_full_read(&mut conn, repo.id, &read, at(100)).unwrap();
        issues::mark_issues_sync_failed(&mut conn, repo.id, "boom").unwrap();
        let relabelled = synced_issue(1, 40, &["agentry"]);
        let new = synced_issue(9, 41, &[]);
        let stale = synced_issue(3, 5, &["old"]);
        issues::apply_issue_changes(
            &mut conn,
            repo.id,
            &[relabelled.clone(), new.clone(), stale],
            &[(2, at(42)), (77, at(42))],
            Some("\"e2\""),
            Some(at(42)),
            at(150),
        )
        .unwrap();
        assert_eq!(stored(db, repo.id), vec![relabelled, list[2].clone(), new]);
        assert_eq!(
            issues::sync_cursor(&mut conn, repo.id).unwrap(),
            IssueSyncCursor { etag: Some("\"e2\"".into()), watermark: Some(at(42)), full_synced_at: Some(at(100)) }
        );
        let state = sync_state(db, repo.id);
        assert_eq!((state.synced_at, state.error), (Some(at(150)), None));
        // A closing older than the stored copy (the issue was reopened since) is ignored; an
        // older watermark does not lower the stored one.
        issues::apply_issue_changes(&mut conn, repo.id, &[], &[(9, at(30))], None, Some(at(1)), at(160)).unwrap();
        assert!(issues::is_open_issue(&mut conn, repo.id, 9).unwrap());
        assert!(!issues::is_open_issue(&mut conn, repo.id, 2).unwrap());
        assert_eq!(issues::sync_cursor(&mut conn, repo.id).unwrap().watermark, Some(at(42)));
        assert!(matches!(
            issues::apply_issue_changes(&mut conn, Uuid::new_v4(), &[], &[], None, None, at(1)),
            Err(DbError::NotFound)
        ));
    }

    // Pages of the view follow the view's order across pages, for every page size, and
    // cover every issue exactly once.
    fn the_view_pages_in_its_order(db) {
        let a = connect(db, "a", "x");
        let b = connect(db, "b", "y");
        let mut conn = db.conn().unwrap();
        let list_a: Vec<SyncedIssue> = (1..=12).map(|n| synced_issue(n, n % 4, &[])).collect();
        let list_b: Vec<SyncedIssue> = (1..=9).map(|n| synced_issue(n, n % 3, &[])).collect();
        issues::replace_open_issues(&mut conn, a.id, &list_a, None, at(100)).unwrap();
        issues::replace_open_issues(&mut conn, b.id, &list_b, None, at(100)).unwrap();
        link_issue(db, &a, 2);
        link_issue(db, &b, 5);
        let all = issues::open_issues(&mut conn, None).unwrap();
        assert_eq!(all.len(), 21);
        for limit in [1, 2, 5, 20, 21, 200] {
            let mut seen = Vec::new();
            let mut cursor: Option<IssueViewCursor> = None;
            loop {
                let page = issues::open_issues_page(&mut conn, None, limit, cursor.as_ref()).unwrap();
                assert!(page.issues.len() <= limit as usize);
                seen.extend(page.issues);
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(seen, all, "limit {limit}");
        }
        // One repository, two pages.
        let first = issues::open_issues_page(&mut conn, Some(b.id), 5, None).unwrap();
        let rest = issues::open_issues_page(&mut conn, Some(b.id), 5, first.next.as_ref()).unwrap();
        assert_eq!((first.issues.len(), rest.issues.len(), rest.next), (5, 4, None));
        assert!(first.issues.iter().chain(&rest.issues).all(|v| v.repo_id == b.id));
        assert_eq!(first.issues[0].issue.number, 2);
        assert_eq!(rest.issues.last().unwrap().issue.number, 5, "the linked one comes last");
    }
}
