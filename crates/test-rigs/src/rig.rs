//! The service under test: `agentry_service::Service` over a fresh database, its code-host
//! integration pointed at the fake GitHub on 127.0.0.1 with test timings, and no runner.
//!
//! One rig for the two test binaries that drive the service: `agentry-service`'s (the use
//! cases called directly) and `agentry-api`'s (the same use cases behind HTTP).

use std::time::Duration;

use agentry_codehost::ClientConfig;
use agentry_domain::{AgentType, RepoUrl, Task, TaskState, TaskType};
use agentry_fake_github::FakeGitHub;
use agentry_persistence::Db;
use agentry_persistence::outbox::{self, EffectKind};
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::secrets::{self, MasterKey, SecretValue};
use agentry_persistence::tasks::{self, NewTask, TransitionDetails};
use agentry_persistence::test_support::TestDb;
use agentry_service::Service;
use agentry_service::codehost::{self, CodeHost, Timing};
use agentry_service::runs::Runs;
use time::OffsetDateTime;
use uuid::Uuid;

/// How long a test waits for something the service does in the background.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The code-host token the fake accepts (user `agentry-bot`).
pub const GH_TOKEN: &str = "ghp_0123456789abcdefFAKEtokenForTests";

/// The fake GitHub's route of an issue's comments.
pub const COMMENTS: &str = "/repos/{o}/{r}/issues/{n}/comments";

/// The fake GitHub's route of an issue's labels.
pub const ISSUE_LABELS: &str = "/repos/{o}/{r}/issues/{n}/labels";

/// Where no code host listens (port 9 refuses connections).
pub const NO_CODE_HOST: &str = "http://127.0.0.1:9";

/// Timings for tests: retry delays long enough that a test decides when time passes (see
/// `Service::deliver_due_effects`), and no full issue read within a test.
pub fn test_timing() -> Timing {
    Timing {
        full_sync_every: Duration::from_secs(3600),
        retry_base: Duration::from_secs(1),
        retry_max: Duration::from_secs(10),
        lease: Duration::from_secs(60),
        idle: Duration::from_millis(200),
    }
}

/// A code-host integration pointed at `api_url`, with fast client retries and `timing`.
pub fn code_host_with(api_url: &str, timing: Timing) -> CodeHost {
    CodeHost::new(
        ClientConfig {
            api_url: api_url.into(),
            request_timeout: Duration::from_secs(5),
            max_retries: 2,
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            max_rate_limit_wait: Duration::from_secs(5),
            ..ClientConfig::default()
        },
        timing,
    )
}

/// A code-host integration that reaches no code host.
pub fn no_code_host() -> CodeHost {
    code_host_with(NO_CODE_HOST, test_timing())
}

/// An orchestrator that starts no run (tests of runs build their own).
pub fn idle_runs() -> Runs {
    Runs::disabled(std::env::temp_dir().join("agentry-tests-idle-runner"))
}

/// The service over `db` with the code-host integration `codehost`, a fresh master key and
/// no runner.
pub fn service_from(db: &Db, codehost: CodeHost) -> Service {
    Service::new(
        db.clone(),
        MasterKey::generate().unwrap(),
        codehost,
        idle_runs(),
    )
}

/// The service over `db` whose code host is `api_url` and master key `key` (a "restarted
/// process" reuses the key of the first), with `timing` and no runner.
pub fn service_with_key(db: &Db, api_url: &str, key: MasterKey, timing: Timing) -> Service {
    Service::new(
        db.clone(),
        key,
        code_host_with(api_url, timing),
        idle_runs(),
    )
}

/// The service over `db` with no reachable code host and a fresh master key.
pub fn service_of(db: &Db) -> Service {
    service_from(db, no_code_host())
}

/// Connects `url` straight in the database (no code-host call, no first sync); returns the
/// repository's id.
pub fn connect_url(db: &Db, url: &str) -> Uuid {
    let new = NewRepository {
        url: RepoUrl::parse(url).unwrap(),
        default_branch: "main".into(),
        clone_url: format!("{url}.git"),
        codehost_id: None,
    };
    repos::connect_repository(&mut db.conn().unwrap(), &new, agentry_persistence::now())
        .unwrap()
        .0
        .id
}

/// A coding or review task of `repo` created at `at`, with the Claude Code agent.
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

/// The details of a transition that opens pull request `number` of `repo` (`owner/name`).
pub fn opening_pull(repo: &str, number: i64) -> TransitionDetails {
    TransitionDetails {
        pull_request: Some(agentry_domain::PullRequestRef {
            url: format!("https://github.com/{repo}/pull/{number}"),
            number,
        }),
        ..Default::default()
    }
}

/// Creates `new` straight in the database.
pub fn create(db: &Db, new: &NewTask) -> Task {
    tasks::create_task(&mut db.conn().unwrap(), new, "test").unwrap()
}

/// The fake GitHub with a token and the repository `acme/web`, a database, and the service
/// over both.
pub struct HostEnv {
    /// The code host.
    pub fake: FakeGitHub,
    /// The database (dropped last: the service's pool points into it).
    pub db: TestDb,
    /// The service, with a fresh master key.
    pub service: Service,
}

impl HostEnv {
    /// A fresh environment over `db`.
    pub fn new(db: TestDb) -> HostEnv {
        let fake = FakeGitHub::start();
        fake.add_token(GH_TOKEN, "agentry-bot");
        fake.add_repo("acme", "web", "main");
        let service = service_with_key(
            &db.db,
            &fake.base_url(),
            MasterKey::generate().unwrap(),
            test_timing(),
        );
        HostEnv { fake, db, service }
    }

    /// [`HostEnv::new`] with the token stored and `acme/web` connected
    /// ([`HostEnv::store_token_and_connect`]): the environment and the repository's id.
    pub fn connected(db: TestDb) -> (HostEnv, Uuid) {
        let env = HostEnv::new(db);
        let repo = env.store_token_and_connect();
        (env, repo)
    }

    /// The environment's database.
    pub fn db(&self) -> &Db {
        &self.db.db
    }

    /// Another process on the same database and master key, with the code-host timing
    /// `timing`.
    pub fn restarted_with(&self, timing: Timing) -> Service {
        let key = self.service.master_key().clone();
        service_with_key(self.db(), &self.fake.base_url(), key, timing)
    }

    /// Another process on the same database and master key.
    pub fn restarted(&self) -> Service {
        self.restarted_with(test_timing())
    }

    /// Stores the token straight in the database (no code-host call).
    pub fn store_token(&self) {
        secrets::put(
            &mut self.db().conn().unwrap(),
            self.service.master_key(),
            codehost::TOKEN_SECRET,
            &SecretValue::new(GH_TOKEN),
            agentry_persistence::now(),
        )
        .unwrap();
    }

    /// Stores the token and connects `acme/web`, both straight in the database; returns the
    /// repository's id.
    pub fn store_token_and_connect(&self) -> Uuid {
        self.store_token();
        self.connect("acme", "web")
    }

    /// Connects `owner/name` straight in the database (no code-host call, no first sync).
    pub fn connect(&self, owner: &str, name: &str) -> Uuid {
        connect_url(self.db(), &format!("https://github.com/{owner}/{name}"))
    }

    /// Delivers every pending effect as if `ahead` seconds had passed (retry delays and
    /// leases run out); returns how many were delivered.
    pub async fn deliver(&self, ahead: i64) -> usize {
        let at = agentry_persistence::now() + time::Duration::seconds(ahead);
        self.service.deliver_due_effects(at).await.unwrap()
    }

    /// The bodies of the comments on issue `number` of `acme/web`.
    pub fn comments_of(&self, number: u64) -> Vec<String> {
        self.fake
            .issue("acme", "web", number)
            .unwrap()
            .comments
            .into_iter()
            .map(|c| c.body)
            .collect()
    }

    /// The number of rows of `table`.
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

    /// Row counts of every table a code-host use case can write.
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

    /// The task of the one issue link.
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

    /// The stored repository `id`.
    pub fn repo(&self, id: Uuid) -> Repository {
        repos::get_repository(&mut self.db().conn().unwrap(), id).unwrap()
    }

    /// An assigned issue whose task ran and opened pull request `pr`.
    pub fn task_with_pull(&self, repo: &Repository, issue: u64, pr: u64) -> Task {
        self.task_with_pull_at(repo, issue, pr, agentry_persistence::now())
    }

    /// [`HostEnv::task_with_pull`] with every step at `at`.
    pub fn task_with_pull_at(
        &self,
        repo: &Repository,
        issue: u64,
        pr: u64,
        at: time::OffsetDateTime,
    ) -> Task {
        let mut conn = self.db().conn().unwrap();
        let (task, _) = codehost::assign(
            &mut conn,
            repo,
            i64::try_from(issue).unwrap(),
            "Fix it",
            "",
            AgentType::ClaudeCode,
            at,
        )
        .unwrap();
        agentry_persistence::test_support::open_pull_request(
            &mut conn,
            task.id,
            i64::try_from(pr).unwrap(),
            at,
        )
        .unwrap()
    }

    /// The stored task `id`.
    pub fn task(&self, id: Uuid) -> Task {
        tasks::get_task(&mut self.db().conn().unwrap(), id).unwrap()
    }

    /// How many close-issue effects task `id` has.
    pub fn close_effects(&self, id: Uuid) -> usize {
        outbox::effects_of_task(&mut self.db().conn().unwrap(), id)
            .unwrap()
            .iter()
            .filter(|e| e.kind() == EffectKind::CloseIssue)
            .count()
    }

    /// Task `id`'s events as (from, to, reason).
    pub fn events(&self, id: Uuid) -> Vec<(Option<TaskState>, TaskState, String)> {
        tasks::task_events(&mut self.db().conn().unwrap(), id)
            .unwrap()
            .into_iter()
            .map(|e| (e.from, e.to, e.reason))
            .collect()
    }
}
