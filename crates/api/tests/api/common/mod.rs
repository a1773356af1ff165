//! A test instance of the API: the real application over a fresh database, with one token
//! of each role.
#![allow(dead_code)]

pub mod env;

pub use agentry_test_rigs::{cost_data, rig};

/// The fake GitHub's route of a repository's pull requests, as its fault injection and
/// request counts name it.
pub const PULLS: &str = "/repos/{o}/{r}/pulls";
/// The fake GitHub's route of a pull request's reviews.
pub const REVIEWS: &str = "/repos/{o}/{r}/pulls/{n}/reviews";

pub use rig::{PATIENCE, code_host_with, connect_url, create, new_task, service_from, test_timing};

use actix_http::Request;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::test;
use actix_web::web;

use agentry_api::auth::{generate_token, hash_token};
use agentry_api::state::AppState;
use agentry_domain::Role;
use agentry_persistence::Db;
use agentry_persistence::secrets::MasterKey;
use agentry_persistence::test_support::TestDb;
use agentry_service::codehost::CodeHost;
use agentry_testkit::json::elements_of;
use serde_json::Value;

pub struct Tokens {
    pub admin: String,
    pub member: String,
    pub viewer: String,
}

pub fn tokens(db: &Db) -> Tokens {
    let mut conn = db.conn().unwrap();
    let mut make = |role: Role| {
        let token = generate_token().unwrap();
        agentry_persistence::tokens::create_token(
            &mut conn,
            role.as_str(),
            role,
            &hash_token(&token),
            agentry_persistence::now(),
        )
        .unwrap();
        token
    };
    Tokens {
        admin: make(Role::Admin),
        member: make(Role::Member),
        viewer: make(Role::Viewer),
    }
}

/// Application state over `db` with the code-host integration `codehost`.
pub fn state_from(db: &Db, codehost: CodeHost) -> web::Data<AppState> {
    state_of(service_from(db, codehost))
}

/// Application state over `service`.
pub fn state_of(service: agentry_service::Service) -> web::Data<AppState> {
    web::Data::new(AppState::new(service).unwrap())
}

/// Application state over `db` (no reachable code host) that serves `/metrics` without a
/// token, as with `AGENTRY_METRICS_PUBLIC=1`.
pub fn state_public_metrics(db: &Db) -> web::Data<AppState> {
    web::Data::new(
        AppState::new(rig::service_of(db))
            .unwrap()
            .with_metrics_public(true),
    )
}

/// Application state over `db` whose code host is `api_url` and master key `key` (a
/// "restarted process" reuses the key of the first).
pub fn state_with_key(db: &Db, api_url: &str, key: MasterKey) -> web::Data<AppState> {
    state_of(rig::service_with_key(db, api_url, key, rig::test_timing()))
}

/// Application state over `db` with no reachable code host (port 9 refuses connections).
pub fn state(db: &Db) -> web::Data<AppState> {
    state_of(rig::service_of(db))
}

pub async fn service(
    db: &Db,
) -> impl Service<
    Request,
    Response = ServiceResponse<impl actix_web::body::MessageBody>,
    Error = actix_web::Error,
> {
    service_with(state(db)).await
}

/// A fresh SQLite database, one token of each role, and the application over it.
pub async fn sqlite_app() -> (
    TestDb,
    Tokens,
    impl Service<
        Request,
        Response = ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
    >,
) {
    let db = sqlite();
    let t = tokens(&db.db);
    let app = service_with(state(&db.db)).await;
    (db, t, app)
}

/// The application over `state`.
pub async fn service_with(
    state: web::Data<AppState>,
) -> impl Service<
    Request,
    Response = ServiceResponse<impl actix_web::body::MessageBody>,
    Error = actix_web::Error,
> {
    test::init_service(agentry_api::app::build_app(
        state,
        vec!["https://app.example".into()],
    ))
    .await
}

/// Sends a request and returns (status, parsed JSON body or Null).
pub async fn call<S, B>(app: &S, req: Request) -> (u16, Value)
where
    S: Service<Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let res = test::call_service(app, req).await;
    let status = res.status().as_u16();
    let bytes = test::read_body(res).await;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, body)
}

/// Sends a request and returns (status, body as text, any invalid UTF-8 replaced).
pub async fn call_text<S: TestApp>(app: &S, req: Request) -> (u16, String) {
    let res = test::call_service(app, req).await;
    let status = res.status().as_u16();
    let bytes = test::read_body(res).await;
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// `GET /metrics` with `token`: the exposition text (asserting a 200).
pub async fn metrics_text<S: TestApp>(app: &S, token: &str) -> String {
    let (status, text) = call_text(app, get("/metrics", token)).await;
    assert_eq!(status, 200, "{text}");
    text
}

/// Asserts that `req` is refused 401 with the `unauthenticated` envelope; returns its
/// message.
pub async fn assert_unauthenticated<S: TestApp>(app: &S, req: Request) -> String {
    let (code, body) = call(app, req).await;
    assert_eq!(code, 401, "{body}");
    envelope(&body, "unauthenticated")
}

/// Asserts the docs/contract.md#32-errors envelope with `code`, returning the message.
pub fn envelope(body: &Value, code: &str) -> String {
    let err = body
        .get("error")
        .unwrap_or_else(|| panic!("not an error envelope: {body}"));
    assert_eq!(err["code"], code, "{body}");
    let message = err["message"].as_str().expect("message").to_owned();
    assert!(!message.is_empty());
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    assert_eq!(err.as_object().unwrap().len(), 2, "{body}");
    message
}

/// Asserts that `GET path?query` (with `token`) answers 400 `invalid_parameter` naming
/// `field` first.
pub async fn assert_bad_parameter<S: TestApp>(
    app: &S,
    token: &str,
    path: &str,
    query: &str,
    field: &str,
) {
    let (code, body) = call(app, get(&format!("{path}?{query}"), token)).await;
    assert_eq!(code, 400, "{query}");
    let message = envelope(&body, "invalid_parameter");
    assert!(
        message.starts_with(&format!("{field}:")),
        "{query}: {message}"
    );
}

/// [`assert_bad_parameter`] for each of `queries`, naming the query's first parameter.
pub async fn assert_bad_parameters<S: TestApp>(app: &S, token: &str, path: &str, queries: &[&str]) {
    for query in queries {
        let field = query.split(['=', '&']).next().unwrap_or_default();
        assert_bad_parameter(app, token, path, query, field).await;
    }
}

/// The application under test, as the helpers take it (any `init_service` result).
pub trait TestApp:
    Service<Request, Response = ServiceResponse<Self::Body>, Error = actix_web::Error>
{
    /// Its response body.
    type Body: actix_web::body::MessageBody;
}

impl<S, B> TestApp for S
where
    S: Service<Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    type Body = B;
}

/// A caller of the API under test: the application and one bearer token, with one method
/// per request the tests send (each returns the status and the parsed JSON body, or Null).
pub struct Client<'a, S> {
    app: &'a S,
    token: &'a str,
}

/// The caller of `app` with `token`.
pub fn client<'a, S>(app: &'a S, token: &'a str) -> Client<'a, S> {
    Client { app, token }
}

impl<S, B> Client<'_, S>
where
    S: Service<Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    /// `GET path`.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        call(self.app, get(path, self.token)).await
    }

    /// `method path` with the JSON `body`.
    pub async fn send(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        call(self.app, env::json_req(method, path, self.token, body)).await
    }

    /// `GET /api/tasks/{id}`: one task's detail.
    pub async fn task(&self, id: impl std::fmt::Display) -> (u16, Value) {
        self.get(&format!("/api/tasks/{id}")).await
    }

    /// `POST /api/tasks`: a new task.
    pub async fn create_task(&self, body: &Value) -> (u16, Value) {
        self.send("POST", "/api/tasks", body).await
    }

    /// `POST /api/issues/assign`: a task for an issue.
    pub async fn assign(&self, body: &Value) -> (u16, Value) {
        self.send("POST", "/api/issues/assign", body).await
    }

    /// `GET /api/analytics/costs?{query}`: the cost report (its defaults when `query` is
    /// empty).
    pub async fn report(&self, query: &str) -> (u16, Value) {
        match query {
            "" => self.get("/api/analytics/costs").await,
            _ => self.get(&format!("/api/analytics/costs?{query}")).await,
        }
    }

    /// `PUT /api/secrets/{name}` with `value`.
    pub async fn put_secret(&self, name: &str, value: &str) -> (u16, Value) {
        let body = serde_json::json!({ "value": value });
        self.send("PUT", &format!("/api/secrets/{name}"), &body)
            .await
    }

    /// `POST /api/repos`: connects `url`.
    pub async fn connect_repo(&self, url: &str) -> (u16, Value) {
        let body = serde_json::json!({ "repoUrl": url });
        self.send("POST", "/api/repos", &body).await
    }
}

/// `GET path` without a token.
pub fn anonymous_get(path: &str) -> Request {
    test::TestRequest::get().uri(path).to_request()
}

pub fn get(path: &str, token: &str) -> Request {
    test::TestRequest::get()
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .to_request()
}

/// A task detail's events as (from, to) states, in order.
pub fn transitions(task: &Value) -> Vec<(Value, Value)> {
    elements_of(task, "events")
        .iter()
        .map(|e| (e["from"].clone(), e["to"].clone()))
        .collect()
}

pub fn task_count(db: &Db) -> i64 {
    agentry_persistence::meta::task_count(&mut db.conn().unwrap()).unwrap()
}

pub fn sqlite() -> TestDb {
    TestDb::sqlite()
}
