//! A service run as root runs its agents as another user (docs/security.md#the-agents-user):
//! the agent works in its worktree and `HOME` as that user, git trusts the repository, and
//! what it wrote (a file only it may read included) is committed by the service.

use std::os::unix::fs::MetadataExt;

use crate::limits::{agent, reported};
use crate::sandbox::{Rig, assert_verdict, failure, run, sandbox_works_here};
use crate::support::git;
use agentry_runner::user::AgentUser;
use agentry_runner::{Sandbox, SandboxMode, Verdict};
use uuid::Uuid;

/// As root, the agent runs as `nobody` (uid 65534) and can pass through the data directory
/// only to its run's paths. Its private file is in the commit (git's jail, which runs as
/// `nobody` too, reads it), and the worktree is the service's again once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_root_the_agent_runs_as_nobody_and_its_work_is_committed() {
    if !sandbox_works_here() || nix_is_not_root() {
        return;
    }
    let rig = Rig::new();
    let program = agent(
        &rig,
        "as-nobody",
        r#"echo "uid $(id -u)"
echo private >private.txt && chmod 600 private.txt
mkdir -p own && chmod 700 own && echo inner >own/f
echo home >"$HOME/h" && echo "home writable"
if git status --porcelain >/dev/null 2>&1; then echo "git-status ok"; else echo "git-status $(git status 2>&1 | head -1)"; fi
"#,
    );
    let user = AgentUser::resolve(0, None, false, true).unwrap();
    assert_eq!(user.ids().map(|u| u.uid), Some(65534));
    let sandbox = Sandbox::new(SandboxMode::Auto).with_agent_user(user.clone());
    let task = Uuid::new_v4();
    let execution = run(
        &rig.agent_runner(sandbox, &program),
        rig.job(task, "Work as nobody"),
    )
    .await;
    let Verdict::Pushed { branch, .. } = &execution.verdict else {
        panic!("{:?}\n{}", execution.verdict, execution.output);
    };
    assert_eq!(reported(&execution, "uid"), "65534");
    assert_eq!(reported(&execution, "git-status"), "ok");
    assert_eq!(reported(&execution, "home"), "writable");
    let bare = &rig.bare;
    assert_eq!(
        git(&["show", &format!("{branch}:private.txt")], bare),
        "private"
    );
    assert_eq!(git(&["show", &format!("{branch}:own/f")], bare), "inner");
    // The run's HOME stays the agent's until the next attempt; the data directory is root's.
    let home = std::fs::metadata(rig.home(task).join("h")).unwrap();
    assert_eq!(home.uid(), 65534);
    assert_eq!(std::fs::metadata(&rig.root).unwrap().uid(), 0);
    // Of the data directory the agent's user passes through to its run's paths and its
    // mirror, and reads nothing else: not its own log nor git's HOME.
    let nobody = user.ids().unwrap();
    let run_dir = rig.root.join("runs").join(task.to_string()).join("1");
    let mirror = rig.root.join("workspaces/mirrors/repo-1.git");
    let modes = [
        (rig.root.clone(), 0o710),
        (rig.root.join("runs"), 0o711),
        (run_dir.clone(), 0o711),
        (run_dir.join("output.log"), 0o600),
        (run_dir.join("agent.pid"), 0o600),
        (rig.root.join("workspaces"), 0o711),
        (rig.root.join("workspaces/mirrors"), 0o711),
        (rig.root.join("workspaces/worktrees"), 0o711),
        (rig.root.join("workspaces/indexes"), 0o711),
        (rig.root.join("workspaces/git-home"), 0o700),
        (rig.root.join("cli-home"), 0o700),
    ];
    for (path, mode) in modes {
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(meta.mode() & 0o7777, mode, "{}", path.display());
    }
    assert_eq!(
        agentry_runner::user::unreachable(&rig.home(task), nobody, false),
        None
    );
    assert_eq!(
        agentry_runner::user::unreachable(&mirror.join("HEAD"), nobody, false),
        None
    );
    // The commit's objects, which git wrote as the agent's user in its jail, were copied
    // into the mirror as the service's: nothing of `nobody` is in the shared mirror.
    let mut dirs = vec![mirror.join("objects")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert_eq!(meta.uid(), 0, "{}", path.display());
            if meta.is_dir() {
                dirs.push(path);
            }
        }
    }
    for closed in ["output.log", "agent.pid"] {
        assert!(agentry_runner::user::unreachable(&run_dir.join(closed), nobody, false).is_some());
    }
}

/// Where no usable user exists, the agent is refused with the reason and nothing is
/// prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_agent_user_refuses_the_agent_with_its_reason() {
    let rig = Rig::new();
    let program = agent(&rig, "never", "echo ran >&2\n");
    let refused = AgentUser::resolve(0, Some("no-such-user-here"), false, true).unwrap();
    let sandbox = Sandbox::new(SandboxMode::Auto).with_agent_user(refused);
    let execution = run(
        &rig.agent_runner(sandbox, &program),
        rig.job(Uuid::new_v4(), "Never runs"),
    )
    .await;
    let message = failure(&execution);
    assert!(
        message.contains("there is no user \"no-such-user-here\"")
            && message.contains("AGENTRY_ALLOW_ROOT=1"),
        "{message}"
    );
    assert!(!rig.root.join("workspaces/worktrees").exists());
}

fn nix_is_not_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() != 0)
        .unwrap_or(true)
}

/// An agent of another user with a network: its forwarder (as that user) reaches the
/// gateway and the proxy through the run's sockets, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_another_user_reaches_the_gateway_and_the_proxy() {
    use agentry_runner::{LocalConfig, LocalRunner};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    if !sandbox_works_here() || nix_is_not_root() {
        return;
    }
    let rig = Rig::new();
    let dir = rig.root.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let forwarder = dir.join("agentry-sandbox-net");
    std::fs::copy(crate::limits::FORWARDER, &forwarder).unwrap();
    let (host_port, _) = crate::network::host_server().await;
    let checker = crate::network::network_checker(&rig, host_port);
    let network = Arc::new(crate::network::TestNetwork::default());
    let user = AgentUser::resolve(0, None, false, true).unwrap();
    let runner = Arc::new(LocalRunner::new(LocalConfig {
        claude_bin: checker,
        network: crate::network::network_config(&network, &forwarder.display().to_string()),
        ..rig.config(Sandbox::new(SandboxMode::Auto).with_agent_user(user))
    }));
    let task = Uuid::new_v4();
    let execution = run(&runner, rig.job(task, "Check the network")).await;
    assert_verdict(&execution, Verdict::NoChanges);
    crate::network::assert_only_gateway_and_proxy(&rig, task);
}
