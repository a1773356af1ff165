//! The real agent CLIs against the fake: Claude Code (`AGENTRY_TEST_CLAUDE_BIN`) and Codex
//! (`AGENTRY_TEST_CODEX_BIN`). A test whose CLI is not set says so and passes, unless
//! `AGENTRY_TEST_REQUIRE_REAL_AGENTS=1`, which makes that a failure.
//!
//! Each run gets a scratch `HOME` and a scratch git repository outside `/tmp` wherever the
//! build lies ([`agentry_testkit::dirs::outside_tmp`]; Codex cannot create its helper
//! binaries with a `HOME` under `/tmp`).
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agentry_fake_models::{Call, CallKind, FakeModels, Provider, Transport, Usage};
use agentry_testkit::git::git;
use agentry_testkit::wait::eventually;
use serde_json::Value;
use tempfile::TempDir;

/// How long one CLI run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// What the review runs ask for.
const REVIEW_PROMPT: &str = "Review this branch: run `git diff origin/main...HEAD` and report.";

/// A coding prompt whose second main call the fake answers after 30 s.
const SLOW_PROMPT: &str = "Please add a line to the notes. [model:slow=30]";

const REQUIRE_VAR: &str = "AGENTRY_TEST_REQUIRE_REAL_AGENTS";

/// The CLI named by `var`, or `None` (after saying so) when it is not set.
///
/// # Panics
/// When it is not set and `AGENTRY_TEST_REQUIRE_REAL_AGENTS=1`, or set to a missing file.
fn cli(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(path.exists(), "{var}={} does not exist", path.display());
            Some(path)
        }
        None => {
            assert!(
                std::env::var(REQUIRE_VAR).as_deref() != Ok("1"),
                "{REQUIRE_VAR}=1 but {var} is not set"
            );
            eprintln!("skipped: set {var} to the CLI to run it against the fake model API");
            None
        }
    }
}

/// A scratch `HOME` and a git repository with one commit on `main` (and, for reviews,
/// `origin/main` at that commit and a branch `feature` one commit ahead, adding `hello.txt`).
struct Workspace {
    _dir: TempDir,
    home: PathBuf,
    repo: PathBuf,
}

impl Workspace {
    fn new(with_feature: bool) -> Self {
        // Outside the temporary directory wherever the build lies: Codex will not create
        // its helper binaries with a HOME under it.
        let dir = agentry_testkit::dirs::outside_tmp(
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            "fake-models-",
        )
        .expect("a directory outside /tmp where this user may write, for Codex's HOME");
        let home = dir.path().join("home");
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&repo).unwrap();
        git(&["init", "-q", "-b", "main"], &repo);
        std::fs::write(repo.join("README.md"), "# demo\n").unwrap();
        git(&["add", "README.md"], &repo);
        git(&["commit", "-q", "-m", "initial"], &repo);
        if with_feature {
            git(&["update-ref", "refs/remotes/origin/main", "HEAD"], &repo);
            git(&["checkout", "-q", "-b", "feature"], &repo);
            std::fs::write(repo.join("hello.txt"), "hello from the feature branch\n").unwrap();
            git(&["add", "hello.txt"], &repo);
            git(&["commit", "-q", "-m", "add hello"], &repo);
        }
        Self {
            _dir: dir,
            home,
            repo,
        }
    }

    fn stdout_path(&self) -> PathBuf {
        self.home.join("stdout.jsonl")
    }

    fn stderr_path(&self) -> PathBuf {
        self.home.join("stderr.txt")
    }

    /// A command running `bin` in the repository, with the scratch `HOME` and only `PATH`
    /// from this environment.
    fn command(&self, bin: &Path) -> Command {
        let mut command = Command::new(bin);
        command
            .current_dir(&self.repo)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home);
        command
    }

    /// Starts `command` with the prompt on stdin, stdout and stderr to files.
    fn spawn(&self, mut command: Command, prompt: &str) -> Child {
        command
            .stdin(Stdio::piped())
            .stdout(File::create(self.stdout_path()).unwrap())
            .stderr(File::create(self.stderr_path()).unwrap());
        let mut child = command.spawn().unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(prompt.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        child
    }

    /// The JSON lines the CLI printed.
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.stdout_path())
            .unwrap()
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// What the CLI printed, for failure messages.
    fn output(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            std::fs::read_to_string(self.stdout_path()).unwrap_or_default(),
            std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
        )
    }

    fn notes(&self) -> String {
        std::fs::read_to_string(self.repo.join("AGENT_NOTES.md"))
            .unwrap_or_else(|e| panic!("no AGENT_NOTES.md ({e}); {}", self.output()))
    }

    /// Asserts that the agent wrote its line, tagged with the run `tag`, to the notes.
    fn assert_notes_written(&self, tag: &str) {
        let line = format!("notes written by a real agent CLI (fake-models run {tag})");
        let notes = self.notes();
        assert!(notes.lines().any(|l| l == line), "{notes}");
    }

    /// Waits for `child` to exit, polling until `deadline` (then kills it and panics).
    fn wait(&self, child: &mut Child, deadline: Duration) -> ExitStatus {
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= until {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the CLI did not exit within {deadline:?}; {}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The entries of Codex's session files (`$HOME/.codex/sessions/**/rollout-*.jsonl`).
    fn rollout(&self) -> Vec<Value> {
        let mut files = Vec::new();
        collect_rollouts(&self.home.join(".codex/sessions"), &mut files);
        files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .filter(|l| l.starts_with('{'))
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

fn collect_rollouts(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rollouts(&path, out);
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl"))
        {
            out.push(path);
        }
    }
}

/// Sends `signal` (e.g. `-INT`) to `pid` with kill(1).
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The child processes of `pid` (from `/proc`), empty when the kernel does not list them.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether process `pid` is still running (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

// ----- Claude Code -----

/// Dollars per token (input, output, cache write (5 minutes), cache read) of a Claude model.
fn claude_prices(model: &str) -> [f64; 4] {
    let per_million = if model.starts_with("claude-sonnet") {
        [3.0, 15.0, 3.75, 0.30]
    } else if model.starts_with("claude-haiku-4-5") {
        [1.0, 5.0, 1.25, 0.10]
    } else {
        panic!("no test prices for {model}")
    };
    per_million.map(|p| p / 1e6)
}

/// What Claude Code should report as `total_cost_usd` for these calls: every answered
/// Anthropic model call, side calls included.
fn claude_cost(calls: &[Call]) -> f64 {
    calls
        .iter()
        .filter(|c| c.provider == Provider::Anthropic && c.answered_at.is_some())
        .filter_map(|c| Some((c.model.as_deref()?, c.usage?)))
        .map(|(model, u)| {
            let [input, output, write, read] = claude_prices(model);
            u.input_tokens as f64 * input
                + u.output_tokens as f64 * output
                + u.cache_write_tokens as f64 * write
                + u.cache_read_tokens as f64 * read
        })
        .sum()
}

fn claude_command(ws: &Workspace, bin: &Path, fake: &FakeModels, extra: &[&str]) -> Command {
    let mut command = ws.command(bin);
    command
        .args(["-p", "--output-format", "stream-json", "--verbose"])
        .args(["--model", "sonnet", "--max-turns", "20"])
        .args(extra)
        .env("IS_SANDBOX", "1")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("ANTHROPIC_API_KEY", fake.key());
    command
}

/// The `result` event, which must be the last line.
fn claude_result(ws: &Workspace) -> Value {
    let events = ws.events();
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "result", "{}", ws.output());
    last
}

/// Asserts that Claude Code's `total_cost_usd` is what the fake's `calls` cost.
fn assert_claude_cost(result: &Value, calls: &[Call], what: &str) {
    let cost = result["total_cost_usd"].as_f64().unwrap();
    let expected = claude_cost(calls);
    assert!(
        (cost - expected).abs() < 1e-9,
        "total_cost_usd {cost}, from the fake's {what} {expected}"
    );
}

/// A CLI and how it is started.
enum Agent<'a> {
    /// Claude Code with these extra arguments.
    Claude(&'a [&'a str]),
    /// Codex with this model.
    Codex(&'a str),
}

/// A CLI run started in a new workspace against a new fake.
struct Started {
    fake: FakeModels,
    ws: Workspace,
    child: Child,
    /// When the CLI was spawned.
    at: Instant,
}

impl Started {
    /// Starts `agent` on `prompt` in a new [`Workspace`] (`with_feature` as for
    /// [`Workspace::new`]) against a new fake that `setup` prepares; `None` when the CLI is
    /// not set (see [`cli`]).
    fn new(
        agent: Agent<'_>,
        with_feature: bool,
        prompt: &str,
        setup: impl FnOnce(&FakeModels),
    ) -> Option<Started> {
        let bin = cli(match agent {
            Agent::Claude(_) => "AGENTRY_TEST_CLAUDE_BIN",
            Agent::Codex(_) => "AGENTRY_TEST_CODEX_BIN",
        })?;
        let fake = FakeModels::start();
        setup(&fake);
        let ws = Workspace::new(with_feature);
        let command = match agent {
            Agent::Claude(extra) => claude_command(&ws, &bin, &fake, extra),
            Agent::Codex(model) => codex_command(&ws, &bin, &fake, model),
        };
        let at = Instant::now();
        let child = ws.spawn(command, prompt);
        Some(Started {
            fake,
            ws,
            child,
            at,
        })
    }

    /// Waits up to [`RUN_DEADLINE`] for the CLI to exit, says how long `what` took and
    /// asserts it succeeded; returns that duration.
    fn succeed(&mut self, what: &str) -> Duration {
        let status = self.ws.wait(&mut self.child, RUN_DEADLINE);
        let took = self.at.elapsed();
        eprintln!("{what}: {took:?}");
        assert!(status.success(), "{status}; {}", self.ws.output());
        took
    }

    /// Waits until the second main call (step 1, slow) has been made.
    fn wait_for_the_second_main_call(&self) {
        assert!(
            self.fake.wait_for(Duration::from_secs(60), |calls| calls
                .iter()
                .any(|c| c.step == Some(1))),
            "no second main call; {}",
            self.ws.output()
        );
    }

    /// Sends SIGINT and waits up to 20 s for the exit.
    fn interrupt(&mut self, what: &str) -> ExitStatus {
        let signalled = Instant::now();
        send_signal(self.child.id(), "-INT");
        let status = self.ws.wait(&mut self.child, Duration::from_secs(20));
        eprintln!(
            "{what} exited {status} {:?} after SIGINT",
            signalled.elapsed()
        );
        status
    }
}

#[test]
fn claude_code_writes_the_notes_and_reports_the_fake_cost() {
    claude_coding_run(None);
}

#[test]
fn claude_code_retries_a_failed_model_call() {
    claude_coding_run(Some(500));
}

/// Runs a coding conversation with Claude Code, the first main call failing with `fault`.
fn claude_coding_run(fault: Option<u16>) {
    let Some(mut run) = Started::new(
        Agent::Claude(&["--permission-mode", "bypassPermissions"]),
        false,
        "Please add a line to the notes.",
        |fake| {
            if let Some(status) = fault {
                fake.fail_next(1, status);
            }
        },
    ) else {
        return;
    };
    run.succeed("claude run");
    let Started { fake, ws, .. } = run;

    let result = claude_result(&ws);
    assert_eq!(result["subtype"], "success", "{result}");
    assert_eq!(result["is_error"], false);
    let tag = &one_run_tag(&fake);
    assert_eq!(
        result["result"],
        format!("Done: added a line to AGENT_NOTES.md. (fake-models run {tag})")
    );
    ws.assert_notes_written(tag);
    let calls = fake.calls();
    let main = answered_main_calls(&fake);
    assert_eq!(main.len(), 2);
    assert!(main.iter().all(|c| c.transport == Transport::Sse));
    let failed = fake.calls_where(|c| c.status != 200 && c.kind == CallKind::Main);
    assert_eq!(failed.len(), usize::from(fault.is_some()));
    assert!(
        !fake.side_calls().is_empty(),
        "Claude Code asks for a session title"
    );
    assert_claude_cost(&result, &calls, "calls");
    // The top-level usage counts the main calls only (side calls are in modelUsage).
    let usage = Usage::sum(main.iter().filter_map(|c| c.usage.as_ref()));
    assert_eq!(result["usage"]["input_tokens"], usage.input_tokens);
    assert_eq!(result["usage"]["output_tokens"], usage.output_tokens);
    assert_eq!(
        result["usage"]["cache_read_input_tokens"],
        usage.cache_read_tokens
    );
    assert_eq!(
        result["usage"]["cache_creation_input_tokens"],
        usage.cache_write_tokens
    );
    // Each assistant event names the answer it came from.
    let ids: Vec<String> = ws
        .events()
        .iter()
        .filter(|e| e["type"] == "assistant")
        .map(|e| e["message"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        main.iter()
            .all(|c| ids.contains(c.answer_id.as_ref().unwrap()))
    );
}

#[test]
fn claude_code_reviews_with_git_diff_allowed_in_accept_edits_mode() {
    let Some(mut run) = Started::new(
        Agent::Claude(&[
            "--permission-mode",
            "acceptEdits",
            "--allowedTools",
            "Bash(git diff:*)",
            "Bash(git log:*)",
            "Bash(git status:*)",
        ]),
        true,
        REVIEW_PROMPT,
        |_| {},
    ) else {
        return;
    };
    run.succeed("claude review");
    let result = claude_result(&run.ws);
    let text = result["result"].as_str().unwrap();
    assert!(
        text.starts_with("fake-models review (fake-models run "),
        "{text}"
    );
    assert!(
        text.contains("+hello from the feature branch"),
        "the review saw the diff: {text}"
    );
    assert_eq!(result["permission_denials"], serde_json::json!([]));
}

#[test]
fn claude_code_reports_the_cost_so_far_on_sigint() {
    let Some(mut run) = Started::new(
        Agent::Claude(&["--permission-mode", "bypassPermissions"]),
        false,
        SLOW_PROMPT,
        |_| {},
    ) else {
        return;
    };
    run.wait_for_the_second_main_call();
    run.interrupt("claude");
    let result = claude_result(&run.ws);
    assert_eq!(result["subtype"], "error_during_execution", "{result}");
    assert_eq!(result["is_error"], true);
    let calls = run.fake.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.step == Some(1) && c.answered_at.is_none()),
        "the slow call was not answered"
    );
    assert_claude_cost(&result, &calls, "answered calls");
}

// ----- Codex -----

fn codex_command(ws: &Workspace, bin: &Path, fake: &FakeModels, model: &str) -> Command {
    let mut command = ws.command(bin);
    command
        .arg("-c")
        .arg(format!("openai_base_url=\"{}\"", fake.openai_base_url()))
        .args(["exec", "--json", "--model", model])
        .args(["--dangerously-bypass-approvals-and-sandbox", "-"])
        .env("CODEX_API_KEY", fake.key());
    command
}

/// The main calls the fake answered with 200.
fn answered_main_calls(fake: &FakeModels) -> Vec<Call> {
    fake.main_calls()
        .into_iter()
        .filter(|c| c.status == 200)
        .collect()
}

/// Codex's events, its last one (`turn.completed`, asserted) and the one run tag of the
/// fake.
fn codex_turn(ws: &Workspace, fake: &FakeModels) -> (Vec<Value>, Value, String) {
    let events = ws.events();
    let turn = events.last().cloned().unwrap_or_default();
    assert_eq!(turn["type"], "turn.completed", "{}", ws.output());
    (events, turn, one_run_tag(fake))
}

/// The fake's run tag; there must be exactly one.
fn one_run_tag(fake: &FakeModels) -> String {
    let tags = fake.run_tags();
    assert_eq!(tags.len(), 1, "{tags:?}");
    tags[0].clone()
}

/// The texts of Codex's agent messages, in order.
fn codex_messages(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "agent_message")
        .map(|e| e["item"]["text"].as_str().unwrap())
        .collect()
}

/// Checks `turn.completed`'s usage against the fake's answered OpenAI calls.
fn assert_codex_usage(turn: &Value, calls: &[Call]) {
    let answered: Vec<&Usage> = calls
        .iter()
        .filter(|c| c.provider == Provider::OpenAi && c.answered_at.is_some())
        .filter_map(|c| c.usage.as_ref())
        .collect();
    let sum = Usage::sum(answered);
    let usage = &turn["usage"];
    assert_eq!(usage["input_tokens"], sum.input_tokens, "{usage}");
    assert_eq!(
        usage["cached_input_tokens"], sum.cache_read_tokens,
        "{usage}"
    );
    assert_eq!(
        usage["cache_write_input_tokens"], sum.cache_write_tokens,
        "{usage}"
    );
    assert_eq!(usage["output_tokens"], sum.output_tokens, "{usage}");
    assert_eq!(
        usage["reasoning_output_tokens"], sum.reasoning_tokens,
        "{usage}"
    );
}

/// Checks that the session file recorded one `token_usage_record` per answered main call,
/// with the fake's response id and usage.
fn assert_codex_rollout(ws: &Workspace, calls: &[Call]) {
    let records: Vec<Value> = ws
        .rollout()
        .into_iter()
        .filter(|e| e["type"] == "token_usage_record")
        .map(|e| e["payload"].clone())
        .collect();
    let main: Vec<&Call> = calls
        .iter()
        .filter(|c| c.kind == CallKind::Main && c.answered_at.is_some() && c.usage.is_some())
        .collect();
    assert_eq!(records.len(), main.len(), "{records:?}");
    for (record, call) in records.iter().zip(&main) {
        let usage = call.usage.unwrap();
        assert_eq!(record["response_id"].as_str(), call.answer_id.as_deref());
        assert_eq!(record["usage"]["input_tokens"], usage.input_tokens);
        assert_eq!(record["usage"]["output_tokens"], usage.output_tokens);
        assert_eq!(
            record["usage"]["cached_input_tokens"],
            usage.cache_read_tokens
        );
    }
}

/// Whether Codex 0.169.0 runs `model` in code mode: no top-level `tools`, an
/// `additional_tools` input item offering the custom tool `exec` (JavaScript), commands run
/// through `tools.exec_command` inside it. So it does for the GPT-6 family and gpt-5.6-sol.
fn code_mode(model: &str) -> bool {
    model.starts_with("gpt-6") || model == "gpt-5.6-sol"
}

/// The `type`s of the input items of a call's body.
fn input_types(call: &Call) -> Vec<String> {
    call.body
        .as_ref()
        .and_then(|b| b["input"].as_array())
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["type"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks how the answered main calls offered their tools and sent back the tool results:
/// code mode's `additional_tools` and `custom_tool_call_output`, or top-level `tools` and
/// `function_call_output`.
fn assert_codex_tools(model: &str, calls: &[Call]) {
    let main: Vec<&Call> = calls
        .iter()
        .filter(|c| c.kind == CallKind::Main && c.status == 200)
        .collect();
    let first = main.first().expect("a main call");
    let types: Vec<String> = main.iter().flat_map(|c| input_types(c)).collect();
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    let results = main.iter().filter(|c| c.step.unwrap() >= 1).count();
    if code_mode(model) {
        assert!(
            main.iter()
                .all(|c| c.body.as_ref().unwrap().get("tools").is_none()),
            "no top-level tools in code mode"
        );
        assert!(
            input_types(first).contains(&"additional_tools".to_owned()),
            "{:?}",
            input_types(first)
        );
        assert!(count("custom_tool_call_output") >= results, "{types:?}");
        assert_eq!(count("function_call_output"), 0, "{types:?}");
    } else {
        assert!(first.body.as_ref().unwrap()["tools"].is_array());
        assert!(count("function_call_output") >= results, "{types:?}");
        assert_eq!(count("custom_tool_call_output"), 0, "{types:?}");
    }
}

/// Runs a coding conversation with Codex (the first main call failing with `fault`);
/// returns the run's duration.
fn codex_coding_run(
    model: &str,
    prompt: &str,
    websocket: bool,
    fault: Option<u16>,
) -> Option<Duration> {
    let mut run = Started::new(Agent::Codex(model), false, prompt, |fake| {
        fake.set_websocket_enabled(websocket);
        if let Some(status) = fault {
            fake.fail_next(1, status);
        }
    })?;
    let took = run.succeed(&format!("codex run ({model}, websocket {websocket})"));
    let Started { fake, ws, .. } = run;

    let (events, turn, tag) = codex_turn(&ws, &fake);
    let messages = codex_messages(&events);
    assert!(
        messages
            .last()
            .is_some_and(|m| m.starts_with("Done: added ")
                && m.ends_with(&format!("(fake-models run {tag})"))),
        "{messages:?}"
    );
    ws.assert_notes_written(&tag);
    let calls = fake.calls();
    eprintln!(
        "codex calls: {:?}",
        calls
            .iter()
            .map(|c| (c.kind, c.transport, c.status, c.step))
            .collect::<Vec<_>>()
    );
    assert_codex_usage(&turn, &calls);
    assert_codex_rollout(&ws, &calls);
    assert_codex_tools(model, &calls);
    let main = answered_main_calls(&fake);
    let expected = if websocket {
        Transport::WebSocket
    } else {
        Transport::Sse
    };
    assert!(
        main.iter()
            .all(|c| c.transport == expected && c.status == 200),
        "{:?}",
        main.iter()
            .map(|c| (c.transport, c.status))
            .collect::<Vec<_>>()
    );
    let upgrades = calls
        .iter()
        .filter(|c| c.transport == Transport::WebSocket && c.kind == CallKind::Other)
        .count();
    if fault.is_none() {
        assert_eq!(upgrades, 1, "one WebSocket upgrade (no reconnects)");
    }
    if websocket {
        assert!(
            calls.iter().any(|c| c.kind == CallKind::Prewarm),
            "Codex prewarms its WebSocket"
        );
    }
    Some(took)
}

#[test]
fn codex_writes_the_notes_over_the_websocket_and_reports_the_fake_usage() {
    codex_coding_run("gpt-5.5", "Please add a line to the notes.", true, None);
}

#[test]
fn codex_retries_a_failed_model_call() {
    codex_coding_run(
        "gpt-5.5",
        "Please add a line to the notes.",
        true,
        Some(500),
    );
}

#[test]
fn codex_with_a_model_without_metadata_and_custom_usage() {
    codex_coding_run(
        "gpt-5",
        "Please add lines to the notes. [model:calls=2] [model:usage=500,60,200,30,7]",
        true,
        None,
    );
}

#[test]
fn codex_falls_back_to_server_sent_events_when_the_websocket_is_refused() {
    codex_coding_run("gpt-5.5", "Please add a line to the notes.", false, None);
}

#[test]
fn codex_in_code_mode_writes_the_notes_through_exec_over_the_websocket() {
    codex_coding_run("gpt-6.1-sol", "Please add a line to the notes.", true, None);
}

#[test]
fn codex_in_code_mode_falls_back_to_server_sent_events() {
    codex_coding_run(
        "gpt-6.1-sol",
        "Please add lines to the notes. [model:calls=2] [model:usage=500,60,200,30,7]",
        false,
        None,
    );
}

#[test]
fn codex_with_its_review_model_writes_the_notes() {
    codex_coding_run("gpt-6-luna", "Please add a line to the notes.", true, None);
}

#[test]
fn codex_in_code_mode_reviews_the_diff() {
    codex_review_run("gpt-6.1-sol");
}

#[test]
fn codex_reviews_the_diff() {
    codex_review_run("gpt-5.5");
}

/// Runs a review conversation with Codex on a branch one commit ahead of `origin/main`.
fn codex_review_run(model: &str) {
    let Some(mut run) = Started::new(Agent::Codex(model), true, REVIEW_PROMPT, |_| {}) else {
        return;
    };
    run.succeed(&format!("codex review ({model})"));
    let Started { fake, ws, .. } = run;
    let (events, turn, tag) = codex_turn(&ws, &fake);
    let text = codex_messages(&events)
        .last()
        .copied()
        .unwrap_or_else(|| panic!("no agent message; {}", ws.output()));
    assert!(
        text.starts_with(&format!(
            "fake-models review (fake-models run {tag}). What the command gave:\n"
        )),
        "{text}"
    );
    assert!(
        text.contains("+hello from the feature branch"),
        "the review saw the diff: {text}"
    );
    assert!(
        events.iter().any(|e| e["type"] == "item.completed"
            && e["item"]["type"] == "command_execution"
            && e["item"]["command"]
                .as_str()
                .is_some_and(|c| c.contains("git diff origin/main...HEAD"))),
        "{}",
        ws.output()
    );
    let calls = fake.calls();
    assert_eq!(fake.main_calls().len(), 2);
    assert_codex_usage(&turn, &calls);
    assert_codex_rollout(&ws, &calls);
    assert_codex_tools(model, &calls);
}

#[test]
fn codex_on_sigint_prints_no_usage_but_its_session_file_has_the_answered_calls() {
    let Some(mut run) = Started::new(Agent::Codex("gpt-5.5"), false, SLOW_PROMPT, |_| {}) else {
        return;
    };
    run.wait_for_the_second_main_call();
    // The session file has the first call's usage while the run goes on.
    eventually(
        Duration::from_secs(10),
        "a token_usage_record while running",
        || {
            run.ws
                .rollout()
                .iter()
                .any(|e| e["type"] == "token_usage_record")
        },
    );
    let natives = children(run.child.id());
    let status = run.interrupt(&format!("codex (native processes {natives:?})"));
    let Started { fake, ws, .. } = run;
    for pid in natives {
        let what = format!("the end of the native codex {pid} after the signal");
        eventually(Duration::from_secs(10), what, || !alive(pid));
    }
    assert!(!status.success());
    let events = ws.events();
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "turn.completed" || e.get("usage").is_some()),
        "{}",
        ws.output()
    );
    let calls = fake.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.step == Some(1) && c.answered_at.is_none())
    );
    assert_codex_rollout(&ws, &calls);
}
