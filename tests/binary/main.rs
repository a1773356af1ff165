//! Black-box tests of the `agentry` binary: `serve` on a fresh data directory (first-start
//! admin token, health, JSON logs, graceful shutdown on SIGTERM/SIGINT), `token create`,
//! `migrate` and `import`, on SQLite and (when the suite has a server) PostgreSQL; and the
//! code-host loops of `serve` against the fake GitHub (issue sync, outbox), with no secret in
//! any log line; and, in [`real_agents`], the real agent CLIs end to end.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

/// The test `$test` runs the scenario `$scenario` on [`Replicas`]: reported ignored where
/// the suite has no PostgreSQL (and doing nothing there if run all the same).
macro_rules! on_replicas {
    ($scenario:ident => $test:ident $(, $key:literal = $value:literal)*) => {
        #[test]
        #[cfg_attr(
            agentry_pg_skipped,
            ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
        )]
        fn $test() {
            if let Some(replicas) = crate::Replicas::with(&[$(($key, $value)),*]) {
                $scenario(&replicas);
            }
        }
    };
}

mod budgets;
mod gateway;
mod kube;
mod real_agents;
mod webhook;

use agentry_persistence::test_support::TestDb;
use agentry_testkit::git::source_repo;
use agentry_testkit::json::elements_of;
use agentry_testkit::process::processes_with_env;
use agentry_testkit::wait::eventually;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agentry");

/// The directives that make the fake Claude Code make one model call through the gateway
/// (sandboxed runs), answered with 1,000 input and 100 output tokens of claude-sonnet-5.
const ONE_CALL: &str = "[fake:model-calls=1] [model:usage=1000,100,0,0]";

/// What that call costs ($2 and $10 per million tokens).
const CALL_COST: &str = "0.003";

/// Whether agents run sandboxed here, so through the model gateway (their cost is then what
/// it metered, not what they printed).
fn metered() -> bool {
    sandboxed()
}

/// Whether agents run sandboxed here (where bubblewrap works; CI requires it).
fn sandboxed() -> bool {
    static SANDBOXED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SANDBOXED
        .get_or_init(|| agentry_testkit::sandbox::sandboxed(agentry_runner::sandbox::works_here()))
}

/// What a child wrote on stderr, read line by line by a thread as it comes, so the child
/// never blocks on a full pipe and the test can still look at all of it afterwards.
struct StderrLog {
    text: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl StderrLog {
    /// Starts reading `stderr`; the first line naming the listen address (`agentry listening
    /// on http://ADDR`) is sent on `address`.
    fn start(stderr: ChildStderr, address: mpsc::Sender<String>) -> StderrLog {
        let text = Arc::new(Mutex::new(String::new()));
        let kept = text.clone();
        let reader = std::thread::spawn(move || {
            let mut stderr = BufReader::new(stderr);
            let mut line = String::new();
            let mut address = Some(address);
            while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(addr) = listen_address(&line)
                    && let Some(tx) = address.take()
                {
                    let _ = tx.send(addr);
                }
                kept.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        StderrLog {
            text,
            reader: Some(reader),
        }
    }

    /// What was read so far.
    fn so_far(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Everything, once the child closed stderr (call after it exited).
    fn all(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.so_far()
    }
}

/// `ADDR` of a log line holding `agentry listening on http://ADDR` (text or JSON logs).
fn listen_address(line: &str) -> Option<String> {
    const MARK: &str = "agentry listening on http://";
    let rest = &line[line.find(MARK)? + MARK.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == '\\' || c == '\x1b')
        .unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

/// Spawns `cmd`, an `agentry serve`, listening on a port the system picks
/// (`AGENTRY_BIND=127.0.0.1:0`: no other test can take it between a choice and the bind);
/// returns the child, its base URL read from its log, and its stderr.
fn spawn_serve(cmd: &mut Command) -> (Child, String, StderrLog) {
    cmd.env("AGENTRY_BIND", "127.0.0.1:0")
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start agentry serve");
    let (tx, rx) = mpsc::channel();
    let mut stderr = StderrLog::start(child.stderr.take().unwrap(), tx);
    // The reader drops the sender at the end of stderr: a child that exits early fails here
    // at once, not at the deadline.
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(addr) => (child, format!("http://{addr}"), stderr),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agentry serve logged no listen address ({e}):\n{}",
                stderr.all()
            );
        }
    }
}

/// `AGENTRY_AGENT_SANDBOX=off` where bubblewrap does not work on this machine (the suite
/// runs on a machine with only the Rust toolchain; CI requires the sandbox); else nothing,
/// so `serve` uses its default, `auto`.
///
/// Run as root (as CI runs), also `AGENTRY_ALLOW_ROOT=1`: a service run as root runs its
/// agents as `nobody`, who cannot reach this binary (the forwarder) in a target directory
/// under root's HOME. `the_readme_defaults_take_an_issue_to_a_pull_request` runs them as
/// `nobody`, from copies it can reach.
fn sandbox_env(cmd: &mut Command) {
    if !sandboxed() {
        cmd.env("AGENTRY_AGENT_SANDBOX", "off");
    }
    if running_as_root() {
        cmd.env("AGENTRY_ALLOW_ROOT", "1");
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn agentry(data_dir: &Path, database_url: Option<&str>) -> Command {
    agentry_env(Command::new(BIN), data_dir, database_url)
}

/// `cmd`, which runs the agentry binary, with the environment [`agentry`] gives it.
fn agentry_env(mut cmd: Command, data_dir: &Path, database_url: Option<&str>) -> Command {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AGENTRY_DATA_DIR", data_dir)
        .env("RUST_LOG", "info");
    sandbox_env(&mut cmd);
    if let Some(url) = database_url {
        cmd.env("AGENTRY_DATABASE_URL", url);
    }
    cmd
}

struct Server {
    child: Child,
    base: String,
    stdout: Vec<String>,
    stderr: StderrLog,
}

impl Server {
    /// Starts `agentry serve` and waits until `/healthz` answers; collects what stdout printed
    /// before that (the first-start token, if any).
    fn start(data_dir: &Path, database_url: Option<&str>, json_logs: bool) -> Server {
        Server::start_with(data_dir, database_url, json_logs, &[] as &[(&str, &str)])
    }

    /// [`Server::start`] with extra environment variables.
    fn start_with(
        data_dir: &Path,
        database_url: Option<&str>,
        json_logs: bool,
        env: &[(impl AsRef<std::ffi::OsStr>, impl AsRef<std::ffi::OsStr>)],
    ) -> Server {
        let mut cmd = agentry(data_dir, database_url);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("serve").stdout(Stdio::piped());
        if json_logs {
            cmd.env("AGENTRY_LOG_FORMAT", "json");
        }
        Server::serve(&mut cmd)
    }

    /// Runs `cmd` (an `agentry serve` command line) and waits until `/healthz` answers; a
    /// server that does not is killed, and its log is part of the failure.
    fn serve(cmd: &mut Command) -> Server {
        let (child, base, stderr) = spawn_serve(cmd);
        let server = Server {
            child,
            base,
            stdout: Vec::new(),
            stderr,
        };
        let client = reqwest::blocking::Client::new();
        eventually(Duration::from_secs(20), "agentry serve healthy", || {
            let healthy = client
                .get(format!("{}/healthz", server.base))
                .send()
                .is_ok_and(|r| r.status() == 200);
            if healthy {
                Ok(())
            } else {
                Err(format!("its log so far:\n{}", server.stderr.so_far()))
            }
        });
        server
    }

    fn read_token(&mut self) -> String {
        let stdout = self.child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().unwrap().unwrap();
        let token = lines.next().unwrap().unwrap();
        self.stdout = vec![first, token.clone()];
        token
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its exit status and everything on stderr.
    /// (A server still running then is killed when it is dropped.)
    fn wait(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let status = eventually(within, "agentry to exit", || self.child.try_wait().unwrap());
        (status, self.stderr.all())
    }

    /// Kills the process; returns everything it wrote on stderr.
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.all()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn get(base: &str, path: &str, token: &str) -> (u16, Value) {
    let res = reqwest::blocking::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().unwrap_or(Value::Null))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run agentry")
}

#[test]
fn first_start_prints_an_admin_token_once_and_serves_until_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    // A data directory that does not exist yet: the service creates it, private.
    let dir = tmp.path().join("data");
    let dir = dir.as_path();
    let mut server = Server::start(dir, None, true);
    let token = server.read_token();
    assert!(
        server.stdout[0].contains("admin API token"),
        "{:?}",
        server.stdout
    );
    assert!(token.starts_with("agt_"), "{token}");

    let file = dir.join("admin-token");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o077,
            0,
            "data dir is private"
        );
    }
    // A failed authentication leaves the file; the token's first use removes it.
    assert_eq!(get(&server.base, "/api/tasks", "agt_wrong").0, 401);
    assert!(file.exists());
    let (status, body) = get(&server.base, "/api/tasks", &token);
    assert_eq!(
        (status, body),
        (200, serde_json::json!({ "tasks": [], "nextCursor": null }))
    );
    assert!(
        !file.exists(),
        "the plain-text admin token is not kept after its first use"
    );
    let (status, _) = get(&server.base, "/readyz", "");
    assert_eq!(status, 200);

    server.signal("TERM");
    let (status, stderr) = server.wait(Duration::from_secs(10));
    assert!(status.success(), "exit {status:?}: {stderr}");
    // AGENTRY_LOG_FORMAT=json: every log line is one JSON object.
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() >= 3, "{stderr}");
    for line in &lines {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
    }
    assert!(
        stderr.contains("\"route\"") || stderr.contains("\"path\":\"/api/tasks\""),
        "{stderr}"
    );
    assert!(!stderr.contains(&token), "the token must never be logged");

    // A second start finds the token and prints nothing on stdout.
    let mut again = Server::start(dir, None, false);
    let mut out = String::new();
    again.signal("INT");
    let stdout = again.child.stdout.take().unwrap();
    let (status, _) = again.wait(Duration::from_secs(10));
    BufReader::new(stdout).read_to_string(&mut out).unwrap();
    assert!(status.success());
    assert_eq!(out, "", "no second admin token");
}

/// The soft and hard limits of open files of the process `pid`, from its `/proc` entry.
fn open_files_limits(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let mut values = line["Max open files".len()..].split_whitespace();
    (
        values.next().unwrap().to_owned(),
        values.next().unwrap().to_owned(),
    )
}

/// Started with a soft limit of 256 open files (a container's soft limit is often 1024,
/// under a far higher hard one), `agentry serve` raises it to the hard limit (at most
/// 65,536) and logs it.
#[test]
fn serve_raises_its_soft_limit_of_open_files_to_the_hard_limit() {
    let (_, hard) = open_files_limits("self");
    if hard != "unlimited" && hard.parse::<u64>().unwrap() <= 256 {
        eprintln!("the hard limit of open files here is {hard}: nothing to raise");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut sh = Command::new("sh");
    sh.args(["-c", "ulimit -S -n 256 && exec \"$0\" serve", BIN]);
    let mut cmd = agentry_env(sh, tmp.path(), None);
    cmd.stdout(Stdio::piped());
    let server = Server::serve(&mut cmd);
    let pid = server.child.id().to_string();
    // The hard limit, at most agentry's ceiling (an unlimited one is not passed on).
    let raised = match hard.parse::<u64>() {
        Ok(n) => n.min(agentry_api::server::MAX_OPEN_FILES),
        Err(_) => agentry_api::server::MAX_OPEN_FILES,
    }
    .to_string();
    assert_eq!(open_files_limits(&pid), (raised.clone(), hard.clone()));
    let log = server.kill();
    assert!(
        log.contains("open files: raised the soft limit towards the hard limit")
            && log.contains("was=256")
            && log.contains(&format!("limit={raised}")),
        "{log}"
    );
}

/// A first admin token whose file cannot be written is still shown, and works: it is stored
/// before its file is written, and a later start issues none (before, the start failed
/// without showing it, and the installation had a token nobody could ever use).
#[test]
fn a_first_admin_token_whose_file_cannot_be_written_is_still_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A directory where the file goes: writing it fails.
    std::fs::create_dir(dir.join("admin-token")).unwrap();
    let mut server = Server::start(dir, None, true);
    let token = server.read_token();
    assert!(
        server.stdout[0].contains("admin API token (shown once)"),
        "{:?}",
        server.stdout
    );
    assert_eq!(get(&server.base, "/api/tasks", &token).0, 200);
    server.signal("TERM");
    let (status, stderr) = server.wait(Duration::from_secs(10));
    assert!(status.success(), "exit {status:?}: {stderr}");
    assert!(
        stderr.contains("could not save the first admin token"),
        "{stderr}"
    );
    assert!(!stderr.contains(&token), "the token must never be logged");
}

#[test]
fn token_create_gives_a_working_token_of_that_role() {
    let dir = tempfile::tempdir().unwrap();
    let out =
        run(agentry(dir.path(), None)
            .args(["token", "create", "--role", "viewer", "--name", "dash"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let viewer = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(viewer.starts_with("agt_"));
    // A token exists now, so serve issues no admin token.
    let server = Server::start(dir.path(), None, false);
    assert_eq!(get(&server.base, "/api/tasks", &viewer).0, 200);
    let res = reqwest::blocking::Client::new()
        .post(format!("{}/api/tasks/import", server.base))
        .bearer_auth(&viewer)
        .header("Content-Type", "application/x-ndjson")
        .body("")
        .send()
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(!dir.path().join("admin-token").exists());

    let bad = run(agentry(dir.path(), None).args(["token", "create", "--role", "root"]));
    assert!(!bad.status.success());
}

fn line(i: usize, cost: &str) -> String {
    format!(
        r#"{{"title":"T{i}","repoUrl":"https://github.com/acme/r{}","taskType":"coding","state":"completed","costUsd":{cost},"inputTokens":1,"outputTokens":2,"createdAt":"2026-11-0{}T10:00:00Z"}}"#,
        i % 3,
        1 + i % 9
    )
}

fn import_then_check(database_url: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.jsonl");
    let good: Vec<String> = (0..500).map(|i| line(i, "\"0.5\"")).collect();
    std::fs::write(&file, good.join("\n")).unwrap();
    let out = run(agentry(dir.path(), database_url).arg("import").arg(&file));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"imported": 500, "skipped": 0}"#
    );

    // One bad line (line 300) rejects the whole file, names the line, and writes nothing.
    let mut bad = good.clone();
    bad[299] = line(299, "\"-1\"");
    bad.push(line(1000, "null"));
    std::fs::write(&file, bad.join("\n")).unwrap();
    let out = run(agentry(dir.path(), database_url).arg("import").arg(&file));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 300: costUsd"), "{stderr}");

    // Re-importing the first file writes nothing new (no ids: new tasks would be created,
    // so count through the API instead of re-importing).
    let out = run(agentry(dir.path(), database_url).args(["token", "create", "--role", "viewer"]));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let server = Server::start(dir.path(), database_url, false);
    let (_, page) = get(&server.base, "/api/tasks?limit=200&state=completed", &token);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 200);
    let mut total = 0;
    let mut cursor = String::new();
    loop {
        let (_, page) = get(
            &server.base,
            &format!("/api/tasks?limit=200{cursor}"),
            &token,
        );
        total += page["tasks"].as_array().unwrap().len();
        match page["nextCursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(total, 500, "the rejected import wrote nothing");

    let out = run(agentry(dir.path(), database_url)
        .arg("import")
        .arg(dir.path().join("missing.jsonl")));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn import_is_all_or_nothing_on_sqlite() {
    import_then_check(None);
}

#[test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
fn import_and_serve_work_on_postgresql() {
    let Some(db) = TestDb::postgres() else { return };
    import_then_check(Some(&db.url));
}

#[test]
fn migrate_is_idempotent_and_bad_configuration_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = run(agentry(dir.path(), None).arg("migrate"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("up to date"));
    }
    let out = run(agentry(dir.path(), Some("mysql://nope")).arg("migrate"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AGENTRY_DATABASE_URL"));
    let out = run(agentry(dir.path(), Some("postgres://nobody@127.0.0.1:1/none")).arg("migrate"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not connect"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(agentry(dir.path(), None)
        .arg("serve")
        .env("AGENTRY_BIND", "not-an-address"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AGENTRY_BIND"));
}

#[test]
fn costs_prints_tables_and_the_api_json_from_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.jsonl");
    let today = time::OffsetDateTime::now_utc().date();
    let lines: Vec<String> = (0..6)
        .map(|i| {
            format!(
                r#"{{"title":"Task {i}","repoUrl":"https://github.com/acme/web","taskType":"coding","state":"completed","modelUsed":"sonnet","costUsd":"{}","inputTokens":10,"outputTokens":2,"createdAt":"{today}T08:00:0{i}Z"}}"#,
                if i == 5 { "40.5" } else { "1.25" }
            )
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    assert!(
        run(agentry(dir.path(), None).arg("import").arg(&file))
            .status
            .success()
    );

    let out = run(agentry(dir.path(), None).args(["costs", "--days", "7"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("Costs over the last 7 days, all repositories"),
        "{table}"
    );
    assert!(table.contains("46.7500"), "total cost card: {table}");
    assert!(
        table.contains("Costliest tasks") && table.contains("Task 5"),
        "{table}"
    );
    // 40.5 is 32.4 times the average of the other five (1.25): an anomaly.
    assert!(
        table.contains("Anomalies") && table.contains("32.4"),
        "{table}"
    );

    let out = run(agentry(dir.path(), None).args([
        "costs",
        "--json",
        "--repo",
        "git@github.com:Acme/Web.git",
    ]));
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["summary"]["totalCost"], "46.7500");
    assert_eq!(report["summary"]["days"], 30);
    assert_eq!(report["dailyCosts"].as_array().unwrap().len(), 30);
    assert_eq!(report["anomalies"][0]["costUsd"], "40.5");

    for bad in [
        ["costs", "--days", "0"],
        ["costs", "--days", "366"],
        ["costs", "--repo", "nope"],
    ] {
        let out = run(agentry(dir.path(), None).args(bad));
        assert!(!out.status.success(), "{bad:?}");
    }
}

/// Task `id` as `base` serves it to `token`.
fn task_of(base: &str, id: &str, token: &str) -> Value {
    get(base, &format!("/api/tasks/{id}"), token).1
}

/// The `errorMessage` of a task or run ("" where it has none).
fn error_of(task: &Value) -> &str {
    task["errorMessage"].as_str().unwrap_or_default()
}

/// Polls task `id` through `base` until `done` holds for it, and returns it; panics with
/// the task as last seen once `within` has passed (waiting for `what`).
fn task_when(
    base: &str,
    id: &str,
    token: &str,
    (within, what): (Duration, &str),
    done: impl Fn(&Value) -> bool,
) -> Value {
    eventually(within, what, || {
        let task = task_of(base, id, token);
        if done(&task) { Ok(task) } else { Err(task) }
    })
}

/// Waits up to `within` until `base` has `n` model calls on record for task `id` (`query`
/// narrows them, e.g. `?attempt=2`).
fn wait_for_calls(base: &str, id: &str, token: &str, query: &str, n: usize, within: Duration) {
    eventually(within, format!("{n} metered calls{query}"), || {
        let (_, calls) = get(base, &format!("/api/tasks/{id}/calls{query}"), token);
        calls["calls"].as_array().is_some_and(|c| c.len() == n)
    });
}

#[test]
fn serve_syncs_labelled_issues_posts_once_and_never_logs_a_secret() {
    use agentry_fake_github::FakeGitHub;
    const GOOD: &str = "ghp_GoodTokenValue0123456789abcdefXYZ";
    const BAD: &str = "github_pat_RefusedTokenValue0123456789";
    let fake = FakeGitHub::start();
    fake.add_token(GOOD, "agentry-bot");
    fake.add_repo("acme", "web", "main");
    let number = fake.add_issue(
        "acme",
        "web",
        "Add dark mode",
        Some("Please."),
        &["agentry"],
    );
    let dir = tempfile::tempdir().unwrap();
    let api = fake.base_url();
    let mut server = Server::start_with(
        dir.path(),
        None,
        true,
        &[
            ("AGENTRY_CODEHOST_API_URL", api.as_str()),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "1"),
            // No agent runs here (the fake's clone URL points at github.com).
            ("AGENTRY_MAX_CONCURRENT_RUNS", "0"),
            ("RUST_LOG", "debug"),
        ],
    );
    let admin = server.read_token();
    let client = reqwest::blocking::Client::new();
    let put = |value: &str| {
        client
            .put(format!("{}/api/secrets/CODEHOST_TOKEN", server.base))
            .bearer_auth(&admin)
            .json(&serde_json::json!({ "value": value }))
            .send()
            .unwrap()
    };
    assert_eq!(put(BAD).status(), 422);
    assert_eq!(put(GOOD).status(), 200);
    let connected = client
        .post(format!("{}/api/repos", server.base))
        .bearer_auth(&admin)
        .json(&serde_json::json!({ "repoUrl": "https://github.com/acme/web" }))
        .send()
        .unwrap();
    assert_eq!(connected.status(), 201);

    // The loops of `serve` do the rest: the sync turns the labelled issue into a task, and
    // the outbox posts the one comment.
    eventually(Duration::from_secs(20), "the comment", || {
        fake.issue("acme", "web", number).unwrap().comments.len() == 1
    });
    let tasks: Value = client
        .get(format!("{}/api/tasks", server.base))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(tasks["tasks"].as_array().unwrap().len(), 1, "{tasks}");
    assert_eq!(tasks["tasks"][0]["issueNumber"], number);
    // A few more sync rounds change nothing (each round lists the repository's issues).
    let lists = || fake.count("GET", "/repos/acme/web/issues");
    let before = lists();
    eventually(Duration::from_secs(20), "three more sync rounds", || {
        lists() >= before + 3
    });
    assert_eq!(fake.issue("acme", "web", number).unwrap().comments.len(), 1);
    assert!(fake.count_status(304) >= 1, "later syncs are conditional");

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("master.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    server.signal("TERM");
    let stdout = server.stdout.join("\n");
    let (status, stderr) = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("code-host token accepted"), "{stderr}");
    for secret in [GOOD, BAD] {
        assert!(!stderr.contains(secret), "a secret reached the log");
        assert!(!stdout.contains(secret));
    }
    let key = std::fs::read_to_string(dir.path().join("master.key")).unwrap();
    assert!(
        !stderr.contains(key.trim()),
        "the master key reached the log"
    );
}

/// A fake GitHub that knows the token `gh` and `acme/web`, whose clone URL is a real git
/// repository (returned) in a temporary directory (returned, to keep it alive).
fn fake_with_repo(
    gh: &str,
) -> (
    agentry_fake_github::FakeGitHub,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let fake = agentry_fake_github::FakeGitHub::start();
    fake.add_token(gh, "agentry-bot");
    fake.add_repo("acme", "web", "main");
    let dir = tempfile::tempdir().unwrap();
    let source = source_repo(dir.path());
    fake.set_clone_url("acme", "web", source.to_str().unwrap());
    (fake, dir, source)
}

/// The fake agent CLI `name` (`claude` or `codex`) of the runner's tests.
fn fake_agent(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/runner/tests/fake-agents")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

/// What `serve` under test runs against: the fake GitHub, which knows the code-host token
/// `gh` and `acme/web` (cloned from `source`), the fake model API, and the environment that
/// points the fake Claude Code at both ([`fake_agent_env`]), in one temporary directory.
struct World {
    gh: String,
    fake: agentry_fake_github::FakeGitHub,
    dir: tempfile::TempDir,
    source: std::path::PathBuf,
    models: agentry_fake_models::FakeModels,
    env: Vec<(String, String)>,
}

impl World {
    /// The world of the code-host token `gh`, with `extra` in the environment.
    fn new(gh: &str, extra: &[(&str, &str)]) -> World {
        let (fake, dir, source) = fake_with_repo(gh);
        let models = agentry_fake_models::FakeModels::start();
        let env = fake_agent_env(&fake, &models, extra);
        World {
            gh: gh.to_owned(),
            fake,
            dir,
            source,
            models,
            env,
        }
    }

    /// The data directory of a single `serve`.
    fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Starts a single `serve` on SQLite (again, on [`World::data_dir`]).
    fn serve(&self, json_logs: bool) -> Server {
        Server::start_with(&self.data_dir(), None, json_logs, &self.env)
    }

    /// Starts a single `serve` on SQLite (plain logs) and, as its admin, connects `acme/web`
    /// with the world's code-host token: the server, its admin token and the repository.
    fn serve_connected(&self) -> (Server, String, Value) {
        let mut server = self.serve(false);
        let admin = server.read_token();
        let repo = connect_repo(&server.base, &admin, &self.gh);
        (server, admin, repo)
    }

    /// [`World::serve_connected`], then `settings` applied to `acme/web` before any task.
    fn serve_with_settings(&self, settings: &Value) -> (Server, String, Value) {
        let (server, admin, repo) = self.serve_connected();
        patch_settings(&server.base, &admin, repo["id"].as_str().unwrap(), settings);
        (server, admin, repo)
    }
}

/// What replicas of `serve` on one PostgreSQL add to their environment: no pull-request
/// poll, a 3-second run lease, and one master key (both decrypt the stored code-host token).
const REPLICA_ENV: [(&str, &str); 3] = [
    ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
    ("AGENTRY_RUN_LEASE_SECS", "3"),
    (
        "AGENTRY_MASTER_KEY",
        "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
    ),
];

/// Replicas of `serve` on one PostgreSQL, each on its own data directory, sharing the fake
/// GitHub (`acme/web` cloned from `source`) and the fake model API, with [`REPLICA_ENV`].
struct Replicas {
    db: TestDb,
    world: World,
}

impl std::ops::Deref for Replicas {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl Replicas {
    /// The replicas' world, `extra` added to every replica's environment; `None` (the test
    /// does nothing) where the suite has no PostgreSQL.
    fn with(extra: &[(&str, &str)]) -> Option<Replicas> {
        let db = TestDb::postgres()?;
        let env: Vec<(&str, &str)> = REPLICA_ENV.iter().chain(extra).copied().collect();
        let world = World::new("ghp_ReplicaTestToken0123456789abcdef", &env);
        Some(Replicas { db, world })
    }

    /// The data directory of replica `name`.
    fn data(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// Starts replica `name` (again, on the same data directory).
    fn start(&self, name: &str) -> Server {
        Server::start_with(&self.data(name), Some(&self.db.url), true, &self.env)
    }

    /// Starts replica `name` first, which prints the admin token; through it connects
    /// `acme/web` and creates the task `title` with `prompt`. Returns the replica, the token
    /// and the task's id.
    fn start_first(&self, name: &str, title: &str, prompt: &str) -> (Server, String, String) {
        let mut server = self.start(name);
        let admin = server.read_token();
        let id = connect_and_create_task(&server.base, &admin, &self.gh, title, prompt);
        (server, admin, id)
    }
}

/// The cost of one run of [`ONE_CALL`] and of two: metered, the call's; unsandboxed, what
/// the fake agent prints.
fn one_and_two_runs_cost() -> (&'static str, &'static str) {
    if metered() {
        (CALL_COST, "0.006")
    } else {
        ("0.123456", "0.246912")
    }
}

/// `serve`'s environment for runs of the fake Claude Code on `fake`'s repositories, its
/// model calls going to `models` (the gateway's upstream and key), with `extra` added.
fn fake_agent_env(
    fake: &agentry_fake_github::FakeGitHub,
    models: &agentry_fake_models::FakeModels,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env = vec![
        ("AGENTRY_CODEHOST_API_URL".to_owned(), fake.base_url()),
        ("AGENTRY_CLAUDE_BIN".to_owned(), fake_agent("claude")),
        ("AGENTRY_ANTHROPIC_UPSTREAM".to_owned(), models.base_url()),
        ("ANTHROPIC_API_KEY".to_owned(), models.key()),
    ];
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

/// Through `base`: stores the code-host token `gh` and connects `acme/web`; returns the
/// repository.
fn connect_repo(base: &str, admin: &str, gh: &str) -> Value {
    let client = reqwest::blocking::Client::new();
    let put = client
        .put(format!("{base}/api/secrets/CODEHOST_TOKEN"))
        .bearer_auth(admin)
        .json(&serde_json::json!({ "value": gh }))
        .send()
        .unwrap();
    assert_eq!(put.status(), 200);
    client
        .post(format!("{base}/api/repos"))
        .bearer_auth(admin)
        .json(&serde_json::json!({ "repoUrl": "https://github.com/acme/web" }))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

/// Through `base`: creates a coding task `title` with `prompt` in the repository `repo`;
/// returns the task's id.
fn create_task(base: &str, admin: &str, repo: &Value, title: &str, prompt: &str) -> String {
    let task: Value = reqwest::blocking::Client::new()
        .post(format!("{base}/api/tasks"))
        .bearer_auth(admin)
        .json(&serde_json::json!({ "repoId": repo["id"], "title": title, "prompt": prompt }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    task["id"].as_str().unwrap().to_owned()
}

/// Through `base`: stores the code-host token `gh`, connects `acme/web` and creates a
/// coding task `title` with `prompt`; returns the task's id.
fn connect_and_create_task(base: &str, admin: &str, gh: &str, title: &str, prompt: &str) -> String {
    let repo = connect_repo(base, admin, gh);
    create_task(base, admin, &repo, title, prompt)
}

/// Through `base`: applies `patch` to the settings of the repository `repo_id`.
fn patch_settings(base: &str, admin: &str, repo_id: &str, patch: &Value) {
    let res = reqwest::blocking::Client::new()
        .patch(format!("{base}/api/repos/{repo_id}/settings"))
        .bearer_auth(admin)
        .json(patch)
        .send()
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().unwrap_or_default());
}

/// `kill -9` of `serve` while an agent runs, then `serve` again: the task is recovered (the
/// lost run recorded, attempt 2), its orphaned agent stopped, and it reaches `pr_opened`
/// with exactly one pull request.
#[test]
fn a_run_killed_with_the_service_is_recovered_after_restart() {
    const GH: &str = "ghp_RestartTestToken0123456789abcdef";
    let world = World::new(GH, &[("AGENTRY_POLL_INTERVAL_SECS", "3600")]);
    let (fake, data) = (&world.fake, world.data_dir());
    let mut server = world.serve(true);
    let admin = server.read_token();
    let id = connect_and_create_task(
        &server.base,
        &admin,
        GH,
        "Slow work",
        &format!("Take time [fake:sleep=3] {ONE_CALL}"),
    );
    // The fake agent writes this once it runs (its own pid, which differs inside a sandbox).
    let home = data.join("runs").join(&id).join("1/home");
    eventually(Duration::from_secs(20), "the agent running", || {
        home.join("agent.pid").exists()
    });
    let running = task_of(&server.base, &id, &admin);
    assert_eq!(running["state"], "running", "{running}");
    let sandboxed = sandboxed();
    if sandboxed {
        // The fake writes its pid before its model call: the kill waits for the call to be
        // metered, so the lost attempt has it on record.
        wait_for_calls(&server.base, &id, &admin, "", 1, Duration::from_secs(20));
    }
    let home_var = format!("HOME={}", home.display());
    assert!(!processes_with_env(&home_var).is_empty());

    server.signal("KILL");
    drop(server);
    // Unsandboxed, the agent outlives the killed service (its own process group) until the
    // next start stops it; sandboxed, bubblewrap ends it with the service.
    if !sandboxed {
        assert!(!processes_with_env(&home_var).is_empty());
    }

    let server = world.serve(true);
    // Recovery at start stops an orphaned agent before anything else runs.
    eventually(
        Duration::from_secs(10),
        "no process of the dead run left",
        || processes_with_env(&home_var).is_empty(),
    );
    let wait = (Duration::from_secs(30), "the recovered task's pull request");
    let last = task_when(&server.base, &id, &admin, wait, |t| {
        t["state"] == "pr_opened"
    });
    assert_eq!(last["attempt"], 2, "{last}");
    let runs = last["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{last}");
    assert_eq!(runs[0]["outcome"], "lost");
    assert_eq!(runs[0]["attempt"], 1);
    assert_eq!(runs[1]["outcome"], "succeeded");
    // Sandboxed, each attempt's cost is its one metered call; unsandboxed, what the agent
    // printed (the lost attempt printed none).
    if sandboxed {
        assert_eq!(runs[0]["costUsd"], CALL_COST, "{last}");
        assert_eq!(last["costUsd"], "0.006", "{last}");
    } else {
        assert_eq!(last["costUsd"], "0.123456");
    }
    assert!(
        elements_of(&last, "events")
            .iter()
            .any(|e| e["from"] == "running" && e["to"] == "queued"),
        "{last}"
    );
    assert_eq!(fake.pulls("acme", "web").len(), 1);
}

/// `kill -9` of `serve` while a revision round's agent runs, then `serve` again: the round is
/// recovered once (its lost run recorded with its cost, a new attempt of the same round),
/// pushes one commit on top of the pull request's branch, and the task is back at
/// `pr_opened` with one pull request and the cost of every run.
#[test]
fn a_revision_killed_with_the_service_is_recovered_once() {
    const GH: &str = "ghp_RevisionKillTestToken0123456789ab";
    let world = World::new(
        GH,
        &[
            ("AGENTRY_POLL_INTERVAL_SECS", "1"),
            ("AGENTRY_REVISION_QUIET_SECS", "0"),
        ],
    );
    let (fake, data, source) = (&world.fake, world.data_dir(), &world.source);
    let mut server = world.serve(true);
    let admin = server.read_token();
    let id = connect_and_create_task(&server.base, &admin, GH, "Add caching", ONE_CALL);
    let repo_id = task_of(&server.base, &id, &admin)["repoId"]
        .as_str()
        .unwrap()
        .to_owned();
    let no_review = serde_json::json!({"autoReview": false});
    patch_settings(&server.base, &admin, &repo_id, &no_review);
    let wait = (Duration::from_secs(30), "the pull request");
    let last = task_when(&server.base, &id, &admin, wait, |t| {
        t["state"] == "pr_opened"
    });
    let number = last["prNumber"].as_u64().unwrap();
    let branch = format!("agentry/task-{}", id.replace('-', ""));
    let head = agentry_testkit::git::git(&["rev-parse", &branch], source);

    fake.set_permission("acme", "web", "alice", "write");
    fake.advance_clock(Duration::from_secs(2));
    fake.add_comment(
        "acme",
        "web",
        number,
        "alice",
        &format!("@agentry please add a test [fake:sleep=3] {ONE_CALL}"),
    );
    let home = data.join("runs").join(&id).join("2/home");
    eventually(
        Duration::from_secs(30),
        "the revision's agent running",
        || home.join("agent.pid").exists(),
    );
    if metered() {
        let within = Duration::from_secs(20);
        wait_for_calls(&server.base, &id, &admin, "?attempt=2", 1, within);
    }
    server.signal("KILL");
    drop(server);

    let server = world.serve(true);
    let wait = (Duration::from_secs(40), "the recovered revision pushed");
    let last = task_when(&server.base, &id, &admin, wait, |t| {
        t["state"] == "pr_opened" && t["runs"].as_array().is_some_and(|r| r.len() == 3)
    });
    assert_eq!(last["revisions"], 1, "{last}");
    assert_eq!(last["attempt"], 3, "{last}");
    let runs = last["runs"].as_array().unwrap();
    let seen: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| {
            (
                r["trigger"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("assignment", "succeeded"),
            ("revision", "lost"),
            ("revision", "succeeded")
        ],
        "{last}"
    );
    assert_eq!(runs[1]["triggerAuthor"], "alice");
    if metered() {
        // Each run's one metered call: the lost one's too.
        for run in runs {
            assert_eq!(run["costUsd"], CALL_COST, "{last}");
        }
        assert_eq!(last["costUsd"], "0.009", "{last}");
    }
    let feedback = last["feedback"].as_array().unwrap();
    assert_eq!(feedback.len(), 1, "{last}");
    assert_eq!(feedback[0]["outcome"], "taken");
    // One commit on top of the old head, on the same pull request.
    let parent = agentry_testkit::git::git(&["rev-parse", &format!("{branch}^")], source);
    assert_eq!(parent, head);
    assert_eq!(fake.pulls("acme", "web").len(), 1);
}

/// Two replicas on one PostgreSQL: replica A's agent ends with its cost reported, then A is
/// killed while the code host holds its pull request's creation. Replica B, which cannot
/// read A's run directory, recovers the task once A's lease expired. A's cost is on record
/// all the same (a run is recorded as soon as its agent ends, before publishing); attempt 2
/// opens the one pull request; the task's cost is both runs'.
fn publishing_replica_dies(replicas: &Replicas) {
    use agentry_fake_github::Fault;
    let fake = &replicas.fake;
    // A's creation hangs (as a code host that stopped answering) until A is gone.
    fake.fail_next(
        Some(("POST", "/repos/{o}/{r}/pulls")),
        1,
        Fault::Timeout(Duration::from_secs(120)),
    );
    let (one, both) = one_and_two_runs_cost();
    let prompt = format!("Some work {ONE_CALL}");
    let (a, admin, id) = replicas.start_first("a", "Publish slowly", &prompt);
    let wait = (
        Duration::from_secs(30),
        "attempt 1's run on record while its pull request is being opened",
    );
    let last = task_when(&a.base, &id, &admin, wait, |t| {
        t["state"] == "running" && t["runs"].as_array().is_some_and(|r| r.len() == 1)
    });
    assert_eq!(last["runs"][0]["costUsd"], one, "{last}");
    assert_eq!(last["costUsd"], one, "{last}");
    a.signal("KILL");
    drop(a);

    let b = replicas.start("b");
    let wait = (Duration::from_secs(60), "the recovered task's pull request");
    let last = task_when(&b.base, &id, &admin, wait, |t| t["state"] == "pr_opened");
    assert_eq!(last["attempt"], 2, "{last}");
    let runs = last["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{last}");
    assert_eq!(
        (runs[0]["attempt"].clone(), runs[1]["attempt"].clone()),
        (1.into(), 2.into())
    );
    assert_eq!(runs[0]["outcome"], "succeeded");
    assert_eq!(runs[0]["costUsd"], one);
    assert_eq!(last["costUsd"], both, "{last}");
    assert_eq!(fake.pulls("acme", "web").len(), 1);
}

on_replicas!(publishing_replica_dies =>
    a_reported_cost_survives_its_replica_dying_while_publishing);

/// Two replicas on one PostgreSQL: replica B's agent ends, and B is killed while pushing
/// (before its run could be recorded). Replica A recovers the task when B's lease expires
/// (it cannot read B's run directory) and opens the pull request with attempt 2. When B
/// starts again on its data directory, it records attempt 1 from the output it left, with
/// the cost that output shows: no reported cost is lost because another replica recovered
/// the task.
fn pushing_replica_dies_and_restarts(replicas: &Replicas) {
    // The first push hangs (its hook's pid in `mark`); later pushes go through.
    let mark = replicas.dir.path().join("push-hung");
    let hook = replicas.source.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nif [ ! -e '{m}' ]; then echo $$ > '{m}'; exec sleep 120; fi\nexit 0\n",
            m = mark.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (one, both) = one_and_two_runs_cost();
    let prompt = format!("Some work {ONE_CALL}");
    let (b, admin, id) = replicas.start_first("b", "Push slowly", &prompt);
    eventually(Duration::from_secs(30), "B's push hanging", || {
        std::fs::read_to_string(&mark).is_ok_and(|pid| !pid.trim().is_empty())
    });
    let during = task_of(&b.base, &id, &admin);
    assert_eq!(during["state"], "running", "{during}");
    b.signal("KILL");
    drop(b);
    let hung = std::fs::read_to_string(&mark).unwrap();
    let _ = Command::new("kill").arg(hung.trim()).status();

    let a = replicas.start("a");
    let wait = (Duration::from_secs(60), "A's pull request");
    let last = task_when(&a.base, &id, &admin, wait, |t| t["state"] == "pr_opened");
    assert_eq!(last["attempt"], 2, "{last}");
    // Metered, A records attempt 1 as it recovers the task: B's call is in the database
    // even though B's output is out of A's reach. Else only attempt 2 is known yet.
    let after_a = if metered() { both } else { one };
    assert_eq!(last["costUsd"], after_a, "{last}");

    let b = replicas.start("b");
    let wait = (Duration::from_secs(20), "B recording attempt 1");
    let last = task_when(&b.base, &id, &admin, wait, |t| {
        t["runs"].as_array().is_some_and(|r| r.len() == 2)
    });
    let runs = last["runs"].as_array().unwrap();
    let first = runs.iter().find(|r| r["attempt"] == 1).unwrap();
    assert_eq!(first["outcome"], "lost", "{last}");
    assert_eq!(first["costUsd"], one, "{last}");
    assert_eq!(last["costUsd"], both, "{last}");
    assert_eq!(last["state"], "pr_opened");
    assert_eq!(replicas.fake.pulls("acme", "web").len(), 1);
    assert!(
        !replicas.data("b").join("runs").join(&id).exists(),
        "the recorded leftover is forgotten"
    );
}

on_replicas!(pushing_replica_dies_and_restarts =>
    a_restarted_replica_records_the_run_it_left_behind);

/// The README's first command as a newcomer runs it: `agentry serve` in a fresh directory
/// with no `AGENTRY_DATA_DIR` (so `./agentry-data`), the agent CLI found on `PATH`. An
/// assigned issue goes all the way to `pr_opened`. Only the listen port (tests run in
/// parallel) and the code host (the local fake) differ from the defaults.
#[test]
fn the_readme_defaults_take_an_issue_to_a_pull_request() {
    use agentry_fake_github::FakeGitHub;
    const GH: &str = "ghp_ReadmeDefaultsToken0123456789abcdef";
    let fake = FakeGitHub::start();
    fake.add_token(GH, "agentry-bot");
    fake.add_repo("acme", "web", "main");
    let number = fake.add_issue("acme", "web", "Add a changelog", Some("Short."), &[]);
    let dir = tempfile::tempdir().unwrap();
    let source = source_repo(dir.path());
    fake.set_clone_url("acme", "web", source.to_str().unwrap());
    // `claude` on PATH and agentry itself where any user can run them, as an operator
    // installs them: run as root, the service runs its agents as `nobody`.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(fake_agent("claude"), bin.join("claude")).unwrap();
    let agentry = bin.join("agentry");
    std::fs::copy(BIN, &agentry).unwrap();
    let cwd = dir.path().join("newcomer");
    std::fs::create_dir_all(&cwd).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(&agentry);
    cmd.arg("serve")
        .current_dir(&cwd)
        .env_clear()
        .env("PATH", path)
        .env("AGENTRY_CODEHOST_API_URL", fake.base_url())
        .stdout(Stdio::null());
    sandbox_env(&mut cmd);
    let sandboxed = sandboxed();
    if sandboxed {
        // The defaults, whoever runs them.
        cmd.env_remove("AGENTRY_ALLOW_ROOT");
    }
    let server = Server::serve(&mut cmd);
    let base = server.base.clone();
    let client = reqwest::blocking::Client::new();
    let data = cwd.join("agentry-data");
    let admin = std::fs::read_to_string(data.join("admin-token"))
        .unwrap()
        .trim()
        .to_owned();
    let repo = connect_repo(&base, &admin, GH);
    let assigned = client
        .post(format!("{base}/api/issues/assign"))
        .bearer_auth(&admin)
        .json(&serde_json::json!({
            "repoId": repo["id"], "issueNumber": number, "title": "Add a changelog"
        }))
        .send()
        .unwrap();
    assert_eq!(assigned.status(), 201);
    let assigned: Value = assigned.json().unwrap();
    let id = assigned["task"]["id"].as_str().unwrap().to_owned();
    let last = eventually(Duration::from_secs(60), "the task's pull request", || {
        let task = task_of(&base, &id, &admin);
        match task["state"].as_str() {
            Some("pr_opened" | "failed") => Ok(task),
            _ => Err(format!("{task}\n{}", server.stderr.so_far())),
        }
    });
    let log = server.kill();
    assert_eq!(last["state"], "pr_opened", "{last}\n{log}");
    assert_eq!(fake.pulls("acme", "web").len(), 1);
    if sandboxed && running_as_root() {
        // Run as root, the agent ran as `nobody`.
        assert!(
            log.contains("its agents run as another user") && log.contains("nobody"),
            "{log}"
        );
    }
    // Everything lives under ./agentry-data, and nothing was nested inside it.
    assert!(data.join("agentry.db").is_file());
    assert!(data.join("workspaces/mirrors").is_dir());
    assert!(!data.join("workspaces/agentry-data").exists());
}

#[test]
fn openapi_prints_the_served_document_without_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("openapi")
        .current_dir(dir.path())
        .env_remove("AGENTRY_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["paths"]["/api/tasks"]["get"].is_object(), "{doc}");
    assert!(doc["paths"]["/api/analytics/costs"]["get"].is_object());
    // Nothing was created: no data directory, no database.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn openapi_into_a_reader_that_stops_early_is_not_a_crash() {
    use std::io::Read;
    let mut child = Command::new(BIN)
        .arg("openapi")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read a few bytes, then close the pipe, as `agentry openapi | head -c 10` does.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 10];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?} {stderr}", out.status);
}

/// The line of `report` (the stdout of `agentry doctor`) whose check is `name`.
fn doctor_line<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in\n{report}"))
}

/// `agentry doctor` prints one line per check, each problem with its fix, and exits 1 when a
/// run cannot succeed: on a fresh machine (creating nothing), with an unsupported agent CLI,
/// and on a served instance with a stored token, whose agent, keys and token it finds
/// working until one of them goes.
#[test]
fn doctor_says_what_a_run_needs() {
    use agentry_fake_github::FakeGitHub;
    const GH: &str = "ghp_DoctorTestToken0123456789abcdef";
    const KEY: &str = "sk-ant-DoctorTestKeyValue";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/runner/tests/fake-agents");
    let claude = agents.join("claude");
    let codex = agents.join("codex");
    let sandboxed = sandboxed();
    let doctor = |env: &[(&str, &str)]| -> (Option<i32>, String) {
        let out = run(agentry(&data, None).envs(env.iter().copied()).arg("doctor"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            !stdout.contains(GH) && !stdout.contains(KEY),
            "a secret was printed:\n{stdout}"
        );
        (out.status.code(), stdout)
    };
    let status = |report: &str, name: &str| -> String {
        doctor_line(report, name)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    let check_sandbox = |report: &str| {
        // `agentry` sets AGENTRY_AGENT_SANDBOX=off where bubblewrap does not work here.
        let expected = if sandboxed { "ok" } else { "warn" };
        assert_eq!(status(report, "sandbox"), expected, "{report}");
    };

    // A fresh machine with no Claude Code: a run cannot succeed, and nothing is created.
    let missing = dir.path().join("no-such-claude");
    let (code, report) = doctor(&[("AGENTRY_CLAUDE_BIN", missing.to_str().unwrap())]);
    assert_eq!(code, Some(1), "{report}");
    let line = doctor_line(&report, "claude-code");
    assert!(line.starts_with("FAIL "), "{report}");
    assert!(
        line.contains("was not found")
            && line.contains("fix: npm install -g @anthropic-ai/claude-code@2.1.197"),
        "{line}"
    );
    assert_eq!(status(&report, "git"), "ok", "{report}");
    assert_eq!(status(&report, "claude-code-key"), "FAIL", "{report}");
    assert_eq!(status(&report, "database"), "warn", "{report}");
    assert!(
        doctor_line(&report, "code-host").contains("no code-host token can be stored yet"),
        "{report}"
    );
    check_sandbox(&report);
    assert!(!data.exists(), "doctor created the data directory");

    // A Claude Code older than the supported range.
    let old = dir.path().join("old-claude");
    std::fs::write(&old, "#!/bin/sh\necho '1.0.0 (Claude Code)'\n").unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, report) = doctor(&[
        ("AGENTRY_CLAUDE_BIN", old.to_str().unwrap()),
        ("ANTHROPIC_API_KEY", KEY),
    ]);
    assert_eq!(code, Some(1), "{report}");
    let line = doctor_line(&report, "claude-code");
    assert!(
        line.starts_with("FAIL ") && line.contains("1.0.0") && line.contains("does not support"),
        "{report}"
    );
    assert_eq!(status(&report, "claude-code-key"), "ok", "{report}");

    // A served instance: a token stored and a repository connected through the API.
    let fake = FakeGitHub::start();
    fake.add_token(GH, "agentry-bot");
    fake.add_repo("acme", "web", "main");
    let api = fake.base_url();
    let mut server = Server::start_with(
        &data,
        None,
        false,
        &[
            ("AGENTRY_CODEHOST_API_URL", api.as_str()),
            ("AGENTRY_MAX_CONCURRENT_RUNS", "0"),
        ],
    );
    let admin = server.read_token();
    let repo = connect_repo(&server.base, &admin, GH);
    let repo_id = repo["id"].as_str().unwrap().to_owned();

    // `doctor` beside the running `serve`.
    let ready = [
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CLAUDE_BIN", claude.to_str().unwrap()),
        ("ANTHROPIC_API_KEY", KEY),
    ];
    let (code, report) = doctor(&ready);
    if sandboxed {
        assert_eq!(code, Some(0), "{report}");
    }
    for name in [
        "git",
        "claude-code",
        "claude-code-key",
        "database",
        "code-host",
        "prices",
    ] {
        assert_eq!(status(&report, name), "ok", "{name}:\n{report}");
    }
    check_sandbox(&report);
    assert!(
        doctor_line(&report, "claude-code").contains("2.1.197"),
        "{report}"
    );
    assert!(
        doctor_line(&report, "database").contains("1 repository connected"),
        "{report}"
    );
    assert!(
        doctor_line(&report, "code-host").contains("agentry-bot"),
        "{report}"
    );
    // Codex: missing, and no repository uses it.
    assert_eq!(status(&report, "codex"), "warn", "{report}");

    // Without its key, Claude Code cannot run.
    let (code, report) = doctor(&ready[..2]);
    assert_eq!(code, Some(1), "{report}");
    let line = doctor_line(&report, "claude-code-key");
    assert!(
        line.starts_with("FAIL ")
            && (line.contains("export ANTHROPIC_API_KEY=… in the environment of `agentry serve`")
                || line.contains("PUT /api/secrets/ANTHROPIC_API_KEY")),
        "{report}"
    );

    // The repository moves to Codex with a model that has no price: Codex and its key are
    // now what a run needs, Claude Code is not, and the price is a warning.
    let codex_unpriced = serde_json::json!({
        "agentType": "codex", "codingModel": "gpt-doctor-unpriced", "reviewModel": "gpt-5"
    });
    patch_settings(&server.base, &admin, &repo_id, &codex_unpriced);
    let (code, report) = doctor(&[
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CLAUDE_BIN", missing.to_str().unwrap()),
        ("AGENTRY_CODEX_BIN", codex.to_str().unwrap()),
        ("OPENAI_API_KEY", KEY),
    ]);
    if sandboxed {
        assert_eq!(code, Some(0), "{report}");
    }
    assert_eq!(status(&report, "codex"), "ok", "{report}");
    assert_eq!(status(&report, "codex-key"), "ok", "{report}");
    assert_eq!(status(&report, "claude-code"), "warn", "{report}");
    assert!(!report.contains("claude-code-key"), "{report}");
    let prices = doctor_line(&report, "prices");
    assert!(
        prices.starts_with("warn ") && prices.contains("gpt-doctor-unpriced"),
        "{report}"
    );

    // A token the code host no longer accepts.
    fake.remove_token(GH);
    let (code, report) = doctor(&ready);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(status(&report, "code-host"), "FAIL", "{report}");

    server.signal("TERM");
    let (exit, stderr) = server.wait(Duration::from_secs(30));
    assert!(exit.success(), "{stderr}");
}
