//! The agent's sandbox (docs/contract.md#65-agent-sandbox, #12-configuration): every agent runs inside bubblewrap (`bwrap`).
//!
//! An agent reads untrusted text (the issue) and runs whatever commands it decides to run, so
//! it is treated as hostile. Inside the sandbox it sees:
//!
//! - only an allow-list of the system, read-only, on an empty read-only root: `/usr`, `/bin`
//!   and its siblings (symlinks where they are), the entries of `/etc` (`ETC_ENTRIES`) programs need
//!   and the operator's `AGENTRY_SANDBOX_EXTRA_RO` ([`Sandbox::with_extra_ro`], mounted
//!   after the sandbox's own `/tmp`, `/var/tmp` and `/run` when it lies in one); `/dev`, a
//!   fresh `/proc`, a fresh writable `/tmp`, and `/var/tmp`, `/run` and the data directory
//!   as empty read-only tmpfs holding only the run's mount points. Nothing else of the
//!   machine (`/etc/default`, `/var/log`, `/home`, `/srv`, `/opt`, the service user's `HOME`)
//!   is there. The agent program and the forwarder come along wherever they live outside
//!   those, read-only and without what lies beside them: their files
//!   (a symbolic link as a link), a script's interpreter's, and for a program of an npm
//!   package that package's directory (where its platform binary is); and so do the files
//!   named by the variables the operator passes to agents
//!   (`AGENTRY_AGENT_ENV`, e.g. a CA bundle);
//! - writable: its worktree and its run's `HOME` (`runs/<task>/<attempt>/home`), nothing
//!   else of the data directory: not the master key, the database, the admin token, other
//!   runs' logs or worktrees, nor its own `output.log`;
//! - for `git` to work in the worktree: the repository's bare mirror read-only, with its
//!   `worktrees/` directory hidden except the run's own entry. A coding run sees there a
//!   writable copy of that entry, made for it outside the mirror
//!   ([`crate::workspace::Worktree::agent_git_dir`]; so `git status` and `git diff` work;
//!   `git add` and `git commit` do not, since they write objects into the shared mirror:
//!   the runner commits the agent's changes afterwards), never the entry itself,
//!   which every git command on the mirror reads; a review run sees the entry read-only
//!   (`git diff <base>...HEAD`, `git log` and `git status` work; nothing of git changes);
//! - its own process, IPC, UTS and (where possible) cgroup namespaces with a fresh `/proc`,
//!   so no other process of the machine (the service, a concurrent `git push` holding the
//!   code-host token) is visible;
//! - with a network (the run's [`crate::network::Network`]): its own network
//!   namespace (`--unshare-net`: a loopback interface, no route), the run's network
//!   directory read-only at [`crate::network::SANDBOX_NET_DIR`], and the forwarder
//!   ([`crate::network::forwarder`]) started in front of the agent, listening on the
//!   sandbox's loopback for the model gateway and the egress proxy: nothing else of any
//!   network is reachable, not even the host's loopback. Without one (the runner was given
//!   no network) the network is shared with the host, as the agent needs its API;
//! - no capabilities (`--cap-drop ALL`, and bwrap sets `no_new_privs`), a new session (no
//!   terminal to inject into), and `--die-with-parent`;
//! - where the installed `bwrap` supports them ([`BwrapFeatures`], found at probe time): a
//!   user namespace of its own in which no nested one can be created (`--unshare-user
//!   --disable-userns`; the agent keeps the service's user id) and a `/tmp` of
//!   [`AgentLimits::tmp_bytes`] (`--size`);
//! - the rlimits of [`AgentLimits`] (processes, open files, file size, memory), set by the
//!   forwarder ([`crate::network::forwarder`]), which is the sandbox's first process with a
//!   network or without one (then it listens on nothing) whenever the runner knows it
//!   ([`Sandbox::with_forwarder`] or a [`crate::local::NetworkConfig`]);
//! - a seccomp filter ([`seccomp`], `bwrap --seccomp`) refusing with `EPERM` the system
//!   calls a coding agent never needs (mounts, namespaces, kernel modules, keyrings, `bpf`,
//!   io_uring…) and sockets of every family but `AF_UNIX`, `AF_INET`, `AF_INET6` and
//!   `NETLINK_ROUTE` (no `AF_VSOCK`),
//!   unless [`Sandbox::with_seccomp`] turns it off (`AGENTRY_SANDBOX_SECCOMP=off`).
//!
//! Killing the `bwrap` process (the pid the runner records, leader of the process group the
//! runner kills) ends the whole sandbox: the namespace's init dies with it and the kernel
//! kills every process left in the pid namespace.
//!
//! [`SandboxMode::Auto`] (the default) finds `bwrap` and probes it once with the same kind of
//! namespaces, a network namespace included; if it does not work, agents are refused. [`SandboxMode::Off`] runs agents as
//! plain processes of the service's user (a warning is logged when the runner is built).

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::process::{
    AgentCommand, HelperFailure, HelperOutput, PassedFd, StopTarget, helper_output,
};
use crate::user::{AgentUser, UserIds};

pub(crate) mod git_jail;
pub mod seccomp;

/// The options of the probe of `bwrap` (after [`BASE_ARGS`]): a network namespace, as a
/// run with a network gets, and a writable `/tmp`.
const PROBE_ARGS: &[&str] = &["--unshare-net", "--tmpfs", "/tmp", "--", "true"];

/// Where `bwrap` is looked for when it is not on the service's `PATH`.
pub const DEFAULT_BWRAP: &str = "/usr/bin/bwrap";

/// How long the probe of `bwrap` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most characters of the probe's stderr quoted in a message.
const PROBE_STDERR_CHARS: usize = 300;

/// The probe's view of the system (an agent's sandbox mounts only [`system_mounts`]).
const PROBE_ROOT_ARGS: &[&str] = &["--ro-bind", "/", "/"];

/// The directories of the system an agent sees read-only, if they exist (`/bin` and its
/// siblings as the symlinks they are on a merged-`/usr` system).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// What of `/etc` an agent sees read-only, if it exists: what programs need to resolve
/// users, hosts and time, find libraries, and check certificates; nothing else (no
/// `/etc/default`, no systemd units, no `.env` files).
const ETC_ENTRIES: &[&str] = &[
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "host.conf",
    "gai.conf",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "gitconfig",
    "mime.types",
    "protocols",
    "services",
    "os-release",
];

/// The options every sandbox gets, before its mounts (also those of the probe).
const BASE_ARGS: &[&str] = &[
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
];

/// Whether agents run sandboxed: the value of `AGENTRY_AGENT_SANDBOX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// `auto` (the default): agents run in a bubblewrap sandbox; without a working `bwrap`
    /// they are refused.
    #[default]
    Auto,
    /// `off`: agents run unsandboxed, as the service's user.
    Off,
}

impl SandboxMode {
    /// The configuration value: `auto` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Off => "off",
        }
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value of `AGENTRY_AGENT_SANDBOX` that is neither `auto` nor `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid AGENTRY_AGENT_SANDBOX {0:?}: expected \"auto\" (agents run in a bubblewrap \
     sandbox, the default) or \"off\" (agents run unsandboxed)"
)]
pub struct InvalidSandboxMode(pub String);

impl FromStr for SandboxMode {
    type Err = InvalidSandboxMode;

    /// `auto` or `off`, exactly; anything else is refused.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(SandboxMode::Auto),
            "off" => Ok(SandboxMode::Off),
            other => Err(InvalidSandboxMode(other.to_owned())),
        }
    }
}

/// The resource limits of a sandboxed agent (docs/security.md#resource-limits): its `/tmp`
/// is a tmpfs of [`AgentLimits::tmp_bytes`] (`bwrap --size`), and the forwarder, the
/// sandbox's first process, sets the others as rlimits on itself before it starts the
/// agent, so that every process of the sandbox inherits them (`agentry sandbox-net
/// --rlimit NAME=VALUE`). Zero means no limit (for the rlimits; `/tmp` always has a size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// The size of the sandbox's `/tmp` in bytes (`AGENTRY_AGENT_TMP_BYTES`, default 1 GiB):
    /// writing more fails with `ENOSPC`.
    pub tmp_bytes: u64,
    /// `RLIMIT_NPROC`: processes and threads (`AGENTRY_AGENT_MAX_PROCESSES`, default 512).
    /// The sandbox has a user namespace of its own, where the count is the sandbox's own
    /// processes, not the service's; the kernel does not apply it to a service running as
    /// `root` (uid 0 outside the sandbox).
    pub max_processes: u64,
    /// `RLIMIT_NOFILE`: open files per process (`AGENTRY_AGENT_MAX_OPEN_FILES`, default
    /// 4096).
    pub max_open_files: u64,
    /// `RLIMIT_FSIZE`: the largest file a process may write, in bytes
    /// (`AGENTRY_AGENT_MAX_FILE_BYTES`, default 1 GiB): writing past it fails with `EFBIG`.
    pub max_file_bytes: u64,
    /// `RLIMIT_DATA`: the heap and private writable memory of each process, in bytes
    /// (`AGENTRY_AGENT_MAX_MEMORY_BYTES`, default 4 GiB). Not `RLIMIT_AS`: V8 and other
    /// runtimes reserve large ranges of address space they never use.
    pub max_memory_bytes: u64,
    /// The memory of the whole sandbox, page cache included, where a control group can be
    /// made ([`crate::cgroup`]; `AGENTRY_AGENT_TOTAL_MEMORY_BYTES`, default 8 GiB, 0: no
    /// limit): past it the kernel ends a process of the sandbox. The group also counts
    /// [`AgentLimits::max_processes`] for the sandbox, whatever its user.
    pub total_memory_bytes: u64,
}

/// One GiB.
const GIB: u64 = 1 << 30;

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            tmp_bytes: GIB,
            max_processes: 512,
            max_open_files: 4096,
            max_file_bytes: GIB,
            max_memory_bytes: 4 * GIB,
            total_memory_bytes: 8 * GIB,
        }
    }
}

/// The variables of [`AgentLimits`], each with the smallest value accepted (0 is accepted
/// by the rlimits: no limit).
pub const AGENT_LIMIT_VARS: &[&str] = &[
    "AGENTRY_AGENT_TMP_BYTES",
    "AGENTRY_AGENT_MAX_PROCESSES",
    "AGENTRY_AGENT_MAX_OPEN_FILES",
    "AGENTRY_AGENT_MAX_FILE_BYTES",
    "AGENTRY_AGENT_MAX_MEMORY_BYTES",
    "AGENTRY_AGENT_TOTAL_MEMORY_BYTES",
];

impl AgentLimits {
    /// The limits read through `get` (a variable's value, `None` when unset or blank): each
    /// of [`AGENT_LIMIT_VARS`] a whole number, bytes possibly with a binary suffix
    /// (`K`, `M`, `G`, `T`: `512M`, `2G`). Unset ones keep their default.
    ///
    /// # Errors
    ///
    /// The variable with a bad value and why: not a number, a `/tmp` under 1 MiB, fewer
    /// than 16 processes, fewer than 64 open files, files or memory under 1 MiB (0, no
    /// limit, is accepted for the rlimits).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<AgentLimits, (&'static str, String)> {
        let mut limits = AgentLimits::default();
        let read = |name: &'static str, bytes: bool, min: u64, zero: bool| {
            let Some(text) = get(name) else {
                return Ok(None);
            };
            let value = parse_amount(text.trim(), bytes).ok_or_else(|| {
                (
                    name,
                    format!(
                        "{text:?}; expected a whole number{}",
                        if bytes {
                            " of bytes, optionally with K, M, G or T (binary: 512M, 2G)"
                        } else {
                            ""
                        }
                    ),
                )
            })?;
            if value < min && !(zero && value == 0) {
                let unit = if bytes {
                    format!("{} MiB", min >> 20)
                } else {
                    min.to_string()
                };
                return Err((
                    name,
                    format!(
                        "{text:?} is too small: at least {unit}{}",
                        if zero { " (or 0: no limit)" } else { "" }
                    ),
                ));
            }
            Ok(Some(value))
        };
        const MIB: u64 = 1 << 20;
        if let Some(v) = read("AGENTRY_AGENT_TMP_BYTES", true, MIB, false)? {
            limits.tmp_bytes = v;
        }
        if let Some(v) = read("AGENTRY_AGENT_MAX_PROCESSES", false, 16, true)? {
            limits.max_processes = v;
        }
        if let Some(v) = read("AGENTRY_AGENT_MAX_OPEN_FILES", false, 64, true)? {
            limits.max_open_files = v;
        }
        if let Some(v) = read("AGENTRY_AGENT_MAX_FILE_BYTES", true, MIB, true)? {
            limits.max_file_bytes = v;
        }
        if let Some(v) = read("AGENTRY_AGENT_MAX_MEMORY_BYTES", true, MIB, true)? {
            limits.max_memory_bytes = v;
        }
        if let Some(v) = read("AGENTRY_AGENT_TOTAL_MEMORY_BYTES", true, 16 * MIB, true)? {
            limits.total_memory_bytes = v;
        }
        Ok(limits)
    }

    /// The forwarder's `--rlimit NAME=VALUE` arguments of the limits that are set (not 0).
    pub fn rlimit_args(&self) -> Vec<String> {
        [
            ("NPROC", self.max_processes),
            ("NOFILE", self.max_open_files),
            ("FSIZE", self.max_file_bytes),
            ("DATA", self.max_memory_bytes),
        ]
        .into_iter()
        .filter(|(_, value)| *value != 0)
        .flat_map(|(name, value)| ["--rlimit".to_owned(), format!("{name}={value}")])
        .collect()
    }
}

/// A whole number, with a binary suffix (`K`, `M`, `G`, `T`, optionally followed by `iB`
/// or `B`) when `bytes`.
fn parse_amount(text: &str, bytes: bool) -> Option<u64> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &text[digits.len()..];
    let number: u64 = digits.parse().ok()?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" => 0,
        _ if !bytes => return None,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    number.checked_mul(1_u64 << shift)
}

/// What the installed `bwrap` supports beyond the basics, found at probe time from its
/// `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BwrapFeatures {
    /// `--size` before `--tmpfs` (bubblewrap 0.5): the sandbox's `/tmp` gets
    /// [`AgentLimits::tmp_bytes`]; without it, a tmpfs of the kernel's default size (half
    /// the memory).
    pub tmpfs_size: bool,
    /// `--unshare-user --disable-userns` (bubblewrap 0.8): the sandbox has a user namespace
    /// of its own (so [`AgentLimits::max_processes`] counts the sandbox's processes only)
    /// and the agent cannot create nested user namespaces.
    pub disable_userns: bool,
}

/// The sandbox agents run in, per a [`SandboxMode`]. Cheap to build and to clone: `bwrap`
/// is found and probed once, on first use ([`Sandbox::check`]), and the answer is shared
/// by the clones.
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: SandboxMode,
    /// The `bwrap` to use instead of searching for one.
    bwrap: Option<PathBuf>,
    /// The resource limits of every agent.
    limits: AgentLimits,
    /// The forwarder started inside every sandbox in front of the agent, which sets the
    /// rlimits (see [`Sandbox::with_forwarder`]).
    forwarder: Option<Vec<String>>,
    /// Directories (or files) the operator adds to what agents see read-only
    /// (`AGENTRY_SANDBOX_EXTRA_RO`, see [`Sandbox::with_extra_ro`]).
    extra_ro: Vec<PathBuf>,
    /// Whether agents get the seccomp filter ([`seccomp`]; `AGENTRY_SANDBOX_SECCOMP`).
    seccomp: bool,
    /// The user agents run as ([`Sandbox::with_agent_user`]).
    agent_user: AgentUser,
    probed: Arc<OnceCell<Result<(PathBuf, BwrapFeatures), String>>>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new(SandboxMode::Auto)
    }
}

impl Sandbox {
    /// The sandbox of `mode`; in [`SandboxMode::Auto`], `bwrap` is the one on the service's
    /// `PATH`, or [`DEFAULT_BWRAP`].
    pub fn new(mode: SandboxMode) -> Self {
        Sandbox {
            mode,
            bwrap: None,
            limits: AgentLimits::default(),
            forwarder: None,
            extra_ro: Vec::new(),
            seccomp: true,
            agent_user: AgentUser::Service,
            probed: Arc::new(OnceCell::new()),
        }
    }

    /// This sandbox with `limits` for every agent.
    pub fn with_limits(self, limits: AgentLimits) -> Self {
        Sandbox { limits, ..self }
    }

    /// This sandbox with `forwarder` (its program, an absolute path or a name found on the
    /// agent's `PATH`, and leading arguments: `["/usr/local/bin/agentry", "sandbox-net"]`,
    /// see [`crate::network::forwarder_main`]) started as the first process of every sandbox,
    /// with the rlimits of [`AgentLimits`] and, for a run with a network, its listeners. A
    /// [`crate::local::NetworkConfig`]'s forwarder takes precedence. Without any, agents run
    /// without the rlimits (a warning is logged when the runner is built).
    pub fn with_forwarder(self, forwarder: Vec<String>) -> Self {
        Sandbox {
            forwarder: Some(forwarder),
            ..self
        }
    }

    /// This sandbox with `paths` (absolute) also visible, read-only, to every agent
    /// (`AGENTRY_SANDBOX_EXTRA_RO`: a toolchain outside `/usr`, such as `/opt/toolchain`).
    /// Paths that do not exist, any that is, holds or lies in the data directory, and any
    /// [`extra_ro_refusal`] refuses are left out. One in `/tmp`, `/var/tmp` or `/run`
    /// ([`REPLACED_DIRS`]) is mounted after the sandbox's own empty directory there, so
    /// agents see it.
    pub fn with_extra_ro(self, paths: Vec<PathBuf>) -> Self {
        Sandbox {
            extra_ro: paths,
            ..self
        }
    }

    /// This sandbox with the seccomp filter ([`seccomp`]) on (the default) or off
    /// (`AGENTRY_SANDBOX_SECCOMP=off`: for an operator whose tools need a refused call).
    pub fn with_seccomp(self, on: bool) -> Self {
        Sandbox {
            seccomp: on,
            ..self
        }
    }

    /// This sandbox with agents run as `user` (see [`crate::user`]): `bwrap` (or an
    /// unsandboxed agent) is started as that user, and the probe of `bwrap` too. A
    /// [`AgentUser::Refused`] refuses every agent with its reason.
    pub fn with_agent_user(self, user: AgentUser) -> Self {
        Sandbox {
            agent_user: user,
            probed: Arc::new(OnceCell::new()),
            ..self
        }
    }

    /// The user agents run as.
    pub fn agent_user(&self) -> &AgentUser {
        &self.agent_user
    }

    /// Whether agents get the seccomp filter (where one exists for the architecture:
    /// [`seccomp::supported`]).
    pub fn seccomp(&self) -> bool {
        self.seccomp
    }

    /// The paths given with [`Sandbox::with_extra_ro`].
    pub fn extra_ro(&self) -> &[PathBuf] {
        &self.extra_ro
    }

    /// The limits of every agent.
    pub fn limits(&self) -> AgentLimits {
        self.limits
    }

    /// The forwarder given with [`Sandbox::with_forwarder`].
    pub fn forwarder(&self) -> Option<&[String]> {
        self.forwarder.as_deref()
    }

    /// [`SandboxMode::Auto`] with the `bwrap` executable at `path` (not searched for).
    pub fn with_bwrap(path: impl Into<PathBuf>) -> Self {
        Sandbox {
            bwrap: Some(path.into()),
            ..Sandbox::new(SandboxMode::Auto)
        }
    }

    /// The mode.
    pub fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// Whether agents run sandboxed: `Ok(true)` when `bwrap` works here (probed once),
    /// `Ok(false)` in [`SandboxMode::Off`].
    ///
    /// # Errors
    ///
    /// In [`SandboxMode::Auto`] when `bwrap` is missing or does not work here: a sentence
    /// saying why and naming the fix (agents are refused then).
    pub async fn check(&self) -> Result<bool, String> {
        Ok(self.launcher().await?.is_some())
    }

    /// What the probed `bwrap` supports ([`BwrapFeatures`]), `None` when agents run
    /// unsandboxed.
    ///
    /// # Errors
    ///
    /// As [`Sandbox::check`].
    pub async fn features(&self) -> Result<Option<BwrapFeatures>, String> {
        Ok(self.probed().await?.map(|(_, features)| features))
    }

    /// The `bwrap` agents are launched with (found and probed once), `None` when agents run
    /// unsandboxed ([`SandboxMode::Off`]).
    ///
    /// # Errors
    ///
    /// As [`Sandbox::check`].
    pub async fn launcher(&self) -> Result<Option<PathBuf>, String> {
        Ok(self.probed().await?.map(|(bwrap, _)| bwrap))
    }

    /// The `bwrap` and its features (found and probed once), `None` when agents run
    /// unsandboxed.
    pub(crate) async fn probed(&self) -> Result<Option<(PathBuf, BwrapFeatures)>, String> {
        if let AgentUser::Refused(why) = &self.agent_user {
            return Err(why.clone());
        }
        if self.mode == SandboxMode::Off {
            return Ok(None);
        }
        let probed = self
            .probed
            .get_or_init(|| async {
                let found = match &self.bwrap {
                    Some(path) => Ok(path.clone()),
                    None => find_bwrap(),
                };
                let result = match found {
                    Ok(bwrap) => probe(&bwrap, self.agent_user.ids())
                        .await
                        .map(|features| (bwrap, features)),
                    Err(e) => Err(e),
                };
                match &result {
                    Ok((bwrap, features)) => {
                        tracing::info!(
                            bwrap = %bwrap.display(),
                            tmpfs_size = features.tmpfs_size,
                            disable_userns = features.disable_userns,
                            user = self.agent_user.ids().map(|u| u.name.as_str()),
                            "agents run in a bubblewrap sandbox"
                        );
                        if !features.tmpfs_size {
                            tracing::warn!(
                                "this bwrap cannot size a tmpfs (--size, bubblewrap 0.5): \
                                 agents' /tmp is not limited by AGENTRY_AGENT_TMP_BYTES"
                            );
                        }
                        if !features.disable_userns && self.seccomp && seccomp::supported() {
                            tracing::warn!(
                                "this bwrap cannot give the sandbox a user namespace of its \
                                 own with --disable-userns (bubblewrap 0.8): only the seccomp \
                                 filter refuses agents nested namespaces, and \
                                 AGENTRY_AGENT_MAX_PROCESSES counts every process of the \
                                 service's user"
                            );
                        } else if !features.disable_userns {
                            tracing::warn!(
                                "this bwrap cannot give the sandbox a user namespace of its \
                                 own with --disable-userns (bubblewrap 0.8) and agents have no \
                                 seccomp filter: agents may create nested user namespaces, and \
                                 AGENTRY_AGENT_MAX_PROCESSES counts every process of the \
                                 service's user"
                            );
                        }
                    }
                    Err(why) => tracing::error!("{}", unavailable(why)),
                }
                result
            })
            .await;
        match probed {
            Ok(found) => Ok(Some(found.clone())),
            Err(why) => Err(unavailable(why)),
        }
    }
}

/// Whether bubblewrap works on this machine: found as a runner finds it and tried once,
/// blocking, with the namespaces an agent's sandbox gets (a network namespace included).
/// For callers outside an async runtime, such as a test suite deciding whether its agents
/// run sandboxed; a runner probes on its own ([`Sandbox::check`]).
///
/// # Errors
///
/// Why not: no `bwrap`, or its trial run failed (with its exit status).
pub fn works_here() -> Result<(), String> {
    let bwrap = find_bwrap()?;
    let status = trial_command(&bwrap, PROBE_ARGS, Stdio::null())
        .status()
        .map_err(|e| format!("cannot start {}: {e}", bwrap.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "a trial run of {} failed ({status})",
            bwrap.display()
        ))
    }
}

/// The message of a refused agent when the sandbox does not work here.
fn unavailable(why: &str) -> String {
    format!(
        "agents run in a bubblewrap sandbox, which is not available here ({why}): install \
         bubblewrap, or set AGENTRY_AGENT_SANDBOX=off to run agents unsandboxed"
    )
}

/// `bwrap` on the service's `PATH`, else [`DEFAULT_BWRAP`] if it exists.
fn find_bwrap() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = search_path(OsStr::new("bwrap"), &path) {
        return Ok(found);
    }
    let default = Path::new(DEFAULT_BWRAP);
    if is_executable(default) {
        return Ok(default.to_owned());
    }
    Err(format!(
        "bwrap was not found on PATH nor at {DEFAULT_BWRAP}"
    ))
}

/// What `bwrap --help` says `bwrap` supports.
async fn features_of(bwrap: &Path) -> BwrapFeatures {
    let help = tokio::time::timeout(
        PROBE_TIMEOUT,
        tokio::process::Command::new(bwrap)
            .arg("--help")
            .env_clear()
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await;
    let text = match help {
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            text
        }
        _ => String::new(),
    };
    let has = |option: &str| text.split_whitespace().any(|word| word == option);
    BwrapFeatures {
        tmpfs_size: has("--size"),
        disable_userns: has("--disable-userns") && has("--unshare-user"),
    }
}

/// The options a sandbox gets for `features`, before its mounts, besides [`BASE_ARGS`]: a
/// user namespace of its own where nested ones are disabled.
fn feature_args(features: BwrapFeatures) -> &'static [&'static str] {
    if features.disable_userns {
        &["--unshare-user", "--disable-userns"]
    } else {
        &[]
    }
}

/// Runs `true` in a sandbox like an agent's (with a network namespace, and what the
/// features of `bwrap` add: a user namespace without nested ones, a sized `/tmp`), to know
/// `bwrap` works here. A feature that fails is left out (the sandbox still works without
/// it). When only the network namespace fails, the message says so.
async fn probe(bwrap: &Path, user: Option<&UserIds>) -> Result<BwrapFeatures, String> {
    let mut features = features_of(bwrap).await;
    let args = |features: BwrapFeatures, net: bool| {
        let mut args: Vec<&str> = feature_args(features).to_vec();
        if net {
            args.push("--unshare-net");
        }
        if features.tmpfs_size {
            args.extend(["--size", "1048576"]);
        }
        args.extend(["--tmpfs", "/tmp", "--", "true"]);
        args
    };
    if features != BwrapFeatures::default()
        && trial(bwrap, user, &args(features, true)).await.is_err()
    {
        for fewer in [
            BwrapFeatures {
                disable_userns: false,
                ..features
            },
            BwrapFeatures {
                tmpfs_size: false,
                ..features
            },
            BwrapFeatures::default(),
        ] {
            if trial(bwrap, user, &args(fewer, true)).await.is_ok() {
                features = fewer;
                break;
            }
        }
    }
    let failed = match trial(bwrap, user, &args(features, true)).await {
        Ok(()) => return Ok(features),
        Err(failed) => failed,
    };
    if trial(bwrap, user, &args(features, false)).await.is_ok() {
        return Err(format!(
            "{failed}; {} works here without a network namespace, but agents get one of \
             their own (--unshare-net), which cannot be created here",
            bwrap.display()
        ));
    }
    Err(failed)
}

/// A trial run of `bwrap`: [`PROBE_ROOT_ARGS`], [`BASE_ARGS`] and `args` (ending with the
/// command), with only a `PATH`, its stdin and stdout to nothing, its stderr to `stderr`.
fn trial_command(bwrap: &Path, args: &[&str], stderr: Stdio) -> std::process::Command {
    let mut command = std::process::Command::new(bwrap);
    command
        .args(PROBE_ROOT_ARGS)
        .args(BASE_ARGS)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    command
}

/// Runs `bwrap` with [`BASE_ARGS`] and `args` (ending with the command), within
/// [`PROBE_TIMEOUT`].
async fn trial(bwrap: &Path, user: Option<&UserIds>, args: &[&str]) -> Result<(), String> {
    let mut command = tokio::process::Command::from(trial_command(bwrap, args, Stdio::piped()));
    if let Some(user) = user {
        command.uid(user.uid).gid(user.gid);
    }
    let HelperOutput { status, stderr, .. } = helper_output(&mut command, PROBE_TIMEOUT)
        .await
        .map_err(|failure| match failure {
            HelperFailure::Start(e) => format!("cannot start {}: {e}", bwrap.display()),
            HelperFailure::TimedOut(limit) => format!(
                "{} did not finish a trial run within {} s",
                bwrap.display(),
                limit.as_secs()
            ),
        })?;
    let status = status.map_err(|e| format!("waiting for {}: {e}", bwrap.display()))?;
    if status.success() {
        return Ok(());
    }
    let stderr = agentry_domain::quote::excerpt(stderr.trim(), PROBE_STDERR_CHARS);
    Err(format!(
        "a trial run of {} failed ({status}){}",
        bwrap.display(),
        if stderr.is_empty() {
            String::new()
        } else {
            format!(": {stderr}")
        }
    ))
}

/// Where one agent run lives, for [`wrap`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout<'a> {
    /// The data directory (hidden).
    pub root: &'a Path,
    /// The run's worktree (writable).
    pub worktree: &'a Path,
    /// The run's `HOME` (writable).
    pub home: &'a Path,
    /// The repository's bare mirror (read-only, the worktree's own entry included).
    pub mirror: &'a Path,
    /// A review run: the worktree's git metadata is read-only too (`git diff`, `git log`
    /// and `git status` work; nothing of git can be changed).
    pub review: bool,
    /// For a coding run, the copy of the worktree's git metadata the agent may write in
    /// ([`crate::workspace::Worktree::agent_git_dir`]), shown at the metadata's own path
    /// instead of it; without one (a review) the metadata is shown read-only.
    pub agent_git: Option<&'a Path>,
    /// Files the agent is given by name (the values of `AGENTRY_AGENT_ENV` variables that
    /// are absolute paths of existing files, such as a CA bundle): those outside the
    /// system's allow-list are bound read-only. Never anything of the data directory.
    pub readable: &'a [PathBuf],
    /// What the operator adds to the system agents see (`AGENTRY_SANDBOX_EXTRA_RO`),
    /// read-only; never anything of the data directory.
    pub extra_ro: &'a [PathBuf],
    /// The run's network, if it has one: then the sandbox gets a network namespace of its
    /// own and the forwarder listens for it.
    pub network: Option<NetLayout<'a>>,
    /// The forwarder's program and leading arguments (`agentry sandbox-net`), started in
    /// front of the agent with the rlimits of `limits` ([`AgentLimits::rlimit_args`]),
    /// [`crate::network::forwarder_args`] for a network, and the agent's command line after
    /// them. Required with a network; without one, the agent gets no rlimits.
    pub forwarder: Option<&'a [String]>,
    /// The agent's resource limits.
    pub limits: AgentLimits,
    /// What the `bwrap` used supports.
    pub features: BwrapFeatures,
    /// The seccomp filter ([`seccomp::program`]), if the agent gets one: given to `bwrap`
    /// on a pipe it alone inherits (`--seccomp N`, [`AgentCommand::pass_fds`]).
    pub seccomp: Option<&'a [u8]>,
    /// The user `bwrap` is started as, if not the service's (it then starts from `/`: the
    /// paths it mounts must be reachable by that user, [`crate::user::unreachable`]).
    pub user: Option<&'a UserIds>,
}

/// The network part of a [`Layout`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct NetLayout<'a> {
    /// The run's network directory (holding the sockets), mounted read-only at
    /// [`crate::network::SANDBOX_NET_DIR`].
    pub dir: &'a Path,
}

/// `cmd` run inside the sandbox by `bwrap`: the same stdin, working directory and
/// environment (the `bwrap` process gets exactly the agent's environment, which it passes
/// on), the program resolved on the environment's `PATH`. With a network
/// ([`Layout::network`]), in a network namespace of its own, started by the forwarder.
pub(crate) fn wrap(
    bwrap: &Path,
    cmd: AgentCommand,
    layout: Layout<'_>,
) -> Result<AgentCommand, String> {
    let root = data_dir(layout.root)?;
    let worktree = canonical(layout.worktree)?;
    let home = canonical(layout.home)?;

    // The system the agent sees, read-only; every other path of the machine is absent
    // (the sandbox's root is an empty tmpfs, made read-only once its mount points exist).
    let (system, visible) = system_mounts(&root, layout.extra_ro);
    let tmpfs = hiding_tmpfs(&root);

    let program = resolve_program(&cmd.program, &cmd.env)?;
    let mut program_binds: Vec<ProgramMount> = Vec::new();
    let mut bind = |what: &str, program: &Path| {
        bind_program(what, program, &cmd.env, &root, &visible, &mut program_binds)
    };
    let program = bind("the agent program", &program)?;
    let forwarder = match layout.forwarder {
        None => None,
        Some(command) => {
            let (first, leading) = command
                .split_first()
                .ok_or_else(|| "the network forwarder's command is empty".to_owned())?;
            let forwarder = resolve_program(Path::new(first), &cmd.env)
                .map_err(|e| format!("the network forwarder: {e}"))?;
            let forwarder = bind("the network forwarder", &forwarder)?;
            Some((forwarder, leading))
        }
    };
    let net_dir = match layout.network {
        None => None,
        Some(net) => {
            if forwarder.is_none() {
                return Err("a run with a network needs the network forwarder".to_owned());
            }
            Some(canonical(net.dir)?)
        }
    };
    for file in layout.readable {
        let Ok(file) = std::fs::canonicalize(file) else {
            continue;
        };
        if file.is_file()
            && !file.starts_with(&root)
            && !visible.iter().any(|v| file.starts_with(v))
            && !covered(&program_binds, &file)
        {
            program_binds.push(ProgramMount::Bind(file));
        }
    }

    let mut args: Vec<String> = BASE_ARGS
        .iter()
        .chain(feature_args(layout.features))
        .map(|a| (*a).to_owned())
        .collect();
    if net_dir.is_some() {
        args.push("--unshare-net".to_owned());
    }
    push_system(
        &mut args,
        &system,
        &tmpfs,
        &program_binds,
        layout.features,
        layout.limits,
    )?;
    if let Some(net_dir) = &net_dir {
        // In the `/run` tmpfs, which is made read-only below like every hiding tmpfs.
        args.extend([
            "--ro-bind".to_owned(),
            utf8(net_dir)?,
            crate::network::SANDBOX_NET_DIR.to_owned(),
        ]);
    }
    let mut hidden_git = Vec::new();
    match git_dirs(&worktree, layout.mirror) {
        Some((mirror, gitdir)) => {
            let entries = mirror.join("worktrees");
            push_bind(&mut args, "--ro-bind", &mirror)?;
            args.extend(["--tmpfs".to_owned(), utf8(&entries)?]);
            match layout.agent_git.filter(|_| !layout.review) {
                Some(copy) => args.extend(["--bind".to_owned(), utf8(copy)?, utf8(&gitdir)?]),
                None => push_bind(&mut args, "--ro-bind", &gitdir)?,
            }
            hidden_git.push(entries);
        }
        None => tracing::warn!(
            worktree = %worktree.display(),
            "the worktree's git directory is not in its mirror; git will not work in the sandbox"
        ),
    }
    for dir in [&worktree, &home] {
        push_bind(&mut args, "--bind", dir)?;
    }
    push_remount_ro(&mut args, tmpfs.iter().chain(&hidden_git))?;
    let mut pass_fds = Vec::new();
    if let Some(program) = layout.seccomp {
        let passed = seccomp_pipe(program)?;
        args.extend(["--seccomp".to_owned(), passed.number().to_string()]);
        pass_fds.push(passed);
    }
    args.extend(["--chdir".to_owned(), utf8(&worktree)?, "--".to_owned()]);
    if let Some((forwarder, leading)) = &forwarder {
        args.push(utf8(forwarder)?);
        args.extend(leading.iter().cloned());
        args.extend(layout.limits.rlimit_args());
        if net_dir.is_some() {
            args.extend(crate::network::forwarder_args());
        } else {
            args.push("--".to_owned());
        }
    }
    args.push(utf8(&program)?);
    args.extend(cmd.args);
    Ok(AgentCommand {
        program: bwrap.to_owned(),
        args,
        stdin: cmd.stdin,
        // Another user may not be able to enter the worktree from outside; `--chdir` takes
        // the agent there inside.
        cwd: if layout.user.is_some() {
            PathBuf::from("/")
        } else {
            cmd.cwd
        },
        env: cmd.env,
        stop: StopTarget::Sandbox,
        pass_fds,
        user: layout.user.cloned(),
    })
}

/// The directories every sandbox replaces with an empty tmpfs of its own (besides the data
/// directory): what the operator adds in them (`AGENTRY_SANDBOX_EXTRA_RO`) is mounted after
/// them, but none of them can be added whole.
pub const REPLACED_DIRS: &[&str] = &["/tmp", "/var/tmp", SANDBOX_RUN];

/// The directories `bwrap` makes afresh in every sandbox (`--proc`, `--dev`): nothing in
/// them can be added.
const FRESH_DIRS: &[&str] = &["/proc", "/dev"];

/// Why `path` (absolute, as given or resolved) cannot be one of the paths the operator
/// adds to the sandbox (`AGENTRY_SANDBOX_EXTRA_RO`), or `None` when it can, as far as the
/// sandbox's own directories go (the data directory is checked apart): one of
/// [`REPLACED_DIRS`] itself (agents get an empty one of their own there), anything in
/// `/proc` or `/dev` (made afresh in each sandbox), and the directory the run's network
/// sockets are mounted at ([`crate::network::SANDBOX_NET_DIR`]) or anything in it. A path
/// *in* one of [`REPLACED_DIRS`] (`/tmp/toolchain`) is accepted: it is mounted after that
/// directory's tmpfs, so agents see it.
pub fn extra_ro_refusal(path: &Path) -> Option<String> {
    let shown = path.display();
    if let Some(dir) = REPLACED_DIRS.iter().find(|d| path == Path::new(d)) {
        return Some(format!(
            "{shown} is {dir}, which the sandbox replaces with an empty directory of its own \
             for each agent, so agents could never see it; name the directories in it that \
             agents need instead"
        ));
    }
    if let Some(dir) = FRESH_DIRS.iter().find(|d| path.starts_with(d)) {
        return Some(format!(
            "{shown} lies in {dir}, which the sandbox makes afresh for each agent, so agents \
             could never see it"
        ));
    }
    let net = Path::new(crate::network::SANDBOX_NET_DIR);
    if path.starts_with(net) {
        return Some(format!(
            "{shown} lies in {}, where the sandbox mounts the run's network sockets, so \
             agents could never see it",
            net.display()
        ));
    }
    None
}

/// The empty tmpfs every sandbox gets, parents first: `/tmp` (writable), `/var/tmp`, `/run`
/// and the data directory `root` (read-only, holding only the run's mount points, even where
/// it lies in `/tmp`).
fn hiding_tmpfs(root: &Path) -> Vec<PathBuf> {
    let mut tmpfs: Vec<PathBuf> = REPLACED_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(std::iter::once(root.to_owned()))
        .collect();
    tmpfs.sort_by_key(|p| p.components().count());
    tmpfs.dedup();
    tmpfs
}

/// `path` resolved (absolute, no symbolic links), or why it cannot be.
fn canonical(path: &Path) -> Result<PathBuf, String> {
    std::fs::canonicalize(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

/// The data directory `root`, resolved; never the root directory, which a sandbox could
/// not hide.
fn data_dir(root: &Path) -> Result<PathBuf, String> {
    let root = canonical(root)?;
    if root.parent().is_none() {
        return Err("the data directory cannot be the root directory".to_owned());
    }
    Ok(root)
}

/// `path` as text for `bwrap`'s command line.
fn utf8(path: &Path) -> Result<String, String> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("the path {} is not valid UTF-8", path.display()))
}

/// Adds the mounts every sandbox starts with: the `system` allow-list ([`system_mounts`]),
/// the hiding `tmpfs` ([`hiding_tmpfs`]; `/tmp` sized by `limits` where `features` allow)
/// and the programs' `binds` ([`bind_program`]), read-only. A mount of `system` in one of the `tmpfs` (an
/// `AGENTRY_SANDBOX_EXTRA_RO` path in `/tmp`) comes after it, so that the tmpfs does not
/// hide it; one holding a tmpfs (`/var`, holding `/var/tmp`) comes before, so that the
/// tmpfs still hides what it replaces.
fn push_system(
    args: &mut Vec<String>,
    system: &[(&'static str, PathBuf, PathBuf)],
    tmpfs: &[PathBuf],
    binds: &[ProgramMount],
    features: BwrapFeatures,
    limits: AgentLimits,
) -> Result<(), String> {
    let (inside, before): (Vec<_>, Vec<_>) = system
        .iter()
        .partition(|(_, _, dest)| tmpfs.iter().any(|t| dest != t && dest.starts_with(t)));
    for (option, source, dest) in before {
        args.extend([(*option).to_owned(), utf8(source)?, utf8(dest)?]);
    }
    for dir in tmpfs {
        if dir == Path::new("/tmp") && features.tmpfs_size {
            args.extend(["--size".to_owned(), limits.tmp_bytes.to_string()]);
        }
        args.extend(["--tmpfs".to_owned(), utf8(dir)?]);
    }
    for (option, source, dest) in inside {
        args.extend([(*option).to_owned(), utf8(source)?, utf8(dest)?]);
    }
    for mount in binds {
        match mount {
            ProgramMount::Bind(path) => push_bind(args, "--ro-bind", path)?,
            ProgramMount::Link { target, path } => {
                args.extend(["--symlink".to_owned(), utf8(target)?, utf8(path)?]);
            }
        }
    }
    Ok(())
}

/// Adds `option` (`--bind` or `--ro-bind`) mounting `path` at its own path.
fn push_bind(args: &mut Vec<String>, option: &str, path: &Path) -> Result<(), String> {
    let path = utf8(path)?;
    args.extend([option.to_owned(), path.clone(), path]);
    Ok(())
}

/// Makes the tmpfs mounts `dirs` (but `/tmp`) and the root read-only, once the mount points
/// in them exist, so nothing written there looks kept.
fn push_remount_ro<'a>(
    args: &mut Vec<String>,
    dirs: impl Iterator<Item = &'a PathBuf>,
) -> Result<(), String> {
    for dir in dirs {
        if dir != Path::new("/tmp") {
            args.extend(["--remount-ro".to_owned(), utf8(dir)?]);
        }
    }
    args.extend(["--remount-ro".to_owned(), "/".to_owned()]);
    Ok(())
}

/// A pipe holding `program` whole, its writing end closed: what `bwrap --seccomp` reads to
/// its end. (The program is far smaller than a pipe's buffer, so writing never waits.)
fn seccomp_pipe(program: &[u8]) -> Result<PassedFd, String> {
    use std::io::Write;
    let (reader, mut writer) =
        std::io::pipe().map_err(|e| format!("cannot create a pipe for the seccomp filter: {e}"))?;
    writer
        .write_all(program)
        .map_err(|e| format!("cannot write the seccomp filter: {e}"))?;
    drop(writer);
    Ok(PassedFd(Arc::new(reader.into())))
}

/// What a program brings into the sandbox, read-only ([`bind_program`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProgramMount {
    /// A file, or an npm package's directory, mounted at its own path.
    Bind(PathBuf),
    /// A symbolic link at `path` to `target` (a program's real file).
    Link {
        /// What the link points to.
        target: PathBuf,
        /// Where the link is.
        path: PathBuf,
    },
}

/// Whether `path` is shown by one of `mounts` already (a bound file or directory, or a
/// link).
fn covered(mounts: &[ProgramMount], path: &Path) -> bool {
    mounts.iter().any(|mount| match mount {
        ProgramMount::Bind(bound) => path.starts_with(bound),
        ProgramMount::Link { path: link, .. } => link == path,
    })
}

/// Adds to `binds` what makes `program` (`what`, for messages) runnable in the sandbox
/// when it is not `visible` already (the system's allow-list), and nothing beside it: the
/// program's real file, and a script's interpreter's (`#!/usr/bin/env node` for an
/// npm-installed Codex), each alone, or the directory of the npm package it lies in (the
/// package's own `node_modules`, where an npm CLI's platform binary is, included; not the
/// other packages beside it); and the program's path as a symbolic link to its real file
/// when it is one (`bin/claude`), so that nothing else of its directory comes along. A
/// program in the data directory (`root`) is refused. Returns the path to start the
/// program by inside the sandbox: `program` without its `.` and `..` components (whose
/// directories, `crates/api/..`, are not in the sandbox).
fn bind_program(
    what: &str,
    program: &Path,
    env: &[(String, String)],
    root: &Path,
    visible: &[PathBuf],
    binds: &mut Vec<ProgramMount>,
) -> Result<PathBuf, String> {
    let canonical_program = std::fs::canonicalize(program)
        .map_err(|e| format!("cannot resolve {}: {e}", program.display()))?;
    let mut programs = vec![(program.to_owned(), canonical_program.clone())];
    if let Some(interpreter) = interpreter(&canonical_program, env)
        && let Ok(target) = std::fs::canonicalize(&interpreter)
    {
        programs.push((interpreter, target));
    }
    for (path, target) in programs {
        for path in [&path, &target] {
            if path.starts_with(root) {
                return Err(format!(
                    "{what} {} lies in the data directory, which agents cannot see",
                    path.display()
                ));
            }
        }
        let shown = |p: &Path, binds: &[ProgramMount]| {
            visible.iter().any(|v| p.starts_with(v)) || covered(binds, p)
        };
        if !shown(&target, binds) {
            let bind = match package_of(&target) {
                Some(package) if !root.starts_with(&package) => package,
                _ => target.clone(),
            };
            binds.push(ProgramMount::Bind(bind));
        }
        // The way to it: where the path (or a symbolic link it leads through) is not shown,
        // a link to the real file.
        let mut hop = normalized(&path);
        for _ in 0..MAX_LINKS {
            if hop == target {
                break;
            }
            if !shown(&hop, binds) {
                binds.push(ProgramMount::Link {
                    target: target.clone(),
                    path: hop,
                });
                break;
            }
            match next_hop(&hop) {
                Some(next) => hop = next,
                None => break,
            }
        }
    }
    Ok(normalized(program))
}

/// The most symbolic links followed from a program's path to its file (the kernel's own
/// limit).
const MAX_LINKS: usize = 40;

/// Where the symbolic link `link` leads (its target, relative to the link's real
/// directory), or `None` if it is not a link.
fn next_hop(link: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(link).ok()?;
    if target.is_absolute() {
        return Some(normalized(&target));
    }
    let dir = std::fs::canonicalize(link.parent()?).ok()?;
    Some(normalized(&dir.join(target)))
}

/// `path` with its `.` and `..` components resolved as text.
fn normalized(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The directory of the npm package `path` lies in: the entry of the outermost
/// `node_modules` directory that holds it (`node_modules/name` or
/// `node_modules/@scope/name`), if any (not a hidden entry such as `.bin`).
fn package_of(path: &Path) -> Option<PathBuf> {
    let modules = node_modules_of(path)?;
    let mut rest = path.strip_prefix(&modules).ok()?.components();
    let first = rest.next()?.as_os_str().to_str()?;
    if first.starts_with('.') {
        return None;
    }
    let mut package = modules.join(first);
    if first.starts_with('@') {
        package.push(rest.next()?);
    }
    (package != path).then_some(package)
}

/// The directory the run's network directory is mounted in (an empty read-only tmpfs).
const SANDBOX_RUN: &str = "/run";

/// The read-only mounts of the system an agent sees (`(option, source, destination)`, in
/// order): [`SYSTEM_DIRS`] (a symlink as a symlink), the [`ETC_ENTRIES`] (each as what
/// it resolves to here, so that a symlink out of `/etc` still works), and the operator's
/// `extra` (`AGENTRY_SANDBOX_EXTRA_RO`; those that exist and have nothing to do with the
/// data directory `root`). Also the paths visible through them.
#[allow(clippy::type_complexity, reason = "a private helper's plain tuple")]
fn system_mounts(
    root: &Path,
    extra: &[PathBuf],
) -> (Vec<(&'static str, PathBuf, PathBuf)>, Vec<PathBuf>) {
    let mut mounts = Vec::new();
    let mut visible = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = PathBuf::from(dir);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(&path) {
                mounts.push(("--symlink", target, path.clone()));
                visible.push(path);
            }
        } else if meta.is_dir() {
            mounts.push(("--ro-bind", path.clone(), path.clone()));
            visible.push(path);
        }
    }
    for name in ETC_ENTRIES {
        let path = Path::new("/etc").join(name);
        // What it resolves to (a symlink's target), mounted at its own path.
        let Ok(resolved) = std::fs::canonicalize(&path) else {
            continue;
        };
        if resolved.starts_with(root) || root.starts_with(&resolved) {
            continue;
        }
        mounts.push(("--ro-bind", resolved, path.clone()));
        visible.push(path);
    }
    for path in extra {
        let Ok(resolved) = std::fs::canonicalize(path) else {
            continue;
        };
        if !path.is_absolute()
            || resolved.starts_with(root)
            || root.starts_with(&resolved)
            || path.starts_with(root)
            || root.starts_with(path)
        {
            continue;
        }
        if let Some(why) = extra_ro_refusal(path).or_else(|| extra_ro_refusal(&resolved)) {
            tracing::warn!("AGENTRY_SANDBOX_EXTRA_RO: {why}; left out");
            continue;
        }
        for dest in [resolved.clone(), path.clone()] {
            if !visible.contains(&dest) {
                mounts.push(("--ro-bind", resolved.clone(), dest.clone()));
                visible.push(dest);
            }
        }
    }
    (mounts, visible)
}

/// The outermost `node_modules` directory `path` lies in, if any.
fn node_modules_of(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .filter(|dir| dir.file_name() == Some(OsStr::new("node_modules")))
        .last()
        .map(Path::to_owned)
}

/// The interpreter of a script (`#!/usr/bin/env NAME` found on the `PATH` of `env`, or
/// `#!/abs/path`), if `program` is one.
fn interpreter(program: &Path, env: &[(String, String)]) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0_u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = std::str::from_utf8(line.split(|b| *b == b'\n').next()?).ok()?;
    let mut words = line.split_whitespace();
    let first = PathBuf::from(words.next()?);
    if first.file_name() != Some(OsStr::new("env")) {
        return first.is_absolute().then_some(first);
    }
    let name = words.find(|w| !w.starts_with('-'))?;
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    search_path(OsStr::new(name), OsStr::new(path))
}

/// The canonical mirror and the worktree's own git directory in it (from the worktree's
/// `.git` file), or `None` if the worktree's git directory is not an entry of `mirror`.
fn git_dirs(worktree: &Path, mirror: &Path) -> Option<(PathBuf, PathBuf)> {
    let mirror = std::fs::canonicalize(mirror).ok()?;
    // What `git worktree add` wrote is a short line; anything longer is not read.
    let dotgit = crate::files::read_small_text(&worktree.join(".git"), 4096)?;
    let gitdir = dotgit.trim().strip_prefix("gitdir:")?.trim();
    let gitdir = std::fs::canonicalize(worktree.join(gitdir)).ok()?;
    let entries = mirror.join("worktrees");
    (gitdir.parent() == Some(entries.as_path()) && gitdir.is_dir()).then_some((mirror, gitdir))
}

/// The agent program as an absolute path: as given if it has a `/` (relative to the
/// service's working directory), else found on the `PATH` of `env`.
pub(crate) fn resolve_program(program: &Path, env: &[(String, String)]) -> Result<PathBuf, String> {
    if program.components().count() > 1 || program.is_absolute() {
        return std::path::absolute(program)
            .map_err(|e| format!("cannot resolve {}: {e}", program.display()));
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    search_path(program.as_os_str(), OsStr::new(path)).ok_or_else(|| {
        format!(
            "the agent program {} was not found on PATH ({path})",
            program.display()
        )
    })
}

/// The first executable file `name` in the absolute directories of `path` (a `PATH`
/// value), as a shell finds a command.
pub fn search_path(name: &OsStr, path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's directories under `base/data`: the worktree and `HOME` (made), the mirror and
    /// the network directory (made by the tests that need them).
    struct RunDirs {
        root: PathBuf,
        worktree: PathBuf,
        home: PathBuf,
        mirror: PathBuf,
        net: PathBuf,
    }

    /// `bwrap` (the test fails without it), a temporary directory (removed when dropped)
    /// and its canonical path.
    fn bwrap_and_base() -> (PathBuf, tempfile::TempDir, PathBuf) {
        let Ok(bwrap) = find_bwrap() else {
            panic!("these tests need bubblewrap (bwrap) installed");
        };
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        (bwrap, dir, base)
    }

    /// The arguments of `bwrap` wrapping `cmd` (which must succeed), joined with spaces.
    /// Runs `wrapped` with only its own environment; its standard output, once it succeeded.
    fn run_wrapped(wrapped: &AgentCommand) -> String {
        let out = std::process::Command::new(&wrapped.program)
            .args(&wrapped.args)
            .current_dir(&wrapped.cwd)
            .env_clear()
            .envs(wrapped.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn wrapped_args(bwrap: &Path, cmd: AgentCommand, layout: Layout<'_>) -> String {
        wrap(bwrap, cmd, layout).unwrap().args.join(" ")
    }

    impl RunDirs {
        fn new(base: &Path) -> RunDirs {
            let root = base.join("data");
            let dirs = RunDirs {
                worktree: root.join("workspaces/worktrees/t"),
                home: root.join("runs/t/1/home"),
                mirror: root.join("workspaces/mirrors/r.git"),
                net: root.join("runs/t/1/net"),
                root,
            };
            for d in [&dirs.worktree, &dirs.home] {
                std::fs::create_dir_all(d).unwrap();
            }
            dirs
        }

        /// `sh -c true` in the worktree.
        fn sh_true(&self) -> AgentCommand {
            AgentCommand {
                program: PathBuf::from("sh"),
                args: vec!["-c".into(), "true".into()],
                stdin: String::new(),
                cwd: self.worktree.clone(),
                env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
                stop: StopTarget::Group,
                pass_fds: Vec::new(),
                user: None,
            }
        }

        /// The layout of a coding run without a network, a forwarder or a seccomp filter,
        /// with the default limits and no `bwrap` feature.
        fn layout(&self) -> Layout<'_> {
            Layout {
                root: &self.root,
                worktree: &self.worktree,
                home: &self.home,
                mirror: &self.mirror,
                review: false,
                agent_git: None,
                readable: &[],
                extra_ro: &[],
                network: None,
                forwarder: None,
                limits: AgentLimits::default(),
                features: BwrapFeatures::default(),
                seccomp: None,
                user: None,
            }
        }
    }

    #[test]
    fn mode_parses_auto_and_off_only() {
        assert_eq!("auto".parse::<SandboxMode>(), Ok(SandboxMode::Auto));
        assert_eq!("off".parse::<SandboxMode>(), Ok(SandboxMode::Off));
        for bad in ["", "on", "Auto", "none", " off"] {
            let err = bad.parse::<SandboxMode>().unwrap_err();
            assert!(err.to_string().contains("\"auto\""), "{err}");
        }
        assert_eq!(SandboxMode::default(), SandboxMode::Auto);
        assert_eq!(SandboxMode::Off.to_string(), "off");
    }

    /// A program in the service user's `HOME` still runs (its file comes back
    /// read-only) but sees nothing else of that `HOME` nor of the data directory, and
    /// writes only to its worktree and its own `HOME`.
    #[test]
    fn the_sandbox_hides_the_service_home_but_not_the_agent_program() {
        let (bwrap, _dir, base) = bwrap_and_base();
        let service_home = base.join("service-home");
        let bin = service_home.join(".local/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(service_home.join("credentials"), "HOME-SECRET").unwrap();
        let program = bin.join("agent");
        std::fs::write(
            &program,
            "#!/bin/sh\n\
             cat \"$0\" >/dev/null && echo program-readable\n\
             cat \"$1\" 2>/dev/null || echo home-hidden\n\
             cat \"$2\" 2>/dev/null || echo data-hidden\n\
             touch \"$2\" 2>/dev/null || echo data-unwritable\n\
             echo work >./work && echo worktree-writable\n\
             echo home >\"$HOME/h\" && echo agent-home-writable\n\
             echo tmp >/tmp/t && echo tmp-writable\n\
             touch /usr/x 2>/dev/null || echo system-readonly\n",
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = RunDirs::new(&base);
        let (root, worktree, home) = (&dirs.root, &dirs.worktree, &dirs.home);
        std::fs::write(root.join("master.key"), "DATA-SECRET").unwrap();
        let cmd = AgentCommand {
            program: program.clone(),
            args: vec![
                service_home.join("credentials").display().to_string(),
                root.join("master.key").display().to_string(),
            ],
            env: vec![
                ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
                ("HOME".to_owned(), home.display().to_string()),
            ],
            ..dirs.sh_true()
        };
        let layout = dirs.layout();
        let wrapped = wrap(&bwrap, cmd, layout).unwrap();
        assert_eq!(wrapped.program, bwrap);
        // Nothing of the machine but what is listed: no `--ro-bind / /`, and neither the
        // service's HOME nor the data directory is mounted.
        let joined = wrapped.args.join(" ");
        assert!(!joined.contains("--ro-bind / /"), "{joined}");
        assert!(joined.contains("--ro-bind /usr /usr"), "{joined}");
        assert!(
            !wrapped.args.iter().any(|a| Path::new(a) == service_home),
            "{joined}"
        );
        let stdout = run_wrapped(&wrapped);
        assert_eq!(
            stdout,
            "program-readable\nhome-hidden\ndata-hidden\ndata-unwritable\n\
             worktree-writable\nagent-home-writable\ntmp-writable\nsystem-readonly\n"
        );
        assert_eq!(
            std::fs::read_to_string(worktree.join("work")).unwrap(),
            "work\n"
        );
        assert_eq!(std::fs::read_to_string(home.join("h")).unwrap(), "home\n");
        assert_eq!(
            std::fs::read_to_string(root.join("master.key")).unwrap(),
            "DATA-SECRET"
        );

        // A program in the data directory is refused: its directory cannot come back.
        let inside = AgentCommand {
            program: root.join("agent"),
            args: Vec::new(),
            stdin: String::new(),
            cwd: worktree.clone(),
            env: Vec::new(),
            stop: StopTarget::Group,
            pass_fds: Vec::new(),
            user: None,
        };
        std::fs::copy(&program, root.join("agent")).unwrap();
        let refused = wrap(&bwrap, inside, layout).unwrap_err();
        assert!(refused.contains("lies in the data directory"), "{refused}");
    }

    /// An npm-installed CLI as `npm install -g --prefix` lays it out (`bin/cli`, a symbolic
    /// link into `lib/node_modules/@scope/cli`, whose platform binary is in the package's
    /// own `node_modules`) runs in the sandbox with its platform binary, while the other
    /// packages beside it, the files beside its link and beside the forwarder are absent.
    #[test]
    fn only_the_programs_files_and_their_npm_package_come_along() {
        let (bwrap, _dir, base) = bwrap_and_base();
        let prefix = base.join("agents");
        let modules = prefix.join("lib/node_modules");
        let package = modules.join("@acme/cli");
        let native = package.join("node_modules/@acme/cli-linux/bin/native");
        let write = |path: &Path, text: &str, mode: u32| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(
            &package.join("bin/cli.sh"),
            r#"#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
"$here/../node_modules/@acme/cli-linux/bin/native"
for f in "$@"; do cat "$f" 2>/dev/null || echo "hidden $f"; done
"#,
            0o755,
        );
        write(
            &native,
            "#!/bin/sh
echo native-ran
",
            0o755,
        );
        write(&modules.join("other/SECRET"), "OTHER-PACKAGE", 0o644);
        write(&prefix.join("bin/SECRET"), "BESIDE-THE-LINK", 0o644);
        std::os::unix::fs::symlink(
            "../lib/node_modules/@acme/cli/bin/cli.sh",
            prefix.join("bin/cli"),
        )
        .unwrap();
        let tools = base.join("tools");
        let forwarder = tools.join("agentry");
        // A stand-in for the forwarder: it starts what follows its `--`.
        write(
            &forwarder,
            "#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
            0o755,
        );
        write(&tools.join("SECRET"), "BESIDE-THE-FORWARDER", 0o644);
        let dirs = RunDirs::new(&base);
        let secrets = [
            modules.join("other/SECRET"),
            prefix.join("bin/SECRET"),
            tools.join("SECRET"),
        ];
        // Given with `..` (as a test's `crates/api/../runner/…`), through directories the
        // sandbox does not have.
        let cmd = AgentCommand {
            program: prefix.join("lib/../bin/cli"),
            args: secrets.iter().map(|p| p.display().to_string()).collect(),
            ..dirs.sh_true()
        };
        let forwarder_cmd = [base.join("agents/../tools/agentry").display().to_string()];
        let layout = Layout {
            forwarder: Some(&forwarder_cmd),
            ..dirs.layout()
        };
        let wrapped = wrap(&bwrap, cmd, layout).unwrap();
        let args = wrapped.args.join(" ");
        assert!(
            args.contains(&format!("--ro-bind {0} {0} ", package.display())),
            "{args}"
        );
        assert!(
            args.contains(&format!(
                "--symlink {} {} ",
                package.join("bin/cli.sh").display(),
                prefix.join("bin/cli").display()
            )),
            "{args}"
        );
        assert!(
            args.contains(&format!("--ro-bind {0} {0} ", forwarder.display())),
            "{args}"
        );
        // Started by their paths without `..`, which the sandbox has.
        assert!(!args.contains("/.."), "{args}");
        let stdout = run_wrapped(&wrapped);
        let expected: String = std::iter::once("native-ran\n".to_owned())
            .chain(secrets.iter().map(|p| format!("hidden {}\n", p.display())))
            .collect();
        assert_eq!(stdout, expected);
    }

    /// The npm package a path lies in: the entry of the outermost `node_modules`, scoped or
    /// not; none outside one or in `.bin`.
    #[test]
    fn the_package_of_a_path_is_the_outermost_node_modules_entry() {
        let package = |p: &str| package_of(Path::new(p)).map(|p| p.display().to_string());
        assert_eq!(
            package("/p/lib/node_modules/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/codex")
                .as_deref(),
            Some("/p/lib/node_modules/@openai/codex")
        );
        assert_eq!(
            package("/p/lib/node_modules/left-pad/index.js").as_deref(),
            Some("/p/lib/node_modules/left-pad")
        );
        assert_eq!(package("/p/node_modules/.bin/claude"), None);
        assert_eq!(package("/p/node_modules/@scope"), None);
        assert_eq!(package("/usr/local/bin/claude"), None);
        assert_eq!(
            normalized(Path::new("/a/b/../../c/./d")),
            PathBuf::from("/c/d")
        );
    }

    /// With a network, the sandbox gets its own namespace, the run's network directory
    /// read-only at /run/agentry (inside the `/run` tmpfs, which stays read-only), and the
    /// forwarder (made visible like the agent program) in front of the agent's command line.
    #[test]
    fn a_network_brings_its_namespace_its_directory_and_the_forwarder() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let service_home = base.join("home");
        let bin = service_home.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let forwarder = bin.join("agentry");
        std::fs::write(&forwarder, "").unwrap();
        std::fs::set_permissions(&forwarder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = RunDirs::new(&base);
        let (root, net) = (&dirs.root, &dirs.net);
        std::fs::create_dir_all(net).unwrap();
        let cmd = dirs.sh_true();
        let forwarder_cmd = [forwarder.display().to_string(), "sandbox-net".to_owned()];
        let layout = Layout {
            network: Some(NetLayout { dir: net }),
            forwarder: Some(&forwarder_cmd),
            ..dirs.layout()
        };
        let bwrap = Path::new("/usr/bin/bwrap");
        let args = wrapped_args(bwrap, cmd.clone(), layout);
        assert!(args.contains("--unshare-net"), "{args}");
        let net_bind = format!("--ro-bind {} /run/agentry", net.display());
        let run_tmpfs = args.find("--tmpfs /run ").unwrap();
        let bound = args.find(&net_bind).unwrap();
        let run_ro = args.find("--remount-ro /run ").unwrap();
        assert!(run_tmpfs < bound && bound < run_ro, "{args}");
        // The forwarder's file alone, not its directory.
        assert!(
            args.contains(&format!("--ro-bind {0} {0} ", forwarder.display())),
            "{args}"
        );
        assert!(
            !args.contains(&format!("--ro-bind {0} {0} ", bin.display())),
            "{args}"
        );
        let sh = resolve_program(Path::new("sh"), &cmd.env).unwrap();
        assert!(
            args.ends_with(&format!(
                "-- {} sandbox-net --rlimit NPROC=512 --rlimit NOFILE=4096 --rlimit \
                 FSIZE=1073741824 --rlimit DATA=4294967296 --listen 4810=/run/agentry/gateway.sock --listen \
                 4811=/run/agentry/proxy.sock -- {} -c true",
                forwarder.display(),
                sh.display()
            )),
            "{args}"
        );
        // Without a network, none of it.
        let plain = wrapped_args(
            bwrap,
            cmd.clone(),
            Layout {
                network: None,
                forwarder: None,
                ..layout
            },
        );
        assert!(
            !plain.contains("--unshare-net") && !plain.contains("/run/agentry"),
            "{plain}"
        );
        assert!(
            plain.ends_with(&format!("-- {} -c true", sh.display())),
            "{plain}"
        );

        // A forwarder in the data directory is refused, as an empty forwarder command.
        let inside = [root.join("agentry").display().to_string()];
        std::fs::copy(&forwarder, root.join("agentry")).unwrap();
        let refused = wrap(
            bwrap,
            cmd.clone(),
            Layout {
                forwarder: Some(&inside),
                ..layout
            },
        )
        .unwrap_err();
        assert!(
            refused.contains("the network forwarder") && refused.contains("data directory"),
            "{refused}"
        );
        let refused = wrap(
            bwrap,
            cmd,
            Layout {
                forwarder: Some(&[]),
                ..layout
            },
        )
        .unwrap_err();
        assert!(refused.contains("command is empty"), "{refused}");
    }

    /// An extra path in a directory the sandbox replaces (`/tmp`) is mounted after that
    /// directory's tmpfs; one holding such a directory (`/var`, holding `/var/tmp`) before
    /// it, so that the tmpfs still hides what it replaces; the replaced directories
    /// themselves and what lies in `/proc` or `/dev` are left out.
    #[test]
    fn extra_paths_in_replaced_directories_come_after_them() {
        let dir = tempfile::Builder::new()
            .prefix("agentry-extra-")
            .tempdir_in("/tmp")
            .unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let dirs = RunDirs::new(&base.join("run"));
        let tool = base.join("toolchain");
        std::fs::create_dir_all(&tool).unwrap();
        let extra = [
            tool.clone(),
            PathBuf::from("/var"),
            PathBuf::from("/tmp"),
            PathBuf::from("/proc/self"),
        ];
        let layout = Layout {
            extra_ro: &extra,
            ..dirs.layout()
        };
        let args = wrapped_args(Path::new("/usr/bin/bwrap"), dirs.sh_true(), layout);
        let at = |needle: &str| {
            args.find(needle)
                .unwrap_or_else(|| panic!("no {needle:?} in {args}"))
        };
        let tool_bind = format!("--ro-bind {0} {0} ", tool.display());
        assert!(at("--tmpfs /tmp ") < at(&tool_bind), "{args}");
        assert!(
            at("--ro-bind /var /var ") < at("--tmpfs /var/tmp "),
            "{args}"
        );
        assert!(!args.contains("--ro-bind /tmp /tmp"), "{args}");
        assert!(!args.contains("/proc/self"), "{args}");
        for refused in [
            "/tmp",
            "/var/tmp",
            "/run",
            "/proc",
            "/dev/shm",
            "/run/agentry/x",
        ] {
            assert!(extra_ro_refusal(Path::new(refused)).is_some(), "{refused}");
        }
        for accepted in [
            "/tmp/x",
            "/var/tmp/x",
            "/run/current-system/sw",
            "/var",
            "/opt",
        ] {
            assert_eq!(extra_ro_refusal(Path::new(accepted)), None, "{accepted}");
        }
    }

    /// The limits' variables: defaults, binary suffixes, 0 for no rlimit, and a bad or too
    /// small value named with its variable.
    #[test]
    fn limits_are_read_from_their_variables() {
        let read = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            AgentLimits::from_lookup(|name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            })
        };
        assert_eq!(read(&[]).unwrap(), AgentLimits::default());
        let limits = read(&[
            ("AGENTRY_AGENT_TMP_BYTES", "512M"),
            ("AGENTRY_AGENT_MAX_PROCESSES", "64"),
            ("AGENTRY_AGENT_MAX_OPEN_FILES", "1024"),
            ("AGENTRY_AGENT_MAX_FILE_BYTES", "2GiB"),
            ("AGENTRY_AGENT_MAX_MEMORY_BYTES", "0"),
            ("AGENTRY_AGENT_TOTAL_MEMORY_BYTES", "2G"),
        ])
        .unwrap();
        assert_eq!(
            limits,
            AgentLimits {
                tmp_bytes: 512 << 20,
                max_processes: 64,
                max_open_files: 1024,
                max_file_bytes: 2 << 30,
                max_memory_bytes: 0,
                total_memory_bytes: 2 << 30,
            }
        );
        assert_eq!(
            limits.rlimit_args().join(" "),
            "--rlimit NPROC=64 --rlimit NOFILE=1024 --rlimit FSIZE=2147483648"
        );
        for (name, bad, why) in [
            ("AGENTRY_AGENT_TMP_BYTES", "0", "too small"),
            ("AGENTRY_AGENT_TMP_BYTES", "1K", "too small"),
            ("AGENTRY_AGENT_TMP_BYTES", "lots", "expected a whole number"),
            ("AGENTRY_AGENT_MAX_PROCESSES", "4", "at least 16"),
            (
                "AGENTRY_AGENT_MAX_PROCESSES",
                "1K",
                "expected a whole number",
            ),
            (
                "AGENTRY_AGENT_MAX_OPEN_FILES",
                "-1",
                "expected a whole number",
            ),
            (
                "AGENTRY_AGENT_MAX_FILE_BYTES",
                "1.5G",
                "expected a whole number",
            ),
            ("AGENTRY_AGENT_MAX_MEMORY_BYTES", "99999999999T", "expected"),
        ] {
            let (var, message) = read(&[(name, bad)]).unwrap_err();
            assert_eq!(var, name, "{bad}");
            assert!(message.contains(why), "{name}={bad}: {message}");
        }
    }

    /// Without a network, the forwarder still starts the agent, with the rlimits and no
    /// listener; the sandbox's `/tmp` is sized and it gets a user namespace without nested
    /// ones when `bwrap` supports them.
    #[test]
    fn without_a_network_the_forwarder_only_sets_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let dirs = RunDirs::new(&base);
        let cmd = dirs.sh_true();
        let forwarder = ["/bin/true".to_owned(), "sandbox-net".to_owned()];
        let limits = AgentLimits {
            tmp_bytes: 1 << 20,
            max_memory_bytes: 0,
            ..AgentLimits::default()
        };
        let layout = Layout {
            forwarder: Some(&forwarder),
            limits,
            features: BwrapFeatures {
                tmpfs_size: true,
                disable_userns: true,
            },
            ..dirs.layout()
        };
        let bwrap = Path::new("/usr/bin/bwrap");
        let args = wrapped_args(bwrap, cmd.clone(), layout);
        let sh = resolve_program(Path::new("sh"), &cmd.env).unwrap();
        assert!(
            args.ends_with(&format!(
                "-- /bin/true sandbox-net --rlimit NPROC=512 --rlimit NOFILE=4096 --rlimit \
                 FSIZE=1073741824 -- {} -c true",
                sh.display()
            )),
            "{args}"
        );
        assert!(args.contains("--size 1048576 --tmpfs /tmp "), "{args}");
        assert!(args.contains("--unshare-user --disable-userns"), "{args}");
        assert!(!args.contains("--unshare-net"), "{args}");
        // Without the features, neither option.
        let plain = wrapped_args(
            bwrap,
            cmd.clone(),
            Layout {
                features: BwrapFeatures::default(),
                ..layout
            },
        );
        assert!(
            !plain.contains("--size") && !plain.contains("--unshare-user"),
            "{plain}"
        );
        // A network without a forwarder is refused.
        std::fs::create_dir_all(&dirs.net).unwrap();
        let refused = wrap(
            bwrap,
            cmd,
            Layout {
                network: Some(NetLayout { dir: &dirs.net }),
                forwarder: None,
                ..layout
            },
        )
        .unwrap_err();
        assert!(refused.contains("needs the network forwarder"), "{refused}");
    }

    /// The installed `bwrap` is probed with its features; on this machine (bubblewrap
    /// 0.8) both are there.
    #[tokio::test]
    async fn the_probe_records_what_bwrap_supports() {
        let Ok(bwrap) = find_bwrap() else {
            panic!("these tests need bubblewrap (bwrap) installed");
        };
        let features = probe(&bwrap, None).await.unwrap();
        let help = std::process::Command::new(&bwrap)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert_eq!(features.tmpfs_size, help.contains("--size"), "{features:?}");
        assert_eq!(
            features.disable_userns,
            help.contains("--disable-userns"),
            "{features:?}"
        );
    }

    #[test]
    fn programs_are_found_on_the_agent_path() {
        let env = vec![("PATH".to_owned(), "relative:/usr/bin:/bin".to_owned())];
        let sh = resolve_program(Path::new("sh"), &env).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert!(resolve_program(Path::new("no-such-agent-program"), &env).is_err());
        assert_eq!(
            resolve_program(Path::new("/opt/claude"), &env).unwrap(),
            PathBuf::from("/opt/claude")
        );
    }
}
