//! A test environment for the code-host capability: the fake GitHub on 127.0.0.1 with a
//! token and the repository `acme/web`, a database, one API token per role, and application
//! state pointed at the fake.
#![allow(dead_code)]

use std::ops::Deref;

use actix_http::Request;
use actix_web::test::TestRequest;
use actix_web::web;
use agentry_api::state::AppState;
use agentry_persistence::test_support::TestDb;
use serde_json::Value;

use super::rig::HostEnv;
use super::{Tokens, state_of, tokens};

pub use super::rig::GH_TOKEN;

/// The service's code-host environment ([`HostEnv`], which this derefs to), with one API
/// token per role and the application state over its service.
pub struct Env {
    pub host: HostEnv,
    pub t: Tokens,
    pub state: web::Data<AppState>,
}

impl Env {
    pub fn new(db: TestDb) -> Env {
        let host = HostEnv::new(db);
        let t = tokens(host.db());
        let state = state_of(host.service.clone());
        Env { host, t, state }
    }

    /// [`Env::new`] with the token stored and `acme/web` connected: the environment and the
    /// repository's id.
    pub fn connected(db: TestDb) -> (Env, uuid::Uuid) {
        let env = Env::new(db);
        let repo = env.store_token_and_connect();
        (env, repo)
    }
}

impl Deref for Env {
    type Target = HostEnv;

    fn deref(&self) -> &HostEnv {
        &self.host
    }
}

/// A request with a JSON body and a bearer token.
pub fn json_req(method: &str, path: &str, token: &str, body: &Value) -> Request {
    TestRequest::default()
        .method(method.parse().unwrap())
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .set_json(body)
        .to_request()
}

/// A request with the raw `payload` of `content_type` and a bearer token.
pub fn raw_req(
    method: &str,
    path: &str,
    token: &str,
    content_type: &str,
    payload: impl Into<actix_web::web::Bytes>,
) -> Request {
    TestRequest::default()
        .method(method.parse().unwrap())
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .insert_header(("Content-Type", content_type))
        .set_payload(payload)
        .to_request()
}

/// A request without a body.
pub fn bare(method: &str, path: &str, token: &str) -> Request {
    TestRequest::default()
        .method(method.parse().unwrap())
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .to_request()
}
