//! The fake `claude` and `codex` executables of `tests/fake-agents/`: each directive gives
//! the output the parsers expect, and the output keeps the shape of the recorded fixtures
//! so the fakes cannot drift from the real formats.
#![allow(
    clippy::unwrap_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{PATH, fake};
use agentry_runner::process::{AgentCommand, Ended, Limits, StopTarget, run_process};
use agentry_runner::{AgentOutcome, PriceTable, RunReport, parse_claude, parse_codex};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::watch;

const CLAUDE_MODEL: &str = "claude-sonnet-4-5-20250929";
const CODEX_MODEL: &str = "gpt-5-codex";

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn claude_args(model: &str) -> Vec<String> {
    [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        model,
        "--max-turns",
        "30",
        "--max-budget-usd",
        "2.5",
        "--permission-mode",
        "acceptEdits",
    ]
    .map(String::from)
    .to_vec()
}

fn codex_args(model: &str) -> Vec<String> {
    ["exec", "--json", "--model", model, "--full-auto", "-"]
        .map(String::from)
        .to_vec()
}

/// One finished run of a fake.
struct Run {
    stdout: String,
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
}

/// Runs a fake with only `PATH` and `HOME` (a fresh directory), in a fresh directory.
fn run_fake(name: &str, args: &[String], prompt: &str) -> Run {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(fake(name))
        .args(args)
        .current_dir(cwd.path())
        .env_clear()
        .env("PATH", PATH)
        .env("HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(prompt.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        code: output.status.code(),
        home,
        cwd,
    }
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

fn cost(report: &RunReport) -> Option<String> {
    report.cost_usd.map(|c| c.to_string())
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

// ---------------------------------------------------------------- claude

#[test]
fn claude_success() {
    let (run, r) = claude("Fix the bug in parse\nMore details here.");
    assert_eq!(run.code, Some(0));
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(cost(&r).as_deref(), Some("0.123456"));
    assert_eq!(r.input_tokens, 1200 + 5000 + 800);
    assert_eq!(r.cache_read_tokens, 5000);
    assert_eq!(r.cache_write_tokens, 800);
    assert_eq!(r.output_tokens, 340);
    assert_eq!(r.model.as_deref(), Some(CLAUDE_MODEL));
    assert_eq!(r.turns, Some(3));
    assert_eq!(r.final_text.as_deref(), Some("Done: Fix the bug in parse"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(run.changes().as_deref(), Some("Fix the bug in parse\n"));
    assert_eq!(
        run.home_file("args"),
        claude_args(CLAUDE_MODEL).join("\n") + "\n"
    );
    assert_minimal_env(&run);
}

#[test]
fn claude_reports_the_model_it_was_given_and_its_cwd() {
    let run = run_fake("claude", &claude_args("claude-opus-4-1-20250805"), "Task");
    let r = parse_claude(&run.stdout);
    assert_eq!(r.model.as_deref(), Some("claude-opus-4-1-20250805"));
    let init: Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(init["model"], "claude-opus-4-1-20250805");
    let cwd = PathBuf::from(init["cwd"].as_str().unwrap());
    assert_eq!(
        cwd.canonicalize().unwrap(),
        run.cwd.path().canonicalize().unwrap()
    );
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
    for line in run.stdout.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

#[test]
fn claude_prompt_with_quotes_is_written_to_the_changes_file() {
    let (run, r) = claude("Say \"hi\" \\o/\nrest");
    assert!(r.outcome.is_success());
    assert_eq!(run.changes().as_deref(), Some("Say \"hi\" \\o/\n"));
    for line in run.stdout.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

#[test]
fn claude_appends_to_an_existing_changes_file() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("AGENT_CHANGES.md"), "earlier\n").unwrap();
    let status = Command::new(fake("claude"))
        .args(claude_args(CLAUDE_MODEL))
        .current_dir(cwd.path())
        .env_clear()
        .env("PATH", PATH)
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("AGENT_CHANGES.md")).unwrap(),
        "earlier\n\n"
    );
}

#[test]
fn claude_cost_directive() {
    let (run, r) = claude("Cheap one [fake:cost=1.5]");
    assert_eq!(run.code, Some(0));
    assert!(r.outcome.is_success());
    assert_eq!(cost(&r).as_deref(), Some("1.5"));
    let (_, r) = claude("Precise [fake:cost=0.000000001]");
    assert_eq!(cost(&r).as_deref(), Some("0.000000001"));
}

#[test]
fn claude_no_changes() {
    let (run, r) = claude("Look only [fake:no-changes]");
    assert_eq!(run.code, Some(0));
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(cost(&r).as_deref(), Some("0.123456"));
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
    assert_eq!(r.output_tokens, 340);
    assert_eq!(run.changes(), None);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn claude_max_turns() {
    let (run, r) = claude("Long task [fake:max-turns]");
    assert_eq!(run.code, Some(1));
    assert_eq!(r.outcome, AgentOutcome::MaxTurns);
    assert_eq!(r.turns, Some(30));
    assert_eq!(cost(&r).as_deref(), Some("0.123456"));
    assert_eq!(r.final_text, None);
    assert!(run.changes().is_some());
}

#[test]
fn claude_max_budget() {
    let (run, r) = claude("Costly task [fake:max-budget] [fake:cost=2.5]");
    assert_eq!(run.code, Some(1));
    assert_eq!(r.outcome, AgentOutcome::MaxBudget);
    assert_eq!(cost(&r).as_deref(), Some("2.5"));
}

#[test]
fn claude_garbage() {
    let (run, r) = claude("Whatever [fake:garbage]");
    assert_eq!(run.code, Some(0));
    assert!(matches!(r.outcome, AgentOutcome::Unparseable(_)), "{r:?}");
    assert_eq!(r.cost_usd, None);
    assert_eq!(run.changes(), None);
}

#[test]
fn claude_exit_code() {
    let (run, r) = claude("Odd exit [fake:exit=7]");
    assert_eq!(run.code, Some(7));
    assert_eq!(r.outcome, AgentOutcome::Success);
    let (run, r) = claude("Odd fail [fake:fail] [fake:exit=0]");
    assert_eq!(run.code, Some(0));
    assert!(matches!(r.outcome, AgentOutcome::Error(_)));
}

// ---------------------------------------------------------------- codex

#[test]
fn codex_success() {
    let (run, r) = codex("Implement the feature\nDetails.");
    assert_eq!(run.code, Some(0));
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(r.input_tokens, 2000);
    assert_eq!(r.cache_read_tokens, 500);
    assert_eq!(r.cache_write_tokens, 0);
    assert_eq!(r.output_tokens, 300);
    assert_eq!(r.turns, Some(1));
    assert_eq!(r.model.as_deref(), Some(CODEX_MODEL));
    // (1500 × 1.25 + 500 × 0.125 + 300 × 10) / 10⁶
    assert_eq!(cost(&r).as_deref(), Some("0.0049375"));
    assert_eq!(r.final_text.as_deref(), Some("Done: Implement the feature"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(run.changes().as_deref(), Some("Implement the feature\n"));
    assert_eq!(
        run.home_file("args"),
        codex_args(CODEX_MODEL).join("\n") + "\n"
    );
    assert_minimal_env(&run);
}

#[test]
fn codex_prompt_with_quotes_backslashes_and_newlines_parses() {
    let (run, r) = codex("Use \"x\" \\ y\t{}\nnext \"line\"");
    assert_eq!(r.outcome, AgentOutcome::Success, "{}", run.stdout);
    assert_eq!(r.final_text.as_deref(), Some("Done: Use \"x\" \\ y{}"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn codex_no_changes() {
    let (run, r) = codex("Read only [fake:no-changes]");
    assert_eq!(run.code, Some(0));
    assert!(r.outcome.is_success());
    assert_eq!(run.changes(), None);
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
    assert_eq!(run.changes(), None);
}

#[test]
fn codex_garbage() {
    let (run, r) = codex("Whatever [fake:garbage]");
    assert_eq!(run.code, Some(0));
    assert!(matches!(r.outcome, AgentOutcome::Unparseable(_)), "{r:?}");
    assert_eq!(r.cost_usd, None);
}

#[test]
fn codex_exit_code_and_model() {
    let run = run_fake("codex", &codex_args("gpt-5-mini"), "Go [fake:exit=3]");
    assert_eq!(run.code, Some(3));
    let r = parse_codex(&run.stdout, "gpt-5-mini", &PriceTable::builtin());
    assert!(r.outcome.is_success());
    assert!(run.home_file("args").lines().any(|l| l == "gpt-5-mini"));
}

/// `[fake:turns=N]`: N turns, turn k using k times the one-turn usage, the last message
/// the final text.
#[test]
fn codex_turns_directive() {
    let (run, r) = codex("Long job\nDetails [fake:turns=3]");
    assert_eq!(run.code, Some(0));
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(r.turns, Some(3));
    // 1 + 2 + 3 = 6 times the one-turn usage and cost.
    assert_eq!(
        (r.input_tokens, r.cache_read_tokens, r.output_tokens),
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
    assert_eq!(completed.len(), 3);
    assert!(
        completed[2].contains("\"input_tokens\":6000"),
        "{}",
        completed[2]
    );
}

/// `[fake:pause=S]`: after each usage event but the last the fake waits, so with a long
/// pause only a stop ends the run; the output then holds the turns printed before it.
#[tokio::test]
async fn codex_pause_directive_keeps_running_until_stopped() {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("run.log");
    let cmd = AgentCommand {
        program: fake("codex"),
        args: codex_args(CODEX_MODEL),
        stdin: "Paused [fake:turns=2] [fake:pause=300]".into(),
        cwd: cwd.path().to_owned(),
        env: agent_env(home.path()),
        stop: StopTarget::Group,
    };
    let limits = Limits {
        wall_time: Duration::from_secs(600),
        stop_grace: Duration::from_secs(1),
    };
    let (cancel, rx) = watch::channel(false);
    let log2 = log.clone();
    let task = tokio::spawn(async move { run_process(cmd, &log2, limits, rx, |_| {}).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("\"turn.completed\"")
    {
        assert!(Instant::now() < deadline, "no usage event");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!task.is_finished(), "the fake did not keep running");
    cancel.send(true).unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.ended, Ended::Cancelled);
    assert_eq!(out.stdout.matches("\"turn.completed\"").count(), 1);
    let r = parse_codex(&out.stdout, CODEX_MODEL, &PriceTable::builtin());
    assert_eq!(cost(&r).as_deref(), Some("0.0049375"));
}

// ---------------------------------------------------------------- [fake:sleep=N]

/// `[fake:sleep=1]` under `run_process`: the pid files, the init event live in the log
/// before the end, a normal result, and the background child killed with the group.
async fn sleep_directive(name: &str, args: Vec<String>, started_marker: &str) -> String {
    let home = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("run.log");
    let cmd = AgentCommand {
        program: fake(name),
        args,
        stdin: "Slow task [fake:sleep=1]".into(),
        cwd: cwd.path().to_owned(),
        env: agent_env(home.path()),
        stop: StopTarget::Group,
    };
    let limits = Limits {
        wall_time: Duration::from_secs(60),
        stop_grace: Duration::from_secs(1),
    };
    let (_tx, rx) = watch::channel(false);
    let log2 = log.clone();
    let start = Instant::now();
    let task = tokio::spawn(async move { run_process(cmd, &log2, limits, rx, |_| {}).await });

    // The start is visible in the log while the agent sleeps.
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(started_marker) {
            assert!(!task.is_finished(), "the log showed nothing before the end");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = task.await.unwrap().unwrap();
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        out.ended,
        Ended::Exited {
            code: Some(0),
            signal: None
        }
    );
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
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_ok();
        let zombie = std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        });
        if !alive || zombie {
            break;
        }
        assert!(Instant::now() < deadline, "background child {child} lives");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

// ---------------------------------------------------------------- the fixtures' shape

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

/// The keys of the first event of type `kind` (and, for `result`/`system`, the given subtype).
fn keys_of(events: &[serde_json::Map<String, Value>], kind: &str) -> BTreeSet<String> {
    events
        .iter()
        .find(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event"))
        .keys()
        .cloned()
        .collect()
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

/// The keys of the (only) entry of a result event's `modelUsage`, all entries merged.
fn model_usage_keys(events: &[serde_json::Map<String, Value>]) -> BTreeSet<String> {
    let event = events.iter().find(|e| e["type"] == "result").unwrap();
    event["modelUsage"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v.as_object().unwrap().keys().cloned())
        .collect()
}

#[test]
fn claude_success_output_has_the_fixture_shape() {
    let fixture = events(&fixture("claude_success.jsonl"));
    let (run, _) = claude("Shape check");
    let fake = events(&run.stdout);
    assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
    assert_eq!(types(&fake), types(&fixture));
    assert_eq!(keys_of(&fake, "result"), keys_of(&fixture, "result"));
    assert_eq!(keys_of(&fake, "system"), keys_of(&fixture, "system"));
    assert_eq!(keys_of(&fake, "assistant"), keys_of(&fixture, "assistant"));
    assert_eq!(keys_of(&fake, "user"), keys_of(&fixture, "user"));
    assert_eq!(
        nested_keys(&fake, "result", &["usage"]),
        nested_keys(&fixture, "result", &["usage"])
    );
    assert_eq!(
        nested_keys(&fake, "assistant", &["message"]),
        nested_keys(&fixture, "assistant", &["message"])
    );
    assert_eq!(model_usage_keys(&fake), model_usage_keys(&fixture));
    // The order of events: init first, result last.
    assert_eq!(fake.first().unwrap()["subtype"], "init");
    assert_eq!(fake.last().unwrap()["type"], "result");
}

#[test]
fn claude_error_outputs_have_the_fixture_shape() {
    let success_types = types(&events(&fixture("claude_success.jsonl")));
    for (directive, fixture_name) in [
        ("[fake:fail]", "claude_error_during_execution.jsonl"),
        ("[fake:max-turns]", "claude_max_turns.jsonl"),
        ("[fake:max-budget]", "claude_max_budget.jsonl"),
    ] {
        let fixture = events(&fixture(fixture_name));
        let (run, _) = claude(&format!("Shape check {directive}"));
        let fake = events(&run.stdout);
        assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
        let fixture_result = fixture.iter().find(|e| e["type"] == "result").unwrap();
        let fake_result = fake.iter().find(|e| e["type"] == "result").unwrap();
        assert_eq!(
            fake_result["subtype"], fixture_result["subtype"],
            "{directive}"
        );
        assert_eq!(
            fake_result["is_error"], fixture_result["is_error"],
            "{directive}"
        );
        assert_eq!(
            keys_of(&fake, "result"),
            keys_of(&fixture, "result"),
            "{directive}"
        );
        // The fixtures differ in which of assistant/user events they hold.
        let known: BTreeSet<String> = types(&fixture).union(&success_types).cloned().collect();
        assert!(types(&fake).is_subset(&known), "{directive}");
        assert_eq!(
            model_usage_keys(&fake),
            model_usage_keys(&fixture),
            "{directive}"
        );
    }
}

#[test]
fn codex_outputs_have_the_fixture_shape() {
    let success = events(&fixture("codex_success.jsonl"));
    for prompt in ["Shape check", "Shape check [fake:turns=3]"] {
        codex_success_shape(&success, prompt);
    }

    let failed = events(&fixture("codex_turn_failed.jsonl"));
    let (run, _) = codex("Shape check [fake:fail]");
    let fake = events(&run.stdout);
    assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
    assert!(types(&fake).is_subset(&types(&failed).union(&types(&success)).cloned().collect()));
    for kind in ["error", "turn.failed"] {
        assert_eq!(keys_of(&fake, kind), keys_of(&failed, kind), "{kind}");
    }
    assert_eq!(
        nested_keys(&fake, "turn.failed", &["error"]),
        nested_keys(&failed, "turn.failed", &["error"])
    );
    assert_eq!(fake.last().unwrap()["type"], "turn.failed");
}

/// A successful output of the fake codex has the shape of the fixture: the same event
/// types and keys, each kind of item with the fixture's keys, each turn started before it
/// completes.
fn codex_success_shape(success: &[serde_json::Map<String, Value>], prompt: &str) {
    let (run, _) = codex(prompt);
    let fake = events(&run.stdout);
    assert_eq!(run.stdout.lines().count(), fake.len(), "every line is JSON");
    assert!(
        types(&fake).is_subset(&types(success)),
        "{:?}",
        types(&fake)
    );
    for kind in ["thread.started", "turn.started", "turn.completed"] {
        assert_eq!(keys_of(&fake, kind), keys_of(success, kind), "{kind}");
    }
    for event in fake.iter().filter(|e| e["type"] == "turn.completed") {
        let keys: BTreeSet<String> = event["usage"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            keys,
            nested_keys(success, "turn.completed", &["usage"]),
            "{prompt}"
        );
    }
    // Each kind of item has the fixture's keys.
    let item_keys =
        |events: &[serde_json::Map<String, Value>]| -> BTreeMap<String, BTreeSet<String>> {
            events
                .iter()
                .filter(|e| e["type"] == "item.completed")
                .map(|e| {
                    let item = e["item"].as_object().unwrap();
                    (
                        item["type"].as_str().unwrap().to_owned(),
                        item.keys().cloned().collect(),
                    )
                })
                .collect()
        };
    let fixture_items = item_keys(success);
    for (kind, keys) in item_keys(&fake) {
        assert_eq!(Some(&keys), fixture_items.get(&kind), "item {kind}");
    }
    // Turns alternate: started, then completed; item ids are unique.
    let turn_events: Vec<&str> = fake
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|t| t.starts_with("turn."))
        .collect();
    for pair in turn_events.chunks(2) {
        assert_eq!(pair, ["turn.started", "turn.completed"], "{prompt}");
    }
    let ids: Vec<&str> = fake
        .iter()
        .filter_map(|e| e.get("item").and_then(|i| i["id"].as_str()))
        .collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "{prompt}"
    );
    assert_eq!(fake.first().unwrap()["type"], "thread.started");
    assert_eq!(fake.last().unwrap()["type"], "turn.completed");
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
