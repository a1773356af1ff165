//! The sandbox's seccomp filter (docs/security.md#the-seccomp-filter), through
//! [`agentry_runner::LocalRunner`] with bubblewrap and this crate's forwarder: inside the
//! sandbox the refused calls fail with `EPERM` while ordinary work (git, files, child
//! processes, Python, Node.js) goes on; with the filter off, a call it refuses works again.
//! The agent is a script posing as Claude Code that prints what it got.

use agentry_runner::{Execution, Sandbox, SandboxMode};

use crate::limits::{agent, probe_run, reported};
use crate::sandbox::{Rig, sandbox_works_here};

/// The probes: `unshare` of util-linux (a new user namespace), then refused and allowed
/// calls made straight from Python (their numbers for this architecture from libc), then
/// ordinary work. A probe whose tool is missing prints `absent`.
fn script() -> String {
    format!(
        r#"if command -v unshare >/dev/null; then
	echo "unshare-user $(unshare -U true 2>&1 | tail -n 1)"
else
	echo "unshare-user absent"
fi
if command -v python3 >/dev/null; then
python3 - <<'PY'
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *args)
    print("call", name, "ok" if result != -1 else "errno=%d" % ctypes.get_errno())
# KEYCTL_GET_KEYRING_ID of the session keyring, not created.
call("keyctl", {keyctl}, ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))
# A handle of the working directory (struct file_handle of 128 bytes).
handle = ctypes.create_string_buffer(136)
ctypes.c_uint.from_buffer(handle).value = 128
mount_id = ctypes.c_int()
call("name_to_handle_at", {name_to_handle_at}, ctypes.c_int(-100), b".", handle,
     ctypes.byref(mount_id), ctypes.c_int(0))
call("mount", {mount}, b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None)
# Allowed: personality (a query) and getpid.
call("personality", {personality}, ctypes.c_ulong(0xffffffff))
call("getpid", {getpid})
PY
else
	echo "python absent"
fi
echo "worktree-file $(echo work >probe-file && cat probe-file && rm probe-file)"
echo "tmp-file $(echo tmp >/tmp/probe && cat /tmp/probe)"
echo "child $(sh -c 'echo $((6 * 7))')"
echo "git $(git status --porcelain >/dev/null 2>&1; echo $?) $(git rev-parse --is-inside-work-tree 2>&1)"
if command -v node >/dev/null; then
	echo "node $(node -e 'const fs = require("fs"); fs.writeFileSync("/tmp/n", "x"); fs.promises.readFile("/tmp/n", "utf8").then((t) => console.log(t === "x" ? "ok" : "bad"))' 2>&1 | tail -n 1)"
else
	echo "node absent"
fi
"#,
        keyctl = libc::SYS_keyctl,
        name_to_handle_at = libc::SYS_name_to_handle_at,
        mount = libc::SYS_mount,
        personality = libc::SYS_personality,
        getpid = libc::SYS_getpid,
    )
}

/// Runs the probes in a sandbox with the filter on or off.
async fn probe(rig: &Rig, filter: bool) -> Execution {
    let program = agent(
        rig,
        if filter { "filtered" } else { "unfiltered" },
        &script(),
    );
    let sandbox = Sandbox::new(SandboxMode::Auto).with_seccomp(filter);
    probe_run(rig, sandbox, &program, "Probe the system calls").await
}

/// The refused calls fail with `EPERM` (`unshare` says "Operation not permitted"), the
/// allowed ones and ordinary work succeed; without the filter `name_to_handle_at` works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_refuses_the_listed_calls_and_nothing_ordinary() {
    if !sandbox_works_here() {
        return;
    }
    assert!(agentry_runner::sandbox::seccomp::supported());
    let rig = Rig::new();
    let on = probe(&rig, true).await;
    let out = |key: &str| reported(&on, key).to_owned();
    let unshare = out("unshare-user");
    let python = !on.output.contains("python absent");
    assert!(
        unshare != "absent" || python,
        "no probe could run here:\n{}",
        on.output
    );
    if unshare != "absent" {
        assert!(unshare.contains("Operation not permitted"), "{unshare}");
    }
    if python {
        assert_eq!(out("call keyctl"), "errno=1");
        assert_eq!(out("call name_to_handle_at"), "errno=1");
        assert_eq!(out("call mount"), "errno=1");
        assert_eq!(out("call personality"), "ok");
        assert_eq!(out("call getpid"), "ok");
    }
    assert_eq!(out("worktree-file"), "work");
    assert_eq!(out("tmp-file"), "tmp");
    assert_eq!(out("child"), "42");
    assert_eq!(out("git"), "0 true");
    let node = out("node");
    assert!(node == "ok" || node == "absent", "{node}");

    // Without the filter, a call it refuses (one needing no privilege) works.
    if python {
        let off = probe(&rig, false).await;
        assert_eq!(
            reported(&off, "call name_to_handle_at"),
            "ok",
            "{}",
            off.output
        );
        assert_eq!(reported(&off, "call getpid"), "ok");
    }
}
