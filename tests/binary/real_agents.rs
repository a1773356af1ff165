//! The real agent CLIs end to end: `agentry serve` runs Claude Code and Codex as installed
//! from npm (`AGENTRY_TEST_CLAUDE_BIN`, `AGENTRY_TEST_CODEX_BIN`; `.ci/run` installs the
//! pinned versions), sandboxed as in production, against the fake model API
//! (`agentry-fake-models`) and the fake GitHub, both on loopback. An issue goes in, a pull
//! request with the agent's change comes out, the review agent reads the diff, and every
//! dollar is recorded: Claude's as it printed it, Codex's as the fake's usage priced from the
//! table, also when a run is cancelled, timed out, stopped at its budget or refused by the
//! model API.
//!
//! A test whose CLI is not given says so and passes, unless
//! `AGENTRY_TEST_REQUIRE_REAL_AGENTS=1` (CI), which makes that a failure. The data directory
//! lives outside `/tmp` ([`agentry_testkit::dirs::outside_tmp`]: under `CARGO_TARGET_TMPDIR`
//! unless the build itself lies in `/tmp`): Codex refuses to create its helper binaries
//! with a `HOME` under a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use agentry_domain::AgentType;
use agentry_fake_github::FakeGitHub;
use agentry_fake_models::{CallKind, FakeModels, Provider, Transport};
use agentry_runner::{PriceTable, Tokens};
use agentry_testkit::git::{git, source_repo};
use agentry_testkit::json::{elements_of, strings_of};
use agentry_testkit::wait::eventually;
use rust_decimal::{Decimal, RoundingStrategy};
use serde_json::{Value, json};

use super::{BIN, Server, error_of, get, sandbox_env};

/// The test `$claude` runs the scenario `$scenario` with Claude Code, `$codex` with Codex.
macro_rules! for_each_agent {
    ($scenario:ident => $claude:ident, $codex:ident) => {
        #[test]
        fn $claude() {
            $scenario(AgentType::ClaudeCode);
        }

        #[test]
        fn $codex() {
            $scenario(AgentType::Codex);
        }
    };
}

const GH: &str = "ghp_RealAgentsTestToken0123456789abcdef";
const OWNER: &str = "acme";
const NAME: &str = "web";

/// The real CLI of `agent`, from its test variable; `None` (with a note) when it is not set,
/// unless `AGENTRY_TEST_REQUIRE_REAL_AGENTS=1`.
fn real_cli(agent: AgentType) -> Option<PathBuf> {
    let var = match agent {
        AgentType::ClaudeCode => "AGENTRY_TEST_CLAUDE_BIN",
        AgentType::Codex => "AGENTRY_TEST_CODEX_BIN",
    };
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            assert!(
                std::env::var("AGENTRY_TEST_REQUIRE_REAL_AGENTS").as_deref() != Ok("1"),
                "AGENTRY_TEST_REQUIRE_REAL_AGENTS=1 but {var} is not set"
            );
            eprintln!("note: {var} is not set; this real-agent test does nothing");
            None
        }
    }
}

/// A served agentry with a connected repository, the fakes it talks to, and one real CLI.
struct Rig {
    models: FakeModels,
    github: FakeGitHub,
    server: Server,
    admin: String,
    repo_id: String,
    source: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// `agentry serve` with the CLI of `agent` (and `extra` variables), the repository
    /// `acme/web` connected with its agent set to `agent`.
    fn start(agent: AgentType, cli: &Path, extra: &[(&str, &str)]) -> Rig {
        let models = FakeModels::start();
        let github = FakeGitHub::start();
        github.add_token(GH, "agentry-bot");
        github.add_repo(OWNER, NAME, "main");
        // Outside the temporary directory wherever the build lies (see the module docs).
        let dir = agentry_testkit::dirs::outside_tmp(
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            "real-agents-",
        )
        .expect("a directory outside /tmp where this user may write, for Codex's HOME");
        let source = source_repo(dir.path());
        github.set_clone_url(OWNER, NAME, source.to_str().unwrap());
        let (bin_var, other_var) = match agent {
            AgentType::ClaudeCode => ("AGENTRY_CLAUDE_BIN", "AGENTRY_CODEX_BIN"),
            AgentType::Codex => ("AGENTRY_CODEX_BIN", "AGENTRY_CLAUDE_BIN"),
        };
        let api = github.base_url();
        let anthropic = models.base_url();
        let openai = models.openai_base_url();
        let key = models.key();
        let mut env: Vec<(&str, &str)> = vec![
            ("AGENTRY_CODEHOST_API_URL", &api),
            (bin_var, cli.to_str().unwrap()),
            (other_var, "/nonexistent/agent"),
            ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "3600"),
            // The keys as an operator sets them; Codex gets its own as CODEX_API_KEY.
            ("ANTHROPIC_API_KEY", &key),
            ("OPENAI_API_KEY", &key),
            // Sandboxed, the agents reach the fake only through agentry's model gateway,
            // whose upstreams these are; unsandboxed, they are given the fake directly.
            ("AGENTRY_ANTHROPIC_UPSTREAM", &anthropic),
            ("AGENTRY_OPENAI_UPSTREAM", &openai),
            ("ANTHROPIC_BASE_URL", &anthropic),
            ("OPENAI_BASE_URL", &openai),
            ("AGENTRY_AGENT_ENV", "ANTHROPIC_BASE_URL OPENAI_BASE_URL"),
        ];
        env.extend_from_slice(extra);
        let data = dir.path().join("data");
        let mut server = Server::start_with(&data, None, false, &env);
        let admin = server.read_token();
        let repo = super::connect_repo(&server.base, &admin, GH);
        let repo_id = repo["id"].as_str().unwrap().to_owned();
        let rig = Rig {
            models,
            github,
            server,
            admin,
            repo_id,
            source,
            _dir: dir,
        };
        rig.settings(json!({ "agentType": agent.as_str() }));
        rig
    }

    fn settings(&self, patch: Value) {
        super::patch_settings(&self.server.base, &self.admin, &self.repo_id, &patch);
    }

    /// Opens the issue `title`/`body` on the fake GitHub and assigns it; returns the task id.
    fn assign(&self, title: &str, body: &str) -> String {
        let number = self.github.add_issue(OWNER, NAME, title, Some(body), &[]);
        let res = reqwest::blocking::Client::new()
            .post(format!("{}/api/issues/assign", self.server.base))
            .bearer_auth(&self.admin)
            .json(&json!({
                "repoId": self.repo_id, "issueNumber": number, "title": title, "body": body
            }))
            .send()
            .unwrap();
        assert_eq!(res.status(), 201);
        let body: Value = res.json().unwrap();
        body["task"]["id"].as_str().unwrap().to_owned()
    }

    fn task(&self, id: &str) -> Value {
        get(&self.server.base, &format!("/api/tasks/{id}"), &self.admin).1
    }

    /// Polls the task until `done` holds (or the deadline), then returns it.
    fn wait_task(
        &self,
        id: &str,
        what: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(within, what, || {
            let task = self.task(id);
            if done(&task) {
                Ok(task)
            } else {
                Err(format!(
                    "{task:#}\n--- agentry's log ---\n{}",
                    self.server.stderr.so_far()
                ))
            }
        })
    }

    /// [`Rig::wait_task`] until the task has failed.
    fn wait_failed(&self, id: &str, what: &str, within: Duration) -> Value {
        self.wait_task(id, what, within, |t| state(t) == "failed")
    }

    /// The task's stored (or live) agent output.
    fn log(&self, id: &str) -> String {
        reqwest::blocking::Client::new()
            .get(format!("{}/api/tasks/{id}/log", self.server.base))
            .bearer_auth(&self.admin)
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    fn cancel(&self, id: &str) {
        let res = reqwest::blocking::Client::new()
            .post(format!("{}/api/tasks/{id}/cancel", self.server.base))
            .bearer_auth(&self.admin)
            .send()
            .unwrap();
        assert_eq!(res.status(), 200, "{}", res.text().unwrap_or_default());
    }

    /// The file `path` on the task's branch of the source repository.
    fn pushed_file(&self, branch: &str, path: &str) -> String {
        git(&["show", &format!("{branch}:{path}")], &self.source)
    }

    /// The priced usage of the fake's answered main calls of the run tagged `tag` (the
    /// model's price from the built-in table); a call the fake still holds (a stopped run's
    /// last) was never answered, so nothing of it was spent.
    fn priced_calls(&self, tag: &str, model: &str) -> Decimal {
        let calls = self.models.calls_where(|c| {
            c.run_tag.as_deref() == Some(tag)
                && c.kind == CallKind::Main
                && c.is_success()
                && c.answered_at.is_some()
        });
        let usage = agentry_fake_models::Usage::sum(calls.iter().filter_map(|c| c.usage.as_ref()));
        let tokens = Tokens {
            input: i64::try_from(usage.input_tokens).unwrap(),
            cache_read: i64::try_from(usage.cache_read_tokens).unwrap(),
            cache_write: i64::try_from(usage.cache_write_tokens).unwrap(),
            output: i64::try_from(usage.output_tokens).unwrap(),
        };
        PriceTable::builtin()
            .get(model)
            .unwrap()
            .cost(tokens)
            .unwrap()
            .as_decimal()
    }
}

/// What the task's (first) run spent, checked from outside: the fake model API's own record
/// of the calls it answered, each priced from the built-in table for the model it named. The
/// run's metered calls (`GET /api/tasks/{id}/calls`) that reached the fake are the first
/// ones at or after `from` (the fake's call count when the task was assigned; tasks of a
/// rig run one after another); their tokens must be the fake's. Unsandboxed (no gateway),
/// the agent's own word is all there is: Claude's printed cost, Codex's calls priced for
/// the launched model. Returns the figure and the task's log, for messages.
fn spent_by(rig: &Rig, agent: AgentType, id: &str, from: usize) -> (Decimal, String) {
    let log = rig.log(id);
    let task = rig.task(id);
    if task["runs"][0]["modelCalls"].is_null() {
        let spent = match agent {
            AgentType::ClaudeCode => printed_claude_cost(&log),
            AgentType::Codex => rig.priced_calls(&run_tag(&log), "gpt-6.1-sol"),
        };
        return (spent, log);
    }
    let (_, listed) = get(
        &rig.server.base,
        &format!("/api/tasks/{id}/calls?attempt=1"),
        &rig.admin,
    );
    let metered: Vec<&Value> = elements_of(&listed, "calls")
        .iter()
        .filter(|c| c["outcome"] != "refused")
        .collect();
    let upstream: Vec<agentry_fake_models::Call> = rig
        .models
        .calls()
        .into_iter()
        .skip(from)
        .filter(|c| {
            c.method == "POST" && (c.path == "/v1/messages" || c.path.starts_with("/v1/responses"))
        })
        .take(metered.len())
        .collect();
    assert_eq!(upstream.len(), metered.len(), "{listed:#}\n{log}");
    let prices = PriceTable::builtin();
    let mut spent = Decimal::ZERO;
    // Calls may overlap (a side call beside a main one): compared as sets of token counts.
    let mut theirs_tokens = Vec::new();
    for theirs in &upstream {
        assert!(
            theirs.key_ok,
            "the upstream got another key than the real one"
        );
        assert!(
            theirs.transport != Transport::WebSocket,
            "a call went around the gateway: {theirs:?}"
        );
        // A call the fake still held when the run stopped was never answered: nothing of
        // it was spent.
        let usage = match theirs.answered_at {
            Some(_) => theirs.usage.unwrap_or_default(),
            None => agentry_fake_models::Usage::default(),
        };
        let n = |v: u64| i64::try_from(v).unwrap();
        let tokens = match theirs.provider {
            Provider::Anthropic => Tokens {
                input: n(usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens),
                cache_read: n(usage.cache_read_tokens),
                cache_write: n(usage.cache_write_tokens),
                output: n(usage.output_tokens),
            },
            Provider::OpenAi => Tokens {
                input: n(usage.input_tokens),
                cache_read: n(usage.cache_read_tokens),
                cache_write: n(usage.cache_write_tokens),
                output: n(usage.output_tokens),
            },
        };
        theirs_tokens.push((tokens.input, tokens.output));
        let model = theirs.model.clone().unwrap_or_default();
        let price = prices
            .get(&model)
            .unwrap_or_else(|| panic!("the test's table has no price for {model}"));
        spent += price.cost(tokens).unwrap().as_decimal();
    }
    let mut ours_tokens: Vec<(i64, i64)> = metered
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_i64().unwrap();
            (
                n("inputTokens") + n("cacheReadTokens") + n("cacheWriteTokens"),
                n("outputTokens"),
            )
        })
        .collect();
    ours_tokens.sort_unstable();
    theirs_tokens.sort_unstable();
    assert_eq!(ours_tokens, theirs_tokens, "{listed:#}\n{log}");
    (spent, log)
}

/// The run tag the fake gave the conversation in `log` (`fake-models run r…` or `c…`).
fn run_tag(log: &str) -> String {
    let at = log
        .find("fake-models run ")
        .expect("a fake-models run tag in the log")
        + 16;
    log[at..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

/// The `total_cost_usd` of the last `result` event in a Claude Code log, exactly as
/// printed, rounded to nano-dollars as agentry records money.
fn printed_claude_cost(log: &str) -> Decimal {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("\"type\":\"result\""))
        .unwrap_or_else(|| panic!("no result event in the log:\n{log}"));
    let at = line.find("\"total_cost_usd\":").unwrap() + 17;
    let text: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    Decimal::from_scientific(&text)
        .or_else(|_| Decimal::from_str(&text))
        .unwrap()
        .round_dp_with_strategy(9, RoundingStrategy::MidpointAwayFromZero)
}

fn money(value: &Value) -> Decimal {
    Decimal::from_str(
        value
            .as_str()
            .unwrap_or_else(|| panic!("not money: {value}")),
    )
    .unwrap()
}

fn state(task: &Value) -> &str {
    task["state"].as_str().unwrap_or_default()
}

/// The review task of the coding task `parent`, once it ended.
fn review_of(rig: &Rig, parent: &str) -> Value {
    let id = eventually(Duration::from_secs(90), "a review task", || {
        let (_, list) = get(
            &rig.server.base,
            "/api/tasks?taskType=review&limit=50",
            &rig.admin,
        );
        let review = list["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["parentTaskId"] == parent);
        match review {
            Some(review) => Ok(review["id"].as_str().unwrap().to_owned()),
            None => Err(format!("{list:#}")),
        }
    });
    rig.wait_task(&id, "the review ends", Duration::from_secs(90), |t| {
        matches!(state(t), "completed" | "failed")
    })
}

/// Issue → pull request → review, with the real CLI of `agent`; returns the seconds from
/// the assignment to `pr_opened`.
fn issue_to_reviewed_pull_request(agent: AgentType) -> Option<f64> {
    let cli = real_cli(agent)?;
    Some(issue_to_reviewed_pull_request_with(agent, &cli, &[]))
}

/// [`issue_to_reviewed_pull_request`] with the CLI `cli` and `extra` in `serve`'s
/// environment.
fn issue_to_reviewed_pull_request_with(
    agent: AgentType,
    cli: &Path,
    extra: &[(&str, &str)],
) -> f64 {
    let rig = Rig::start(agent, cli, extra);
    let started = Instant::now();
    let from = rig.models.calls().len();
    let id = rig.assign("Add agent notes", "Write the notes file.");
    let task = rig.wait_task(&id, "pr_opened", Duration::from_secs(120), |t| {
        matches!(state(t), "pr_opened" | "failed")
    });
    let took = started.elapsed().as_secs_f64();
    assert_eq!(state(&task), "pr_opened", "{task:#}\n{}", rig.log(&id));
    let run = &task["runs"][0];
    assert_eq!(run["sandboxed"], true, "{task:#}");

    // The agent's change is in the pull request's branch.
    let pulls = rig.github.pulls(OWNER, NAME);
    assert_eq!(pulls.len(), 1);
    let notes = rig.pushed_file(&pulls[0].head, "AGENT_NOTES.md");
    let log = rig.log(&id);
    let tag = run_tag(&log);
    assert!(
        notes.contains(&format!(
            "notes written by a real agent CLI (fake-models run {tag})"
        )),
        "{notes}"
    );

    // Every dollar: the calls the upstream answered, priced from the table, are the bill;
    // what the agent printed is kept beside it.
    let cost = money(&task["costUsd"]);
    assert_eq!(cost, spent_by(&rig, agent, &id, from).0, "{log}");
    assert_eq!(money(&run["meteredCostUsd"]), cost, "{task:#}");
    if agent == AgentType::ClaudeCode {
        assert_eq!(
            money(&run["reportedCostUsd"]),
            printed_claude_cost(&log),
            "{task:#}"
        );
    } else {
        assert_eq!(run["model"], "gpt-6.1-sol", "{task:#}");
    }
    // Where the CLI tried to go besides its model API (refused: egressAllow is empty).
    eprintln!(
        "note: {} egress refused: {}",
        agent.as_str(),
        task["egressBlocked"]
    );
    // The agent never held the real key: it is nowhere in what it printed.
    assert!(!log.contains(&rig.models.key()));
    assert!(cost > Decimal::ZERO);

    // The review agent saw the diff: the command it was told to run, and what it gave.
    let review = review_of(&rig, &id);
    assert_eq!(state(&review), "completed", "{review:#}");
    let posted = rig.github.reviews(OWNER, NAME, pulls[0].number);
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(
        posted[0].contains("What the command gave:"),
        "{}",
        posted[0]
    );
    assert!(
        posted[0].contains("+++ b/AGENT_NOTES.md")
            && posted[0].contains(&format!(
                "+notes written by a real agent CLI (fake-models run {tag})"
            )),
        "the review does not show the diff: {}",
        posted[0]
    );
    assert!(money(&review["costUsd"]) > Decimal::ZERO, "{review:#}");
    // Only the fakes' key was used, and it always worked.
    assert!(rig.models.calls().iter().all(|c| c.key_ok));
    took
}

/// The real Claude Code of the agent image (deploy/Dockerfile.agent) in a Job on fake-kube:
/// the image's root file system unpacked (`AGENTRY_TEST_AGENT_ROOTFS`; `.ci/run` sets it after
/// building the image), its entry point (tini, then `agentry pod-run`) and its `claude`, the
/// same issue → reviewed pull request as above, every dollar metered.
#[test]
fn claude_code_in_the_agent_image_takes_an_issue_to_a_reviewed_pull_request_on_kubernetes() {
    let Some(rootfs) = std::env::var_os("AGENTRY_TEST_AGENT_ROOTFS").filter(|v| !v.is_empty())
    else {
        assert!(
            std::env::var("AGENTRY_TEST_REQUIRE_AGENT_IMAGE").as_deref() != Ok("1"),
            "AGENTRY_TEST_REQUIRE_AGENT_IMAGE=1 but AGENTRY_TEST_AGENT_ROOTFS is not set"
        );
        eprintln!(
            "note: AGENTRY_TEST_AGENT_ROOTFS is not set; the agent image's test does nothing"
        );
        return;
    };
    let kube = super::kube::cluster_with_image("agentry-agent", Path::new(&rootfs));
    let mut env = super::kube::kube_env(
        &kube,
        &[
            ("AGENTRY_AGENT_IMAGE", "agentry-agent"),
            (
                "AGENTRY_KUBE_POD_COMMAND",
                "/usr/bin/tini -- /usr/local/bin/agentry pod-run",
            ),
            ("AGENTRY_KUBE_AGENT_MEMORY", "2Gi"),
        ],
    );
    env.retain(|(name, _)| name != "AGENTRY_CLAUDE_BIN");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let took = issue_to_reviewed_pull_request_with(
        AgentType::ClaudeCode,
        Path::new("/usr/local/bin/claude"),
        &env,
    );
    eprintln!(
        "figure: claude-code in the agent image on fake-kube, assign to pull request {took:.2} s"
    );
}

#[test]
fn claude_code_takes_an_issue_to_a_reviewed_pull_request() {
    if let Some(took) = issue_to_reviewed_pull_request(AgentType::ClaudeCode) {
        eprintln!("figure: claude-code assign to pull request {took:.2} s");
    }
}

#[test]
fn codex_takes_an_issue_to_a_reviewed_pull_request() {
    if let Some(took) = issue_to_reviewed_pull_request(AgentType::Codex) {
        eprintln!("figure: codex assign to pull request {took:.2} s");
    }
}

/// A run is stopped while its second model call waits: by a cancel, or by the time limit.
/// The calls already answered are on record at what the upstream billed, and the call the
/// upstream was working on when the run stopped at its reservation (its usage never came,
/// and the provider may have billed it: unknown usage is spent, never free).
fn stopped_runs_record_what_they_spent(agent: AgentType) {
    let Some(cli) = real_cli(agent) else { return };
    let rig = Rig::start(agent, &cli, &[("AGENTRY_RUN_TIME_LIMIT_SECS", "20")]);
    rig.settings(json!({ "autoReview": false }));
    let provider = match agent {
        AgentType::ClaudeCode => Provider::Anthropic,
        AgentType::Codex => Provider::OpenAi,
    };
    // One main call answered and the next one held by the fake.
    let waiting = |calls: &[agentry_fake_models::Call]| {
        let main: Vec<_> = calls
            .iter()
            .filter(|c| c.provider == provider && c.kind == CallKind::Main)
            .collect();
        main.iter().any(|c| c.answered_at.is_some()) && main.iter().any(|c| c.answered_at.is_none())
    };

    // Cancel.
    let from = rig.models.calls().len();
    let id = rig.assign("Slow notes", "Write notes. [model:calls=2] [model:slow=60]");
    assert!(
        rig.models.wait_for(Duration::from_secs(60), waiting),
        "the agent never reached its second model call: {:#}",
        rig.task(&id)
    );
    let cancelled_at = Instant::now();
    rig.cancel(&id);
    let task = rig.wait_task(
        &id,
        "the cancelled run recorded",
        Duration::from_secs(30),
        |t| t["runs"].as_array().is_some_and(|r| !r.is_empty()),
    );
    let stop_took = cancelled_at.elapsed().as_secs_f64();
    let run = &task["runs"][0];
    assert_eq!(state(&task), "cancelled");
    assert_eq!(run["outcome"], "cancelled", "{task:#}");
    let (spent, log) = spent_by(&rig, agent, &id, from);
    assert!(spent > Decimal::ZERO);
    assert_stopped_cost(&rig, &id, run, spent, &log);
    assert_eq!(money(&task["costUsd"]), money(&run["costUsd"]));
    eprintln!(
        "figure: {} cancel to run recorded {stop_took:.2} s",
        agent.as_str()
    );

    // The time limit.

    let from = rig.models.calls().len();
    let id = rig.assign(
        "Slower notes",
        "Write notes. [model:calls=2] [model:slow=600]",
    );
    let task = rig.wait_failed(&id, "the timed-out run", Duration::from_secs(90));
    let run = &task["runs"][0];
    assert_eq!(run["outcome"], "timed_out", "{task:#}");
    assert!(
        error_of(&task).contains("longer than the limit"),
        "{task:#}"
    );
    let (spent, log) = spent_by(&rig, agent, &id, from);
    assert!(spent > Decimal::ZERO);
    assert_stopped_cost(&rig, &id, run, spent, &log);
}

/// A stopped run's cost: its answered calls at what the upstream billed (`billed`), plus the
/// held call at its reservation (more than nothing).
fn assert_stopped_cost(rig: &Rig, id: &str, run: &Value, billed: Decimal, log: &str) {
    let (_, listed) = get(
        &rig.server.base,
        &format!("/api/tasks/{id}/calls?attempt=1"),
        &rig.admin,
    );
    let sum = |outcomes: &[&str]| -> Decimal {
        elements_of(&listed, "calls")
            .iter()
            .filter(|c| outcomes.contains(&c["outcome"].as_str().unwrap_or("")))
            .map(|c| money(&c["costUsd"]))
            .sum()
    };
    let (answered, held) = (sum(&["completed"]), sum(&["interrupted", "unmetered"]));
    assert_eq!(answered, billed, "{listed:#}\n{log}");
    assert!(held > Decimal::ZERO, "{listed:#}");
    assert_eq!(
        money(&run["costUsd"]),
        answered + held,
        "{run:#}\n{listed:#}"
    );
}

for_each_agent!(stopped_runs_record_what_they_spent =>
    claude_code_runs_stopped_midway_record_what_they_spent,
    codex_runs_stopped_midway_record_what_they_spent);

/// A run stops at its budget, never past it: the gateway sends a call only while its
/// largest cost fits beside what the run has spent and reserved, so the calls that went out
/// add up to no more than the allowance, the next one is refused, and the whole cost is
/// recorded. A model API error fails the task with the provider's words.
fn budgets_and_api_errors(agent: AgentType) {
    let Some(cli) = real_cli(agent) else { return };
    let rig = Rig::start(agent, &cli, &[]);
    rig.settings(json!({ "autoReview": false, "maxCostPerTaskUsd": "2" }));

    // Each main call costs about $0.2 (1,000 input and up to 20,000 output tokens; the
    // fake stops at the call's max_tokens, as the provider does) and reserves more (its
    // whole output limit and every byte of its body as input), so a few calls go out.
    let from = rig.models.calls().len();
    let id = rig.assign(
        "Costly notes",
        "Write notes. [model:usage=1000,20000,0,0] [model:calls=30]",
    );
    let task = rig.wait_failed(&id, "the budget stop", Duration::from_secs(120));
    let message = error_of(&task);
    assert!(message.contains("budget reached"), "{task:#}");
    let cost = money(&task["costUsd"]);
    let (spent, log) = spent_by(&rig, agent, &id, from);
    assert_eq!(cost, spent, "{log}");
    assert!(cost <= Decimal::new(2, 0), "{task:#}");
    let (_, calls) = get(
        &rig.server.base,
        &format!("/api/tasks/{id}/calls"),
        &rig.admin,
    );
    let outcomes = strings_of(&calls, "calls", "outcome");
    let costly = elements_of(&calls, "calls")
        .iter()
        .filter(|c| c["outcome"] == "completed" && c["outputTokens"].as_i64() > Some(1000))
        .count();
    assert!(costly >= 1, "{calls:#}");
    assert!(outcomes.contains(&"refused"), "{calls:#}");
    assert!(rig.github.pulls(OWNER, NAME).is_empty());

    // A model API error.
    let id = rig.assign("Refused notes", "Write notes. [model:api-error=400]");
    let task = rig.wait_failed(&id, "the API error", Duration::from_secs(60));
    let message = error_of(&task);
    assert!(
        message.contains("fake-models refuses this request (API-ERROR)")
            && message.starts_with("model API error"),
        "{task:#}\n{}",
        rig.log(&id)
    );
}

for_each_agent!(budgets_and_api_errors =>
    claude_code_budget_stops_and_api_errors,
    codex_budget_stops_and_api_errors);

/// A missing CLI and an unsupported version fail the task with what to do, and `agentry
/// doctor` says the same. Needs no real CLI.
#[test]
fn a_missing_or_unsupported_cli_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old-codex");
    std::fs::write(&old, "#!/bin/sh\necho 'codex-cli 0.100.0'\n").unwrap();
    let mut perms = std::fs::metadata(&old).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&old, perms).unwrap();
    let fake_claude =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/runner/tests/fake-agents/claude");

    for (codex, expected) in [
        (
            dir.path().join("missing/codex"),
            "the Codex CLI was not found",
        ),
        (
            old.clone(),
            "is version 0.100.0, which agentry does not support",
        ),
    ] {
        let rig = Rig::start(
            AgentType::Codex,
            &codex,
            &[("AGENTRY_CLAUDE_BIN", fake_claude.to_str().unwrap())],
        );
        let id = rig.assign("Notes", "Write notes.");
        let task = rig.wait_failed(&id, "the task fails", Duration::from_secs(30));
        let message = error_of(&task);
        assert!(message.contains(expected), "{task:#}");
        assert!(
            message.contains("npm install -g @openai/codex@0.169.0"),
            "{message}"
        );
        // No agent ran, so nothing was spent: a null cost, never $0.
        assert_eq!(task["costUsd"], Value::Null, "{task:#}");

        // `agentry doctor` on the same configuration: the same problem, exit 1.
        let mut doctor = Command::new(BIN);
        doctor
            .arg("doctor")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AGENTRY_DATA_DIR", rig._dir.path().join("data"))
            .env("AGENTRY_CODEX_BIN", &codex)
            .env("AGENTRY_CLAUDE_BIN", &fake_claude)
            .env("OPENAI_API_KEY", "k");
        sandbox_env(&mut doctor);
        let out = doctor.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(expected), "{text}");
    }
}
