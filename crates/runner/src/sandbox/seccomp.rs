//! The sandbox's seccomp filter (docs/security.md#the-seccomp-filter): the system calls a
//! coding agent never needs, refused inside every sandbox.
//!
//! The filter allows every call but those listed below, which fail with `EPERM` (never a
//! kill: a tool that probes one gets an error it can handle). It is compiled to classic BPF
//! by `seccompiler` and handed to `bwrap --seccomp FD`, which installs it on the sandbox's
//! first process right before it starts it, after `no_new_privs`; every process of the
//! sandbox inherits it and none can remove it. `AGENTRY_SANDBOX_SECCOMP=off` runs agents
//! without it.
//!
//! Refused, and why:
//!
//! | Calls | Why |
//! |---|---|
//! | `mount`, `umount2`, `pivot_root`, `chroot`, `move_mount`, `open_tree`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr` | The sandbox's view of the files is fixed by `bwrap`; no tool changes mounts or its root. |
//! | `unshare`, `setns` | New or other namespaces: `bwrap` already refuses new user namespaces (`--disable-userns`), and without capabilities the others fail too; refused outright. |
//! | `swapon`, `swapoff`, `reboot`, `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module`, `acct`, `quotactl`, `quotactl_fd`, `vhangup` | Administration of the machine. |
//! | `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex` | Setting the clock (reading it, `clock_gettime`, is not affected; `adjtimex` is refused even to only query the clock's discipline). |
//! | `syslog`, `lookup_dcookie` | The kernel's log and internals (`dmesg` fails). |
//! | `iopl`, `ioperm` (x86_64 only) | Direct access to I/O ports. |
//! | `bpf`, `perf_event_open` | Kernel programs and performance counters: a large kernel attack surface (`perf` and profilers built on it fail). |
//! | `userfaultfd` | A common aid in exploiting kernel races; only virtual-machine migration and checkpointing use it. |
//! | `keyctl`, `add_key`, `request_key` | The kernel keyrings are not namespaced: the session and user keyrings could hold the service user's keys. |
//! | `open_by_handle_at`, `name_to_handle_at` | Opening files by handle bypasses the mount view (a known container escape). |
//! | `process_vm_readv`, `process_vm_writev` | Reading and writing another process's memory; no coding tool needs it (samplers such as `py-spy` fail). |
//! | `fanotify_init` | Watching whole filesystems (tools use `inotify`, which stays allowed). |
//! | `socket`, `socketpair` of any family but `AF_UNIX`, `AF_INET`, `AF_INET6` and `AF_NETLINK` ([`KEPT_FAMILIES`]); `socket` of `AF_NETLINK` with any protocol but `NETLINK_ROUTE` | `AF_VSOCK` reaches the hypervisor's side of a virtual machine, which the network namespace does not isolate; `AF_PACKET`, `AF_ALG`, `AF_KEY`, Bluetooth, CAN, TIPC, RDS, XDP and the rest are kernel attack surface no coding tool needs. |
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` | io_uring performs system calls (`socket` among them) without passing through this filter; libuv (Node.js) falls back to its thread pool when `io_uring_setup` fails, as in Docker's default profile. |
//!
//! The kept families, and why: `AF_UNIX` (local IPC: the forwarder's sockets, git, npm, language
//! servers), `AF_INET` and `AF_INET6` (the model gateway and the egress proxy on the
//! sandbox's loopback, test servers on `127.0.0.1`/`::1`) and `AF_NETLINK` with
//! `NETLINK_ROUTE` only, which glibc's `getaddrinfo` (`AI_ADDRCONFIG`), `getifaddrs`
//! (Node.js's `os.networkInterfaces()`, Python's `socket.if_nameindex()`) and `ip` use to
//! read the namespace's own interfaces; other netlink protocols (audit, uevents, socket
//! diagnostics, netfilter) are refused.
//!
//! Allowed on purpose, because real tools need them (Node.js, which both agent CLIs are,
//! git, npm, Python, `cargo test`, debugging):
//!
//! - `ptrace`: `strace`, `gdb` and AddressSanitizer's leak checker (which stops the
//!   process's threads with `ptrace`) need it. The sandbox's pid namespace confines it to
//!   the sandbox's own processes, of the same user, without capabilities.
//! - `personality`: `setarch -R`, `gdb` and the sanitizers turn address randomisation off
//!   with it.
//! - `clone` and `clone3` (every thread and process): namespace flags are left to the
//!   missing capabilities and `--disable-userns` (the flags of `clone3` are in memory a
//!   filter cannot read).
//!
//! On x86_64 the x32 numbers of the refused calls are refused too, and a call of another
//! architecture's ABI (a 32-bit i386 program) kills the process: the filter checks the
//! architecture first, as every seccomp filter must. The filter exists for x86_64 and
//! aarch64; elsewhere agents run without it ([`program`] says so, and the runner logs it).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

/// The refused calls of this architecture, by name and number.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const REFUSED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("vhangup", libc::SYS_vhangup),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("syslog", libc::SYS_syslog),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// The socket families an agent may create sockets of (`socket`, `socketpair`); every other
/// fails with `EPERM`. `AF_NETLINK` only with the protocol `NETLINK_ROUTE` (for `socket`).
pub const KEPT_FAMILIES: &[(&str, i32)] = &[
    ("AF_UNIX", libc::AF_UNIX),
    ("AF_INET", libc::AF_INET),
    ("AF_INET6", libc::AF_INET6),
    ("AF_NETLINK", libc::AF_NETLINK),
];

/// The calls refused only for some arguments: `socket` and `socketpair` of a family not in
/// [`KEPT_FAMILIES`], and `socket` of `AF_NETLINK` but for `NETLINK_ROUTE`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const FAMILY_CALLS: &[(&str, i64, bool)] = &[
    ("socket", libc::SYS_socket, true),
    ("socketpair", libc::SYS_socketpair, false),
];

/// None where there is no filter.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FAMILY_CALLS: &[(&str, i64, bool)] = &[];

/// No refused calls where there is no filter.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const REFUSED: &[(&str, i64)] = &[];

/// The bit of the x32 ABI's call numbers on x86_64.
#[cfg(target_arch = "x86_64")]
const X32_BIT: i64 = 0x4000_0000;

/// The x32 ABI's own numbers of refused calls (its compatibility entries 512 and up).
#[cfg(target_arch = "x86_64")]
const X32_OWN: &[i64] = &[
    528, // kexec_load
    539, // process_vm_readv
    540, // process_vm_writev
];

/// No x32 ABI elsewhere.
#[cfg(not(target_arch = "x86_64"))]
const X32_OWN: &[i64] = &[];

/// The names of the calls the filter refuses on this architecture (none where there is no
/// filter).
pub fn refused_calls() -> Vec<&'static str> {
    REFUSED.iter().map(|(name, _)| *name).collect()
}

/// Whether there is a filter for this architecture (x86_64 and aarch64).
pub fn supported() -> bool {
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64"))
}

/// The call numbers the filter refuses: [`refused_calls`]' and, on x86_64, their x32
/// numbers.
fn refused_numbers() -> Vec<i64> {
    with_x32(REFUSED.iter().map(|(_, nr)| *nr).collect(), X32_OWN)
}

/// `numbers` and, on x86_64, their x32 numbers and the x32 ABI's `own` numbers.
#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(
        unused_mut,
        unused_variables,
        reason = "only x86_64 adds the x32 numbers"
    )
)]
fn with_x32(mut numbers: Vec<i64>, own: &[i64]) -> Vec<i64> {
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<i64> = numbers
            .iter()
            .copied()
            .chain(own.iter().copied())
            .map(|nr| nr | X32_BIT)
            .collect();
        numbers.extend(x32);
    }
    numbers
}

/// The rules of a call refused for some arguments ([`FAMILY_CALLS`]): its family (the
/// first argument, an `int`) none of [`KEPT_FAMILIES`]; and, with `netlink`, the family
/// `AF_NETLINK` with a protocol (the third argument) other than `NETLINK_ROUTE`.
fn family_rules(netlink: bool) -> Result<Vec<SeccompRule>, String> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition};
    let condition = |arg: u8, op: SeccompCmpOp, value: i32| {
        SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            op,
            u64::from(value.cast_unsigned()),
        )
        .map_err(|e| format!("the sandbox's seccomp filter: {e}"))
    };
    let mut rules = vec![
        KEPT_FAMILIES
            .iter()
            .map(|(_, family)| condition(0, SeccompCmpOp::Ne, *family))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|c| {
                SeccompRule::new(c).map_err(|e| format!("the sandbox's seccomp filter: {e}"))
            })?,
    ];
    if netlink {
        let conditions = vec![
            condition(0, SeccompCmpOp::Eq, libc::AF_NETLINK)?,
            condition(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE)?,
        ];
        rules.push(
            SeccompRule::new(conditions)
                .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?,
        );
    }
    Ok(rules)
}

/// The filter for this architecture as `bwrap --seccomp` reads it: the raw array of
/// `struct sock_filter` (8 bytes each, in the machine's byte order).
///
/// # Errors
///
/// On an architecture without a filter (anything but x86_64 and aarch64), or should
/// `seccompiler` refuse the filter: a sentence saying so (agents then run without it).
pub fn program() -> Result<Vec<u8>, String> {
    if !supported() {
        return Err(format!(
            "the sandbox's seccomp filter exists for x86_64 and aarch64 only, not {}",
            std::env::consts::ARCH
        ));
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp filter for {}: {e}", std::env::consts::ARCH))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = refused_numbers()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    for (_, nr, netlink) in FAMILY_CALLS {
        for nr in with_x32(vec![*nr], &[]) {
            rules.insert(nr, family_rules(*netlink)?);
        }
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        arch,
    )
    .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("the sandbox's seccomp filter: {e}"))?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for op in &program {
        bytes.extend_from_slice(&op.code.to_ne_bytes());
        bytes.push(op.jt);
        bytes.push(op.jf);
        bytes.extend_from_slice(&op.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter builds here (x86_64 or aarch64), within the kernel's 4096 instructions,
    /// and refuses what the documentation lists, not what real tools need.
    #[test]
    fn the_program_builds_for_this_architecture() {
        assert!(supported(), "{}", std::env::consts::ARCH);
        let program = program().unwrap();
        assert_eq!(program.len() % 8, 0);
        let instructions = program.len() / 8;
        assert!(
            (REFUSED.len()..4096).contains(&instructions),
            "{instructions}"
        );
        let refused = refused_calls();
        for name in ["mount", "unshare", "keyctl", "bpf", "process_vm_readv"] {
            assert!(refused.contains(&name), "{name}");
        }
        for name in ["ptrace", "personality", "clone", "clone3", "socket"] {
            assert!(!refused.contains(&name), "{name}");
        }
        assert!(refused.contains(&"io_uring_setup"));
        assert_eq!(family_rules(true).unwrap().len(), 2);
        assert_eq!(family_rules(false).unwrap().len(), 1);
        let numbers = refused_numbers();
        let mut unique = numbers.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), numbers.len());
    }
}
