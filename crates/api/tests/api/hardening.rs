//! Randomised input against the real application: no query string, path, header or body may
//! produce a 5xx, a non-envelope error, or a write (docs/contract.md#32-errors, #7-reliability-and-security).

use crate::common::env::raw_req;
use crate::common::*;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};

const CASES: usize = 400;

fn sample<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
    strategy.new_tree(runner).expect("value").current()
}

fn check(code: u16, body: &serde_json::Value, what: &str) {
    assert!(code < 500, "{what} -> {code} {body}");
    if code >= 400 {
        assert!(
            body["error"]["code"].is_string() && body["error"]["message"].is_string(),
            "{what} -> {body}"
        );
    }
}

#[actix_web::test]
async fn random_query_strings_and_paths_never_fail_the_server() {
    let (db, t, app) = sqlite_app().await;
    let mut runner = TestRunner::new(Config::default());
    let query = proptest::string::string_regex(
        "((state|repoId|taskType|limit|cursor|days|x)=([a-zA-Z0-9%._~-]|%[0-9A-F]{2}){0,40}&?){0,5}",
    )
    .unwrap();
    let segment = proptest::string::string_regex("([a-zA-Z0-9._~-]|%[0-9A-F]{2}){0,40}").unwrap();
    for _ in 0..CASES {
        let q = sample(&mut runner, &query);
        let (code, body) = call(&app, get(&format!("/api/tasks?{q}"), &t.viewer)).await;
        check(code, &body, &q);
        let s = sample(&mut runner, &segment);
        for path in [
            format!("/api/tasks/{s}"),
            format!("/api/{s}"),
            format!("/api/tokens/{s}"),
        ] {
            let (code, body) = call(&app, get(&path, &t.viewer)).await;
            check(code, &body, &path);
        }
    }
    assert_eq!(task_count(&db.db), 0);
}

#[actix_web::test]
async fn random_bodies_never_fail_the_server_or_write() {
    let (db, t, app) = sqlite_app().await;
    let mut runner = TestRunner::new(Config::default());
    // Mostly JSON-looking text with the real member names, plus arbitrary bytes.
    let jsonish = proptest::string::string_regex(
        r#"[{}\[\]",:0-9.eE+ -]{0,10}("(title|repoUrl|taskType|state|costUsd|inputTokens|createdAt|name|role)"[:,]?[ "a-z0-9.{}\[\]-]{0,12}){0,8}[}\]]?"#,
    )
    .unwrap();
    let bytes = proptest::collection::vec(proptest::num::u8::ANY, 0..200);
    for i in 0..CASES {
        let body: Vec<u8> = if i % 3 == 0 {
            sample(&mut runner, &bytes)
        } else {
            sample(&mut runner, &jsonish).into_bytes()
        };
        let ndjson = "application/x-ndjson";
        let import = raw_req("POST", "/api/tasks/import", &t.admin, ndjson, body.clone());
        let (code, reply) = call(&app, import).await;
        check(code, &reply, &String::from_utf8_lossy(&body));
        let json = "application/json";
        let token = raw_req("POST", "/api/tokens", &t.admin, json, body.clone());
        let (code, reply) = call(&app, token).await;
        check(code, &reply, &String::from_utf8_lossy(&body));
        assert_ne!(
            code,
            201,
            "a random body created a token: {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(task_count(&db.db), 0);
}

#[actix_web::test]
async fn random_input_on_the_code_host_endpoints_never_fails_or_writes_when_refused() {
    let (db, t, app) = sqlite_app().await;
    let repo = agentry_persistence::repos::connect_repository(
        &mut db.db.conn().unwrap(),
        &agentry_persistence::repos::NewRepository {
            url: agentry_domain::RepoUrl::parse("https://github.com/acme/web").unwrap(),
            default_branch: "main".into(),
            clone_url: "https://github.com/acme/web.git".into(),
            codehost_id: None,
        },
        agentry_persistence::now(),
    )
    .unwrap()
    .0;
    let rows = || {
        let mut conn = db.db.conn().unwrap();
        (
            agentry_persistence::secrets::list(&mut conn).unwrap().len(),
            agentry_persistence::repos::get_repository(&mut conn, repo.id).unwrap(),
            task_count(&db.db),
        )
    };
    let mut runner = TestRunner::new(Config::default());
    let jsonish = proptest::string::string_regex(
        r#"[{}\[\]",:0-9.eE+ -]{0,10}("(value|repoUrl|issueNumber|repoId|title|body|agentType|codingModel|maxTurnsCoding|maxTurnsReview|autoReview|maxCostPerTaskUsd)"[:,]?[ "a-z0-9.{}\[\]-]{0,12}){0,8}[}\]]?"#,
    )
    .unwrap();
    let query =
        proptest::string::string_regex("((repoId|x)=([a-zA-Z0-9%._~-]|%[0-9A-F]{2}){0,40}&?){0,3}")
            .unwrap();
    let targets = [
        ("PUT", "/api/secrets/OTHER_KEY".to_owned()),
        ("POST", "/api/repos".to_owned()),
        ("PATCH", format!("/api/repos/{}/settings", repo.id)),
        ("POST", "/api/issues/assign".to_owned()),
    ];
    for _ in 0..CASES {
        let body = sample(&mut runner, &jsonish);
        for (method, path) in &targets {
            let before = rows();
            let req = raw_req(method, path, &t.admin, "application/json", body.clone());
            let (code, reply) = call(&app, req).await;
            check(code, &reply, &format!("{method} {path} {body}"));
            if code >= 400 {
                assert_eq!(rows(), before, "{method} {path} {body} wrote on {code}");
            }
        }
        let q = sample(&mut runner, &query);
        let (code, reply) = call(&app, get(&format!("/api/issues?{q}"), &t.viewer)).await;
        check(code, &reply, &q);
    }
}

/// A database that stays locked past the busy timeout (here by a second connection holding
/// SQLite's write lock) answers 503 `unavailable` with `Retry-After: 1`, never a 500, and
/// writes nothing; the same request succeeds once the lock is gone.
#[actix_web::test]
async fn a_locked_database_is_503_unavailable_with_retry_after() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, SqliteConnection};

    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("agentry.db");
    let url = format!("sqlite://{}", path.display());
    let db = agentry_persistence::Db::connect_with(&url, 4, std::time::Duration::from_millis(300))
        .expect("open SQLite");
    db.migrate().expect("migrate");
    let t = tokens(&db);
    let app = service(&db).await;
    let body = r#"{"name":"ci","role":"viewer"}"#;
    let create = || raw_req("POST", "/api/tokens", &t.admin, "application/json", body);
    let count = |db: &agentry_persistence::Db| {
        agentry_persistence::tokens::list_active(&mut db.conn().expect("connection"))
            .expect("tokens")
            .len()
    };
    let before = count(&db);

    let mut other =
        SqliteConnection::establish(path.to_str().expect("utf-8 path")).expect("second connection");
    other.batch_execute("BEGIN IMMEDIATE").expect("lock");
    let res = actix_web::test::call_service(&app, create()).await;
    assert_eq!(res.status().as_u16(), 503);
    assert_eq!(
        res.headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: serde_json::Value =
        serde_json::from_slice(&actix_web::test::read_body(res).await).expect("JSON");
    envelope(&body, "unavailable");
    other.batch_execute("ROLLBACK").expect("unlock");
    assert_eq!(count(&db), before, "a refused write wrote nothing");

    let (code, body) = call(&app, create()).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(count(&db), before + 1);
}
