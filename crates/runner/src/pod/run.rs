//! `agentry pod-run`: the main program of an agent's pod.
//!
//! In this order: it reads [`ENV_ENDPOINT`] and [`ENV_KEY`]; receives the [`Launch`] and the
//! files on a launch connection; opens the control connection, kept for the whole run (from
//! here every failure is sent as a [`PodResult`] with a failure sentence); checks that the
//! Kubernetes API is out of reach (unless [`Launch::allow_api_reach`]); makes the work
//! directory a standalone repository with one base commit (when [`Launch::patch`]); listens
//! on `127.0.0.1:4810` and `127.0.0.1:4811` and carries each connection to the replica's
//! gateway or proxy; runs the agent under [`run_process_with`] (its own process group, the
//! SIGINT → SIGTERM → SIGKILL ladder on a `Stop` frame, on SIGTERM or SIGINT to pod-run,
//! or when the control connection ends); sends the agent's stdout as it comes (and prints
//! it on its own stdout, the pod log), the patch against the base commit, and the result.
//!
//! It prints nothing on stdout but the agent's stdout; its own messages are lines on stderr
//! starting with `agentry pod-run:`. The agent's log files ([`run_process_with`] keeps
//! them) go to a directory of its own under `$TMPDIR` (`/tmp` by default), which must be
//! writable.

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::{
    Channel, FromPod, Launch, PodEnded, PodResult, ToPod, connect, read_to_pod, receive_launch,
    write_from_pod,
};
use crate::network::{GATEWAY_PORT, PROXY_PORT, forwarder};
use crate::process::{
    AgentCommand, Ended, Limits, OutputSink, STDERR_TAIL_BYTES, StopTarget, cancelled,
    run_process_with,
};

/// The replica's pod endpoint, `host:port`.
pub const ENV_ENDPOINT: &str = "AGENTRY_POD_ENDPOINT";

/// The run's key (from the run's Secret).
pub const ENV_KEY: &str = "AGENTRY_POD_KEY";

/// The most bytes of file content the launch may bring (default
/// [`DEFAULT_MAX_WORKSPACE_BYTES`]).
pub const ENV_MAX_WORKSPACE_BYTES: &str = "AGENTRY_POD_MAX_WORKSPACE_BYTES";

/// `GW,PROXY`: the loopback ports to listen on instead of 4810 and 4811, for running
/// pod-run outside a pod (where those ports may be taken); the agent must then be told the
/// ports in its environment.
pub const ENV_LISTEN_PORTS: &str = "AGENTRY_POD_LISTEN_PORTS";

/// The default of [`ENV_MAX_WORKSPACE_BYTES`]: 8 GiB.
pub const DEFAULT_MAX_WORKSPACE_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// The exit code of pod-run when it failed itself (its environment, the launch, a result
/// it could not deliver).
pub const EXIT_FAILED: i32 = 125;

/// The prefix of every message pod-run prints.
const PREFIX: &str = "agentry pod-run:";

/// How long a TCP connect to the Kubernetes API may take before it counts as unreachable.
const API_REACH_TIMEOUT: Duration = Duration::from_secs(2);

/// The wall time given to [`run_process_with`]: the run's time limit is the replica's
/// business (it sends `Stop`).
const NO_WALL_TIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The largest patch frame.
const PATCH_CHUNK_BYTES: usize = 1024 * 1024;

/// How long pod-run waits, after its result, for the replica to close the control
/// connection.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How long pod-run waits before accepting again after an accept failed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// `agentry pod-run` (no arguments): the pod's main program (see the module docs). Returns
/// the process's exit code: 0 once the result was delivered (whatever the agent did),
/// [`EXIT_FAILED`] (with a line on stderr) otherwise.
pub fn pod_run_main() -> i32 {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2);
    let Some(runtime) = forwarder::start_runtime(builder, PREFIX) else {
        return EXIT_FAILED;
    };
    let code = runtime.block_on(pod_run());
    // Forwarded connections may still be open: they end with the process.
    runtime.shutdown_background();
    code
}

/// Why the agent must stop, shared by everything that can ask for it.
#[derive(Clone)]
struct Stopper {
    cancel: Arc<watch::Sender<bool>>,
    /// Whether the control connection ended or failed before the result was sent.
    replica_gone: Arc<AtomicBool>,
    /// Whether the result is being sent: from then on the replica closing the connection
    /// is the normal end (it may read the result and close before the write returns).
    finishing: Arc<AtomicBool>,
}

impl Stopper {
    fn stop(&self) {
        self.cancel.send_replace(true);
    }

    fn stopped(&self) -> bool {
        *self.cancel.borrow()
    }
}

async fn pod_run() -> i32 {
    let (cancel, cancel_rx) = watch::channel(false);
    let stopper = Stopper {
        cancel: Arc::new(cancel),
        replica_gone: Arc::new(AtomicBool::new(false)),
        finishing: Arc::new(AtomicBool::new(false)),
    };
    // PID 1 of a container gets no default action for SIGTERM: it is handled here, from the
    // start, and turned into the stop ladder.
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        match signal(kind) {
            Ok(mut stream) => {
                let stopper = stopper.clone();
                tokio::spawn(async move {
                    while stream.recv().await.is_some() {
                        stopper.stop();
                    }
                });
            }
            Err(e) => {
                eprintln!("{PREFIX} cannot handle signal {}: {e}", kind.as_raw_value());
                return EXIT_FAILED;
            }
        }
    }

    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("{PREFIX} {message}");
            return EXIT_FAILED;
        }
    };

    let mut stop_wait = cancel_rx.clone();
    let launch = tokio::select! {
        launch = fetch_launch(&settings) => launch,
        () = cancelled(&mut stop_wait) => Err(
            "stopped by a signal before the launch was received".to_owned()
        ),
    };
    let launch = match launch {
        Ok(launch) => launch,
        Err(message) => {
            eprintln!("{PREFIX} {message}");
            return EXIT_FAILED;
        }
    };

    let control = match connect(&settings.endpoint, Channel::Control, &settings.key).await {
        Ok(control) => control,
        Err(message) => {
            eprintln!("{PREFIX} {message}");
            return EXIT_FAILED;
        }
    };
    let (control_read, mut control_write) = control.into_split();
    let reader = tokio::spawn(read_control(control_read, stopper.clone()));

    let result = run(&settings, &launch, &stopper, cancel_rx, &mut control_write).await;
    if stopper.replica_gone.load(Ordering::SeqCst) {
        eprintln!(
            "{PREFIX} the control connection to the replica ended before the result was \
             sent; the agent was stopped"
        );
        return EXIT_FAILED;
    }
    if let Err(e) = result {
        eprintln!("{PREFIX} cannot send the result to the replica: {e}");
        return EXIT_FAILED;
    }
    // The replica reads the result, then closes: wait for it (a bounded time), so that
    // nothing sent is lost to a reset.
    let _ = tokio::time::timeout(CLOSE_WAIT, reader).await;
    0
}

/// pod-run's environment.
struct Settings {
    endpoint: String,
    key: String,
    max_workspace_bytes: u64,
    gateway_port: u16,
    proxy_port: u16,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let required = |name: &str| match std::env::var(name) {
            Ok(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
            _ => Err(format!(
                "{name} is not set: pod-run runs in an agent's pod, started by agentry"
            )),
        };
        let endpoint = required(ENV_ENDPOINT)?;
        let key = required(ENV_KEY)?;
        let max_workspace_bytes = match std::env::var(ENV_MAX_WORKSPACE_BYTES) {
            Ok(value) => value.trim().parse::<u64>().map_err(|_| {
                format!("{ENV_MAX_WORKSPACE_BYTES} must be a whole number of bytes, not {value:?}")
            })?,
            Err(_) => DEFAULT_MAX_WORKSPACE_BYTES,
        };
        let (gateway_port, proxy_port) = match std::env::var(ENV_LISTEN_PORTS) {
            Ok(value) => listen_ports(&value)?,
            Err(_) => (GATEWAY_PORT, PROXY_PORT),
        };
        Ok(Settings {
            endpoint,
            key,
            max_workspace_bytes,
            gateway_port,
            proxy_port,
        })
    }
}

/// [`ENV_LISTEN_PORTS`]: `GW,PROXY`, two ports from 1 to 65535.
fn listen_ports(value: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{ENV_LISTEN_PORTS} must be GATEWAY_PORT,PROXY_PORT, not {value:?}");
    let (gateway, proxy) = value.split_once(',').ok_or_else(bad)?;
    let port = |p: &str| p.trim().parse::<u16>().ok().filter(|p| *p != 0);
    Ok((port(gateway).ok_or_else(bad)?, port(proxy).ok_or_else(bad)?))
}

/// Steps 2: the launch and the files.
async fn fetch_launch(settings: &Settings) -> Result<Launch, String> {
    let stream = connect(&settings.endpoint, Channel::Launch, &settings.key).await?;
    receive_launch(stream, settings.max_workspace_bytes).await
}

/// Reads the replica's frames: `Stop` stops the agent; the end of the connection, an error
/// or a frame that is not one stops it too and, unless the result is being sent, marks
/// the replica gone. Returns at the end of the connection.
async fn read_control(mut control: OwnedReadHalf, stopper: Stopper) {
    loop {
        match read_to_pod(&mut control).await {
            Ok(Some(ToPod::Stop)) => stopper.stop(),
            Ok(None) => break,
            Err(e) => {
                eprintln!("{PREFIX} the control connection failed: {e}");
                break;
            }
        }
    }
    if !stopper.finishing.load(Ordering::SeqCst) {
        stopper.replica_gone.store(true, Ordering::SeqCst);
    }
    stopper.stop();
}

/// Steps 4 to 8, once the control connection is open: everything ends in a result sent on
/// `control` (unless the connection failed: then the error).
async fn run(
    settings: &Settings,
    launch: &Launch,
    stopper: &Stopper,
    cancel: watch::Receiver<bool>,
    control: &mut OwnedWriteHalf,
) -> io::Result<()> {
    let not_started = |failure: String| PodResult {
        ended: PodEnded::NotStarted,
        stderr_tail: String::new(),
        failure: Some(failure),
        oom_kills: 0,
    };
    let result = match prepare(settings, launch).await {
        Err(failure) => not_started(failure),
        Ok(_) if stopper.stopped() => PodResult {
            ended: PodEnded::Stopped,
            stderr_tail: String::new(),
            failure: None,
            oom_kills: 0,
        },
        Ok(base) => {
            let oom_before = crate::cgroup::own_oom_kills();
            match run_agent(launch, stopper, cancel, control).await? {
                Err(failure) => not_started(failure),
                Ok((ended, stderr_tail)) => {
                    let oom_kills = match (oom_before, crate::cgroup::own_oom_kills()) {
                        (Some(before), Some(after)) => after.saturating_sub(before),
                        _ => 0,
                    };
                    let mut result = PodResult {
                        ended,
                        stderr_tail,
                        failure: None,
                        oom_kills,
                    };
                    if let (Some(base), PodEnded::Exited { .. }) = (&base, &result.ended)
                        && let Err(failure) = send_patch(launch, base, control).await?
                    {
                        result.failure = Some(failure);
                    }
                    result
                }
            }
        }
    };
    if let Some(failure) = &result.failure {
        eprintln!("{PREFIX} {failure}");
    }
    stopper.finishing.store(true, Ordering::SeqCst);
    write_from_pod(control, &FromPod::Result(result)).await?;
    control.shutdown().await
}

/// Steps 4 to 6: the API check, the base commit (its hash, when the launch asks for a
/// patch), the listeners (serving from here on).
async fn prepare(settings: &Settings, launch: &Launch) -> Result<Option<String>, String> {
    if !launch.allow_api_reach {
        check_api_unreachable().await?;
    }
    tokio::fs::create_dir_all(&launch.home)
        .await
        .map_err(|e| format!("cannot create the agent's HOME {}: {e}", launch.home))?;
    // A review gets the repository too (with the history: it reads the change with git),
    // but returns no patch.
    let base = if launch.patch || launch.history.is_some() {
        Some(base_commit(settings, launch).await?).filter(|_| launch.patch)
    } else {
        None
    };
    let endpoint: Arc<str> = Arc::from(settings.endpoint.as_str());
    let key: Arc<str> = Arc::from(settings.key.as_str());
    for (port, channel) in [
        (settings.gateway_port, Channel::Gateway),
        (settings.proxy_port, Channel::Proxy),
    ] {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(|e| format!("cannot listen on 127.0.0.1:{port} for the {channel}: {e}"))?;
        tokio::spawn(serve(listener, channel, endpoint.clone(), key.clone()));
    }
    Ok(base)
}

/// Step 4: fails with a sentence when `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`
/// accepts a TCP connection within [`API_REACH_TIMEOUT`].
async fn check_api_unreachable() -> Result<(), String> {
    let (Ok(host), Ok(port)) = (
        std::env::var("KUBERNETES_SERVICE_HOST"),
        std::env::var("KUBERNETES_SERVICE_PORT"),
    ) else {
        return Ok(());
    };
    let (host, port) = (host.trim().to_owned(), port.trim().to_owned());
    let Ok(port_number) = port.parse::<u16>() else {
        return Ok(());
    };
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let reached = tokio::time::timeout(
        API_REACH_TIMEOUT,
        TcpStream::connect((host.trim_matches(['[', ']']), port_number)),
    )
    .await;
    if matches!(reached, Ok(Ok(_))) {
        return Err(format!(
            "the Kubernetes API at {address} is reachable from the agent's pod: the \
             NetworkPolicy for agent pods is not enforced here; use a network plugin that \
             enforces NetworkPolicy, or set AGENTRY_KUBE_ALLOW_API_REACH=1 to run agents anyway"
        ));
    }
    Ok(())
}

/// A `git` command for the work directory: no system or global configuration, no hooks,
/// no fsmonitor, a fixed identity, `HOME` the agent's, nothing else of pod-run's
/// environment but `PATH`.
fn git(launch: &Launch) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("git");
    command
        .env_clear()
        .env("HOME", &launch.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "user.name=agentry",
            "-c",
            "user.email=agentry@localhost",
            "-c",
            "commit.gpgSign=false",
            "-c",
            "init.defaultBranch=main",
        ])
        .current_dir(&launch.workdir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command
}

/// Runs `git <args>` in the work directory; its stdout on success, a sentence with its
/// stderr otherwise.
async fn git_output(launch: &Launch, args: &[&str]) -> Result<String, String> {
    let output = git(launch)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("cannot run git {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "git {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Step 5: makes the work directory a standalone repository with one commit of its files;
/// returns the commit's hash.
async fn base_commit(settings: &Settings, launch: &Launch) -> Result<String, String> {
    git_output(launch, &["init", "-q"]).await?;
    if let Some(commit) = &launch.history {
        // The replica's history: its branches as `origin/*`, HEAD at the files' commit.
        let bundle = receive_history(settings).await?;
        let bundle_arg = bundle.to_string_lossy().into_owned();
        let fetched = git_output(
            launch,
            &[
                "fetch",
                "--quiet",
                "--no-write-fetch-head",
                &bundle_arg,
                "+refs/remotes/origin/*:refs/remotes/origin/*",
            ],
        )
        .await;
        let _ = tokio::fs::remove_file(&bundle).await;
        fetched?;
        git_output(launch, &["update-ref", "--no-deref", "HEAD", commit]).await?;
        git_output(launch, &["read-tree", commit]).await?;
        return git_output(launch, &["rev-parse", "--verify", "HEAD^{commit}"]).await;
    }
    git_output(launch, &["add", "-A"]).await?;
    git_output(
        launch,
        &["commit", "-q", "--no-verify", "--allow-empty", "-m", "base"],
    )
    .await?;
    git_output(launch, &["rev-parse", "--verify", "HEAD^{commit}"]).await
}

/// Fetches the run's history bundle from the replica into a file of the pod's `/tmp`.
async fn receive_history(settings: &Settings) -> Result<PathBuf, String> {
    let mut stream = connect(&settings.endpoint, Channel::History, &settings.key).await?;
    let path = std::env::temp_dir().join(format!("agentry-history-{}.bundle", std::process::id()));
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    tokio::io::copy(&mut stream, &mut file)
        .await
        .map_err(|e| format!("cannot receive the run's history: {e}"))?;
    Ok(path)
}

/// Accepts the agent's connections on `listener` for the rest of the run, each carried to
/// the replica's `channel`.
async fn serve(listener: TcpListener, channel: Channel, endpoint: Arc<str>, key: Arc<str>) {
    loop {
        match listener.accept().await {
            Ok((agent, _)) => {
                tokio::spawn(carry(agent, channel, endpoint.clone(), key.clone()));
            }
            Err(e) => {
                eprintln!("{PREFIX} accepting a connection for the {channel} failed: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

/// Copies bytes between the agent's connection and a new `channel` connection to the
/// replica, both ways, a half close passed on; a replica that cannot be reached resets the
/// agent's connection.
async fn carry(mut agent: TcpStream, channel: Channel, endpoint: Arc<str>, key: Arc<str>) {
    let mut replica = match connect(&endpoint, channel, &key).await {
        Ok(replica) => replica,
        Err(message) => {
            eprintln!("{PREFIX} {message}");
            // Closed with a reset: the agent sees the failure at once.
            let _ = agent.set_zero_linger();
            return;
        }
    };
    // A reset or a broken pipe on either side ends the connection; nothing to report.
    let _ = tokio::io::copy_bidirectional(&mut agent, &mut replica).await;
}

/// The agent's stdout: printed on pod-run's stdout (the pod log) and sent as frames.
struct StdoutSink {
    frames: mpsc::UnboundedSender<FromPod>,
}

impl OutputSink for StdoutSink {
    fn feed(&mut self, chunk: &[u8]) {
        let mut out = io::stdout().lock();
        // A closed pod log must not end the run.
        let _ = out.write_all(chunk).and_then(|()| out.flush());
        let _ = self.frames.send(FromPod::Stdout(chunk.to_vec()));
    }
}

/// How the agent ended and its stderr's tail, or a sentence when it could not be run.
type AgentEnd = Result<(PodEnded, String), String>;

/// Step 7: runs the agent, its stdout sent on `control` as it comes (the sink passes the
/// chunks through a channel; they are written here while the agent runs). Returns once
/// every stdout frame was written; the error is the control connection's (the agent is
/// stopped as soon as a write fails).
async fn run_agent(
    launch: &Launch,
    stopper: &Stopper,
    cancel: watch::Receiver<bool>,
    control: &mut OwnedWriteHalf,
) -> io::Result<AgentEnd> {
    let Some((program, args)) = launch.argv.split_first() else {
        return Ok(Err("the launch has no program to run".to_owned()));
    };
    let log_dir = match private_log_dir() {
        Ok(dir) => dir,
        Err(message) => return Ok(Err(message)),
    };
    let command = AgentCommand {
        program: PathBuf::from(program),
        args: args.to_vec(),
        stdin: launch.stdin.clone(),
        cwd: PathBuf::from(&launch.workdir),
        env: launch.env.clone(),
        stop: StopTarget::Group,
        pass_fds: Vec::new(),
        user: None,
    };
    let limits = Limits {
        wall_time: NO_WALL_TIME,
        stop_grace: Duration::from_millis(launch.stop_grace_ms),
    };
    let (frames, mut frames_rx) = mpsc::unbounded_channel();
    let sink = StdoutSink { frames };
    let log_path = log_dir.join("agent.log");
    let agent = run_process_with(command, &log_path, limits, cancel, sink, |_| {});
    tokio::pin!(agent);
    // Write stdout frames while the agent runs; once it has ended (and its sink, holding
    // the only sender, is dropped), write what is left.
    let mut write_error = None;
    let outcome = loop {
        tokio::select! {
            outcome = &mut agent => break outcome,
            Some(frame) = frames_rx.recv(), if write_error.is_none() => {
                if let Err(e) = write_from_pod(control, &frame).await {
                    // The replica cannot be told anything any more: the run must not go on.
                    stopper.replica_gone.store(true, Ordering::SeqCst);
                    stopper.stop();
                    write_error = Some(e);
                }
            }
        }
    };
    let outcome = outcome.map(|(outcome, sink)| {
        drop(sink);
        outcome
    });
    while let Some(frame) = frames_rx.recv().await {
        if write_error.is_none()
            && let Err(e) = write_from_pod(control, &frame).await
        {
            write_error = Some(e);
        }
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    if let Some(e) = write_error {
        return Err(e);
    }
    let end = match outcome {
        Err(e) => Err(e.to_string()),
        Ok(outcome) => {
            let ended = match outcome.ended {
                Ended::Exited { code, signal } => PodEnded::Exited { code, signal },
                Ended::Cancelled | Ended::Stopped | Ended::TimedOut => PodEnded::Stopped,
            };
            Ok((ended, outcome.stderr_tail))
        }
    };
    Ok(end)
}

/// A new directory for the agent's log files, readable by pod-run's user alone, in the
/// temporary directory (outside the work directory).
fn private_log_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("agentry-pod-run-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
        .map_err(|e| format!("cannot create the log directory {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Step 8: `git add -A`, then the diff against `base` sent as patch frames of at most
/// [`PATCH_CHUNK_BYTES`]. The outer error is the control connection's; the inner one a
/// sentence on what failed (the frames sent, if any, are then not to be used).
async fn send_patch(
    launch: &Launch,
    base: &str,
    control: &mut OwnedWriteHalf,
) -> io::Result<Result<(), String>> {
    if let Err(failure) = git_output(launch, &["add", "-A"]).await {
        return Ok(Err(failure));
    }
    let args = [
        "diff",
        "--cached",
        "--binary",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        base,
    ];
    let mut child = match git(launch)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return Ok(Err(format!("cannot run git diff: {e}"))),
    };
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Ok(Err("git diff has no output pipes".to_owned()));
    };
    let stderr_task = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = (&mut stderr)
            .take(STDERR_TAIL_BYTES as u64)
            .read_to_end(&mut text)
            .await;
        // Whatever is left is not kept, but read, so that git never blocks on it.
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        String::from_utf8_lossy(&text).trim().to_owned()
    });
    let mut chunk = vec![0u8; PATCH_CHUNK_BYTES];
    let mut filled = 0;
    loop {
        let n = match stdout.read(&mut chunk[filled..]).await {
            Ok(n) => n,
            Err(e) => return Ok(Err(format!("reading git diff's output failed: {e}"))),
        };
        filled += n;
        if (n == 0 || filled == chunk.len()) && filled > 0 {
            write_from_pod(control, &FromPod::Patch(chunk[..filled].to_vec())).await?;
            filled = 0;
        }
        if n == 0 {
            break;
        }
    }
    let status = child.wait().await;
    let stderr = stderr_task.await.unwrap_or_default();
    match status {
        Ok(status) if status.success() => Ok(Ok(())),
        Ok(status) => Ok(Err(format!("git diff failed ({status}): {stderr}"))),
        Err(e) => Ok(Err(format!("waiting for git diff failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_ports_are_two_ports() {
        assert_eq!(listen_ports("5810,5811"), Ok((5810, 5811)));
        assert_eq!(listen_ports(" 1 , 2 "), Ok((1, 2)));
        for bad in ["", "5810", "0,1", "1,65536", "a,b", "1,2,3"] {
            let err = listen_ports(bad).unwrap_err();
            assert!(err.contains(ENV_LISTEN_PORTS), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_path_under_the_temporary_directory() {
        let dir = private_log_dir().unwrap();
        assert!(dir.starts_with(std::env::temp_dir()));
        assert!(dir.is_dir());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
