//! The GitHub client against the fake GitHub (and, for the exact bytes on the wire, a tiny
//! scripted HTTP server): every method, pagination, conditional requests, retries, timeouts,
//! rate limits, error mapping, and that the token never shows.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_codehost::{
    ClientConfig, CodeHostError, Conditional, GitHub, Permission, ReactionTarget,
};
use agentry_fake_github::{FakeGitHub, Fault};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "ghp_client_test_0123456789abcdef";
const OWNER: &str = "acme";
const REPO: &str = "widgets";

/// A fake with the user `agentry-bot` (token [`TOKEN`]) and the repository `acme/widgets`.
fn fake() -> FakeGitHub {
    let fake = FakeGitHub::start();
    fake.add_token(TOKEN, "agentry-bot");
    fake.add_repo(OWNER, REPO, "main");
    fake
}

/// Fast retries: backoff 5–50 ms, 2 s per attempt.
fn config(api_url: &str) -> ClientConfig {
    ClientConfig {
        api_url: api_url.to_owned(),
        user_agent: "agentry-tests".to_owned(),
        request_timeout: Duration::from_secs(2),
        max_retries: 5,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::default()
    }
}

fn client(fake: &FakeGitHub) -> GitHub {
    client_with(fake, |_| {})
}

/// A client of `fake` whose configuration `adjust` changed.
fn client_with(fake: &FakeGitHub, adjust: impl FnOnce(&mut ClientConfig)) -> GitHub {
    let mut config = config(&fake.base_url());
    adjust(&mut config);
    GitHub::new(&config, TOKEN).unwrap()
}

fn modified<T: std::fmt::Debug>(c: Conditional<T>) -> (T, String) {
    match c {
        Conditional::Modified { value, etag } => (value, etag.expect("an ETag")),
        Conditional::NotModified => panic!("expected new data, got 304"),
    }
}

/// Asserts that `result` is [`CodeHostError::NotFound`].
#[track_caller]
fn assert_not_found<T: std::fmt::Debug>(result: Result<T, CodeHostError>) {
    assert!(
        matches!(result, Err(CodeHostError::NotFound(_))),
        "{result:?}"
    );
}

/// Asserts that `list` has `len` items, read with `pages` GETs of `route` (the fake's
/// route template).
#[track_caller]
fn assert_paged<T>(fake: &FakeGitHub, list: &[T], len: usize, route: &str, pages: usize) {
    assert_eq!(list.len(), len);
    assert_eq!(fake.count("GET", route), pages, "GETs of {route}");
}

fn assert_no_token(text: &str) {
    assert!(!text.contains(TOKEN), "the token leaked: {text}");
    assert!(
        !text.contains("0123456789abcdef"),
        "the token leaked: {text}"
    );
}

// ----- plain reads -----

#[tokio::test]
async fn current_user_and_repository() {
    let fake = fake();
    fake.set_clone_url(OWNER, REPO, "file:///tmp/widgets.git");
    let gh = client(&fake);

    let user = gh.current_user().await.unwrap();
    assert_eq!(user.login, "agentry-bot");
    assert!(user.id > 0);

    let repo = gh.repository(OWNER, REPO).await.unwrap();
    assert_eq!(repo.owner, "acme");
    assert_eq!(repo.name, "widgets");
    assert_eq!(repo.full_name, "acme/widgets");
    assert_eq!(repo.default_branch, "main");
    assert_eq!(repo.clone_url, "file:///tmp/widgets.git");
    assert_eq!(repo.html_url, "https://github.com/acme/widgets");
    assert!(!repo.private);
    assert!(repo.id > 0);

    assert_eq!(gh.requests_sent(), 2);
    assert_eq!(fake.count("GET", "/user"), 1);
    assert_eq!(fake.count("GET", "/repos/{o}/{r}"), 1);
    assert!(fake.requests().iter().all(|r| r.authorization));
    // A clone shares the counter.
    let clone = gh.clone();
    clone.current_user().await.unwrap();
    assert_eq!(gh.requests_sent(), 3);
}

/// A client's own login is asked once and kept with the client (and its clones); another
/// token's client asks for its own user, whatever the first one kept.
#[tokio::test]
async fn own_login_is_asked_once_per_client() {
    let fake = fake();
    fake.add_token("ghp_second_token_0123456789abcdefghij", "second-bot");
    let gh = client(&fake);
    assert_eq!(gh.own_login().await.unwrap(), "agentry-bot");
    assert_eq!(gh.clone().own_login().await.unwrap(), "agentry-bot");
    assert_eq!(fake.count("GET", "/user"), 1);
    let other = GitHub::new(
        &config(&fake.base_url()),
        "ghp_second_token_0123456789abcdefghij",
    )
    .unwrap();
    assert_eq!(other.own_login().await.unwrap(), "second-bot");
    assert_eq!(gh.own_login().await.unwrap(), "agentry-bot");
    assert_eq!(fake.count("GET", "/user"), 2);
}

#[tokio::test]
async fn unknown_token_unknown_repo_and_no_access() {
    let fake = fake();
    fake.add_repo(OWNER, "secret", "main");
    fake.add_token_with_access("ghp_narrow_token", "narrow", &["acme/widgets"]);

    let bad = GitHub::new(&config(&fake.base_url()), "ghp_unknown_token").unwrap();
    let err = bad.current_user().await.unwrap_err();
    assert!(matches!(err, CodeHostError::Unauthorized(_)), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("Bad credentials"), "{err}");
    assert!(!err.to_string().contains("ghp_unknown_token"), "{err}");
    assert_eq!(bad.requests_sent(), 1, "a 401 is not retried");

    let gh = client(&fake);
    let err = gh.repository(OWNER, "nope").await.unwrap_err();
    assert!(matches!(err, CodeHostError::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("/repos/acme/nope"), "{err}");
    assert_eq!(err.status(), Some(404));
    assert_not_found(gh.issue(OWNER, REPO, 999).await);

    let narrow = GitHub::new(&config(&fake.base_url()), "ghp_narrow_token").unwrap();
    narrow.repository(OWNER, REPO).await.unwrap();
    assert_not_found(narrow.repository(OWNER, "secret").await);
}

// ----- issues -----

#[tokio::test]
async fn open_issues_reads_every_page_skips_pulls_and_uses_the_etag() {
    let fake = fake();
    let mut issues = Vec::new();
    for i in 0..250 {
        issues.push(fake.add_issue(OWNER, REPO, &format!("issue {i}"), Some("body"), &[]));
    }
    let mut pulls = Vec::new();
    for i in 0..10 {
        pulls.push(fake.add_pull(OWNER, REPO, &format!("pr {i}"), &format!("b{i}"), "main"));
    }
    let closed = fake.add_issue(OWNER, REPO, "closed one", None, &[]);
    fake.close_issue(OWNER, REPO, closed);
    let gh = client(&fake);

    // 260 open items (issues and pulls) at 100 a page: 3 pages.
    let (list, etag) = modified(gh.open_issues(OWNER, REPO, None).await.unwrap());
    assert_paged(&fake, &list, 250, "/repos/{o}/{r}/issues", 3);
    let mut numbers: Vec<u64> = list.iter().map(|i| i.number).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, issues);
    assert!(list.iter().all(|i| i.state == "open" && i.author == "acme"));
    assert!(
        list.windows(2).all(|w| w[0].updated_at >= w[1].updated_at),
        "most recently updated first"
    );
    let queries: Vec<String> = fake.requests().iter().map(|r| r.query.clone()).collect();
    assert!(queries[0].contains("state=open"), "{queries:?}");
    assert!(queries[0].contains("sort=updated"), "{queries:?}");
    assert!(queries[0].contains("direction=desc"), "{queries:?}");
    assert!(queries[0].contains("per_page=100"), "{queries:?}");
    assert!(queries[2].contains("page=3"), "{queries:?}");

    // Unchanged: one conditional request, a 304, no rate limit spent.
    let remaining = fake.rate_limit_remaining();
    let sent = gh.requests_sent();
    fake.reset_counts();
    let again = gh.open_issues(OWNER, REPO, Some(&etag)).await.unwrap();
    assert_eq!(again, Conditional::NotModified);
    assert_eq!(gh.requests_sent(), sent + 1);
    assert_eq!(fake.count("*", "/repos/{o}/{r}/issues"), 1);
    assert_eq!(fake.count_status(304), 1);
    assert!(fake.requests()[0].if_none_match);
    assert_eq!(fake.rate_limit_remaining(), remaining);

    // A change (a label added on github.com): new data and a new ETag.
    fake.add_label(OWNER, REPO, issues[10], "bug");
    let (list, etag2) = modified(gh.open_issues(OWNER, REPO, Some(&etag)).await.unwrap());
    assert_ne!(etag2, etag);
    assert_eq!(list.len(), 250);
    assert_eq!(list[0].number, issues[10], "the updated issue comes first");
    assert_eq!(list[0].labels[0].name, "bug");
    assert_eq!(list[0].labels[0].color, "ededed");
    // Only the first page is conditional.
    let conditional: Vec<bool> = fake.requests().iter().map(|r| r.if_none_match).collect();
    assert_eq!(conditional, [true, true, false, false]);

    // A new issue changes it too.
    let new = fake.add_issue(OWNER, REPO, "new", None, &[]);
    let (list, _) = modified(gh.open_issues(OWNER, REPO, Some(&etag2)).await.unwrap());
    assert_eq!(list.len(), 251);
    assert_eq!(list[0].number, new);
}

#[tokio::test]
async fn issues_updated_since_reads_closed_issues_every_page_and_skips_pulls() {
    let fake = fake();
    fake.freeze_clock();
    let t0 = fake.now_unix();
    let old = fake.add_issue(OWNER, REPO, "old", None, &[]);
    fake.advance_clock(Duration::from_secs(60));
    for i in 0..150 {
        fake.add_issue(OWNER, REPO, &format!("new {i}"), None, &[]);
    }
    let pull = fake.add_pull(OWNER, REPO, "a pull", "feature", "main");
    fake.close_issue(OWNER, REPO, 2);
    let gh = client(&fake);
    let since = OffsetDateTime::from_unix_timestamp(t0 + 30).unwrap();
    let (changes, etag) = modified(
        gh.issues_updated_since(OWNER, REPO, since, None)
            .await
            .unwrap(),
    );
    assert_eq!(changes.pages, 2);
    // 150 issues share the newest second: a 304 on the first page could hide a 151st.
    assert!(!changes.etag_covers_all);
    assert_eq!(
        changes.issues.len(),
        150,
        "the old issue and the pull request are left out"
    );
    assert!(
        changes
            .issues
            .iter()
            .all(|i| i.number != old && i.number != pull)
    );
    let closed: Vec<u64> = changes
        .issues
        .iter()
        .filter(|i| i.state == "closed")
        .map(|i| i.number)
        .collect();
    assert_eq!(closed, [2]);
    assert_eq!(
        changes.newest,
        Some(OffsetDateTime::from_unix_timestamp(t0 + 60).unwrap())
    );
    let requests = fake.requests();
    assert!(
        requests[0].query.contains("state=all")
            && requests[0].query.contains("sort=updated")
            && requests[0].query.contains("direction=desc"),
        "{requests:?}"
    );
    // `since` is inclusive, in whole seconds: the issue updated at exactly `since` is read.
    let exact =
        OffsetDateTime::from_unix_timestamp(t0).unwrap() + time::Duration::milliseconds(900);
    let (all, _) = modified(
        gh.issues_updated_since(OWNER, REPO, exact, None)
            .await
            .unwrap(),
    );
    assert_eq!(all.issues.len(), 151);
    // A few issues later, the newest second holds fewer than a page: the ETag vouches.
    fake.advance_clock(Duration::from_secs(1));
    fake.add_issue(OWNER, REPO, "later", None, &[]);
    let later = OffsetDateTime::from_unix_timestamp(t0 + 61).unwrap();
    let (tail, tail_etag) = modified(
        gh.issues_updated_since(OWNER, REPO, later, None)
            .await
            .unwrap(),
    );
    assert_eq!(
        (tail.issues.len(), tail.pages, tail.etag_covers_all),
        (1, 1, true)
    );
    // Unchanged: 304 after one request, before and after the earlier query changed with
    // the new issue.
    let unchanged = || async {
        fake.reset_counts();
        let again = gh
            .issues_updated_since(OWNER, REPO, later, Some(&tail_etag))
            .await
            .unwrap();
        assert!(again.is_not_modified());
        assert_eq!(fake.count_status(304), 1);
        assert_eq!(fake.requests().len(), 1);
    };
    unchanged().await;
    let (grown, _) = modified(
        gh.issues_updated_since(OWNER, REPO, since, Some(&etag))
            .await
            .unwrap(),
    );
    assert_eq!(grown.issues.len(), 151);
    unchanged().await;
}

#[tokio::test]
async fn issue_and_close_issue() {
    let fake = fake();
    let n = fake.add_issue(OWNER, REPO, "Fix the flux", None, &["agentry", "bug"]);
    let gh = client(&fake);

    let issue = gh.issue(OWNER, REPO, n).await.unwrap();
    assert_eq!(issue.number, n);
    assert_eq!(issue.title, "Fix the flux");
    assert_eq!(issue.body, "", "a null body is empty");
    assert_eq!(issue.state, "open");
    assert_eq!(issue.author, "acme");
    assert_eq!(
        issue.html_url,
        format!("https://github.com/acme/widgets/issues/{n}")
    );
    let labels: Vec<&str> = issue.labels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(labels, ["agentry", "bug"]);
    assert_eq!(issue.closed_at, None);
    assert!(
        (OffsetDateTime::now_utc() - issue.created_at)
            .whole_seconds()
            .abs()
            < 60
    );
    assert_eq!(issue.created_at.offset(), time::UtcOffset::UTC);

    gh.close_issue(OWNER, REPO, n).await.unwrap();
    assert_eq!(fake.issue(OWNER, REPO, n).unwrap().state, "closed");
    assert_eq!(fake.count("PATCH", "/repos/{o}/{r}/issues/{n}"), 1);
    let closed = gh.issue(OWNER, REPO, n).await.unwrap();
    assert_eq!(closed.state, "closed");
    assert!(closed.closed_at.is_some());
    // Closing again is fine.
    gh.close_issue(OWNER, REPO, n).await.unwrap();
    assert_not_found(gh.close_issue(OWNER, REPO, 999).await);
}

#[tokio::test]
async fn ensure_label_creates_once_and_add_labels() {
    let fake = fake();
    let n = fake.add_issue(OWNER, REPO, "x", None, &[]);
    let gh = client(&fake);

    gh.ensure_label(OWNER, REPO, "agentry", "6f42c1")
        .await
        .unwrap();
    assert_eq!(
        fake.labels(OWNER, REPO),
        [("agentry".to_owned(), "6f42c1".to_owned())]
    );
    assert_eq!(fake.count("GET", "/repos/{o}/{r}/labels/{name}"), 1);
    assert_eq!(fake.count("POST", "/repos/{o}/{r}/labels"), 1);

    // The second time: one GET, no POST.
    gh.ensure_label(OWNER, REPO, "agentry", "6f42c1")
        .await
        .unwrap();
    assert_eq!(fake.count("GET", "/repos/{o}/{r}/labels/{name}"), 2);
    assert_eq!(fake.count("POST", "/repos/{o}/{r}/labels"), 1);
    assert_eq!(fake.labels(OWNER, REPO).len(), 1);

    // Created by someone else between the GET and the POST: the 422 already_exists is fine.
    fake.fail_next(
        Some(("GET", "/repos/{o}/{r}/labels/{name}")),
        1,
        Fault::Status(404),
    );
    gh.ensure_label(OWNER, REPO, "agentry", "6f42c1")
        .await
        .unwrap();
    assert_eq!(fake.count("POST", "/repos/{o}/{r}/labels"), 2);
    assert_eq!(fake.count_status(422), 1);

    // A name that needs percent-encoding in the path.
    gh.ensure_label(OWNER, REPO, "good first issue", "#00ff00")
        .await
        .unwrap();
    gh.ensure_label(OWNER, REPO, "good first issue", "00ff00")
        .await
        .unwrap();
    assert_eq!(fake.count("POST", "/repos/{o}/{r}/labels"), 3);
    assert!(
        fake.labels(OWNER, REPO)
            .contains(&("good first issue".to_owned(), "00ff00".to_owned()))
    );

    // A bad colour is GitHub's 422.
    let err = gh
        .ensure_label(OWNER, REPO, "x", "purple")
        .await
        .unwrap_err();
    assert!(
        matches!(err, CodeHostError::Rejected { status: 422, .. }),
        "{err:?}"
    );

    gh.add_labels(OWNER, REPO, n, &["agentry", "good first issue"])
        .await
        .unwrap();
    let labels = fake.issue(OWNER, REPO, n).unwrap().labels;
    assert_eq!(
        labels,
        [
            ("agentry".to_owned(), "6f42c1".to_owned()),
            ("good first issue".to_owned(), "00ff00".to_owned())
        ]
    );
    // Adding again changes nothing.
    gh.add_labels(OWNER, REPO, n, &["agentry"]).await.unwrap();
    assert_eq!(fake.issue(OWNER, REPO, n).unwrap().labels.len(), 2);
}

#[tokio::test]
async fn comments_every_page_and_create_comment() {
    let fake = fake();
    let n = fake.add_issue(OWNER, REPO, "x", None, &[]);
    for i in 0..150 {
        fake.add_comment(OWNER, REPO, n, "someone", &format!("comment {i}"));
    }
    let gh = client(&fake);

    let comments = gh.issue_comments(OWNER, REPO, n).await.unwrap();
    assert_paged(
        &fake,
        &comments,
        150,
        "/repos/{o}/{r}/issues/{n}/comments",
        2,
    );
    assert_eq!(comments[0].body, "comment 0");
    assert_eq!(comments[149].body, "comment 149");
    assert!(comments.iter().all(|c| c.author == "someone"));

    let body = "agentry is working on this issue (task 0190a4b2).";
    let created = gh.create_comment(OWNER, REPO, n, body).await.unwrap();
    assert_eq!(created.body, body);
    assert_eq!(created.author, "agentry-bot");
    assert!(created.id > 0);
    let stored = fake.issue(OWNER, REPO, n).unwrap().comments;
    assert_eq!(stored.len(), 151);
    assert_eq!(stored[150].id, created.id);
    assert_eq!(stored[150].user, "agentry-bot");

    let all = gh.issue_comments(OWNER, REPO, n).await.unwrap();
    assert_eq!(all.last(), Some(&created));

    // An empty comment is GitHub's 422.
    let err = gh.create_comment(OWNER, REPO, n, " ").await.unwrap_err();
    assert!(
        matches!(err, CodeHostError::Rejected { status: 422, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("Validation Failed"), "{err}");
}

// ----- pull requests -----

#[tokio::test]
async fn create_pull_pull_and_create_review() {
    let fake = fake();
    let gh = client(&fake);

    let pr = gh
        .create_pull(OWNER, REPO, "Fix #1", "agentry/fix-1", "main", "Closes #1")
        .await
        .unwrap();
    assert_eq!(pr.title, "Fix #1");
    assert_eq!(pr.body, "Closes #1");
    assert_eq!(pr.head_ref, "agentry/fix-1");
    assert_eq!(pr.base_ref, "main");
    assert_eq!(pr.state, "open");
    assert_eq!(pr.merged_at, None);
    assert_eq!(
        pr.html_url,
        format!("https://github.com/acme/widgets/pull/{}", pr.number)
    );
    assert_eq!(fake.pulls(OWNER, REPO)[0].user, "agentry-bot");

    assert_eq!(gh.pull(OWNER, REPO, pr.number).await.unwrap(), pr);

    gh.create_review(OWNER, REPO, pr.number, "Looks fine; one nit.")
        .await
        .unwrap();
    assert_eq!(
        fake.reviews(OWNER, REPO, pr.number),
        ["Looks fine; one nit."]
    );
    let posted = gh.reviews(OWNER, REPO, pr.number).await.unwrap();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].body, "Looks fine; one nit.");
    // The open pull request of a branch is found by its head; other branches have none.
    let found = gh
        .open_pull_for_branch(OWNER, REPO, "agentry/fix-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.number, pr.number);
    assert!(
        gh.open_pull_for_branch(OWNER, REPO, "agentry/other")
            .await
            .unwrap()
            .is_none()
    );
    // A review is not sent again after a 5xx (GitHub may have stored it).
    fake.fail_next(
        Some(("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews")),
        1,
        Fault::Status(502),
    );
    fake.reset_counts();
    let err = gh
        .create_review(OWNER, REPO, pr.number, "second")
        .await
        .unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert_eq!(
        fake.count("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
        1
    );

    // A second pull request for the same head is GitHub's 422.
    let err = gh
        .create_pull(OWNER, REPO, "again", "agentry/fix-1", "main", "")
        .await
        .unwrap_err();
    assert!(
        matches!(err, CodeHostError::Rejected { status: 422, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("already exists"), "{err}");

    // A creation whose answer is lost is not sent again: the pull request exists, and the
    // caller finds it by its branch.
    fake.fail_next(
        Some(("POST", "/repos/{owner}/{repo}/pulls")),
        1,
        Fault::AnswerLost(502),
    );
    fake.reset_counts();
    let err = gh
        .create_pull(OWNER, REPO, "Lost", "agentry/lost", "main", "")
        .await
        .unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert_eq!(fake.count("POST", "/repos/{owner}/{repo}/pulls"), 1);
    let lost = gh
        .open_pull_for_branch(OWNER, REPO, "agentry/lost")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lost.title, "Lost");

    fake.merge_pull(OWNER, REPO, pr.number);
    let merged = gh.pull(OWNER, REPO, pr.number).await.unwrap();
    assert_eq!(merged.state, "closed");
    assert!(merged.merged_at.is_some());
    assert!(merged.closed_at.is_some());
    assert!(merged.updated_at >= pr.updated_at);

    let closed = fake.add_pull(OWNER, REPO, "abandoned", "b2", "main");
    fake.close_pull(OWNER, REPO, closed);
    let closed = gh.pull(OWNER, REPO, closed).await.unwrap();
    assert_eq!((closed.state.as_str(), closed.merged_at), ("closed", None));

    let issue = fake.add_issue(OWNER, REPO, "not a pull", None, &[]);
    assert_not_found(gh.pull(OWNER, REPO, issue).await);
}

// ----- revisions: reviews, review comments, permissions, reactions -----

#[tokio::test]
async fn reviews_every_page_oldest_first() {
    let fake = fake();
    let pr = fake.add_pull(OWNER, REPO, "Fix", "agentry/fix", "main");
    for i in 0..130 {
        let state = if i % 2 == 0 { "COMMENTED" } else { "APPROVED" };
        fake.add_review(OWNER, REPO, pr, "alice", state, &format!("review {i}"));
    }
    let last = fake.add_review(OWNER, REPO, pr, "bob", "CHANGES_REQUESTED", "Rename it.");
    let gh = client(&fake);

    let reviews = gh.reviews(OWNER, REPO, pr).await.unwrap();
    assert_paged(&fake, &reviews, 131, "/repos/{o}/{r}/pulls/{n}/reviews", 2);
    assert_eq!(reviews[0].body, "review 0");
    assert_eq!(reviews[1].state, "APPROVED");
    let r = &reviews[130];
    assert_eq!(r.id, last);
    assert_eq!(r.author, "bob");
    assert_eq!(r.state, "CHANGES_REQUESTED");
    assert_eq!(r.body, "Rename it.");
    assert_eq!(
        r.html_url,
        format!("https://github.com/acme/widgets/pull/{pr}#pullrequestreview-{last}")
    );
    assert!(r.submitted_at.is_some());
    // An issue has no reviews.
    let issue = fake.add_issue(OWNER, REPO, "x", None, &[]);
    assert_not_found(gh.reviews(OWNER, REPO, issue).await);
}

#[tokio::test]
async fn review_comments_every_page_and_since() {
    let fake = fake();
    fake.freeze_clock();
    let pr = fake.add_pull(OWNER, REPO, "Fix", "agentry/fix", "main");
    for i in 0..120 {
        fake.add_review_comment(
            OWNER,
            REPO,
            pr,
            "alice",
            "src/lib.rs",
            i + 1,
            &format!("c{i}"),
        );
    }
    fake.advance_clock(Duration::from_secs(60));
    let since = OffsetDateTime::from_unix_timestamp(fake.now_unix()).unwrap();
    let newer = fake.add_review_comment(OWNER, REPO, pr, "bob", "README.md", 3, "Typo here.");
    let gh = client(&fake);

    let all = gh.review_comments(OWNER, REPO, pr, None).await.unwrap();
    assert_paged(&fake, &all, 121, "/repos/{o}/{r}/pulls/{n}/comments", 2);
    assert_eq!(all[0].body, "c0");
    assert_eq!(all[0].line, Some(1));
    assert_eq!(all[0].path, "src/lib.rs");
    // Each single comment sits in a review of its own, as on GitHub.
    let reviews = gh.reviews(OWNER, REPO, pr).await.unwrap();
    assert_eq!(reviews.len(), 121);
    assert_eq!(all[0].review_id, Some(reviews[0].id));
    assert_eq!(
        (reviews[0].state.as_str(), reviews[0].body.as_str()),
        ("COMMENTED", "")
    );

    fake.reset_counts();
    let recent = gh
        .review_comments(
            OWNER,
            REPO,
            pr,
            Some(since + time::Duration::milliseconds(700)),
        )
        .await
        .unwrap();
    assert_eq!(recent.len(), 1);
    let c = &recent[0];
    assert_eq!(c.id, newer);
    assert_eq!(c.author, "bob");
    assert_eq!(c.body, "Typo here.");
    assert_eq!((c.path.as_str(), c.line), ("README.md", Some(3)));
    assert_eq!(
        c.html_url,
        format!("https://github.com/acme/widgets/pull/{pr}#discussion_r{newer}")
    );
    assert_eq!(c.created_at, since);
    // `since` goes out in whole UTC seconds.
    let query = &fake.requests()[0].query;
    let expected = format!(
        "since={}",
        since
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
            .replace(':', "%3A")
    );
    assert!(
        query.contains(&expected) || query.contains(&expected.replace("%3A", ":")),
        "{query}"
    );
}

#[tokio::test]
async fn issue_comments_since_and_html_urls() {
    let fake = fake();
    fake.freeze_clock();
    let pr = fake.add_pull(OWNER, REPO, "Fix", "agentry/fix", "main");
    let issue = fake.add_issue(OWNER, REPO, "Bug", None, &[]);
    let old = fake.add_comment(OWNER, REPO, pr, "alice", "old");
    fake.add_comment(OWNER, REPO, issue, "alice", "on the issue");
    fake.advance_clock(Duration::from_secs(10));
    let since = OffsetDateTime::from_unix_timestamp(fake.now_unix()).unwrap();
    let new = fake.add_comment(OWNER, REPO, pr, "bob", "@agentry please fix the test");
    let gh = client(&fake);

    let all = gh.issue_comments(OWNER, REPO, pr).await.unwrap();
    assert_eq!(all.iter().map(|c| c.id).collect::<Vec<_>>(), [old, new]);
    assert_eq!(
        all[1].html_url,
        format!("https://github.com/acme/widgets/pull/{pr}#issuecomment-{new}")
    );
    let recent = gh
        .issue_comments_since(OWNER, REPO, pr, Some(since))
        .await
        .unwrap();
    assert_eq!(recent.len(), 1);
    assert_eq!(recent[0].id, new);
    assert_eq!(recent[0].author, "bob");
    assert_eq!(
        gh.issue_comments_since(OWNER, REPO, pr, None)
            .await
            .unwrap(),
        all
    );
    let on_issue = gh.issue_comments(OWNER, REPO, issue).await.unwrap();
    assert!(
        on_issue[0].html_url.starts_with(&format!(
            "https://github.com/acme/widgets/issues/{issue}#issuecomment-"
        )),
        "{}",
        on_issue[0].html_url
    );
}

#[tokio::test]
async fn collaborator_permission_roles_and_404() {
    let fake = fake();
    fake.set_permission(OWNER, REPO, "maria", "maintain");
    fake.set_permission(OWNER, REPO, "wes", "write");
    fake.set_permission(OWNER, REPO, "tri", "triage");
    fake.set_permission(OWNER, REPO, "gone", "none");
    fake.set_permission(OWNER, REPO, "ad.min", "admin");
    fake.add_token("ghp_other_user_token", "stranger");
    let gh = client(&fake);

    let of = |login: &'static str| {
        let gh = gh.clone();
        async move {
            gh.collaborator_permission(OWNER, REPO, login)
                .await
                .unwrap()
        }
    };
    assert_eq!(of("acme").await, Permission::Admin, "the owner");
    assert_eq!(of("ad.min").await, Permission::Admin);
    assert_eq!(of("maria").await, Permission::Maintain);
    assert_eq!(of("wes").await, Permission::Write);
    assert_eq!(of("tri").await, Permission::Triage);
    assert_eq!(of("gone").await, Permission::None);
    // A user without a role on a public repository may read it.
    assert_eq!(of("stranger").await, Permission::Read);
    // No such user: GitHub's 404 is "no permission", not an error.
    assert_eq!(of("nobody-at-all").await, Permission::None);
    assert_eq!(of("a/b?c").await, Permission::None);
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path == "/repos/acme/widgets/collaborators/a%2Fb%3Fc/permission")
    );
    assert!(Permission::Maintain.can_write());
    assert!(!Permission::Triage.can_write());
    assert_eq!(Permission::Maintain.as_str(), "maintain");
    // GitHub's 404 does not say what is missing: an unknown repository is no permission too.
    assert_eq!(
        gh.collaborator_permission(OWNER, "nope", "wes")
            .await
            .unwrap(),
        Permission::None
    );
}

#[tokio::test]
async fn reactions_are_added_once_and_repeating_is_ok() {
    let fake = fake();
    let pr = fake.add_pull(OWNER, REPO, "Fix", "agentry/fix", "main");
    let comment = fake.add_comment(OWNER, REPO, pr, "alice", "@agentry fix it");
    let review_comment =
        fake.add_review_comment(OWNER, REPO, pr, "alice", "src/lib.rs", 4, "rename");
    let gh = client(&fake);
    let route = "/repos/{o}/{r}/issues/comments/{id}/reactions";

    gh.add_reaction(OWNER, REPO, ReactionTarget::IssueComment(comment), "eyes")
        .await
        .unwrap();
    gh.add_reaction(OWNER, REPO, ReactionTarget::IssueComment(comment), "eyes")
        .await
        .unwrap();
    let statuses: Vec<u16> = fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [201, 200]);
    gh.add_reaction(
        OWNER,
        REPO,
        ReactionTarget::ReviewComment(review_comment),
        "+1",
    )
    .await
    .unwrap();
    let reactions = fake.reactions(OWNER, REPO);
    assert_eq!(reactions.len(), 2);
    assert_eq!(
        (reactions[0].comment_id, reactions[0].review_comment),
        (comment, false)
    );
    assert_eq!(reactions[0].content, "eyes");
    assert_eq!(reactions[0].user, "agentry-bot");
    assert_eq!(
        (reactions[1].comment_id, reactions[1].review_comment),
        (review_comment, true)
    );
    assert_eq!(
        fake.count("POST", "/repos/{o}/{r}/pulls/comments/{id}/reactions"),
        1
    );

    // Safe to repeat, so sent again after a 5xx, even one whose answer was lost.
    fake.fail_next(Some(("POST", route)), 1, Fault::AnswerLost(502));
    fake.reset_counts();
    gh.add_reaction(OWNER, REPO, ReactionTarget::IssueComment(comment), "rocket")
        .await
        .unwrap();
    assert_eq!(fake.count("POST", route), 2);
    assert_eq!(fake.reactions(OWNER, REPO).len(), 3);

    let err = gh
        .add_reaction(OWNER, REPO, ReactionTarget::IssueComment(comment), "tada")
        .await
        .unwrap_err();
    assert!(
        matches!(err, CodeHostError::Rejected { status: 422, .. }),
        "{err:?}"
    );
    let err = gh
        .add_reaction(OWNER, REPO, ReactionTarget::ReviewComment(comment), "eyes")
        .await
        .unwrap_err();
    assert!(matches!(err, CodeHostError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn pulls_updated_since_stops_paging_early() {
    let fake = fake();
    let mut numbers = Vec::new();
    for i in 0..250 {
        numbers.push(fake.add_pull(OWNER, REPO, &format!("pr {i}"), &format!("b{i}"), "main"));
    }
    let gh = client(&fake);

    // Everything: 3 pages.
    let (all, etag) = modified(
        gh.pulls_updated_since(OWNER, REPO, None, None)
            .await
            .unwrap(),
    );
    assert_paged(&fake, &all, 250, "/repos/{o}/{r}/pulls", 3);
    let query = &fake.requests()[0].query;
    for part in [
        "state=all",
        "sort=updated",
        "direction=desc",
        "per_page=100",
    ] {
        assert!(query.contains(part), "{query}");
    }

    // Unchanged: one 304.
    fake.reset_counts();
    assert_eq!(
        gh.pulls_updated_since(OWNER, REPO, Some(&etag), None)
            .await
            .unwrap(),
        Conditional::NotModified
    );
    assert_eq!(fake.count("GET", "/repos/{o}/{r}/pulls"), 1);
    assert_eq!(fake.count_status(304), 1);

    // An hour later three pull requests change; a poll since half an hour ago reads one page.
    let since = OffsetDateTime::now_utc() + time::Duration::minutes(30);
    fake.advance_clock(Duration::from_secs(3600));
    fake.merge_pull(OWNER, REPO, numbers[7]);
    fake.add_label(OWNER, REPO, numbers[100], "x");
    fake.close_pull(OWNER, REPO, numbers[249]);
    fake.reset_counts();
    let (page, etag2) = modified(
        gh.pulls_updated_since(OWNER, REPO, Some(&etag), Some(since))
            .await
            .unwrap(),
    );
    assert_eq!(
        fake.count("GET", "/repos/{o}/{r}/pulls"),
        1,
        "one page is enough"
    );
    assert_ne!(etag2, etag);
    let fresh: Vec<u64> = page
        .iter()
        .filter(|p| p.updated_at >= since)
        .map(|p| p.number)
        .collect();
    assert_eq!(fresh.len(), 3);
    for n in [numbers[7], numbers[100], numbers[249]] {
        assert!(fresh.contains(&n), "{fresh:?}");
    }
    assert!(
        page.iter()
            .any(|p| p.number == numbers[7] && p.merged_at.is_some())
    );

    // More than a page changed: reads on until a page ends with an older pull request.
    let since = OffsetDateTime::now_utc() + time::Duration::minutes(90);
    fake.advance_clock(Duration::from_secs(3600));
    for n in &numbers[..150] {
        fake.add_label(OWNER, REPO, *n, "y");
    }
    fake.reset_counts();
    let (pages, _) = modified(
        gh.pulls_updated_since(OWNER, REPO, Some(&etag2), Some(since))
            .await
            .unwrap(),
    );
    assert_eq!(fake.count("GET", "/repos/{o}/{r}/pulls"), 2);
    assert_eq!(pages.len(), 200);
    assert_eq!(pages.iter().filter(|p| p.updated_at >= since).count(), 150);
}

// ----- retries and timeouts -----

#[tokio::test]
async fn server_errors_are_retried() {
    let fake = fake();
    let gh = client(&fake);
    fake.fail_next(Some(("GET", "/user")), 1, Fault::Status(500));
    fake.fail_next(Some(("GET", "/user")), 1, Fault::Status(502));

    let user = gh.current_user().await.unwrap();
    assert_eq!(user.login, "agentry-bot");
    assert_eq!(fake.count("GET", "/user"), 3);
    assert_eq!(gh.requests_sent(), 3);
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 502, 200]);

    // POSTs that are harmless twice are retried too.
    let n = fake.add_issue(OWNER, REPO, "x", None, &[]);
    fake.fail_next(
        Some(("POST", "/repos/{o}/{r}/issues/{n}/labels")),
        2,
        Fault::Status(503),
    );
    gh.add_labels(OWNER, REPO, n, &["bug"]).await.unwrap();
    assert_eq!(fake.count("POST", "/repos/{o}/{r}/issues/{n}/labels"), 3);
    assert_eq!(fake.issue(OWNER, REPO, n).unwrap().labels.len(), 1);
}

#[tokio::test]
async fn a_comment_is_not_sent_again_after_a_failure_but_after_a_rate_limit() {
    let fake = fake();
    let gh = client_with(&fake, |c| c.request_timeout = Duration::from_millis(300));
    let n = fake.add_issue(OWNER, REPO, "x", None, &[]);
    let route = ("POST", "/repos/{o}/{r}/issues/{n}/comments");
    fake.fail_next(Some(route), 1, Fault::Status(502));
    let err = gh
        .create_comment(OWNER, REPO, n, "hello")
        .await
        .unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert_eq!(fake.count(route.0, route.1), 1);
    // A hung request is not sent again either.
    fake.fail_next(Some(route), 1, Fault::Timeout(Duration::from_millis(600)));
    let err = gh
        .create_comment(OWNER, REPO, n, "hello")
        .await
        .unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert_eq!(gh.requests_sent(), 2);
    // A rate-limit refusal stored nothing: it is waited out and sent again.
    fake.fail_next(
        Some(route),
        1,
        Fault::SecondaryRateLimit {
            retry_after_secs: 1,
        },
    );
    gh.create_comment(OWNER, REPO, n, "hello").await.unwrap();
    assert_eq!(gh.requests_sent(), 4);
    assert_eq!(fake.count(route.0, route.1), 4);
    assert_eq!(fake.issue(OWNER, REPO, n).unwrap().comments.len(), 1);
}

#[tokio::test]
async fn too_many_server_errors_are_unavailable() {
    let fake = fake();
    let gh = client_with(&fake, |c| c.max_retries = 2);
    fake.fail_next(None, 10, Fault::Status(503));

    let err = gh.repository(OWNER, REPO).await.unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(text.contains("503"), "{text}");
    assert!(text.contains("3 attempts"), "{text}");
    assert_no_token(&text);
    assert_eq!(fake.count("GET", "/repos/{o}/{r}"), 3, "1 + max_retries");
    assert_eq!(gh.requests_sent(), 3);
}

#[tokio::test]
async fn a_hung_request_times_out_and_is_retried() {
    let fake = fake();
    let gh = client_with(&fake, |c| c.request_timeout = Duration::from_millis(300));
    fake.fail_next(
        Some(("GET", "/user")),
        1,
        Fault::Timeout(Duration::from_secs(3)),
    );

    let started = Instant::now();
    gh.current_user().await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(
        took < Duration::from_secs(2),
        "did not wait for the hung answer: {took:?}"
    );
    assert_eq!(fake.count("GET", "/user"), 2);
    assert_eq!(gh.requests_sent(), 2);

    // Always hung: Unavailable after 1 + max_retries attempts.
    let gh = client_with(&fake, |c| {
        c.request_timeout = Duration::from_millis(200);
        c.max_retries = 1;
    });
    fake.fail_next(
        Some(("GET", "/user")),
        2,
        Fault::Timeout(Duration::from_secs(3)),
    );
    let err = gh.current_user().await.unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert_eq!(gh.requests_sent(), 2);
}

#[tokio::test]
async fn connection_errors_are_retried_then_unavailable() {
    // A port nothing listens on, held for the whole test: a socket bound but never
    // listening refuses every connection, and no other test can take the port meanwhile.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = held.local_addr().unwrap().port();
    let gh = GitHub::new(
        &ClientConfig {
            max_retries: 3,
            ..config(&format!("http://127.0.0.1:{port}"))
        },
        TOKEN,
    )
    .unwrap();
    let err = gh.current_user().await.unwrap_err();
    assert!(matches!(err, CodeHostError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("connection error"), "{err}");
    assert_no_token(&err.to_string());
    assert_eq!(gh.requests_sent(), 4);
}

// ----- rate limits -----

/// Rate limits the client waits out: how the fake is set up, then `current_user` or
/// `repository` succeeds no sooner than the wait, and the statuses the fake answered.
#[tokio::test]
async fn rate_limits_are_waited_out() {
    let fault = |route: Option<(&'static str, &'static str)>, fault: Fault| {
        move |fake: &FakeGitHub| fake.fail_next(route, 1, fault)
    };
    /// What makes the fake limit the next request.
    type SetUp = Box<dyn FnOnce(&FakeGitHub)>;
    /// The call that is limited.
    enum Call {
        CurrentUser,
        Repository,
    }
    let cases: [(&str, SetUp, Call, Duration, [u16; 2]); 3] = [
        (
            "a primary limit with Retry-After",
            Box::new(fault(
                Some(("GET", "/user")),
                Fault::RateLimited {
                    retry_after_secs: 1,
                },
            )),
            Call::CurrentUser,
            Duration::from_secs(1),
            [403, 200],
        ),
        (
            "a secondary limit",
            Box::new(fault(
                None,
                Fault::SecondaryRateLimit {
                    retry_after_secs: 1,
                },
            )),
            Call::Repository,
            Duration::from_secs(1),
            [429, 200],
        ),
        (
            // GitHub's primary limit: 403, X-RateLimit-Remaining 0, no Retry-After.
            "a used-up window, until the reset",
            Box::new(|fake: &FakeGitHub| {
                fake.set_rate_limit_remaining(0);
                fake.set_rate_limit_reset_in(Duration::from_secs(1));
            }),
            Call::CurrentUser,
            Duration::from_millis(900),
            [403, 200],
        ),
    ];
    for (what, set_up, call, wait, statuses) in cases {
        let fake = fake();
        let gh = client(&fake);
        set_up(&fake);
        let started = Instant::now();
        match call {
            Call::CurrentUser => gh.current_user().await.map(drop),
            Call::Repository => gh.repository(OWNER, REPO).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let took = started.elapsed();
        assert!(took >= wait, "{what}: {took:?}");
        assert!(took < wait + Duration::from_secs(2), "{what}: {took:?}");
        let answered: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
        assert_eq!(answered, statuses, "{what}");
    }
}

#[tokio::test]
async fn a_long_rate_limit_is_an_error_and_sends_nothing_more() {
    let fake = fake();
    let gh = client_with(&fake, |c| c.max_rate_limit_wait = Duration::from_secs(2));
    fake.fail_next(
        None,
        1,
        Fault::RateLimited {
            retry_after_secs: 5,
        },
    );
    let started = Instant::now();
    let err = gh.current_user().await.unwrap_err();
    assert_eq!(
        err,
        CodeHostError::RateLimited {
            retry_after: Duration::from_secs(5)
        }
    );
    assert!(err.is_transient());
    assert!(err.to_string().contains("retry after 5 s"), "{err}");
    assert_eq!(fake.count("*", "/user"), 1);

    // The answer said the window is used up until the reset: the next call does not even ask.
    let err = gh.repository(OWNER, REPO).await.unwrap_err();
    match err {
        CodeHostError::RateLimited { retry_after } => {
            assert!(retry_after > Duration::from_secs(2), "{retry_after:?}");
            assert!(retry_after <= Duration::from_secs(5), "{retry_after:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(gh.requests_sent(), 1);
    assert!(started.elapsed() < Duration::from_secs(1), "no sleeping");
}

#[tokio::test]
async fn the_last_request_of_a_window_makes_the_next_call_wait() {
    // The answer that used the last unit says Remaining: 0 with a reset an hour away
    // (longer than the default 15 min): the client does not send a request bound to fail.
    let fake = fake();
    let gh = client(&fake);
    fake.set_rate_limit_remaining(1);
    gh.current_user().await.unwrap();
    assert_eq!(gh.rate_limit().map(|(remaining, _)| remaining), Some(0));
    let err = gh.current_user().await.unwrap_err();
    match err {
        CodeHostError::RateLimited { retry_after } => {
            assert!(
                retry_after > Duration::from_secs(15 * 60),
                "{retry_after:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.count("GET", "/user"), 1);
}

// ----- secrets and configuration -----

#[tokio::test]
async fn the_token_never_shows() {
    let fake = fake();
    let gh = client_with(&fake, |c| {
        c.max_retries = 0;
        c.max_rate_limit_wait = Duration::from_millis(100);
    });
    assert_no_token(&format!("{gh:?}"));
    assert_no_token(&format!("{:?}", gh.clone()));

    let n = fake.add_issue(OWNER, REPO, "x", None, &[]);
    let mut errors = vec![
        gh.repository(OWNER, "nope").await.unwrap_err(),
        gh.create_comment(OWNER, REPO, n, "").await.unwrap_err(),
    ];
    fake.fail_next(None, 1, Fault::Status(500));
    errors.push(gh.current_user().await.unwrap_err());
    fake.fail_next(
        None,
        1,
        Fault::RateLimited {
            retry_after_secs: 1,
        },
    );
    errors.push(gh.current_user().await.unwrap_err());
    fake.remove_token(TOKEN);
    // Past the rate-limit window announced above.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    errors.push(gh.current_user().await.unwrap_err());
    assert!(
        matches!(errors[4], CodeHostError::Unauthorized(_)),
        "{:?}",
        errors[4]
    );
    for e in &errors {
        assert_no_token(&e.to_string());
        assert_no_token(&format!("{e:?}"));
    }
    for bad in [
        format!("{TOKEN}\nx"),
        format!("{TOKEN} x"),
        format!("{TOKEN}\u{e9}"),
    ] {
        let err = GitHub::new(&config(&fake.base_url()), &bad).unwrap_err();
        assert!(matches!(err, CodeHostError::Config(_)), "{err:?}");
        assert_no_token(&err.to_string());
    }
}

#[test]
fn bad_configuration_is_refused() {
    let config = |url: &str| ClientConfig {
        api_url: url.to_owned(),
        ..ClientConfig::default()
    };
    for url in ["", "api.github.com", "ftp://h", "https://", "https://u:p@h"] {
        assert!(
            matches!(
                GitHub::new(&config(url), TOKEN),
                Err(CodeHostError::Config(_))
            ),
            "{url}"
        );
    }
    let empty_ua = ClientConfig {
        user_agent: " ".into(),
        ..ClientConfig::default()
    };
    assert!(matches!(
        GitHub::new(&empty_ua, TOKEN),
        Err(CodeHostError::Config(_))
    ));
    assert!(matches!(
        GitHub::new(&ClientConfig::default(), ""),
        Err(CodeHostError::Config(_))
    ));
    let defaults = ClientConfig::default();
    assert_eq!(defaults.api_url, "https://api.github.com");
    assert_eq!(defaults.user_agent, "agentry");
    assert_eq!(defaults.request_timeout, Duration::from_secs(30));
    assert_eq!(defaults.max_retries, 5);
    assert_eq!(defaults.backoff_base, Duration::from_millis(500));
    assert_eq!(defaults.backoff_max, Duration::from_secs(30));
    assert_eq!(defaults.max_rate_limit_wait, Duration::from_secs(900));
}

#[test]
fn a_client_outlives_the_runtime_it_was_first_used_on() {
    let fake = fake();
    // Built without a runtime.
    let gh = client(&fake);
    for _ in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let user = runtime.block_on(gh.current_user()).unwrap();
        assert_eq!(user.login, "agentry-bot");
        drop(runtime);
    }
    assert_eq!(gh.requests_sent(), 3);
    assert_eq!(fake.count("GET", "/user"), 3);
}

// ----- the bytes on the wire (a scripted server) -----

/// A scripted answer: status, extra headers, body.
type Answer = (u16, Vec<(String, String)>, String);

/// A minimal HTTP/1.1 server: answers each request with `respond(request head)` and closes
/// the connection; keeps every request head.
struct Scripted {
    addr: std::net::SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    async fn start(respond: fn(&str, &str) -> Answer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&heads);
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                let origin = format!("http://{addr}");
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    seen.lock().unwrap().push(head.clone());
                    let (status, headers, body) = respond(&origin, &head);
                    let headers: String = headers
                        .iter()
                        .map(|(k, v)| format!("{k}: {v}\r\n"))
                        .collect();
                    let out = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(out.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Scripted { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

fn issue_json(number: u64) -> String {
    format!(
        r#"{{"number":{number},"title":"t{number}","body":null,"html_url":"h","state":"open",
        "user":{{"login":"u"}},"labels":[],"created_at":"2024-05-01T10:00:00Z",
        "updated_at":"2024-05-01T10:00:00Z","closed_at":null}}"#
    )
}

/// GHES-style routes under `/api/v3`: `/user`, and three pages of issues whose `Link`s are
/// absolute, the second pointing at another host.
fn ghes(origin: &str, head: &str) -> Answer {
    let target = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let link = |url: String| vec![("Link".to_owned(), format!("<{url}>; rel=\"next\""))];
    if target == "/api/v3/user" {
        return (200, vec![], r#"{"login":"bot","id":7}"#.to_owned());
    }
    if let Some(query) = target.strip_prefix("/api/v3/repos/o/r/issues?") {
        if !query.contains("&page=") {
            return (
                200,
                link(format!(
                    "{origin}/api/v3/repos/o/r/issues?per_page=100&page=2"
                )),
                format!("[{},{}]", issue_json(1), issue_json(2)),
            );
        }
        if query.contains("&page=2") {
            return (
                200,
                link("https://elsewhere.example/repos/o/r/issues?per_page=100&page=3".to_owned()),
                format!("[{}]", issue_json(3)),
            );
        }
        if query.contains("&page=3") {
            return (200, vec![], format!("[{}]", issue_json(4)));
        }
    }
    (404, vec![], r#"{"message":"Not Found"}"#.to_owned())
}

fn header_lines<'h>(head: &'h str, name: &str) -> Vec<&'h str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect()
}

#[tokio::test]
async fn every_request_carries_the_headers_once_under_the_base_path() {
    let server = Scripted::start(ghes).await;
    let gh = GitHub::new(&config(&format!("http://{}/api/v3/", server.addr)), TOKEN).unwrap();

    let user = gh.current_user().await.unwrap();
    assert_eq!((user.login.as_str(), user.id), ("bot", 7));

    let (issues, _) = match gh.open_issues("o", "r", None).await.unwrap() {
        Conditional::Modified { value, etag } => (value, etag),
        Conditional::NotModified => panic!("304"),
    };
    let numbers: Vec<u64> = issues.iter().map(|i| i.number).collect();
    assert_eq!(numbers, [1, 2, 3, 4]);

    let heads = server.heads();
    let targets: Vec<&str> = heads
        .iter()
        .map(|h| h.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "/api/v3/user",
            "/api/v3/repos/o/r/issues?state=open&sort=updated&direction=desc&per_page=100",
            "/api/v3/repos/o/r/issues?per_page=100&page=2",
            // The link to another host was followed on this one, under the base path.
            "/api/v3/repos/o/r/issues?per_page=100&page=3",
        ]
    );

    // Every other method stays under the base path too (this server answers them 404).
    let not_found = |r: Result<(), CodeHostError>| {
        assert!(matches!(r, Err(CodeHostError::NotFound(_))), "{r:?}");
    };
    not_found(gh.repository("o", "r").await.map(drop));
    not_found(gh.issue("o", "r", 1).await.map(drop));
    not_found(gh.close_issue("o", "r", 1).await);
    not_found(gh.ensure_label("o", "r", "agentry", "6f42c1").await);
    not_found(gh.add_labels("o", "r", 1, &["agentry"]).await);
    not_found(gh.issue_comments("o", "r", 1).await.map(drop));
    not_found(gh.create_comment("o", "r", 1, "hi").await.map(drop));
    not_found(
        gh.pulls_updated_since("o", "r", Some("\"e\""), None)
            .await
            .map(drop),
    );
    not_found(gh.pull("o", "r", 1).await.map(drop));
    not_found(
        gh.create_pull("o", "r", "t", "h", "main", "b")
            .await
            .map(drop),
    );
    not_found(gh.create_review("o", "r", 1, "b").await);

    let heads = server.heads();
    assert_eq!(heads.len(), 4 + 12, "ensure_label: a GET and a POST");
    for head in &heads {
        let (method, target) = {
            let mut words = head.split_whitespace();
            (words.next().unwrap(), words.next().unwrap())
        };
        assert!(target.starts_with("/api/v3/"), "{head}");
        assert_eq!(
            header_lines(head, "authorization"),
            [format!("Bearer {TOKEN}")]
        );
        assert_eq!(header_lines(head, "user-agent"), ["agentry-tests"]);
        assert_eq!(
            header_lines(head, "accept"),
            ["application/vnd.github+json"]
        );
        assert_eq!(header_lines(head, "x-github-api-version"), ["2022-11-28"]);
        assert_eq!(header_lines(head, "host"), [server.addr.to_string()]);
        let conditional = target.starts_with("/api/v3/repos/o/r/pulls?");
        assert_eq!(
            header_lines(head, "if-none-match"),
            if conditional { vec!["\"e\""] } else { vec![] },
            "{head}"
        );
        if method == "POST" || method == "PATCH" {
            assert_eq!(header_lines(head, "content-type"), ["application/json"]);
        }
    }
}

#[tokio::test]
async fn a_body_that_does_not_parse_is_an_invalid_response() {
    fn garbage(_: &str, _: &str) -> Answer {
        (200, vec![], r#"{"login": 42}"#.to_owned())
    }
    let server = Scripted::start(garbage).await;
    let gh = GitHub::new(&config(&format!("http://{}", server.addr)), TOKEN).unwrap();
    let err = gh.current_user().await.unwrap_err();
    assert!(matches!(err, CodeHostError::InvalidResponse(_)), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("GET /user"), "{err}");
    assert_eq!(gh.requests_sent(), 1);
}
