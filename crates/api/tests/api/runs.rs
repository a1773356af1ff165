//! Agent runs end to end through the HTTP API (docs/contract.md#22-states-and-transitions, #38-tasks, #6-agent-runs): the fake GitHub on
//! 127.0.0.1, a local bare repository as the clone URL, the real `git`, and the fake
//! Claude Code executable (crates/runner/tests/fake-agents) printing what the real CLI
//! prints.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::env::{Env, bare, json_req};
use crate::common::{
    PATIENCE, PULLS, REVIEWS, TestApp, call, client, code_host_with, get, test_timing, transitions,
};
use actix_web::web;
use agentry_api::state::AppState;
use agentry_fake_github::Fault;
use agentry_persistence::test_support::TestDb;
use agentry_service::runs::{RunSettings, Runs};
use agentry_testkit::git::{git, source_repo};
use agentry_testkit::json::{elements_of, strings_of};
use agentry_testkit::process::processes_with_env;
use agentry_testkit::wait::eventually_async;
use serde_json::{Value, json};
use tempfile::TempDir;

pub(crate) const OWNER: &str = "acme";
pub(crate) const NAME: &str = "web";

pub(crate) fn fake_agent(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../runner/tests/fake-agents/{name}"))
}

pub(crate) struct Rig {
    pub(crate) env: Env,
    pub(crate) state: web::Data<AppState>,
    pub(crate) data: TempDir,
    pub(crate) source: PathBuf,
    pub(crate) repo_id: String,
}

impl Rig {
    pub(crate) fn new(db: TestDb) -> Rig {
        Rig::with_settings(db, |_| {})
    }

    fn with_settings(db: TestDb, tweak: impl FnOnce(&mut RunSettings)) -> Rig {
        Rig::build(db, tweak, |codehost| codehost)
    }

    /// A rig whose code-host integration `codehost` adjusts (revision settings, a webhook
    /// secret).
    pub(crate) fn build(
        db: TestDb,
        tweak: impl FnOnce(&mut RunSettings),
        codehost: impl FnOnce(
            agentry_service::codehost::CodeHost,
        ) -> agentry_service::codehost::CodeHost,
    ) -> Rig {
        let env = Env::new(db);
        env.store_token();
        let data = TempDir::new().unwrap();
        let source = source_repo(data.path());
        env.fake
            .set_clone_url(OWNER, NAME, source.to_str().unwrap());
        let mut settings = RunSettings {
            max_concurrent: 2,
            lease: Duration::from_secs(30),
            wall_time: Duration::from_secs(60),
            idle: Duration::from_millis(100),
            keep_run_dirs: true,
            sandbox: if sandboxed() {
                agentry_runner::SandboxMode::Auto
            } else {
                agentry_runner::SandboxMode::Off
            },
            agent_limits: agentry_runner::AgentLimits::default(),
            publish_backoff: Duration::from_millis(50),
            publish_patience: Duration::from_secs(30),
            ..RunSettings::default()
        };
        tweak(&mut settings);
        let state = common::state_of(agentry_service::Service::new(
            env.db().clone(),
            env.state.service.master_key().clone(),
            codehost(code_host_with(&env.fake.base_url(), test_timing())),
            Runs::local(
                data.path().join("agentry"),
                fake_agent("claude"),
                fake_agent("codex"),
                agentry_runner::PriceTable::builtin(),
                &[],
                settings,
                None,
            ),
        ));
        Rig {
            env,
            state,
            data,
            source,
            repo_id: String::new(),
        }
    }

    pub(crate) fn run_dir(&self, task: &str, attempt: i64) -> PathBuf {
        self.data
            .path()
            .join("agentry/runs")
            .join(task)
            .join(attempt.to_string())
    }
}

/// Polls the task until `done(task)` holds (at most 30 s).
pub(crate) async fn wait_for<S: TestApp>(
    app: &S,
    token: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    eventually_async(PATIENCE, what, async || {
        let (status, task) = client(app, token).task(id).await;
        assert_eq!(status, 200, "{task}");
        if done(&task) {
            Ok(task)
        } else {
            Err(format!("{task:#}"))
        }
    })
    .await
}

/// Polls the task until it is in `state` (at most 30 s).
pub(crate) async fn wait_for_state<S: TestApp>(
    app: &S,
    token: &str,
    id: &str,
    state: &str,
) -> Value {
    wait_for(app, token, id, state, |t| state_of(t) == state).await
}

pub(crate) fn state_of(task: &Value) -> &str {
    task["state"].as_str().unwrap()
}

fn error_of(task: &Value) -> &str {
    task["errorMessage"].as_str().unwrap()
}

/// The application over the rig's state with its repository connected (its id in
/// `rig.repo_id`) and the runner loop started; `app!(rig, settings)` then patches the
/// repository's settings with the JSON `settings`.
macro_rules! app {
    ($rig:expr, $settings:expr) => {{
        let app = app!($rig);
        crate::runs::patch_settings(&app, &$rig, $settings).await;
        app
    }};
    ($rig:expr) => {{
        let app = crate::common::service_with($rig.state.clone()).await;
        let (status, repo) = crate::common::client(&app, &$rig.env.t.admin)
            .connect_repo("https://github.com/acme/web")
            .await;
        assert_eq!(status, 201, "{repo}");
        $rig.repo_id = repo["id"].as_str().unwrap().to_owned();
        agentry_service::BackgroundLoop::runner().start(&$rig.state.service);
        app
    }};
}

/// Assign → queued → provisioning → running → pr_opened with the branch pushed, the pull
/// request on the fake and the exact cost everywhere; the review runs and posts; merging
/// completes the task and closes the issue.
async fn issue_to_merged_pull_request(db: TestDb) {
    let mut rig = Rig::new(db);
    let app = app!(rig);
    let issue = rig.env.fake.add_issue(
        OWNER,
        NAME,
        "Fix the parser",
        Some("The parser panics on \"empty\" input."),
        &[],
    );
    let (status, assigned) = client(&app, &rig.env.t.member)
        .assign(
            &json!({"issueNumber": issue, "repoId": rig.repo_id, "title": "Fix the parser",
                    "body": "The parser panics on \"empty\" input."}),
        )
        .await;
    assert_eq!(status, 201, "{assigned}");
    let id = assigned["task"]["id"].as_str().unwrap().to_owned();
    let t = rig.env.t.viewer.clone();
    let task = wait_for_state(&app, &t, &id, "pr_opened").await;

    // The state history.
    let path = transitions(&task);
    assert_eq!(
        path,
        [
            (Value::Null, json!("queued")),
            (json!("queued"), json!("provisioning")),
            (json!("provisioning"), json!("running")),
            (json!("running"), json!("pr_opened")),
        ]
    );
    // The exact cost and tokens, on the task and its run.
    assert_eq!(task["costUsd"], "0.123456", "{task:#}");
    assert_eq!(task["inputTokens"], 1200 + 5000 + 800);
    assert_eq!(task["outputTokens"], 340);
    let run = &task["runs"][0];
    assert_eq!(run["costUsd"], "0.123456", "{run:#}");
    assert_eq!(run["outcome"], "succeeded", "{run:#}");
    assert_eq!(task["runs"].as_array().unwrap().len(), 1);

    // The branch with the change in the bare repository.
    let branch = format!("agentry/task-{}", id.replace('-', ""));
    let changes = git(
        &["show", &format!("{branch}:AGENT_CHANGES.md")],
        &rig.source,
    );
    assert!(changes.contains("Fix the parser"), "{changes}");
    let author = git(&["log", "-1", "--format=%an <%ae>", &branch], &rig.source);
    assert_eq!(author.trim(), "agentry <agentry@localhost>");

    // The pull request on the fake.
    let pull = the_one_pull(&rig);
    assert_eq!(pull.head, branch);
    assert_eq!(pull.base, "main");
    assert_eq!(pull.title, "Fix the parser");
    let body = pull.body.clone().unwrap();
    assert!(body.contains(&format!("Closes #{issue}")), "{body}");
    assert!(body.contains(&id), "{body}");
    assert!(body.contains("0.123456"), "{body}");
    assert_eq!(task["prNumber"], pull.number);

    // The review subtask runs with the review model and posts on the pull request.
    let review_id = task["reviews"][0]["id"].as_str().unwrap().to_owned();
    let review = wait_for(&app, &t, &review_id, "review completed", |t| {
        state_of(t) == "completed"
    })
    .await;
    assert_eq!(review["taskType"], "review");
    assert_eq!(review["title"], "Review: Fix the parser");
    assert_eq!(review["parentTaskId"], id.as_str());
    assert_eq!(review["costUsd"], "0.123456");
    assert_eq!(review["modelUsed"], "haiku");
    let posted = rig.env.fake.reviews(OWNER, NAME, pull.number);
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(
        posted[0].starts_with("Done: Review pull request"),
        "{}",
        posted[0]
    );
    assert!(posted[0].contains(&format!("agentry:review:{review_id}")));

    // The log of the run.
    let (status, log) = {
        let res =
            actix_web::test::call_service(&app, get(&format!("/api/tasks/{id}/log"), &t)).await;
        let status = res.status().as_u16();
        let bytes = actix_web::test::read_body(res).await;
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    };
    assert_eq!(status, 200);
    assert!(log.contains("\"type\":\"result\""), "{log}");

    // The costs report: the exact cost of both tasks, coding and review.
    let (status, report) = client(&app, &t).report("days=30").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["summary"]["totalCost"], "0.2469");
    let top: Vec<(&str, &str)> = elements_of(&report, "topTasks")
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["costUsd"].as_str().unwrap()))
        .collect();
    assert!(top.contains(&(id.as_str(), "0.123456")), "{top:?}");
    let by_type = strings_of(&report, "costByType", "taskType");
    assert!(
        by_type.contains(&"coding") && by_type.contains(&"review"),
        "{by_type:?}"
    );

    // Merging on the fake completes the task; the issue is closed.
    rig.env.fake.merge_pull(OWNER, NAME, pull.number);
    rig.state.service.poll_pull_requests().await.unwrap();
    let done = wait_for_state(&app, &t, &id, "completed").await;
    assert_eq!(done["costUsd"], "0.123456");
    rig.state
        .service
        .deliver_due_effects(agentry_persistence::now())
        .await
        .unwrap();
    assert_eq!(
        rig.env.fake.issue(OWNER, NAME, issue).unwrap().state,
        "closed"
    );

    // The worktrees are gone; the mirror stays.
    let worktrees = rig.data.path().join("agentry/workspaces/worktrees");
    let left: Vec<_> = std::fs::read_dir(&worktrees)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    issue_to_merged_pull_request
);

/// An issue titled "fixes #7 and Closes acme/web#8": the commit message and the pull
/// request's title carry the title with its closing keywords broken, so merging closes no
/// other issue; the body still closes the task's own issue.
#[actix_web::test]
async fn a_title_with_closing_keywords_closes_only_the_tasks_own_issue() {
    use agentry_service::closing_refs::{BREAK, closing_references};
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig);
    let title = "fixes #7 and Closes acme/web#8";
    let issue = rig
        .env
        .fake
        .add_issue(OWNER, NAME, title, Some("body"), &[]);
    let (status, assigned) = client(&app, &rig.env.t.member)
        .assign(
            &json!({"issueNumber": issue, "repoId": rig.repo_id, "title": title, "body": "body"}),
        )
        .await;
    assert_eq!(status, 201, "{assigned}");
    let id = assigned["task"]["id"].as_str().unwrap().to_owned();
    let t = rig.env.t.viewer.clone();
    wait_for_state(&app, &t, &id, "pr_opened").await;

    let pull = the_one_pull(&rig);
    assert!(
        closing_references(&pull.title).is_empty(),
        "{:?}",
        pull.title
    );
    assert_eq!(pull.title.replace(BREAK, ""), title);
    let body = pull.body.clone().unwrap();
    assert_eq!(closing_references(&body), [format!("#{issue}")], "{body}");

    let branch = format!("agentry/task-{}", id.replace('-', ""));
    let message = git(&["log", "-1", "--format=%B", &branch], &rig.source);
    assert!(closing_references(&message).is_empty(), "{message:?}");
    assert!(message.replace(BREAK, "").starts_with(title), "{message:?}");
    assert!(message.contains(&format!("agentry task {id}")), "{message}");
}

/// The one pull request of the repository on the fake (asserting there is only one).
pub(crate) fn the_one_pull(rig: &Rig) -> agentry_fake_github::PullState {
    let mut pulls = rig.env.fake.pulls(OWNER, NAME);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    pulls.remove(0)
}

/// Creates a manual task with `prompt` through the API; returns its id.
async fn manual_task<S: TestApp>(app: &S, rig: &Rig, prompt: &str) -> String {
    let (status, task) = client(app, &rig.env.t.member)
        .create_task(&json!({"repoId": rig.repo_id, "title": "Manual task", "prompt": prompt}))
        .await;
    assert_eq!(status, 201, "{task}");
    assert_eq!(task["state"], "queued");
    assert_eq!(task["taskType"], "coding");
    task["id"].as_str().unwrap().to_owned()
}

/// [`manual_task`], then waits until the task is in `state`: its id and detail.
async fn manual_task_until<S: TestApp>(
    app: &S,
    rig: &Rig,
    prompt: &str,
    state: &str,
) -> (String, Value) {
    let id = manual_task(app, rig, prompt).await;
    let task = wait_for_state(app, &rig.env.t.member, &id, state).await;
    (id, task)
}

/// [`manual_task_until`] `pr_opened`: the task's detail and its pull request, the one on the
/// fake (asserting the task shows its number).
async fn manual_task_to_its_pull<S: TestApp>(
    app: &S,
    rig: &Rig,
    prompt: &str,
) -> (Value, agentry_fake_github::PullState) {
    let (_, task) = manual_task_until(app, rig, prompt, "pr_opened").await;
    let pull = the_one_pull(rig);
    assert_eq!(task["prNumber"], pull.number);
    (task, pull)
}

/// A failing agent: the task fails with the agent's message and the run's cost is still
/// recorded; a retry runs again and the costs add.
#[actix_web::test]
async fn failed_agent_keeps_its_cost_and_a_retry_adds() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig);
    let t = rig.env.t.member.clone();
    let (id, task) = manual_task_until(&app, &rig, "Break it [fake:fail]", "failed").await;
    assert!(error_of(&task).contains("the agent failed"), "{task:#}");
    assert_eq!(task["costUsd"], "0.123456");
    assert_eq!(task["runs"][0]["outcome"], "failed");
    assert_eq!(task["runs"][0]["exitCode"], 1);
    assert!(rig.env.fake.pulls(OWNER, NAME).is_empty());

    let (status, retried) = call(&app, bare("POST", &format!("/api/tasks/{id}/retry"), &t)).await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["state"], "queued");
    assert_eq!(retried["attempt"], 2);
    let task = wait_for(&app, &t, &id, "failed again", |t| {
        state_of(t) == "failed" && t["runs"].as_array().unwrap().len() == 2
    })
    .await;
    assert_eq!(task["costUsd"], "0.246912", "{task:#}");
    assert_eq!(task["runs"][1]["attempt"], 2);

    // A retry of a task that is not failed or cancelled is refused.
    let ok = manual_task(&app, &rig, "Fine").await;
    wait_for_state(&app, &t, &ok, "pr_opened").await;
    let (status, body) = call(&app, bare("POST", &format!("/api/tasks/{ok}/retry"), &t)).await;
    assert_eq!(status, 409, "{body}");
    common::envelope(&body, "invalid_transition");
}

/// An agent that changes nothing fails the task ("the agent made no changes"), with its
/// cost; no pull request is opened.
#[actix_web::test]
async fn no_changes_fails_without_a_pull_request() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig);
    let (_, task) = manual_task_until(&app, &rig, "Look only [fake:no-changes]", "failed").await;
    assert_eq!(task["errorMessage"], "the agent made no changes");
    assert_eq!(task["costUsd"], "0.123456");
    assert!(rig.env.fake.pulls(OWNER, NAME).is_empty());
    let branches = git(&["branch", "--list", "agentry/*"], &rig.source);
    assert!(branches.trim().is_empty(), "{branches}");
}

/// Cancelling a running task kills the agent's whole process group; the run is recorded as
/// cancelled.
#[actix_web::test]
async fn cancel_while_running_kills_the_process_group() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig);
    let t = rig.env.t.member.clone();
    let id = manual_task(&app, &rig, "Take long [fake:sleep=60]").await;
    wait_for_state(&app, &t, &id, "running").await;
    let home = rig.run_dir(&id, 1).join("home");
    eventually_async(Duration::from_secs(20), "the agent's child", async || {
        home.join("child.pid").exists()
    })
    .await;
    // The agent and its `sleep` child (pids in the files differ inside a sandbox, so they
    // are found by their HOME).
    let home_var = format!("HOME={}", home.display());
    let running = processes_with_env(&home_var);
    assert!(running.len() >= 2, "agent and child: {running:?}");

    let (status, cancelled) =
        call(&app, bare("POST", &format!("/api/tasks/{id}/cancel"), &t)).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["state"], "cancelled");
    let task = wait_for(&app, &t, &id, "the cancelled run recorded", |t| {
        t["runs"].as_array().unwrap().len() == 1
    })
    .await;
    assert_eq!(task["runs"][0]["outcome"], "cancelled");
    assert_eq!(task["state"], "cancelled");
    let left = processes_with_env(&home_var);
    assert!(
        left.is_empty(),
        "the agent or its child still runs: {left:?}"
    );
    // Cancelling again is refused.
    let (status, body) = call(&app, bare("POST", &format!("/api/tasks/{id}/cancel"), &t)).await;
    assert_eq!(status, 409, "{body}");
}

/// Changes the repository's settings through the API.
pub(crate) async fn patch_settings<S: TestApp>(app: &S, rig: &Rig, patch: Value) {
    let path = format!("/api/repos/{}/settings", rig.repo_id);
    let (status, body) = call(app, json_req("PATCH", &path, &rig.env.t.admin, &patch)).await;
    assert_eq!(status, 200, "{body}");
}

/// The lines of a file the fake agent wrote into its HOME.
fn home_lines(rig: &Rig, id: &str, attempt: i64, file: &str) -> Vec<String> {
    let path = rig.run_dir(id, attempt).join("home").join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every file below `dir`.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// The repository's settings reach the agent's command line; the budget of each attempt is
/// what the task has left of `maxCostPerTaskUsd`, and a task that spent it fails without a
/// run; the agent's environment holds nothing of the service's, and the code-host token is
/// in no file of the data directory.
#[actix_web::test]
async fn settings_reach_the_agent_and_secrets_do_not() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(
        rig,
        json!({"codingModel": "opus", "maxTurnsCoding": 7, "maxCostPerTaskUsd": "0.2"})
    );
    let t = rig.env.t.member.clone();
    let id = manual_task(&app, &rig, "Try [fake:fail]").await;
    wait_for_state(&app, &t, &id, "failed").await;
    let claude_args = |budget: &str| -> Vec<String> {
        [
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "opus",
            "--max-turns",
            "7",
            "--max-budget-usd",
            budget,
            "--permission-mode",
            // Inside the sandbox the agent may run commands; unsandboxed it may only edit.
            if sandboxed() {
                "bypassPermissions"
            } else {
                "acceptEdits"
            },
        ]
        .map(str::to_owned)
        .to_vec()
    };
    assert_eq!(home_lines(&rig, &id, 1, "args"), claude_args("0.2"));

    // The agent's environment: what the shell adds, PATH, HOME, (when the service has
    // them) the agent's own credentials, and what Claude Code needs to run headless.
    // Nothing else.
    let env = home_lines(&rig, &id, 1, "env");
    for line in &env {
        let name = line.split('=').next().unwrap();
        assert!(
            [
                "PATH",
                "HOME",
                "PWD",
                "OLDPWD",
                "SHLVL",
                "_",
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_AUTH_TOKEN",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "DISABLE_AUTOUPDATER",
                "DISABLE_ERROR_REPORTING",
                "IS_SANDBOX",
            ]
            .contains(&name),
            "unexpected variable in the agent's environment: {line}"
        );
    }
    assert!(env.contains(&"DISABLE_AUTOUPDATER=1".to_owned()));
    assert_eq!(env.contains(&"IS_SANDBOX=1".to_owned()), sandboxed());
    let home = rig.run_dir(&id, 1).join("home");
    assert!(env.contains(&format!("HOME={}", home.display())), "{env:?}");

    // Attempt 2 may spend what is left: 0.2 - 0.123456; the agent stops there (the fake,
    // like Claude Code, ends at its --max-budget-usd).
    call(&app, bare("POST", &format!("/api/tasks/{id}/retry"), &t)).await;
    let task = wait_for(&app, &t, &id, "attempt 2 failed", |t| {
        state_of(t) == "failed" && t["runs"].as_array().unwrap().len() == 2
    })
    .await;
    assert_eq!(home_lines(&rig, &id, 2, "args"), claude_args("0.076544"));
    assert_eq!(task["costUsd"], "0.2");

    // The task has spent more than its limit: attempt 3 fails before any agent starts.
    call(&app, bare("POST", &format!("/api/tasks/{id}/retry"), &t)).await;
    let task = wait_for(&app, &t, &id, "attempt 3 failed", |t| {
        state_of(t) == "failed" && t["attempt"] == 3
    })
    .await;
    assert!(
        error_of(&task).contains("spent its cost limit of 0.2 USD"),
        "{task:#}"
    );
    assert_eq!(task["runs"].as_array().unwrap().len(), 2, "{task:#}");
    assert_eq!(task["costUsd"], "0.2");
    assert!(!rig.run_dir(&id, 3).exists());

    // The token is in no file agentry or git wrote (mirror config, worktrees, run dirs).
    let files = files_below(rig.data.path());
    assert!(files.iter().any(|f| f.ends_with("config")), "{files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes
                .windows(common::env::GH_TOKEN.len())
                .any(|w| w == common::env::GH_TOKEN.as_bytes()),
            "the token is in {}",
            file.display()
        );
    }
}

/// A Codex task: the repository's agent type and model are used, the tokens are priced
/// exactly with the built-in table, and a model without a price gives a null cost (never
/// zero) while the pull request is still opened.
#[actix_web::test]
async fn codex_runs_are_priced_from_the_price_table() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(
        rig,
        json!({"agentType": "codex", "codingModel": "gpt-5-codex", "autoReview": false})
    );
    let (id, task) = manual_task_until(&app, &rig, "Add a test", "pr_opened").await;
    assert_eq!(task["agentType"], "codex");
    assert_eq!(
        home_lines(&rig, &id, 1, "args"),
        [
            "exec",
            "--json",
            "--model",
            "gpt-5-codex",
            if sandboxed() {
                "--dangerously-bypass-approvals-and-sandbox"
            } else {
                "--sandbox workspace-write"
            },
            "-"
        ]
        .join(" ")
        .split(' ')
        .collect::<Vec<_>>()
    );
    // 1500 uncached input × 1.25 + 500 cached × 0.125 + 300 output × 10, per million.
    assert_eq!(task["costUsd"], "0.0049375", "{task:#}");
    let run = &task["runs"][0];
    assert_eq!(run["model"], "gpt-5-codex");
    // The run keeps uncached input apart from cache reads; the task's total includes both.
    assert_eq!(run["inputTokens"], 1500);
    assert_eq!(run["cacheReadTokens"], 500);
    assert_eq!(task["inputTokens"], 2000);
    assert_eq!(run["outputTokens"], 300);
    assert_eq!(run["outcome"], "succeeded");

    patch_settings(&app, &rig, json!({"codingModel": "in-house-model"})).await;
    let (_, task) = manual_task_until(&app, &rig, "Add another test", "pr_opened").await;
    assert_eq!(task["costUsd"], Value::Null, "{task:#}");
    assert_eq!(task["runs"][0]["costUsd"], Value::Null);
    assert_eq!(task["inputTokens"], 2000);
    assert_eq!(rig.env.fake.pulls(OWNER, NAME).len(), 2);
}

/// An agent that runs past the wall-time limit is stopped with its children; the task fails
/// saying so, and the run is recorded as timed out.
#[actix_web::test]
async fn a_run_past_the_wall_time_is_stopped() {
    let mut rig = Rig::with_settings(TestDb::sqlite(), |s| s.wall_time = Duration::from_secs(1));
    let app = app!(rig);
    let (id, task) = manual_task_until(&app, &rig, "Take long [fake:sleep=60]", "failed").await;
    assert!(
        error_of(&task).contains("longer than the limit"),
        "{task:#}"
    );
    assert_eq!(task["runs"][0]["outcome"], "timed_out");
    let home = rig.run_dir(&id, 1).join("home");
    assert!(
        home.join("child.pid").exists(),
        "the agent started its child"
    );
    let left = processes_with_env(&format!("HOME={}", home.display()));
    assert!(left.is_empty(), "the agent's child still runs: {left:?}");
    assert!(rig.env.fake.pulls(OWNER, NAME).is_empty());
}

/// The largest number of the intervals `(start, end)` that overlap at one instant (an
/// interval ending when another starts does not overlap it).
/// Whether the agents of these tests run in the sandbox (where bubblewrap works).
fn sandboxed() -> bool {
    static SANDBOXED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SANDBOXED
        .get_or_init(|| agentry_testkit::sandbox::sandboxed(agentry_runner::sandbox::works_here()))
}

fn max_overlap(intervals: &[(u128, u128)]) -> usize {
    // Ends sort before starts at the same instant (false < true).
    let mut edges: Vec<(u128, bool)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, true), (end, false)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut most) = (0usize, 0usize);
    for (_, starts) in edges {
        if starts {
            now += 1;
            most = most.max(now);
        } else {
            now = now.saturating_sub(1);
        }
    }
    most
}

#[test]
fn max_overlap_counts_intervals_running_at_once() {
    assert_eq!(max_overlap(&[]), 0);
    assert_eq!(max_overlap(&[(1, 5), (5, 9), (9, 12)]), 1);
    assert_eq!(max_overlap(&[(1, 5), (2, 9), (6, 12), (10, 11)]), 2);
    assert_eq!(max_overlap(&[(1, 10), (2, 3), (4, 8), (5, 6)]), 3);
}

/// When the fake agent of a run started and ended (nanoseconds since the epoch), from the
/// `times` file it keeps in its HOME.
fn agent_interval(rig: &Rig, id: &str) -> (u128, u128) {
    let lines = home_lines(rig, id, 1, "times");
    let at = |what: &str| {
        let found: Vec<u128> = lines
            .iter()
            .filter_map(|l| l.strip_prefix(what)?.trim().parse().ok())
            .collect();
        assert_eq!(found.len(), 1, "one {what} of the agent of {id}: {lines:?}");
        found[0]
    };
    let interval = (at("start "), at("end "));
    assert!(interval.0 < interval.1, "{id}: {lines:?}");
    interval
}

/// The limit counts agent processes running at once: each fake agent records when it
/// started and ended, and at no instant do more than `max_concurrent` (2) of those intervals
/// overlap, while at some instant 2 do. The others wait in `queued`: the two oldest are
/// claimed first, and all of them finish. The task states agree at every snapshot.
#[actix_web::test]
async fn runs_are_limited_to_the_concurrency_setting() {
    let mut rig = Rig::new(TestDb::sqlite());
    let max_concurrent = rig.state.service.run_settings().max_concurrent;
    assert_eq!(max_concurrent, 2);
    let app = app!(rig, json!({"autoReview": false}));
    let t = rig.env.t.member.clone();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(manual_task(&app, &rig, "Take a while [fake:sleep=3]").await);
    }
    // One list request reads every state in one query: a consistent snapshot (reading the
    // tasks one by one could see a finished task and its successor both working).
    let states = || async {
        let (_, list) = call(&app, get("/api/tasks?limit=10", &t)).await;
        let listed = list["tasks"].as_array().unwrap();
        ids.iter()
            .map(|id| {
                let task = listed
                    .iter()
                    .find(|task| task["id"] == id.as_str())
                    .unwrap();
                state_of(task).to_owned()
            })
            .collect::<Vec<_>>()
    };
    let working = |states: &[String]| {
        states
            .iter()
            .filter(|s| *s == "provisioning" || *s == "running")
            .count()
    };
    eventually_async(
        Duration::from_secs(60),
        "all four pull requests",
        async || {
            let now = states().await;
            assert!(working(&now) <= max_concurrent, "{now:?}");
            if now.iter().all(|s| s == "pr_opened") {
                return Ok(());
            }
            // Why a task failed, for the message when the wait times out.
            let (_, list) = call(&app, get("/api/tasks?limit=10", &t)).await;
            let errors: Vec<&Value> = list["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|task| &task["errorMessage"])
                .filter(|e| !e.is_null())
                .collect();
            Err(format!("{now:?} {errors:?}"))
        },
    )
    .await;
    assert_eq!(rig.env.fake.pulls(OWNER, NAME).len(), 4);

    let intervals: Vec<(u128, u128)> = ids.iter().map(|id| agent_interval(&rig, id)).collect();
    assert_eq!(
        max_overlap(&intervals),
        max_concurrent,
        "agents running at once: {intervals:?}"
    );
    // Oldest first: both older tasks were claimed before either newer one.
    let mut claimed = Vec::new();
    for id in &ids {
        let (_, task) = client(&app, &t).task(id).await;
        let at = elements_of(&task, "events")
            .iter()
            .find(|e| e["from"] == "queued" && e["to"] == "provisioning")
            .and_then(|e| e["at"].as_str())
            .unwrap_or_else(|| panic!("no claim of {id}: {task:#}"))
            .to_owned();
        claimed.push(
            time::OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339)
                .unwrap(),
        );
    }
    assert!(
        claimed[0].max(claimed[1]) <= claimed[2].min(claimed[3]),
        "claimed out of order: {claimed:?}"
    );
}

/// Code-host failures whose outcome is unknown delay publishing, never end it: a 500 on
/// the pull request's creation (nothing created) is sent again once the branch is seen to
/// have none; a review post that fails with a 502 is posted again, and one whose answer was
/// lost is found by its marker and not posted twice. Each task ends as if nothing failed,
/// with one pull request and one review.
#[actix_web::test]
async fn uncertain_publishing_failures_are_retried_not_fatal() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig, json!({"autoReview": true}));
    let t = rig.env.t.member.clone();
    let fake = &rig.env.fake;

    fake.fail_next(Some(("POST", PULLS)), 1, Fault::Status(500));
    fake.fail_next(Some(("POST", REVIEWS)), 1, Fault::Status(502));
    fake.fail_next(Some(("POST", REVIEWS)), 1, Fault::AnswerLost(502));
    let (task, pull) = manual_task_to_its_pull(&app, &rig, "Flaky code host").await;
    assert_eq!(
        fake.count("POST", PULLS),
        2,
        "one failed creation, one sent again"
    );
    assert_eq!(task["costUsd"], "0.123456");

    let review_id = task["reviews"][0]["id"].as_str().unwrap().to_owned();
    let review = wait_for(&app, &t, &review_id, "review completed", |t| {
        state_of(t) == "completed"
    })
    .await;
    assert_eq!(review["costUsd"], "0.123456", "{review:#}");
    let posted = fake.reviews(OWNER, NAME, pull.number);
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(posted[0].contains(&format!("agentry:review:{review_id}")));
    assert_eq!(
        fake.count("POST", REVIEWS),
        2,
        "a 502 sent again; a lost answer found by its marker"
    );
}

/// Publishing when the code host misbehaves: a pull request created but whose answer was
/// lost is found, never opened twice; a refused pull request fails the task with the code
/// host's message (the run's cost recorded) and a retry opens it; a refused push fails the
/// task with git's message and opens nothing.
#[actix_web::test]
async fn publishing_survives_lost_answers_and_reports_refusals() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig, json!({"autoReview": false}));
    let t = rig.env.t.member.clone();
    let fake = &rig.env.fake;

    fake.fail_next(Some(("POST", PULLS)), 1, Fault::AnswerLost(502));
    manual_task_to_its_pull(&app, &rig, "Answer lost").await;
    assert_eq!(fake.count("POST", PULLS), 1, "the creation was sent again");

    fake.fail_next(Some(("POST", PULLS)), 1, Fault::Status(422));
    let (id, task) = manual_task_until(&app, &rig, "Refused", "failed").await;
    assert!(
        error_of(&task).starts_with("the pull request could not be opened"),
        "{task:#}"
    );
    assert_eq!(task["costUsd"], "0.123456");
    assert_eq!(fake.pulls(OWNER, NAME).len(), 1);
    call(&app, bare("POST", &format!("/api/tasks/{id}/retry"), &t)).await;
    let task = wait_for_state(&app, &t, &id, "pr_opened").await;
    assert_eq!(task["costUsd"], "0.246912");
    assert_eq!(fake.pulls(OWNER, NAME).len(), 2);

    let hook = rig.source.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'push declined: protected branches only' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (_, task) = manual_task_until(&app, &rig, "Push refused", "failed").await;
    assert!(
        error_of(&task).contains("push declined: protected branches only"),
        "{task:#}"
    );
    assert_eq!(task["costUsd"], "0.123456");
    assert_eq!(fake.pulls(OWNER, NAME).len(), 2);
}

/// Agents that stop short: unreadable output fails the task saying so, with a null cost
/// (never a fake zero); a turn limit fails it naming the limit, with the cost reported; the
/// stored log is the agent's output.
#[actix_web::test]
async fn unreadable_output_and_limits_fail_the_task_clearly() {
    let mut rig = Rig::new(TestDb::sqlite());
    let app = app!(rig);
    let t = rig.env.t.member.clone();
    let (id, task) = manual_task_until(&app, &rig, "Mumble [fake:garbage]", "failed").await;
    assert!(
        error_of(&task).starts_with("the agent's output could not be read"),
        "{task:#}"
    );
    assert_eq!(task["costUsd"], Value::Null);
    assert_eq!(task["runs"][0]["costUsd"], Value::Null);
    assert_eq!(task["runs"][0]["outcome"], "failed");
    let (status, log) = common::call_text(&app, get(&format!("/api/tasks/{id}/log"), &t)).await;
    assert_eq!(status, 200);
    assert!(!log.is_empty());
    assert!(!log.contains("\"type\":\"result\""));

    let (_, task) = manual_task_until(&app, &rig, "Too long [fake:max-turns]", "failed").await;
    assert_eq!(
        task["errorMessage"],
        "the agent reached its turn limit (maxTurns)"
    );
    assert_eq!(task["costUsd"], "0.123456");
    assert!(rig.env.fake.pulls(OWNER, NAME).is_empty());
}

/// Bad input to the new endpoints: §3.2 errors, nothing created.
#[actix_web::test]
async fn bad_task_requests_are_refused() {
    let mut rig = Rig::with_settings(TestDb::sqlite(), |s| s.max_concurrent = 0);
    let app = app!(rig);
    let m = rig.env.t.member.clone();
    let before = rig.env.count("tasks");
    for (body, code) in [
        (
            json!({"repoId": rig.repo_id, "title": "  "}),
            "invalid_parameter",
        ),
        (json!({"repoId": rig.repo_id}), "invalid_request"),
        (json!({"repoId": "nope", "title": "x"}), "invalid_parameter"),
        (
            json!({"repoId": uuid::Uuid::new_v4(), "title": "x"}),
            "not_found",
        ),
        (
            json!({"repoId": rig.repo_id, "title": "x", "agentType": "gpt"}),
            "invalid_parameter",
        ),
        (
            json!({"repoId": rig.repo_id, "title": "x".repeat(501)}),
            "invalid_parameter",
        ),
    ] {
        let (status, reply) = client(&app, &m).create_task(&body).await;
        assert!(status == 400 || status == 404, "{body} → {status} {reply}");
        common::envelope(&reply, code);
    }
    let (status, reply) = client(&app, &rig.env.t.viewer)
        .create_task(&json!({"repoId": rig.repo_id, "title": "x"}))
        .await;
    assert_eq!(status, 403, "{reply}");
    assert_eq!(rig.env.count("tasks"), before);
    let unknown = uuid::Uuid::new_v4();
    for path in [
        format!("/api/tasks/{unknown}/cancel"),
        format!("/api/tasks/{unknown}/retry"),
    ] {
        let (status, reply) = call(&app, bare("POST", &path, &m)).await;
        assert_eq!(status, 404, "{path} {reply}");
    }
    let (status, _) = call(&app, get(&format!("/api/tasks/{unknown}/log"), &m)).await;
    assert_eq!(status, 404);
    let (status, _) = call(&app, bare("POST", "/api/tasks/not-a-uuid/cancel", &m)).await;
    assert_eq!(status, 400);
    // A queued task has no log yet.
    let id = manual_task(&app, &rig, "later").await;
    let (status, reply) = call(&app, get(&format!("/api/tasks/{id}/log"), &m)).await;
    assert_eq!(status, 404, "{reply}");
    // Cancelling a queued task works without any runner.
    let (status, reply) = call(&app, bare("POST", &format!("/api/tasks/{id}/cancel"), &m)).await;
    assert_eq!(status, 200, "{reply}");
}

/// A $1 monthly budget and four tasks whose runs would each cost $0.40, through a fake
/// Claude Code that stops at `--max-budget-usd` like the real one: the first two runs
/// finish, the third is given the $0.20 left, stops there and fails with its $0.20 recorded,
/// the fourth stays queued and blocked; raising the budget to $2 starts it.
async fn a_monthly_budget_stops_spending_at_its_line(db: TestDb) {
    let mut rig = Rig::new(db);
    let app = app!(rig, json!({"autoReview": false, "monthlyBudgetUsd": "1"}));
    let t = rig.env.t.member.clone();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(manual_task(&app, &rig, &format!("Task {i} [fake:cost=0.40]")).await);
    }
    for id in &ids[..2] {
        let task = wait_for_state(&app, &t, id, "pr_opened").await;
        assert_eq!(task["costUsd"], "0.4", "{task:#}");
    }
    let third = wait_for_state(&app, &t, &ids[2], "failed").await;
    assert!(error_of(&third).starts_with("budget reached"), "{third:#}");
    assert_eq!(third["costUsd"], "0.2", "{third:#}");
    // The agent was given exactly what the budget had left.
    let args = home_lines(&rig, &ids[2], 1, "args");
    let budget = args.iter().position(|a| a == "--max-budget-usd").unwrap();
    assert_eq!(args[budget + 1], "0.2", "{args:?}");
    let fourth = wait_for(&app, &t, &ids[3], "blocked", |t| {
        t["blockedReason"] == "budget_exhausted"
    })
    .await;
    assert_eq!(state_of(&fourth), "queued");
    assert_eq!(fourth["blockedBy"], "repository");
    assert!(rig.env.fake.pulls(OWNER, NAME).len() == 2);
    // The report's budgets member: the month is spent, so it ran out today.
    let (status, report) = client(&app, &t).report("days=7").await;
    assert_eq!(status, 200, "{report}");
    let today = time::OffsetDateTime::now_utc().date();
    assert_eq!(
        report["budgets"],
        json!([{
            "scope": "repository",
            "repoUrl": "https://github.com/acme/web",
            "monthlyBudgetUsd": "1.0000",
            "monthToDateUsd": "1.0000",
            "forecastUsd": agentry_domain::format_decimal(
                rust_decimal::Decimal::from(today.month().length(today.year()))
                    / rust_decimal::Decimal::from(today.day()),
                4
            ),
            "exhaustsOn": format!("{:04}-{:02}-{:02}", today.year(), u8::from(today.month()), today.day()),
        }]),
        "{report:#}"
    );
    // The repository shows the same forecast.
    let (status, repo) = call(&app, get(&format!("/api/repos/{}", rig.repo_id), &t)).await;
    assert_eq!(status, 200, "{repo}");
    assert_eq!(repo["budget"], report["budgets"][0], "{repo:#}");

    patch_settings(&app, &rig, json!({"monthlyBudgetUsd": "2"})).await;
    let fourth = wait_for_state(&app, &t, &ids[3], "pr_opened").await;
    assert_eq!(fourth["blockedReason"], Value::Null);
    assert_eq!(fourth["costUsd"], "0.4");
    let args = home_lines(&rig, &ids[3], 1, "args");
    let budget = args.iter().position(|a| a == "--max-budget-usd").unwrap();
    assert_eq!(args[budget + 1], "1", "{args:?}");
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    a_monthly_budget_stops_spending_at_its_line
);

/// A Codex repository with a $0.02 monthly budget: Codex has no budget option, so agentry
/// prices each model call Codex records in its session file and stops the run after the
/// call that reaches the allowance. The fake makes three calls a second apart (call k costs
/// k × $0.0049375) and then waits long before it would print its usage (as Codex, only at
/// the end), so only that stop ends it: stopped after the third call, the task fails with
/// "budget reached", no pull request is opened, and the run's cost is exactly the priced
/// calls before the stop. The overshoot is measured: $0.029625 − $0.02, less than the cost
/// of the last call ($0.0148125).
async fn a_codex_run_is_stopped_at_its_allowance(db: TestDb) {
    let mut rig = Rig::new(db);
    let app = app!(
        rig,
        json!({
            "agentType": "codex",
            "codingModel": "gpt-5-codex",
            "autoReview": false,
            "monthlyBudgetUsd": "0.02",
        })
    );
    let t = rig.env.t.member.clone();
    let started = Instant::now();
    let id = manual_task(
        &app,
        &rig,
        "Costly work [fake:turns=3] [fake:pause=1] [fake:hold=300]",
    )
    .await;
    let task = wait_for_state(&app, &t, &id, "failed").await;
    // Long before the fake's hold would have ended, and before the run's wall time.
    assert!(started.elapsed() < Duration::from_secs(60));
    let message = error_of(&task);
    assert!(message.starts_with("budget reached"), "{task:#}");
    assert!(
        message.contains("reached 0.029625 USD") && message.contains("limit was 0.02 USD"),
        "{message}"
    );
    assert_eq!(task["costUsd"], "0.029625", "{task:#}");
    let runs = task["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{task:#}");
    assert_eq!(runs[0]["outcome"], "failed");
    assert_eq!(runs[0]["costUsd"], "0.029625");
    // Stopped before Codex printed its one `turn.completed`: the three calls it recorded
    // are the turns, the tokens and the cost.
    assert_eq!(runs[0]["turns"], 3);
    // Six one-call units of tokens: 1 + 2 + 3.
    assert_eq!(runs[0]["outputTokens"], 1800);
    assert!(rig.env.fake.pulls(OWNER, NAME).is_empty());
    // The overshoot beyond the allowance, and the last usage event's cost that bounds it.
    let nanos = |usd: &str| agentry_domain::money::Usd::parse(usd).unwrap().to_nanos();
    let recorded = nanos(task["costUsd"].as_str().unwrap());
    let overshoot = recorded - nanos("0.02");
    assert_eq!(overshoot, nanos("0.009625"));
    // The cumulative cost after the second call was under the allowance.
    let last_event = recorded - nanos("0.0148125");
    assert!(
        0 < overshoot && overshoot < last_event,
        "{overshoot} {last_event}"
    );
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    a_codex_run_is_stopped_at_its_allowance
);
