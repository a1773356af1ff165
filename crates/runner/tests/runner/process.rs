//! `run_process`: output capture and log files, stdin, the exact environment, exit
//! statuses, wall time, cancellation, killing the whole process group, large output; and
//! `agent_env`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentry_runner::agent::{MAX_LINE_BYTES, OutputParser};
use agentry_runner::process::{
    AgentCommand, Ended, LOG_FILE_CAP, Limits, ProcessError, ProcessOutcome, STDERR_TAIL_BYTES,
    STDOUT_MEMORY_CAP, StopTarget, rotated_log_path, run_process, run_process_with,
    stderr_log_path,
};
use agentry_runner::{AgentOutcome, RunReport};
use agentry_testkit::wait::{eventually, eventually_async};

use crate::support::{EXITED_0, PATH};
use tokio::sync::watch;

/// `sh -c script` in `dir`, with only `PATH` and `HOME` set.
fn sh(dir: &Path, script: &str) -> AgentCommand {
    AgentCommand {
        program: PathBuf::from("sh"),
        args: vec!["-c".into(), script.into()],
        stdin: String::new(),
        cwd: dir.to_owned(),
        env: vec![
            ("PATH".into(), PATH.into()),
            ("HOME".into(), dir.display().to_string()),
        ],
        stop: StopTarget::Group,
        pass_fds: Vec::new(),
        user: None,
    }
}

fn limits(wall_secs: f64) -> Limits {
    Limits {
        wall_time: Duration::from_secs_f64(wall_secs),
        stop_grace: Duration::from_millis(500),
    }
}

/// Runs `cmd` with a cancel channel nobody uses, logging to `dir/logs/run.log`.
async fn run(cmd: AgentCommand, dir: &Path, limits: Limits) -> ProcessOutcome {
    let (_tx, rx) = watch::channel(false);
    run_cancellable(cmd, &dir.join("logs"), limits, rx)
        .await
        .unwrap()
}

/// Runs `cmd` logging to `log_dir/run.log`, cancelled when `cancel` turns true.
async fn run_cancellable(
    cmd: AgentCommand,
    log_dir: &Path,
    limits: Limits,
    cancel: watch::Receiver<bool>,
) -> Result<ProcessOutcome, ProcessError> {
    run_process(cmd, &log_dir.join("run.log"), limits, cancel, |_| {}).await
}

/// Runs `script` in `dir` with 300 ms of wall time and `grace` between the stop signals;
/// checks that it timed out within 10 s having printed `stdout`, and returns how long it
/// took.
async fn run_past_wall_time(dir: &Path, script: &str, grace: Duration, stdout: &str) -> Duration {
    let start = Instant::now();
    let out = run(
        sh(dir, script),
        dir,
        Limits {
            wall_time: Duration::from_millis(300),
            stop_grace: grace,
        },
    )
    .await;
    let elapsed = start.elapsed();
    assert_eq!(out.ended, Ended::TimedOut);
    assert_eq!(out.stdout, stdout);
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    elapsed
}

/// Whether `pid` is gone: no such process, or a zombie nobody reaped yet (in a container
/// pid 1 may not reap orphans).
fn gone(pid: i32) -> bool {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Err(nix::errno::Errno::ESRCH) => true,
        _ => std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                // "pid (comm) S …": the state follows the last ')'.
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
            })
            .unwrap_or(true),
    }
}

/// Waits up to 5 s for `pid` to be gone.
fn wait_gone(pid: i32) {
    eventually(Duration::from_secs(5), format!("the end of {pid}"), || {
        gone(pid)
    });
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn output_is_captured_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut started = None;
    let (_tx, rx) = watch::channel(false);
    let log = dir.path().join("deep/er/run.log");
    let out = run_process(
        sh(dir.path(), "echo one; echo two; echo oops >&2; exit 0"),
        &log,
        limits(30.0),
        rx,
        |pid| started = Some(pid),
    )
    .await
    .unwrap();
    assert_eq!(out.ended, EXITED_0);
    assert_eq!(out.stdout, "one\ntwo\n");
    assert!(!out.stdout_truncated);
    assert_eq!(out.stdout_bytes, 8);
    assert_eq!(out.stderr_tail, "oops\n");
    assert_eq!(started, Some(out.pid));
    assert!(out.pid > 0);
    assert_eq!(out.log_error, None);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\ntwo\n");
    assert_eq!(
        std::fs::read_to_string(stderr_log_path(&log)).unwrap(),
        "oops\n"
    );
    assert_eq!(
        stderr_log_path(&log),
        dir.path().join("deep/er/run.log.stderr")
    );
}

#[tokio::test]
async fn log_file_is_truncated_and_written_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.log");
    std::fs::write(&log, "old content that must go\n").unwrap();
    let (_tx, rx) = watch::channel(false);
    let log2 = log.clone();
    let task = tokio::spawn(async move {
        run_process(
            sh(&std::env::temp_dir(), "echo early; sleep 2; echo late"),
            &log2,
            limits(30.0),
            rx,
            |_| {},
        )
        .await
    });
    // The first line is on disk long before the process ends.
    let what = "the first line in the log while the process ran";
    eventually_async(Duration::from_millis(1500), what, async || {
        std::fs::read_to_string(&log).unwrap_or_default() == "early\n"
    })
    .await;
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.stdout, "early\nlate\n");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "early\nlate\n");
}

#[tokio::test]
async fn prompt_arrives_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sh(dir.path(), "cat; echo; echo \"cwd=$(pwd)\"");
    cmd.stdin = "line \"one\"\nline \\two\n".into();
    let out = run(cmd, dir.path(), limits(30.0)).await;
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(
        out.stdout,
        format!("line \"one\"\nline \\two\n\ncwd={}\n", cwd.display())
    );
}

#[tokio::test]
async fn a_process_that_does_not_read_stdin_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sh(dir.path(), "echo ignored");
    cmd.stdin = "x".repeat(1024 * 1024);
    let out = run(cmd, dir.path(), limits(30.0)).await;
    assert_eq!(out.stdout, "ignored\n");
}

#[tokio::test]
async fn environment_is_exactly_the_given_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sh(dir.path(), "env");
    cmd.env
        .push(("AGENTRY_TEST_KEY".into(), "s3cret value".into()));
    let out = run(cmd, dir.path(), limits(30.0)).await;
    let mut seen = BTreeSet::new();
    for line in out.stdout.lines() {
        let (name, value) = line.split_once('=').unwrap();
        match name {
            "PATH" => assert_eq!(value, PATH),
            "HOME" => assert_eq!(value, dir.path().display().to_string()),
            "AGENTRY_TEST_KEY" => assert_eq!(value, "s3cret value"),
            // Set by sh itself.
            "PWD" | "SHLVL" | "_" => {}
            other => panic!("unexpected variable {other} in {}", out.stdout),
        }
        seen.insert(name.to_owned());
    }
    for name in ["PATH", "HOME", "AGENTRY_TEST_KEY"] {
        assert!(seen.contains(name), "{name} missing from {}", out.stdout);
    }
}

#[tokio::test]
async fn exit_code_and_signal_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(sh(dir.path(), "echo bye; exit 3"), dir.path(), limits(30.0)).await;
    assert_eq!(
        out.ended,
        Ended::Exited {
            code: Some(3),
            signal: None
        }
    );
    assert_eq!(out.stdout, "bye\n");

    let out = run(sh(dir.path(), "kill -KILL $$"), dir.path(), limits(30.0)).await;
    assert_eq!(
        out.ended,
        Ended::Exited {
            code: None,
            signal: Some(9)
        }
    );
}

#[tokio::test]
async fn a_missing_program_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sh(dir.path(), "true");
    cmd.program = PathBuf::from("agentry-no-such-agent-cli");
    let (_tx, rx) = watch::channel(false);
    let mut called = false;
    let err = run_process(cmd, &dir.path().join("run.log"), limits(30.0), rx, |_| {
        called = true
    })
    .await
    .unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err:?}");
    assert!(
        err.to_string().contains("agentry-no-such-agent-cli"),
        "{err}"
    );
    assert!(!called);

    let mut cmd = sh(dir.path(), "true");
    cmd.program = dir.path().join("absent/claude");
    let (_tx, rx) = watch::channel(false);
    let err = run_cancellable(cmd, dir.path(), limits(30.0), rx)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("absent/claude"), "{err}");
}

#[tokio::test]
async fn an_uncreatable_log_is_an_error_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), "").unwrap();
    let marker = dir.path().join("ran");
    let cmd = sh(dir.path(), &format!("touch '{}'", marker.display()));
    let (_tx, rx) = watch::channel(false);
    let err = run_cancellable(cmd, &dir.path().join("file"), limits(30.0), rx)
        .await
        .unwrap_err();
    assert!(matches!(err, ProcessError::Log { .. }), "{err:?}");
    assert!(!marker.exists());
}

#[tokio::test]
async fn wall_time_stops_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let elapsed = run_past_wall_time(
        dir.path(),
        "echo started; sleep 30",
        limits(0.3).stop_grace,
        "started\n",
    )
    .await;
    assert!(elapsed >= Duration::from_millis(300));
}

#[tokio::test]
async fn cancel_stops_the_process_and_its_grandchildren() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pidfile");
    let script = format!(
        "sleep 300 & echo $! > '{}'; echo waiting; wait",
        pidfile.display()
    );
    let (tx, rx) = watch::channel(false);
    let log_dir = dir.path().to_owned();
    let cmd = sh(dir.path(), &script);
    let task = tokio::spawn(async move { run_cancellable(cmd, &log_dir, limits(300.0), rx).await });
    let start = Instant::now();
    eventually_async(
        Duration::from_secs(10),
        "the grandchild's pid",
        async || std::fs::read_to_string(&pidfile).is_ok_and(|pid| !pid.trim().is_empty()),
    )
    .await;
    let grandchild = read_pid(&pidfile);
    assert!(!gone(grandchild));
    tx.send(true).unwrap();
    let out = task.await.unwrap().unwrap();
    assert_eq!(out.ended, Ended::Cancelled);
    assert_eq!(out.stdout, "waiting\n");
    assert!(start.elapsed() < Duration::from_secs(10));
    wait_gone(grandchild);
    // The direct child was reaped: not even a zombie is left.
    assert!(
        matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(out.pid as i32), None),
            Err(nix::errno::Errno::ESRCH)
        ),
        "process {} not reaped",
        out.pid
    );
}

#[tokio::test]
async fn cancel_before_start_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_tx, rx) = watch::channel(true);
    let start = Instant::now();
    let out = run_cancellable(sh(dir.path(), "sleep 30"), dir.path(), limits(300.0), rx)
        .await
        .unwrap();
    assert_eq!(out.ended, Ended::Cancelled);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_dropped_cancel_sender_does_not_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = watch::channel(false);
    drop(tx);
    let out = run_cancellable(
        sh(dir.path(), "sleep 0.3; echo finished"),
        dir.path(),
        limits(30.0),
        rx,
    )
    .await
    .unwrap();
    assert_eq!(out.ended, EXITED_0);
    assert_eq!(out.stdout, "finished\n");
}

#[tokio::test]
async fn grandchildren_left_after_a_normal_exit_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pidfile");
    // The background sleep keeps stdout open: run_process must not wait for it.
    let script = format!("sleep 300 & echo $! > '{}'; echo done", pidfile.display());
    let start = Instant::now();
    let out = run(sh(dir.path(), &script), dir.path(), limits(300.0)).await;
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.ended, EXITED_0);
    assert_eq!(out.stdout, "done\n");
    let grandchild = read_pid(&pidfile);
    wait_gone(grandchild);
}

#[tokio::test]
async fn a_process_escaping_its_group_does_not_hold_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let Ok(setsid) = which("setsid") else {
        eprintln!("no setsid; skipped");
        return;
    };
    let pidfile = dir.path().join("pidfile");
    // A new session keeps the pipe open beyond the group kill.
    let script = format!(
        "{} sleep 30 & echo $! > '{}'; echo done",
        setsid.display(),
        pidfile.display()
    );
    let start = Instant::now();
    let out = run(sh(dir.path(), &script), dir.path(), limits(300.0)).await;
    let elapsed = start.elapsed();
    assert_eq!(out.stdout, "done\n");
    assert!(elapsed < Duration::from_secs(8), "{elapsed:?}");
    // Clean up the escaped process.
    if let Ok(text) = std::fs::read_to_string(&pidfile)
        && let Ok(pid) = text.trim().parse::<i32>()
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn which(name: &str) -> Result<PathBuf, ()> {
    PATH.split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// A stop climbs the ladder: SIGINT, SIGTERM after one grace, SIGKILL after two.
#[tokio::test]
async fn a_stop_climbs_the_ladder() {
    let dir = tempfile::tempdir().unwrap();
    for (script, grace, stdout, at_least) in [
        // A stopped agent is interrupted first (SIGINT, as Ctrl-C), so it can print what it
        // spent before it exits: here at once, long before the grace is over.
        (
            "trap 'echo \"interrupted, spent 0.25\"; exit 130' INT; \
             trap 'echo terminated; exit 143' TERM; echo started; sleep 300 & wait",
            Duration::from_secs(30),
            "started\ninterrupted, spent 0.25\n",
            Duration::ZERO,
        ),
        // An agent that ignores SIGINT gets SIGTERM after the grace.
        (
            "trap '' INT; trap 'echo terminated; exit 143' TERM; echo started; sleep 300 & wait",
            Duration::from_millis(500),
            "started\nterminated\n",
            Duration::from_millis(800),
        ),
        // A process ignoring SIGINT and SIGTERM is killed after two graces.
        (
            "trap '' INT TERM; echo stubborn; sleep 300",
            Duration::from_millis(700),
            "stubborn\n",
            Duration::from_millis(1700),
        ),
    ] {
        let elapsed = run_past_wall_time(dir.path(), script, grace, stdout).await;
        assert!(elapsed >= at_least, "{stdout}: {elapsed:?}");
    }
}

#[tokio::test]
async fn large_output_does_not_deadlock_and_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    // 2 MB of stderr written at the same time as 20 MB of stdout.
    let script = "(head -c 2000000 /dev/zero | tr '\\0' e >&2) & \
                  head -c 20000000 /dev/zero | tr '\\0' o; wait";
    let out = run(sh(dir.path(), script), dir.path(), limits(120.0)).await;
    assert_eq!(out.ended, EXITED_0);
    // Memory keeps the end only; the log has all of it.
    assert_eq!(out.stdout.len(), STDOUT_MEMORY_CAP);
    assert!(out.stdout.bytes().all(|b| b == b'o'));
    assert!(out.stdout_truncated);
    assert_eq!(out.stdout_bytes, 20_000_000);
    assert_eq!(out.stderr_tail.len(), STDERR_TAIL_BYTES);
    assert!(out.stderr_tail.bytes().all(|b| b == b'e'));
    let log = dir.path().join("logs/run.log");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 20_000_000);
    assert_eq!(
        std::fs::metadata(stderr_log_path(&log)).unwrap().len(),
        2_000_000
    );
}

#[tokio::test]
async fn stdout_beyond_the_memory_cap_is_truncated_but_logged() {
    let dir = tempfile::tempdir().unwrap();
    // The head is `h`s, the rest `x`s and a final line: what is kept is the end.
    let script = format!(
        "head -c 1000 /dev/zero | tr '\\0' h; head -c {} /dev/zero | tr '\\0' x; echo; echo END",
        STDOUT_MEMORY_CAP - 5
    );
    let total = 1000 + STDOUT_MEMORY_CAP - 5 + 1 + 4;
    let out = run(sh(dir.path(), &script), dir.path(), limits(120.0)).await;
    assert!(out.stdout_truncated);
    assert_eq!(out.stdout.len(), STDOUT_MEMORY_CAP);
    assert!(out.stdout.ends_with("x\nEND\n"));
    assert!(!out.stdout.contains('h'));
    assert_eq!(out.stdout_bytes, total as u64);
    assert_eq!(
        std::fs::metadata(dir.path().join("logs/run.log"))
            .unwrap()
            .len(),
        total as u64
    );
}

/// Runs `script` under `sh` as if it were Claude Code, its output parsed as it arrives.
async fn run_claude(dir: &Path, script: &str) -> (ProcessOutcome, RunReport) {
    let (_tx, rx) = watch::channel(false);
    let (out, parser) = run_process_with(
        sh(dir, script),
        &dir.join("logs/run.log"),
        limits(300.0),
        rx,
        OutputParser::claude(),
        |_| {},
    )
    .await
    .unwrap();
    (out, parser.finish())
}

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":9,"result":"Done.","total_cost_usd":12.345678901,"modelUsage":{"claude-x":{"inputTokens":100,"outputTokens":200,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":12.345678901}}}"#;

fn len(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

/// An agent printing far more than every cap (about 150 MB of events, and 70 MB of
/// stderr): the cost of its final result event is still exact, memory keeps only the end
/// of the output, and the disk holds at most twice the log cap per stream, ending with the
/// result event.
#[tokio::test]
async fn output_beyond_every_cap_keeps_the_exact_cost_in_bounded_memory_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "(head -c 70000000 /dev/zero | tr '\\0' e >&2) & \
         echo '{{\"type\":\"system\",\"subtype\":\"init\",\"model\":\"claude-x\"}}'; \
         awk 'BEGIN {{ s = sprintf(\"%1000s\", \"\"); gsub(/ /, \"x\", s); \
           for (i = 0; i < 140000; i++) \
             printf \"{{\\\"type\\\":\\\"assistant\\\",\\\"message\\\":{{\\\"content\\\":[{{\\\"type\\\":\\\"text\\\",\\\"text\\\":\\\"%s\\\"}}]}}}}\\n\", s }}'; \
         echo '{RESULT}'; wait"
    );
    let (out, report) = run_claude(dir.path(), &script).await;
    assert_eq!(out.ended, EXITED_0);
    assert_eq!(
        report.outcome,
        AgentOutcome::Success,
        "{:?}",
        report.warnings
    );
    assert_eq!(
        report.cost_usd.map(|c| c.to_string()).as_deref(),
        Some("12.345678901")
    );
    assert_eq!((report.tokens.input, report.tokens.output), (100, 200));
    assert_eq!(report.turns, Some(9));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);

    let total = out.stdout_bytes;
    assert!(total > 2 * LOG_FILE_CAP, "{total}");
    assert!(out.stdout_truncated);
    // What the service stores of a run's output (agentry-persistence's MAX_LOG_BYTES).
    assert_eq!(STDOUT_MEMORY_CAP, 8 * 1024 * 1024);
    assert!(out.stdout.len() <= STDOUT_MEMORY_CAP);
    assert!(out.stdout.ends_with(&format!("{RESULT}\n")));

    for log in [
        dir.path().join("logs/run.log"),
        stderr_log_path(&dir.path().join("logs/run.log")),
    ] {
        let (current, rotated) = (len(&log), len(&rotated_log_path(&log)));
        assert!(current <= LOG_FILE_CAP, "{}: {current}", log.display());
        assert_eq!(rotated, LOG_FILE_CAP, "{}", log.display());
    }
    let log = dir.path().join("logs/run.log");
    // What is on disk is the end of the output.
    assert_eq!(len(&log), total % LOG_FILE_CAP);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .ends_with(&format!("{RESULT}\n"))
    );
    assert_eq!(out.stderr_tail.len(), STDERR_TAIL_BYTES);
}

/// A line longer than the parser's bound is skipped as it streams by; the result event
/// after it is read.
#[tokio::test]
async fn an_over_long_line_is_skipped_and_the_result_after_it_found() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "printf '{{\"type\":\"assistant\",\"text\":\"'; head -c {} /dev/zero | tr '\\0' a; \
         printf '\"}}\\n'; echo '{RESULT}'",
        MAX_LINE_BYTES + 1000
    );
    let (out, report) = run_claude(dir.path(), &script).await;
    assert_eq!(
        out.stdout_bytes,
        (MAX_LINE_BYTES + 1000 + 31 + RESULT.len() + 1) as u64
    );
    assert_eq!(report.outcome, AgentOutcome::Success);
    assert_eq!(
        report.cost_usd.map(|c| c.to_string()).as_deref(),
        Some("12.345678901")
    );
    assert_eq!(
        report.warnings,
        vec![format!(
            "line 1: longer than {MAX_LINE_BYTES} bytes, skipped"
        )]
    );
}

/// A rotated log left by an earlier run in the same place is removed, so it is never
/// read as part of this run's output.
#[tokio::test]
async fn a_rotated_log_of_an_earlier_run_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("logs/run.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(rotated_log_path(&log), "stale\n").unwrap();
    std::fs::write(rotated_log_path(&stderr_log_path(&log)), "stale\n").unwrap();
    let out = run(sh(dir.path(), "echo fresh"), dir.path(), limits(30.0)).await;
    assert_eq!(out.stdout, "fresh\n");
    assert!(!rotated_log_path(&log).exists());
    assert!(!rotated_log_path(&stderr_log_path(&log)).exists());
}

#[tokio::test]
async fn a_cut_stderr_tail_starts_on_a_character() {
    let dir = tempfile::tempdir().unwrap();
    // "é" is two bytes; 10001 of them cut at 16 KiB from the end leaves whole ones only
    // after dropping a dangling continuation byte, if any.
    let script = "i=0; s=''; while [ $i -lt 100 ]; do s=\"${s}é\"; i=$((i+1)); done; \
                  j=0; while [ $j -lt 100 ]; do printf '%s' \"$s\" >&2; j=$((j+1)); done; \
                  printf 'x' >&2";
    let out = run(sh(dir.path(), script), dir.path(), limits(60.0)).await;
    assert!(!out.stderr_tail.contains('\u{FFFD}'), "replacement char");
    assert!(out.stderr_tail.ends_with("éx"));
    assert!(out.stderr_tail.len() <= STDERR_TAIL_BYTES);
}
