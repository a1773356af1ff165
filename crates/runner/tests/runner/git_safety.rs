//! An agent cannot turn git against the service: end to end through [`LocalRunner`] with
//! the fake `claude`'s `[fake:tamper-git]` directive (unsandboxed, the worst case: the agent
//! can write the mirror too), a local bare repository as the remote and a plain TCP
//! listener standing in for the remote the agent plants. Nothing the agent planted runs,
//! nothing connects to the listener, the token is written nowhere, and a rewritten `.git`
//! or mirror configuration fails the run with nothing committed or pushed.

use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sandbox::{self, failure};
use crate::support::{assert_no_file_holds, git, peak_rss_kib};
use agentry_runner::workspace::{GitAuth, branch_name};
use agentry_runner::{Control, Execution, Job, Runner, Sandbox, SandboxMode, Verdict};
use base64::Engine;
use tokio::sync::watch;
use uuid::Uuid;

const TOKEN: &str = "ghs_tamper-test-token-0123456789";

/// Every connection to a loopback port, with the bytes it sent.
struct Listener {
    port: u16,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Listener {
    fn start() -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let index = {
                    let mut seen = recorded.lock().unwrap();
                    seen.push(Vec::new());
                    seen.len() - 1
                };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buffer = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    recorded.lock().unwrap()[index].extend_from_slice(&buffer[..n]);
                }
            }
        });
        Listener { port, seen }
    }

    fn connections(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .collect()
    }
}

/// The shared rig with an unsandboxed runner: the agent can reach the mirror through the
/// worktree's `.git`.
type Rig = sandbox::RunnerRig;

fn rig() -> Rig {
    Rig::new(Sandbox::new(SandboxMode::Off))
}

impl Rig {
    /// Runs the job of `prompt` with a code-host token, to completion.
    async fn run_with_token(&self, task_id: Uuid, prompt: &str) -> Execution {
        let job = Job {
            auth: GitAuth::token(TOKEN),
            ..self.job(task_id, prompt)
        };
        let (_cancel, cancel) = watch::channel(false);
        let control = Control {
            cancel,
            started: None,
        };
        self.runner.execute(job, control).await
    }

    /// Makes `main`'s head a commit with a submodule at `sub` (a gitlink to a made-up
    /// commit, and its `.gitmodules` entry); returns the gitlink's commit id.
    fn add_submodule(&self) -> String {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        std::fs::write(
            self.seed.join(".gitmodules"),
            "[submodule \"sub\"]\n\tpath = sub\n\turl = https://github.com/o/sub.git\n",
        )
        .unwrap();
        git(&["add", ".gitmodules"], &self.seed);
        git(
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{sha},sub"),
            ],
            &self.seed,
        );
        git(&["commit", "-q", "-m", "a submodule"], &self.seed);
        git(
            &["push", "-q", "origin", "HEAD:refs/heads/main"],
            &self.seed,
        );
        sha.to_owned()
    }

    /// Runs a new task whose agent tampers with git (`[fake:tamper-git=PORT{how}]`), planting
    /// a remote on a new [`Listener`]'s port.
    async fn run_tampering(&self, how: &str) -> (Uuid, Execution, Listener) {
        let listener = Listener::start();
        let task = Uuid::new_v4();
        let prompt = format!("Fix it [fake:tamper-git={}{how}]", listener.port);
        let execution = self.run_with_token(task, &prompt).await;
        (task, execution, listener)
    }

    /// Asserts that the run of `task_id` failed because the agent `did` something to git
    /// (the message says so, and that nothing was committed or pushed), and that the remote
    /// has no branch of it.
    #[track_caller]
    fn assert_refused(&self, task_id: Uuid, execution: &Execution, did: &str) {
        let message = failure(execution);
        assert!(
            message.contains(&format!("{did}; nothing was committed or pushed")),
            "{message}"
        );
        assert_eq!(self.remote_branch(task_id), "", "{did}");
    }

    /// Plants a repository with a `clean` filter at `path` of the worktree: asserts that the
    /// run is refused, that the filter never ran and that nothing leaked.
    async fn assert_nested_repository_refused(&self, path: &str) {
        let listener = Listener::start();
        let task = Uuid::new_v4();
        let marker = self.dir().join("filter-ran");
        let execution = self
            .run_with_token(
                task,
                &format!("Fix it [fake:nested-repo={path},{}]", marker.display()),
            )
            .await;
        self.assert_refused(
            task,
            &execution,
            &format!("the agent created a nested git repository at {path}/.git"),
        );
        assert_filter_never_ran(self, task, &marker);
        self.assert_nothing_leaked(task, &listener);
    }

    /// Nothing the agent planted ran, nothing connected to the planted remote, and no file
    /// anywhere under the rig (the agent's HOME, the mirror, the remote) holds the token.
    fn assert_nothing_leaked(&self, task_id: Uuid, listener: &Listener) {
        let ran: Vec<String> = std::fs::read_dir(self.home(task_id))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("tampered-"))
            .collect();
        assert!(ran.is_empty(), "planted programs ran: {ran:?}");
        let connections = listener.connections();
        assert!(
            connections.is_empty(),
            "the planted remote was contacted: {connections:?}"
        );
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"));
        assert_no_file_holds(self.dir(), &[TOKEN, &encoded]);
    }
}

/// The agent points the worktree's `.git` at a git dir of its own (remote, fsmonitor,
/// hooks) and plants the same in the real metadata: the run fails saying so, nothing is
/// committed or pushed, nothing planted runs, the planted remote hears nothing.
#[tokio::test]
async fn a_rewritten_dot_git_fails_the_run_with_nothing_pushed_or_run() {
    let rig = rig();
    let (task, execution, listener) = rig.run_tampering("").await;
    rig.assert_refused(task, &execution, "the agent modified the worktree's .git");
    // The fake really did rewrite it, with a usable git dir of its own.
    let evil = rig.home(task).join("evil.git");
    assert!(evil.join("config").exists());
    assert!(git(&["config", "remote.origin.url"], &evil).contains(&listener.port.to_string()));
    rig.assert_nothing_leaked(task, &listener);
}

/// Hooks and an fsmonitor planted in the mirror's `hooks/` and the worktree's metadata
/// (`config.worktree` with an fsmonitor and an evil remote), with `.git` itself left
/// alone: none of it is used; the push reaches the real remote.
#[tokio::test]
async fn planted_hooks_and_metadata_never_run_and_the_push_reaches_the_real_remote() {
    let rig = rig();
    let (task, execution, listener) = rig.run_tampering(":metadata").await;
    let (branch, commit) = pushed(&execution);
    assert_eq!(branch, branch_name(task));
    assert_eq!(rig.remote_branch(task), commit);
    // The hooks were really planted in the mirror.
    let hook = rig
        .root
        .join("workspaces/mirrors/repo-1.git/hooks/pre-push");
    assert!(hook.exists());
    rig.assert_nothing_leaked(task, &listener);
}

/// The agent rewrites the mirror's configuration (fsmonitor, a remote, `insteadOf`
/// rewriting every URL to the planted remote): the run fails with nothing pushed, and the
/// next run repairs the mirror and pushes normally.
#[tokio::test]
async fn a_rewritten_mirror_config_fails_the_run_and_is_repaired_for_the_next() {
    let rig = rig();
    let (task, execution, listener) = rig.run_tampering(":config").await;
    rig.assert_refused(
        task,
        &execution,
        "the agent modified the git configuration of the repository's mirror",
    );
    rig.assert_nothing_leaked(task, &listener);

    let again = Uuid::new_v4();
    let execution = rig.run_with_token(again, "Fix it properly").await;
    pushed(&execution);
    rig.assert_nothing_leaked(again, &listener);
    rig.assert_nothing_leaked(task, &listener);
}

/// The branch and the commit a run pushed (panics, with the output, on any other verdict).
#[track_caller]
fn pushed(execution: &Execution) -> (&str, &str) {
    match &execution.verdict {
        Verdict::Pushed { branch, commit } => (branch, commit),
        other => panic!("{other:?}: {}", execution.output),
    }
}

/// The fake's planted filter ran (as the service) if `$HOME/tampered-filter` or the marker
/// exists.
fn assert_filter_never_ran(rig: &Rig, task: Uuid, marker: &std::path::Path) {
    assert!(
        rig.home(task).join("filter-clean").exists(),
        "the fake planted no filter"
    );
    assert!(
        !rig.home(task).join("tampered-filter").exists() && !marker.exists(),
        "the planted clean filter ran"
    );
}

/// A git repository the agent plants in a plain directory (with a `clean` filter in its
/// own configuration): the run is refused before git touches the worktree, nothing is
/// pushed, the filter never runs.
#[tokio::test]
async fn a_nested_repository_is_refused_and_its_filter_never_runs() {
    rig().assert_nested_repository_refused("lib/vendor").await;
}

/// The base commit has a submodule at `sub/` and the agent makes `sub/.git` a repository
/// of its own whose `clean` filter `git add` would run inside the submodule (the finding):
/// refused, nothing pushed, the filter never runs.
#[tokio::test]
async fn a_repository_planted_in_a_submodule_is_refused_and_its_filter_never_runs() {
    let rig = rig();
    rig.add_submodule();
    rig.assert_nested_repository_refused("sub").await;
}

/// The names a case-insensitive, NTFS or HFS+ file system (or git itself) takes for
/// `.git` are refused as well.
#[tokio::test]
async fn names_git_takes_for_dot_git_are_refused() {
    let rig = rig();
    for name in [
        ".GIT",
        ".git.",
        ".git ",
        "GIT~1",
        ".g\u{200C}it",
        "\u{FEFF}.Git",
    ] {
        let task = Uuid::new_v4();
        let execution = rig
            .run_with_token(task, &format!("Fix it [fake:plant-dir=deep/{name}]"))
            .await;
        rig.assert_refused(
            task,
            &execution,
            &format!("the agent created a nested git repository at deep/{name}"),
        );
    }
}

/// The agent replaces the worktree's `.git` with a 3 GiB sparse file: refused as tampering
/// without reading it (the service's peak memory stays flat), quickly.
#[tokio::test]
async fn a_huge_dot_git_is_refused_without_reading_it() {
    let rig = rig();
    let task = Uuid::new_v4();
    let before = peak_rss_kib();
    let started = std::time::Instant::now();
    let execution = rig.run_with_token(task, "Fix it [fake:sparse-git=3]").await;
    let took = started.elapsed();
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!("sparse 3 GiB .git: refused in {took:?}, peak RSS grew by {grown} KiB");
    rig.assert_refused(task, &execution, "the agent modified the worktree's .git");
    assert!(grown < 200 * 1024, "the peak RSS grew by {grown} KiB");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// Runs a task of `prompt` on a base with a submodule at `sub`: asserts that it pushed a
/// commit in which `sub` is still the base's gitlink; returns the rig, the task and the
/// commit.
async fn run_over_a_submodule(prompt: &str) -> (Rig, Uuid, String) {
    let rig = rig();
    let sha = rig.add_submodule();
    let task = Uuid::new_v4();
    let execution = rig.run_with_token(task, prompt).await;
    let commit = pushed(&execution).1.to_owned();
    assert_eq!(
        git(&["ls-tree", &commit, "sub"], &rig.bare),
        format!("160000 commit {sha}\tsub")
    );
    (rig, task, commit)
}

/// The base's submodules are pushed as they were: files the agent wrote in a submodule's
/// directory (without a `.git`) are not committed, and the gitlink keeps its commit.
#[tokio::test]
async fn the_base_gitlinks_are_kept_in_the_pushed_commit() {
    let (rig, task, commit) = run_over_a_submodule("Fix it [fake:plant-dir=sub/inner]").await;
    assert_eq!(rig.remote_branch(task), commit);
    let files = git(&["ls-tree", "-r", "--name-only", &commit], &rig.bare);
    let files: Vec<&str> = files.lines().collect();
    assert_eq!(
        files,
        [".gitmodules", "AGENT_CHANGES.md", "README.md", "sub"],
        "{files:?}"
    );
}

/// The agent deletes a submodule's directory: the pushed commit still has the submodule at
/// the base's commit (git would otherwise record the deletion).
#[tokio::test]
async fn a_deleted_submodule_directory_keeps_its_gitlink() {
    run_over_a_submodule("Fix it [fake:remove-path=sub]").await;
}
