//! Task creation, the unique issue link (docs/contract.md#37-assign) and connecting repositories.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;
use agentry_domain::{AgentType, RepoSettings, RepoUrl, TaskState, TaskType};
use agentry_persistence::DbError;
use agentry_persistence::repos;
use agentry_persistence::tasks::{self, NewTask, TaskEvent};
use time::macros::datetime;
use uuid::Uuid;

agentry_persistence::backend_tests! {
    // A new task starts queued at attempt 1, with every field as given, no totals yet, and
    // exactly one creation event {from: null, to: queued}.
    fn create_task_starts_queued_with_creation_event(db) {
        let repo = repo(db);
        let new = NewTask {
            issue_number: Some(7),
            agent_type: AgentType::Codex,
            ..new_task(&repo, T0)
        };
        let mut conn = db.conn().unwrap();
        let task = tasks::create_task(&mut conn, &new, "created by test").unwrap();
        assert_eq!(task.id, new.id);
        assert_eq!(task.title, new.title);
        assert_eq!(task.prompt, new.prompt);
        assert_eq!(task.repo_id, Some(repo.id));
        assert_eq!(task.repo_url, repo.url);
        assert_eq!(task.task_type, TaskType::Coding);
        assert_eq!(task.agent_type, AgentType::Codex);
        assert_eq!(task.state, TaskState::Queued);
        assert_eq!(task.attempt, 1);
        assert_eq!(task.issue_number, Some(7));
        assert_eq!(task.parent_task_id, None);
        assert_eq!(task.model_used, None);
        assert_eq!(task.cost_usd, None);
        assert_eq!((task.input_tokens, task.output_tokens), (0, 0));
        assert_eq!((task.pr_url.as_deref(), task.pr_number), (None, None));
        assert_eq!(task.error_message, None);
        assert_eq!(task.created_at, T0);
        assert_eq!(task.updated_at, T0);
        assert_eq!((task.started_at, task.finished_at), (None, None));
        // What create_task returned is what a later read sees.
        assert_eq!(tasks::get_task(&mut conn, new.id).unwrap(), task);
        assert_eq!(
            tasks::task_events(&mut conn, new.id).unwrap(),
            vec![TaskEvent {
                from: None,
                to: TaskState::Queued,
                reason: "created by test".into(),
                at: T0,
                kind: tasks::EventKind::Transition,
            }]
        );
        assert_eq!(task_count(db), 1);
    }

    // Times are stored at microsecond precision: a microsecond value round-trips exactly,
    // a nanosecond value comes back truncated to the microsecond, a non-UTC offset comes
    // back as the same instant in UTC.
    fn create_task_times_round_trip_at_microsecond_precision(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        for (written, expected) in [
            (
                datetime!(2026-03-01 00:00:00.000001 UTC),
                datetime!(2026-03-01 00:00:00.000001 UTC),
            ),
            (
                datetime!(2026-03-01 23:59:59.999999 UTC),
                datetime!(2026-03-01 23:59:59.999999 UTC),
            ),
            (
                datetime!(2026-03-01 12:00:00 UTC),
                datetime!(2026-03-01 12:00:00 UTC),
            ),
            (
                datetime!(2026-03-01 12:00:00.5 UTC),
                datetime!(2026-03-01 12:00:00.5 UTC),
            ),
            (
                datetime!(1999-12-31 23:59:59.123456789 UTC),
                datetime!(1999-12-31 23:59:59.123456 UTC),
            ),
            (
                datetime!(2026-03-01 02:00:00.25 +02:00),
                datetime!(2026-03-01 00:00:00.25 UTC),
            ),
        ] {
            let new = new_task(&repo, written);
            let created = tasks::create_task(&mut conn, &new, "created").unwrap();
            let read = tasks::get_task(&mut conn, new.id).unwrap();
            assert_eq!(created, read);
            assert_eq!(read.created_at, expected, "written {written}");
            assert_eq!(read.created_at.offset(), time::UtcOffset::UTC);
            assert_eq!(read.updated_at, expected, "written {written}");
            assert_eq!(
                tasks::task_events(&mut conn, new.id).unwrap()[0].at,
                expected
            );
        }
        // now() is already at the stored precision.
        let now = agentry_persistence::now();
        let new = new_task(&repo, now);
        tasks::create_task(&mut conn, &new, "created").unwrap();
        assert_eq!(tasks::get_task(&mut conn, new.id).unwrap().created_at, now);
    }

    // A task whose id already exists is refused, and the first one is left untouched.
    fn create_task_with_existing_id_is_refused(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let new = new_task(&repo, T0);
        let first = tasks::create_task(&mut conn, &new, "created").unwrap();
        let again = NewTask {
            title: "other".into(),
            ..new.clone()
        };
        let err = tasks::create_task(&mut conn, &again, "created").unwrap_err();
        assert!(err.is_unique_violation(), "{err:?}");
        assert_eq!(tasks::get_task(&mut conn, new.id).unwrap(), first);
        assert_eq!(tasks::task_events(&mut conn, new.id).unwrap().len(), 1);
        assert_eq!(task_count(db), 1);
    }

    // Unknown ids: get → NotFound, find → None.
    fn unknown_task_is_not_found(db) {
        let mut conn = db.conn().unwrap();
        let id = Uuid::new_v4();
        assert!(matches!(
            tasks::get_task(&mut conn, id),
            Err(DbError::NotFound)
        ));
        assert_eq!(tasks::find_task(&mut conn, id).unwrap(), None);
        assert_eq!(tasks::task_events(&mut conn, id).unwrap(), vec![]);
    }

    // Review subtasks are found through their parent, oldest first.
    fn review_tasks_are_listed_by_parent(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let parent = tasks::create_task(&mut conn, &new_task(&repo, T0), "created").unwrap();
        let review = |secs| NewTask {
            task_type: TaskType::Review,
            parent_task_id: Some(parent.id),
            ..new_task(&repo, at(secs))
        };
        let (r2, r1) = (review(20), review(10));
        tasks::create_task(&mut conn, &r2, "review launched").unwrap();
        tasks::create_task(&mut conn, &r1, "review launched").unwrap();
        tasks::create_task(&mut conn, &new_task(&repo, at(5)), "created").unwrap();
        let reviews = tasks::review_tasks(&mut conn, parent.id).unwrap();
        let ids: Vec<_> = reviews.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![r1.id, r2.id]);
        assert!(reviews.iter().all(|t| t.parent_task_id == Some(parent.id)));
        assert!(reviews.iter().all(|t| t.task_type == TaskType::Review));
        assert_eq!(tasks::review_tasks(&mut conn, r1.id).unwrap(), vec![]);
    }

    // First assignment of an issue creates and links the task; a second one (with another
    // new id) creates nothing and returns the first task.
    fn issue_task_is_created_once(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let first = issue_task(&repo, 12);
        let (task, created) = tasks::create_issue_task(&mut conn, &first, |_, _| Ok(())).unwrap();
        assert!(created);
        assert_eq!(task.id, first.id);
        assert_eq!(task.issue_number, Some(12));
        assert_eq!(task.state, TaskState::Queued);
        assert_eq!(
            tasks::task_events(&mut conn, first.id).unwrap()[0].reason,
            "issue assigned"
        );
        assert_eq!(
            tasks::linked_task(&mut conn, repo.id, 12).unwrap(),
            Some(task.clone())
        );

        let second = NewTask {
            title: "another title".into(),
            ..issue_task(&repo, 12)
        };
        assert_ne!(second.id, first.id);
        let (again, created) = tasks::create_issue_task(&mut conn, &second, |_, _| Ok(())).unwrap();
        assert!(!created);
        assert_eq!(again, task, "the first task, unchanged");
        assert_eq!(tasks::find_task(&mut conn, second.id).unwrap(), None);
        assert_eq!(task_count(db), 1);
        assert_eq!(row_count(db, "issue_links"), 1);
        assert_eq!(row_count(db, "task_events"), 1);

        // Still linked, whatever the task's state.
        tasks::transition_task(
            &mut conn,
            task.id,
            agentry_domain::Trigger::Cancel,
            &Default::default(),
            at(1),
        )
        .unwrap();
        let (again, created) =
            tasks::create_issue_task(&mut conn, &issue_task(&repo, 12), |_, _| Ok(())).unwrap();
        assert!(!created);
        assert_eq!(again.id, task.id);
        assert_eq!(again.state, TaskState::Cancelled);
        assert_eq!(task_count(db), 1);
    }

    // The link is per (repository, issue number): another issue or the same number in
    // another repository gets its own task.
    fn issue_link_is_per_repository_and_number(db) {
        let (a, b) = (repo(db), connect(db, "o", "other"));
        let mut conn = db.conn().unwrap();
        let mut ids = vec![];
        for new in [issue_task(&a, 1), issue_task(&a, 2), issue_task(&b, 1)] {
            let (task, created) = tasks::create_issue_task(&mut conn, &new, |_, _| Ok(())).unwrap();
            assert!(created);
            ids.push(task.id);
        }
        assert_eq!(
            tasks::linked_task(&mut conn, a.id, 1).unwrap().unwrap().id,
            ids[0]
        );
        assert_eq!(
            tasks::linked_task(&mut conn, a.id, 2).unwrap().unwrap().id,
            ids[1]
        );
        assert_eq!(
            tasks::linked_task(&mut conn, b.id, 1).unwrap().unwrap().id,
            ids[2]
        );
        assert_eq!(tasks::linked_task(&mut conn, b.id, 2).unwrap(), None);
        assert_eq!(task_count(db), 3);
    }

    // An issue task needs both a repository and an issue number; nothing is written otherwise.
    fn issue_task_without_repository_or_number_is_refused(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let no_number = NewTask {
            issue_number: None,
            ..issue_task(&repo, 1)
        };
        let no_repo = NewTask {
            repo_id: None,
            ..issue_task(&repo, 1)
        };
        for new in [no_number, no_repo] {
            let calls = AtomicUsize::new(0);
            let result = tasks::create_issue_task(&mut conn, &new, |_, _| {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            assert!(matches!(result, Err(DbError::Conflict(_))), "{result:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 0);
        }
        assert_eq!(task_count(db), 0);
    }

    // `in_tx` runs inside the creating transaction: it sees the new task, and its error
    // rolls back the task, its event and the link.
    fn issue_task_in_tx_error_rolls_everything_back(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let new = issue_task(&repo, 5);
        let result = tasks::create_issue_task(&mut conn, &new, |conn, task| {
            assert_eq!(task.id, new.id);
            // The task is visible inside the transaction...
            assert_eq!(
                tasks::get_task(conn, task.id).unwrap().state,
                TaskState::Queued
            );
            Err(DbError::Conflict("the outbox refused".into()))
        });
        assert!(
            matches!(&result, Err(DbError::Conflict(m)) if m == "the outbox refused"),
            "{result:?}"
        );
        // ...and gone afterwards, with its link and event.
        assert_eq!(tasks::find_task(&mut conn, new.id).unwrap(), None);
        assert_eq!(tasks::linked_task(&mut conn, repo.id, 5).unwrap(), None);
        assert_eq!(task_count(db), 0);
        assert_eq!(row_count(db, "issue_links"), 0);
        assert_eq!(row_count(db, "task_events"), 0);

        // The connection is usable and the issue can be assigned afterwards.
        let (task, created) =
            tasks::create_issue_task(&mut conn, &issue_task(&repo, 5), |_, _| Ok(())).unwrap();
        assert!(created);
        assert_eq!(
            tasks::linked_task(&mut conn, repo.id, 5)
                .unwrap()
                .unwrap()
                .id,
            task.id
        );
    }

    // `in_tx` runs exactly once, and only when the task is created now.
    fn issue_task_in_tx_runs_only_on_creation(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let calls = AtomicUsize::new(0);
        let count = |_: &mut agentry_persistence::AnyConnection, _: &agentry_domain::Task| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        assert!(
            tasks::create_issue_task(&mut conn, &issue_task(&repo, 9), count)
                .unwrap()
                .1
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(
            !tasks::create_issue_task(&mut conn, &issue_task(&repo, 9), count)
                .unwrap()
                .1
        );
        assert!(
            !tasks::create_issue_task(&mut conn, &issue_task(&repo, 9), count)
                .unwrap()
                .1
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    // 50 concurrent assignments of one issue, each on its own connection with its own new
    // id: exactly one task, exactly one `created`, everybody gets the same task, and the
    // `in_tx` effect happened once.
    fn concurrent_issue_assignments_create_exactly_one_task(db) {
        let repo = repo(db);
        let wide = wide_pool(db, 50);
        let effects = AtomicUsize::new(0);
        let results = race(&wide, 50, |_, conn| {
            tasks::create_issue_task(conn, &issue_task(&repo, 77), |_, _| {
                effects.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap()
        });
        let created: Vec<_> = results.iter().filter(|(_, c)| *c).collect();
        assert_eq!(created.len(), 1, "exactly one caller creates the task");
        let winner = created[0].0.id;
        assert!(
            results.iter().all(|(t, _)| t.id == winner),
            "all see the same task"
        );
        assert_eq!(effects.load(Ordering::SeqCst), 1);
        assert_eq!(task_count(db), 1);
        assert_eq!(row_count(db, "issue_links"), 1);
        assert_eq!(row_count(db, "task_events"), 1);
        let mut conn = db.conn().unwrap();
        assert_eq!(
            tasks::linked_task(&mut conn, repo.id, 77)
                .unwrap()
                .unwrap()
                .id,
            winner
        );
    }

    // Connecting a repository stores it with the default settings; connecting the same
    // (normalised) URL again returns the same repository, not a new one.
    fn connect_repository_is_idempotent_with_default_settings(db) {
        let mut conn = db.conn().unwrap();
        let new = new_repo("Org", "Repo");
        let (repo, created) = repos::connect_repository(&mut conn, &new, T0).unwrap();
        assert!(created);
        assert_eq!(repo.url.as_str(), "https://github.com/org/repo");
        assert_eq!(repo.default_branch, "main");
        assert_eq!(repo.clone_url, new.clone_url);
        assert_eq!(repo.codehost_id, Some(42));
        assert_eq!(repo.settings, RepoSettings::default());
        assert_eq!(
            (repo.connected_at, repo.created_at, repo.updated_at),
            (T0, T0, T0)
        );
        assert_eq!(repo.disconnected_at, None);
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), repo);

        let same_url = repos::NewRepository {
            url: RepoUrl::parse("git@github.com:ORG/repo.git").unwrap(),
            ..new_repo("org", "repo")
        };
        let (again, created) = repos::connect_repository(&mut conn, &same_url, at(60)).unwrap();
        assert!(!created);
        assert_eq!(again, repo, "the stored repository, unchanged");
        assert_eq!(row_count(db, "repositories"), 1);

        let found = repos::find_by_url(
            &mut conn,
            &RepoUrl::parse("https://github.com/org/repo/").unwrap(),
        )
        .unwrap();
        assert_eq!(found, Some(repo.clone()));
        assert_eq!(
            repos::find_by_url(
                &mut conn,
                &RepoUrl::parse("https://github.com/org/nope").unwrap()
            )
            .unwrap(),
            None
        );
        assert!(matches!(
            repos::get_repository(&mut conn, Uuid::new_v4()),
            Err(DbError::NotFound)
        ));

        let (other, created) =
            repos::connect_repository(&mut conn, &new_repo("a", "b"), at(1)).unwrap();
        assert!(created);
        assert_ne!(other.id, repo.id);
        let listed: Vec<_> = repos::list_connected(&mut conn)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, vec![other.id, repo.id], "ordered by URL");
    }

    // Concurrent connects of one URL store one repository and all return its id.
    fn concurrent_connects_store_one_repository(db) {
        let wide = wide_pool(db, 10);
        let results = race(&wide, 10, |_, conn| {
            repos::connect_repository(conn, &new_repo("o", "r"), T0).unwrap()
        });
        assert_eq!(results.iter().filter(|(_, c)| *c).count(), 1);
        assert!(results.iter().all(|(r, _)| r.id == results[0].0.id));
        assert_eq!(row_count(db, "repositories"), 1);
    }
}
