//! Running one agent process under control.
//!
//! [`run_process`] starts the agent CLI in its own process group with exactly the
//! environment it is given (see [`agent_env`] for the minimal one), writes the prompt to its
//! stdin, streams its stdout to a log file as it arrives (and keeps it in memory for the
//! parsers), keeps the tail of its stderr, and ends the run on exit, on the wall-time limit
//! or on cancellation. Whatever way it ends, the whole process group is killed afterwards,
//! so no grandchild the agent started outlives the run, and the direct child is reaped.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::fs::File;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The most stdout kept in memory: its end, since the agents report cost and totals last.
/// Earlier output is still in the log file and counted, and
/// [`ProcessOutcome::stdout_truncated`] is set.
pub const STDOUT_MEMORY_CAP: usize = 64 * 1024 * 1024;

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
}

/// The limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest the process may run before it is stopped ([`Ended::TimedOut`]).
    pub wall_time: Duration,
    /// How long a process that is asked to stop (`SIGTERM`) gets before it is killed
    /// (`SIGKILL`).
    pub kill_grace: Duration,
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
    /// file still has all of it).
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

/// The path stderr is appended to: `log_path` with `.stderr` added to its name.
pub fn stderr_log_path(log_path: &Path) -> PathBuf {
    let mut name = log_path.as_os_str().to_owned();
    name.push(".stderr");
    PathBuf::from(name)
}

/// Runs `cmd` to its end under `limits`.
///
/// - The process runs in its own process group, with `env_clear()` then [`AgentCommand::env`],
///   in [`AgentCommand::cwd`]; [`AgentCommand::stdin`] is written to its stdin, which is then
///   closed.
/// - Every stdout chunk is written and flushed to `log_path` (created or truncated, its
///   directory created) as it arrives; its last [`STDOUT_MEMORY_CAP`] bytes are kept in
///   memory.
///   Stderr goes to [`stderr_log_path`]`(log_path)` and its tail is kept.
/// - `on_start(pid)` is called once the process is spawned.
/// - The run ends when the process exits ([`Ended::Exited`]), when `limits.wall_time` has
///   passed ([`Ended::TimedOut`]) or when `cancel` becomes `true` ([`Ended::Cancelled`]; a
///   dropped sender never cancels). To stop it, the group gets `SIGTERM`, then `SIGKILL`
///   after `limits.kill_grace` if the process has not exited. In every case the whole group
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
/// waiting for it fails.
pub async fn run_process(
    cmd: AgentCommand,
    log_path: &Path,
    limits: Limits,
    mut cancel: watch::Receiver<bool>,
    on_start: impl FnOnce(u32) + Send,
) -> Result<ProcessOutcome, ProcessError> {
    let stderr_path = stderr_log_path(log_path);
    if let Some(parent) = log_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|source| ProcessError::Log {
                path: parent.to_owned(),
                source,
            })?;
    }
    let stdout_log = create_log(log_path).await?;
    let stderr_log = create_log(&stderr_path).await?;

    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .current_dir(&cmd.cwd)
        .env_clear()
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let spawn_error = |source: io::Error| ProcessError::Spawn {
        program: cmd.program.display().to_string(),
        cwd: cmd.cwd.display().to_string(),
        source,
    };
    let mut child = command.spawn().map_err(spawn_error)?;
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
    tracing::debug!(pid, program = %cmd.program.display(), "agent process started");

    let stdin_task = child.stdin.take().map(|mut stdin| {
        let prompt = cmd.stdin;
        tokio::spawn(async move {
            if let Err(e) = stdin.write_all(prompt.as_bytes()).await {
                // The process may exit without reading its input.
                tracing::debug!(pid, "writing the prompt to stdin: {e}");
            }
            drop(stdin);
        })
    });
    let stdout = child
        .stdout
        .take()
        .map(|out| Reader::spawn(out, stdout_log, log_path, STDOUT_MEMORY_CAP));
    let stderr = child
        .stderr
        .take()
        .map(|err| Reader::spawn(err, stderr_log, &stderr_path, STDERR_TAIL_BYTES));

    on_start(pid);

    let deadline = Instant::now() + limits.wall_time;
    let stop = tokio::select! {
        status = child.wait() => Stop::Exited(status),
        () = tokio::time::sleep_until(deadline) => Stop::TimedOut,
        () = cancelled(&mut cancel) => Stop::Cancelled,
    };

    let ended = match stop {
        Stop::Exited(status) => {
            let status = status.map_err(|source| ProcessError::Wait { pid, source })?;
            Ended::Exited {
                code: status.code(),
                signal: status.signal(),
            }
        }
        Stop::TimedOut | Stop::Cancelled => {
            let ended = if matches!(stop, Stop::TimedOut) {
                Ended::TimedOut
            } else {
                Ended::Cancelled
            };
            tracing::debug!(pid, ?ended, "stopping agent process group");
            group.signal(Signal::SIGTERM);
            match tokio::time::timeout(limits.kill_grace, child.wait()).await {
                Ok(status) => {
                    status.map_err(|source| ProcessError::Wait { pid, source })?;
                }
                Err(_) => {
                    tracing::debug!(pid, "agent process survived SIGTERM; killing it");
                    group.signal(Signal::SIGKILL);
                    child
                        .wait()
                        .await
                        .map_err(|source| ProcessError::Wait { pid, source })?;
                }
            }
            ended
        }
    };
    // The leader is gone: kill whatever else is left in its group.
    group.finish();

    let drain_deadline = Instant::now() + DRAIN_TIMEOUT;
    let stdout = match stdout {
        Some(reader) => reader.finish(drain_deadline).await,
        None => Capture::default(),
    };
    let stderr = match stderr {
        Some(reader) => reader.finish(drain_deadline).await,
        None => Capture::default(),
    };
    if let Some(task) = stdin_task {
        task.abort();
    }

    let stdout_truncated = stdout.total > stdout.kept.len() as u64;
    let stderr_cut = stderr.total > stderr.kept.len() as u64;
    let log_error = stdout.error.or(stderr.error);
    if let Some(error) = &log_error {
        tracing::warn!(pid, "agent log: {error}");
    }
    Ok(ProcessOutcome {
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
    })
}

/// The minimal agent environment: `PATH` (from `lookup("PATH")`, by default
/// `/usr/local/bin:/usr/bin:/bin`), `HOME` = `home`, and each of `api_key_vars` that
/// `lookup` gives a non-empty value for. Nothing else.
pub fn agent_env(
    home: &Path,
    api_key_vars: &[&str],
    lookup: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let path = lookup("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
    let mut env = vec![
        ("PATH".to_owned(), path),
        ("HOME".to_owned(), home.to_string_lossy().into_owned()),
    ];
    for var in api_key_vars {
        if env.iter().any(|(name, _)| name == var) {
            continue;
        }
        if let Some(value) = lookup(var).filter(|v| !v.is_empty()) {
            env.push(((*var).to_owned(), value));
        }
    }
    env
}

/// Why the wait ended.
enum Stop {
    /// The process exited (or waiting failed).
    Exited(io::Result<std::process::ExitStatus>),
    /// The wall time passed.
    TimedOut,
    /// The run was cancelled.
    Cancelled,
}

/// Resolves once `cancel` is `true`; never if its sender is dropped first.
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Creates (or truncates) a log file.
async fn create_log(path: &Path) -> Result<File, ProcessError> {
    File::create(path)
        .await
        .map_err(|source| ProcessError::Log {
            path: path.to_owned(),
            source,
        })
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

/// What a reader collected from one stream.
#[derive(Debug, Default)]
struct Capture {
    /// The last bytes read (at most the reader's limit).
    kept: Vec<u8>,
    /// All bytes read.
    total: u64,
    /// The first log-file or read error.
    error: Option<String>,
}

/// A task reading one stream of the process.
struct Reader {
    task: JoinHandle<Capture>,
    stop: oneshot::Sender<()>,
}

impl Reader {
    /// Starts reading `stream` into `log` (at `log_path`), keeping its last `keep` bytes in
    /// memory.
    fn spawn<R>(stream: R, log: File, log_path: &Path, keep: usize) -> Reader
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(capture(stream, log, log_path.to_owned(), keep, stop_rx));
        Reader { task, stop }
    }

    /// Waits for the stream's end until `deadline`, then stops reading.
    async fn finish(self, deadline: Instant) -> Capture {
        let Reader { mut task, stop } = self;
        let joined = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                tracing::debug!("agent output still open after the process ended; not waiting");
                let _ = stop.send(());
                task.await
            }
        };
        joined.unwrap_or_else(|e| Capture {
            error: Some(format!("output reader failed: {e}")),
            ..Capture::default()
        })
    }
}

/// Reads `stream` to its end (or until `stop`), appending every chunk to `log` and keeping
/// its last `keep` bytes in memory.
async fn capture<R>(
    mut stream: R,
    log: File,
    log_path: PathBuf,
    keep: usize,
    mut stop: oneshot::Receiver<()>,
) -> Capture
where
    R: AsyncRead + Unpin,
{
    let mut log = Some(log);
    let mut out = Capture::default();
    let mut buf = vec![0_u8; CHUNK_BYTES];
    loop {
        let n = tokio::select! {
            biased;
            _ = &mut stop => break,
            read = stream.read(&mut buf) => match read {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    out.error.get_or_insert_with(|| format!("reading agent output: {e}"));
                    break;
                }
            },
        };
        let chunk = &buf[..n];
        out.total = out.total.saturating_add(n as u64);
        if let Some(file) = log.as_mut()
            && let Err(e) = append(file, chunk).await
        {
            out.error
                .get_or_insert_with(|| format!("writing {}: {e}", log_path.display()));
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

/// Writes one chunk to a log file and flushes it, so a live reader sees it and a crash
/// leaves it on disk.
async fn append(file: &mut File, chunk: &[u8]) -> io::Result<()> {
    file.write_all(chunk).await?;
    file.flush().await
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
