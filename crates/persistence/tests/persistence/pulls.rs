//! Pull-request tracking (docs/contract.md#55-pull-request-tracking–#56-webhook): the repositories to poll and their poll state, the
//! task of a pull request, and applying a pull request's fate (transition + closing effect in
//! one transaction, exactly once among concurrent actors).

use crate::common::*;
use agentry_domain::{AgentType, RepoUrl, Task, TaskState, TaskType, Trigger};
use agentry_persistence::outbox::{self, Action};
use agentry_persistence::pulls::{self, CLOSED_WITHOUT_MERGE, PullPollState};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::tasks::{self, ImportTask, TransitionDetails};
use agentry_persistence::{AnyConnection, Db, DbError, runner, webhooks, write_tx};
use uuid::Uuid;

/// The ids of the repositories `repos_to_poll` lists, in its order.
fn polled(db: &Db) -> Vec<Uuid> {
    let mut conn = db.conn().unwrap();
    pulls::repos_to_poll(&mut conn)
        .unwrap()
        .into_iter()
        .map(|(repo, _)| repo.id)
        .collect()
}

/// A coding task on `repo` waiting in `pr_opened` on pull request `pr_number`, linked to
/// issue `issue` if given.
fn waiting(db: &Db, repo: &Repository, issue: Option<i64>, pr_number: i64) -> Task {
    let task = match issue {
        Some(n) => link_issue(db, repo, n),
        None => create(db, repo, T0),
    };
    open_pull(db, &task, pr_number)
}

fn merge(conn: &mut AnyConnection, task: &Task, secs: i64) -> Result<Option<Task>, DbError> {
    pulls::apply_pull_outcome(
        conn,
        task.id,
        Trigger::PullRequestMerged,
        "merge seen by the poller",
        None,
        at(secs),
    )
}

/// Completes `task` (in `pr_opened`) without going through `apply_pull_outcome`.
fn complete(db: &Db, task: &Task) {
    let mut conn = db.conn().unwrap();
    tasks::transition_task(
        &mut conn,
        task.id,
        Trigger::PullRequestMerged,
        &TransitionDetails::default(),
        at(5),
    )
    .unwrap();
}

agentry_persistence::backend_tests! {
    // Only connected repositories with a task in pr_opened are polled, by URL, each once;
    // one drops out when its last waiting task moves on.
    fn repos_to_poll_lists_connected_repositories_with_pr_opened_tasks(db) {
        assert!(polled(db).is_empty());
        let zeta = connect(db, "o", "zeta");
        let alpha = connect(db, "o", "alpha");
        let idle = connect(db, "o", "idle");
        let done = connect(db, "o", "done");
        let gone = connect(db, "o", "gone");
        let _empty = connect(db, "o", "empty");

        let z1 = waiting(db, &zeta, None, 1);
        waiting(db, &zeta, Some(4), 2);
        let a1 = waiting(db, &alpha, Some(7), 17);
        create(db, &idle, T0); // queued
        let d1 = waiting(db, &done, None, 3);
        complete(db, &d1);
        waiting(db, &gone, None, 4);
        let mut conn = db.conn().unwrap();
        repos::disconnect_repository(&mut conn, gone.id, at(9)).unwrap();

        let listed = pulls::repos_to_poll(&mut conn).unwrap();
        let ids: Vec<Uuid> = listed.iter().map(|(r, _)| r.id).collect();
        assert_eq!(ids, vec![alpha.id, zeta.id]);
        assert_eq!(listed[0].0, repos::get_repository(&mut conn, alpha.id).unwrap());
        // Never polled: no ETag, no watermark; a first poll starts a day before the oldest
        // waiting task.
        let first = PullPollState { first_since: Some(T0 - time::Duration::DAY), ..PullPollState::default() };
        assert!(listed.iter().all(|(_, state)| *state == first), "{listed:?}");

        // Alpha's only waiting task is merged: alpha is no longer polled.
        assert!(merge(&mut conn, &a1, 10).unwrap().is_some());
        assert_eq!(polled(db), vec![zeta.id]);
        // Zeta still has one waiting task after the first is closed.
        pulls::apply_pull_outcome(&mut conn, z1.id, Trigger::PullRequestClosed, "closed", None, at(10))
            .unwrap()
            .unwrap();
        assert_eq!(polled(db), vec![zeta.id]);
        // Reconnecting the disconnected repository brings it back.
        repos::connect_repository(&mut conn, &new_repo("o", "gone"), at(11)).unwrap();
        assert_eq!(polled(db), vec![gone.id, zeta.id]);
    }

    // A task in a revision round waits on its pull request as one in pr_opened does: its
    // repository is polled (a merge or close ends the round), a never-polled one from a day
    // before it, whether the round is queued or its agent runs; a merge ends the round and
    // closes the issue. A task retried after its pull request closed is in no round.
    fn a_revision_round_waits_on_its_pull_request(db) {
        let repo = repo(db);
        let other = connect(db, "o", "other");
        let task = waiting(db, &repo, Some(7), 17);
        let mut conn = db.conn().unwrap();
        let revise = |conn: &mut AnyConnection, task: &Task| {
            tasks::transition_task(conn, task.id, Trigger::RevisionRequested, &TransitionDetails::default(), at(5))
                .unwrap()
                .0
        };
        let round = revise(&mut conn, &task);
        assert_eq!((round.state, round.revision().is_some()), (TaskState::Queued, true));
        let first = PullPollState { first_since: Some(T0 - time::Duration::DAY), ..PullPollState::default() };
        let listed = pulls::repos_to_poll(&mut conn).unwrap();
        assert_eq!(listed.iter().map(|(r, s)| (r.id, s.clone())).collect::<Vec<_>>(), vec![(repo.id, first.clone())]);
        assert_eq!(pulls::pull_poll_state(&mut conn, repo.id).unwrap(), first);
        // Claimed, its agent started: still waiting.
        let claimed = runner::claim_next(&mut conn, "runner-1", at(6), time::Duration::minutes(5)).unwrap().unwrap();
        assert_eq!(claimed.id, task.id);
        tasks::transition_task(&mut conn, task.id, Trigger::AgentStarted, &TransitionDetails::default(), at(6)).unwrap();
        assert_eq!(polled(db), vec![repo.id]);
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 17).unwrap().map(|t| t.state), Some(TaskState::Running));
        // The merge ends the round: completed, its issue closed; nothing waits any more.
        let after = merge(&mut conn, &round, 10).unwrap().unwrap();
        assert_eq!(after.state, TaskState::Completed);
        let closes: Vec<Action> = outbox::effects_of_task(&mut conn, task.id)
            .unwrap()
            .into_iter()
            .map(|e| e.action)
            .filter(|a| matches!(a, Action::CloseIssue { .. }))
            .collect();
        assert_eq!(closes, vec![Action::CloseIssue { issue_number: 7 }]);
        assert!(polled(db).is_empty());

        // Closed without merge, then retried: queued again, but in no round.
        let closed = waiting(db, &other, None, 3);
        pulls::apply_pull_outcome(&mut conn, closed.id, Trigger::PullRequestClosed, "closed", None, at(11))
            .unwrap()
            .unwrap();
        let retried = tasks::transition_task(&mut conn, closed.id, Trigger::Retry, &TransitionDetails::default(), at(12))
            .unwrap()
            .0;
        assert_eq!((retried.state, retried.revision()), (TaskState::Queued, None));
        assert!(polled(db).is_empty());
    }

    // The poll state is stored as given (microseconds kept), read back by repos_to_poll and
    // pull_poll_state, cleared by None, and leaves the repository itself unchanged.
    fn record_pull_poll_round_trips(db) {
        let repo = repo(db);
        let other = connect(db, "o", "other");
        waiting(db, &repo, None, 1);
        waiting(db, &other, None, 1);
        let mut conn = db.conn().unwrap();
        let before = repos::get_repository(&mut conn, repo.id).unwrap();

        pulls::record_pull_poll(&mut conn, repo.id, Some("W/\"abc\""), Some(at(30))).unwrap();
        let expected = PullPollState { etag: Some("W/\"abc\"".into()), watermark: Some(at(30)), first_since: None };
        assert_eq!(pulls::pull_poll_state(&mut conn, repo.id).unwrap(), expected);
        let listed = pulls::repos_to_poll(&mut conn).unwrap();
        let state_of = |id: Uuid| listed.iter().find(|(r, _)| r.id == id).unwrap().1.clone();
        assert_eq!(state_of(repo.id), expected);
        // Never polled: the first poll starts a day before its oldest waiting task.
        let first = PullPollState { first_since: Some(T0 - time::Duration::DAY), ..PullPollState::default() };
        assert_eq!(state_of(other.id), first);
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), before);
        // The issue-sync state is separate.
        let issue_states = repos::issue_sync_states(&mut conn).unwrap();
        assert!(issue_states.iter().all(|(_, s)| s.etag.is_none()));

        // A later poll replaces both; None clears.
        pulls::record_pull_poll(&mut conn, repo.id, None, Some(at(60))).unwrap();
        assert_eq!(
            pulls::pull_poll_state(&mut conn, repo.id).unwrap(),
            PullPollState { etag: None, watermark: Some(at(60)), first_since: None }
        );
        pulls::record_pull_poll(&mut conn, repo.id, Some("\"x\""), None).unwrap();
        assert_eq!(
            pulls::pull_poll_state(&mut conn, repo.id).unwrap(),
            PullPollState { etag: Some("\"x\"".into()), watermark: None, first_since: Some(T0 - time::Duration::DAY) }
        );

        let unknown = Uuid::new_v4();
        assert!(matches!(
            pulls::record_pull_poll(&mut conn, unknown, Some("e"), Some(at(1))),
            Err(DbError::NotFound)
        ));
        assert!(matches!(pulls::pull_poll_state(&mut conn, unknown), Err(DbError::NotFound)));
    }

    // The coding task of (repository, number); not another repository's, not a review task
    // carrying the same number, never imported history (not even a newer one waiting in
    // pr_opened), and the waiting task before an older one with that number.
    fn task_of_pull_finds_the_coding_task(db) {
        let repo = repo(db);
        let other = connect(db, "o", "other");
        let mut conn = db.conn().unwrap();
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 17).unwrap(), None);

        let task = waiting(db, &repo, Some(7), 17);
        waiting(db, &other, None, 18);
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 17).unwrap(), Some(task.clone()));
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 18).unwrap(), None);
        assert_eq!(pulls::task_of_pull(&mut conn, other.id, 17).unwrap(), None);
        assert_eq!(pulls::task_of_pull(&mut conn, Uuid::new_v4(), 17).unwrap(), None);

        // Imported history: a review task and a newer, finished coding task with number 17.
        let imported = |task_type, state, minutes: i64| ImportTask {
            id: Uuid::new_v4(),
            title: "history".into(),
            repo_url: RepoUrl::parse("https://github.com/o/r").unwrap(),
            task_type,
            state,
            agent_type: AgentType::ClaudeCode,
            model_used: None,
            cost_usd: None,
            input_tokens: 0,
            output_tokens: 0,
            created_at: at(60 * minutes),
            pr_url: Some("https://github.com/o/r/pull/17".into()),
            pr_number: Some(17),
            issue_number: None,
        };
        let review = imported(TaskType::Review, TaskState::PrOpened, 10);
        let finished = imported(TaskType::Coding, TaskState::Completed, 20);
        let waiting_history = imported(TaskType::Coding, TaskState::PrOpened, 30);
        tasks::import_tasks::<DbError, _>(
            &mut conn,
            [Ok(review.clone()), Ok(finished.clone()), Ok(waiting_history.clone())],
        )
        .unwrap();
        assert_eq!(tasks::get_task(&mut conn, review.id).unwrap().repo_id, Some(repo.id));
        assert_eq!(tasks::get_task(&mut conn, waiting_history.id).unwrap().repo_id, Some(repo.id));
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 17).unwrap(), Some(task.clone()));
        // Once the waiting task is done too, it is still the answer: imported history never is.
        complete(db, &task);
        assert_eq!(pulls::task_of_pull(&mut conn, repo.id, 17).unwrap().unwrap().id, task.id);
        // A repository whose only task with the number is history has none.
        let only_history = ImportTask {
            id: Uuid::new_v4(),
            repo_url: RepoUrl::parse("https://github.com/o/other").unwrap(),
            ..waiting_history
        };
        tasks::import_tasks::<DbError, _>(&mut conn, [Ok(only_history)]).unwrap();
        assert_eq!(pulls::task_of_pull(&mut conn, other.id, 17).unwrap(), None);
    }

    // Imported history in pr_opened is waiting on nothing: its repository is not polled for
    // it, and a first poll starts from the live tasks only.
    fn imported_history_is_not_polled(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let history = ImportTask {
            id: Uuid::new_v4(),
            title: "history".into(),
            repo_url: RepoUrl::parse("https://github.com/o/r").unwrap(),
            task_type: TaskType::Coding,
            state: TaskState::PrOpened,
            agent_type: AgentType::ClaudeCode,
            model_used: None,
            cost_usd: None,
            input_tokens: 0,
            output_tokens: 0,
            created_at: T0 - time::Duration::days(10),
            pr_url: Some("https://github.com/o/r/pull/5".into()),
            pr_number: Some(5),
            issue_number: Some(3),
        };
        tasks::import_tasks::<DbError, _>(&mut conn, [Ok(history)]).unwrap();
        assert!(polled(db).is_empty());

        // A live task waits too: the repository is polled, from a day before the live task.
        waiting(db, &repo, None, 6);
        let first = PullPollState { first_since: Some(T0 - time::Duration::DAY), ..PullPollState::default() };
        let listed = pulls::repos_to_poll(&mut conn).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].0.id, &listed[0].1), (repo.id, &first));
        assert_eq!(pulls::pull_poll_state(&mut conn, repo.id).unwrap(), first);
    }

    // A merge: completed with its event, and exactly one close_issue effect for the issue,
    // due at once. A second apply (merged or closed) changes nothing.
    fn merge_completes_the_task_and_closes_its_issue(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, Some(7), 17);
        let mut conn = db.conn().unwrap();
        let after = merge(&mut conn, &task, 10).unwrap().unwrap();
        assert_eq!(after.state, TaskState::Completed);
        assert_eq!(after.finished_at, Some(at(10)));
        assert_eq!(after.updated_at, at(10));
        assert_eq!(after.error_message, None);
        assert_eq!(after.pr_number, Some(17));
        assert_eq!(after, tasks::get_task(&mut conn, task.id).unwrap());

        let events = tasks::task_events(&mut conn, task.id).unwrap();
        let last = events.last().unwrap();
        assert_eq!(
            (last.from, last.to, last.reason.as_str(), last.at),
            (Some(TaskState::PrOpened), TaskState::Completed, "merge seen by the poller", at(10))
        );
        let effects = outbox::effects_of_task(&mut conn, task.id).unwrap();
        assert_eq!(effects.len(), 1);
        let effect = &effects[0];
        assert_eq!(effect.action, Action::CloseIssue { issue_number: 7 });
        assert_eq!(effect.repo_id, repo.id);
        assert_eq!(effect.next_attempt_at, at(10));
        assert_eq!(effect.delivered_at, None);

        // Seen again (by the webhook, by the poller on the next round): nothing more.
        let reason = "merge seen by a webhook";
        assert_eq!(
            pulls::apply_pull_outcome(&mut conn, task.id, Trigger::PullRequestMerged, reason, None, at(20)).unwrap(),
            None
        );
        assert_eq!(
            pulls::apply_pull_outcome(&mut conn, task.id, Trigger::PullRequestClosed, "closed", Some("x"), at(20)).unwrap(),
            None
        );
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap(), after);
        assert_eq!(tasks::task_events(&mut conn, task.id).unwrap(), events);
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap(), effects);
        assert_eq!(row_count(db, "outbox"), 1);
    }

    // Closed without merge: failed with the given message (or the default), no effect.
    fn close_fails_the_task_without_effect(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, Some(7), 17);
        let plain = waiting(db, &repo, Some(8), 18);
        let mut conn = db.conn().unwrap();
        let message = "pull request #17 was closed without being merged";
        let after = pulls::apply_pull_outcome(
            &mut conn, task.id, Trigger::PullRequestClosed, "close seen by the poller", Some(message), at(10),
        )
        .unwrap()
        .unwrap();
        assert_eq!(after.state, TaskState::Failed);
        assert_eq!(after.error_message.as_deref(), Some(message));
        assert_eq!(after.finished_at, Some(at(10)));
        let last = tasks::task_events(&mut conn, task.id).unwrap().pop().unwrap();
        assert_eq!(
            (last.from, last.to, last.reason.as_str()),
            (Some(TaskState::PrOpened), TaskState::Failed, "close seen by the poller")
        );
        assert!(outbox::effects_of_task(&mut conn, task.id).unwrap().is_empty());

        let after = pulls::apply_pull_outcome(
            &mut conn, plain.id, Trigger::PullRequestClosed, "closed", None, at(11),
        )
        .unwrap()
        .unwrap();
        assert_eq!(after.error_message.as_deref(), Some(CLOSED_WITHOUT_MERGE));
        assert_eq!(row_count(db, "outbox"), 0);
    }

    // A merged task without an issue completes with no effect.
    fn merge_without_issue_writes_no_effect(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, None, 17);
        let mut conn = db.conn().unwrap();
        let after = merge(&mut conn, &task, 10).unwrap().unwrap();
        assert_eq!(after.state, TaskState::Completed);
        assert_eq!(row_count(db, "outbox"), 0);
    }

    // A task not in pr_opened: Ok(None), nothing written. Unknown task: NotFound. A trigger
    // that is no pull-request outcome: refused before anything is read.
    fn apply_refuses_what_is_not_waiting(db) {
        let repo = repo(db);
        let queued = link_issue(db, &repo, 7);
        let mut conn = db.conn().unwrap();
        let events = tasks::task_events(&mut conn, queued.id).unwrap();
        assert_eq!(merge(&mut conn, &queued, 10).unwrap(), None);
        assert_eq!(
            pulls::apply_pull_outcome(&mut conn, queued.id, Trigger::PullRequestClosed, "c", None, at(10)).unwrap(),
            None
        );
        assert_eq!(tasks::get_task(&mut conn, queued.id).unwrap(), queued);
        assert_eq!(tasks::task_events(&mut conn, queued.id).unwrap(), events);
        assert_eq!(row_count(db, "outbox"), 0);

        let unknown = Task { id: Uuid::new_v4(), ..queued.clone() };
        assert!(matches!(merge(&mut conn, &unknown, 10), Err(DbError::NotFound)));

        let task = waiting(db, &repo, Some(8), 17);
        for trigger in [Trigger::Cancel, Trigger::Fail, Trigger::PullRequestOpened] {
            assert!(matches!(
                pulls::apply_pull_outcome(&mut conn, task.id, trigger, "r", None, at(10)),
                Err(DbError::Conflict(_))
            ));
        }
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::PrOpened);
    }

    // Inside a caller's transaction: the effect and the transition roll back with it; a
    // refused apply (Ok(None)) leaves the caller's transaction usable (PostgreSQL included).
    fn apply_nests_in_the_callers_transaction(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, Some(7), 17);
        let queued = link_issue(db, &repo, 8);
        let mut conn = db.conn().unwrap();
        let failed: Result<(), DbError> = write_tx(&mut conn, |conn| {
            assert!(merge(conn, &task, 10)?.is_some());
            assert_eq!(outbox::effects_of_task(conn, task.id)?.len(), 1);
            Err(DbError::Conflict("the caller gives up".into()))
        });
        assert!(matches!(failed, Err(DbError::Conflict(_))));
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::PrOpened);
        assert_eq!(row_count(db, "outbox"), 0);
        assert_eq!(tasks::task_events(&mut conn, task.id).unwrap().len(), 4);

        write_tx::<_, DbError, _>(&mut conn, |conn| {
            assert!(webhooks::record_delivery(conn, "d-1", "pull_request", Some("closed"), at(10))?);
            assert_eq!(merge(conn, &queued, 10)?, None);
            assert!(merge(conn, &task, 10)?.is_some());
            Ok(())
        })
        .unwrap();
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::Completed);
        assert_eq!(outbox::effects_of_task(&mut conn, task.id).unwrap().len(), 1);
        assert!(webhooks::find_delivery(&mut conn, "d-1").unwrap().is_some());
    }

    // Many actors apply the same merge at once (poller, webhook, replicas): exactly one
    // applies it; one event, one effect.
    fn concurrent_merges_apply_once(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, Some(7), 17);
        let n = 8;
        let wide = wide_pool(db, n as u32);
        let results = race(&wide, n, |i, conn| {
            let trigger = if i % 2 == 0 { Trigger::PullRequestMerged } else { Trigger::PullRequestClosed };
            pulls::apply_pull_outcome(conn, task.id, trigger, &format!("actor {i}"), None, at(10 + i as i64))
        });
        let applied: Vec<(usize, Task)> = results
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| r.unwrap().map(|t| (i, t)))
            .collect();
        assert_eq!(applied.len(), 1, "{applied:?}");
        let (winner, after) = &applied[0];
        let mut conn = db.conn().unwrap();
        assert_eq!(&tasks::get_task(&mut conn, task.id).unwrap(), after);
        let events = tasks::task_events(&mut conn, task.id).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(events[4].reason, format!("actor {winner}"));
        let effects = outbox::effects_of_task(&mut conn, task.id).unwrap();
        if winner % 2 == 0 {
            assert_eq!(after.state, TaskState::Completed);
            assert_eq!(effects.len(), 1);
            assert_eq!(effects[0].action, Action::CloseIssue { issue_number: 7 });
        } else {
            assert_eq!(after.state, TaskState::Failed);
            assert!(effects.is_empty());
        }
    }

    // Only merges racing: exactly one Some, exactly one close_issue effect.
    fn concurrent_identical_merges_close_the_issue_once(db) {
        let repo = repo(db);
        let task = waiting(db, &repo, Some(7), 17);
        let n = 8;
        let wide = wide_pool(db, n as u32);
        let results = race(&wide, n, |i, conn| merge(conn, &task, 10 + i as i64).unwrap());
        assert_eq!(results.iter().filter(|r| r.is_some()).count(), 1);
        let mut conn = db.conn().unwrap();
        assert_eq!(tasks::get_task(&mut conn, task.id).unwrap().state, TaskState::Completed);
        assert_eq!(tasks::task_events(&mut conn, task.id).unwrap().len(), 5);
        assert_eq!(row_count(db, "outbox"), 1);
    }
}
