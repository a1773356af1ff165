//! Pull-request tracking by the poller, against the fake GitHub on 127.0.0.1: one
//! conditional request per repository, the watermark moved only after success, merges and
//! closes applied once, and old webhook delivery ids forgotten
//! (docs/contract.md#55-pull-request-tracking, #22-states-and-transitions). The webhook,
//! which is HTTP, is tested in `agentry-api`.

use std::time::Duration;

use agentry_codehost::webhook::{RepoRef, WebhookEvent};
use agentry_domain::TaskState;
use agentry_fake_github::Fault;
use agentry_persistence::revisions::{self, FeedbackOutcome, FeedbackSource, NewFeedback};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{pulls, tasks};
use agentry_service::revisions::Considered;
use agentry_service::tracking::WebhookOutcome;
use uuid::Uuid;

use crate::rig::HostEnv;

const PULLS: &str = "/repos/{o}/{r}/pulls";

/// `acme/web` connected, with issues A and B, each the issue of a task that opened a pull
/// request (`Fix A`, `Fix B`): the environment and (task, issue, pull request) of each.
fn two_pulls(db: TestDb) -> (HostEnv, [(agentry_domain::Task, u64, u64); 2]) {
    let env = HostEnv::new(db);
    let repo = env.repo(env.store_token_and_connect());
    let made = ["A", "B"].map(|name| {
        let issue = env.fake.add_issue("acme", "web", name, None, &[]);
        let branch = format!("agentry/task-{}", name.to_lowercase());
        let pr = env
            .fake
            .add_pull("acme", "web", &format!("Fix {name}"), &branch, "main");
        (issue, pr)
    });
    let tasks = made.map(|(issue, pr)| (env.task_with_pull(&repo, issue, pr), issue, pr));
    (env, tasks)
}

async fn the_poller_completes_merged_tasks_fails_closed_ones_and_closes_the_issue_once(db: TestDb) {
    let (env, [(a, issue_a, pr_a), (b, issue_b, pr_b)]) = two_pulls(db);

    // Open pull requests: nothing happens; then an unchanged poll is one 304.
    let first = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(first[0].1.applied, 0);
    env.fake.reset_counts();
    let again = env.service.poll_pull_requests().await.unwrap();
    assert!(again[0].1.unchanged);
    assert_eq!(env.fake.requests().len(), 1);
    assert_eq!(env.fake.count_status(304), 1);

    env.fake.advance_clock(Duration::from_secs(60));
    env.fake.merge_pull("acme", "web", pr_a);
    env.fake.close_pull("acme", "web", pr_b);
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 2, "{polled:?}");
    let (a, b) = (env.task(a.id), env.task(b.id));
    assert_eq!(
        (a.state, b.state),
        (TaskState::Completed, TaskState::Failed)
    );
    assert!(a.finished_at.is_some());
    assert!(
        b.error_message
            .unwrap()
            .contains("closed without being merged")
    );
    assert_eq!(
        env.events(a.id).last().unwrap().2,
        "pull request merged (seen by the poller)"
    );
    assert_eq!((env.close_effects(a.id), env.close_effects(b.id)), (1, 0));

    // The outbox closes the merged task's issue, once; the other stays open.
    env.deliver(0).await;
    assert_eq!(
        env.fake.issue("acme", "web", issue_a).unwrap().state,
        "closed"
    );
    assert_eq!(
        env.fake.issue("acme", "web", issue_b).unwrap().state,
        "open"
    );
    assert_eq!(env.fake.count("PATCH", "/repos/{o}/{r}/issues/{n}"), 1);

    // No task is left in pr_opened: the repository is no longer polled.
    env.fake.reset_counts();
    let idle = env.service.poll_pull_requests().await.unwrap();
    assert!(idle.is_empty());
    assert_eq!(env.fake.requests().len(), 0);
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    the_poller_completes_merged_tasks_fails_closed_ones_and_closes_the_issue_once
);

/// A repository's first poll starts a day before its oldest waiting task, not at the
/// beginning of its pull-request history: 250 older closed pull requests cost no extra page.
#[tokio::test]
async fn a_first_poll_does_not_read_the_whole_history() {
    let env = HostEnv::new(TestDb::sqlite());
    let repo = env.repo(env.store_token_and_connect());
    for i in 0..250 {
        let n = env
            .fake
            .add_pull("acme", "web", "Old", &format!("old/{i}"), "main");
        env.fake.close_pull("acme", "web", n);
    }
    env.fake.advance_clock(Duration::from_secs(2 * 86_400));
    let issue = env.fake.add_issue("acme", "web", "A", None, &[]);
    let pr = env
        .fake
        .add_pull("acme", "web", "Fix A", "agentry/task-a", "main");
    let later = agentry_persistence::now() + time::Duration::days(2);
    let task = env.task_with_pull_at(&repo, issue, pr, later);
    env.fake.reset_counts();
    env.service.poll_pull_requests().await.unwrap();
    assert_eq!(env.fake.count("GET", PULLS), 1, "{:?}", env.fake.requests());

    env.fake.advance_clock(Duration::from_secs(60));
    env.fake.merge_pull("acme", "web", pr);
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 1);
    assert_eq!(env.task(task.id).state, TaskState::Completed);
}

#[tokio::test]
async fn a_failed_poll_does_not_move_the_watermark_and_the_merge_is_seen_later() {
    let env = HostEnv::new(TestDb::sqlite());
    let repo = env.repo(env.store_token_and_connect());
    let issue = env.fake.add_issue("acme", "web", "A", None, &[]);
    let pr = env
        .fake
        .add_pull("acme", "web", "Fix A", "agentry/task-a", "main");
    let task = env.task_with_pull(&repo, issue, pr);
    env.service.poll_pull_requests().await.unwrap();

    env.fake.advance_clock(Duration::from_secs(60));
    env.fake.merge_pull("acme", "web", pr);
    env.fake
        .fail_next(Some(("GET", PULLS)), 10, Fault::Status(502));
    let failed = env.service.poll_pull_requests().await.unwrap();
    assert!(failed[0].1.error.is_some());
    assert_eq!(env.task(task.id).state, TaskState::PrOpened);
    // Later polls, once the code host is back: the merge is not lost.
    env.fake.clear_faults();
    env.fake.advance_clock(Duration::from_secs(60));
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 1);
    assert_eq!(env.task(task.id).state, TaskState::Completed);
}

async fn delivery_ids_older_than_a_week_are_forgotten(db: TestDb) {
    use agentry_persistence::webhooks::{find_delivery, record_delivery};
    use agentry_service::tracking::DELIVERY_RETENTION;
    let env = HostEnv::new(db);
    let now = agentry_persistence::now();
    {
        let mut conn = env.db().conn().unwrap();
        for (id, age) in [
            ("old", DELIVERY_RETENTION + time::Duration::hours(1)),
            ("recent", time::Duration::days(3)),
            ("new", time::Duration::ZERO),
        ] {
            assert!(record_delivery(&mut conn, id, "ping", None, now - age).unwrap());
        }
    }
    assert_eq!(env.service.forget_old_deliveries(now).await.unwrap(), 1);
    let mut conn = env.db().conn().unwrap();
    assert!(find_delivery(&mut conn, "old").unwrap().is_none());
    assert!(find_delivery(&mut conn, "recent").unwrap().is_some());
    assert!(find_delivery(&mut conn, "new").unwrap().is_some());
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    delivery_ids_older_than_a_week_are_forgotten
);

/// With 100 open agentry pull requests and no new comment, a poll cycle is one request for
/// the repository (a 304), whatever the revisions; a new mention on one of them costs that
/// pull request's reviews, comments and review comments, and its author's permission.
async fn a_quiet_poll_costs_one_request_per_repository_with_revisions_on(db: TestDb) {
    let env = HostEnv::new(db);
    let repo = env.repo(env.store_token_and_connect());
    let mut pulls = Vec::new();
    for i in 0..100 {
        let issue = env
            .fake
            .add_issue("acme", "web", &format!("Issue {i}"), None, &[]);
        let pr = env
            .fake
            .add_pull("acme", "web", "Fix", &format!("agentry/task-{i}"), "main");
        env.task_with_pull(&repo, issue, pr);
        pulls.push(pr);
    }
    // The first poll reads every pull request's feedback once. Then one more change a
    // minute later moves the watermark to a second of its own (the 100 were made within
    // a second or two, and a poll reads again what was updated in the 5 s before its
    // watermark).
    env.service.poll_pull_requests().await.unwrap();
    env.fake.advance_clock(Duration::from_secs(60));
    env.fake
        .add_comment("acme", "web", pulls[0], "bob", "Looks good.");
    env.service.poll_pull_requests().await.unwrap();
    env.fake.reset_counts();
    for _ in 0..3 {
        let again = env.service.poll_pull_requests().await.unwrap();
        assert!(again[0].1.unchanged, "{again:?}");
    }
    assert_eq!(env.fake.requests().len(), 3, "{:?}", env.fake.requests());

    env.fake.set_permission("acme", "web", "alice", "write");
    env.fake.advance_clock(Duration::from_secs(60));
    env.fake
        .add_comment("acme", "web", pulls[42], "alice", "@agentry add a test");
    env.fake.reset_counts();
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert!(polled[0].1.error.is_none(), "{polled:?}");
    let sent: Vec<String> = env
        .fake
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.route.as_deref().unwrap_or(&r.path)))
        .collect();
    // The list; the reviews, comments and review comments of the two pull requests
    // updated since 5 s before the watermark (that one, and the one that set the
    // watermark, a minute earlier, which the overlap reads again); agentry's own login
    // (asked once per process) and alice's permission.
    let per_pull = env
        .fake
        .count("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews");
    assert_eq!(per_pull, 2, "{sent:?}");
    assert_eq!(sent.len(), 1 + 3 * 2 + 2, "{sent:?}");
    assert_eq!(env.fake.count("GET", "/user"), 1, "{sent:?}");
    assert_eq!(env.fake.count("GET", PULLS), 1, "{sent:?}");
    let task = tasks::find_task(&mut env.db().conn().unwrap(), {
        agentry_persistence::pulls::task_of_pull(
            &mut env.db().conn().unwrap(),
            repo.id,
            i64::try_from(pulls[42]).unwrap(),
        )
        .unwrap()
        .unwrap()
        .id
    })
    .unwrap()
    .unwrap();
    let feedback =
        agentry_persistence::revisions::of_task(&mut env.db().conn().unwrap(), task.id).unwrap();
    assert_eq!(feedback.len(), 1);
    assert_eq!(feedback[0].author, "alice");
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_quiet_poll_costs_one_request_per_repository_with_revisions_on
);

/// A merge of pull request `number` of `acme/web` as a webhook delivers it.
fn merged(number: u64) -> WebhookEvent {
    WebhookEvent::PullRequestClosed {
        repo: acme_web(),
        number,
        merged: true,
        merged_at: Some(agentry_persistence::now()),
        html_url: format!("https://github.com/acme/web/pull/{number}"),
        head_ref: "some-branch".into(),
    }
}

/// `acme/web` as a webhook names it.
fn acme_web() -> RepoRef {
    RepoRef {
        owner: "acme".into(),
        name: "web".into(),
        html_url: "https://github.com/acme/web".into(),
    }
}

/// Imported history is not tracked (docs/contract.md#39-import): its repository is not
/// polled for it, a merge of the number an imported task in `pr_opened` carries moves
/// nothing and closes no issue, a writer's mention on that pull request starts nothing, and
/// feedback recorded for it before starts no round. A live task with the same number is the
/// one the merge completes.
async fn imported_history_is_not_tracked_or_revised(db: TestDb) {
    let env = HostEnv::new(db);
    let repo = env.repo(env.store_token_and_connect());
    let id = Uuid::new_v4();
    let created = (agentry_persistence::now() - time::Duration::days(3))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let line = format!(
        r#"{{"id":"{id}","title":"Old fix","repoUrl":"https://github.com/acme/web","taskType":"coding","state":"pr_opened","costUsd":"1.5","inputTokens":1,"outputTokens":1,"createdAt":"{created}","prUrl":"https://github.com/acme/web/pull/7","issueNumber":3}}"#
    );
    let outcome = env.service.import(line.into_bytes()).await.unwrap();
    assert_eq!(outcome.imported, 1);
    let before = env.task(id);
    assert!(before.imported);
    assert_eq!(
        (
            before.state,
            before.repo_id,
            before.pr_number,
            before.issue_number
        ),
        (TaskState::PrOpened, Some(repo.id), Some(7), Some(3))
    );

    // Nothing to poll: the only task in pr_opened is history.
    env.fake.reset_counts();
    assert!(env.service.poll_pull_requests().await.unwrap().is_empty());
    assert_eq!(env.fake.requests().len(), 0);

    // A merge of #7: the delivery is recorded and ignored; the task keeps its state and no
    // effect (closing issue #3) is queued.
    let outcome = env
        .service
        .webhook_event("d-1".into(), "pull_request".into(), merged(7))
        .await
        .unwrap();
    assert_eq!(outcome, WebhookOutcome::Ignored);
    assert_eq!(env.task(id), before);
    assert_eq!(env.count("outbox"), 0);

    // A writer's mention on #7 is not for agentry.
    env.fake.set_permission("acme", "web", "alice", "write");
    let mention = WebhookEvent::IssueCommentCreated {
        repo: acme_web(),
        issue_number: 7,
        is_pull_request: true,
        comment_id: 41,
        author: "alice".into(),
        body: "@agentry please fix the tests".into(),
        html_url: "https://github.com/acme/web/pull/7#issuecomment-41".into(),
    };
    let considered = env.service.feedback_event(&mention).await.unwrap().unwrap();
    assert!(
        matches!(&considered, Considered::Ignored(why) if why.contains("not opened by agentry")),
        "{considered:?}"
    );
    assert_eq!(env.count("revision_feedback"), 0);

    // Feedback recorded for it before imported tasks were left out starts no round, and is
    // dropped.
    {
        let mut conn = env.db().conn().unwrap();
        let new = NewFeedback {
            repo_id: repo.id,
            source: FeedbackSource::IssueComment,
            external_id: "40".into(),
            task_id: id,
            pr_number: 7,
            author: "alice".into(),
            body: "@agentry fix".into(),
            path: None,
            line: None,
            url: "https://github.com/acme/web/pull/7#issuecomment-40".into(),
        };
        let at = agentry_persistence::now();
        assert!(revisions::insert(&mut conn, &new, FeedbackOutcome::Waiting, at).unwrap());
        revisions::set_due(&mut conn, id, Some(at)).unwrap();
    }
    let later = agentry_persistence::now() + time::Duration::seconds(1);
    assert_eq!(env.service.start_due_rounds(later).await.unwrap(), 0);
    assert_eq!(env.task(id), before);
    let feedback = revisions::of_task(&mut env.db().conn().unwrap(), id).unwrap();
    assert_eq!(feedback[0].outcome, FeedbackOutcome::Dropped);
    assert_eq!(env.count("outbox"), 0);

    // A live task whose pull request is #7 too: the merge completes it, and only it.
    let live = env.task_with_pull(&repo, 5, 7);
    let found = pulls::task_of_pull(&mut env.db().conn().unwrap(), repo.id, 7).unwrap();
    assert_eq!(found.map(|t| t.id), Some(live.id));
    let outcome = env
        .service
        .webhook_event("d-2".into(), "pull_request".into(), merged(7))
        .await
        .unwrap();
    assert_eq!(outcome, WebhookOutcome::Handled);
    assert_eq!(env.task(live.id).state, TaskState::Completed);
    assert_eq!(env.close_effects(live.id), 1);
    assert_eq!(env.task(id), before);
    assert_eq!(env.close_effects(id), 0);
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    imported_history_is_not_tracked_or_revised
);

/// Starts a revision round on the task of pull request `pr` as review feedback does: a
/// writer's mention, then the revision scheduler once the quiet period is over.
async fn start_round(env: &HostEnv, pr: u64, comment_id: u64) {
    env.fake.set_permission("acme", "web", "alice", "write");
    let mention = WebhookEvent::IssueCommentCreated {
        repo: acme_web(),
        issue_number: pr,
        is_pull_request: true,
        comment_id,
        author: "alice".into(),
        body: "@agentry please add a test".into(),
        html_url: format!("https://github.com/acme/web/pull/{pr}#issuecomment-{comment_id}"),
    };
    let considered = env.service.feedback_event(&mention).await.unwrap().unwrap();
    assert!(
        matches!(considered, Considered::Waiting(_)),
        "{considered:?}"
    );
    let later = agentry_persistence::now() + time::Duration::minutes(1);
    assert_eq!(env.service.start_due_rounds(later).await.unwrap(), 1);
}

/// A merge or a close seen while a revision round is queued ends the round
/// (docs/contract.md#22-states-and-transitions, #57-revisions): a webhook's merge completes
/// the task and closes its issue, the poll sees a close (the repository is polled for a task
/// in a round alone) and fails the other, and no runner claims either afterwards.
async fn a_merge_or_close_during_a_queued_round_ends_it(db: TestDb) {
    let (env, [(a, _, pr_a), (b, _, pr_b)]) = two_pulls(db);
    env.service.poll_pull_requests().await.unwrap();
    start_round(&env, pr_a, 101).await;
    start_round(&env, pr_b, 102).await;
    for id in [a.id, b.id] {
        let task = env.task(id);
        assert_eq!((task.state, task.revisions), (TaskState::Queued, 1));
        assert!(task.revision().is_some());
    }

    // The webhook's merge of A: handled, the task completed, its issue to be closed.
    let outcome = env
        .service
        .webhook_event("d-1".into(), "pull_request".into(), merged(pr_a))
        .await
        .unwrap();
    assert_eq!(outcome, WebhookOutcome::Handled);
    let done = env.task(a.id);
    assert_eq!(done.state, TaskState::Completed);
    // (The round's event is stamped with the scheduler's time, a minute ahead.)
    assert!(
        env.events(a.id).contains(&(
            Some(TaskState::Queued),
            TaskState::Completed,
            "pull request merged (seen by a webhook)".to_owned()
        )),
        "{:?}",
        env.events(a.id)
    );
    assert_eq!(env.close_effects(a.id), 1);

    // B's pull request is closed; the poll sees it though no task is in pr_opened.
    env.fake.advance_clock(Duration::from_secs(60));
    env.fake.close_pull("acme", "web", pr_b);
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled.len(), 1, "{polled:?}");
    assert_eq!(polled[0].1.applied, 1, "{polled:?}");
    let failed = env.task(b.id);
    assert_eq!(failed.state, TaskState::Failed);
    assert!(
        failed
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("closed without being merged")),
        "{failed:?}"
    );
    assert_eq!(env.close_effects(b.id), 0);

    // Neither round runs.
    let mut conn = env.db().conn().unwrap();
    let claimed = agentry_persistence::runner::claim_next(
        &mut conn,
        "runner-1",
        agentry_persistence::now(),
        time::Duration::minutes(5),
    )
    .unwrap();
    assert_eq!(claimed, None);
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_merge_or_close_during_a_queued_round_ends_it
);

/// A change that shows in the pull-request list only after a newer one was polled is still
/// seen: a poll reads again from a few seconds before its watermark
/// (docs/contract.md#55-pull-request-tracking). What is read again changes nothing more: the
/// merge is applied once and its issue closed once, and a mention is kept and acknowledged
/// once.
async fn a_change_listed_after_a_newer_one_is_still_seen(db: TestDb) {
    let env = HostEnv::new(db);
    let repo = env.repo(env.store_token_and_connect());
    env.fake.freeze_clock();
    let issue_a = env.fake.add_issue("acme", "web", "A", None, &[]);
    let issue_c = env.fake.add_issue("acme", "web", "C", None, &[]);
    let pr_a = env
        .fake
        .add_pull("acme", "web", "Fix A", "agentry/task-a", "main");
    let pr_b = env
        .fake
        .add_pull("acme", "web", "A human's change", "feature/b", "main");
    let pr_c = env
        .fake
        .add_pull("acme", "web", "Fix C", "agentry/task-c", "main");
    let a = env.task_with_pull(&repo, issue_a, pr_a);
    let c = env.task_with_pull(&repo, issue_c, pr_c);
    env.service.poll_pull_requests().await.unwrap();

    // A comment on B a minute later: the watermark moves to it.
    env.fake.advance_clock(Duration::from_secs(60));
    env.fake
        .add_comment("acme", "web", pr_b, "bob", "Looks good.");
    env.service.poll_pull_requests().await.unwrap();
    // A was merged two seconds before that comment, but the list shows it only now.
    env.fake.rewind_clock(Duration::from_secs(2));
    env.fake.merge_pull("acme", "web", pr_a);
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 1, "{polled:?}");
    assert_eq!(env.task(a.id).state, TaskState::Completed);
    assert_eq!(env.close_effects(a.id), 1);

    // A writer's mention on C, then another change a second later: both polls read A's
    // merge and the mention again, and nothing is done twice.
    env.fake.set_permission("acme", "web", "alice", "write");
    let effects = env.count("outbox");
    env.fake.advance_clock(Duration::from_secs(3));
    env.fake
        .add_comment("acme", "web", pr_c, "alice", "@agentry add a test");
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 0, "{polled:?}");
    env.fake.advance_clock(Duration::from_secs(1));
    env.fake
        .add_comment("acme", "web", pr_b, "bob", "Still good.");
    env.fake.reset_counts();
    let polled = env.service.poll_pull_requests().await.unwrap();
    assert_eq!(polled[0].1.applied, 0, "{polled:?}");
    assert_eq!(
        env.fake
            .count("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
        1,
        "C's feedback read again: {:?}",
        env.fake.requests()
    );
    assert_eq!(env.close_effects(a.id), 1);
    let merges = env
        .events(a.id)
        .into_iter()
        .filter(|(_, to, _)| *to == TaskState::Completed)
        .count();
    assert_eq!(merges, 1);
    let feedback = revisions::of_task(&mut env.db().conn().unwrap(), c.id).unwrap();
    assert_eq!(feedback.len(), 1, "{feedback:?}");
    assert_eq!(feedback[0].author, "alice");
    // One effect more: the reaction on alice's comment.
    assert_eq!(env.count("outbox"), effects + 1);
    assert_eq!(env.task(c.id).state, TaskState::PrOpened);
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_change_listed_after_a_newer_one_is_still_seen
);
