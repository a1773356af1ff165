//! A test instance of the API: the real application over a fresh database, with one token
//! of each role.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use actix_http::Request;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::test;
use actix_web::web;
use agentry_api::auth::{generate_token, hash_token};
use agentry_api::metrics::Metrics;
use agentry_api::state::AppState;
use agentry_domain::{AgentType, RepoUrl, Role, TaskType};
use agentry_persistence::Db;
use agentry_persistence::tasks::{self, NewTask};
use agentry_persistence::test_support::TestDb;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

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

pub fn state(db: &Db) -> web::Data<AppState> {
    web::Data::new(AppState {
        db: db.clone(),
        metrics: Metrics::new().unwrap(),
        openapi_json: serde_json::to_string(&agentry_api::app::openapi()).unwrap(),
    })
}

pub async fn service(
    db: &Db,
) -> impl Service<
    Request,
    Response = ServiceResponse<impl actix_web::body::MessageBody>,
    Error = actix_web::Error,
> {
    test::init_service(agentry_api::app::build_app(
        state(db),
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

/// Asserts the SPEC §3.2 envelope with `code`, returning the message.
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

pub fn get(path: &str, token: &str) -> Request {
    test::TestRequest::get()
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .to_request()
}

pub fn task_count(db: &Db) -> i64 {
    agentry_persistence::meta::task_count(&mut db.conn().unwrap()).unwrap()
}

pub fn new_task(repo: &str, task_type: TaskType, created_at: OffsetDateTime) -> NewTask {
    NewTask {
        id: Uuid::new_v4(),
        title: "A task".into(),
        prompt: "Do it".into(),
        repo_id: None,
        repo_url: RepoUrl::parse(repo).unwrap(),
        task_type,
        agent_type: AgentType::ClaudeCode,
        issue_number: None,
        parent_task_id: None,
        created_at,
    }
}

pub fn create(db: &Db, new: &NewTask) -> agentry_domain::Task {
    tasks::create_task(&mut db.conn().unwrap(), new, "test").unwrap()
}

pub fn sqlite() -> TestDb {
    TestDb::sqlite()
}
