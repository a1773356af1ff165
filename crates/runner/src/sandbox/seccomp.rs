//! The sandbox's seccomp filter (docs/security.md#the-seccomp-filter): the system calls a
//! coding agent never needs, refused inside every sandbox.
//!
//! The filter allows every call but those listed below, which fail with `EPERM` (never a
//! kill: a tool that probes one gets an error it can handle), and `clone3`, which fails
//! with `ENOSYS`. It is compiled to classic BPF by `seccompiler` and handed to `bwrap
//! --seccomp FD`, which installs it on the sandbox's first process right before it starts
//! it, after `no_new_privs`; every process of the sandbox inherits it and none can remove
//! it. `AGENTRY_SANDBOX_SECCOMP=off` runs agents without it.
//!
//! Refused, and why:
//!
//! | Calls | Why |
//! |---|---|
//! | `mount`, `umount2`, `pivot_root`, `chroot`, `move_mount`, `open_tree`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr` | The sandbox's view of the files is fixed by `bwrap`; no tool changes mounts or its root. |
//! | `unshare`, `setns`; `clone` with any namespace flag ([`CLONE_NAMESPACE_FLAGS`]); `clone3` (with `ENOSYS`) | New or other namespaces. A new user namespace comes with every capability inside it (netlink's routing, traffic control, netfilter: kernel attack surface). `bwrap --disable-userns` refuses them only from bubblewrap 0.8 on (older ones leave it out), so the filter refuses them itself: `clone` when its flags ask for a new namespace; `clone3`, whose flags are in memory the filter cannot read, always, with `ENOSYS`, so that glibc falls back to `clone` for threads and `posix_spawn` (as Docker's default profile does). |
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
//! - `clone` without namespace flags (every thread and process: `fork`, `vfork`,
//!   `pthread_create` and `posix_spawn` after their `clone3` failed).
//!
//! On x86_64 the x32 numbers of the refused calls (and of `clone` and `clone3`) are refused
//! too, and a call of another architecture's ABI (a 32-bit i386 program) kills the process:
//! the filter checks the architecture first, as every seccomp filter must. The filter exists for x86_64 and
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

/// The flags of `clone` that ask for a new namespace; a `clone` with any of them fails with
/// `EPERM`. (`CLONE_NEWTIME` is not one: `clone` reads its bit as part of the child's exit
/// signal, and only `unshare` and `clone3` take it.)
pub const CLONE_NAMESPACE_FLAGS: &[(&str, i32)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER),
    ("CLONE_NEWPID", libc::CLONE_NEWPID),
    ("CLONE_NEWNET", libc::CLONE_NEWNET),
];

/// `clone`'s number here, refused for some flags ([`CLONE_NAMESPACE_FLAGS`]).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const CLONE: Option<i64> = Some(libc::SYS_clone);

/// No `clone` rule where there is no filter.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const CLONE: Option<i64> = None;

/// `clone3`'s number here, which fails with `ENOSYS`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const CLONE3: Option<i64> = Some(libc::SYS_clone3);

/// No `clone3` rule where there is no filter.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const CLONE3: Option<i64> = None;

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

/// The rules of `clone`: one per flag of [`CLONE_NAMESPACE_FLAGS`], matching when the flags
/// (the first argument; every namespace flag lies in its low 32 bits) hold it.
fn clone_rules() -> Result<Vec<SeccompRule>, String> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition};
    CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|(_, flag)| {
            let flag = u64::from(flag.cast_unsigned());
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|condition| SeccompRule::new(vec![condition]))
            .map_err(|e| format!("the sandbox's seccomp filter: {e}"))
        })
        .collect()
}

/// `rules` compiled for `arch` by `seccompiler`: a call that matches gets `action`, every
/// other is allowed.
fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    action: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)
        .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("the sandbox's seccomp filter: {e}"))
}

/// One program of `first` then `second` (each compiled by [`compile`]): where `first` would
/// allow a call (`RET ALLOW`), it jumps to the start of `second` instead, which decides.
/// A filter takes one action per program, and `bwrap --seccomp` installs one program;
/// this is how `clone3` gets `ENOSYS` while the rest gets `EPERM`.
fn chain(mut first: BpfProgram, second: BpfProgram) -> Result<BpfProgram, String> {
    let ret_allow = u16::try_from(libc::BPF_RET | libc::BPF_K)
        .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?;
    let jump = u16::try_from(libc::BPF_JMP | libc::BPF_JA)
        .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?;
    let len = first.len();
    for (at, op) in first.iter_mut().enumerate() {
        if op.code == ret_allow && op.k == libc::SECCOMP_RET_ALLOW {
            // `JA k` goes on at the instruction `k` after the next one: `second`'s first.
            let k = u32::try_from(len - at - 1)
                .map_err(|e| format!("the sandbox's seccomp filter: {e}"))?;
            *op = seccompiler::sock_filter {
                code: jump,
                jt: 0,
                jf: 0,
                k,
            };
        }
    }
    first.extend(second);
    if first.len() > 4096 {
        return Err(format!(
            "the sandbox's seccomp filter has {} instructions, over the kernel's 4096",
            first.len()
        ));
    }
    Ok(first)
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
    for nr in with_x32(CLONE.into_iter().collect(), &[]) {
        rules.insert(nr, clone_rules()?);
    }
    let enosys: BTreeMap<i64, Vec<SeccompRule>> = with_x32(CLONE3.into_iter().collect(), &[])
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let program = chain(
        compile(
            enosys,
            SeccompAction::Errno(libc::ENOSYS.unsigned_abs()),
            arch,
        )?,
        compile(
            rules,
            SeccompAction::Errno(libc::EPERM.unsigned_abs()),
            arch,
        )?,
    )?;
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

    /// What the kernel would decide for the call `nr` with `args` of the architecture
    /// `arch` (`None`: this one), running the program as classic BPF over a `struct
    /// seccomp_data` (only the instructions `seccompiler` and [`chain`] emit).
    fn decide(program: &[u8], arch: Option<u32>, nr: i64, args: [u64; 6]) -> u32 {
        let ops: Vec<(u16, u8, u8, u32)> = program
            .chunks_exact(8)
            .map(|op| {
                (
                    u16::from_ne_bytes([op[0], op[1]]),
                    op[2],
                    op[3],
                    u32::from_ne_bytes([op[4], op[5], op[6], op[7]]),
                )
            })
            .collect();
        // The architecture the program checks first (`JEQ arch`), unless another is given.
        let arch = arch.unwrap_or(ops[1].3);
        let mut data = Vec::new();
        data.extend_from_slice(&i32::try_from(nr).unwrap().to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let (code, jt, jf, k) = ops[pc];
            let k_usize = usize::try_from(k).unwrap();
            let jump = |taken: bool| usize::from(if taken { jt } else { jf });
            pc += 1;
            match u32::from(code) {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    a = u32::from_ne_bytes(data[k_usize..k_usize + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += k_usize,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => pc += jump(a == k),
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => pc += jump(a >= k),
                c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => pc += jump(a > k),
                c if c == libc::BPF_RET | libc::BPF_K => return k,
                other => panic!("instruction {other:#x} at {}", pc - 1),
            }
        }
    }

    /// `clone` asking for any new namespace gets `EPERM`, `clone3` `ENOSYS` (whatever its
    /// arguments), and the `clone`s of `fork`, `vfork` and threads pass, as do calls the
    /// filter does not name; the first program's allowed calls go on to the second.
    #[test]
    fn clone_with_namespace_flags_and_clone3_are_refused() {
        let program = program().unwrap();
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM.cast_unsigned();
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS.cast_unsigned();
        let allow = libc::SECCOMP_RET_ALLOW;
        let flags = |f: i32| u64::from(f.cast_unsigned());
        let clone = |f: u64| decide(&program, None, libc::SYS_clone, [f, 0, 0, 0, 0, 0]);
        let sigchld = flags(libc::SIGCHLD);
        assert_eq!(
            clone(flags(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) | sigchld),
            eperm
        );
        for (name, flag) in CLONE_NAMESPACE_FLAGS {
            assert_eq!(clone(flags(*flag) | sigchld), eperm, "{name}");
        }
        let thread = libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID;
        for ordinary in [
            sigchld,
            flags(libc::CLONE_VM | libc::CLONE_VFORK) | sigchld,
            flags(thread),
            flags(libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) | sigchld,
            // CLONE_NEWTIME's bit is an exit signal's to clone.
            flags(libc::CLONE_NEWTIME),
        ] {
            assert_eq!(clone(ordinary), allow, "{ordinary:#x}");
        }
        for args in [[0; 6], [flags(libc::CLONE_NEWUSER), 0, 0, 0, 0, 0]] {
            assert_eq!(decide(&program, None, libc::SYS_clone3, args), enosys);
        }
        assert_eq!(decide(&program, None, libc::SYS_getpid, [0; 6]), allow);
        assert_eq!(decide(&program, None, libc::SYS_unshare, [0; 6]), eperm);
        assert_eq!(decide(&program, None, libc::SYS_mount, [0; 6]), eperm);
        let vsock = u64::from(libc::AF_VSOCK.cast_unsigned());
        let inet = u64::from(libc::AF_INET.cast_unsigned());
        assert_eq!(
            decide(&program, None, libc::SYS_socket, [vsock, 1, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            decide(&program, None, libc::SYS_socket, [inet, 1, 0, 0, 0, 0]),
            allow
        );
        #[cfg(target_arch = "x86_64")]
        {
            let newuser = flags(libc::CLONE_NEWUSER) | sigchld;
            let x32 = |nr: i64, f: u64| decide(&program, None, nr | X32_BIT, [f, 0, 0, 0, 0, 0]);
            assert_eq!(x32(libc::SYS_clone, newuser), eperm);
            assert_eq!(x32(libc::SYS_clone, sigchld), allow);
            assert_eq!(x32(libc::SYS_clone3, 0), enosys);
        }
        // Another architecture's call kills the process.
        assert_eq!(
            decide(&program, Some(0x4000_0003), libc::SYS_getpid, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }
}
