//! The resource limits of a sandboxed agent (docs/security.md#resource-limits), through
//! [`LocalRunner`] with bubblewrap and the forwarder of this crate (`agentry-sandbox-net`,
//! the sandbox's first process, which sets the rlimits): a process bomb stops at the
//! process limit, a huge file at the file-size limit, filling `/tmp` at its size, and
//! opening files at the open-file limit. Each agent is a script posing as Claude Code that
//! prints what it got on its stdout.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agentry_runner::user::AgentUser;
use agentry_runner::{AgentLimits, Execution, Sandbox, SandboxMode, Verdict};
use uuid::Uuid;

use crate::sandbox::{Rig, run, sandbox_works_here};

/// The forwarder built with this crate.
pub(crate) const FORWARDER: &str = env!("CARGO_BIN_EXE_agentry-sandbox-net");

/// The head of every agent script: answers the version check, reads its prompt.
const HEAD: &str = "#!/bin/bash\n\
    if [ \"${1:-}\" = --version ]; then echo \"2.1.197 (Claude Code)\"; exit 0; fi\n\
    cat >/dev/null\n";

/// The last line of every agent script: a successful result.
const TAIL: &str = "printf '%s\\n' '{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\
    \"num_turns\":1,\"result\":\"done\",\"total_cost_usd\":0.01,\"modelUsage\":{}}'\n";

/// Writes the agent script `body` (between [`HEAD`] and [`TAIL`]) next to the rig's data
/// directory, readable and executable by everyone.
pub(crate) fn agent(rig: &Rig, name: &str, body: &str) -> PathBuf {
    rig.program(name, &format!("{HEAD}{body}{TAIL}"))
}

/// Runs `program` as the agent in `sandbox` (with the forwarder) on a job of `prompt`;
/// asserts that it ran sandboxed and changed nothing (a probe reports, it does not edit).
pub(crate) async fn probe_run(
    rig: &Rig,
    sandbox: Sandbox,
    program: &Path,
    prompt: &str,
) -> Execution {
    let sandbox = sandbox.with_forwarder(vec![FORWARDER.to_owned()]);
    let execution = run(
        &rig.agent_runner(sandbox, program),
        rig.job(Uuid::new_v4(), prompt),
    )
    .await;
    assert!(
        matches!(execution.verdict, Verdict::NoChanges),
        "{:?}\n{}",
        execution.verdict,
        execution.output
    );
    assert!(execution.sandboxed);
    execution
}

/// The value of the line `key VALUE` of the agent's output.
pub(crate) fn reported<'a>(execution: &'a Execution, key: &str) -> &'a str {
    execution
        .output
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {key:?} in the output:\n{}", execution.output))
}

fn number(execution: &Execution, key: &str) -> u64 {
    reported(execution, key)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in the output:\n{}", execution.output))
}

/// A file larger than the file-size limit stops at it, in the worktree and in `/tmp`;
/// `/tmp` is full at its size (`ENOSPC`) though each file is under the limit; opening
/// files stops at the open-file limit; memory beyond the data limit is refused. What the
/// service writes is not limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_tmp_open_files_and_memory_stop_at_their_limits() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    let program = agent(
        &rig,
        "limited",
        r#"echo "limits $(ulimit -n) $(ulimit -f) $(ulimit -d)"
head -c 6M /dev/zero >big; echo "worktree-big $? $(stat -c %s big)"; rm -f big
head -c 6M /dev/zero >/tmp/big; echo "tmp-big $? $(stat -c %s /tmp/big)"; rm -f /tmp/big
for i in 1 2 3 4; do
	if ! out=$(dd if=/dev/zero of=/tmp/part$i bs=1M count=3 2>&1); then
		echo "tmp-full $i ${out%%$'\n'*}"; break
	fi
done
echo "tmp-size $(df -B1 --output=size /tmp | tail -n 1 | tr -d ' ')"
n=0
for i in $(seq 1 200); do exec {fd}</dev/null 2>/dev/null || break; n=$((n+1)); done
echo "opened $n"
python3 -c 'bytearray(256 << 20)' 2>/dev/null; echo "memory-256M $?"
"#,
    );
    let limits = AgentLimits {
        tmp_bytes: 8 << 20,
        max_processes: 512,
        max_open_files: 64,
        max_file_bytes: 4 << 20,
        max_memory_bytes: 128 << 20,
        ..AgentLimits::default()
    };
    let sandbox = Sandbox::new(agentry_runner::SandboxMode::Auto).with_limits(limits);
    let execution = probe_run(&rig, sandbox, &program, "Fill everything").await;
    // ulimit -f and -d are in KiB.
    assert_eq!(reported(&execution, "limits"), "64 4096 131072");
    // Killed by SIGXFSZ (128 + 25) at exactly the limit.
    assert_eq!(reported(&execution, "worktree-big"), "153 4194304");
    assert_eq!(reported(&execution, "tmp-big"), "153 4194304");
    let full = reported(&execution, "tmp-full");
    assert!(
        full.starts_with("3 ") && full.contains("No space left on device"),
        "{full}"
    );
    assert_eq!(number(&execution, "tmp-size"), 8 << 20);
    let opened = number(&execution, "opened");
    eprintln!("the agent opened {opened} files under a limit of 64");
    assert!((40..64).contains(&opened), "opened {opened} files");
    assert_eq!(reported(&execution, "memory-256M"), "1");
}

/// A process bomb stops at the process limit and the service is unaffected, and the
/// service's own processes (80 of the same user, outside) do not count against it. The kernel
/// never applies `RLIMIT_NPROC` to uid 0: a service run as root runs its agents as `nobody`
/// (docs/security.md#the-agents-user), and in the sandbox's own user namespace the limit
/// counts the sandbox's processes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_bomb_stops_at_the_process_limit() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    // Everything `nobody` runs must be reachable by it: the forwarder out of the target
    // directory (which may lie under root's HOME).
    let dir = rig.root.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let forwarder = dir.join("agentry-sandbox-net");
    std::fs::copy(FORWARDER, &forwarder).unwrap();
    let program = agent(
        &rig,
        "bomb",
        r#"echo "nproc $(ulimit -u) uid $(id -u)"
timeout 20 sh -c 'i=0; while [ $i -lt 300 ]; do sleep 3 & i=$((i+1)); echo $i >/tmp/count; done' 2>/dev/null
read -r started </tmp/count
echo "started $started"
"#,
    );
    let limits = AgentLimits {
        max_processes: 64,
        ..AgentLimits::default()
    };
    let user = AgentUser::resolve(0, None, false, true).unwrap();
    let sandbox = Sandbox::new(SandboxMode::Auto)
        .with_limits(limits)
        .with_forwarder(vec![forwarder.display().to_string()])
        .with_agent_user(user);
    // 80 processes of the same user outside the sandbox (the service's, say): more than the
    // sandbox's limit, which they must not count against.
    let mut outside = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg("for i in $(seq 80); do sleep 15 & done; echo ready; wait")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(outside.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n");
    let execution = run(
        &rig.agent_runner(sandbox, &program),
        rig.job(Uuid::new_v4(), "Fork away"),
    )
    .await;
    let _ = outside.kill();
    let _ = outside.wait();
    assert!(
        matches!(execution.verdict, Verdict::NoChanges),
        "{:?}\n{}",
        execution.verdict,
        execution.output
    );
    assert_eq!(reported(&execution, "nproc"), "64 uid 65534");
    // The sandbox's own processes (bwrap's init, the forwarder, the agent, `timeout`, `sh`)
    // and the bomb's share the 64.
    let started = number(&execution, "started");
    eprintln!("the bomb started {started} processes under a limit of 64");
    assert!((40..64).contains(&started), "the bomb started {started}");
    // The service still starts processes, as its user and as the sandbox's.
    let status = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "true"])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Where a cgroup can be made (as root here), the sandbox as a whole has its memory limit:
/// one process touching more than it is stopped by the kernel while the same run without a
/// limit completes; and the process limit holds for a sandbox whose user is root, which
/// `RLIMIT_NPROC` never limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cgroup_limits_the_sandbox_memory_and_processes_even_for_root() {
    if !sandbox_works_here()
        || agentry_runner::cgroup::RunCgroup::create("probe-limits", 0, 0).is_err()
    {
        return;
    }
    let rig = Rig::new();
    let program = agent(
        &rig,
        "hog",
        r#"dd if=/dev/zero of=/dev/null bs=300M count=1 2>/dev/null
echo "dd-status $?"
timeout 20 sh -c 'i=0; while [ $i -lt 300 ]; do sleep 3 & i=$((i+1)); echo $i >/tmp/count; done' 2>/dev/null
read -r started </tmp/count
echo "started $started"
"#,
    );
    let run_with = |total_memory_bytes: u64| {
        let sandbox = Sandbox::new(SandboxMode::Auto).with_limits(AgentLimits {
            total_memory_bytes,
            max_processes: 64,
            ..AgentLimits::default()
        });
        let runner = rig.agent_runner(sandbox, &program);
        let job = rig.job(Uuid::new_v4(), "Use memory");
        async move { run(&runner, job).await }
    };
    let limited = run_with(128 << 20).await;
    assert!(
        matches!(limited.verdict, Verdict::NoChanges),
        "{:?}\n{}",
        limited.verdict,
        limited.output
    );
    // SIGKILL from the OOM killer: 128 + 9.
    assert_eq!(reported(&limited, "dd-status"), "137", "{}", limited.output);
    let started = number(&limited, "started");
    assert!((40..64).contains(&started), "the bomb started {started}");
    let unlimited = run_with(0).await;
    assert_eq!(
        reported(&unlimited, "dd-status"),
        "0",
        "{}",
        unlimited.output
    );
}
