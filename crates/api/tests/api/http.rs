//! The HTTP API end to end, in process: authentication and roles, the error envelope for
//! every kind of bad input (with nothing written), task listing and detail, import, tokens,
//! health, metrics and the OpenAPI document.

use crate::common::cost_data::start_at;
use crate::common::env::{bare, raw_req};
use crate::common::*;
use actix_web::test::TestRequest;
use agentry_domain::{TaskState, TaskType, Trigger, Usd};
use agentry_persistence::tasks::{self, Run, RunOutcome};
use agentry_persistence::write_tx;
use agentry_testkit::json::{elements_of, strings_of};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

const GOOD_LINE: &str = r#"{"title":"Old task","repoUrl":"git@github.com:Acme/Widgets.git","taskType":"coding","state":"completed","modelUsed":"claude-sonnet-4-5","costUsd":"0.123456","inputTokens":1000,"outputTokens":200,"createdAt":"2026-10-01T12:00:00Z"}"#;

fn import_req(token: &str, body: impl Into<String>) -> actix_http::Request {
    TestRequest::post()
        .uri("/api/tasks/import")
        .insert_header(("Authorization", format!("Bearer {token}")))
        .insert_header(("Content-Type", "application/x-ndjson"))
        .set_payload(body.into())
        .to_request()
}

#[actix_web::test]
async fn health_and_readiness_need_no_token() {
    let db = sqlite();
    let app = service(&db.db).await;
    for (path, status) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let (code, body) = call(&app, anonymous_get(path)).await;
        assert_eq!((code, body), (200, json!({ "status": status })));
    }
}

#[actix_web::test]
async fn every_api_route_needs_a_valid_token() {
    let (_db, t, app) = sqlite_app().await;
    let cases: [(&str, Option<String>, &str); 6] = [
        ("missing", None, "missing Authorization"),
        (
            "scheme",
            Some(format!("Basic {}", t.admin)),
            "expected Authorization: Bearer",
        ),
        (
            "empty",
            Some("Bearer ".into()),
            "expected Authorization: Bearer",
        ),
        (
            "unknown",
            Some("Bearer agt_nope".into()),
            "invalid or revoked",
        ),
        (
            "huge",
            Some(format!("Bearer {}", "a".repeat(5000))),
            "expected Authorization: Bearer",
        ),
        (
            "no space",
            Some("Bearer".into()),
            "expected Authorization: Bearer",
        ),
    ];
    for (name, header, expected) in cases {
        for path in [
            "/api/tasks",
            "/api/tokens",
            &format!("/api/tasks/{}", Uuid::new_v4()),
        ] {
            let mut req = TestRequest::get().uri(path);
            if let Some(h) = &header {
                req = req.insert_header(("Authorization", h.as_str()));
            }
            let (code, body) = call(&app, req.to_request()).await;
            assert_eq!(code, 401, "{name} {path}");
            assert!(
                envelope(&body, "unauthenticated").contains(expected),
                "{name}: {body}"
            );
        }
    }
    // The bearer scheme is case-insensitive (RFC 7235).
    let req = TestRequest::get()
        .uri("/api/tasks")
        .insert_header(("Authorization", format!("bearer {}", t.viewer)));
    assert_eq!(call(&app, req.to_request()).await.0, 200);
}

#[actix_web::test]
async fn roles_gate_writes() {
    let (db, t, app) = sqlite_app().await;
    for token in [&t.viewer, &t.member, &t.admin] {
        assert_eq!(call(&app, get("/api/tasks", token)).await.0, 200);
    }
    for token in [&t.viewer, &t.member] {
        let (code, body) = call(&app, import_req(token, GOOD_LINE)).await;
        assert_eq!(code, 403);
        assert!(envelope(&body, "forbidden").contains("admin"));
        let (code, _) = call(&app, get("/api/tokens", token)).await;
        assert_eq!(code, 403);
    }
    assert_eq!(task_count(&db.db), 0);
    assert_eq!(call(&app, import_req(&t.admin, GOOD_LINE)).await.0, 200);
}

/// A route that reads a JSON body checks the caller first: 401 for an unknown token, then 403
/// for a role below the route's, whatever the body. The body is not read for them, so neither
/// a malformed body, a wrong media type nor an oversized one answers first.
#[actix_web::test]
async fn callers_are_checked_before_the_body_is_read() {
    let (db, t, app) = sqlite_app().await;
    let unknown = agentry_api::auth::generate_token().unwrap();
    let repo = Uuid::new_v4();
    let settings = format!("/api/repos/{repo}/settings");
    let routes: [(&str, &str, &[&str]); 7] = [
        ("POST", "/api/tasks", &[&t.viewer]),
        ("POST", "/api/issues/assign", &[&t.viewer]),
        ("POST", "/api/tokens", &[&t.viewer, &t.member]),
        (
            "PUT",
            "/api/secrets/CODEHOST_TOKEN",
            &[&t.viewer, &t.member],
        ),
        ("PUT", "/api/budget", &[&t.viewer, &t.member]),
        ("POST", "/api/repos", &[&t.viewer, &t.member]),
        ("PATCH", &settings, &[&t.viewer, &t.member]),
    ];
    let oversized = format!("{{\"title\":\"{}\"}}", "x".repeat(1 << 20));
    let bodies = [
        ("application/json", "{".to_owned()),
        ("application/json", "[1, 2]".to_owned()),
        ("text/plain", "{}".to_owned()),
        ("application/json", oversized),
    ];
    for round in 0..5 {
        for (method, path, below) in &routes {
            for (content_type, body) in &bodies {
                let what = format!(
                    "{method} {path} {content_type} {} bytes, round {round}",
                    body.len()
                );
                let req = raw_req(method, path, &unknown, content_type, body.clone());
                let (status, answer) = call(&app, req).await;
                assert_eq!(status, 401, "{what}: {answer}");
                envelope(&answer, "unauthenticated");
                for token in below.iter() {
                    let req = raw_req(method, path, token, content_type, body.clone());
                    let (status, answer) = call(&app, req).await;
                    assert_eq!(status, 403, "{what}: {answer}");
                    envelope(&answer, "forbidden");
                }
            }
        }
    }
    // Then the id in the path, before the body.
    let req = raw_req(
        "PATCH",
        "/api/repos/nope/settings",
        &t.admin,
        "application/json",
        "{",
    );
    let (status, answer) = call(&app, req).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        envelope(&answer, "invalid_parameter").starts_with("id"),
        "{answer}"
    );
    assert_eq!(task_count(&db.db), 0);
}

#[actix_web::test]
async fn unknown_routes_and_methods_answer_the_envelope() {
    let (_db, t, app) = sqlite_app().await;
    const NOT_FOUND: (u16, &str) = (404, "not_found");
    const NOT_ALLOWED: (u16, &str) = (405, "method_not_allowed");
    for (method, path, (status, code)) in [
        ("GET", "/api/nope", NOT_FOUND),
        ("GET", "/api", NOT_FOUND),
        ("GET", "/api/tasks/1/2/3", NOT_FOUND),
        ("DELETE", "/api/tasks", NOT_ALLOWED),
        ("PUT", "/api/tasks/import", NOT_ALLOWED),
        ("GET", "/nothing-here", NOT_FOUND),
    ] {
        let (answer, body) = call(&app, bare(method, path, &t.admin)).await;
        assert_eq!(answer, status, "{method} {path}: {body}");
        envelope(&body, code);
    }
}

#[actix_web::test]
async fn task_list_pages_newest_first_with_filters() {
    let db = sqlite();
    let t = tokens(&db.db);
    let base = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap() - Duration::days(1);
    let mut ids = Vec::new();
    for i in 0..7 {
        let task_type = if i % 3 == 0 {
            TaskType::Review
        } else {
            TaskType::Coding
        };
        // Pairs of equal creation times exercise the id tie-break of the cursor.
        let task = create(
            &db.db,
            &new_task(
                "https://github.com/o/r",
                task_type,
                base + Duration::seconds(i / 2),
            ),
        );
        ids.push((task.created_at, task.id));
    }
    ids.sort_by(|a, b| b.cmp(a));
    let expected: Vec<String> = ids.iter().map(|(_, id)| id.to_string()).collect();
    let app = service(&db.db).await;

    let mut seen = Vec::new();
    let mut uri = "/api/tasks?limit=3".to_owned();
    loop {
        let (code, body) = call(&app, get(&uri, &t.viewer)).await;
        assert_eq!(code, 200, "{body}");
        seen.extend(
            elements_of(&body, "tasks")
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned()),
        );
        match body["nextCursor"].as_str() {
            Some(c) => uri = format!("/api/tasks?limit=3&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, expected);

    let (_, body) = call(&app, get("/api/tasks?taskType=review", &t.viewer)).await;
    assert_eq!(body["tasks"].as_array().unwrap().len(), 3);
    let (_, body) = call(
        &app,
        get("/api/tasks?state=queued&taskType=coding", &t.viewer),
    )
    .await;
    assert_eq!(body["tasks"].as_array().unwrap().len(), 4);
    let (_, body) = call(&app, get("/api/tasks?state=completed", &t.viewer)).await;
    assert_eq!(body, json!({ "tasks": [], "nextCursor": null }));
    let (_, body) = call(
        &app,
        get(&format!("/api/tasks?repoId={}", Uuid::new_v4()), &t.viewer),
    )
    .await;
    assert_eq!(body["tasks"], json!([]));
    let task = &call(&app, get("/api/tasks?limit=1", &t.viewer)).await.1["tasks"][0];
    // A list item leaves out the prompt (up to 256 KiB each); the detail view has it.
    assert!(task.get("prompt").is_none(), "{task}");
    assert_eq!(task["imported"], false, "{task}");
    let detail = call(
        &app,
        get(
            &format!("/api/tasks/{}", task["id"].as_str().unwrap()),
            &t.viewer,
        ),
    )
    .await
    .1;
    assert_eq!(detail["prompt"], "Do it");
    for member in [
        "id",
        "title",
        "repoId",
        "repoUrl",
        "taskType",
        "state",
        "agentType",
        "modelUsed",
        "costUsd",
        "inputTokens",
        "outputTokens",
        "prUrl",
        "prNumber",
        "issueNumber",
        "parentTaskId",
        "attempt",
        "errorMessage",
        "createdAt",
        "updatedAt",
        "startedAt",
        "finishedAt",
    ] {
        assert!(task.get(member).is_some(), "task lacks {member}: {task}");
    }
    assert!(task["createdAt"].as_str().unwrap().ends_with('Z'));
}

#[actix_web::test]
async fn bad_list_parameters_are_refused_naming_the_parameter() {
    let (_db, t, app) = sqlite_app().await;
    let queries = [
        "limit=0",
        "limit=201",
        "limit=500",
        "limit=abc",
        "limit=7.5",
        "limit=-1",
        "limit=",
        "limit=5&limit=6",
        "state=done",
        "state=QUEUED",
        "taskType=chat",
        "repoId=not-a-uuid",
        "cursor=garbage",
        "cursor=",
        "sort=asc",
    ];
    assert_bad_parameters(&app, &t.viewer, "/api/tasks", &queries).await;
    // An unknown parameter is named even after a good one.
    assert_bad_parameter(&app, &t.viewer, "/api/tasks", "limit=10&x%00=1", "x\0").await;
}

#[actix_web::test]
async fn a_metered_runs_calls_refusals_and_cost_mismatch_are_served() {
    use agentry_persistence::metering::{self, ModelCall};
    let db = sqlite();
    let t = tokens(&db.db);
    let now = agentry_persistence::now();
    let task = create(
        &db.db,
        &new_task("https://github.com/o/r", TaskType::Coding, now),
    );
    {
        let mut conn = db.db.conn().unwrap();
        for (i, cost) in [Some("0.003"), None].into_iter().enumerate() {
            metering::record_call(
                &mut conn,
                &ModelCall {
                    id: Uuid::now_v7(),
                    task_id: task.id,
                    attempt: 1,
                    provider: "anthropic".into(),
                    model: Some("claude-sonnet-5".into()),
                    status: if cost.is_some() { 200 } else { 429 },
                    outcome: if cost.is_some() {
                        "completed"
                    } else {
                        "refused"
                    }
                    .into(),
                    tokens: if cost.is_some() {
                        agentry_domain::Tokens::from_uncached(1000, 0, 0, 100)
                    } else {
                        agentry_domain::Tokens::default()
                    },
                    reasoning_tokens: 0,
                    cost_usd: Some(Usd::parse(cost.unwrap_or("0")).unwrap()),
                    started_at: now + Duration::seconds(i as i64),
                    duration_ms: 1200,
                },
            )
            .unwrap();
        }
        metering::record_blocked(&mut conn, task.id, 1, "169.254.169.254", 80, now).unwrap();
        tasks::record_run(
            &mut conn,
            &Run {
                model: Some("claude-sonnet-5".into()),
                cost_usd: Some(Usd::parse("0.003").unwrap()),
                tokens: agentry_domain::Tokens::from_uncached(1000, 0, 0, 100),
                turns: Some(2),
                outcome: RunOutcome::Failed,
                exit_code: Some(1),
                error_message: Some("budget reached".into()),
                sandboxed: Some(true),
                model_calls: Some(2),
                reported_cost_usd: Some(Usd::parse("0.000001").unwrap()),
                ..agentry_persistence::test_support::succeeded_run(task.id, 1, now)
            },
        )
        .unwrap();
        tasks::record_note(
            &mut conn,
            task.id,
            tasks::EventKind::CostMismatch,
            "cost_mismatch: metered 0.003 USD, reported 0.000001 USD",
            now,
        )
        .unwrap();
    }
    let app = service(&db.db).await;
    let (code, body) = client(&app, &t.viewer).task(task.id).await;
    assert_eq!(code, 200);
    let run = &body["runs"][0];
    assert_eq!(
        (
            &run["modelCalls"],
            &run["meteredCostUsd"],
            &run["reportedCostUsd"]
        ),
        (&json!(2), &json!("0.003"), &json!("0.000001"))
    );
    assert_eq!(body["events"][1]["kind"], "cost_mismatch");
    assert_eq!(body["events"][1]["from"], body["events"][1]["to"]);
    assert_eq!(
        body["egressBlocked"],
        json!([{
            "attempt": 1, "host": "169.254.169.254", "port": 80, "count": 1,
            "firstAt": body["egressBlocked"][0]["firstAt"], "lastAt": body["egressBlocked"][0]["lastAt"]
        }])
    );

    let (code, calls) = call(
        &app,
        get(&format!("/api/tasks/{}/calls", task.id), &t.viewer),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(calls["totalCostUsd"], "0.003");
    let outcomes = strings_of(&calls, "calls", "outcome");
    assert_eq!(outcomes, ["completed", "refused"]);
    assert_eq!(calls["calls"][1]["status"], 429);
    let (code, one) = call(
        &app,
        get(
            &format!("/api/tasks/{}/calls?attempt=2", task.id),
            &t.viewer,
        ),
    )
    .await;
    assert_eq!((code, one["calls"].as_array().unwrap().len()), (200, 0));
    for bad in ["attempt=0", "attempt=x", "attempt=99999999999", "other=1"] {
        let (code, body) = call(
            &app,
            get(&format!("/api/tasks/{}/calls?{bad}", task.id), &t.viewer),
        )
        .await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let (code, _) = call(
        &app,
        get(&format!("/api/tasks/{}/calls", Uuid::new_v4()), &t.viewer),
    )
    .await;
    assert_eq!(code, 404);
}

#[actix_web::test]
async fn task_detail_has_runs_events_issue_and_reviews() {
    let db = sqlite();
    let t = tokens(&db.db);
    let now = agentry_persistence::now();
    let mut coding = new_task("https://github.com/o/r", TaskType::Coding, now);
    coding.issue_number = Some(42);
    let coding = create(&db.db, &coding);
    let mut review = new_task(
        "https://github.com/o/r",
        TaskType::Review,
        now + Duration::seconds(1),
    );
    review.parent_task_id = Some(coding.id);
    let review = create(&db.db, &review);
    {
        let mut conn = db.db.conn().unwrap();
        start_at(&mut conn, coding.id, now);
        write_tx::<_, agentry_persistence::DbError, _>(&mut conn, |conn| {
            tasks::record_run(
                conn,
                &Run {
                    model: Some("claude-sonnet-4-5".into()),
                    cost_usd: Some(Usd::parse("0.123456").unwrap()),
                    tokens: agentry_domain::Tokens::from_uncached(10, 20, 30, 40),
                    turns: Some(7),
                    ..agentry_persistence::test_support::succeeded_run(coding.id, 1, now)
                },
            )?;
            tasks::transition_task(
                conn,
                coding.id,
                Trigger::PullRequestOpened,
                &rig::opening_pull("o/r", 9),
                now,
            )?;
            Ok(())
        })
        .unwrap();
    }
    let app = service(&db.db).await;
    let (code, body) = client(&app, &t.viewer).task(coding.id).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["state"], "pr_opened");
    assert_eq!(body["costUsd"], "0.123456");
    assert_eq!(
        (body["inputTokens"].as_i64(), body["outputTokens"].as_i64()),
        (Some(60), Some(40))
    );
    assert_eq!(body["modelUsed"], "claude-sonnet-4-5");
    assert_eq!(
        (body["prUrl"].as_str(), body["prNumber"].as_i64()),
        (Some("https://github.com/o/r/pull/9"), Some(9))
    );
    assert_eq!(
        body["issue"],
        json!({ "number": 42, "htmlUrl": "https://github.com/o/r/issues/42" })
    );
    let run = &body["runs"][0];
    assert_eq!(run["costUsd"], "0.123456");
    assert_eq!(
        (
            run["cacheReadTokens"].as_i64(),
            run["turns"].as_i64(),
            run["outcome"].as_str()
        ),
        (Some(20), Some(7), Some("succeeded"))
    );
    let transitions = transitions(&body);
    assert_eq!(
        transitions,
        vec![
            (Value::Null, json!("queued")),
            (json!("queued"), json!("provisioning")),
            (json!("provisioning"), json!("running")),
            (json!("running"), json!("pr_opened")),
        ]
    );
    assert_eq!(body["reviews"].as_array().unwrap().len(), 1);
    assert_eq!(body["reviews"][0]["id"], review.id.to_string());

    let (code, body) = client(&app, &t.viewer).task(Uuid::new_v4()).await;
    assert_eq!(code, 404);
    envelope(&body, "not_found");
    for bad in ["not-a-uuid", "123", "%00"] {
        let (code, body) = client(&app, &t.viewer).task(bad).await;
        assert_eq!(code, 400, "{bad}");
        assert!(envelope(&body, "invalid_parameter").starts_with("id:"));
    }
}

#[actix_web::test]
async fn import_writes_all_or_nothing_and_skips_known_ids() {
    let (db, t, app) = sqlite_app().await;
    let id = Uuid::new_v4();
    let with_id = GOOD_LINE.replacen('{', &format!(r#"{{"id":"{id}","#), 1);
    let body = format!("{GOOD_LINE}\n{with_id}\n\n{GOOD_LINE}\r\n");
    let (code, reply) = call(&app, import_req(&t.admin, body.clone())).await;
    assert_eq!((code, reply), (200, json!({ "imported": 3, "skipped": 0 })));
    let (code, detail) = client(&app, &t.viewer).task(id).await;
    assert_eq!(code, 200);
    assert_eq!(detail["repoUrl"], "https://github.com/acme/widgets");
    assert_eq!(detail["costUsd"], "0.123456");
    assert_eq!(detail["repoId"], Value::Null);
    assert_eq!(detail["imported"], true);
    assert_eq!(
        detail["events"],
        json!([{ "from": null, "to": "completed", "reason": "imported", "at": "2026-10-01T12:00:00Z", "kind": "transition" }])
    );

    let (code, reply) = call(&app, import_req(&t.admin, with_id.clone())).await;
    assert_eq!((code, reply), (200, json!({ "imported": 0, "skipped": 1 })));
    assert_eq!(task_count(&db.db), 3);

    let bad = format!(
        "{GOOD_LINE}\n{GOOD_LINE}\n{}\n{GOOD_LINE}\n",
        GOOD_LINE.replace("\"0.123456\"", "\"-5\"")
    );
    let (code, reply) = call(&app, import_req(&t.admin, bad)).await;
    assert_eq!(code, 400);
    let message = envelope(&reply, "invalid_request");
    assert!(message.starts_with("line 3: costUsd:"), "{message}");
    assert_eq!(task_count(&db.db), 3, "a rejected import writes nothing");

    let (code, reply) = call(&app, import_req(&t.admin, "")).await;
    assert_eq!((code, reply), (200, json!({ "imported": 0, "skipped": 0 })));
}

#[actix_web::test]
async fn import_refuses_bad_bodies_and_writes_nothing() {
    let (db, t, app) = sqlite_app().await;
    // The good line with `from` replaced by `to`.
    let altered = |from: &str, to: &str| GOOD_LINE.replace(from, to);
    // Bad lines, each with the message it gets after its line number.
    let bad_lines = [
        ("{\"title\":".to_owned(), "not valid JSON"),
        ("[]".to_owned(), "not a task record"),
        ("\"text\"".to_owned(), "not a task record"),
        ("null".to_owned(), "not a task record"),
        (altered("coding", "Coding"), "taskType:"),
        (
            altered("git@github.com:Acme/Widgets.git", "not a url"),
            "repoUrl:",
        ),
        // 1000 is the line's input tokens.
        (altered("1000", "1.5"), "inputTokens:"),
        (altered("1000", "\"1000\""), "inputTokens:"),
        (
            altered("\"inputTokens\":1000,", ""),
            "not a task record: missing field `inputTokens`",
        ),
        (altered("0.123456", "0.1234567891"), "costUsd:"),
        (altered("0.123456", "1e-3"), "costUsd:"),
        (altered("2026-10-01T12:00:00Z", "2026-10-01"), "createdAt:"),
        (altered("{", r#"{"id":"nope","#), "id:"),
        (altered("{", r#"{"extra":1,"#), "extra:"),
    ];
    for (line, expected) in bad_lines {
        let (code, reply) = call(&app, import_req(&t.admin, format!("{line}\n{GOOD_LINE}"))).await;
        assert_eq!(code, 400, "{line}");
        let message = envelope(&reply, "invalid_request");
        let expected = format!("line 1: {expected}");
        assert!(message.starts_with(&expected), "{line}: {message}");
    }
    let invalid_utf8 = TestRequest::post()
        .uri("/api/tasks/import")
        .insert_header(("Authorization", format!("Bearer {}", t.admin)))
        .insert_header(("Content-Type", "application/x-ndjson"))
        .set_payload(vec![0xff, 0xfe, b'\n'])
        .to_request();
    let (code, reply) = call(&app, invalid_utf8).await;
    assert_eq!(code, 400);
    assert!(envelope(&reply, "invalid_request").contains("UTF-8"));
    for content_type in [None, Some("application/json"), Some("text/plain")] {
        let mut req = TestRequest::post()
            .uri("/api/tasks/import")
            .insert_header(("Authorization", format!("Bearer {}", t.admin)))
            .set_payload(GOOD_LINE);
        if let Some(ct) = content_type {
            req = req.insert_header(("Content-Type", ct));
        }
        let (code, reply) = call(&app, req.to_request()).await;
        assert_eq!(code, 400, "{content_type:?}");
        assert!(envelope(&reply, "invalid_request").contains("application/x-ndjson"));
    }
    assert_eq!(task_count(&db.db), 0);
}

fn token_req(
    token: &str,
    content_type: Option<&str>,
    body: impl Into<actix_web::web::Bytes>,
) -> actix_http::Request {
    let mut req = TestRequest::post()
        .uri("/api/tokens")
        .insert_header(("Authorization", format!("Bearer {token}")))
        .set_payload(body.into());
    if let Some(ct) = content_type {
        req = req.insert_header(("Content-Type", ct));
    }
    req.to_request()
}

#[actix_web::test]
async fn tokens_are_created_listed_used_and_revoked() {
    let (_db, t, app) = sqlite_app().await;
    let (code, created) = call(
        &app,
        token_req(
            &t.admin,
            Some("application/json"),
            r#"{"name":" dashboard ","role":"viewer"}"#,
        ),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        (created["name"].as_str(), created["role"].as_str()),
        (Some("dashboard"), Some("viewer"))
    );
    let new_token = created["token"].as_str().unwrap().to_owned();
    assert_eq!(call(&app, get("/api/tasks", &new_token)).await.0, 200);
    let (_, list) = call(&app, get("/api/tokens", &t.admin)).await;
    assert_eq!(list["tokens"].as_array().unwrap().len(), 4);
    assert!(
        list.to_string().find(&new_token).is_none(),
        "the list never shows a token"
    );

    let id = created["id"].as_str().unwrap();
    let revoke = |id: &str| {
        TestRequest::delete()
            .uri(&format!("/api/tokens/{id}"))
            .insert_header(("Authorization", format!("Bearer {}", t.admin)))
            .to_request()
    };
    assert_eq!(call(&app, revoke(id)).await.0, 204);
    assert_unauthenticated(&app, get("/api/tasks", &new_token)).await;
    let (code, body) = call(&app, revoke(id)).await;
    assert_eq!(code, 404);
    envelope(&body, "not_found");
    let (code, body) = call(&app, revoke("nope")).await;
    assert_eq!(code, 400);
    envelope(&body, "invalid_parameter");
}

#[actix_web::test]
async fn bad_json_bodies_are_refused_and_nothing_is_written() {
    let (_db, t, app) = sqlite_app().await;
    let json = Some("application/json");
    // (content type, body, status, code, message fragment)
    type Case<'a> = (Option<&'a str>, Vec<u8>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            json,
            br#"{"name":"x","#.to_vec(),
            400,
            "invalid_request",
            "not valid JSON",
        ),
        (json, b"".to_vec(), 400, "invalid_request", "not valid JSON"),
        (
            json,
            b"[]".to_vec(),
            400,
            "invalid_request",
            "must be a JSON object",
        ),
        // serde alone would read the struct from its members in order.
        (
            json,
            br#"["x","viewer"]"#.to_vec(),
            400,
            "invalid_request",
            "must be a JSON object",
        ),
        (
            json,
            b"null".to_vec(),
            400,
            "invalid_request",
            "must be a JSON object",
        ),
        (
            json,
            br#"{"name":5,"role":"viewer"}"#.to_vec(),
            400,
            "invalid_parameter",
            "name:",
        ),
        (
            json,
            br#"{"name":"x","role":"root"}"#.to_vec(),
            400,
            "invalid_parameter",
            "role:",
        ),
        (
            json,
            br#"{"name":"x"}"#.to_vec(),
            400,
            "invalid_request",
            "missing field `role`",
        ),
        (
            json,
            br#"{"name":"x","role":"viewer","admin":true}"#.to_vec(),
            400,
            "invalid_parameter",
            "admin:",
        ),
        (
            json,
            br#"{"name":"   ","role":"viewer"}"#.to_vec(),
            400,
            "invalid_parameter",
            "name:",
        ),
        (
            json,
            format!(r#"{{"name":"{}","role":"viewer"}}"#, "n".repeat(101)).into_bytes(),
            400,
            "invalid_parameter",
            "name:",
        ),
        (
            None,
            br#"{"name":"x","role":"viewer"}"#.to_vec(),
            400,
            "invalid_request",
            "Content-Type must be application/json",
        ),
        (
            Some("text/plain"),
            br#"{"name":"x","role":"viewer"}"#.to_vec(),
            400,
            "invalid_request",
            "Content-Type",
        ),
        (
            json,
            vec![b' '; 1024 * 1024 + 1],
            413,
            "payload_too_large",
            "larger than the limit",
        ),
    ];
    for (content_type, body, status, code, fragment) in cases {
        let (got, reply) = call(&app, token_req(&t.admin, content_type, body.clone())).await;
        assert_eq!(
            got,
            status,
            "{}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        let message = envelope(&reply, code);
        assert!(message.contains(fragment), "{message}");
    }
    let (_, list) = call(&app, get("/api/tokens", &t.admin)).await;
    assert_eq!(
        list["tokens"].as_array().unwrap().len(),
        3,
        "no token was created"
    );
    // The budget's body in array form (found by the API fuzzer): refused, nothing set.
    let put = TestRequest::put()
        .uri("/api/budget")
        .insert_header(("Authorization", format!("Bearer {}", t.admin)))
        .insert_header(("Content-Type", "application/json"))
        .set_payload(r#"["5"]"#)
        .to_request();
    let (got, reply) = call(&app, put).await;
    assert_eq!(got, 400);
    assert!(envelope(&reply, "invalid_request").contains("must be a JSON object"));
    let (_, budget) = call(&app, get("/api/budget", &t.admin)).await;
    assert!(budget["monthlyBudgetUsd"].is_null(), "{budget}");
}

/// Every route the application registers is in the OpenAPI document, and every operation
/// the document lists is served (never the unknown-route answer).
#[actix_web::test]
async fn the_openapi_document_lists_exactly_the_served_routes() {
    let (_db, t, app) = sqlite_app().await;
    let (code, doc) = call(&app, anonymous_get("/api/openapi.json")).await;
    assert_eq!(code, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut operations: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    operations.sort();
    let mut expected: Vec<(String, String)> = [
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/api/openapi.json"),
        ("GET", "/api/tasks"),
        ("GET", "/api/tasks/{id}"),
        ("POST", "/api/tasks"),
        ("POST", "/api/tasks/import"),
        ("POST", "/api/tasks/{id}/cancel"),
        ("POST", "/api/tasks/{id}/retry"),
        ("GET", "/api/tasks/{id}/calls"),
        ("GET", "/api/tasks/{id}/log"),
        ("GET", "/api/me"),
        ("GET", "/api/tokens"),
        ("POST", "/api/tokens"),
        ("DELETE", "/api/tokens/{id}"),
        ("GET", "/api/analytics/costs"),
        ("GET", "/api/secrets"),
        ("PUT", "/api/secrets/{name}"),
        ("DELETE", "/api/secrets/{name}"),
        ("GET", "/api/repos"),
        ("POST", "/api/repos"),
        ("GET", "/api/repos/{id}"),
        ("DELETE", "/api/repos/{id}"),
        ("GET", "/api/repos/{id}/settings"),
        ("PATCH", "/api/repos/{id}/settings"),
        ("GET", "/api/issues"),
        ("POST", "/api/issues/sync"),
        ("POST", "/api/issues/assign"),
        ("POST", "/api/webhooks/codehost"),
        ("GET", "/api/budget"),
        ("PUT", "/api/budget"),
        ("GET", "/api/budget/alerts"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    expected.sort();
    assert_eq!(operations, expected);
    for (method, path) in &operations {
        let uri = path
            .replace("{id}", &Uuid::new_v4().to_string())
            .replace("{name}", "SOME_SECRET");
        let req = bare(method, &uri, &t.admin);
        let (_, body) = call(&app, req).await;
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            !message.starts_with("no route"),
            "{method} {path} is documented but not served"
        );
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert!(doc["components"]["schemas"]["TaskDto"].is_object());
    let summary = &doc["components"]["schemas"]["TaskSummaryDto"];
    assert!(summary["properties"]["title"].is_object(), "{summary}");
    assert!(summary["properties"].get("prompt").is_none(), "{summary}");
    assert_eq!(
        doc["components"]["schemas"]["TaskListDto"]["properties"]["tasks"]["items"]["$ref"],
        "#/components/schemas/TaskSummaryDto"
    );
}

#[actix_web::test]
async fn undeclared_methods_on_known_paths_answer_405_with_allow() {
    let (_db, t, app) = sqlite_app().await;
    let id = Uuid::new_v4();
    for (method, path, allow) in [
        ("TRACE", "/api/tasks".to_owned(), "GET, POST"),
        ("QUERY", "/api/tasks".to_owned(), "GET, POST"),
        ("DELETE", "/api/tasks".to_owned(), "GET, POST"),
        ("PUT", format!("/api/tasks/{id}"), "GET"),
        ("PUT", "/api/tasks/import".to_owned(), "POST"),
        ("GET", "/api/tasks/import".to_owned(), "POST"),
        ("GET", format!("/api/tasks/{id}/cancel"), "POST"),
        ("HEAD", "/api/tokens".to_owned(), "GET, POST"),
        ("TRACE", "/api/webhooks/codehost".to_owned(), "POST"),
        ("POST", "/healthz".to_owned(), "GET"),
        ("PATCH", format!("/api/repos/{id}"), "GET, DELETE"),
    ] {
        let req = bare(method, &path, &t.admin);
        let res = actix_web::test::call_service(&app, req).await;
        assert_eq!(res.status(), 405, "{method} {path}");
        assert_eq!(
            res.headers().get("allow").unwrap(),
            allow,
            "{method} {path}"
        );
        let body: Value = actix_web::test::read_body_json(res).await;
        envelope(&body, "method_not_allowed");
    }
    for (method, path) in [
        ("TRACE", "/api/nope"),
        ("GET", "/api/tasks/1/2/3"),
        ("GET", "/api/tasks/"),
        ("GET", "/nothing-here"),
    ] {
        let req = bare(method, path, &t.admin);
        let (code, body) = call(&app, req).await;
        assert_eq!(code, 404, "{method} {path}");
        envelope(&body, "not_found");
    }
}

#[actix_web::test]
async fn made_up_methods_and_paths_do_not_grow_the_metrics() {
    use proptest::strategy::{Strategy, ValueTree};
    let db = sqlite();
    let app = service(&db.db).await;
    let mut runner = proptest::test_runner::TestRunner::default();
    let names = proptest::string::string_regex("[A-Z][A-Z0-9_-]{2,20}").unwrap();
    let segment = proptest::string::string_regex("[a-z0-9]{1,12}").unwrap();
    for _ in 0..50 {
        let method = names.new_tree(&mut runner).unwrap().current();
        let path = format!("/api/{}", segment.new_tree(&mut runner).unwrap().current());
        let other = format!("/{}", segment.new_tree(&mut runner).unwrap().current());
        for uri in [&path, &other, &"/api/tasks".to_owned()] {
            let req = TestRequest::default()
                .method(method.parse().unwrap())
                .uri(uri)
                .to_request();
            let (code, _) = call(&app, req).await;
            assert!(
                code == 404 || code == 405 || code == 401,
                "{method} {uri}: {code}"
            );
        }
    }
    let t = tokens(&db.db);
    let text = metrics_text(&app, &t.viewer).await;
    let label = |name: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("agentry_http_requests_total{"))
            .filter_map(|l| {
                let start = l.find(&format!("{name}=\""))? + name.len() + 2;
                let end = start + l[start..].find('"')?;
                Some(l[start..end].to_owned())
            })
            .collect()
    };
    let methods = label("method");
    assert!(
        methods.iter().all(|m| m == "OTHER"),
        "one label for all made-up methods: {methods:?}"
    );
    let routes = label("route");
    assert!(
        routes.len() <= 3,
        "made-up paths are not labels: {routes:?}"
    );
    assert!(
        routes
            .iter()
            .all(|r| !r.contains("/api/") || r == "/api/tasks"),
        "{routes:?}"
    );
}

#[actix_web::test]
async fn responses_are_not_sniffed_and_api_answers_are_not_cached() {
    let (_db, t, app) = sqlite_app().await;
    let created = TestRequest::post()
        .uri("/api/tokens")
        .insert_header(("Authorization", format!("Bearer {}", t.admin)))
        .insert_header(("Content-Type", "application/json"))
        .set_payload(r#"{"name":"ci","role":"viewer"}"#)
        .to_request();
    for (req, status, api) in [
        (created, 201, true),
        (get("/api/tasks", &t.viewer), 200, true),
        (get("/api/tasks", "agt_wrong"), 401, true),
        (get("/api/nope", &t.viewer), 404, true),
        (get("/api/openapi.json", &t.viewer), 200, true),
        (anonymous_get("/healthz"), 200, false),
        (anonymous_get("/nothing"), 404, false),
    ] {
        let what = format!("{} {}", req.method(), req.path());
        let res = actix_web::test::call_service(&app, req).await;
        assert_eq!(res.status(), status, "{what}");
        assert_eq!(
            res.headers().get("x-content-type-options").unwrap(),
            "nosniff",
            "{what}"
        );
        let cache = res.headers().get("cache-control");
        if api {
            assert_eq!(cache.unwrap(), "no-store", "{what}");
        } else {
            assert!(cache.is_none(), "{what}");
        }
    }
}

#[actix_web::test]
async fn metrics_count_requests_by_route_pattern() {
    let (_db, t, app) = sqlite_app().await;
    for _ in 0..3 {
        client(&app, &t.viewer).task(Uuid::new_v4()).await;
    }
    let text = metrics_text(&app, &t.viewer).await;
    assert!(
        text.contains(
            r#"agentry_http_requests_total{method="GET",route="/api/tasks/{id}",status="404"} 3"#
        ),
        "{text}"
    );
    assert!(text.contains("agentry_http_request_duration_seconds_bucket"));
}

#[actix_web::test]
async fn metrics_need_a_token_unless_public() {
    let (db, t, app) = sqlite_app().await;
    assert_unauthenticated(&app, anonymous_get("/metrics")).await;
    assert_unauthenticated(&app, get("/metrics", "agt_not-a-real-token")).await;
    // Any role will do.
    for token in [&t.viewer, &t.member, &t.admin] {
        let res = actix_web::test::call_service(&app, get("/metrics", token)).await;
        assert_eq!(res.status(), 200);
    }

    // AGENTRY_METRICS_PUBLIC=1: no token needed.
    let public = service_with(state_public_metrics(&db.db)).await;
    actix_web::test::call_service(&public, anonymous_get("/healthz")).await;
    let (status, text) = call_text(&public, anonymous_get("/metrics")).await;
    assert_eq!(status, 200);
    assert!(
        text.contains("# TYPE agentry_http_requests_total counter"),
        "{text}"
    );
}

/// Records a run costing `nanos` and `blocked` refused connections for a new task of `repo`.
fn spend(db: &agentry_persistence::Db, repo: &str, nanos: i64, blocked: usize) {
    use agentry_persistence::metering;
    let now = agentry_persistence::now();
    let task = create(db, &new_task(repo, TaskType::Coding, now));
    let mut conn = db.conn().unwrap();
    for i in 0..blocked {
        let host = if i % 2 == 0 {
            "169.254.169.254"
        } else {
            "evil.example"
        };
        metering::record_blocked(&mut conn, task.id, 1, host, 80, now).unwrap();
    }
    tasks::record_run(
        &mut conn,
        &Run {
            model: Some("opus".into()),
            cost_usd: Some(Usd::from_nanos(nanos).unwrap()),
            tokens: agentry_domain::Tokens::from_uncached(1, 0, 0, 1),
            sandboxed: Some(true),
            ..agentry_persistence::test_support::succeeded_run(task.id, 1, now)
        },
    )
    .unwrap();
}

/// Per-repository series name connected repositories only: not a disconnected one, not
/// history whose repository was never connected; the values are the exact sums.
#[actix_web::test]
async fn metrics_name_connected_repositories_only() {
    let (db, t, app) = sqlite_app().await;
    let (web_repo, gone, never) = (
        "https://github.com/acme/web",
        "https://github.com/acme/secret-project",
        "https://github.com/acme/imported-only",
    );
    connect_url(&db.db, web_repo);
    let gone_id = connect_url(&db.db, gone);
    spend(&db.db, web_repo, 100_000_000, 3);
    spend(&db.db, web_repo, 200_000_000, 1);
    spend(&db.db, gone, 5_000_000_000, 2);
    spend(&db.db, never, 7_000_000_000, 2);
    agentry_persistence::repos::disconnect_repository(
        &mut db.db.conn().unwrap(),
        gone_id,
        agentry_persistence::now(),
    )
    .unwrap();

    let text = metrics_text(&app, &t.viewer).await;
    assert!(
        text.contains(
            "agentry_cost_usd_total{model=\"opus\",repo=\"https://github.com/acme/web\",task_type=\"coding\"} 0.3\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("agentry_egress_blocked_total{repo=\"https://github.com/acme/web\"} 4\n"),
        "{text}"
    );
    assert!(!text.contains("secret-project"), "{text}");
    assert!(!text.contains("imported-only"), "{text}");
    // The rollup holds every repository's exact sum, equal to the ledger's.
    let mut conn = db.db.conn().unwrap();
    assert_eq!(
        agentry_persistence::scrape::run_cost_totals(&mut conn).unwrap(),
        agentry_persistence::rollups::run_cost_totals(&mut conn).unwrap()
    );
}

#[actix_web::test]
async fn cors_answers_the_configured_origin_only() {
    let db = sqlite();
    let app = service(&db.db).await;
    let preflight = |origin: &str| {
        TestRequest::default()
            .method(actix_web::http::Method::OPTIONS)
            .uri("/api/tasks")
            .insert_header(("Origin", origin))
            .insert_header(("Access-Control-Request-Method", "GET"))
            .to_request()
    };
    let res = actix_web::test::call_service(&app, preflight("https://app.example")).await;
    assert_eq!(
        res.headers().get("access-control-allow-origin").unwrap(),
        "https://app.example"
    );
    let res = actix_web::test::call_service(&app, preflight("https://evil.example")).await;
    assert!(res.headers().get("access-control-allow-origin").is_none());
}

/// The same API on PostgreSQL when the suite has a server: listing, detail and import.
#[actix_web::test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
async fn the_api_works_on_postgresql_too() {
    let Some(db) = agentry_persistence::test_support::TestDb::postgres() else {
        return;
    };
    let t = tokens(&db.db);
    let app = service(&db.db).await;
    let (code, reply) = call(
        &app,
        import_req(&t.admin, format!("{GOOD_LINE}\n{GOOD_LINE}")),
    )
    .await;
    assert_eq!((code, reply), (200, json!({ "imported": 2, "skipped": 0 })));
    let (code, list) = call(&app, get("/api/tasks?limit=1", &t.viewer)).await;
    assert_eq!(code, 200);
    let id = list["tasks"][0]["id"].as_str().unwrap().to_owned();
    let next = list["nextCursor"].as_str().unwrap().to_owned();
    let (_, page2) = call(
        &app,
        get(&format!("/api/tasks?limit=1&cursor={next}"), &t.viewer),
    )
    .await;
    assert_eq!(page2["tasks"].as_array().unwrap().len(), 1);
    assert_ne!(page2["tasks"][0]["id"], list["tasks"][0]["id"]);
    assert_eq!(page2["nextCursor"], Value::Null);
    let (code, detail) = client(&app, &t.viewer).task(id).await;
    assert_eq!(code, 200);
    assert_eq!(detail["costUsd"], "0.123456");
    let bad = format!("{GOOD_LINE}\n{{oops");
    let (code, _) = call(&app, import_req(&t.admin, bad)).await;
    assert_eq!(code, 400);
    assert_eq!(task_count(&db.db), 2);
    assert_eq!(TaskState::Completed.as_str(), detail["state"]);
}

/// The cost report's schema is generated from its Rust types: every member of docs/contract.md#4-cost-report.
#[actix_web::test]
async fn the_cost_report_schema_has_every_member() {
    let doc = serde_json::to_value(agentry_api::app::openapi()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let members = |name: &str| -> Vec<String> {
        let mut m: Vec<String> = schemas[name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}"))
            .keys()
            .cloned()
            .collect();
        m.sort();
        m
    };
    assert_eq!(
        members("CostReport"),
        [
            "anomalies",
            "budgets",
            "costByModel",
            "costByRepo",
            "costByType",
            "dailyCosts",
            "forecast",
            "modelSuggestions",
            "outcomes",
            "summary",
            "topTasks"
        ]
    );
    assert_eq!(
        members("Summary"),
        [
            "avgCost",
            "costTrend",
            "days",
            "prevPeriodCost",
            "taskCount",
            "tasksWithCost",
            "totalCost"
        ]
    );
    assert_eq!(
        members("Forecast"),
        [
            "dailyAvgCost",
            "daysRemaining",
            "forecastedMonthTotal",
            "monthCostSoFar",
            "monthImportedCostSoFar"
        ]
    );
    assert_eq!(schemas["DailyCost"]["properties"]["cost"]["type"], "number");
    // A top task is a costed task (its money a string) with its tokens.
    assert_eq!(
        schemas["TopTask"]["allOf"][0]["$ref"],
        "#/components/schemas/CostedTask"
    );
    assert_eq!(
        schemas["CostedTask"]["properties"]["costUsd"]["type"],
        "string"
    );
    let op = &doc["paths"]["/api/analytics/costs"]["get"]["responses"]["200"]["content"]["application/json"]
        ["schema"];
    assert_eq!(op["$ref"], "#/components/schemas/CostReport");
}

#[actix_web::test]
async fn integral_json_numbers_count_as_integers_and_the_document_states_the_limits() {
    let (_db, t, app) = sqlite_app().await;
    let assign = |number: &str| {
        TestRequest::post()
            .uri("/api/issues/assign")
            .insert_header(("Authorization", format!("Bearer {}", t.member)))
            .insert_header(("Content-Type", "application/json"))
            .set_payload(format!(
                r#"{{"issueNumber": {number}, "repoId": "{}", "title": "Fix it"}}"#,
                Uuid::new_v4()
            ))
            .to_request()
    };
    // 7.0 and 7e0 are the integer 7 (JSON does not tell them apart): past parsing, the
    // unknown repository is what is refused.
    for number in ["7", "7.0", "7e0"] {
        let (code, body) = call(&app, assign(number)).await;
        assert_eq!(code, 404, "{number}: {body}");
    }
    for number in ["7.5", "1e300", "\"7\""] {
        let (code, body) = call(&app, assign(number)).await;
        assert_eq!(code, 400, "{number}: {body}");
        assert!(
            envelope(&body, "invalid_parameter").starts_with("issueNumber:"),
            "{number}: {body}"
        );
    }
    let (_, doc) = call(&app, get("/api/openapi.json", &t.viewer)).await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["AssignIssue"]["properties"]["issueNumber"]["minimum"],
        1
    );
    assert_eq!(schemas["CreateTask"]["properties"]["title"]["minLength"], 1);
    assert_eq!(
        schemas["CreateTask"]["properties"]["title"]["maxLength"],
        500
    );
    assert_eq!(
        schemas["CreateToken"]["properties"]["name"]["maxLength"],
        100
    );
    assert!(schemas["ConnectRepo"]["properties"]["repoUrl"]["pattern"].is_string());
    assert_eq!(
        schemas["AgentTypeName"]["enum"],
        json!(["claude-code", "codex"])
    );
}
