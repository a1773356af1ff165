//! The fake GitHub over real HTTP: raw checks with reqwest, and octocrab to prove that its
//! JSON deserializes into octocrab's models.
#![allow(
    clippy::unwrap_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use std::time::{Duration, Instant};

use agentry_fake_github::{FakeGitHub, Fault};
use octocrab::Octocrab;
use octocrab::models::IssueState as OctoIssueState;
use octocrab::params::{Direction, State, pulls::Sort};
use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::{Value, json};

const TOKEN: &str = "ghp_test_token";
const UA: &str = "agentry-tests";

/// A fake with one user (`agentry-bot`, token [`TOKEN`]) and the repository `acme/widgets`.
fn fake() -> FakeGitHub {
    let fake = FakeGitHub::start();
    fake.add_token(TOKEN, "agentry-bot");
    fake.add_repo("acme", "widgets", "main");
    fake
}

fn client() -> Client {
    client_timing_out_after(Duration::from_secs(10))
}

fn client_timing_out_after(timeout: Duration) -> Client {
    Client::builder()
        .user_agent(UA)
        .timeout(timeout)
        .build()
        .unwrap()
}

fn req(fake: &FakeGitHub, method: reqwest::Method, path: &str) -> RequestBuilder {
    client()
        .request(method, format!("{}{path}", fake.base_url()))
        .bearer_auth(TOKEN)
}

fn get(fake: &FakeGitHub, path: &str) -> Response {
    req(fake, reqwest::Method::GET, path).send().unwrap()
}

fn send_json(fake: &FakeGitHub, method: reqwest::Method, path: &str, body: &Value) -> Response {
    req(fake, method, path).json(body).send().unwrap()
}

fn post(fake: &FakeGitHub, path: &str, body: &Value) -> Response {
    send_json(fake, reqwest::Method::POST, path, body)
}

/// `GET path` with `If-None-Match: etag`.
fn get_if_none_match(fake: &FakeGitHub, path: &str, etag: &str) -> Response {
    req(fake, reqwest::Method::GET, path)
        .header("If-None-Match", etag)
        .send()
        .unwrap()
}

fn header(resp: &Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The `message` of an error answer.
fn message(resp: Response) -> String {
    json_of(resp)["message"].as_str().unwrap().to_owned()
}

/// How many items a list answer holds.
fn len_of(resp: Response) -> usize {
    json_of(resp).as_array().unwrap().len()
}

fn json_of(resp: Response) -> Value {
    let ct = header(&resp, "content-type").unwrap_or_default();
    assert_eq!(ct, "application/json; charset=utf-8");
    resp.json().unwrap()
}

fn remaining(resp: &Response) -> u64 {
    header(resp, "x-ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap()
}

/// Makes the next `n` requests `GET /repos/{owner}/{repo}` answer 502.
fn fail_repo_gets(fake: &FakeGitHub, n: usize) {
    fake.fail_next(
        Some(("GET", "/repos/{owner}/{repo}")),
        n,
        Fault::Status(502),
    );
}

/// Asserts that `resp` is a 502 with GitHub's message.
#[track_caller]
fn assert_bad_gateway(resp: Response) {
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(json_of(resp)["message"], "Bad Gateway");
}

/// The answer to `GET path` once the next request (whatever its route) is made to fail with
/// `fault`.
fn faulted(fake: &FakeGitHub, fault: Fault, path: &str) -> Response {
    fake.fail_next(None, 1, fault);
    get(fake, path)
}

fn octo(fake: &FakeGitHub) -> Octocrab {
    Octocrab::builder()
        .base_uri(fake.base_url())
        .unwrap()
        .personal_token(TOKEN.to_owned())
        .build()
        .unwrap()
}

fn status_of(err: &octocrab::Error) -> u16 {
    match err {
        octocrab::Error::GitHub { source, .. } => source.status_code.as_u16(),
        other => panic!("not a GitHub error: {other:?}"),
    }
}

// ----- authentication -----

#[test]
fn auth_user_agent_and_repo_access() {
    let fake = fake();
    fake.add_repo("acme", "secret", "main");
    fake.add_token_with_access("ghp_narrow", "narrow", &["acme/widgets"]);

    // Unknown token → 401 Bad credentials, as JSON.
    let resp = client()
        .get(format!("{}/user", fake.base_url()))
        .bearer_auth("ghp_unknown")
        .send()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body = json_of(resp);
    assert_eq!(body["message"], "Bad credentials");
    assert!(
        body["documentation_url"]
            .as_str()
            .unwrap()
            .starts_with("https://docs.github.com")
    );

    // No Authorization at all → 401 too.
    let resp = client()
        .get(format!("{}/user", fake.base_url()))
        .send()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_of(resp)["message"], "Requires authentication");

    // No User-Agent → 403 (reqwest sends none unless told).
    let resp = reqwest::blocking::Client::new()
        .get(format!("{}/user", fake.base_url()))
        .bearer_auth(TOKEN)
        .send()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(message(resp).contains("User-Agent"));

    // `token x` works like `Bearer x`.
    let resp = client()
        .get(format!("{}/user", fake.base_url()))
        .header("Authorization", format!("token {TOKEN}"))
        .send()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let user = json_of(resp);
    assert_eq!(user["login"], "agentry-bot");
    assert!(user["id"].as_u64().unwrap() > 0);

    // A token limited to acme/widgets sees it, but acme/secret is a 404 like GitHub's.
    let narrow = |path: &str| {
        client()
            .get(format!("{}{path}", fake.base_url()))
            .bearer_auth("ghp_narrow")
            .send()
            .unwrap()
    };
    assert_eq!(narrow("/repos/acme/widgets").status(), StatusCode::OK);
    let resp = narrow("/repos/acme/secret");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(resp)["message"], "Not Found");
    assert_eq!(
        narrow("/repos/acme/secret/issues").status(),
        StatusCode::NOT_FOUND
    );
    // A repository that does not exist at all looks the same.
    assert_eq!(
        get(&fake, "/repos/acme/nope").status(),
        StatusCode::NOT_FOUND
    );
    // Owner and name are case-insensitive.
    assert_eq!(get(&fake, "/repos/ACME/Widgets").status(), StatusCode::OK);

    // Revoked tokens stop working.
    fake.remove_token("ghp_narrow");
    assert_eq!(
        narrow("/repos/acme/widgets").status(),
        StatusCode::UNAUTHORIZED
    );

    assert_eq!(fake.count_status(401), 3);
    assert_eq!(fake.count_status(403), 1);
    let records = fake.requests();
    assert!(!records[1].authorization);
    assert!(records[0].authorization);
}

// ----- pagination -----

#[test]
fn a_frozen_clock_and_same_second_order_by_number() {
    let fake = fake();
    fake.freeze_clock();
    let t = fake.now_unix();
    for i in 0..3 {
        fake.add_issue("acme", "widgets", &format!("issue {i}"), None, &[]);
    }
    fake.add_label("acme", "widgets", 1, "bug");
    fake.close_issue("acme", "widgets", 2);
    for n in 1..=3 {
        let issue = fake.issue("acme", "widgets", n).unwrap();
        assert_eq!(
            time::OffsetDateTime::parse(
                &issue.updated_at,
                &time::format_description::well_known::Rfc3339
            )
            .unwrap()
            .unix_timestamp(),
            t
        );
    }
    let numbers = |v: Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i["number"].as_u64().unwrap())
            .collect()
    };
    let path = "/repos/acme/widgets/issues?state=all&sort=updated&direction=desc";
    // By default the latest update comes first; by number, the second does not count.
    assert_eq!(numbers(json_of(get(&fake, path))), [2, 1, 3]);
    fake.order_same_second_by_number(true);
    assert_eq!(numbers(json_of(get(&fake, path))), [3, 2, 1]);
    // `since` is inclusive; a later second excludes them all.
    let at = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let since = |secs: i64| format!("{path}&since={}", at(secs));
    assert_eq!(numbers(json_of(get(&fake, &since(t)))).len(), 3);
    assert_eq!(numbers(json_of(get(&fake, &since(t + 1)))).len(), 0);
    fake.advance_clock(Duration::from_secs(10));
    assert_eq!(fake.now_unix(), t + 10);
    fake.add_label("acme", "widgets", 3, "later");
    assert_eq!(numbers(json_of(get(&fake, &since(t + 1)))), [3]);
    fake.unfreeze_clock();
    assert!(fake.now_unix() >= t + 10);
}

/// A fake whose acme/widgets holds 245 open issues (numbers 1–245, with this body and these
/// labels) and then 5 open pull requests (246–250): three pages of 100.
fn fake_with_245_issues_and_5_pulls(body: Option<&str>, labels: &[&str]) -> FakeGitHub {
    let fake = fake();
    for i in 0..245 {
        fake.add_issue("acme", "widgets", &format!("issue {i}"), body, labels);
    }
    for i in 0..5 {
        fake.add_pull(
            "acme",
            "widgets",
            &format!("pr {i}"),
            &format!("feature-{i}"),
            "main",
        );
    }
    fake
}

#[test]
fn issues_paginate_with_link_headers_and_include_pulls() {
    let fake = fake_with_245_issues_and_5_pulls(Some("body"), &[]);
    let base = fake.base_url();

    let page1 = get(&fake, "/repos/acme/widgets/issues?state=open&per_page=100");
    assert_eq!(page1.status(), StatusCode::OK);
    let link = header(&page1, "link").unwrap();
    assert!(
        link.contains(&format!(
            "<{base}/repos/acme/widgets/issues?state=open&per_page=100&page=2>; rel=\"next\""
        )),
        "{link}"
    );
    assert!(link.contains(&format!(
        "<{base}/repos/acme/widgets/issues?state=open&per_page=100&page=3>; rel=\"last\""
    )));
    assert!(!link.contains("rel=\"prev\""));
    let items = json_of(page1);
    assert_eq!(items.as_array().unwrap().len(), 100);
    // Newest first by default.
    assert_eq!(items[0]["number"], 250);

    let page2 = get(
        &fake,
        "/repos/acme/widgets/issues?state=open&per_page=100&page=2",
    );
    let link = header(&page2, "link").unwrap();
    for rel in ["prev", "next", "last", "first"] {
        assert!(link.contains(&format!("rel=\"{rel}\"")), "{link}");
    }
    assert_eq!(len_of(page2), 100);

    let page3 = get(
        &fake,
        "/repos/acme/widgets/issues?state=open&per_page=100&page=3",
    );
    let link = header(&page3, "link").unwrap();
    assert!(link.contains(&format!(
        "<{base}/repos/acme/widgets/issues?state=open&per_page=100&page=2>; rel=\"prev\""
    )));
    assert!(!link.contains("rel=\"next\""));
    let last = json_of(page3);
    assert_eq!(last.as_array().unwrap().len(), 50);

    // Pull requests are in the list, with a `pull_request` object, like GitHub's.
    let all: Vec<Value> = [items, last]
        .iter()
        .flat_map(|v| v.as_array().unwrap().clone())
        .collect();
    let pulls: Vec<&Value> = all
        .iter()
        .filter(|i| i.get("pull_request").is_some())
        .collect();
    assert_eq!(pulls.len(), 5);
    assert!(
        pulls[0]["pull_request"]["url"]
            .as_str()
            .unwrap()
            .contains("/pulls/")
    );
    assert!(pulls[0]["html_url"].as_str().unwrap().contains("/pull/"));

    // Default page size 30, capped at 100; a single page has no Link header.
    assert_eq!(len_of(get(&fake, "/repos/acme/widgets/issues")), 30);
    assert_eq!(
        len_of(get(&fake, "/repos/acme/widgets/issues?per_page=1000")),
        100
    );
    let one = get(&fake, "/repos/acme/widgets/issues?labels=nothing-has-this");
    assert!(header(&one, "link").is_none());
    assert_eq!(json_of(one), json!([]));
    // Past the end: an empty page.
    assert_eq!(
        json_of(get(&fake, "/repos/acme/widgets/issues?page=99")),
        json!([])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn octocrab_reads_every_page_of_issues() {
    let fake = fake_with_245_issues_and_5_pulls(None, &["bug"]);
    let gh = octo(&fake);
    let first = gh
        .issues("acme", "widgets")
        .list()
        .state(State::Open)
        .per_page(100)
        .send()
        .await
        .unwrap();
    assert_eq!(first.items.len(), 100);
    assert!(first.next.is_some());
    assert_eq!(first.number_of_pages(), Some(3));
    let all = gh.all_pages(first).await.unwrap();
    assert_eq!(all.len(), 250);
    assert_eq!(all.iter().filter(|i| i.pull_request.is_some()).count(), 5);
    let issue = all.iter().find(|i| i.pull_request.is_none()).unwrap();
    assert_eq!(issue.labels[0].name, "bug");
    assert_eq!(issue.labels[0].color, "ededed");
    assert_eq!(issue.user.login, "acme");
    assert_eq!(fake.count("GET", "/repos/{owner}/{repo}/issues"), 3);
}

// ----- conditional requests -----

#[test]
fn etags_give_304s_that_cost_no_rate_limit() {
    let fake = fake();
    let n = fake.add_issue("acme", "widgets", "Fix it", Some("please"), &[]);
    let path = format!("/repos/acme/widgets/issues/{n}");

    let first = get(&fake, &path);
    assert_eq!(first.status(), StatusCode::OK);
    let etag = header(&first, "etag").unwrap();
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag.len() == 66,
        "{etag}"
    );
    let before = remaining(&first);
    let bytes = first.bytes().unwrap();
    // The ETag is the SHA-256 of the exact body.
    assert_eq!(etag, format!("\"{}\"", sha256_hex(&bytes)));

    for _ in 0..3 {
        let again = get_if_none_match(&fake, &path, &etag);
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(remaining(&again), before, "a 304 costs nothing");
        assert_eq!(header(&again, "etag").as_deref(), Some(etag.as_str()));
        assert!(header(&again, "x-ratelimit-reset").is_some());
        assert!(again.bytes().unwrap().is_empty());
    }
    // A non-matching ETag is a normal 200 that costs one.
    let other = get_if_none_match(&fake, &path, "\"0000\"");
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(remaining(&other), before - 1);
    assert_eq!(fake.rate_limit_remaining(), before - 1);
    assert_eq!(fake.count_status(304), 3);
    assert_eq!(
        fake.requests().iter().filter(|r| r.if_none_match).count(),
        4
    );

    // Each kind of change gives a new ETag, on the issue and on the list.
    let list_path = "/repos/acme/widgets/issues?state=all";
    let mut issue_etag = etag;
    let mut list_etag = header(&get(&fake, list_path), "etag").unwrap();
    let changes: Vec<Box<dyn Fn()>> = vec![
        Box::new(|| fake.add_label("acme", "widgets", n, "agentry")),
        Box::new(|| fake.set_issue_body("acme", "widgets", n, Some("new body"))),
        Box::new(|| fake.close_issue("acme", "widgets", n)),
        Box::new(|| fake.reopen_issue("acme", "widgets", n)),
        Box::new(|| {
            let r = send_json(
                &fake,
                reqwest::Method::PATCH,
                &format!("/repos/acme/widgets/issues/{n}"),
                &json!({"title": "Fix it now"}),
            );
            assert_eq!(r.status(), StatusCode::OK);
        }),
        Box::new(|| {
            fake.add_comment("acme", "widgets", n, "someone", "me too");
        }),
    ];
    for change in changes {
        change();
        let resp = get_if_none_match(&fake, &path, &issue_etag);
        assert_eq!(resp.status(), StatusCode::OK);
        let new = header(&resp, "etag").unwrap();
        assert_ne!(new, issue_etag);
        issue_etag = new;
        let resp = get_if_none_match(&fake, list_path, &list_etag);
        assert_eq!(resp.status(), StatusCode::OK);
        let new = header(&resp, "etag").unwrap();
        assert_ne!(new, list_etag);
        list_etag = new;
    }
    // And without a change, the list is a 304 again.
    let resp = get_if_none_match(&fake, list_path, &list_etag);
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn rate_limit_counts_down_and_blocks_at_zero() {
    let fake = fake();
    let resp = get(&fake, "/user");
    assert_eq!(header(&resp, "x-ratelimit-limit").as_deref(), Some("5000"));
    assert_eq!(remaining(&resp), 4999);
    assert_eq!(header(&resp, "x-ratelimit-used").as_deref(), Some("1"));
    let reset: i64 = header(&resp, "x-ratelimit-reset").unwrap().parse().unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(reset > now && reset <= now + 3600);

    fake.set_rate_limit_remaining(1);
    let resp = get(&fake, "/repos/acme/widgets");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(remaining(&resp), 0);
    let resp = get(&fake, "/repos/acme/widgets");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(remaining(&resp), 0);
    assert!(header(&resp, "x-ratelimit-reset").is_some());
    assert!(message(resp).starts_with("API rate limit exceeded"));

    // When the window ends, the budget comes back.
    fake.set_rate_limit_reset_in(Duration::ZERO);
    let resp = get(&fake, "/repos/acme/widgets");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(remaining(&resp), 4999);
}

// ----- labels and comments -----

#[test]
fn labels_create_exists_and_add() {
    let fake = fake();
    let n = fake.add_issue("acme", "widgets", "Fix it", None, &[]);

    let missing = get(&fake, "/repos/acme/widgets/labels/agentry");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(missing)["message"], "Not Found");

    let created = post(
        &fake,
        "/repos/acme/widgets/labels",
        &json!({"name": "agentry", "color": "6f42c1", "description": "Worked on by agentry"}),
    );
    assert_eq!(created.status(), StatusCode::CREATED);
    assert!(
        header(&created, "location")
            .unwrap()
            .ends_with("/repos/acme/widgets/labels/agentry")
    );
    let label = json_of(created);
    assert_eq!(label["name"], "agentry");
    assert_eq!(label["color"], "6f42c1");
    assert_eq!(label["default"], false);

    let again = post(
        &fake,
        "/repos/acme/widgets/labels",
        &json!({"name": "Agentry", "color": "000000"}),
    );
    assert_eq!(again.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = json_of(again);
    assert_eq!(body["message"], "Validation Failed");
    assert_eq!(body["errors"][0]["code"], "already_exists");
    assert_eq!(body["errors"][0]["resource"], "Label");
    assert_eq!(body["errors"][0]["field"], "name");

    // Lookup is case-insensitive; names with spaces are percent-encoded.
    assert_eq!(
        get(&fake, "/repos/acme/widgets/labels/AGENTRY").status(),
        StatusCode::OK
    );

    let added = post(
        &fake,
        &format!("/repos/acme/widgets/issues/{n}/labels"),
        &json!({"labels": ["agentry", "good first issue"]}),
    );
    assert_eq!(added.status(), StatusCode::OK);
    let labels = json_of(added);
    assert_eq!(labels.as_array().unwrap().len(), 2);
    assert_eq!(labels[1]["name"], "good first issue");
    assert!(
        labels[1]["url"]
            .as_str()
            .unwrap()
            .ends_with("/labels/good%20first%20issue")
    );
    assert_eq!(
        get(&fake, "/repos/acme/widgets/labels/good%20first%20issue").status(),
        StatusCode::OK
    );
    // Adding again changes nothing.
    let labels = json_of(post(
        &fake,
        &format!("/repos/acme/widgets/issues/{n}/labels"),
        &json!(["agentry"]),
    ));
    assert_eq!(labels.as_array().unwrap().len(), 2);

    assert_eq!(
        fake.labels("acme", "widgets"),
        vec![
            ("agentry".to_owned(), "6f42c1".to_owned()),
            ("good first issue".to_owned(), "ededed".to_owned()),
        ]
    );
    let issue = fake.issue("acme", "widgets", n).unwrap();
    assert_eq!(issue.labels[0], ("agentry".to_owned(), "6f42c1".to_owned()));

    // Filter the issue list by label; remove one.
    let listed = json_of(get(&fake, "/repos/acme/widgets/issues?labels=agentry"));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let resp = req(
        &fake,
        reqwest::Method::DELETE,
        &format!("/repos/acme/widgets/issues/{n}/labels/good%20first%20issue"),
    )
    .send()
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(len_of(resp), 1);
}

#[test]
fn comments_post_and_list() {
    let fake = fake();
    let n = fake.add_issue("acme", "widgets", "Fix it", None, &[]);
    let path = format!("/repos/acme/widgets/issues/{n}/comments");
    assert_eq!(json_of(get(&fake, &path)), json!([]));

    let resp = post(&fake, &path, &json!({"body": "agentry is on it"}));
    assert_eq!(resp.status(), StatusCode::CREATED);
    let comment = json_of(resp);
    assert_eq!(comment["body"], "agentry is on it");
    assert_eq!(comment["user"]["login"], "agentry-bot");
    assert!(
        comment["html_url"]
            .as_str()
            .unwrap()
            .contains("#issuecomment-")
    );

    let listed = json_of(get(&fake, &path));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], comment["id"]);
    let issue = json_of(get(&fake, &format!("/repos/acme/widgets/issues/{n}")));
    assert_eq!(issue["comments"], 1);

    let empty = post(&fake, &path, &json!({"body": ""}));
    assert_eq!(empty.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let missing = post(&fake, &path, &json!({}));
    assert_eq!(missing.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let nowhere = post(
        &fake,
        "/repos/acme/widgets/issues/999/comments",
        &json!({"body": "x"}),
    );
    assert_eq!(nowhere.status(), StatusCode::NOT_FOUND);

    let state = fake.issue("acme", "widgets", n).unwrap();
    assert_eq!(state.comments.len(), 1);
    assert_eq!(state.comments[0].user, "agentry-bot");
    assert_eq!(state.comments[0].body, "agentry is on it");
}

// ----- octocrab shapes -----

#[tokio::test(flavor = "multi_thread")]
async fn octocrab_models_deserialize() {
    let fake = fake();
    fake.set_clone_url("acme", "widgets", "file:///tmp/agentry/widgets.git");
    let n = fake.add_issue("acme", "widgets", "Fix it", Some("It is broken"), &["bug"]);
    let gh = octo(&fake);

    let me = gh.current().user().await.unwrap();
    assert_eq!(me.login, "agentry-bot");
    let profile: octocrab::models::UserProfile = gh.get("/user", None::<&()>).await.unwrap();
    assert_eq!(profile.login, "agentry-bot");

    let repo = gh.repos("acme", "widgets").get().await.unwrap();
    assert_eq!(repo.name, "widgets");
    assert_eq!(repo.full_name.as_deref(), Some("acme/widgets"));
    assert_eq!(repo.default_branch.as_deref(), Some("main"));
    assert_eq!(
        repo.clone_url.as_ref().map(|u| u.as_str()),
        Some("file:///tmp/agentry/widgets.git")
    );
    assert_eq!(repo.owner.as_ref().unwrap().login, "acme");
    assert_eq!(repo.open_issues_count, Some(1));
    assert!(
        repo.html_url
            .unwrap()
            .as_str()
            .starts_with("https://github.com/acme/widgets")
    );

    let issue = gh.issues("acme", "widgets").get(n).await.unwrap();
    assert_eq!(issue.title, "Fix it");
    assert_eq!(issue.body.as_deref(), Some("It is broken"));
    assert_eq!(issue.state, OctoIssueState::Open);
    assert!(issue.url.as_str().starts_with(&fake.base_url()));

    let comment = gh
        .issues("acme", "widgets")
        .create_comment(n, "agentry is working on this (task 1234)")
        .await
        .unwrap();
    assert_eq!(
        comment.body.as_deref(),
        Some("agentry is working on this (task 1234)")
    );
    assert_eq!(comment.user.login, "agentry-bot");

    let labels = gh
        .issues("acme", "widgets")
        .add_labels(n, &["agentry".to_owned()])
        .await
        .unwrap();
    assert_eq!(
        labels.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["bug", "agentry"]
    );
    let label = gh
        .issues("acme", "widgets")
        .get_label("agentry")
        .await
        .unwrap();
    assert_eq!(label.color, "ededed");
    let err = gh
        .issues("acme", "widgets")
        .get_label("nope")
        .await
        .unwrap_err();
    assert_eq!(status_of(&err), 404);
    let err = gh
        .issues("acme", "widgets")
        .create_label("agentry", "6f42c1", "")
        .await
        .unwrap_err();
    assert_eq!(status_of(&err), 422);

    let comments = gh
        .issues("acme", "widgets")
        .list_comments(n)
        .send()
        .await
        .unwrap();
    assert_eq!(comments.items.len(), 1);

    let closed = gh
        .issues("acme", "widgets")
        .update(n)
        .state(OctoIssueState::Closed)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.state, OctoIssueState::Closed);
    assert!(closed.closed_at.is_some());
    let state = fake.issue("acme", "widgets", n).unwrap();
    assert_eq!(state.state, "closed");
    assert_eq!(state.state_reason.as_deref(), Some("completed"));
    assert_eq!(state.comments.len(), 1);

    let err = gh.repos("acme", "nope").get().await.unwrap_err();
    assert_eq!(status_of(&err), 404);
}

// ----- pull requests -----

#[tokio::test(flavor = "multi_thread")]
async fn pulls_create_list_sorted_by_update_and_merge() {
    let fake = fake();
    let issue = fake.add_issue("acme", "widgets", "Fix it", None, &[]);
    let p1 = fake.add_pull("acme", "widgets", "first", "agentry/task-1", "main");
    let p2 = fake.add_pull("acme", "widgets", "second", "agentry/task-2", "main");
    assert_eq!((issue, p1, p2), (1, 2, 3));
    let gh = octo(&fake);

    let created = gh
        .pulls("acme", "widgets")
        .create("third", "agentry/task-3", "main")
        .body(format!("Closes #{issue}"))
        .send()
        .await
        .unwrap();
    let p3 = created.number;
    assert_eq!(p3, 4);
    assert_eq!(created.head.ref_field, "agentry/task-3");
    assert_eq!(created.base.ref_field, "main");
    assert_eq!(created.head.sha.len(), 40);
    assert_eq!(created.user.as_ref().unwrap().login, "agentry-bot");
    assert_eq!(created.merged, Some(false));

    // Merging the oldest makes it the most recently updated.
    fake.advance_clock(Duration::from_secs(60));
    fake.merge_pull("acme", "widgets", p1);
    fake.close_pull("acme", "widgets", p2);
    let page = gh
        .pulls("acme", "widgets")
        .list()
        .state(State::All)
        .sort(Sort::Updated)
        .direction(Direction::Descending)
        .send()
        .await
        .unwrap();
    let order: Vec<u64> = page.items.iter().map(|p| p.number).collect();
    assert_eq!(order, [p2, p1, p3]);
    let merged = &page.items[1];
    assert!(merged.merged_at.is_some());
    assert_eq!(merged.state, Some(OctoIssueState::Closed));
    let closed = &page.items[0];
    assert!(closed.merged_at.is_none());
    assert!(closed.closed_at.is_some());

    // Only open ones by default.
    let open = gh.pulls("acme", "widgets").list().send().await.unwrap();
    assert_eq!(
        open.items.iter().map(|p| p.number).collect::<Vec<_>>(),
        [p3]
    );

    let one = gh.pulls("acme", "widgets").get(p1).await.unwrap();
    assert_eq!(one.merged, Some(true));
    assert!(one.merged_at.is_some());
    assert!(one.merge_commit_sha.is_some());
    assert_eq!(one.merged_by.as_ref().unwrap().login, "acme");
    let open_one = gh.pulls("acme", "widgets").get(p3).await.unwrap();
    assert_eq!(open_one.mergeable, Some(true));
    assert_eq!(open_one.body.as_deref(), Some("Closes #1"));

    // 422s: head == base, an open pull request for the same head, missing head.
    for head in ["main", "agentry/task-3"] {
        let err = gh
            .pulls("acme", "widgets")
            .create("x", head, "main")
            .send()
            .await
            .unwrap_err();
        assert_eq!(status_of(&err), 422, "{head}");
    }
    let err = gh.pulls("acme", "widgets").get(issue).await.unwrap_err();
    assert_eq!(status_of(&err), 404, "an issue is not a pull request");

    let pulls = fake.pulls("acme", "widgets");
    assert_eq!(pulls.len(), 3);
    assert!(
        pulls
            .iter()
            .any(|p| p.number == p1 && p.merged && p.state == "closed")
    );
    assert!(
        pulls
            .iter()
            .any(|p| p.number == p2 && !p.merged && p.state == "closed")
    );
    assert!(
        pulls
            .iter()
            .any(|p| p.number == p3 && p.head == "agentry/task-3" && p.user == "agentry-bot")
    );
}

#[test]
fn pulls_raw_filters_reviews_and_merge() {
    let fake = fake();
    fake.add_token("ghp_reviewer", "reviewer");
    let p = fake.add_pull("acme", "widgets", "first", "feature", "main");

    let list = json_of(get(&fake, "/repos/acme/widgets/pulls?head=acme:feature"));
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert!(
        list[0].get("merged").is_none(),
        "the list shape has no `merged`"
    );
    assert_eq!(list[0]["head"]["repo"]["full_name"], "acme/widgets");
    assert_eq!(
        json_of(get(&fake, "/repos/acme/widgets/pulls?base=develop")),
        json!([])
    );

    // A review comment from the author's own token is fine, approving it is not.
    let review = post(
        &fake,
        &format!("/repos/acme/widgets/pulls/{p}/reviews"),
        &json!({"body": "Looks fine to me", "event": "COMMENT"}),
    );
    assert_eq!(review.status(), StatusCode::OK);
    let review = json_of(review);
    assert_eq!(review["state"], "COMMENTED");
    let typed: octocrab::models::pulls::Review = serde_json::from_value(review.clone()).unwrap();
    assert_eq!(typed.body.as_deref(), Some("Looks fine to me"));
    assert_eq!(typed.user.unwrap().login, "agentry-bot");
    assert_eq!(fake.reviews("acme", "widgets", p), ["Looks fine to me"]);
    let approve = client()
        .post(format!(
            "{}/repos/acme/widgets/pulls/{p}/reviews",
            fake.base_url()
        ))
        .bearer_auth("ghp_reviewer")
        .json(&json!({"event": "APPROVE"}))
        .send()
        .unwrap();
    assert_eq!(approve.status(), StatusCode::OK);
    let reviews = json_of(get(
        &fake,
        &format!("/repos/acme/widgets/pulls/{p}/reviews"),
    ));
    assert_eq!(reviews.as_array().unwrap().len(), 2);

    // Merge through the API.
    let merge_path = format!("/repos/acme/widgets/pulls/{p}/merge");
    assert_eq!(get(&fake, &merge_path).status(), StatusCode::NOT_FOUND);
    let merged = send_json(
        &fake,
        reqwest::Method::PUT,
        &merge_path,
        &json!({"merge_method": "squash"}),
    );
    assert_eq!(merged.status(), StatusCode::OK);
    assert_eq!(json_of(merged)["merged"], true);
    assert_eq!(get(&fake, &merge_path).status(), StatusCode::NO_CONTENT);
    let again = send_json(&fake, reqwest::Method::PUT, &merge_path, &json!({}));
    assert_eq!(again.status(), StatusCode::METHOD_NOT_ALLOWED);
    let pull = json_of(get(&fake, &format!("/repos/acme/widgets/pulls/{p}")));
    assert_eq!(pull["merged"], true);
    assert_eq!(pull["state"], "closed");
    // The issue side of the pull request says so too.
    let issue = json_of(get(&fake, &format!("/repos/acme/widgets/issues/{p}")));
    assert!(issue["pull_request"]["merged_at"].is_string());

    assert_eq!(
        fake.count("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
        2
    );
    assert_eq!(fake.count("PUT", "/repos/{o}/{r}/pulls/{n}/merge"), 2);
    assert_eq!(fake.count("*", "/repos/{o}/{r}/pulls/{n}/merge"), 4);
}

// ----- faults -----

#[test]
fn fail_next_502_then_success() {
    let fake = fake();
    fail_repo_gets(&fake, 3);
    for _ in 0..3 {
        assert_bad_gateway(get(&fake, "/repos/acme/widgets"));
    }
    // Other routes are not affected.
    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
    assert_eq!(get(&fake, "/repos/acme/widgets").status(), StatusCode::OK);
    assert_eq!(fake.count("GET", "/repos/{owner}/{repo}"), 4);
    assert_eq!(fake.count_status(502), 3);
    assert_eq!(fake.count("GET", "/user"), 1);
}

#[test]
fn a_lost_answer_still_takes_effect() {
    let fake = fake();
    fake.fail_next(
        Some(("POST", "/repos/{o}/{r}/issues")),
        1,
        Fault::AnswerLost(502),
    );
    let resp = post(
        &fake,
        "/repos/acme/widgets/issues",
        &serde_json::json!({"title": "Created though unanswered"}),
    );
    assert_bad_gateway(resp);
    let issue = fake
        .issue("acme", "widgets", 1)
        .expect("the issue was created");
    assert_eq!(issue.title, "Created though unanswered");
    assert_eq!(fake.count_status(502), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn octocrab_retries_through_three_502s() {
    let fake = fake();
    fail_repo_gets(&fake, 3);
    let repo = octo(&fake).repos("acme", "widgets").get().await.unwrap();
    assert_eq!(repo.name, "widgets");
    assert_eq!(fake.count("GET", "/repos/{owner}/{repo}"), 4);
    assert_eq!(fake.count_status(502), 3);
    assert_eq!(fake.count_status(200), 1);
}

#[test]
fn rate_limit_faults() {
    let fake = fake();
    let limit = Fault::RateLimited {
        retry_after_secs: 7,
    };
    let resp = faulted(&fake, limit, "/repos/acme/widgets/issues");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&resp, "retry-after").as_deref(), Some("7"));
    assert_eq!(remaining(&resp), 0);
    let reset: i64 = header(&resp, "x-ratelimit-reset").unwrap().parse().unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!((now + 5..=now + 9).contains(&reset));
    assert!(message(resp).starts_with("API rate limit exceeded"));

    let limit = Fault::SecondaryRateLimit {
        retry_after_secs: 3,
    };
    let resp = faulted(&fake, limit, "/user");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after").as_deref(), Some("3"));
    assert!(message(resp).contains("secondary rate limit"));

    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
    // Faults cost no rate limit: only the last request counted.
    assert_eq!(fake.rate_limit_remaining(), 4999);
    assert_eq!(fake.count_status(403), 1);
    assert_eq!(fake.count_status(429), 1);
}

#[test]
fn timeout_fault_outlasts_the_client_timeout() {
    let fake = fake();
    fake.fail_next(
        Some(("GET", "/user")),
        1,
        Fault::Timeout(Duration::from_secs(3)),
    );
    let short = client_timing_out_after(Duration::from_millis(300));
    let started = Instant::now();
    let err = short
        .get(format!("{}/user", fake.base_url()))
        .bearer_auth(TOKEN)
        .send()
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The fake recorded it (as the 504 it will eventually answer) and serves the next one.
    assert_eq!(fake.count_status(504), 1);
    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);

    // A client that waits gets the 504.
    let resp = faulted(&fake, Fault::Timeout(Duration::from_millis(200)), "/user");
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(message(resp).contains("in time"));
}

#[test]
fn fail_fraction_is_deterministic() {
    let pattern = |seed: u64| {
        let fake = fake();
        fake.fail_fraction(
            Some(("GET", "/repos/{owner}/{repo}/issues")),
            0.5,
            Fault::Status(500),
            seed,
        );
        let statuses: Vec<u16> = (0..40)
            .map(|_| get(&fake, "/repos/acme/widgets/issues").status().as_u16())
            .collect();
        // Other routes are never faulted.
        assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
        fake.clear_faults();
        assert_eq!(
            get(&fake, "/repos/acme/widgets/issues").status(),
            StatusCode::OK
        );
        statuses
    };
    let a = pattern(42);
    assert_eq!(a, pattern(42));
    assert_ne!(a, pattern(43));
    let failures = a.iter().filter(|&&s| s == 500).count();
    assert!((8..=32).contains(&failures), "{failures} of 40");
}

// ----- accounting -----

#[test]
fn counters_per_route_and_reset() {
    let fake = fake();
    let n = fake.add_issue("acme", "widgets", "Fix it", None, &[]);
    get(&fake, "/repos/acme/widgets/issues");
    get(&fake, "/repos/acme/widgets/issues?state=closed");
    get(&fake, &format!("/repos/acme/widgets/issues/{n}"));
    post(
        &fake,
        &format!("/repos/acme/widgets/issues/{n}/comments"),
        &json!({"body": "hi"}),
    );
    get(&fake, "/nothing/here");

    assert_eq!(fake.count("GET", "/repos/{owner}/{repo}/issues"), 2);
    assert_eq!(
        fake.count("get", "/repos/{owner}/{repo}/issues/{issue_number}"),
        1
    );
    assert_eq!(
        fake.count(
            "POST",
            "/repos/{owner}/{repo}/issues/{issue_number}/comments"
        ),
        1
    );
    assert_eq!(
        fake.count(
            "GET",
            "/repos/{owner}/{repo}/issues/{issue_number}/comments"
        ),
        0
    );
    // Exact paths work too.
    assert_eq!(fake.count("GET", "/repos/acme/widgets/issues"), 2);
    assert_eq!(fake.count("GET", "/nothing/here"), 1);
    assert_eq!(fake.count_status(404), 1);

    let records = fake.requests();
    assert_eq!(records.len(), 5);
    assert_eq!(records[1].query, "state=closed");
    assert_eq!(
        records[1].route.as_deref(),
        Some("/repos/{owner}/{repo}/issues")
    );
    assert_eq!(records[3].method, "POST");
    assert_eq!(records[3].status, 201);
    assert_eq!(records[4].route, None);

    fake.reset_counts();
    assert!(fake.requests().is_empty());
    assert_eq!(fake.count("GET", "/repos/{owner}/{repo}/issues"), 0);
}

// ----- robustness -----

#[test]
fn malformed_requests_get_json_errors() {
    let fake = fake();
    let n = fake.add_issue("acme", "widgets", "Fix it", None, &[]);
    let issue = format!("/repos/acme/widgets/issues/{n}");

    let raw = |method: reqwest::Method, path: &str, body: &'static str| {
        let resp = req(&fake, method, path)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        let body = json_of(resp);
        assert!(body["message"].is_string(), "{body}");
        status
    };
    use reqwest::Method as M;
    let labels = format!("{issue}/labels");
    let comments = format!("{issue}/comments");
    let missing_label = format!("{issue}/labels/nope");
    let too_deep = format!("/repos/acme/widgets/{}", "x/".repeat(500));
    let (issues, pulls) = ("/repos/acme/widgets/issues", "/repos/acme/widgets/pulls");
    let repo_labels = "/repos/acme/widgets/labels";
    // (method, path, body, status)
    let cases: [(M, &str, &'static str, u16); 27] = [
        (M::PATCH, &issue, "{not json", 400),
        (M::PATCH, &issue, "[1,2]", 422),
        (M::PATCH, &issue, "\"x\"", 422),
        (M::PATCH, &issue, r#"{"title": {"a": 1}}"#, 422),
        (M::PATCH, &issue, r#"{"state": "sideways"}"#, 422),
        (M::PATCH, &issue, r#"{"labels": 5}"#, 422),
        (M::PATCH, &issue, r#"{"state_reason": "bored"}"#, 422),
        (M::POST, &labels, r#"{"labels": [1]}"#, 422),
        (M::POST, &labels, r#"{"labels": [""]}"#, 422),
        (M::POST, &labels, "null", 422),
        (M::POST, &comments, r#"{"body": 12}"#, 422),
        (
            M::POST,
            repo_labels,
            r#"{"name": "x", "color": "zzz"}"#,
            422,
        ),
        (M::POST, repo_labels, "{}", 422),
        (M::POST, pulls, r#"{"title": "t", "base": "main"}"#, 422),
        (
            M::POST,
            pulls,
            r#"{"title": "t", "head": ":", "base": "main"}"#,
            422,
        ),
        (M::POST, &format!("{pulls}/1/reviews"), "{}", 404),
        (M::GET, &format!("{issues}?state=sideways"), "", 422),
        (M::GET, &format!("{issues}?since=yesterday"), "", 422),
        (M::GET, &format!("{pulls}?direction=up"), "", 422),
        (M::GET, &format!("{issues}/abc"), "", 404),
        (
            M::GET,
            &format!("{issues}/99999999999999999999999"),
            "",
            404,
        ),
        (M::GET, "/repos/%ff/widgets", "", 404),
        (M::GET, "/repos/acme/widgets/labels/%zz", "", 404),
        (M::GET, "//", "", 404),
        (M::DELETE, "/repos/acme/widgets", "", 404),
        (M::DELETE, &missing_label, "", 404),
        (M::GET, &too_deep, "", 404),
    ];
    for (method, path, body, status) in cases {
        let what = format!("{method} {path} {body}");
        assert_eq!(raw(method, path, body), status, "{what}");
    }
    // Odd pagination values are tolerated, like GitHub does.
    let odd = get(
        &fake,
        "/repos/acme/widgets/issues?page=18446744073709551615&per_page=-3",
    );
    assert_eq!(odd.status(), StatusCode::OK);
    assert_eq!(json_of(odd), json!([]));

    // Nothing was changed by the rejected requests, and the server still answers.
    let state = fake.issue("acme", "widgets", n).unwrap();
    assert_eq!(state.title, "Fix it");
    assert_eq!(state.state, "open");
    assert!(state.labels.is_empty());
    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
    assert_eq!(fake.count_status(500), 0);
}

#[test]
fn created_issues_and_state_reasons() {
    let fake = fake();
    let resp = post(
        &fake,
        "/repos/acme/widgets/issues",
        &json!({"title": "From the API", "body": "b", "labels": ["agentry"]}),
    );
    assert_eq!(resp.status(), StatusCode::CREATED);
    let issue = json_of(resp);
    let n = issue["number"].as_u64().unwrap();
    assert_eq!(issue["labels"][0]["name"], "agentry");
    assert_eq!(issue["user"]["login"], "agentry-bot");

    let closed = json_of(send_json(
        &fake,
        reqwest::Method::PATCH,
        &format!("/repos/acme/widgets/issues/{n}"),
        &json!({"state": "closed", "state_reason": "not_planned"}),
    ));
    assert_eq!(closed["state"], "closed");
    assert_eq!(closed["state_reason"], "not_planned");
    assert_eq!(closed["closed_by"]["login"], "agentry-bot");
    assert_eq!(json_of(get(&fake, "/repos/acme/widgets/issues")), json!([]));
    let all = json_of(get(&fake, "/repos/acme/widgets/issues?state=closed"));
    assert_eq!(all.as_array().unwrap().len(), 1);

    let reopened = json_of(send_json(
        &fake,
        reqwest::Method::PATCH,
        &format!("/repos/acme/widgets/issues/{n}"),
        &json!({"state": "open"}),
    ));
    assert_eq!(reopened["state_reason"], "reopened");
    assert!(reopened["closed_at"].is_null());

    // `since` filters on updated_at.
    fake.advance_clock(Duration::from_secs(3600));
    let later = fake.add_issue("acme", "widgets", "Later", None, &[]);
    let cutoff = fake.issue("acme", "widgets", later).unwrap().updated_at;
    let since = json_of(get(
        &fake,
        &format!("/repos/acme/widgets/issues?since={cutoff}"),
    ));
    assert_eq!(since.as_array().unwrap().len(), 1);
    assert_eq!(since[0]["number"], later);
}

#[test]
fn the_fake_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FakeGitHub>();
    let fake = fake();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10 {
                    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
                }
            });
        }
    });
    assert_eq!(fake.count("GET", "/user"), 40);
    assert_eq!(fake.rate_limit_remaining(), 4960);
}

#[test]
fn dropping_the_fake_stops_the_server() {
    let fake = fake();
    let url = format!("{}/user", fake.base_url());
    assert_eq!(
        client()
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .unwrap()
            .status(),
        StatusCode::OK
    );
    drop(fake);
    assert!(client().get(&url).bearer_auth(TOKEN).send().is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn octocrab_conditional_requests_see_304s() {
    let fake = fake();
    fake.add_pull("acme", "widgets", "first", "feature", "main");
    let gh = octo(&fake);
    let uri = "/repos/acme/widgets/pulls?state=all&sort=updated&direction=desc";

    // Explicit: `_get_with_headers` shows the 304.
    let resp = gh._get_with_headers(uri, None).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let etag = resp.headers()["etag"].clone();
    let body = gh.body_to_string(resp).await.unwrap();
    let pulls: Vec<octocrab::models::pulls::PullRequest> = serde_json::from_str(&body).unwrap();
    assert_eq!(pulls.len(), 1);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("if-none-match", etag.clone());
    let resp = gh
        ._get_with_headers(uri, Some(headers.clone()))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 304);
    fake.merge_pull("acme", "widgets", 1);
    let resp = gh._get_with_headers(uri, Some(headers)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_ne!(resp.headers()["etag"], etag);

    // Built-in cache: octocrab sends If-None-Match itself and turns the 304 into the body.
    let cached = Octocrab::builder()
        .base_uri(fake.base_url())
        .unwrap()
        .personal_token(TOKEN.to_owned())
        .cache(octocrab::service::middleware::cache::mem::InMemoryCache::new())
        .build()
        .unwrap();
    fake.reset_counts();
    for _ in 0..3 {
        let page = cached
            .pulls("acme", "widgets")
            .list()
            .state(State::All)
            .send()
            .await
            .unwrap();
        assert_eq!(page.items.len(), 1);
        assert!(page.items[0].merged_at.is_some());
    }
    assert_eq!(fake.count_status(200), 1);
    assert_eq!(fake.count_status(304), 2);
    assert_eq!(
        fake.requests().iter().filter(|r| r.if_none_match).count(),
        2
    );
}

#[test]
fn random_requests_never_break_the_fake() {
    let fake = fake();
    fake.add_issue("acme", "widgets", "Fix it", None, &["bug"]);
    fake.add_pull("acme", "widgets", "first", "feature", "main");
    let segments = [
        "repos", "acme", "widgets", "issues", "pulls", "labels", "comments", "reviews", "merge",
        "1", "2", "999", "x", "%20", "%ff", "user", "", "bug",
    ];
    let methods = ["GET", "POST", "PATCH", "PUT", "DELETE", "HEAD"];
    let bodies = [
        "",
        "{",
        "[]",
        "null",
        "\u{0}",
        r#"{"title": 1}"#,
        r#"{"title": null, "body": null}"#,
        r#"{"labels": [{}]}"#,
        r#"{"labels": ["a", "A", "b"]}"#,
        r#"{"state": "closed", "state_reason": null}"#,
        r#"{"state": "open"}"#,
        r#"{"body": "hello"}"#,
        r#"{"head": "a", "base": "a", "title": "t"}"#,
        r#"{"head": "b", "base": "main", "title": "t", "draft": "yes"}"#,
        r#"{"event": "APPROVE", "body": "ok"}"#,
        r#"{"event": "NOPE"}"#,
        r##"{"name": "x", "color": "#FFFFFF", "description": 3}"##,
        r#"{"sha": "0", "merge_method": "squash"}"#,
    ];
    let queries = [
        "",
        "?page=0",
        "?per_page=abc&page=-1",
        "?state=all&sort=updated&direction=asc",
        "?since=2020-01-01T00:00:00Z",
        "?labels=,,,",
        "?sort=long-running",
        "?head=acme:feature&base=main",
    ];
    let mut seed: u64 = 0x5eed;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) as usize) % n
    };
    let http = client();
    for _ in 0..600 {
        let templates = [
            "/user",
            "/repos/acme/widgets",
            "/repos/acme/widgets/issues",
            "/repos/acme/widgets/issues/{n}",
            "/repos/acme/widgets/issues/{n}/comments",
            "/repos/acme/widgets/issues/{n}/labels",
            "/repos/acme/widgets/issues/{n}/labels/{l}",
            "/repos/acme/widgets/labels",
            "/repos/acme/widgets/labels/{l}",
            "/repos/acme/widgets/pulls",
            "/repos/acme/widgets/pulls/{n}",
            "/repos/acme/widgets/pulls/{n}/reviews",
            "/repos/acme/widgets/pulls/{n}/merge",
        ];
        let numbers = ["1", "2", "3", "999", "x", "0"];
        let label_names = ["bug", "%20", "%ff", "x"];
        let path = if next(4) == 0 {
            // Random segments.
            (0..1 + next(7))
                .map(|_| segments[next(segments.len())])
                .collect::<Vec<_>>()
                .join("/")
        } else {
            templates[next(templates.len())]
                .trim_start_matches('/')
                .replace("{n}", numbers[next(numbers.len())])
                .replace("{l}", label_names[next(label_names.len())])
        };
        let url = format!(
            "{}/{}{}",
            fake.base_url(),
            path,
            queries[next(queries.len())]
        );
        let method = reqwest::Method::from_bytes(methods[next(methods.len())].as_bytes()).unwrap();
        let is_head = method == reqwest::Method::HEAD;
        let resp = http
            .request(method, &url)
            .bearer_auth(TOKEN)
            .body(bodies[next(bodies.len())])
            .send()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = resp.status().as_u16();
        assert!(status < 500, "{url} answered {status}");
        if matches!(status, 204 | 304) || is_head {
            continue;
        }
        let body: Value = resp
            .json()
            .unwrap_or_else(|e| panic!("{url}: not JSON: {e}"));
        if status >= 400 {
            assert!(body["message"].is_string(), "{url}: {body}");
        }
    }
    // The mix reached the handlers, not only the router's 404.
    for status in [200, 201, 400, 404, 422] {
        assert!(fake.count_status(status) > 0, "no {status} answered");
    }
    assert_eq!(get(&fake, "/user").status(), StatusCode::OK);
    assert_eq!(fake.count_status(500), 0);
}

// ----- reviews, review comments, reactions, permissions -----

#[test]
fn reviews_list_with_etags_and_touch_the_pull() {
    let fake = fake();
    let n = fake.add_pull("acme", "widgets", "Fix", "agentry/fix", "main");
    let path = format!("/repos/acme/widgets/pulls/{n}/reviews");
    let pulls = "/repos/acme/widgets/pulls?state=all&sort=updated&direction=desc";
    let first = get(&fake, &path);
    let etag = header(&first, "etag").unwrap();
    assert_eq!(json_of(first), json!([]));
    let pulls_etag = header(&get(&fake, pulls), "etag").unwrap();
    let before = fake.pulls("acme", "widgets");

    fake.advance_clock(Duration::from_secs(5));
    let id = fake.add_review(
        "acme",
        "widgets",
        n,
        "alice",
        "CHANGES_REQUESTED",
        "Rename it.",
    );
    // The list and the pull requests sorted by update both changed.
    let resp = get_if_none_match(&fake, &path, &etag);
    assert_eq!(resp.status(), StatusCode::OK);
    let etag = header(&resp, "etag").unwrap();
    let reviews = json_of(resp);
    let r = &reviews[0];
    assert_eq!(r["id"], id);
    assert_eq!(r["user"]["login"], "alice");
    assert_eq!(r["state"], "CHANGES_REQUESTED");
    assert_eq!(r["body"], "Rename it.");
    assert_eq!(
        r["html_url"],
        format!("https://github.com/acme/widgets/pull/{n}#pullrequestreview-{id}")
    );
    assert!(r["submitted_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(r["commit_id"].as_str().unwrap().len(), 40);
    assert_eq!(
        r["pull_request_url"],
        format!("{}/repos/acme/widgets/pulls/{n}", fake.base_url())
    );
    let resp = get_if_none_match(&fake, &path, &etag);
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    let resp = get_if_none_match(&fake, pulls, &pulls_etag);
    assert_eq!(resp.status(), StatusCode::OK);
    let listed = json_of(resp);
    assert_ne!(listed[0]["updated_at"], listed[0]["created_at"]);
    assert_eq!(before.len(), 1);

    // A pending review is seen by its author only, and has no submitted_at.
    fake.add_review("acme", "widgets", n, "agentry-bot", "PENDING", "draft");
    fake.add_review("acme", "widgets", n, "alice", "PENDING", "hers");
    let reviews = json_of(get(&fake, &path));
    assert_eq!(reviews.as_array().unwrap().len(), 2);
    assert_eq!(reviews[1]["state"], "PENDING");
    assert!(reviews[1].get("submitted_at").is_none());
    assert_eq!(
        fake.reviews("acme", "widgets", n),
        ["Rename it.", "draft", "hers"]
    );
}

#[test]
fn review_comments_page_filter_by_since_and_count_on_the_pull() {
    let fake = fake();
    fake.freeze_clock();
    let n = fake.add_pull("acme", "widgets", "Fix", "agentry/fix", "main");
    for i in 0..35 {
        fake.add_review_comment("acme", "widgets", n, "alice", "src/lib.rs", i + 1, "old");
    }
    fake.advance_clock(Duration::from_secs(30));
    let since = fake.now_unix();
    let newer = fake.add_review_comment("acme", "widgets", n, "bob", "README.md", 7, "Typo.");
    let path = format!("/repos/acme/widgets/pulls/{n}/comments");

    // Default page size 30, Link to the next page.
    let resp = get(&fake, &path);
    let link = header(&resp, "link").unwrap();
    assert!(link.contains("rel=\"next\""), "{link}");
    assert_eq!(len_of(resp), 30);
    let page2 = json_of(get(&fake, &format!("{path}?page=2")));
    assert_eq!(page2.as_array().unwrap().len(), 6);
    let c = &page2[5];
    assert_eq!(c["id"], newer);
    assert_eq!(c["user"]["login"], "bob");
    assert_eq!(c["path"], "README.md");
    assert_eq!(
        (c["line"].clone(), c["original_line"].clone()),
        (json!(7), json!(7))
    );
    assert_eq!(
        c["html_url"],
        format!("https://github.com/acme/widgets/pull/{n}#discussion_r{newer}")
    );
    assert!(c["pull_request_review_id"].as_u64().is_some());
    assert_eq!(c["created_at"], c["updated_at"]);

    // `since` keeps those updated at or after it.
    let since_text = time::OffsetDateTime::from_unix_timestamp(since)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let recent = json_of(get(&fake, &format!("{path}?since={since_text}")));
    assert_eq!(recent.as_array().unwrap().len(), 1);
    assert_eq!(recent[0]["id"], newer);
    let bad = get(&fake, &format!("{path}?since=yesterday"));
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // ETags: a 304 until something changes.
    let resp = get(&fake, &path);
    let etag = header(&resp, "etag").unwrap();
    let resp = get_if_none_match(&fake, &path, &etag);
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);

    let pull = json_of(get(&fake, &format!("/repos/acme/widgets/pulls/{n}")));
    assert_eq!(pull["review_comments"], 36);
    assert_eq!(fake.count("GET", "/repos/{o}/{r}/pulls/{n}/comments"), 6);
    // An issue number is no pull request.
    let issue = fake.add_issue("acme", "widgets", "x", None, &[]);
    let resp = get(
        &fake,
        &format!("/repos/acme/widgets/pulls/{issue}/comments"),
    );
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[test]
fn issue_comments_filter_by_since_and_touch_the_pull() {
    let fake = fake();
    fake.freeze_clock();
    let n = fake.add_pull("acme", "widgets", "Fix", "agentry/fix", "main");
    let old = fake.add_comment("acme", "widgets", n, "alice", "old");
    let pulls = "/repos/acme/widgets/pulls?state=all&sort=updated&direction=desc";
    let pulls_etag = header(&get(&fake, pulls), "etag").unwrap();
    fake.advance_clock(Duration::from_secs(30));
    let since = time::OffsetDateTime::from_unix_timestamp(fake.now_unix())
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let id = fake.add_comment("acme", "widgets", n, "bob", "@agentry again");
    let path = format!("/repos/acme/widgets/issues/{n}/comments");
    let recent = json_of(get(&fake, &format!("{path}?since={since}")));
    assert_eq!(recent.as_array().unwrap().len(), 1);
    assert_eq!(recent[0]["id"], id);
    assert_eq!(
        recent[0]["html_url"],
        format!("https://github.com/acme/widgets/pull/{n}#issuecomment-{id}")
    );
    let resp = get_if_none_match(&fake, pulls, &pulls_etag);
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        fake.issue_comments("acme", "widgets", n),
        [
            (old, "alice".to_owned(), "old".to_owned()),
            (id, "bob".to_owned(), "@agentry again".to_owned())
        ]
    );
    assert_eq!(
        fake.pull_head("acme", "widgets", n).as_deref(),
        Some("agentry/fix")
    );
    assert_eq!(fake.pull_head("acme", "widgets", 999), None);
}

#[test]
fn reactions_201_then_200_and_422_404() {
    let fake = fake();
    let n = fake.add_pull("acme", "widgets", "Fix", "agentry/fix", "main");
    let comment = fake.add_comment("acme", "widgets", n, "alice", "@agentry fix");
    let review_comment = fake.add_review_comment("acme", "widgets", n, "alice", "a.rs", 1, "here");
    let issue_path = format!("/repos/acme/widgets/issues/comments/{comment}/reactions");
    let review_path = format!("/repos/acme/widgets/pulls/comments/{review_comment}/reactions");

    let resp = post(&fake, &issue_path, &json!({"content": "eyes"}));
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created = json_of(resp);
    assert_eq!(created["content"], "eyes");
    assert_eq!(created["user"]["login"], "agentry-bot");
    let resp = post(&fake, &issue_path, &json!({"content": "eyes"}));
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(json_of(resp)["id"], created["id"]);
    let resp = post(&fake, &review_path, &json!({"content": "+1"}));
    assert_eq!(resp.status(), StatusCode::CREATED);

    let reactions = fake.reactions("acme", "widgets");
    assert_eq!(
        reactions,
        [
            agentry_fake_github::Reaction {
                comment_id: comment,
                review_comment: false,
                content: "eyes".into(),
                user: "agentry-bot".into(),
            },
            agentry_fake_github::Reaction {
                comment_id: review_comment,
                review_comment: true,
                content: "+1".into(),
                user: "agentry-bot".into(),
            }
        ]
    );
    // The comments' roll-ups count them.
    let listed = json_of(get(
        &fake,
        &format!("/repos/acme/widgets/issues/{n}/comments"),
    ));
    assert_eq!(listed[0]["reactions"]["eyes"], 1);
    assert_eq!(listed[0]["reactions"]["total_count"], 1);
    let listed = json_of(get(
        &fake,
        &format!("/repos/acme/widgets/pulls/{n}/comments"),
    ));
    assert_eq!(listed[0]["reactions"]["+1"], 1);

    let resp = post(&fake, &issue_path, &json!({"content": "tada"}));
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(resp)["message"], "Validation Failed");
    let resp = post(&fake, &issue_path, &json!({}));
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // An issue comment's id is no review comment's, and the other way round.
    let resp = post(
        &fake,
        &format!("/repos/acme/widgets/pulls/comments/{comment}/reactions"),
        &json!({"content": "eyes"}),
    );
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = post(
        &fake,
        &format!("/repos/acme/widgets/issues/comments/{review_comment}/reactions"),
        &json!({"content": "eyes"}),
    );
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);

    // Faults apply to the new routes like to the others.
    let route = "/repos/{o}/{r}/issues/comments/{id}/reactions";
    fake.fail_next(Some(("POST", route)), 1, Fault::Status(502));
    let resp = post(&fake, &issue_path, &json!({"content": "heart"}));
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(fake.reactions("acme", "widgets").len(), 2);
    assert_eq!(fake.count("POST", route), 6);
}

#[test]
fn permissions_by_role_owner_stranger_and_unknown() {
    let fake = fake();
    fake.set_permission("acme", "widgets", "maria", "maintain");
    fake.set_permission("acme", "widgets", "tri", "triage");
    fake.add_token("ghp_stranger", "stranger");
    let raw = |login: &str| {
        let resp = get(
            &fake,
            &format!("/repos/acme/widgets/collaborators/{login}/permission"),
        );
        (resp.status(), json_of(resp))
    };
    // (octocrab 0.54's model of this answer expects `push`/`pull` in `permission`, where
    // GitHub writes `write`/`read`: the shape is checked here member by member.)
    let (status, body) = raw("maria");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["user"]["login"], "maria");
    assert_eq!(body["user"]["role_name"], "maintain");
    assert_eq!(
        body["user"]["permissions"],
        json!({"admin": false, "maintain": true, "push": true, "triage": true, "pull": true})
    );
    assert_eq!(
        (body["permission"].clone(), body["role_name"].clone()),
        (json!("write"), json!("maintain"))
    );
    let (_, body) = raw("tri");
    assert_eq!(
        (body["permission"].clone(), body["role_name"].clone()),
        (json!("read"), json!("triage"))
    );
    let (_, body) = raw("acme");
    assert_eq!(body["permission"], "admin");
    let (_, body) = raw("stranger");
    assert_eq!(
        (body["permission"].clone(), body["role_name"].clone()),
        (json!("read"), json!("read"))
    );
    let (status, body) = raw("nobody");
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["message"], "Not Found");
    fake.set_permission("acme", "widgets", "maria", "none");
    let (_, body) = raw("maria");
    assert_eq!(body["permission"], "none");

    // ETags on the new GET like on the others.
    let path = "/repos/acme/widgets/collaborators/tri/permission";
    let etag = header(&get(&fake, path), "etag").unwrap();
    let resp = get_if_none_match(&fake, path, &etag);
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(
        fake.count("GET", "/repos/{o}/{r}/collaborators/{u}/permission"),
        8
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn octocrab_reads_reviews_and_review_comments() {
    let fake = fake();
    let n = fake.add_pull("acme", "widgets", "Fix", "agentry/fix", "main");
    let review = fake.add_review("acme", "widgets", n, "alice", "CHANGES_REQUESTED", "No.");
    let comment = fake.add_review_comment("acme", "widgets", n, "bob", "src/a.rs", 3, "Hm.");
    let octo = octo(&fake);
    let pulls = octo.pulls("acme", "widgets");
    let reviews = pulls.list_reviews(n).send().await.unwrap();
    assert_eq!(reviews.items.len(), 2);
    assert_eq!(reviews.items[0].id.0, review);
    let comments = pulls.list_comments(Some(n)).send().await.unwrap();
    assert_eq!(comments.items.len(), 1);
    assert_eq!(comments.items[0].id.0, comment);
    assert_eq!(comments.items[0].line, Some(3));
}
