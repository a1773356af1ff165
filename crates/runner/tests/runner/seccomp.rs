//! The sandbox's seccomp filter (docs/security.md#the-seccomp-filter), through
//! [`agentry_runner::LocalRunner`] with bubblewrap and this crate's forwarder: inside the
//! sandbox the refused calls fail with `EPERM` while ordinary work (git, files, child
//! processes, Python, Node.js) goes on; with the filter off, a call it refuses works again.
//! The agent is a script posing as Claude Code that prints what it got.

use agentry_runner::{Execution, Sandbox, SandboxMode};

use crate::limits::{agent, probe_run, reported};
use crate::sandbox::{Rig, sandbox_works_here};
use crate::support::write_program;

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
# io_uring, which would create sockets past the filter (params: 120 bytes of zeros).
params = ctypes.create_string_buffer(120)
call("io_uring_setup", {io_uring_setup}, ctypes.c_uint(4), params)
import os, shutil, subprocess, threading
def forked(name, pid, errno):
    # A child of a raw clone (fork-like: no stack given) leaves at once.
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    print("call", name, "ok" if pid != -1 else "errno=%d" % errno)
# clone(CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD): a user namespace with a network namespace
# in it, where the child would hold every capability.
ctypes.set_errno(0)
pid = libc.syscall(ctypes.c_long({clone}), ctypes.c_ulong(0x10000000 | 0x40000000 | 17),
                   ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
forked("clone-newuser", pid, ctypes.get_errno())
# clone3 of a plain child (struct clone_args, 88 bytes: exit_signal SIGCHLD at offset 32).
args = ctypes.create_string_buffer(88)
ctypes.c_uint64.from_buffer(args, 32).value = 17
ctypes.set_errno(0)
pid = libc.syscall(ctypes.c_long({clone3}), args, ctypes.c_size_t(88))
forked("clone3", pid, ctypes.get_errno())
# Ordinary process creation: fork, a thread (glibc tries clone3, then clone), a
# subprocess and posix_spawn (clone3, then clone, in glibc).
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
got = []
thread = threading.Thread(target=lambda: got.append(6 * 7))
thread.start()
thread.join()
print("thread", got[0] if got else "none")
print("subprocess", subprocess.run(["sh", "-c", "echo spawned"], capture_output=True, text=True).stdout.strip())
pid = os.posix_spawn(shutil.which("sh"), ["sh", "-c", "exit 3"], os.environ)
print("posix_spawn", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
# Socket families: (name, family, type, protocol).
for name, family, kind, proto in [
    ("vsock", 40, 1, 0),
    ("alg", 38, 5, 0),
    ("packet", 17, 2, 0),
    ("netlink-audit", 16, 3, 9),
    ("unix", 1, 1, 0),
    ("inet", 2, 1, 0),
    ("inet6", 10, 2, 0),
    ("netlink-route", 16, 3, 0),
]:
    ctypes.set_errno(0)
    fd = libc.socket(family, kind, proto)
    print("socket", name, "ok" if fd >= 0 else "errno=%d" % ctypes.get_errno())
pair = (ctypes.c_int * 2)()
ctypes.set_errno(0)
print("socketpair vsock", "ok" if libc.socketpair(40, 1, 0, pair) == 0 else "errno=%d" % ctypes.get_errno())
ctypes.set_errno(0)
print("socketpair unix", "ok" if libc.socketpair(1, 1, 0, pair) == 0 else "errno=%d" % ctypes.get_errno())
import socket
print("getaddrinfo", sorted({{a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)}}) and "ok")
print("if_nameindex", ",".join(n for _, n in socket.if_nameindex()))
PY
else
	echo "python absent"
fi
if [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; then
	echo "ip-addr $(PATH=/usr/sbin:/sbin:$PATH ip -o addr show 2>&1 | awk '{{print $2}}' | sort -u | tr '\n' ' ')"
else
	echo "ip-addr absent"
fi
echo "worktree-file $(echo work >probe-file && cat probe-file && rm probe-file)"
echo "tmp-file $(echo tmp >/tmp/probe && cat /tmp/probe)"
echo "child $(sh -c 'echo $((6 * 7))')"
echo "git $(git status --porcelain >/dev/null 2>&1; echo $?) $(git rev-parse --is-inside-work-tree 2>&1)"
if command -v node >/dev/null; then
	echo "node $(node -e 'const fs = require("fs"); fs.writeFileSync("/tmp/n", "x"); fs.promises.readFile("/tmp/n", "utf8").then((t) => console.log(t === "x" ? "ok" : "bad"))' 2>&1 | tail -n 1)"
	echo "node-net $(node -e '
const net = require("net"), os = require("os");
os.networkInterfaces();
const server = net.createServer((c) => c.end("pong")).listen(0, "127.0.0.1", () => {{
  net.connect(server.address().port, "127.0.0.1").on("data", (d) => {{ console.log(String(d)); server.close(); }});
}});' 2>&1 | tail -n 1)"
else
	echo "node absent"
fi
"#,
        keyctl = libc::SYS_keyctl,
        name_to_handle_at = libc::SYS_name_to_handle_at,
        mount = libc::SYS_mount,
        personality = libc::SYS_personality,
        getpid = libc::SYS_getpid,
        io_uring_setup = libc::SYS_io_uring_setup,
        clone = libc::SYS_clone,
        clone3 = libc::SYS_clone3,
    )
}

/// Runs the probes in a sandbox with the filter on or off.
async fn probe(rig: &Rig, filter: bool) -> Execution {
    probe_in(rig, Sandbox::new(SandboxMode::Auto), filter).await
}

/// Runs the probes in `sandbox` with the filter on or off.
async fn probe_in(rig: &Rig, sandbox: Sandbox, filter: bool) -> Execution {
    let program = agent(
        rig,
        if filter { "filtered" } else { "unfiltered" },
        &script(),
    );
    probe_run(
        rig,
        sandbox.with_seccomp(filter),
        &program,
        "Probe the system calls",
    )
    .await
}

/// The refused calls fail with `EPERM` (`unshare` says "Operation not permitted"), and so
/// do sockets of the refused families (`AF_VSOCK`, `AF_ALG`, `AF_PACKET`, netlink but
/// `NETLINK_ROUTE`); the allowed calls, the kept families (`AF_UNIX`, `AF_INET`,
/// `AF_INET6`, `NETLINK_ROUTE`) and ordinary work succeed (getaddrinfo, `ip addr`, a Node.js
/// TCP server on the loopback); without the filter `name_to_handle_at` and io_uring work.
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
        assert_eq!(out("call io_uring_setup"), "errno=1");
        // A clone asking for new namespaces fails with EPERM (bwrap's --disable-userns
        // alone makes it ENOSPC); clone3 with ENOSYS, so that glibc falls back to clone,
        // and every ordinary way of starting a process or a thread works.
        assert_eq!(out("call clone-newuser"), "errno=1");
        assert_eq!(out("call clone3"), "errno=38");
        assert_eq!(out("fork"), "7");
        assert_eq!(out("thread"), "42");
        assert_eq!(out("subprocess"), "spawned");
        assert_eq!(out("posix_spawn"), "3");
        // The refused families fail with EPERM, the kept ones work.
        for refused in ["vsock", "alg", "packet", "netlink-audit"] {
            assert_eq!(out(&format!("socket {refused}")), "errno=1", "{refused}");
        }
        for kept in ["unix", "inet", "inet6", "netlink-route"] {
            assert_eq!(out(&format!("socket {kept}")), "ok", "{kept}");
        }
        assert_eq!(out("socketpair vsock"), "errno=1");
        assert_eq!(out("socketpair unix"), "ok");
        // glibc's getaddrinfo (with AI_ADDRCONFIG, through netlink) and if_nameindex work
        // (this run has no network of its own: it lists the machine's interfaces).
        assert_eq!(out("getaddrinfo"), "ok");
        let interfaces = out("if_nameindex");
        assert!(interfaces.split(',').any(|i| i == "lo"), "{interfaces}");
    }
    let ip = out("ip-addr");
    assert!(
        ip == "absent" || ip.split_whitespace().any(|i| i == "lo"),
        "{ip}"
    );
    assert_eq!(out("worktree-file"), "work");
    assert_eq!(out("tmp-file"), "tmp");
    assert_eq!(out("child"), "42");
    assert_eq!(out("git"), "0 true");
    let node = out("node");
    assert!(node == "ok" || node == "absent", "{node}");
    if node == "ok" {
        assert_eq!(out("node-net"), "pong");
    }

    // Without the filter, a call it refuses (one needing no privilege) works.
    if python {
        let off = probe(&rig, false).await;
        let works = |what: &str| assert_eq!(reported(&off, what), "ok", "{what}\n{}", off.output);
        works("call name_to_handle_at");
        works("call getpid");
        // Unless the machine disables io_uring (kernel.io_uring_disabled).
        if std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map_or(true, |v| v.trim() == "0")
        {
            works("call io_uring_setup");
        }
        works("socket netlink-route");
        works("call clone3");
        // Not EPERM: refused by --disable-userns (ENOSPC), if at all.
        assert_ne!(
            reported(&off, "call clone-newuser"),
            "errno=1",
            "{}",
            off.output
        );
    }
}

/// Where `bwrap` cannot disable nested user namespaces (bubblewrap before 0.8, posed by a
/// wrapper whose `--help` does not offer `--disable-userns`), the filter alone refuses a
/// `clone` into a new user and network namespace, while processes and threads still
/// start. Without the filter the same `clone` works there: what the filter closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_disable_userns_the_filter_still_refuses_new_namespaces() {
    if !sandbox_works_here() {
        return;
    }
    let real = std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("bwrap"))
                .find(|bwrap| bwrap.is_file())
        })
        .unwrap_or_else(|| agentry_runner::sandbox::DEFAULT_BWRAP.into());
    let rig = Rig::new();
    let old_bwrap = rig.dir().join("bwrap-0.7");
    write_program(
        &old_bwrap,
        &format!(
            "#!/bin/sh\n\
             if [ \"$1\" = --help ]; then\n\
             \t'{real}' --help 2>&1 | grep -v -e --disable-userns -e --assert-userns-disabled\n\
             \texit 0\n\
             fi\n\
             exec '{real}' \"$@\"\n",
            real = real.display()
        ),
    );
    let features = Sandbox::with_bwrap(&old_bwrap)
        .features()
        .await
        .unwrap()
        .unwrap();
    assert!(!features.disable_userns, "{features:?}");
    let on = probe_in(&rig, Sandbox::with_bwrap(&old_bwrap), true).await;
    if on.output.contains("python absent") {
        return;
    }
    let out = |key: &str| reported(&on, key).to_owned();
    assert_eq!(out("call clone-newuser"), "errno=1", "{}", on.output);
    assert_eq!(out("call clone3"), "errno=38");
    assert_eq!(out("fork"), "7");
    assert_eq!(out("thread"), "42");
    assert_eq!(out("subprocess"), "spawned");
    assert_eq!(out("posix_spawn"), "3");
    assert_eq!(out("child"), "42");

    let off = probe_in(&rig, Sandbox::with_bwrap(&old_bwrap), false).await;
    let unfiltered = reported(&off, "call clone-newuser");
    if unfiltered != "ok" {
        // This kernel refuses the service's user new user namespaces by itself.
        eprintln!("without the filter, clone into new namespaces: {unfiltered}");
    }
}
