//! The fake `claude` and `codex` executables of `tests/fake-agents/`: each directive gives
//! the output the parsers expect, launched with the command lines agentry builds, and the
//! output (and Codex's session file) keeps the shape of what the real CLIs printed
//! (`tests/fixtures/*_real_*`), so the fakes cannot drift from the real formats.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{EXITED_0, PATH, assert_warned, fake, fixture};
use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use agentry_runner::agent::{AgentSpec, Launch, OutputParser, arguments};
use agentry_runner::process::{
    AgentCommand, Ended, Limits, ProcessError, ProcessOutcome, StopTarget, run_process,
};
use agentry_runner::{AgentOutcome, PriceTable, RunReport, parse_claude, parse_codex};
use agentry_testkit::wait::{eventually, eventually_async};
use nix::sys::signal::Signal;
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::watch;

const CLAUDE_MODEL: &str = "claude-sonnet-4-5-20250929";
const CODEX_MODEL: &str = "gpt-5-codex";

/// How long a fake may take to answer a signal (the real Claude Code takes about 0.1 s); far
/// shorter than the waits the tests interrupt.
const SIGNAL_DEADLINE: Duration = Duration::from_secs(10);

/// The command line agentry gives Claude Code (unsandboxed: `--permission-mode
/// acceptEdits`), with a turn limit of 30 and a budget of 2.5 USD.
fn claude_args(model: &str) -> Vec<String> {
    let spec = AgentSpec {
        agent_type: AgentType::ClaudeCode,
        model: model.into(),
        max_turns: Some(30),
        max_budget_usd: Some(Usd::parse("2.5").unwrap()),
    };
    arguments(&spec, Launch::default(), &[])
}

/// The command line agentry gives Codex: inside its sandbox
/// (`--dangerously-bypass-approvals-and-sandbox`) unless `workspace_write`, with `-c
/// openai_base_url=…` when `base_url` is given.
fn codex_args_with(model: &str, workspace_write: bool, base_url: Option<&str>) -> Vec<String> {
    let spec = AgentSpec::unlimited(AgentType::Codex, model);
    let launch = Launch {
        sandboxed: !workspace_write,
        review: false,
    };
    let env: Vec<(String, String)> = base_url
        .map(|url| ("OPENAI_BASE_URL".to_owned(), url.to_owned()))
        .into_iter()
        .collect();
    arguments(&spec, launch, &env)
}

fn codex_args(model: &str) -> Vec<String> {
    codex_args_with(model, false, None)
}

/// One finished run of a fake.
struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
    home: TempDir,
    cwd: TempDir,
}

impl Run {
    fn changes(&self) -> Option<String> {
        std::fs::read_to_string(self.cwd.path().join("AGENT_CHANGES.md")).ok()
    }

    fn home_file(&self, name: &str) -> String {
        std::fs::read_to_string(self.home.path().join(name)).unwrap()
    }

    /// The lines of the Codex session files in this run's `HOME`, parsed.
    fn session(&self) -> Vec<Value> {
        session_lines(self.home.path())
    }
}

/// The lines of the Codex session files (`.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`)
/// under `home`, parsed (each line must be JSON).
fn session_lines(home: &Path) -> Vec<Value> {
    let mut files = Vec::new();
    let mut dirs = vec![home.join(".codex/sessions")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let name = path.file_name().unwrap().to_str().unwrap().to_owned();
                assert!(
                    name.starts_with("rollout-") && name.ends_with(".jsonl"),
                    "{}",
                    path.display()
                );
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .iter()
        .flat_map(|file| {
            std::fs::read_to_string(file)
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
                .collect::<Vec<Value>>()
        })
        .collect()
}

/// The payloads of the session lines of type `kind`.
fn records<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["type"] == kind)
        .map(|l| &l["payload"])
        .collect()
}

/// The fake `name` with `args`, run in `cwd` with only `PATH` and `HOME` (`home`) set.
fn fake_command(name: &str, args: &[String], home: &Path, cwd: &Path) -> Command {
    let mut command = Command::new(fake(name));
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", PATH)
        .env("HOME", home);
    command
}

/// Starts the fake `name` with `args` ([`fake_command`]) in a fresh working directory with
/// a fresh `HOME`, its stdin and stdout piped and its stderr to `stderr`; returns it, its
/// `HOME` and its working directory.
fn start_fake(name: &str, args: &[String], stderr: Stdio) -> (Child, TempDir, TempDir) {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let child = fake_command(name, args, home.path(), cwd.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    (child, home, cwd)
}

/// Runs a fake with only `PATH` and `HOME` (a fresh directory), in a fresh directory.
fn run_fake_any(name: &str, args: &[String], prompt: &str) -> Run {
    let (mut child, home, cwd) = start_fake(name, args, Stdio::piped());
    // A fake that refuses its arguments reads no prompt.
    let _ = child.stdin.take().unwrap().write_all(prompt.as_bytes());
    let output = child.wait_with_output().unwrap();
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        code: output.status.code(),
        home,
        cwd,
    }
}

/// [`run_fake_any`], which must print nothing on stderr.
fn run_fake(name: &str, args: &[String], prompt: &str) -> Run {
    let run = run_fake_any(name, args, prompt);
    assert!(run.stderr.is_empty(), "stderr: {}", run.stderr);
    run
}

fn claude(prompt: &str) -> (Run, RunReport) {
    let run = run_fake("claude", &claude_args(CLAUDE_MODEL), prompt);
    let report = parse_claude(&run.stdout);
    (run, report)
}

fn codex(prompt: &str) -> (Run, RunReport) {
    let run = run_fake("codex", &codex_args(CODEX_MODEL), prompt);
    let report = parse_codex(&run.stdout, CODEX_MODEL, &PriceTable::builtin());
    (run, report)
}

/// The fake Claude Code on `prompt`, once it printed its init event.
fn claude_live(prompt: &str) -> Live {
    Live::start(
        "claude",
        &claude_args(CLAUDE_MODEL),
        prompt,
        "\"subtype\":\"init\"",
    )
}

/// The fake Codex on `prompt`, once its stdout holds `until`.
fn codex_live(prompt: &str, until: &str) -> Live {
    Live::start("codex", &codex_args(CODEX_MODEL), prompt, until)
}

/// The report of a Codex run read as agentry reads it: stdout and the session files of its
/// `HOME`.
fn codex_report(stdout: &str, home: &Path, model: &str) -> RunReport {
    let prices = PriceTable::builtin();
    let mut parser = OutputParser::codex(model, &prices).with_codex_home(home, &prices);
    parser.feed(stdout.as_bytes());
    parser.finish()
}

/// What `name --version` prints (it must succeed).
fn version(name: &str) -> String {
    let out = Command::new(fake(name))
        .arg("--version")
        .env_clear()
        .env("PATH", PATH)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn cost(report: &RunReport) -> Option<String> {
    report.cost_usd.map(|c| c.to_string())
}

/// Asserts that every line of `stdout` is JSON.
#[track_caller]
fn assert_json_lines(stdout: &str) {
    for line in stdout.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

/// The JSON object of the last line of `stdout` whose `type` is `kind`.
fn last_event(stdout: &str, kind: &str) -> Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .rfind(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {stdout}"))
}

/// `[fake:api-error=400]`: exit 1, the model API's refusal with its status.
fn assert_refused_with_400(run: &Run, r: &RunReport) {
    assert_eq!(run.code, Some(1));
    assert_eq!(
        r.outcome,
        AgentOutcome::ApiError {
            status: Some(400),
            message: "The model API refused this request (fake:api-error)".into()
        }
    );
}

/// `[fake:garbage]`: exit 0, but nothing agentry can read, so no cost.
fn assert_unparseable(run: &Run, r: &RunReport) {
    assert_eq!(run.code, Some(0));
    assert!(matches!(r.outcome, AgentOutcome::Unparseable(_)), "{r:?}");
    assert_eq!(r.cost_usd, None);
}

/// Exit code `code` and the outcome `outcome`.
#[track_caller]
fn assert_ended(run: &Run, r: &RunReport, code: i32, outcome: AgentOutcome) {
    assert_eq!(run.code, Some(code), "{}", run.stderr);
    assert_eq!(r.outcome, outcome, "{r:?}");
}

/// Exit 0, a success, and the cost `usd`.
fn assert_succeeded_at(run: &Run, r: &RunReport, usd: &str) {
    assert_ended(run, r, 0, AgentOutcome::Success);
    assert_eq!(cost(r).as_deref(), Some(usd));
}

/// The fake was launched with `args` (it wrote them to `$HOME/args`) and saw the minimal
/// environment.
fn assert_launched_with(run: &Run, args: &[String]) {
    assert_eq!(run.home_file("args"), args.join("\n") + "\n");
    assert_minimal_env(run);
}

/// The environment the fake saw is the minimal one (plus what sh adds itself).
fn assert_minimal_env(run: &Run) {
    let env = run.home_file("env");
    let names: BTreeSet<&str> = env
        .lines()
        .map(|line| line.split_once('=').unwrap().0)
        .collect();
    for name in &names {
        assert!(
            ["PATH", "HOME", "PWD", "SHLVL", "_"].contains(name),
            "unexpected {name} in {env}"
        );
    }
    assert!(names.contains("PATH") && names.contains("HOME"), "{env}");
}

/// A fake running with its stdout read as it comes (it may stay open after the fake exits:
/// `[fake:sleep=N]` leaves a `sleep 300` holding it), to be signalled.
struct Live {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    home: TempDir,
    cwd: TempDir,
}

impl Live {
    /// Starts the fake `name` with `args` on `prompt`, and waits until its stdout holds
    /// `until`.
    fn start(name: &str, args: &[String], prompt: &str, until: &str) -> Live {
        let (mut child, home, cwd) = start_fake(name, args, Stdio::null());
        child
            .stdin
            .take()
            .unwrap()
            .write_all(prompt.as_bytes())
            .unwrap();
        let mut pipe = child.stdout.take().unwrap();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stdout);
        let reader = std::thread::spawn(move || {
            let mut buf = [0_u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let live = Live {
            child,
            stdout,
            reader: Some(reader),
            home,
            cwd,
        };
        live.wait_for(until);
        live
    }

    fn stdout(&self) -> String {
        String::from_utf8(self.stdout.lock().unwrap().clone()).unwrap()
    }

    /// Waits until stdout holds `text`.
    fn wait_for(&self, text: &str) {
        eventually(Duration::from_secs(20), text, || {
            let stdout = self.stdout();
            if stdout.contains(text) {
                Ok(())
            } else {
                Err(stdout)
            }
        });
    }

    /// Sends `signal` to the fake alone and waits for it to exit: how, and how long it took.
    fn signal(&mut self, signal: Signal) -> (ExitStatus, Duration) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let sent = Instant::now();
        nix::sys::signal::kill(pid, signal).unwrap();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, sent.elapsed());
            }
            assert!(
                sent.elapsed() < SIGNAL_DEADLINE,
                "the fake ignored {signal:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What the fake printed, all of it (waiting for stdout to close, after stopping the
    /// background `sleep` of `[fake:sleep=N]` if there is one), its `HOME` and its working
    /// directory.
    fn finish(mut self) -> (String, TempDir, TempDir) {
        if let Ok(pid) = std::fs::read_to_string(self.home.path().join("child.pid")) {
            let pid = nix::unistd::Pid::from_raw(pid.trim().parse().unwrap());
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
        self.reader.take().unwrap().join().unwrap();
        (self.stdout(), self.home, self.cwd)
    }
}

// ---------------------------------------------------------------- claude

#[test]
fn claude_success() {
    let (run, r) = claude("Fix the bug in parse\nMore details here.");
    assert_succeeded_at(&run, &r, "0.123456");
    assert_eq!(r.tokens.input, 1200 + 5000 + 800);
    assert_eq!(r.tokens.cache_read, 5000);
    assert_eq!(r.tokens.cache_write, 800);
    assert_eq!(r.tokens.output, 340);
    assert_eq!(r.model.as_deref(), Some(CLAUDE_MODEL));
    // The tool call and the final answer, as the real CLI counts them.
    assert_eq!(r.turns, Some(2));
    assert_eq!(r.final_text.as_deref(), Some("Done: Fix the bug in parse"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(run.changes().as_deref(), Some("Fix the bug in parse\n"));
    assert_launched_with(&run, &claude_args(CLAUDE_MODEL));
    // The change is a Write tool call creating the file, and its result.
    let tool = run
        .stdout
        .lines()
        .find(|l| l.contains("\"tool_use\""))
        .unwrap();
    assert!(tool.contains("\"name\":\"Write\""), "{tool}");
    assert!(run.stdout.contains("File created successfully at: "));
}

#[test]
fn claude_reports_the_model_it_was_given_its_cwd_and_permission_mode() {
    let run = run_fake("claude", &claude_args("claude-opus-4-1-20250805"), "Task");
    let r = parse_claude(&run.stdout);
    assert_eq!(r.model.as_deref(), Some("claude-opus-4-1-20250805"));
    let init: Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(init["model"], "claude-opus-4-1-20250805");
    assert_eq!(init["claude_code_version"], "2.1.197");
    assert_eq!(init["permissionMode"], "acceptEdits");
    assert_eq!(init["apiKeySource"], "none");
    let cwd = PathBuf::from(init["cwd"].as_str().unwrap());
    assert_eq!(
        cwd.canonicalize().unwrap(),
        run.cwd.path().canonicalize().unwrap()
    );
    // Inside agentry's sandbox the permission mode is bypassPermissions: echoed.
    let spec = AgentSpec::unlimited(AgentType::ClaudeCode, CLAUDE_MODEL);
    let sandboxed = Launch {
        sandboxed: true,
        review: false,
    };
    let run = run_fake("claude", &arguments(&spec, sandboxed, &[]), "Task");
    let init: Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(init["permissionMode"], "bypassPermissions");
    assert!(parse_claude(&run.stdout).outcome.is_success());
}

#[test]
fn claude_prompt_with_quotes_backslashes_and_newlines_parses() {
    let prompt =
        "Fix \"quoted\" C:\\path\\ {\"a\":1} \\n\tand é✓ [fake:no-changes]\nsecond \"line\"\n\\";
    let (run, r) = claude(prompt);
    assert_eq!(r.outcome, AgentOutcome::Success, "{}", run.stdout);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // Control characters (the tab) are dropped; everything else is kept.
    assert_eq!(
        r.final_text.as_deref(),
        Some("Done: Fix \"quoted\" C:\\path\\ {\"a\":1} \\nand é✓ [fake:no-changes]")
    );
    assert_json_lines(&run.stdout);
}

#[test]
fn claude_prompt_with_quotes_is_written_to_the_changes_file() {
    let (run, r) = claude("Say \"hi\" \\o/ it's\nrest");
    assert!(r.outcome.is_success());
    assert_eq!(run.changes().as_deref(), Some("Say \"hi\" \\o/ it's\n"));
    assert_json_lines(&run.stdout);
    let tool = last_event(&run.stdout, "assistant");
    assert!(tool["message"]["content"][0]["text"].is_string());
}

#[test]
fn claude_appends_to_an_existing_changes_file() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("AGENT_CHANGES.md"), "earlier\n").unwrap();
    let output = fake_command(
        "claude",
        &claude_args(CLAUDE_MODEL),
        home.path(),
        cwd.path(),
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(output.status.success());
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("AGENT_CHANGES.md")).unwrap(),
        "earlier\n\n"
    );
    // An existing file is appended to with Bash, whose result has the real CLI's shape.
    let stdout = String::from_utf8(output.stdout).unwrap();
    let call = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["message"]["content"][0]["type"] == "tool_use")
        .unwrap();
    let input = &call["message"]["content"][0]["input"];
    assert_eq!(call["message"]["content"][0]["name"], "Bash");
    assert_eq!(
        input["command"], "printf '%s\\n' '' >> AGENT_CHANGES.md",
        "{call}"
    );
    let result = last_event(&stdout, "user");
    assert_eq!(
        result["message"]["content"][0]["content"],
        "(Bash completed with no output)"
    );
    assert!(parse_claude(&stdout).outcome.is_success());
}

#[test]
fn claude_cost_directive() {
    let (run, r) = claude("Cheap one [fake:cost=1.5]");
    assert_eq!(run.code, Some(0));
    assert!(r.outcome.is_success());
    assert_eq!(cost(&r).as_deref(), Some("1.5"));
    let (_, r) = claude("Precise [fake:cost=0.000000001]");
    assert_eq!(cost(&r).as_deref(), Some("0.000000001"));
    // A binary float, as the real CLI prints its sums: printed verbatim, recorded rounded to
    // nano-dollars.
    let (run, r) = claude("Float [fake:cost=0.006500000000000001]");
    let result = run.stdout.lines().last().unwrap();
    assert!(
        result.contains("\"total_cost_usd\":0.006500000000000001,")
            && result.contains("\"costUSD\":0.006500000000000001,"),
        "{result}"
    );
    assert_eq!(cost(&r).as_deref(), Some("0.0065"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn claude_no_changes() {
    let (run, r) = claude("Look only [fake:no-changes]");
    assert_succeeded_at(&run, &r, "0.123456");
    assert_eq!(
        r.final_text.as_deref(),
        Some("Done: Look only [fake:no-changes]")
    );
    assert_eq!(run.changes(), None);
    assert_eq!(
        std::fs::read_dir(run.cwd.path()).unwrap().count(),
        0,
        "no file at all"
    );
}

#[test]
fn claude_fail() {
    let (run, r) = claude("Break [fake:fail]");
    assert_eq!(run.code, Some(1));
    match &r.outcome {
        AgentOutcome::Error(message) => {
            assert!(message.starts_with("error_during_execution"), "{message}");
            assert!(message.contains("fake:fail"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cost(&r).as_deref(), Some("0.123456"));
    assert_eq!(r.tokens.output, 340);
    assert_eq!(run.changes(), None);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

/// `[fake:api-error=CODE]`: the real CLI's model API error (`subtype` success with
/// `is_error` and `api_error_status`), exit 1.
#[test]
fn claude_api_error() {
    let (run, r) = claude("Refused [fake:api-error=400]");
    assert_refused_with_400(&run, &r);
    assert_eq!(
        r.outcome.describe(),
        "model API error 400: The model API refused this request (fake:api-error)"
    );
    // The session-title side request was answered: its cost.
    assert_eq!(cost(&r).as_deref(), Some("0.00075"));
    assert_eq!(run.changes(), None);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let result = last_event(&run.stdout, "result");
    assert_eq!(
        result["result"],
        "API Error: 400 The model API refused this request (fake:api-error)"
    );

    let (_, r) = claude("Overloaded [fake:api-error=529] [fake:cost=0.01]");
    assert!(
        matches!(
            r.outcome,
            AgentOutcome::ApiError {
                status: Some(529),
                ..
            }
        ),
        "{:?}",
        r.outcome
    );
    assert_eq!(cost(&r).as_deref(), Some("0.01"));
}

#[test]
fn claude_max_turns() {
    let (run, r) = claude("Long task [fake:max-turns]");
    assert_ended(&run, &r, 1, AgentOutcome::MaxTurns);
    // --max-turns 30: the real CLI reports one more turn than its limit.
    assert_eq!(r.turns, Some(31));
    assert_eq!(cost(&r).as_deref(), Some("0.123456"));
    assert_eq!(r.final_text, None);
    assert!(run.changes().is_some());
    let result = last_event(&run.stdout, "result");
    assert_eq!(
        result["errors"],
        serde_json::json!(["Reached maximum number of turns (30)"])
    );
}

#[test]
fn claude_max_budget() {
    let (run, r) = claude("Costly task [fake:max-budget] [fake:cost=2.5]");
    assert_ended(&run, &r, 1, AgentOutcome::MaxBudget);
    assert_eq!(cost(&r).as_deref(), Some("2.5"));
    let result = last_event(&run.stdout, "result");
    assert_eq!(
        result["errors"],
        serde_json::json!(["Reached maximum budget ($2.5)"])
    );
    // A cost beyond --max-budget-usd 2.5 stops there.
    let (run, r) = claude("Too costly [fake:cost=3.75]");
    assert_ended(&run, &r, 1, AgentOutcome::MaxBudget);
    assert_eq!(cost(&r).as_deref(), Some("2.5"));
}

#[test]
fn claude_garbage() {
    let (run, r) = claude("Whatever [fake:garbage]");
    assert_unparseable(&run, &r);
    assert_eq!(run.changes(), None);
}

#[test]
fn claude_exit_code() {
    let (run, r) = claude("Odd exit [fake:exit=7]");
    assert_ended(&run, &r, 7, AgentOutcome::Success);
    let (run, r) = claude("Odd fail [fake:fail] [fake:exit=0]");
    assert_eq!(run.code, Some(0));
    assert!(matches!(r.outcome, AgentOutcome::Error(_)));
}

#[test]
fn claude_version() {
    assert_eq!(version("claude"), "2.1.197 (Claude Code)\n");
}

/// SIGINT, what agentry sends first to stop a run: at once (not after the wait it
/// interrupts), the real CLI's `error_during_execution` result with the cost so far, exit 0.
#[test]
fn claude_on_sigint_reports_the_cost_so_far_and_exits_0() {
    let mut live = claude_live("Interrupted [fake:sleep=60] [fake:cost=0.006500000000000001]");
    let (status, took) = live.signal(Signal::SIGINT);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(took < SIGNAL_DEADLINE, "{took:?}");
    let (stdout, _home, cwd) = live.finish();
    let result = last_event(&stdout, "result");
    assert_eq!(result["subtype"], "error_during_execution");
    assert_eq!(result["is_error"], true);
    assert_eq!(result["terminal_reason"], "aborted_streaming");
    let interrupted = last_event(&stdout, "user");
    assert_eq!(
        interrupted["message"]["content"][0]["text"],
        "[Request interrupted by user]"
    );
    let r = parse_claude(&stdout);
    assert_eq!(cost(&r).as_deref(), Some("0.0065"));
    assert!(
        matches!(&r.outcome, AgentOutcome::Error(m) if m.starts_with("error_during_execution: ")),
        "{:?}",
        r.outcome
    );
    // Interrupted before its work: nothing changed.
    assert!(!cwd.path().join("AGENT_CHANGES.md").exists());
    // The shape of the real CLI's answer to SIGINT.
    let real = events(&fixture("claude_real_sigint.jsonl"));
    let fake = events(&stdout);
    assert_eq!(keys_of_last(&fake, "result"), keys_of_last(&real, "result"));
    assert_eq!(keys_of_last(&fake, "user"), keys_of_last(&real, "user"));
}

/// SIGTERM: nothing more printed, exit 143, at once.
#[test]
fn claude_on_sigterm_prints_nothing_more_and_exits_143() {
    let mut live = claude_live("Terminated [fake:sleep=60]");
    let (status, _) = live.signal(Signal::SIGTERM);
    assert_eq!(status.code(), Some(143), "{status:?}");
    let (stdout, _, _) = live.finish();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(matches!(
        parse_claude(&stdout).outcome,
        AgentOutcome::Unparseable(_)
    ));
}

// ---------------------------------------------------------------- codex

#[test]
fn codex_success() {
    let (run, r) = codex("Implement the feature\nDetails.");
    assert_ended(&run, &r, 0, AgentOutcome::Success);
    assert_eq!(r.tokens.input, 2000);
    assert_eq!(r.tokens.cache_read, 500);
    assert_eq!(r.tokens.cache_write, 0);
    assert_eq!(r.tokens.output, 300);
    assert_eq!(r.turns, Some(1));
    assert_eq!(r.model.as_deref(), Some(CODEX_MODEL));
    // (1500 × 1.25 + 500 × 0.125 + 300 × 10) / 10⁶
    assert_eq!(cost(&r).as_deref(), Some("0.0049375"));
    assert_eq!(r.final_text.as_deref(), Some("Done: Implement the feature"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(run.changes().as_deref(), Some("Implement the feature\n"));
    assert_launched_with(&run, &codex_args(CODEX_MODEL));
    // The change, as the real CLI shows it: a shell command.
    let command = last_event(&run.stdout, "item.completed");
    assert_eq!(command["item"]["type"], "agent_message");
    assert!(run.stdout.contains(
        r#""command":"/bin/bash -lc \"printf '%s\\\\n' 'Implement the feature' >> AGENT_CHANGES.md\"""#
    ));

    // The session file: the model, and the one call's usage.
    let session = run.session();
    assert_eq!(records(&session, "session_meta").len(), 1);
    assert_eq!(records(&session, "turn_context")[0]["model"], CODEX_MODEL);
    let calls = records(&session, "token_usage_record");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]["usage"],
        serde_json::json!({"input_tokens": 2000, "cached_input_tokens": 500,
            "cache_write_input_tokens": 0, "output_tokens": 300,
            "reasoning_output_tokens": 40, "total_tokens": 2300})
    );
    // Read as agentry reads a run: the same report, the session agreeing with stdout.
    assert_eq!(codex_report(&run.stdout, run.home.path(), CODEX_MODEL), r);
}

/// Every command line agentry builds for Codex is accepted: in and out of its sandbox, with
/// a base URL.
#[test]
fn codex_accepts_agentrys_command_lines() {
    for args in [
        codex_args_with(CODEX_MODEL, false, None),
        codex_args_with(CODEX_MODEL, true, None),
        codex_args_with(CODEX_MODEL, true, Some("http://127.0.0.1:9/v1")),
    ] {
        let run = run_fake("codex", &args, "Go");
        assert_eq!(run.code, Some(0), "{args:?}");
        let r = parse_codex(&run.stdout, CODEX_MODEL, &PriceTable::builtin());
        assert!(r.outcome.is_success(), "{args:?}: {:?}", r.outcome);
        let session = run.session();
        let sandbox = &records(&session, "turn_context")[0]["sandbox_policy"]["type"];
        let expected = if args.contains(&"--sandbox".to_owned()) {
            "workspace-write"
        } else {
            "danger-full-access"
        };
        assert_eq!(sandbox, expected, "{args:?}");
    }
}

/// `--full-auto` is gone from `codex exec`: refused with the real CLI's message, exit 2,
/// before anything runs.
#[test]
fn codex_refuses_full_auto() {
    let run = run_fake_any(
        "codex",
        &["exec", "--json", "--model", "gpt-5", "--full-auto", "-"].map(String::from),
        "Anything",
    );
    assert_eq!(run.code, Some(2));
    assert_eq!(run.stderr, fixture("codex_real_full_auto.txt"));
    assert_eq!(run.stdout, "");
    assert!(run.session().is_empty());
    assert_eq!(run.changes(), None);
}

#[test]
fn codex_version() {
    assert_eq!(version("codex"), "codex-cli 0.169.0\n");
}

#[test]
fn codex_prompt_with_quotes_backslashes_and_newlines_parses() {
    let (run, r) = codex("Use \"x\" \\ y\t{} it's $HOME `z`\nnext \"line\"");
    assert_eq!(r.outcome, AgentOutcome::Success, "{}", run.stdout);
    assert_eq!(
        r.final_text.as_deref(),
        Some("Done: Use \"x\" \\ y{} it's $HOME `z`")
    );
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(
        run.changes().as_deref(),
        Some("Use \"x\" \\ y\t{} it's $HOME `z`\n")
    );
    assert_json_lines(&run.stdout);
}

#[test]
fn codex_no_changes() {
    let (run, r) = codex("Read only [fake:no-changes]");
    assert_eq!(run.code, Some(0));
    assert!(r.outcome.is_success());
    assert_eq!(run.changes(), None);
    assert!(!run.stdout.contains("command_execution"));
}

#[test]
fn codex_fail() {
    let (run, r) = codex("Break [fake:fail]");
    assert_eq!(run.code, Some(1));
    match &r.outcome {
        AgentOutcome::Error(message) => assert!(message.contains("fake:fail"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(!r.outcome.is_success());
    assert_eq!(r.cost_usd, None);
    assert_eq!(run.changes(), None);
    assert!(records(&run.session(), "token_usage_record").is_empty());
}

/// `[fake:api-error=CODE]`: the real CLI's failed turn, the provider's JSON error as its
/// message, exit 1.
#[test]
fn codex_api_error() {
    let (run, r) = codex("Refused [fake:api-error=400]");
    assert_refused_with_400(&run, &r);
    assert_eq!(r.cost_usd, None);
    assert_eq!(run.changes(), None);
    let failed = last_event(&run.stdout, "turn.failed");
    let body: Value = serde_json::from_str(failed["error"]["message"].as_str().unwrap()).unwrap();
    assert_eq!(body["status"], 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    // No call was answered: nothing in the session file to price.
    let report = codex_report(&run.stdout, run.home.path(), CODEX_MODEL);
    assert_eq!(report.outcome, r.outcome);
    assert_eq!(report.cost_usd, None);
}

/// `[fake:reconnect=N]`: transport noise before a turn that succeeds.
#[test]
fn codex_reconnect_noise_before_a_successful_turn() {
    let (run, r) = codex("Flaky network [fake:reconnect=2]");
    assert_succeeded_at(&run, &r, "0.0049375");
    assert!(
        run.stdout
            .contains("{\"type\":\"error\",\"message\":\"Reconnecting... 2/5\"}")
    );
    assert_warned(&r, "Reconnecting");
}

#[test]
fn codex_garbage() {
    let (run, r) = codex("Whatever [fake:garbage]");
    assert_unparseable(&run, &r);
}

#[test]
fn codex_exit_code_and_model() {
    let run = run_fake("codex", &codex_args("gpt-5-mini"), "Go [fake:exit=3]");
    assert_eq!(run.code, Some(3));
    let r = parse_codex(&run.stdout, "gpt-5-mini", &PriceTable::builtin());
    assert!(r.outcome.is_success());
    assert!(run.home_file("args").lines().any(|l| l == "gpt-5-mini"));
    assert!(
        run.stdout
            .contains("Model metadata for `gpt-5-mini` not found.")
    );
    // gpt-5.5, whose metadata the CLI has, gets no such noise.
    let run = run_fake("codex", &codex_args("gpt-5.5"), "Go");
    assert!(!run.stdout.contains("Model metadata"), "{}", run.stdout);
    assert_eq!(
        records(&run.session(), "turn_context")[0]["model"],
        "gpt-5.5"
    );
}

/// `[fake:turns=N]`: N model calls in one turn, call k using k times the one-call usage;
/// one `turn.completed` at the end sums them, and the session file has each call.
#[test]
fn codex_turns_directive() {
    let (run, r) = codex("Long job\nDetails [fake:turns=3]");
    assert_ended(&run, &r, 0, AgentOutcome::Success);
    assert_eq!(r.turns, Some(1));
    // 1 + 2 + 3 = 6 times the one-call usage and cost.
    assert_eq!(
        (r.tokens.input, r.tokens.cache_read, r.tokens.output),
        (12_000, 3_000, 1_800)
    );
    assert_eq!(cost(&r).as_deref(), Some("0.029625"));
    assert_eq!(r.final_text.as_deref(), Some("Done: Long job"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(run.changes().as_deref(), Some("Long job\n"));
    let completed: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("\"turn.completed\""))
        .collect();
    assert_eq!(completed.len(), 1);
    assert_eq!(run.stdout.lines().last(), completed.first().copied());
    assert!(
        completed[0].contains("\"input_tokens\":12000,")
            && completed[0].contains("\"reasoning_output_tokens\":240}"),
        "{}",
        completed[0]
    );
    assert_eq!(run.stdout.matches("\"agent_message\"").count(), 3);

    // Each call in the session file: k units, its own response id, the running total.
    let session = run.session();
    let calls = records(&session, "token_usage_record");
    assert_eq!(calls.len(), 3);
    let ids: BTreeSet<&str> = calls
        .iter()
        .map(|c| c["response_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    for (k, call) in (1_i64..).zip(&calls) {
        assert_eq!(call["usage"]["input_tokens"], 2000 * k);
        assert_eq!(call["usage"]["output_tokens"], 300 * k);
        assert_eq!(
            call["turn_token_usage"]["input_tokens"],
            2000 * k * (k + 1) / 2
        );
        assert!(call["response_id"].as_str().unwrap().starts_with("resp_"));
    }
    let counts = records(&session, "event_msg")
        .into_iter()
        .filter(|p| p["type"] == "token_count")
        .count();
    assert_eq!(counts, 3);
    // The session agrees with stdout, but counts the calls as turns.
    assert_eq!(
        codex_report(&run.stdout, run.home.path(), CODEX_MODEL),
        RunReport {
            turns: Some(3),
            ..r
        },
        "the session agrees with stdout"
    );
}

/// `[fake:pause=S]`: after each call but the last the fake waits, so with a long pause only
/// a stop ends the run; its stdout then holds no usage (as the real CLI's), and its session
/// file prices the calls made before it.
#[tokio::test]
async fn codex_pause_directive_keeps_running_until_stopped() {
    let mut run = spawn_stoppable(
        "codex",
        codex_args(CODEX_MODEL),
        "Paused [fake:turns=2] [fake:pause=300]",
    );
    let home = run.home.path().to_owned();
    eventually_async(Duration::from_secs(20), "a call recorded", async || {
        !records(&session_lines(&home), "token_usage_record").is_empty()
    })
    .await;
    assert!(
        std::fs::read_to_string(&run.log)
            .unwrap()
            .contains("\"agent_message\"")
    );
    assert!(!run.task.is_finished(), "the fake did not keep running");
    let out = run.stop().await;
    assert_eq!(out.stdout.matches("\"turn.completed\"").count(), 0);
    assert_eq!(out.stdout.matches("\"agent_message\"").count(), 1);
    let r = codex_report(&out.stdout, &home, CODEX_MODEL);
    assert_eq!(cost(&r).as_deref(), Some("0.0049375"));
    assert_eq!((r.tokens.input, r.tokens.output), (2000, 300));
    // Without the session file nothing is known.
    let r = parse_codex(&out.stdout, CODEX_MODEL, &PriceTable::builtin());
    assert_eq!(r.cost_usd, None);
    // The session file says why it ended.
    let aborted: Vec<Value> = records(&session_lines(&home), "event_msg")
        .into_iter()
        .filter(|p| p["type"] == "turn_aborted")
        .cloned()
        .collect();
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0]["reason"], "interrupted");
}

/// `[fake:hold=S]`: every call made, then a wait before `turn.completed`: stopped there,
/// stdout has no usage and the session file has every call.
#[test]
fn codex_hold_directive_withholds_the_usage_until_the_end() {
    let mut live = codex_live(
        "Held [fake:turns=2] [fake:hold=60]",
        "\"text\":\"Done: Held",
    );
    eventually(Duration::from_secs(20), "both calls recorded", || {
        records(&session_lines(live.home.path()), "token_usage_record").len() >= 2
    });
    assert!(live.child.try_wait().unwrap().is_none(), "it did not hold");
    let (status, took) = live.signal(Signal::SIGINT);
    // Codex exits 1 on SIGINT, printing nothing more.
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(took < SIGNAL_DEADLINE);
    let (stdout, home, _) = live.finish();
    assert!(!stdout.contains("turn.completed"), "{stdout}");
    let r = codex_report(&stdout, home.path(), CODEX_MODEL);
    // 1 + 2 units.
    assert_eq!(cost(&r).as_deref(), Some("0.0148125"));
    assert!(matches!(r.outcome, AgentOutcome::Unparseable(_)), "{r:?}");
}

/// SIGTERM kills the fake Codex at once, with nothing more printed.
#[test]
fn codex_on_sigterm_dies_of_it() {
    let mut live = codex_live(
        "Terminated [fake:turns=2] [fake:pause=60]",
        "\"agent_message\"",
    );
    let (status, _) = live.signal(Signal::SIGTERM);
    assert_eq!(status.signal(), Some(15), "{status:?}");
    let (stdout, _, _) = live.finish();
    assert!(!stdout.contains("turn.completed"), "{stdout}");
}

// ---------------------------------------------------------------- [fake:sleep=N]

/// `[fake:sleep=1]` under `run_process`: the pid files, the init event live in the log
/// before the end, a normal result, and the background child killed with the group.
async fn sleep_directive(name: &str, args: Vec<String>, started_marker: &str) -> String {
    let start = Instant::now();
    let Spawned {
        home,
        log,
        cancel: _tx,
        task,
        cwd,
        _logs,
    } = spawn_fake(
        name,
        args,
        "Slow task [fake:sleep=1]",
        Duration::from_secs(60),
        Duration::from_secs(1),
    );

    // The start is visible in the log while the agent sleeps.
    eventually_async(Duration::from_secs(10), started_marker, async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let started = text.contains(started_marker);
        assert!(
            !started || !task.is_finished(),
            "the log showed nothing before the end"
        );
        started
    })
    .await;
    let out = task.await.unwrap().unwrap();
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.ended, EXITED_0);
    let agent_pid: u32 = std::fs::read_to_string(home.path().join("agent.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(agent_pid, out.pid);
    let child: i32 = std::fs::read_to_string(home.path().join("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The background `sleep 300` is gone (or an unreaped zombie).
    let what = format!("the end of background child {child}");
    eventually_async(Duration::from_secs(5), what, async || {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_ok();
        let zombie = std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        });
        !alive || zombie
    })
    .await;
    assert!(cwd.path().join("AGENT_CHANGES.md").exists());
    out.stdout
}

#[tokio::test]
async fn claude_sleep_directive() {
    let stdout = sleep_directive("claude", claude_args(CLAUDE_MODEL), "\"subtype\":\"init\"").await;
    let r = parse_claude(&stdout);
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(
        r.final_text.as_deref(),
        Some("Done: Slow task [fake:sleep=1]")
    );
}

#[tokio::test]
async fn codex_sleep_directive() {
    let stdout = sleep_directive("codex", codex_args(CODEX_MODEL), "\"turn.started\"").await;
    let r = parse_codex(&stdout, CODEX_MODEL, &PriceTable::builtin());
    assert_eq!(r.outcome, AgentOutcome::Success);
}

/// A Claude run cancelled by agentry (SIGINT first) reports what it spent: the cost of a
/// stopped run is known.
#[tokio::test]
async fn a_cancelled_claude_run_reports_its_cost_so_far() {
    let mut run = spawn_stoppable(
        "claude",
        claude_args(CLAUDE_MODEL),
        "Long [fake:sleep=300] [fake:cost=0.25]",
    );
    eventually_async(Duration::from_secs(20), "the init event", async || {
        std::fs::read_to_string(&run.log)
            .unwrap_or_default()
            .contains("\"subtype\":\"init\"")
    })
    .await;
    let out = run.stop().await;
    let r = parse_claude(&out.stdout);
    assert_eq!(cost(&r).as_deref(), Some("0.25"));
    assert!(
        matches!(r.outcome, AgentOutcome::Error(_)),
        "{:?}",
        r.outcome
    );
}

// ---------------------------------------------------------------- the real outputs' shape

/// The events of a JSON-lines output (non-JSON lines skipped).
fn events(output: &str) -> Vec<serde_json::Map<String, Value>> {
    output
        .lines()
        .filter_map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(object)) => Some(object),
            _ => None,
        })
        .collect()
}

fn types(events: &[serde_json::Map<String, Value>]) -> BTreeSet<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

type Event = serde_json::Map<String, Value>;

/// The keys of `event`, the one of type `kind` that was looked for.
fn keys(event: Option<&Event>, kind: &str) -> BTreeSet<String> {
    event
        .unwrap_or_else(|| panic!("no {kind} event"))
        .keys()
        .cloned()
        .collect()
}

/// The keys of the first event of type `kind`.
fn keys_of(events: &[Event], kind: &str) -> BTreeSet<String> {
    keys(events.iter().find(|e| e["type"] == kind), kind)
}

/// The keys of the last event of type `kind`.
fn keys_of_last(events: &[Event], kind: &str) -> BTreeSet<String> {
    keys(events.iter().rfind(|e| e["type"] == kind), kind)
}

/// Object keys at a path inside the first event of type `kind`.
fn nested_keys(
    events: &[serde_json::Map<String, Value>],
    kind: &str,
    path: &[&str],
) -> BTreeSet<String> {
    let event = events.iter().find(|e| e["type"] == kind).unwrap();
    let mut value = &event[path[0]];
    for key in &path[1..] {
        value = &value[*key];
    }
    value.as_object().unwrap().keys().cloned().collect()
}

/// The keys of the entries of a result event's `modelUsage`, all entries merged.
fn model_usage_keys(events: &[serde_json::Map<String, Value>]) -> BTreeSet<String> {
    let event = events.iter().find(|e| e["type"] == "result").unwrap();
    event["modelUsage"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v.as_object().unwrap().keys().cloned())
        .collect()
}

/// The content block types of the assistant events, in order.
fn block_types(events: &[serde_json::Map<String, Value>]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "assistant")
        .map(|e| {
            let content = e["message"]["content"].as_array().unwrap();
            assert_eq!(content.len(), 1, "one content block per assistant event");
            content[0]["type"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn claude_success_output_has_the_real_shape() {
    let real = events(&fixture("claude_real_success.jsonl"));
    let (run, _) = claude("Shape check");
    let fake = events(&run.stdout);
    assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
    assert_eq!(types(&fake), types(&real));
    for kind in ["system", "assistant", "user", "result"] {
        assert_eq!(keys_of(&fake, kind), keys_of(&real, kind), "{kind}");
    }
    for path in [&["usage"][..], &["usage", "cache_creation"]] {
        assert_eq!(
            nested_keys(&fake, "result", path),
            nested_keys(&real, "result", path),
            "{path:?}"
        );
    }
    for path in [&["message"][..], &["message", "usage"]] {
        assert_eq!(
            nested_keys(&fake, "assistant", path),
            nested_keys(&real, "assistant", path),
            "{path:?}"
        );
    }
    assert_eq!(
        nested_keys(&fake, "user", &["tool_use_result"]),
        nested_keys(&real, "user", &["tool_use_result"])
    );
    assert_eq!(model_usage_keys(&fake), model_usage_keys(&real));
    // The order of events: init first, a text and a tool call of one message, the tool's
    // result, the final text, the result last.
    assert_eq!(fake.first().unwrap()["subtype"], "init");
    assert_eq!(block_types(&fake), block_types(&real));
    let kinds = |events: &[serde_json::Map<String, Value>]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(kinds(&fake), kinds(&real));
    assert_eq!(fake[1]["message"]["id"], fake[2]["message"]["id"]);
    assert_ne!(fake[2]["message"]["id"], fake[4]["message"]["id"]);
    // Every event of the run carries its session id; every uuid is unique.
    let session = &fake[0]["session_id"];
    assert!(fake.iter().all(|e| &e["session_id"] == session));
    let uuids: BTreeSet<&str> = fake.iter().map(|e| e["uuid"].as_str().unwrap()).collect();
    assert_eq!(uuids.len(), fake.len());
    // The init event: the real CLI's lists.
    let (fake_init, real_init) = (&fake[0], &real[0]);
    for key in [
        "tools",
        "slash_commands",
        "agents",
        "skills",
        "claude_code_version",
    ] {
        assert_eq!(fake_init[key], real_init[key], "{key}");
    }
}

/// The error results of the fake have the fields of the real CLI's, directive by directive.
#[test]
fn claude_error_outputs_have_the_real_shape() {
    let success_types = types(&events(&fixture("claude_real_success.jsonl")));
    for (directive, fixture_name) in [
        ("[fake:fail]", "claude_real_sigint.jsonl"),
        ("[fake:max-turns]", "claude_real_max_turns.jsonl"),
        ("[fake:max-budget]", "claude_real_max_budget.jsonl"),
        ("[fake:api-error=400]", "claude_real_api_error.jsonl"),
    ] {
        let real = events(&fixture(fixture_name));
        let (run, _) = claude(&format!("Shape check {directive}"));
        let fake = events(&run.stdout);
        assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
        let real_result = real.iter().find(|e| e["type"] == "result").unwrap();
        let fake_result = fake.iter().find(|e| e["type"] == "result").unwrap();
        if directive != "[fake:fail]" {
            assert_eq!(
                fake_result["subtype"], real_result["subtype"],
                "{directive}"
            );
        }
        assert_eq!(
            fake_result["is_error"], real_result["is_error"],
            "{directive}"
        );
        assert_eq!(
            keys_of(&fake, "result"),
            keys_of(&real, "result"),
            "{directive}"
        );
        let known: BTreeSet<String> = types(&real).union(&success_types).cloned().collect();
        assert!(types(&fake).is_subset(&known), "{directive}");
        assert_eq!(
            model_usage_keys(&fake),
            model_usage_keys(&real),
            "{directive}"
        );
        assert_eq!(fake.last().unwrap()["type"], "result", "{directive}");
    }
    // The API error's synthetic assistant message.
    let real = events(&fixture("claude_real_api_error.jsonl"));
    let (run, _) = claude("Shape check [fake:api-error=400]");
    let fake = events(&run.stdout);
    assert_eq!(keys_of(&fake, "assistant"), keys_of(&real, "assistant"));
    assert_eq!(
        nested_keys(&fake, "assistant", &["message"]),
        nested_keys(&real, "assistant", &["message"])
    );
    assert_eq!(fake[1]["message"]["model"], "<synthetic>");
}

#[test]
fn codex_outputs_have_the_real_shape() {
    let real = events(&fixture("codex_real_exec.jsonl"));
    for prompt in [
        "Shape check",
        "Shape check [fake:turns=3]",
        "Shape check [fake:no-changes] [fake:reconnect=1]",
    ] {
        codex_success_shape(&real, prompt);
    }

    let failed = events(&fixture("codex_real_api_error.jsonl"));
    for directive in ["[fake:fail]", "[fake:api-error=400]"] {
        let (run, _) = codex(&format!("Shape check {directive}"));
        let fake = events(&run.stdout);
        assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
        assert_eq!(types(&fake), types(&failed), "{directive}");
        for kind in ["thread.started", "item.completed", "error", "turn.failed"] {
            assert_eq!(keys_of(&fake, kind), keys_of(&failed, kind), "{kind}");
        }
        assert_eq!(
            nested_keys(&fake, "turn.failed", &["error"]),
            nested_keys(&failed, "turn.failed", &["error"])
        );
        assert_eq!(fake.last().unwrap()["type"], "turn.failed");
    }
    let (run, _) = codex("Shape check [fake:api-error=400]");
    let fake = events(&run.stdout);
    let body = |events: &[serde_json::Map<String, Value>]| -> BTreeSet<String> {
        let event = events.iter().find(|e| e["type"] == "turn.failed").unwrap();
        let body: Value =
            serde_json::from_str(event["error"]["message"].as_str().unwrap()).unwrap();
        body.as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(body(&fake), body(&failed));
}

/// A successful output of the fake codex has the shape of the real one: the same event
/// types and keys, each kind of item with the real keys, one turn started and completed
/// last.
fn codex_success_shape(real: &[serde_json::Map<String, Value>], prompt: &str) {
    let (run, _) = codex(prompt);
    let fake = events(&run.stdout);
    assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
    let mut known = types(real);
    known.insert("error".into());
    assert!(types(&fake).is_subset(&known), "{:?}", types(&fake));
    for kind in ["thread.started", "turn.started", "turn.completed"] {
        assert_eq!(keys_of(&fake, kind), keys_of(real, kind), "{kind}");
    }
    assert_eq!(
        nested_keys(&fake, "turn.completed", &["usage"]),
        nested_keys(real, "turn.completed", &["usage"]),
        "{prompt}"
    );
    // Each kind of item has the real keys.
    let item_keys = |events: &[serde_json::Map<String, Value>],
                     kind: &str|
     -> BTreeMap<String, BTreeSet<String>> {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| {
                let item = e["item"].as_object().unwrap();
                (
                    item["type"].as_str().unwrap().to_owned(),
                    item.keys().cloned().collect(),
                )
            })
            .collect()
    };
    for kind in ["item.started", "item.completed"] {
        let real_items = item_keys(real, kind);
        for (item, keys) in item_keys(&fake, kind) {
            assert_eq!(Some(&keys), real_items.get(&item), "{kind} {item}");
        }
    }
    // One turn: started after thread.started (and the metadata noise), completed last.
    let turn_events: Vec<&str> = fake
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|t| t.starts_with("turn."))
        .collect();
    assert_eq!(turn_events, ["turn.started", "turn.completed"], "{prompt}");
    let ids: Vec<&str> = fake
        .iter()
        .filter(|e| e["type"] == "item.completed")
        .map(|e| e["item"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "{prompt}"
    );
    assert_eq!(fake[0]["type"], "thread.started");
    assert_eq!(fake[1]["item"]["type"], "error");
    assert_eq!(fake[2]["type"], "turn.started");
    assert_eq!(fake.last().unwrap()["type"], "turn.completed");
}

/// The fake's session file has the lines agentry reads with the real file's fields.
#[test]
fn codex_session_file_has_the_real_shape() {
    let real: Vec<Value> = fixture("codex_real_sigint_rollout.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (run, _) = codex("Shape check [fake:turns=2]");
    let fake = run.session();
    let keys = |v: &Value| -> BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };
    let first = |lines: &[Value], kind: &str| -> Value {
        lines.iter().find(|l| l["type"] == kind).unwrap().clone()
    };
    assert_eq!(fake[0]["type"], "session_meta");
    // Every line: timestamp, ordinal, type, payload.
    for kind in [
        "session_meta",
        "event_msg",
        "turn_context",
        "token_usage_record",
    ] {
        assert_eq!(
            keys(&first(&fake, kind)),
            keys(&first(&real, kind)),
            "{kind}"
        );
    }
    // What agentry reads: the model of the turn, and each call's usage.
    for lines in [&fake, &real] {
        assert!(first(lines, "turn_context")["payload"]["model"].is_string());
    }
    let (fake_call, real_call) = (
        first(&fake, "token_usage_record"),
        first(&real, "token_usage_record"),
    );
    assert_eq!(keys(&fake_call["payload"]), keys(&real_call["payload"]));
    for usage in ["usage", "turn_token_usage", "thread_token_usage"] {
        assert_eq!(
            keys(&fake_call["payload"][usage]),
            keys(&real_call["payload"][usage]),
            "{usage}"
        );
    }
    let token_count = |lines: &[Value]| -> Value {
        lines
            .iter()
            .find(|l| l["payload"]["type"] == "token_count")
            .unwrap()["payload"]
            .clone()
    };
    assert_eq!(
        keys(&token_count(&fake)["info"]),
        keys(&token_count(&real)["info"])
    );
    // Lines are numbered in order, as the real file's.
    let ordinals: Vec<i64> = fake
        .iter()
        .map(|l| l["ordinal"].as_i64().unwrap())
        .collect();
    assert_eq!(ordinals, (0..).take(fake.len()).collect::<Vec<i64>>());
    assert!(real.iter().all(|l| l["ordinal"].is_i64()));
}

#[test]
fn fakes_are_executable() {
    use std::os::unix::fs::PermissionsExt;
    for name in ["claude", "codex"] {
        let mode = std::fs::metadata(fake(name)).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "{name} is not executable");
    }
}

/// The environment of a fake agent: `PATH` and `HOME`.
fn agent_env(home: &Path) -> Vec<(String, String)> {
    vec![
        ("PATH".to_owned(), PATH.to_owned()),
        ("HOME".to_owned(), home.display().to_string()),
    ]
}

/// A fake agent started under [`run_process`] in fresh directories, with its cancel switch.
struct Spawned {
    home: tempfile::TempDir,
    log: PathBuf,
    cancel: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<ProcessOutcome, ProcessError>>,
    /// Its working directory.
    cwd: tempfile::TempDir,
    /// The log's directory, kept for the run.
    _logs: tempfile::TempDir,
}

/// [`spawn_fake`] with a wall time of 10 minutes and a stop grace of 5 s: a run that only
/// a stop ends.
fn spawn_stoppable(name: &str, args: Vec<String>, stdin: &str) -> Spawned {
    spawn_fake(
        name,
        args,
        stdin,
        Duration::from_secs(600),
        Duration::from_secs(5),
    )
}

impl Spawned {
    /// Cancels the run and waits for it: cancelled, and by the SIGINT sent first, not the
    /// SIGTERM that would follow the 5 s grace of [`spawn_stoppable`].
    async fn stop(&mut self) -> ProcessOutcome {
        let stopping = Instant::now();
        self.cancel.send(true).unwrap();
        let out = (&mut self.task).await.unwrap().unwrap();
        assert_eq!(out.ended, Ended::Cancelled);
        assert!(
            stopping.elapsed() < Duration::from_secs(5),
            "{:?}",
            stopping.elapsed()
        );
        out
    }
}

/// Starts the fake `name` with `args` and the prompt `stdin` under `run_process`, with a
/// wall-time limit `wall` and a stop grace `grace`.
fn spawn_fake(
    name: &str,
    args: Vec<String>,
    stdin: &str,
    wall: Duration,
    grace: Duration,
) -> Spawned {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("run.log");
    let cmd = AgentCommand {
        program: fake(name),
        args,
        stdin: stdin.to_owned(),
        cwd: cwd.path().to_owned(),
        env: agent_env(home.path()),
        stop: StopTarget::Group,
        pass_fds: Vec::new(),
        user: None,
    };
    let limits = Limits {
        wall_time: wall,
        stop_grace: grace,
    };
    let (cancel, rx) = watch::channel(false);
    let log2 = log.clone();
    let task = tokio::spawn(async move { run_process(cmd, &log2, limits, rx, |_| {}).await });
    Spawned {
        home,
        log,
        cancel,
        task,
        cwd,
        _logs: logs,
    }
}
