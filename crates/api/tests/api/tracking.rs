//! Pull-request tracking end to end, in process, against the fake GitHub on 127.0.0.1: the
//! poller (one conditional request per repository, watermark only after success), the signed
//! webhook with GitHub's real payloads, the race between them, and the poller role among
//! replicas on PostgreSQL (docs/contract.md#55-pull-request-tracking–#56-webhook, #22-states-and-transitions).

use std::time::Duration;

use crate::common::env::*;
use crate::common::*;
use actix_http::Request;
use actix_web::test::TestRequest;
use agentry_codehost::webhook::sign;
use agentry_domain::TaskState;
use agentry_persistence::repos::{self};
use agentry_persistence::secrets::SecretValue;
use agentry_persistence::test_support::TestDb;
use agentry_service::{Background, BackgroundLoop};
use agentry_testkit::wait::eventually_async;
use serde_json::json;

const SECRET: &str = "whsec-test-shared-secret";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../codehost/tests/fixtures/github-webhooks/{name}.payload.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The fixture's close made a merge, as GitHub sends it.
fn merged_fixture() -> Vec<u8> {
    let text = String::from_utf8(fixture("pull_request.closed")).unwrap();
    assert!(text.contains("\"merged\": false") && text.contains("\"merged_at\": null"));
    text.replace("\"merged\": false", "\"merged\": true")
        .replace(
            "\"merged_at\": null",
            "\"merged_at\": \"2026-11-22T10:00:00Z\"",
        )
        .into_bytes()
}

/// A webhook delivery signed with `secret`.
fn delivery(event: &str, id: &str, body: &[u8], secret: Option<&str>) -> Request {
    let mut req = TestRequest::post()
        .uri("/api/webhooks/codehost")
        .insert_header(("X-GitHub-Event", event))
        .insert_header(("X-GitHub-Delivery", id))
        .insert_header(("Content-Type", "application/json"));
    if let Some(secret) = secret {
        req = req.insert_header(("X-Hub-Signature-256", sign(secret.as_bytes(), body)));
    }
    req.set_payload(body.to_vec()).to_request()
}

impl Env {
    /// The same environment with the webhook enabled (same database and master key).
    fn with_webhook(mut self) -> Env {
        let key = self.service.master_key().clone();
        self.host.service = agentry_service::Service::new(
            self.db().clone(),
            key,
            code_host_with(&self.fake.base_url(), test_timing())
                .with_webhook_secret(Some(SecretValue::new(SECRET))),
            rig::idle_runs(),
        );
        self.state = state_of(self.host.service.clone());
        self
    }
}

async fn the_webhook_verifies_then_acts_once_per_delivery(db: TestDb) {
    let env = Env::new(db);
    env.store_token();
    env.fake.add_repo("Codertocat", "Hello-World", "main");
    let repo = env.repo(env.connect("codertocat", "hello-world"));
    // The fixtures are about pull request #2 of Codertocat/Hello-World.
    let merged = env.task_with_pull(&repo, 7, 2);

    // Without a secret the endpoint is disabled.
    let app = service_with(env.state.clone()).await;
    let (status, body) = call(
        &app,
        delivery("ping", "d-0", &fixture("ping"), Some(SECRET)),
    )
    .await;
    assert_eq!(status, 404);
    envelope(&body, "webhook_disabled");

    let env = env.with_webhook();
    let app = service_with(env.state.clone()).await;
    let before = env.count("webhook_deliveries");
    assert_eq!(before, 0);
    // Refused before anything is parsed or recorded.
    let body = merged_fixture();
    let mut altered = body.clone();
    let at = altered.len() / 2;
    altered[at] = b' ';
    for (name, req) in [
        ("no signature", delivery("pull_request", "d-1", &body, None)),
        (
            "another secret",
            delivery("pull_request", "d-1", &body, Some("other-secret")),
        ),
        ("altered after signing", {
            let mut r = TestRequest::post()
                .uri("/api/webhooks/codehost")
                .insert_header(("X-GitHub-Event", "pull_request"))
                .insert_header(("X-GitHub-Delivery", "d-1"))
                .insert_header(("X-Hub-Signature-256", sign(SECRET.as_bytes(), &body)));
            r = r.set_payload(altered.clone());
            r.to_request()
        }),
        ("empty body, signature of another", {
            TestRequest::post()
                .uri("/api/webhooks/codehost")
                .insert_header(("X-GitHub-Event", "pull_request"))
                .insert_header(("X-GitHub-Delivery", "d-1"))
                .insert_header(("X-Hub-Signature-256", sign(SECRET.as_bytes(), &body)))
                .to_request()
        }),
    ] {
        let (status, reply) = call(&app, req).await;
        assert_eq!(status, 401, "{name}: {reply}");
        envelope(&reply, "unauthenticated");
    }
    // A correctly signed empty body is not a payload.
    let (status, reply) = call(&app, delivery("pull_request", "d-1", b"", Some(SECRET))).await;
    assert_eq!(status, 400, "{reply}");
    envelope(&reply, "invalid_request");
    assert_eq!(env.count("webhook_deliveries"), 0);
    assert_eq!(env.task(merged.id).state, TaskState::PrOpened);

    let (status, reply) = call(
        &app,
        delivery("ping", "d-2", &fixture("ping"), Some(SECRET)),
    )
    .await;
    assert_eq!((status, reply), (200, json!({ "ok": true })));

    // The merge moves the task at once and queues the issue's closing, once.
    let (status, reply) = call(&app, delivery("pull_request", "d-3", &body, Some(SECRET))).await;
    assert_eq!((status, reply), (200, json!({ "ok": true })));
    assert_eq!(env.task(merged.id).state, TaskState::Completed);
    assert_eq!(
        env.events(merged.id).last().unwrap().2,
        "pull request merged (seen by a webhook)"
    );
    assert_eq!(env.close_effects(merged.id), 1);
    // A redelivery of the same id: acknowledged, nothing done again.
    let (status, reply) = call(&app, delivery("pull_request", "d-3", &body, Some(SECRET))).await;
    assert_eq!(
        (status, reply),
        (200, json!({ "ok": true, "duplicate": true }))
    );
    // Another delivery of the same merge: nothing to do any more.
    let (status, reply) = call(&app, delivery("pull_request", "d-4", &body, Some(SECRET))).await;
    assert_eq!(
        (status, reply),
        (200, json!({ "ok": true, "ignored": true }))
    );
    assert_eq!(
        env.events(merged.id).len(),
        5,
        "created, claimed, started, pr_opened, completed"
    );
    assert_eq!(env.close_effects(merged.id), 1);

    // A close without merge fails its task.
    let closed_task = env.task_with_pull(&repo, 8, 3);
    let closed = String::from_utf8(fixture("pull_request.closed"))
        .unwrap()
        .replace("\"number\": 2,", "\"number\": 3,");
    let (status, _) = call(
        &app,
        delivery("pull_request", "d-5", closed.as_bytes(), Some(SECRET)),
    )
    .await;
    assert_eq!(status, 200);
    let closed_task = env.task(closed_task.id);
    assert_eq!(closed_task.state, TaskState::Failed);
    assert!(closed_task.error_message.unwrap().contains("#3"));
    assert_eq!(env.close_effects(closed_task.id), 0);

    // Everything else is acknowledged and ignored.
    for (event, name) in [
        ("issues", "issues.opened"),
        ("issues", "issues.labeled"),
        ("pull_request", "pull_request.opened"),
        ("pull_request", "pull_request.reopened"),
        ("pull_request", "pull_request.labeled"),
        ("deployment", "ping"),
    ] {
        let id = format!("d-{name}-{event}");
        let (status, reply) = call(&app, delivery(event, &id, &fixture(name), Some(SECRET))).await;
        assert_eq!(
            (status, &reply),
            (200, &json!({ "ok": true, "ignored": true })),
            "{name}"
        );
    }
    assert_eq!(env.count("webhook_deliveries"), 10);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    the_webhook_verifies_then_acts_once_per_delivery
);

/// The fake GitHub's route of a repository's issue list, which each issue sync reads.
const ISSUE_LIST: &str = "/repos/{o}/{r}/issues";

/// The fixture's `issues` `labeled` delivery, with the service's label.
fn labelled_body() -> Vec<u8> {
    String::from_utf8(fixture("issues.labeled"))
        .unwrap()
        .replace("\"name\": \"bug\"", "\"name\": \"agentry\"")
        .into_bytes()
}

/// Starts the issue-sync loop with a period of an hour (so within a test only webhooks wake
/// it again) and waits for its first sync, made at once, to store the fixtures' repository's
/// one open issue and to end.
async fn issue_sync_started(env: &Env) -> Background {
    let started = Background::start(
        &env.state.service,
        vec![BackgroundLoop::issue_sync(Duration::from_secs(3600))],
    );
    eventually_async(PATIENCE, "the first issue sync", async || {
        env.count("synced_issues") == 1
    })
    .await;
    // Syncs take turns: this one waits for the loop's first sync to end (it stores the issue
    // before its last read), so nothing the test does next is seen by that sync.
    env.state.service.sync_issues(None).await.unwrap();
    started
}

#[actix_web::test]
async fn a_labelled_issue_webhook_syncs_that_repository_at_once() {
    let env = Env::new(sqlite()).with_webhook();
    env.store_token();
    env.fake.add_repo("Codertocat", "Hello-World", "main");
    let repo = env.connect("codertocat", "hello-world");
    let number = env
        .fake
        .add_issue("Codertocat", "Hello-World", "Spelling", None, &[]);
    let _sync = issue_sync_started(&env).await;
    assert_eq!(env.count("tasks"), 0);
    env.fake
        .add_label("Codertocat", "Hello-World", number, "agentry");
    let app = service_with(env.state.clone()).await;
    let (status, reply) = call(
        &app,
        delivery("issues", "l-1", &labelled_body(), Some(SECRET)),
    )
    .await;
    assert_eq!((status, reply), (200, json!({ "ok": true })));
    // The sync runs after the answer.
    eventually_async(PATIENCE, "a task after the webhook", async || {
        env.count("tasks") > 0
    })
    .await;
    let view = agentry_persistence::issues::open_issues(&mut env.db().conn().unwrap(), Some(repo))
        .unwrap();
    assert_eq!(view.len(), 1);
    assert!(view[0].task.is_some());
}

// Each labelled-issue webhook only asks the issue-sync loop for a sync of its repository:
// 50 deliveries (one genuine signed body replayed under fresh delivery ids) read nothing
// from the code host while the loop is not running, and one step of the loop then syncs
// the repository once for all of them. Before, each delivery started its own sync.
#[actix_web::test]
async fn labelled_issue_webhooks_cost_one_sync_not_one_each() {
    let env = Env::new(sqlite()).with_webhook();
    env.store_token();
    env.fake.add_repo("Codertocat", "Hello-World", "main");
    env.connect("codertocat", "hello-world");
    let number = env
        .fake
        .add_issue("Codertocat", "Hello-World", "Spelling", None, &[]);
    env.fake
        .add_label("Codertocat", "Hello-World", number, "agentry");
    let body = labelled_body();
    let app = service_with(env.state.clone()).await;
    let replies = futures_util::future::join_all((0..50).map(|i| {
        let id = format!("replayed-{i}");
        call(&app, delivery("issues", &id, &body, Some(SECRET)))
    }))
    .await;
    for reply in replies {
        assert_eq!(reply, (200, json!({ "ok": true })));
    }
    assert_eq!(
        env.fake.count("GET", ISSUE_LIST),
        0,
        "a delivery read the issue list"
    );
    // The loop's step (its first, every repository's sync) is the sync they asked for.
    let _sync = Background::start(
        &env.state.service,
        vec![BackgroundLoop::issue_sync(Duration::from_secs(3600))],
    );
    eventually_async(PATIENCE, "a task after the webhooks", async || {
        env.count("tasks") > 0
    })
    .await;
    // A sync of ours waits for that step to end (syncs take turns); then another like it
    // says how many reads ours made, and the rest are the step's: one full sync's (the
    // open issues, then the changes since).
    env.state.service.sync_issues(None).await.unwrap();
    let with_ours = env.fake.count("GET", ISSUE_LIST);
    env.fake.reset_counts();
    env.state.service.sync_issues(None).await.unwrap();
    let ours = env.fake.count("GET", ISSUE_LIST);
    let step = with_ours - ours;
    assert!(
        (1..=2).contains(&step),
        "the loop's step read the issue list {step} times"
    );
    assert_eq!(env.count("tasks"), 1);
}

async fn poller_and_webhook_racing_on_one_merge_apply_it_once(db: TestDb) {
    let env = Env::new(db).with_webhook();
    env.store_token();
    env.fake.add_repo("Codertocat", "Hello-World", "main");
    let repo = env.repo(env.connect("codertocat", "hello-world"));
    let issue = env
        .fake
        .add_issue("Codertocat", "Hello-World", "Typo", None, &[]);
    // Make the fake's pull request #2 exist and merged, like the webhook says.
    let mut pr = 0;
    while pr < 2 {
        pr = env
            .fake
            .add_pull("Codertocat", "Hello-World", "Fix", "agentry/x", "main");
    }
    assert_eq!(pr, 2);
    let task = env.task_with_pull(&repo, issue, 2);
    env.state.service.poll_pull_requests().await.unwrap();
    env.fake.advance_clock(Duration::from_secs(60));
    env.fake.merge_pull("Codertocat", "Hello-World", 2);

    let app = service_with(env.state.clone()).await;
    let body = merged_fixture();
    let (polled, (status, _)) = futures_util::join!(
        env.state.service.poll_pull_requests(),
        call(
            &app,
            delivery("pull_request", "race-1", &body, Some(SECRET))
        )
    );
    assert_eq!(status, 200);
    // Whichever came first applied it (the poller may even find nothing left to poll).
    let applied: usize = polled.unwrap().iter().map(|(_, o)| o.applied).sum();
    assert!(applied <= 1);
    let events = env.events(task.id);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.1 == TaskState::Completed)
            .count(),
        1,
        "{events:?}"
    );
    assert_eq!(env.close_effects(task.id), 1);
    env.deliver(0).await;
    assert_eq!(
        env.fake
            .issue("Codertocat", "Hello-World", issue)
            .unwrap()
            .state,
        "closed"
    );
    assert_eq!(env.fake.count("PATCH", "/repos/{o}/{r}/issues/{n}"), 1);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    poller_and_webhook_racing_on_one_merge_apply_it_once
);

#[actix_web::test]
async fn bodies_over_25_mib_are_refused() {
    let env = Env::new(sqlite()).with_webhook();
    let app = service_with(env.state.clone()).await;
    let big = vec![b' '; 25 * 1024 * 1024 + 1];
    let (status, reply) = call(&app, delivery("ping", "big", &big, Some(SECRET))).await;
    assert_eq!(status, 413);
    envelope(&reply, "payload_too_large");
    assert_eq!(env.count("webhook_deliveries"), 0);
}

#[actix_web::test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
async fn of_two_pollers_on_one_postgresql_only_one_polls() {
    let Some(db) = TestDb::postgres() else {
        return;
    };
    let env = Env::new(db);
    let mut repo = env.repo(env.store_token_and_connect());
    // Revisions off: a poll is then exactly its one conditional request (with revisions on,
    // a repository's first poll also reads its open pull requests' reviews and comments).
    repo.settings.max_revisions = 0;
    repos::update_settings(
        &mut env.db().conn().unwrap(),
        repo.id,
        &repo.settings,
        agentry_persistence::now(),
    )
    .unwrap();
    let issue = env.fake.add_issue("acme", "web", "A", None, &[]);
    let pr = env
        .fake
        .add_pull("acme", "web", "Fix A", "agentry/task-a", "main");
    env.task_with_pull(&repo, issue, pr);
    let key = env.state.service.master_key().clone();
    let replicas = [
        state_with_key(env.db(), &env.fake.base_url(), key.clone()),
        state_with_key(env.db(), &env.fake.base_url(), key),
    ];
    let every = Duration::from_millis(100);
    let started = std::time::Instant::now();
    let loops: Vec<_> = replicas
        .iter()
        .map(|state| {
            BackgroundLoop::pull_request_poll(every, env.db.url.clone()).start(&state.service)
        })
        .collect();
    // Until the leader polled 5 times (its 5th cycle, ~0.5 s; a slow machine gets 30 s).
    let sent = || async {
        let mut sent = Vec::new();
        for state in &replicas {
            sent.push(state.service.github().await.unwrap().requests_sent());
        }
        sent.sort_unstable();
        sent
    };
    eventually_async(PATIENCE, "5 polls", async || {
        let sent = sent().await;
        if sent.iter().sum::<u64>() >= 5 {
            Ok(())
        } else {
            Err(format!("{sent:?}"))
        }
    })
    .await;
    for l in loops {
        l.abort();
    }
    let cycles = started.elapsed().as_millis() / every.as_millis();
    let sent = sent().await;
    assert_eq!(sent[0], 0, "both replicas polled: {sent:?}");
    assert!(sent[1] >= 5, "the leader polled every cycle: {sent:?}");
    assert!(
        u128::from(sent[1]) <= cycles + 2,
        "one request per cycle ({cycles} cycles): {sent:?}"
    );
    // The fake counts what reached it: a request in flight when the loops were stopped was
    // counted by the client only.
    let reached = env.fake.count("GET", PULLS) as u64;
    assert!(
        reached == sent[1] || reached + 1 == sent[1],
        "{reached} {sent:?}"
    );
}

#[actix_web::test]
async fn random_signed_bodies_never_fail_the_webhook() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRunner};
    let env = Env::new(sqlite()).with_webhook();
    let app = service_with(env.state.clone()).await;
    let mut runner = TestRunner::new(Config::default());
    let mut accepted = 0;
    let jsonish = proptest::string::string_regex(
        r#"[{}\[\]",:0-9 -]{0,6}("(action|number|merged|merged_at|pull_request|repository|html_url|owner|login|name|label|issue|head|ref|zen|hook_id)"[:,]?[ "a-z0-9.:/{}\[\]-]{0,14}){0,10}[}\]]?"#,
    )
    .unwrap();
    for i in 0..300 {
        let body = jsonish
            .new_tree(&mut runner)
            .unwrap()
            .current()
            .into_bytes();
        let event = ["ping", "issues", "pull_request", "push"][i % 4];
        let (status, reply) = call(
            &app,
            delivery(event, &format!("fuzz-{i}"), &body, Some(SECRET)),
        )
        .await;
        assert!(status == 200 || status == 400, "{status} {reply}");
        if status == 400 {
            envelope(&reply, "invalid_request");
        } else {
            accepted += 1;
        }
    }
    // Only deliveries that were accepted are recorded.
    assert_eq!(env.count("webhook_deliveries"), accepted);
    assert_eq!(env.count("tasks"), 0);
}

/// The real application on a real socket (127.0.0.1, one worker) with webhook `limits`;
/// returns its address and the handle that stops it.
fn listen(
    env: &Env,
    limits: agentry_api::routes::webhooks::WebhookLimits,
) -> (std::net::SocketAddr, actix_web::dev::ServerHandle) {
    let state = env.state.clone();
    let limits = actix_web::web::Data::new(limits);
    let server = actix_web::HttpServer::new(move || {
        agentry_api::app::build_app_with(state.clone(), Vec::new(), limits.clone())
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    (addr, handle)
}

/// The head of a webhook request for a body of `length` bytes with the given headers.
fn webhook_head(headers: &[(&str, &str)], length: Option<usize>) -> String {
    let mut head = String::from("POST /api/webhooks/codehost HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(length) = length {
        head.push_str(&format!("Content-Length: {length}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// GitHub's `ping` payload and its signature with the shared secret.
fn signed_ping() -> (Vec<u8>, String) {
    let body = fixture("ping");
    let signature = sign(SECRET.as_bytes(), &body);
    (body, signature)
}

/// The head of a signed `ping` delivery `id` whose body has `length` bytes.
fn ping_head(signature: &str, id: &str, length: usize) -> String {
    webhook_head(
        &[
            ("X-Hub-Signature-256", signature),
            ("X-GitHub-Event", "ping"),
            ("X-GitHub-Delivery", id),
        ],
        Some(length),
    )
}

/// Reads from `conn` until an answer's head and `Content-Length` bytes of body are in, or
/// the connection closes, within `deadline`; `None` when no whole answer came in time.
async fn read_answer(
    conn: &mut tokio::net::TcpStream,
    deadline: Duration,
) -> Option<(u16, String)> {
    use tokio::io::AsyncReadExt;
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = agentry_testkit::http::content_length(&text[..end]);
                if got.len() >= end + 4 + length {
                    let status = text[9..12].parse().unwrap();
                    return Some((status, text));
                }
            }
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(deadline, read).await.ok().flatten()
}

/// Whether the server closed `conn` (within `deadline`).
async fn closed(conn: &mut tokio::net::TcpStream, deadline: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(deadline, read).await.unwrap_or(false)
}

async fn connect(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

async fn send(conn: &mut tokio::net::TcpStream, bytes: &[u8]) {
    use tokio::io::AsyncWriteExt;
    conn.write_all(bytes).await.unwrap();
    conn.flush().await.unwrap();
}

#[actix_web::test]
async fn a_webhook_is_refused_on_its_headers_before_its_body_is_sent() {
    let env = Env::new(sqlite()).with_webhook();
    let (addr, server) = listen(&env, Default::default());
    let (body, good_signature) = signed_ping();
    let twenty_mib = 20 * 1024 * 1024;
    for (name, headers, length, status, code) in [
        (
            "no signature",
            vec![("X-GitHub-Event", "ping"), ("X-GitHub-Delivery", "h-1")],
            Some(twenty_mib),
            401,
            "unauthenticated",
        ),
        (
            "malformed signature",
            vec![
                ("X-Hub-Signature-256", "sha1=0123"),
                ("X-GitHub-Event", "ping"),
                ("X-GitHub-Delivery", "h-2"),
            ],
            Some(twenty_mib),
            401,
            "unauthenticated",
        ),
        (
            "empty event",
            vec![
                ("X-Hub-Signature-256", good_signature.as_str()),
                ("X-GitHub-Event", ""),
                ("X-GitHub-Delivery", "h-3"),
            ],
            Some(twenty_mib),
            400,
            "invalid_request",
        ),
        (
            "blank delivery",
            vec![
                ("X-Hub-Signature-256", good_signature.as_str()),
                ("X-GitHub-Event", "ping"),
                ("X-GitHub-Delivery", "  "),
            ],
            Some(twenty_mib),
            400,
            "invalid_request",
        ),
        (
            "over 25 MiB",
            vec![
                ("X-Hub-Signature-256", good_signature.as_str()),
                ("X-GitHub-Event", "ping"),
                ("X-GitHub-Delivery", "h-4"),
            ],
            Some(25 * 1024 * 1024 + 1),
            413,
            "payload_too_large",
        ),
        (
            "chunked, no length",
            vec![
                ("X-Hub-Signature-256", good_signature.as_str()),
                ("X-GitHub-Event", "ping"),
                ("X-GitHub-Delivery", "h-5"),
                ("Transfer-Encoding", "chunked"),
            ],
            None,
            411,
            "length_required",
        ),
    ] {
        let mut conn = connect(addr).await;
        // Only the head: the answer must not wait for a body that never comes.
        send(&mut conn, webhook_head(&headers, length).as_bytes()).await;
        let (got, text) = read_answer(&mut conn, Duration::from_secs(3))
            .await
            .unwrap_or_else(|| panic!("{name}: no answer before the body"));
        assert_eq!(got, status, "{name}: {text}");
        assert!(
            text.contains(&format!("\"code\":\"{code}\"")),
            "{name}: {text}"
        );
    }
    // The same headers with the body are accepted.
    let mut conn = connect(addr).await;
    let head = ping_head(&good_signature, "h-6", body.len());
    send(&mut conn, head.as_bytes()).await;
    send(&mut conn, &body).await;
    let (got, text) = read_answer(&mut conn, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got, 200, "{text}");
    assert_eq!(env.count("webhook_deliveries"), 1);
    server.stop(false).await;
}

#[actix_web::test]
async fn a_slow_webhook_body_is_cut_off() {
    use agentry_api::routes::webhooks::WebhookLimits;
    let env = Env::new(sqlite()).with_webhook();
    let read_timeout = Duration::from_millis(300);
    let (addr, server) = listen(
        &env,
        WebhookLimits::new(4, Duration::from_secs(1), read_timeout),
    );
    let (body, signature) = signed_ping();
    let mut conn = connect(addr).await;
    let head = ping_head(&signature, "slow-1", body.len());
    send(&mut conn, head.as_bytes()).await;
    send(&mut conn, &body[..10]).await;
    let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
        .await
        .expect("a slow body is answered, not waited for");
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(
        closed(&mut conn, Duration::from_secs(5)).await,
        "the connection is closed"
    );
    assert_eq!(env.count("webhook_deliveries"), 0);
    server.stop(false).await;
}

#[actix_web::test]
async fn webhook_bodies_are_read_a_few_at_a_time() {
    use agentry_api::routes::webhooks::WebhookLimits;
    let env = Env::new(sqlite()).with_webhook();
    let (body, signature) = signed_ping();
    // Memory for one body, and no pace limit: a half-sent body holds it.
    let (addr, server) = listen(
        &env,
        WebhookLimits::new(1, Duration::from_millis(100), Duration::from_secs(20))
            .with_memory(body.len())
            .with_min_rate(1),
    );
    let head = |id: &str| ping_head(&signature, id, body.len());
    // A delivery whose body is half sent holds the only read slot…
    let mut holder = connect(addr).await;
    send(&mut holder, head("holder").as_bytes()).await;
    send(&mut holder, &body[..body.len() / 2]).await;
    // …so another one is answered 503 with Retry-After (once the holder has the slot).
    let started = std::time::Instant::now();
    let mut busy = None;
    for i in 0.. {
        assert!(started.elapsed() < Duration::from_secs(10), "never busy");
        let mut conn = connect(addr).await;
        send(&mut conn, head(&format!("other-{i}")).as_bytes()).await;
        send(&mut conn, &body).await;
        let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
            .await
            .unwrap();
        if status == 503 {
            busy = Some(text);
            break;
        }
        assert_eq!(status, 200, "{text}");
    }
    let busy = busy.unwrap();
    assert!(busy.contains("\"code\":\"busy\""), "{busy}");
    assert!(
        busy.to_ascii_lowercase().contains("retry-after: 5"),
        "{busy}"
    );
    // The holder finishes; its delivery is accepted and the slot is free again.
    send(&mut holder, &body[body.len() / 2..]).await;
    let (status, text) = read_answer(&mut holder, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let mut conn = connect(addr).await;
    send(&mut conn, head("after").as_bytes()).await;
    send(&mut conn, &body).await;
    let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    server.stop(false).await;
}

/// Slow unauthenticated uploads (anyone can send them) cannot starve signed deliveries:
/// they are cut off after about a second, large ones hold at most the large-body slots
/// meanwhile, and a genuine delivery sent meanwhile is answered 200.
#[actix_web::test]
async fn slow_uploads_cannot_starve_signed_deliveries() {
    use agentry_api::routes::webhooks::WebhookLimits;
    let env = Env::new(sqlite()).with_webhook();
    let (addr, server) = listen(&env, WebhookLimits::default());
    let (body, signature) = signed_ping();
    let head = |id: &str, length: usize| ping_head(&signature, id, length);
    // Eight slow small uploads and four slow large ones, each stalled after a few bytes.
    let mut slow = Vec::new();
    for i in 0..8 {
        let mut conn = connect(addr).await;
        send(&mut conn, head(&format!("slow-{i}"), 5000).as_bytes()).await;
        send(&mut conn, &body[..10]).await;
        slow.push(conn);
    }
    let mut large = Vec::new();
    for i in 0..4 {
        let mut conn = connect(addr).await;
        send(
            &mut conn,
            head(&format!("large-{i}"), 20 * 1024 * 1024).as_bytes(),
        )
        .await;
        send(&mut conn, &body[..10]).await;
        large.push(conn);
    }
    // Genuine deliveries go through meanwhile.
    for i in 0..3 {
        let mut conn = connect(addr).await;
        send(&mut conn, head(&format!("real-{i}"), body.len()).as_bytes()).await;
        send(&mut conn, &body).await;
        let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(status, 200, "{text}");
    }
    // The small slow ones were cut off by their pace deadline.
    for mut conn in slow {
        let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
            .await
            .expect("a slow small upload is answered within seconds");
        assert_eq!(status, 408, "{text}");
    }
    // The large ones held the two large slots a second each, or were turned away: each is
    // answered 408 (behind the pace) or 503 (no slot), never accepted.
    for mut conn in large {
        let (status, text) = read_answer(&mut conn, Duration::from_secs(5))
            .await
            .expect("a slow large upload is answered within seconds");
        assert!(status == 408 || status == 503, "{text}");
    }
    assert_eq!(env.count("webhook_deliveries"), 3);
    server.stop(false).await;
}
