//! Agents run in a bubblewrap sandbox (docs/contract.md#65-agent-sandbox, #12-configuration), through [`LocalRunner`] with the
//! fake `claude` and a local bare repository as the remote: what a hostile agent can read,
//! that its own work still happens, that nothing it started outlives a cancel or a
//! recovery, and that without a working `bwrap` no agent starts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{PATH, fake, git, seeded_bare, write_program};
use agentry_domain::AgentType;
use agentry_runner::workspace::{GitAuth, RepoSpec, branch_name};
use agentry_runner::{
    AgentSpec, Control, Execution, Job, JobKind, LocalConfig, LocalRunner, PriceTable, Runner,
    Sandbox, SandboxMode, Verdict,
};
pub(crate) use agentry_testkit::process::processes_with_env;
use agentry_testkit::wait::eventually_async;
use tempfile::TempDir;
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

/// A [`Rig`] with its runner; a test module adds the methods it needs in an `impl` of its
/// own.
pub(crate) struct RunnerRig {
    rig: Rig,
    pub(crate) runner: Arc<LocalRunner>,
}

impl RunnerRig {
    /// A fresh rig whose runner sandboxes agents as `sandbox` says.
    pub(crate) fn new(sandbox: Sandbox) -> RunnerRig {
        let rig = Rig::new();
        let runner = rig.runner(sandbox);
        RunnerRig { rig, runner }
    }
}

impl std::ops::Deref for RunnerRig {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        &self.rig
    }
}

/// A data directory (`root`) next to a bare repository with a README on `main`.
pub(crate) struct Rig {
    dir: TempDir,
    pub(crate) root: PathBuf,
    pub(crate) bare: PathBuf,
    /// The working clone that seeded `bare`, for commits of the base.
    pub(crate) seed: PathBuf,
}

impl Rig {
    pub(crate) fn new() -> Rig {
        let dir = TempDir::new().unwrap();
        let (bare, seed) = seeded_bare(dir.path(), "seed");
        let root = dir.path().join("agentry");
        std::fs::create_dir_all(&root).unwrap();
        Rig {
            dir,
            root,
            bare,
            seed,
        }
    }

    /// The directory that holds everything of the rig.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub(crate) fn config(&self, sandbox: Sandbox) -> LocalConfig {
        LocalConfig {
            root: self.root.clone(),
            claude_bin: fake("claude"),
            codex_bin: fake("codex"),
            prices: PriceTable::builtin(),
            env: agentry_runner::agent::ServiceEnv {
                path: Some(PATH.into()),
                ..Default::default()
            },
            stop_grace: Duration::from_secs(1),
            sandbox,
            network: None,
        }
    }

    pub(crate) fn runner(&self, sandbox: Sandbox) -> Arc<LocalRunner> {
        Arc::new(LocalRunner::new(self.config(sandbox)))
    }

    /// A runner with `sandbox`, its agent (posing as Claude Code) `program`.
    pub(crate) fn agent_runner(&self, sandbox: Sandbox, program: &Path) -> Arc<LocalRunner> {
        Arc::new(LocalRunner::new(LocalConfig {
            claude_bin: program.to_owned(),
            ..self.config(sandbox)
        }))
    }

    /// Writes the program `text` as `name` next to the data directory, readable and
    /// executable by everyone.
    pub(crate) fn program(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir().join(name);
        write_program(&path, text);
        path
    }

    pub(crate) fn job(&self, task_id: Uuid, prompt: &str) -> Job {
        Job {
            task_id,
            attempt: 1,
            kind: JobKind::Coding {
                commit_message: "agent work".into(),
            },
            repo: RepoSpec {
                key: "repo-1".into(),
                clone_url: self.bare.to_str().unwrap().to_owned(),
                default_branch: "main".into(),
                host: "github.com".into(),
                allow_local: true,
            },
            agent: AgentSpec::unlimited(AgentType::ClaudeCode, "claude-sonnet-4-5-20250929"),
            prompt: prompt.to_owned(),
            auth: GitAuth::none(),
            wall_time: Duration::from_secs(120),
        }
    }

    pub(crate) fn home(&self, task_id: Uuid) -> PathBuf {
        self.root
            .join("runs")
            .join(task_id.to_string())
            .join("1/home")
    }

    /// The head of the task's branch in the bare repository (empty when it was not pushed).
    pub(crate) fn remote_branch(&self, task_id: Uuid) -> String {
        git(
            &[
                "branch",
                "--list",
                "--format=%(objectname)",
                &branch_name(task_id),
            ],
            &self.bare,
        )
    }
}

/// A job started on its own task, with its cancel switch and its start signal.
pub(crate) struct Started {
    pub(crate) cancel: watch::Sender<bool>,
    pub(crate) started: oneshot::Receiver<()>,
    pub(crate) handle: tokio::task::JoinHandle<Execution>,
}

pub(crate) fn start(runner: &Arc<LocalRunner>, job: Job) -> Started {
    let (cancel, cancel_rx) = watch::channel(false);
    let (started_tx, started) = oneshot::channel();
    let runner = Arc::clone(runner);
    let handle = tokio::spawn(async move {
        runner
            .execute(
                job,
                Control {
                    cancel: cancel_rx,
                    started: Some(started_tx),
                },
            )
            .await
    });
    Started {
        cancel,
        started,
        handle,
    }
}

/// Whether bubblewrap works on this machine; where it does not, the sandboxed tests have
/// nothing to test and return (CI sets `AGENTRY_TEST_REQUIRE_SANDBOX=1`, which makes that a
/// failure instead).
pub(crate) fn sandbox_works_here() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS
        .get_or_init(|| agentry_testkit::sandbox::sandboxed(agentry_runner::sandbox::works_here()))
}

/// The sandbox mode these tests run agents in: `auto` where bubblewrap works here.
pub(crate) fn sandbox_mode() -> SandboxMode {
    if sandbox_works_here() {
        SandboxMode::Auto
    } else {
        SandboxMode::Off
    }
}

pub(crate) async fn run(runner: &Arc<LocalRunner>, job: Job) -> Execution {
    let started = start(runner, job);
    let execution = started.handle.await.unwrap();
    drop(started.cancel);
    execution
}

/// Asserts the run ended with `verdict`, showing its output if not.
#[track_caller]
pub(crate) fn assert_verdict(execution: &Execution, verdict: Verdict) {
    assert_eq!(execution.verdict, verdict, "{}", execution.output);
}

/// Asserts the run pushed its change, showing its verdict and output if not.
#[track_caller]
pub(crate) fn assert_pushed(execution: &Execution) {
    assert!(
        matches!(execution.verdict, Verdict::Pushed { .. }),
        "{:?}\n{}",
        execution.verdict,
        execution.output
    );
}

/// Waits until the agent of `task`'s first attempt printed its init event, as the run's
/// live output shows.
pub(crate) async fn wait_for_init(runner: &LocalRunner, task: Uuid) {
    eventually_async(
        Duration::from_secs(30),
        "the agent's init event in the output",
        async || {
            runner
                .live_output(task, 1)
                .is_some_and(|output| output.contains("\"subtype\":\"init\""))
        },
    )
    .await;
}

/// Waits until no process carries `home` (`HOME=…`, the run's) any more.
pub(crate) async fn wait_for_no_process_with(home: &str) {
    eventually_async(
        Duration::from_secs(30),
        "every process of the run to end",
        async || processes_with_env(home).is_empty(),
    )
    .await;
}

/// Asserts that the stopped fake agent (`[fake:sleep=…]`) got the stop and, like Claude Code
/// on SIGINT, printed what it had spent.
#[track_caller]
pub(crate) fn assert_stopped_agent_reported(execution: &Execution) {
    assert!(
        execution.output.contains("\"error_during_execution\""),
        "{}",
        execution.output
    );
    let report = execution.report.as_ref().unwrap();
    assert_eq!(
        report.cost_usd.map(|c| c.to_string()).as_deref(),
        Some("0.123456")
    );
}

/// The message of a failed run (panics, with the output, on any other verdict).
pub(crate) fn failure(execution: &Execution) -> &str {
    match &execution.verdict {
        Verdict::Failed(message) => message,
        other => panic!(
            "expected a failure, got {other:?}; output: {}",
            execution.output
        ),
    }
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// A `sleep` child of the test with a marker in its environment: a stand-in for the
/// service, or a `git push` holding a token. Killed when dropped.
struct Marked {
    child: Child,
    marker: String,
}

impl Marked {
    async fn spawn() -> Marked {
        let marker = format!("secret-marker-{}", Uuid::new_v4().simple());
        let child = Command::new("sleep")
            .arg("300")
            .env("AGENTRY_TEST_TOKEN", &marker)
            .spawn()
            .unwrap();
        let environ = format!("/proc/{}/environ", child.id());
        let wanted = marker.clone();
        eventually_async(
            Duration::from_secs(10),
            "the marked process to start",
            async || {
                std::fs::read(&environ).is_ok_and(|e| String::from_utf8_lossy(&e).contains(&wanted))
            },
        )
        .await;
        Marked { child, marker }
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The secrets a snooping agent goes after: (path, contents).
fn plant_secrets(rig: &Rig, own_task: Uuid, marked: &Marked) -> Vec<(String, String)> {
    let mut secrets = Vec::new();
    let mut plant = |path: PathBuf, contents: String| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &contents).unwrap();
        secrets.push((path.to_str().unwrap().to_owned(), contents));
    };
    let tag = || Uuid::new_v4().simple().to_string();
    plant(rig.root.join("master.key"), format!("MASTER-KEY-{}", tag()));
    plant(rig.root.join("agentry.db"), format!("DATABASE-{}", tag()));
    plant(
        rig.root.join("admin-token"),
        format!("ADMIN-TOKEN-{}", tag()),
    );
    let other = Uuid::new_v4().to_string();
    plant(
        rig.root.join("runs").join(&other).join("1/output.log"),
        format!("OTHER-RUN-LOG-{}", tag()),
    );
    plant(
        rig.root
            .join("workspaces/worktrees")
            .join(&other)
            .join("NOTES.md"),
        format!("OTHER-WORKTREE-{}", tag()),
    );
    secrets.push((
        format!("/proc/{}/environ", marked.child.id()),
        marked.marker.clone(),
    ));
    // Its own log is the service's, not the agent's (it exists while the agent runs).
    let own_log = rig
        .root
        .join("runs")
        .join(own_task.to_string())
        .join("1/output.log");
    secrets.push((own_log.to_str().unwrap().to_owned(), String::new()));
    secrets
}

/// Runs the snooping fake under `sandbox`: the run, what the agent saw, the planted secrets.
async fn snoop(sandbox: Sandbox) -> (Rig, Execution, String, Vec<(String, String)>) {
    snoop_also(sandbox, Vec::new()).await
}

/// [`snoop`], the agent also trying the files `also` ((path, contents)), which are listed
/// after the planted secrets.
async fn snoop_also(
    sandbox: Sandbox,
    also: Vec<(String, String)>,
) -> (Rig, Execution, String, Vec<(String, String)>) {
    let rig = Rig::new();
    let marked = Marked::spawn().await;
    let task = Uuid::new_v4();
    let mut secrets = plant_secrets(&rig, task, &marked);
    secrets.extend(also);
    let paths: Vec<&str> = secrets.iter().map(|(p, _)| p.as_str()).collect();
    let prompt = format!("Snoop around\n[fake:snoop={}]", paths.join(","));
    let runner = rig.runner(sandbox);
    let execution = run(&runner, rig.job(task, &prompt)).await;
    // Binaries read (`/usr/bin/git`) are not UTF-8.
    let seen =
        String::from_utf8_lossy(&std::fs::read(rig.home(task).join("snoop")).unwrap()).into_owned();
    // The agent's own work happened and was pushed.
    assert_pushed(&execution);
    let branch = format!("refs/heads/{}", branch_name(task));
    assert_eq!(
        git(&["show", &format!("{branch}:AGENT_CHANGES.md")], &rig.bare),
        "Snoop around"
    );
    // Git works in the worktree.
    let main = git(&["rev-parse", "refs/heads/main"], &rig.bare);
    assert!(seen.contains(&format!("GIT {main}\n")), "{seen}");
    (rig, execution, seen, secrets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_agent_reads_no_secret_no_other_run_and_no_other_process() {
    if !sandbox_works_here() {
        return;
    }
    let (_rig, execution, seen, secrets) = snoop(Sandbox::new(SandboxMode::Auto)).await;
    assert!(execution.sandboxed);
    for (path, contents) in &secrets {
        assert!(
            seen.contains(&format!("DENIED {path}\n")),
            "{path} was readable:\n{seen}"
        );
        if !contents.is_empty() {
            assert!(
                !seen.contains(contents.as_str()),
                "{contents} leaked:\n{seen}"
            );
        }
    }
}

/// Files planted for a test outside its temporary directory, removed when dropped.
struct Planted(Vec<PathBuf>);

impl Planted {
    /// Writes `contents` at `path` (creating its directory, removed afterwards when it is
    /// created here); `false` when this user cannot write there.
    fn plant(&mut self, path: PathBuf, dir_to_remove: Option<PathBuf>, contents: &str) -> bool {
        let parent = path.parent().unwrap().to_owned();
        if std::fs::create_dir_all(&parent).is_err() || std::fs::write(&path, contents).is_err() {
            return false;
        }
        self.0.push(dir_to_remove.unwrap_or(path));
        true
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        for path in &self.0 {
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Where a test places an `AGENTRY_SANDBOX_EXTRA_RO` directory outside `/tmp`
/// ([`agentry_testkit::dirs::outside_tmp`]); `None` (with a note) where there is none.
fn dir_outside_tmp() -> Option<TempDir> {
    let dir = agentry_testkit::dirs::outside_tmp(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "agentry-test-",
    );
    if dir.is_none() {
        eprintln!("note: no writable directory outside /tmp here; only /tmp's extra path is tried");
    }
    dir
}

/// The sandbox mounts an allow-list of the system, not all of it: a directory outside it
/// (beside each extra path), `/srv`, `/etc/default` and `/var/log` are absent, while
/// `/etc/passwd` and `/usr/bin/git` are readable, and so are the directories the operator
/// lists in `AGENTRY_SANDBOX_EXTRA_RO` ([`Sandbox::with_extra_ro`]): one in `/tmp` (which
/// the sandbox replaces with its own, so the extra path is mounted over it) and one outside
/// it. Nothing depends on where the build or the checkout lies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_agent_sees_only_the_allowed_system_and_the_extra_paths() {
    if !sandbox_works_here() {
        return;
    }
    let tag = Uuid::new_v4().simple().to_string();
    let mut planted = Planted(Vec::new());
    let in_tmp = tempfile::Builder::new()
        .prefix("agentry-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let elsewhere = dir_outside_tmp();
    let bases: Vec<PathBuf> = std::iter::once(&in_tmp)
        .chain(elsewhere.as_ref())
        .map(|d| std::fs::canonicalize(d.path()).unwrap())
        .collect();
    let mut hidden = Vec::new();
    let mut tools = Vec::new();
    let mut extra = Vec::new();
    for base in &bases {
        // Beside the extra directory, a directory nobody listed stays hidden.
        let outside = base.join("outside/.env");
        assert!(planted.plant(outside.clone(), None, &format!("OUTSIDE-{tag}")));
        hidden.push((
            outside.to_str().unwrap().to_owned(),
            format!("OUTSIDE-{tag}"),
        ));
        let tool = base.join("toolchain/bin/tool-version");
        assert!(planted.plant(tool.clone(), None, &format!("TOOLCHAIN-{tag}")));
        tools.push(tool.to_str().unwrap().to_owned());
        extra.push(base.join("toolchain"));
    }
    // Where this user may write (root in CI containers): the system's own places.
    let srv_dir = PathBuf::from(format!("/srv/agentry-test-{tag}"));
    for (path, dir) in [
        (srv_dir.join("app.env"), Some(srv_dir.clone())),
        (
            PathBuf::from(format!("/etc/default/agentry-test-{tag}")),
            None,
        ),
        (
            PathBuf::from(format!("/var/log/agentry-test-{tag}.log")),
            None,
        ),
    ] {
        let contents = format!("SYSTEM-SECRET-{tag}-{}", hidden.len());
        if planted.plant(path.clone(), dir, &contents) {
            hidden.push((path.to_str().unwrap().to_owned(), contents));
        } else {
            eprintln!("note: cannot plant {} here; not tried", path.display());
        }
    }
    let readable: Vec<String> = ["/etc/passwd".to_owned(), "/usr/bin/git".to_owned()]
        .into_iter()
        .chain(tools.iter().cloned())
        .collect();
    let also: Vec<(String, String)> = hidden
        .iter()
        .cloned()
        .chain(readable.iter().map(|p| (p.clone(), String::new())))
        .collect();
    let sandbox = Sandbox::new(SandboxMode::Auto).with_extra_ro(extra);
    let (_rig, execution, seen, _) = snoop_also(sandbox, also).await;
    assert!(execution.sandboxed);
    for (path, contents) in &hidden {
        assert!(
            seen.contains(&format!("DENIED {path}\n")),
            "{path} was readable:\n{seen}"
        );
        assert!(!seen.contains(contents.as_str()), "{contents} leaked");
    }
    for path in &readable {
        assert!(
            seen.contains(&format!("READ {path}\n")),
            "{path} was not readable:\n{seen}"
        );
    }
    assert!(seen.contains("root:"), "/etc/passwd was empty");
    assert_eq!(
        seen.matches(&format!("TOOLCHAIN-{tag}")).count(),
        tools.len(),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsandboxed_agent_reads_them_all() {
    let (_rig, execution, seen, secrets) = snoop(Sandbox::new(SandboxMode::Off)).await;
    assert!(!execution.sandboxed);
    for (path, contents) in &secrets {
        assert!(seen.contains(&format!("READ {path}\n")), "{path}:\n{seen}");
        assert!(seen.contains(contents.as_str()), "{contents}:\n{seen}");
    }
}

/// A sandboxed run of `[fake:sleep=300]` (which leaves `sleep 300 &` behind), started on a
/// rig of its own.
struct Sleeper {
    rig: Rig,
    task: Uuid,
    started: Started,
    /// `HOME=…` of the run, which all its processes carry.
    home: String,
}

/// A [`Sleeper`] whose processes run, or `None` where the sandbox does not work.
async fn sleeper() -> Option<Sleeper> {
    if !sandbox_works_here() {
        return None;
    }
    let rig = Rig::new();
    let runner = rig.runner(Sandbox::new(SandboxMode::Auto));
    let task = Uuid::new_v4();
    let (started, home) = start_sleeper(&rig, &runner, task).await;
    Some(Sleeper {
        rig,
        task,
        started,
        home,
    })
}

/// Starts `[fake:sleep=300]` sandboxed, and waits until its processes run: their host pids,
/// all carrying the run's `HOME`.
async fn start_sleeper(rig: &Rig, runner: &Arc<LocalRunner>, task: Uuid) -> (Started, String) {
    let mut started = start(runner, rig.job(task, "Sleep\n[fake:sleep=300]"));
    (&mut started.started).await.unwrap();
    let child_pid = rig.home(task).join("child.pid");
    eventually_async(
        Duration::from_secs(20),
        "the agent's background child",
        async || child_pid.exists(),
    )
    .await;
    // The agent writes child.pid before it prints its first event: wait for that event to
    // reach the run's output too (on a loaded machine it can come much later).
    wait_for_init(runner, task).await;
    let home = format!("HOME={}", rig.home(task).display());
    let pids = processes_with_env(&home);
    assert!(
        pids.iter()
            .any(|pid| cmdline(*pid).trim_end() == "sleep 300"),
        "{pids:?}: {:?}",
        pids.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );
    assert!(
        pids.iter()
            .any(|pid| cmdline(*pid).starts_with("/") && cmdline(*pid).contains("bwrap")),
        "the agent runs in bwrap: {:?}",
        pids.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );
    (started, home)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_sandboxed_run_leaves_no_process_behind() {
    let Some(Sleeper {
        rig: _rig,
        started,
        home,
        ..
    }) = sleeper().await
    else {
        return;
    };
    started.cancel.send(true).unwrap();
    let execution = started.handle.await.unwrap();
    assert_eq!(execution.verdict, Verdict::Cancelled);
    assert!(execution.sandboxed);
    // The stop reached the agent inside the sandbox (not bwrap, whose death would have
    // killed it silently): like Claude Code on SIGINT, it printed what it had spent.
    assert_stopped_agent_reported(&execution);
    wait_for_no_process_with(&home).await;
}

/// A review agent sees the change with git inside the sandbox (`git diff <base>...HEAD`,
/// `git log`, `git status`) and can change nothing of git: its worktree's metadata is
/// read-only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_review_agent_reads_the_change_and_writes_no_git_metadata() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    // The pull request's branch: one commit adding a file.
    let task = Uuid::new_v4();
    let branch = branch_name(task);
    let work = rig.root.parent().unwrap().join("seed");
    git(&["checkout", "-q", "-b", &branch], &work);
    std::fs::write(work.join("CHANGE.md"), "the change under review\n").unwrap();
    git(&["add", "CHANGE.md"], &work);
    git(&["commit", "-q", "-m", "change"], &work);
    git(&["push", "-q", "origin", &branch], &work);
    // A review agent that runs the commands and tries to write its git metadata.
    let agent = rig.program(
        "reviewer",
        r#"#!/bin/sh
if [ "${1:-}" = --version ]; then echo "2.1.197 (Claude Code)"; exit 0; fi
cat >/dev/null
git diff origin/main...HEAD >"$HOME/diff" 2>&1
git log --oneline -1 >"$HOME/log" 2>&1
git status --short >"$HOME/status" 2>&1 && echo ok >>"$HOME/status"
meta=$(sed -n 's/^gitdir: //p' .git)
if touch "$meta/probe" 2>/dev/null; then echo writable >"$HOME/meta"; else echo read-only >"$HOME/meta"; fi
if git update-ref refs/heads/evil HEAD 2>/dev/null; then echo written >"$HOME/refs"; else echo refused >"$HOME/refs"; fi
printf '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Looks fine.","total_cost_usd":0.01,"modelUsage":{}}
'
"#,
    );
    let runner = rig.agent_runner(Sandbox::new(SandboxMode::Auto), &agent);
    let job = Job {
        kind: JobKind::Review {
            branch: branch.clone(),
        },
        ..rig.job(task, "Review it")
    };
    let execution = run(&runner, job).await;
    assert!(execution.sandboxed);
    assert_verdict(
        &execution,
        Verdict::Reviewed {
            text: "Looks fine.".into(),
        },
    );
    let home = rig.home(task);
    let read = |name: &str| std::fs::read_to_string(home.join(name)).unwrap();
    assert!(
        read("diff").contains("+the change under review"),
        "{}",
        read("diff")
    );
    assert!(read("log").contains("change"), "{}", read("log"));
    assert!(read("status").ends_with("ok\n"), "{}", read("status"));
    assert_eq!(read("meta"), "read-only\n");
    assert_eq!(read("refs"), "refused\n");
}

/// A sandboxed coding agent writes git metadata (`git status` works) but never the mirror's
/// entry of its worktree, which git lists for every command on the repository: the agent
/// replaces what it sees there with a FIFO, and `git worktree list` on the mirror (what
/// another task's fetch or `worktree add` does) still answers at once, reading the entry as
/// `git worktree add` wrote it. The agent's copy is gone after the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coding_agent_cannot_jam_the_mirrors_worktree_entry() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    let task = Uuid::new_v4();
    let agent = rig.program(
        "jammer",
        r#"#!/bin/sh
if [ "${1:-}" = --version ]; then echo "2.1.197 (Claude Code)"; exit 0; fi
cat >/dev/null
echo fixed >fix.txt
meta=$(git rev-parse --absolute-git-dir)
git status --short >"$HOME/status" 2>&1 && touch "$meta/probe" && echo ok >>"$HOME/status"
git add -A >"$HOME/add" 2>&1
rm -f "$meta/gitdir" && mkfifo "$meta/gitdir" && echo jammed >"$HOME/jammed"
i=0
while [ ! -e "$HOME/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
printf '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done.","total_cost_usd":0.01,"modelUsage":{}}
'
"#,
    );
    let runner = rig.agent_runner(Sandbox::new(SandboxMode::Auto), &agent);
    let started = start(&runner, rig.job(task, "Fix it"));
    let home = rig.home(task);
    eventually_async(Duration::from_secs(60), "the agent's FIFO", async || {
        home.join("jammed").exists()
    })
    .await;
    let mirror = rig.root.join("workspaces/mirrors/repo-1.git");
    let listed = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new("git")
            .arg(format!("--git-dir={}", mirror.display()))
            .args(["worktree", "list", "--porcelain"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("git on the mirror waits on the agent's FIFO")
    .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let worktree = rig.root.join("workspaces/worktrees").join(task.to_string());
    assert!(
        listed.contains(&format!("worktree {}\n", worktree.display())),
        "{listed}"
    );
    std::fs::write(home.join("release"), "").unwrap();
    let execution = started.handle.await.unwrap();
    drop(started.cancel);
    assert_pushed(&execution);
    assert_eq!(
        std::fs::read_to_string(home.join("status")).unwrap(),
        "?? fix.txt\nok\n",
        "the agent's git status and a file of its git metadata"
    );
    let copies = rig.root.join("workspaces/agent-git");
    assert_eq!(std::fs::read_dir(&copies).unwrap().count(), 0);
    assert_eq!(rig.remote_branch(task).len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salvaging_a_dead_services_run_ends_its_whole_sandbox() {
    let Some(Sleeper {
        rig,
        task,
        started,
        home,
    }) = sleeper().await
    else {
        return;
    };
    // Another runner over the same data directory (the restarted service) recovers it.
    let restarted = rig.runner(Sandbox::new(SandboxMode::Auto));
    let spec =
        agentry_runner::AgentSpec::unlimited(agentry_domain::AgentType::ClaudeCode, "sonnet");
    let output = restarted.salvage(task, 1, &spec).unwrap().output;
    assert!(output.contains("\"subtype\":\"init\""), "{output}");
    wait_for_no_process_with(&home).await;
    let execution = started.handle.await.unwrap();
    assert!(
        matches!(execution.verdict, Verdict::Failed(_)),
        "{:?}",
        execution.verdict
    );
    drop(started.cancel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_working_bwrap_agents_are_refused_and_nothing_starts() {
    for (bwrap, why) in [
        ("/nonexistent/bwrap", "cannot start /nonexistent/bwrap"),
        ("/bin/false", "a trial run of /bin/false failed"),
    ] {
        let rig = Rig::new();
        let sandbox = Sandbox::with_bwrap(bwrap);
        let refused = sandbox.check().await.unwrap_err();
        assert!(refused.contains(why), "{refused}");
        let runner = rig.runner(sandbox);
        let task = Uuid::new_v4();
        let started = start(&runner, rig.job(task, "Do it"));
        let execution = started.handle.await.unwrap();
        let Verdict::Failed(message) = &execution.verdict else {
            panic!("{:?}", execution.verdict);
        };
        assert!(
            message
                .starts_with("agents run in a bubblewrap sandbox, which is not available here (")
                && message.contains(why)
                && message.ends_with(
                    "install bubblewrap, or set AGENTRY_AGENT_SANDBOX=off to run agents \
                     unsandboxed"
                ),
            "{message}"
        );
        assert!(!execution.sandboxed);
        assert!(execution.ended.is_none() && execution.report.is_none());
        // Nothing was prepared or started.
        assert!(started.started.await.is_err(), "the start signal fired");
        assert!(!rig.root.join("runs").exists());
        assert!(!rig.root.join("workspaces").exists());
    }
    // Off needs no bwrap at all.
    assert_eq!(Sandbox::new(SandboxMode::Off).check().await, Ok(false));
}

/// Sandboxed runs get a network namespace of their own: a `bwrap` that cannot create one
/// is refused, and the message says that is what fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bwrap_without_network_namespaces_is_refused_with_the_reason() {
    let dir = TempDir::new().unwrap();
    let bwrap = dir.path().join("bwrap");
    write_program(
        &bwrap,
        "#!/bin/sh\n\
         case \" $* \" in *\" --unshare-net \"*)\n\
         \techo 'bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted' >&2; exit 1 ;;\n\
         esac\n\
         exit 0\n",
    );
    let refused = Sandbox::with_bwrap(&bwrap).check().await.unwrap_err();
    assert!(
        refused.contains("a trial run of")
            && refused.contains("Failed RTM_NEWADDR")
            && refused.contains(
                "works here without a network namespace, but agents get one of their own \
                 (--unshare-net), which cannot be created here"
            )
            && refused.ends_with("set AGENTRY_AGENT_SANDBOX=off to run agents unsandboxed"),
        "{refused}"
    );
}

/// Of the agent program and the forwarder (the agentry binary), the sandbox shows their
/// files, not their directories: a file placed beside the forwarder (in the build's
/// directory, wherever it lies) and one beside the agent are not readable, and listing the
/// forwarder's directory shows the forwarder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_beside_the_forwarder_and_the_agent_are_not_visible() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    let tag = Uuid::new_v4().simple().to_string();
    let forwarder = std::fs::canonicalize(crate::limits::FORWARDER).unwrap();
    let forwarder_dir = forwarder.parent().unwrap().to_owned();
    let mut planted = Planted(Vec::new());
    let beside_forwarder = forwarder_dir.join(format!("agentry-test-beside-{tag}"));
    assert!(planted.plant(beside_forwarder.clone(), None, &format!("BESIDE-{tag}")));
    let beside_agent = rig.dir().join(format!("beside-agent-{tag}"));
    assert!(planted.plant(beside_agent.clone(), None, &format!("AGENT-SIDE-{tag}")));
    let program = crate::limits::agent(
        &rig,
        "lister",
        &format!(
            r#"echo "forwarder-dir $(ls -A '{dir}' 2>&1 | tr '\n' ' ')"
echo "beside-forwarder $(cat '{forwarder_side}' 2>/dev/null || echo hidden)"
echo "beside-agent $(cat '{agent_side}' 2>/dev/null || echo hidden)"
"#,
            dir = forwarder_dir.display(),
            forwarder_side = beside_forwarder.display(),
            agent_side = beside_agent.display(),
        ),
    );
    let execution = crate::limits::probe_run(
        &rig,
        Sandbox::new(SandboxMode::Auto),
        &program,
        "List the directories",
    )
    .await;
    let reported = |key: &str| crate::limits::reported(&execution, key).to_owned();
    assert_eq!(reported("beside-forwarder"), "hidden");
    assert_eq!(reported("beside-agent"), "hidden");
    assert_eq!(
        reported("forwarder-dir").trim_end(),
        forwarder.file_name().unwrap().to_str().unwrap()
    );
    assert!(!execution.output.contains(&tag), "{}", execution.output);
}
