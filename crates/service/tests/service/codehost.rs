//! The code-host use cases against the fake GitHub over HTTP on 127.0.0.1: the outbox's
//! exactly-once label and comment through failures and restarts, and the issue sync's
//! conditional, incremental and rare full reads (docs/contract.md#52-issue-sync,
//! #54-effects-of-assignment). Their HTTP endpoints are tested in `agentry-api`.

use agentry_fake_github::{FakeGitHub, Fault};
use agentry_persistence::outbox::{self, EffectKind};
use agentry_persistence::repos;
use agentry_persistence::test_support::TestDb;
use agentry_service::codehost;
use agentry_service::tasks::Assignment;
use uuid::Uuid;

use crate::rig::{COMMENTS, HostEnv, ISSUE_LABELS, PATIENCE, test_timing};

/// The assignment of issue `number` of repository `repo` (the repository's agent).
fn assignment(repo: Uuid, number: u64) -> Assignment {
    Assignment {
        repo_id: repo,
        issue_number: i64::try_from(number).unwrap(),
        title: "Fix the login redirect".into(),
        body: "It loops.".into(),
        agent_type: None,
    }
}

/// Issue `title`, opened on `acme/web` and assigned straight through the use case (its
/// label and comment effects queued, none delivered): its number, the repository and the
/// task.
fn assigned_issue(
    env: &HostEnv,
    repo_id: Uuid,
    title: &str,
) -> (u64, repos::Repository, agentry_domain::Task) {
    let number = env.fake.add_issue("acme", "web", title, None, &[]);
    let repo = repos::get_repository(&mut env.db().conn().unwrap(), repo_id).unwrap();
    let (task, created) = codehost::assign(
        &mut env.db().conn().unwrap(),
        &repo,
        i64::try_from(number).unwrap(),
        title,
        "",
        agentry_domain::AgentType::ClaudeCode,
        agentry_persistence::now(),
    )
    .unwrap();
    assert!(created);
    (number, repo, task)
}

/// GETs of the issue list since the last `reset_counts`.
fn list_reads(fake: &FakeGitHub) -> Vec<agentry_fake_github::RequestRecord> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.route.as_deref() == Some("/repos/{owner}/{repo}/issues"))
        .collect()
}

#[tokio::test]
async fn a_failing_code_host_delays_the_effects_but_posts_one_comment() {
    let (env, repo) = HostEnv::connected(TestDb::sqlite());
    let number = env.fake.add_issue("acme", "web", "Flaky", None, &[]);
    let (_, created) = env
        .service
        .assign_issue(assignment(repo, number))
        .await
        .unwrap();
    assert!(created);

    // The next 5 label and comment calls fail. The client retries a label call twice
    // itself; a comment it never sends again after a failure (GitHub may have stored it), so
    // the outbox retries it, looking for its marker first.
    env.fake
        .fail_next(Some(("POST", ISSUE_LABELS)), 5, Fault::Status(500));
    env.fake
        .fail_next(Some(("POST", COMMENTS)), 5, Fault::Status(502));
    assert_eq!(env.deliver(0).await, 0);
    let task_id = Uuid::parse_str(&env.fake_task_id()).unwrap();
    let failed = outbox::effects_of_task(&mut env.db().conn().unwrap(), task_id).unwrap();
    assert!(
        failed
            .iter()
            .all(|e| e.attempts == 1 && e.delivered_at.is_none() && e.last_error.is_some()),
        "{failed:?}"
    );
    // Not due again before its retry delay.
    assert_eq!(env.deliver(0).await, 0);
    assert_eq!(env.fake.count("POST", COMMENTS), 1);
    // Time passes, the code host recovers.
    let mut delivered = 0;
    let mut rounds = 1;
    while delivered < 2 {
        rounds += 1;
        assert!(rounds <= 6, "still not delivered after {rounds} rounds");
        delivered += env.deliver(3600 * rounds).await;
    }
    assert_eq!(rounds, 6, "the comment needed five failed rounds");
    assert_eq!(env.comments_of(number).len(), 1);
    assert_eq!(env.fake.count("POST", COMMENTS), 6);
    assert_eq!(
        env.fake.issue("acme", "web", number).unwrap().labels.len(),
        1
    );
    let done = outbox::effects_of_task(&mut env.db().conn().unwrap(), task_id).unwrap();
    let attempts: Vec<(EffectKind, i32)> = done.iter().map(|e| (e.kind(), e.attempts)).collect();
    assert!(
        attempts.contains(&(EffectKind::AddLabel, 1)),
        "{attempts:?}"
    );
    assert!(attempts.contains(&(EffectKind::Comment, 5)), "{attempts:?}");
    assert_eq!(env.deliver(3600 * 10).await, 0);
    assert_eq!(env.comments_of(number).len(), 1);
}

// A send that lasts longer than the worker's lease (the code host hangs, the client waits
// and retries) keeps its effect from every other worker: its lease is renewed while it is
// sent. Before, another replica claimed the effect once the lease ran out, while this one was
// still sending it (two identical comments when both listed the comments before either
// posted).
#[tokio::test]
async fn a_send_longer_than_its_lease_keeps_its_effect_from_other_workers() {
    let (env, repo) = HostEnv::connected(TestDb::sqlite());
    let number = env.fake.add_issue("acme", "web", "Slow", None, &[]);
    env.service
        .assign_issue(assignment(repo, number))
        .await
        .unwrap();
    let timing = codehost::Timing {
        lease: std::time::Duration::from_secs(1),
        ..test_timing()
    };
    let (a, b) = (env.restarted_with(timing), env.restarted_with(timing));
    env.fake.fail_next(
        Some(("GET", COMMENTS)),
        1,
        Fault::Timeout(std::time::Duration::from_secs(4)),
    );
    let sending =
        tokio::spawn(async move { a.deliver_due_effects(agentry_persistence::now()).await });
    // A has claimed both effects and delivered the label; it now sends the comment.
    agentry_testkit::wait::eventually_async(PATIENCE, "the label added", async || {
        env.fake.issue("acme", "web", number).unwrap().labels.len() == 1
    })
    .await;
    // While A sends (past its first lease), B finds nothing to claim, again and again.
    let mut rounds = 0;
    while !sending.is_finished() {
        let taken = b
            .deliver_due_effects(agentry_persistence::now())
            .await
            .unwrap();
        assert_eq!(taken, 0, "another worker took an effect being sent");
        rounds += 1;
        assert!(rounds < 600, "A's send did not end within a minute");
        // The pace of B's rounds while polling for A's end, not a wait for anything.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        rounds > 10,
        "the send was not longer than the lease ({rounds} rounds)"
    );
    assert_eq!(sending.await.unwrap().unwrap(), 2);
    assert_eq!(env.comments_of(number).len(), 1);
}

async fn a_restart_between_posting_and_marking_delivered_posts_no_second_comment(db: TestDb) {
    let (env, repo_id) = HostEnv::connected(db);
    let (number, repo, task) = assigned_issue(&env, repo_id, "Crash me");

    // A worker claims the effects and posts the comment, then dies before marking it.
    let claimed = outbox::QUEUE
        .claim_due(
            &mut env.db().conn().unwrap(),
            agentry_persistence::now(),
            time::Duration::minutes(2),
            10,
        )
        .unwrap();
    let comment = claimed
        .iter()
        .find(|e| e.kind() == EffectKind::Comment)
        .unwrap();
    let github = env.service.github().await.unwrap();
    let own = github.current_user().await.unwrap().login;
    codehost::deliver(&github, &repo, comment, &own)
        .await
        .unwrap();
    assert_eq!(env.comments_of(number).len(), 1);
    drop(github);

    // A new process on the same database: nothing is due while the lease runs…
    let restarted = env.restarted();
    let at = agentry_persistence::now();
    assert_eq!(restarted.deliver_due_effects(at).await.unwrap(), 0);
    // …then both effects are delivered, and the comment is recognised by its marker.
    let later = at + time::Duration::minutes(3);
    assert_eq!(restarted.deliver_due_effects(later).await.unwrap(), 2);
    assert_eq!(env.comments_of(number).len(), 1);
    assert_eq!(env.fake.count("POST", COMMENTS), 1);
    let effects = outbox::effects_of_task(&mut env.db().conn().unwrap(), task.id).unwrap();
    assert!(
        effects.iter().all(|e| e.delivered_at.is_some()),
        "{effects:?}"
    );
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_restart_between_posting_and_marking_delivered_posts_no_second_comment
);

/// A comment of somebody else's that holds agentry's marker (anyone can write it: the task
/// id is on the issue) does not pass for agentry's: its comment is posted all the same.
#[tokio::test]
async fn a_marker_in_somebody_elses_comment_does_not_stop_agentrys() {
    let (env, repo_id) = HostEnv::connected(TestDb::sqlite());
    let (number, _, task) = assigned_issue(&env, repo_id, "Forge me");
    let forged = format!("nothing to see <!-- agentry:task:{} -->", task.id);
    env.fake
        .add_comment("acme", "web", number, "mallory", &forged);
    assert_eq!(
        env.service
            .deliver_due_effects(agentry_persistence::now())
            .await
            .unwrap(),
        2
    );
    let comments = env.comments_of(number);
    assert_eq!(comments.len(), 2, "{comments:?}");
    assert_eq!(env.fake.count("POST", COMMENTS), 1);
}

#[tokio::test]
async fn an_unchanged_sync_of_twenty_repositories_costs_twenty_requests_all_304() {
    let env = HostEnv::new(TestDb::sqlite());
    env.store_token();
    for i in 0..20 {
        let name = format!("repo{i:02}");
        env.fake.add_repo("acme", &name, "main");
        for n in 0..3 {
            env.fake
                .add_issue("acme", &name, &format!("Issue {n}"), None, &[]);
        }
        env.connect("acme", &name);
    }
    let before = env.fake.rate_limit_remaining();
    env.service.sync_issues(None).await.unwrap();
    assert_eq!(env.count("synced_issues"), 60);
    env.fake.reset_counts();
    let outcomes = env.service.sync_issues(None).await.unwrap();
    assert!(
        outcomes
            .iter()
            .all(|(_, o)| o.unchanged && o.error.is_none())
    );
    let requests = env.fake.requests();
    assert_eq!(requests.len(), 20, "{requests:?}");
    assert!(requests.iter().all(|r| r.status == 304 && r.if_none_match));
    // 304s cost no rate limit: only the first sync's 40 requests were counted (per
    // repository, the full read of its open issues, then the changes since it, whose ETag
    // the later syncs send).
    let used = before - env.fake.rate_limit_remaining();
    assert_eq!(used, 40);
    eprintln!(
        "unchanged sync of 20 repositories: {} requests, {} answered 304; rate-limit units \
         used by both syncs: {used}",
        requests.len(),
        requests.iter().filter(|r| r.status == 304).count()
    );
}

async fn a_restart_syncs_incrementally_from_the_stored_watermark(db: TestDb) {
    let env = HostEnv::new(db);
    env.store_token_and_connect();
    env.fake.freeze_clock();
    for n in 1..=150 {
        env.fake
            .add_issue("acme", "web", &format!("Issue {n}"), None, &[]);
        env.fake.advance_clock(std::time::Duration::from_secs(1));
    }
    env.service.sync_issues(None).await.unwrap();
    assert_eq!(env.count("synced_issues"), 150);

    // A new process on the same database; meanwhile #1 (page 2 of the open issues)
    // closes and #2 gets a label.
    let restarted = env.restarted();
    env.fake.close_issue("acme", "web", 1);
    env.fake.add_label("acme", "web", 2, "bug");
    env.fake.reset_counts();
    let outcomes = restarted.sync_issues(None).await.unwrap();
    assert!(
        outcomes.iter().all(|(_, o)| o.error.is_none()),
        "{outcomes:?}"
    );
    // One request: the changes since the stored watermark, not the 2 pages of all issues.
    let reads = list_reads(&env.fake);
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].query.contains("since="), "{reads:?}");
    assert!(reads[0].query.contains("state=all"), "{reads:?}");
    assert_eq!(env.count("synced_issues"), 149);
    let view = restarted
        .issues_view(None, 200, None)
        .await
        .unwrap()
        .page
        .issues;
    let two = view.iter().find(|i| i.issue.number == 2).unwrap();
    assert_eq!(two.issue.labels[0].name, "bug");
    assert!(!view.iter().any(|i| i.issue.number == 1));
}

agentry_testkit::on_both_backends!(
    #[tokio::test]
    a_restart_syncs_incrementally_from_the_stored_watermark
);

#[tokio::test]
async fn the_rare_full_read_removes_issues_gone_from_the_code_host() {
    let (env, repo) = HostEnv::connected(TestDb::sqlite());
    let service = env.restarted_with(codehost::Timing {
        // Long enough that the incremental sync below comes before it even on a loaded
        // machine; the test waits for it by polling.
        full_sync_every: std::time::Duration::from_secs(1),
        ..test_timing()
    });
    for n in 1..=3 {
        env.fake
            .add_issue("acme", "web", &format!("Issue {n}"), None, &[]);
    }
    service.sync_issues(None).await.unwrap();
    // An issue the copy holds but the code host no longer lists (deleted there: updates
    // never report it).
    let mut gone = agentry_persistence::issues::open_issues(&mut env.db().conn().unwrap(), None)
        .unwrap()
        .into_iter()
        .map(|v| v.issue)
        .collect::<Vec<_>>();
    gone.push(agentry_persistence::issues::SyncedIssue {
        number: 99,
        ..gone[0].clone()
    });
    agentry_persistence::issues::replace_open_issues(
        &mut env.db().conn().unwrap(),
        repo,
        &gone,
        None,
        agentry_persistence::now(),
    )
    .unwrap();
    assert_eq!(env.count("synced_issues"), 4);
    // Before the full read is due, an incremental sync does not notice.
    service.sync_issues(None).await.unwrap();
    assert_eq!(env.count("synced_issues"), 4);
    // Once the full read is due (1 s after the last one), a sync reads every issue and
    // drops the one gone. Until then each sync is incremental and keeps it.
    agentry_testkit::wait::eventually_async(PATIENCE, "a full read", async || {
        env.fake.reset_counts();
        service.sync_issues(None).await.unwrap();
        if env.count("synced_issues") == 3 {
            return true;
        }
        assert_eq!(env.count("synced_issues"), 4);
        false
    })
    .await;
    // The missing issue was looked up once before it left the copy.
    assert_eq!(env.fake.count("GET", "/repos/acme/web/issues/99"), 1);
}
