//! Running one agent process under control.
//!
//! [`run_process_with`] starts the agent CLI in its own process group with exactly the
//! environment it is given (see [`crate::agent::environment`]), writes the prompt to its
//! stdin, streams its stdout to a log file as it arrives and to an [`OutputSink`] (the
//! agent's [`OutputParser`]), keeps the end of its stdout and stderr in memory, and ends
//! the run on exit, on the wall-time limit, on cancellation or when the sink asks for it
//! (a Codex run whose priced usage reached its allowance). The log files are capped
//! ([`LOG_FILE_CAP`]): a full log is rotated to [`rotated_log_path`], so the disk holds at
//! most twice the cap per stream and always the end of the output.
//!
//! **Stopping** is a ladder, so that an agent can say what it spent: `SIGINT` first (what
//! Ctrl-C sends; Claude Code then prints its final `result` event with the cost so far),
//! `SIGTERM` after [`Limits::stop_grace`] if it is still running, `SIGKILL` after another
//! grace. The signals reach the agent's processes as [`StopTarget`] says: the process group
//! of an unsandboxed agent, the processes inside a sandbox (never `bwrap` itself, whose
//! death would kill the sandbox at once). Whatever way the run ends, the whole process
//! group is killed afterwards, so no grandchild the agent started outlives the run, and the
//! direct child is reaped.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::fs::File;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::user::UserIds;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::OutputParser;

/// The most stdout kept in memory, for the run's log: its end. It equals the most agent
/// output the service stores per run (`MAX_LOG_BYTES` of `agentry-persistence`, 8 MiB), so
/// nothing kept is thrown away later. The parser reads all of stdout as it arrives; the
/// log files keep more ([`LOG_FILE_CAP`]); [`ProcessOutcome::stdout_truncated`] says the
/// head was dropped.
pub const STDOUT_MEMORY_CAP: usize = 8 * 1024 * 1024;

/// The most bytes one log file holds. When a log reaches it, it is renamed to
/// [`rotated_log_path`] (replacing the previous one) and a new log is started, so each
/// stream takes at most twice this on disk and the end of the output is always there.
pub const LOG_FILE_CAP: u64 = 64 * 1024 * 1024;

/// How much of the end of stderr is kept in [`ProcessOutcome::stderr_tail`].
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;

/// How long output is still read after the process has ended and its group was killed.
/// A process that escaped the group may hold the pipes open; the run does not wait for it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The size of one read from the process's pipes.
const CHUNK_BYTES: usize = 64 * 1024;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    /// The program: an absolute path, or a name looked up on the `PATH` of
    /// [`AgentCommand::env`].
    pub program: PathBuf,
    /// The arguments, without the program name.
    pub args: Vec<String>,
    /// Written to the process's stdin, which is then closed.
    pub stdin: String,
    /// The working directory.
    pub cwd: PathBuf,
    /// The complete environment of the process: nothing else is inherited.
    pub env: Vec<(String, String)>,
    /// Which processes the stop signals go to.
    pub stop: StopTarget,
    /// Descriptors the process inherits, each at its own number (the sandbox's seccomp
    /// filter, which `bwrap --seccomp N` reads, and the paths `bwrap --bind-fd N` mounts);
    /// no other process does.
    pub pass_fds: Vec<PassedFd>,
    /// The user the process runs as, if not the service's (the service runs as root:
    /// [`crate::user::AgentUser::Switch`]); its supplementary groups are dropped.
    pub user: Option<UserIds>,
}

/// A descriptor given to one started process only ([`AgentCommand::pass_fds`]): open in
/// the service with close-on-exec, it is made inheritable in the child alone, between
/// `fork` and `exec`, so that no other process the service starts meanwhile gets it.
#[derive(Debug, Clone)]
pub struct PassedFd(pub Arc<OwnedFd>);

impl PassedFd {
    /// The descriptor's number, in the service and in the started process.
    pub fn number(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The mappings that give `passed` to a child at their own numbers: a duplicate of each
    /// (close-on-exec here) put at the original's number in the child only.
    ///
    /// # Errors
    ///
    /// A descriptor that cannot be duplicated.
    pub fn mappings(passed: &[PassedFd]) -> io::Result<Vec<FdMapping>> {
        passed
            .iter()
            .map(|p| {
                Ok(FdMapping {
                    parent_fd: p.0.try_clone()?,
                    child_fd: p.number(),
                })
            })
            .collect()
    }
}

impl PartialEq for PassedFd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PassedFd {}

/// Which processes `SIGINT` and `SIGTERM` go to when a run is stopped (`SIGKILL` always
/// goes to the whole process group of the started process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopTarget {
    /// The started process is the agent: its process group (the agent and the children it
    /// did not move to a group of their own), as a terminal's Ctrl-C does.
    Group,
    /// The started process is `bwrap` with a pid namespace: its only child is the
    /// namespace's init, in a session and process group of its own with the agent and the
    /// agent's children. The signals go to every process of that group but the init, whose
    /// death would kill the whole namespace before the agent could report anything.
    Sandbox,
}

/// The limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest the process may run before it is stopped ([`Ended::TimedOut`]).
    pub wall_time: Duration,
    /// How long a process that is asked to stop gets at each step of the ladder: after
    /// `SIGINT` before `SIGTERM`, and after `SIGTERM` before `SIGKILL`.
    pub stop_grace: Duration,
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The process exited on its own: with an exit code, or killed by a signal (not ours).
    Exited {
        /// The exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
    /// The wall-time limit passed and the process was stopped.
    TimedOut,
    /// The run was cancelled and the process was stopped.
    Cancelled,
    /// The output sink asked to stop the run ([`OutputSink::stop_requested`]: the agent's
    /// priced usage reached its allowance) and the process was stopped.
    Stopped,
}

/// The result of [`run_process`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOutcome {
    /// How the process ended.
    pub ended: Ended,
    /// The process's stdout as lossy UTF-8: all of it, or (at most) the last
    /// [`STDOUT_MEMORY_CAP`] bytes if [`ProcessOutcome::stdout_truncated`], starting on a
    /// character.
    pub stdout: String,
    /// Whether stdout was longer than [`STDOUT_MEMORY_CAP`] and cut in memory (the log
    /// files still have up to twice [`LOG_FILE_CAP`] of its end).
    pub stdout_truncated: bool,
    /// The number of bytes the process wrote to stdout.
    pub stdout_bytes: u64,
    /// The last [`STDERR_TAIL_BYTES`] (at most) of stderr, as lossy UTF-8.
    pub stderr_tail: String,
    /// The process id (also its process group id).
    pub pid: u32,
    /// The first error met while writing the log files during the run, if any. Writing
    /// stops at the first error but the run goes on (the output is still kept in memory).
    pub log_error: Option<String>,
}

/// Why a process could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started (not found, not executable, bad working
    /// directory…).
    #[error("cannot start agent program {program:?} in {cwd}: {source}")]
    Spawn {
        /// The program as given.
        program: String,
        /// The working directory it was to run in.
        cwd: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// A log file (or its directory) could not be created.
    #[error("cannot create log file {path}: {source}")]
    Log {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Waiting for the process failed (its process group has been killed).
    #[error("waiting for agent process {pid} failed: {source}")]
    Wait {
        /// The process id.
        pid: u32,
        /// The operating system's error.
        source: io::Error,
    },
}

/// What a short-lived helper process (a `--version`, a trial run) ended with: how it
/// exited and what it printed on its piped stdout and stderr (`""` for one not piped).
#[derive(Debug)]
pub struct HelperOutput {
    /// Its exit status, or why waiting for it failed.
    pub status: io::Result<std::process::ExitStatus>,
    /// What it printed on stdout (up to the first invalid UTF-8, if any).
    pub stdout: String,
    /// What it printed on stderr (up to the first invalid UTF-8, if any).
    pub stderr: String,
}

/// Why [`helper_output`] has no output for a helper process.
#[derive(Debug)]
pub enum HelperFailure {
    /// It could not be started.
    Start(io::Error),
    /// It did not finish within the limit (it was killed).
    TimedOut(Duration),
}

impl std::fmt::Display for HelperFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelperFailure::Start(e) => write!(f, "cannot start it: {e}"),
            HelperFailure::TimedOut(limit) => {
                write!(f, "it did not finish within {} s", limit.as_secs())
            }
        }
    }
}

/// Starts `command` (killed if it outlives `limit`) and waits up to `limit` for it to exit,
/// reading its piped stdout and stderr to their end meanwhile.
///
/// # Errors
///
/// It could not be started, or did not finish in time.
pub async fn helper_output(
    command: &mut tokio::process::Command,
    limit: Duration,
) -> Result<HelperOutput, HelperFailure> {
    let mut child = command
        .kill_on_drop(true)
        .spawn()
        .map_err(HelperFailure::Start)?;
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    tokio::time::timeout(limit, async {
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_string(&mut out).await;
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err).await;
        }
        HelperOutput {
            status: child.wait().await,
            stdout: out,
            stderr: err,
        }
    })
    .await
    .map_err(|_| HelperFailure::TimedOut(limit))
}

/// The path stderr is appended to: `log_path` with `.stderr` added to its name.
pub fn stderr_log_path(log_path: &Path) -> PathBuf {
    let mut name = log_path.as_os_str().to_owned();
    name.push(".stderr");
    PathBuf::from(name)
}

/// Where a full log file is moved when it is rotated: `log_path` with `.1` added to its
/// name. It holds the [`LOG_FILE_CAP`] bytes written before those in `log_path`.
pub fn rotated_log_path(log_path: &Path) -> PathBuf {
    let mut name = log_path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// What reads the agent's stdout as it arrives, chunk by chunk (cut anywhere).
pub trait OutputSink: Send + 'static {
    /// Takes the next chunk of stdout.
    fn feed(&mut self, chunk: &[u8]);

    /// Whether what was fed so far means the process must be stopped (asked after every
    /// chunk and every poll; once it says so, the run ends as [`Ended::Stopped`]). Never, by
    /// default.
    fn stop_requested(&self) -> bool {
        false
    }

    /// Called every [`POLL_INTERVAL`] while the process runs, to read what the agent
    /// records elsewhere than on stdout. Nothing, by default.
    fn poll(&mut self) {}
}

/// How often [`OutputSink::poll`] is called while the agent runs.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Reads nothing.
impl OutputSink for () {
    fn feed(&mut self, _chunk: &[u8]) {}
}

/// Stops the run once the agent's priced usage reaches its allowance
/// ([`OutputParser::allowance_reached`]).
impl OutputSink for OutputParser {
    fn feed(&mut self, chunk: &[u8]) {
        OutputParser::feed(self, chunk);
    }

    fn stop_requested(&self) -> bool {
        self.allowance_reached()
    }

    fn poll(&mut self) {
        OutputParser::poll(self);
    }
}

/// [`run_process_with`] without a sink: stdout is only logged and its end kept.
///
/// # Errors
///
/// As [`run_process_with`].
pub async fn run_process(
    cmd: AgentCommand,
    log_path: &Path,
    limits: Limits,
    cancel: watch::Receiver<bool>,
    on_start: impl FnOnce(u32) + Send,
) -> Result<ProcessOutcome, ProcessError> {
    let (outcome, ()) = run_process_with(cmd, log_path, limits, cancel, (), on_start).await?;
    Ok(outcome)
}

/// Runs `cmd` to its end under `limits`, feeding its stdout to `sink` as it arrives;
/// returns how it ended and the sink.
///
/// - The process runs in its own process group, with `env_clear()` then [`AgentCommand::env`],
///   in [`AgentCommand::cwd`]; [`AgentCommand::stdin`] is written to its stdin, which is then
///   closed.
/// - Every stdout chunk is given to `sink`, and written and flushed to `log_path` (created
///   or truncated, its directory created, a rotated log of an earlier run removed) as it
///   arrives; at [`LOG_FILE_CAP`] bytes the log is rotated to [`rotated_log_path`]. Its
///   last [`STDOUT_MEMORY_CAP`] bytes are kept in memory.
///   Stderr goes to [`stderr_log_path`]`(log_path)`, rotated the same way, and its tail is
///   kept.
/// - [`AgentCommand::pass_fds`] are inherited by the process alone.
/// - It runs as [`AgentCommand::user`] when one is given.
/// - `on_start(pid)` is called once the process is spawned.
/// - The run ends when the process exits ([`Ended::Exited`]), when `limits.wall_time` has
///   passed ([`Ended::TimedOut`]), when `cancel` becomes `true` ([`Ended::Cancelled`]; a
///   dropped sender never cancels) or when `sink` asks for it after a chunk
///   ([`OutputSink::stop_requested`], [`Ended::Stopped`]). The sink still reads whatever
///   the process writes until it is gone. To stop it, the processes of
///   [`AgentCommand::stop`] get `SIGINT`, then `SIGTERM` after `limits.stop_grace` if the
///   process has not exited, then the group gets `SIGKILL` after another `stop_grace`
///   (see the module docs). In every case the whole group
///   gets `SIGKILL` once the process has exited, so no grandchild lingers, and the process
///   is reaped.
/// - Output is read concurrently with waiting; after the end, remaining output is read for
///   at most [`DRAIN_TIMEOUT`] (a process outside the group may keep the pipes open).
/// - If the returned future is dropped before the end, the process group is killed.
///
/// # Errors
///
/// [`ProcessError::Log`] if a log file cannot be created (nothing is started then),
/// [`ProcessError::Spawn`] if the program cannot be started, [`ProcessError::Wait`] if
/// waiting for it (or for the reader of its stdout) fails.
pub async fn run_process_with<S: OutputSink>(
    cmd: AgentCommand,
    log_path: &Path,
    limits: Limits,
    mut cancel: watch::Receiver<bool>,
    sink: S,
    on_start: impl FnOnce(u32) + Send,
) -> Result<(ProcessOutcome, S), ProcessError> {
    let (stdout_log, stderr_log) = open_logs(log_path).await?;
    let AgentCommand {
        program,
        args,
        stdin,
        cwd,
        env,
        stop: stop_target,
        pass_fds,
        user,
    } = cmd;
    let spawn_error = |source: io::Error| ProcessError::Spawn {
        program: program.display().to_string(),
        cwd: cwd.display().to_string(),
        source,
    };
    let mut command = Command::new(&program);
    command
        .args(&args)
        .current_dir(&cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let Spawned {
        mut child,
        pid,
        group,
        stdout_pipe,
    } = spawn(command, &pass_fds, user.as_ref(), &spawn_error)?;
    tracing::debug!(pid, program = %program.display(), "agent process started");
    let streams = start_streams(
        &mut child,
        pid,
        stdin,
        stdout_pipe,
        stdout_log,
        stderr_log,
        sink,
    );
    on_start(pid);
    let Streams {
        stdin_task,
        stdout,
        stderr,
        mut stop_requested,
    } = streams;

    let stop = wait_for_end(
        &mut child,
        limits.wall_time,
        &mut cancel,
        &mut stop_requested,
    )
    .await;
    let ended = apply_stop_ladder(
        stop,
        &mut child,
        &group,
        stop_target,
        limits.stop_grace,
        pid,
    )
    .await?;
    // The leader is gone: kill whatever else is left in its group.
    group.finish();
    let collected = collect_outcome(ended, pid, stdin_task, stdout, stderr).await;
    // Kept until the end: a passed descriptor's original is closed with the command.
    drop(pass_fds);
    collected
}

/// Creates the directory of `log_path` and the run's two logs: stdout's at `log_path`,
/// stderr's at [`stderr_log_path`] (first step of [`run_process_with`]).
async fn open_logs(log_path: &Path) -> Result<(LogFile, LogFile), ProcessError> {
    let stderr_path = stderr_log_path(log_path);
    if let Some(parent) = log_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|source| ProcessError::Log {
                path: parent.to_owned(),
                source,
            })?;
    }
    let stdout_log = LogFile::create(log_path).await?;
    let stderr_log = LogFile::create(&stderr_path).await?;
    Ok((stdout_log, stderr_log))
}

/// A spawned agent process: the child, its id, its process group and its stdout.
struct Spawned {
    child: tokio::process::Child,
    pid: u32,
    group: ProcessGroup,
    stdout_pipe: tokio::process::ChildStdout,
}

/// Spawns `command` with `pass_fds` inherited by it alone and as `user` when one is given
/// (second step of [`run_process_with`]); `spawn_error` words a failure.
fn spawn(
    mut command: Command,
    pass_fds: &[PassedFd],
    user: Option<&UserIds>,
    spawn_error: &dyn Fn(io::Error) -> ProcessError,
) -> Result<Spawned, ProcessError> {
    if !pass_fds.is_empty() {
        // Duplicates (close-on-exec) put at the originals' numbers in the child only, where
        // they are inheritable: the originals are open here, so nothing else of the child
        // has those numbers.
        command
            .fd_mappings(PassedFd::mappings(pass_fds).map_err(spawn_error)?)
            .map_err(|e| spawn_error(io::Error::other(e)))?;
    }
    if let Some(user) = user {
        // As root, std drops the supplementary groups when it switches the user id.
        command.uid(user.uid).gid(user.gid);
    }
    let mut child = command.spawn().map_err(spawn_error)?;
    // The child has its copy of a passed descriptor: the duplicate is closed here with
    // the command (the original when the caller's `pass_fds` go).
    drop(command);
    let Some(pid) = child.id() else {
        return Err(spawn_error(io::Error::other(
            "the process has no id right after spawning",
        )));
    };
    let group = match i32::try_from(pid) {
        Ok(raw) if raw > 0 => ProcessGroup::new(Pid::from_raw(raw)),
        _ => {
            return Err(spawn_error(io::Error::other(format!(
                "unusable process id {pid}"
            ))));
        }
    };
    let Some(stdout_pipe) = child.stdout.take() else {
        return Err(spawn_error(io::Error::other(
            "the process has no stdout pipe",
        )));
    };
    Ok(Spawned {
        child,
        pid,
        group,
        stdout_pipe,
    })
}

/// The tasks feeding and reading a running process, and the sink's request to stop it.
struct Streams<S> {
    stdin_task: Option<JoinHandle<()>>,
    stdout: Reader<S>,
    stderr: Option<Reader<()>>,
    stop_requested: oneshot::Receiver<()>,
}

/// Starts writing `prompt` to the child's stdin and reading its stdout (into `stdout_log`
/// and `sink`) and stderr (into `stderr_log`) (third step of [`run_process_with`]).
fn start_streams<S: OutputSink>(
    child: &mut tokio::process::Child,
    pid: u32,
    prompt: String,
    stdout_pipe: tokio::process::ChildStdout,
    stdout_log: LogFile,
    stderr_log: LogFile,
    sink: S,
) -> Streams<S> {
    let stdin_task = child.stdin.take().map(|mut stdin| {
        tokio::spawn(async move {
            if let Err(e) = stdin.write_all(prompt.as_bytes()).await {
                // The process may exit without reading its input.
                tracing::debug!(pid, "writing the prompt to stdin: {e}");
            }
            drop(stdin);
        })
    });
    let (stop_request, stop_requested) = oneshot::channel();
    let stdout = Reader::spawn(
        stdout_pipe,
        stdout_log,
        STDOUT_MEMORY_CAP,
        sink,
        Some(stop_request),
    );
    let stderr = child
        .stderr
        .take()
        .map(|err| Reader::spawn(err, stderr_log, STDERR_TAIL_BYTES, (), None));
    Streams {
        stdin_task,
        stdout,
        stderr,
        stop_requested,
    }
}

/// Waits for whatever ends the run first: the process's exit, the `wall_time`, `cancel`
/// or the sink's request (fourth step of [`run_process_with`]).
async fn wait_for_end(
    child: &mut tokio::process::Child,
    wall_time: Duration,
    cancel: &mut watch::Receiver<bool>,
    stop_requested: &mut oneshot::Receiver<()>,
) -> Stop {
    let deadline = Instant::now() + wall_time;
    tokio::select! {
        status = child.wait() => Stop::Exited(status),
        () = tokio::time::sleep_until(deadline) => Stop::TimedOut,
        () = cancelled(cancel) => Stop::Cancelled,
        () = requested(stop_requested) => Stop::Requested,
    }
}

/// How the run ended after `stop`: an exit as it is, otherwise the stop ladder applied to
/// the agent (`SIGINT`, then `SIGTERM` after `stop_grace`, then `SIGKILL` to the group after
/// another `stop_grace`) and the process reaped (fifth step of [`run_process_with`]).
async fn apply_stop_ladder(
    stop: Stop,
    child: &mut tokio::process::Child,
    group: &ProcessGroup,
    target: StopTarget,
    stop_grace: Duration,
    pid: u32,
) -> Result<Ended, ProcessError> {
    let ended = match stop {
        Stop::Exited(status) => {
            let status = status.map_err(|source| ProcessError::Wait { pid, source })?;
            return Ok(Ended::Exited {
                code: status.code(),
                signal: status.signal(),
            });
        }
        Stop::TimedOut => Ended::TimedOut,
        Stop::Requested => Ended::Stopped,
        Stop::Cancelled => Ended::Cancelled,
    };
    tracing::debug!(pid, ?ended, "stopping the agent");
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        if !group.signal_agent(target, signal) {
            // Nothing to ask (a sandbox stopped before its agent started).
            break;
        }
        if let Ok(status) = tokio::time::timeout(stop_grace, child.wait()).await {
            status.map_err(|source| ProcessError::Wait { pid, source })?;
            return Ok(ended);
        }
        tracing::debug!(pid, "the agent survived {signal}");
    }
    group.signal(Signal::SIGKILL);
    child
        .wait()
        .await
        .map_err(|source| ProcessError::Wait { pid, source })?;
    Ok(ended)
}

/// Reads what is left of the process's output for at most [`DRAIN_TIMEOUT`] and makes the
/// run's [`ProcessOutcome`] of it, with the sink (last step of [`run_process_with`]).
async fn collect_outcome<S: OutputSink>(
    ended: Ended,
    pid: u32,
    stdin_task: Option<JoinHandle<()>>,
    stdout: Reader<S>,
    stderr: Option<Reader<()>>,
) -> Result<(ProcessOutcome, S), ProcessError> {
    let drain_deadline = Instant::now() + DRAIN_TIMEOUT;
    let stdout = stdout.finish(drain_deadline).await;
    let stderr = match stderr {
        Some(reader) => reader
            .finish(drain_deadline)
            .await
            .unwrap_or_else(|message| Capture {
                error: Some(message),
                ..Capture::new(())
            }),
        None => Capture::new(()),
    };
    if let Some(task) = stdin_task {
        task.abort();
    }
    // The stdout reader can only fail by panicking (a bug); its sink is lost then.
    let stdout = stdout.map_err(|message| ProcessError::Wait {
        pid,
        source: io::Error::other(message),
    })?;

    let stdout_truncated = stdout.total > stdout.kept.len() as u64;
    let stderr_cut = stderr.total > stderr.kept.len() as u64;
    let log_error = stdout.error.or(stderr.error);
    if let Some(error) = &log_error {
        tracing::warn!(pid, "agent log: {error}");
    }
    let outcome = ProcessOutcome {
        ended,
        stdout: lossy(if stdout_truncated {
            skip_partial_char(stdout.kept)
        } else {
            stdout.kept
        }),
        stdout_truncated,
        stdout_bytes: stdout.total,
        stderr_tail: lossy(if stderr_cut {
            skip_partial_char(stderr.kept)
        } else {
            stderr.kept
        }),
        pid,
        log_error,
    };
    Ok((outcome, stdout.sink))
}

/// Why the wait ended.
enum Stop {
    /// The process exited (or waiting failed).
    Exited(io::Result<std::process::ExitStatus>),
    /// The wall time passed.
    TimedOut,
    /// The run was cancelled.
    Cancelled,
    /// The output sink asked to stop the run.
    Requested,
}

/// Resolves once `cancel` is `true`; never if its sender is dropped first.
pub(crate) async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once the stdout reader asks to stop the run; never if it ends without asking.
async fn requested(request: &mut oneshot::Receiver<()>) {
    if request.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A log file capped at [`LOG_FILE_CAP`] bytes, rotated to [`rotated_log_path`] when full.
pub(crate) struct LogFile {
    path: PathBuf,
    file: File,
    /// Bytes in the current file.
    written: u64,
    cap: u64,
}

impl LogFile {
    /// Creates (or truncates) the log at `path` and removes the rotated log a previous run
    /// may have left.
    pub(crate) async fn create(path: &Path) -> Result<LogFile, ProcessError> {
        let log_error = |path: &Path, source| ProcessError::Log {
            path: path.to_owned(),
            source,
        };
        let rotated = rotated_log_path(path);
        match tokio::fs::remove_file(&rotated).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(log_error(&rotated, e)),
        }
        let file = private_log(path).await.map_err(|e| log_error(path, e))?;
        Ok(LogFile {
            path: path.to_owned(),
            file,
            written: 0,
            cap: LOG_FILE_CAP.max(1),
        })
    }

    /// Writes `chunk`, rotating the file whenever it is full, and flushes it, so a live
    /// reader sees it and a crash leaves it on disk.
    pub(crate) async fn append(&mut self, mut chunk: &[u8]) -> io::Result<()> {
        while !chunk.is_empty() {
            if self.written >= self.cap {
                self.rotate().await?;
            }
            let room = usize::try_from(self.cap - self.written).unwrap_or(usize::MAX);
            let (now, rest) = chunk.split_at(room.min(chunk.len()));
            self.file.write_all(now).await?;
            self.written += now.len() as u64;
            chunk = rest;
        }
        self.file.flush().await
    }

    /// Moves the full file to [`rotated_log_path`] and starts an empty one.
    async fn rotate(&mut self) -> io::Result<()> {
        self.file.flush().await?;
        tokio::fs::rename(&self.path, rotated_log_path(&self.path)).await?;
        self.file = private_log(&self.path).await?;
        self.written = 0;
        Ok(())
    }
}

/// A log file at `path`, created empty and readable by the service's user alone (mode
/// 0600: an agent's output may quote what it read).
async fn private_log(path: &Path) -> io::Result<File> {
    let path = path.to_owned();
    let file = tokio::task::spawn_blocking(move || crate::user::private_file(&path))
        .await
        .map_err(io::Error::other)??;
    Ok(File::from_std(file))
}

/// The process group of the agent. Dropped before [`ProcessGroup::finish`] (the run's
/// future was dropped or failed), it kills the group.
struct ProcessGroup {
    pgid: Pid,
    finished: bool,
}

impl ProcessGroup {
    /// The group led by `pgid`.
    fn new(pgid: Pid) -> Self {
        ProcessGroup {
            pgid,
            finished: false,
        }
    }

    /// Sends `signal` to the group; a group that no longer exists is fine.
    fn signal(&self, signal: Signal) {
        match killpg(self.pgid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pgid = %self.pgid, "killpg {signal}: {e}"),
        }
    }

    /// Sends `signal` to the agent's processes as `target` says (see [`StopTarget`]);
    /// `false` when there was none to send it to (a sandbox whose agent has not started, or
    /// has already ended: only `bwrap` itself, which the final `SIGKILL` ends).
    fn signal_agent(&self, target: StopTarget, signal: Signal) -> bool {
        match target {
            StopTarget::Group => {
                self.signal(signal);
                true
            }
            StopTarget::Sandbox => {
                let table = processes();
                let Some(init) = table
                    .iter()
                    .find(|p| p.ppid == self.pgid.as_raw())
                    .map(|p| p.pid)
                else {
                    return false;
                };
                let mut sent = false;
                for p in table.iter().filter(|p| p.pgrp == init && p.pid != init) {
                    match nix::sys::signal::kill(Pid::from_raw(p.pid), signal) {
                        Ok(()) => sent = true,
                        Err(Errno::ESRCH) => {}
                        Err(e) => tracing::warn!(pid = p.pid, "kill {signal}: {e}"),
                    }
                }
                sent
            }
        }
    }

    /// Kills what is left of the group once its leader has been reaped. The group id
    /// cannot be reused while any member lives, so this reaches only the agent's
    /// processes (short of the id being recycled in the instant after the group emptied).
    fn finish(mut self) {
        self.signal(Signal::SIGKILL);
        self.finished = true;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.finished {
            self.signal(Signal::SIGKILL);
        }
    }
}

/// One process of the machine, as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: i32,
    ppid: i32,
    pgrp: i32,
}

/// Every process `/proc` shows (Linux; elsewhere none).
fn processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(&stat)
        })
        .collect()
}

/// The pid, parent and process group of a `/proc/<pid>/stat` line. The command name (in
/// parentheses, second) may hold spaces and parentheses: the fields after it are read from
/// its last `)`.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let (head, rest) = stat.rsplit_once(')')?;
    let pid = head.split_once(' ')?.0.trim().parse().ok()?;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(ProcStat { pid, ppid, pgrp })
}

/// What a reader collected from one stream.
#[derive(Debug)]
struct Capture<S> {
    /// The last bytes read (at most the reader's limit).
    kept: Vec<u8>,
    /// All bytes read.
    total: u64,
    /// The first log-file or read error.
    error: Option<String>,
    /// What every byte read was fed to.
    sink: S,
}

impl<S> Capture<S> {
    fn new(sink: S) -> Self {
        Capture {
            kept: Vec::new(),
            total: 0,
            error: None,
            sink,
        }
    }
}

/// A task reading one stream of the process.
struct Reader<S> {
    task: JoinHandle<Capture<S>>,
    stop: oneshot::Sender<()>,
}

impl<S: OutputSink> Reader<S> {
    /// Starts reading `stream` into `log` and `sink`, keeping its last `keep` bytes in
    /// memory; `stop_request` is fired once the sink asks to stop the run.
    fn spawn<R>(
        stream: R,
        log: LogFile,
        keep: usize,
        sink: S,
        stop_request: Option<oneshot::Sender<()>>,
    ) -> Reader<S>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(capture(stream, log, keep, sink, stop_request, stop_rx));
        Reader { task, stop }
    }

    /// Waits for the stream's end until `deadline`, then stops reading. Fails only if the
    /// reading task failed (panicked), with a sentence saying so.
    async fn finish(self, deadline: Instant) -> Result<Capture<S>, String> {
        let Reader { mut task, stop } = self;
        let joined = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                tracing::debug!("agent output still open after the process ended; not waiting");
                let _ = stop.send(());
                task.await
            }
        };
        joined.map_err(|e| format!("output reader failed: {e}"))
    }
}

/// Reads `stream` to its end (or until `stop`), giving every chunk to `sink`, appending it
/// to `log` and keeping its last `keep` bytes in memory. The first time the sink asks to
/// stop the run after a chunk, `stop_request` is fired; reading goes on.
async fn capture<R, S>(
    mut stream: R,
    log: LogFile,
    keep: usize,
    sink: S,
    mut stop_request: Option<oneshot::Sender<()>>,
    mut stop: oneshot::Receiver<()>,
) -> Capture<S>
where
    R: AsyncRead + Unpin,
    S: OutputSink,
{
    let mut log = Some(log);
    let mut out = Capture::new(sink);
    let mut buf = vec![0_u8; CHUNK_BYTES];
    let mut polls = tokio::time::interval(POLL_INTERVAL);
    polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let read = tokio::select! {
            biased;
            _ = &mut stop => break,
            read = stream.read(&mut buf) => Some(read),
            _ = polls.tick(), if stop_request.is_some() => None,
        };
        let n = match read {
            None => {
                out.sink.poll();
                if out.sink.stop_requested() {
                    tracing::debug!("what the agent recorded asks to stop it");
                    if let Some(request) = stop_request.take() {
                        let _ = request.send(());
                    }
                }
                continue;
            }
            Some(Ok(0)) => break,
            Some(Ok(n)) => n,
            Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Some(Err(e)) => {
                out.error
                    .get_or_insert_with(|| format!("reading agent output: {e}"));
                break;
            }
        };
        let chunk = &buf[..n];
        out.total = out.total.saturating_add(n as u64);
        out.sink.feed(chunk);
        if stop_request.is_some() && out.sink.stop_requested() {
            tracing::debug!("the agent's output asks to stop it");
            if let Some(request) = stop_request.take() {
                let _ = request.send(());
            }
        }
        if let Some(file) = log.as_mut()
            && let Err(e) = file.append(chunk).await
        {
            out.error
                .get_or_insert_with(|| format!("writing {}: {e}", file.path.display()));
            log = None;
        }
        out.kept.extend_from_slice(chunk);
        // Dropping the head a quarter of the limit at a time keeps the copying linear.
        if out.kept.len() > keep.saturating_add(keep / 4) {
            let excess = out.kept.len() - keep;
            out.kept.drain(..excess);
        }
    }
    if out.kept.len() > keep {
        let excess = out.kept.len() - keep;
        out.kept.drain(..excess);
    }
    out
}

/// Bytes as a string, invalid UTF-8 replaced (without copying valid text).
pub(crate) fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Drops the UTF-8 continuation bytes a cut may have left at the start of `bytes`.
pub(crate) fn skip_partial_char(mut bytes: Vec<u8>) -> Vec<u8> {
    let partial = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    bytes.drain(..partial);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_past_odd_command_names() {
        assert_eq!(
            parse_stat("4497 (sh) S 4496 4496 4496 0 -1 4194560 100 0"),
            Some(ProcStat {
                pid: 4497,
                ppid: 4496,
                pgrp: 4496
            })
        );
        assert_eq!(
            parse_stat("12 (a) b (c) R 1 12 12 0"),
            Some(ProcStat {
                pid: 12,
                ppid: 1,
                pgrp: 12
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S notanumber 1 1"), None);
        let me = processes()
            .into_iter()
            .find(|p| p.pid == i32::try_from(std::process::id()).unwrap());
        assert!(me.is_some(), "this process is listed");
    }
}
