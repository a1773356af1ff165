//! A test environment for the code-host capability: the fake GitHub on 127.0.0.1 with a
//! token and the repository `acme/web`, a database, one API token per role, and application
//! state pointed at the fake.
#![allow(dead_code)]

use actix_http::Request;
use actix_web::test::TestRequest;
use actix_web::web;
use agentry_api::state::AppState;
use agentry_fake_github::FakeGitHub;
use agentry_persistence::repos::{self, NewRepository};
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{Db, secrets};
use agentry_service::codehost;
use serde_json::Value;
use uuid::Uuid;

use super::{Tokens, state_with, tokens};

/// The code-host token the fake accepts (user `agentry-bot`).
pub const GH_TOKEN: &str = "ghp_0123456789abcdefFAKEtokenForTests";

pub struct Env {
    pub fake: FakeGitHub,
    pub db: TestDb,
    pub t: Tokens,
    pub state: web::Data<AppState>,
}

impl Env {
    pub fn new(db: TestDb) -> Env {
        let fake = FakeGitHub::start();
        fake.add_token(GH_TOKEN, "agentry-bot");
        fake.add_repo("acme", "web", "main");
        let t = tokens(&db.db);
        let state = state_with(&db.db, &fake.base_url());
        Env { fake, db, t, state }
    }

    pub fn db(&self) -> &Db {
        &self.db.db
    }

    /// Stores the token straight in the database (no code-host call).
    pub fn store_token(&self) {
        secrets::put(
            &mut self.db().conn().unwrap(),
            self.state.service.master_key(),
            codehost::TOKEN_SECRET,
            &secrets::SecretValue::new(GH_TOKEN),
            agentry_persistence::now(),
        )
        .unwrap();
    }

    /// Connects `owner/name` straight in the database (no code-host call, no first sync).
    pub fn connect(&self, owner: &str, name: &str) -> Uuid {
        let new = NewRepository {
            url: agentry_domain::RepoUrl::parse(&format!("https://github.com/{owner}/{name}"))
                .unwrap(),
            default_branch: "main".into(),
            clone_url: format!("https://github.com/{owner}/{name}.git"),
            codehost_id: None,
        };
        repos::connect_repository(
            &mut self.db().conn().unwrap(),
            &new,
            agentry_persistence::now(),
        )
        .unwrap()
        .0
        .id
    }

    /// Delivers every pending effect as if `ahead` seconds had passed (retry delays and
    /// leases run out); returns how many were delivered.
    pub async fn deliver(&self, ahead: i64) -> usize {
        let at = agentry_persistence::now() + time::Duration::seconds(ahead);
        self.state.service.deliver_due_effects(at).await.unwrap()
    }

    pub fn count(&self, table: &str) -> i64 {
        use diesel::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {table}"))
            .get_result::<N>(&mut *self.db().conn().unwrap())
            .unwrap()
            .n
    }

    /// Row counts of every table a code-host endpoint can write.
    pub fn written(&self) -> [i64; 6] {
        [
            self.count("secrets"),
            self.count("repositories"),
            self.count("tasks"),
            self.count("outbox"),
            self.count("synced_issues"),
            self.count("issue_links"),
        ]
    }
}

impl Env {
    pub fn fake_task_id(&self) -> String {
        use diesel::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::Text)]
            task_id: String,
        }
        diesel::sql_query("SELECT task_id FROM issue_links")
            .get_result::<Id>(&mut *self.db().conn().unwrap())
            .unwrap()
            .task_id
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

/// A request without a body.
pub fn bare(method: &str, path: &str, token: &str) -> Request {
    TestRequest::default()
        .method(method.parse().unwrap())
        .uri(path)
        .insert_header(("Authorization", format!("Bearer {token}")))
        .to_request()
}
