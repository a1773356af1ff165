//! `agentry-pod-run` (the agent pod's program, `agentry pod-run`) as a child process
//! against a replica written here: a TCP listener on 127.0.0.1 that checks each hello,
//! serves the launch and the files, hands the control connection to the test and carries
//! gateway connections to a small HTTP responder.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry_runner::pod::{
    self, Channel, FromPod, Launch, PodEnded, PodResult, ToPod, answer, read_from_pod, read_hello,
    send_launch, write_to_pod,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::support::{PATH, git};

const POD_RUN: &str = env!("CARGO_BIN_EXE_agentry-pod-run");

/// The run's key in these tests.
const KEY: &str = "agr_test-run-key";

/// The longest a test waits for anything.
const WITHIN: Duration = Duration::from_secs(30);

/// The replica of a test.
struct Replica {
    endpoint: String,
    /// Control connections, as pods open them (after `OK`).
    controls: mpsc::UnboundedReceiver<TcpStream>,
    /// The channel of every hello that was answered `OK`, and every refused one's.
    hellos: Arc<Mutex<Vec<(Channel, bool)>>>,
    /// The requests the HTTP responder behind the gateway got (their head).
    requests: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    async fn start(launch: Launch, files: PathBuf) -> Replica {
        let responder = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = responder.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(respond(responder, requests.clone()));

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let (controls_tx, controls) = mpsc::unbounded_channel();
        let hellos = Arc::new(Mutex::new(Vec::new()));
        let seen = hellos.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(serve(
                    stream,
                    launch.clone(),
                    files.clone(),
                    backend,
                    controls_tx.clone(),
                    seen.clone(),
                ));
            }
        });
        Replica {
            endpoint,
            controls,
            hellos,
            requests,
        }
    }

    /// The next control connection a pod opened.
    async fn control(&mut self) -> TcpStream {
        tokio::time::timeout(WITHIN, self.controls.recv())
            .await
            .expect("no control connection in time")
            .expect("the replica ended")
    }
}

/// One connection from the pod.
async fn serve(
    mut stream: TcpStream,
    launch: Launch,
    files: PathBuf,
    backend: SocketAddr,
    controls: mpsc::UnboundedSender<TcpStream>,
    hellos: Arc<Mutex<Vec<(Channel, bool)>>>,
) {
    let Ok(hello) = read_hello(&mut stream).await else {
        return;
    };
    let known = hello.key == KEY;
    hellos.lock().unwrap().push((hello.channel, known));
    if !known {
        answer(&mut stream, Err("no run has this key"))
            .await
            .unwrap();
        return;
    }
    answer(&mut stream, Ok(())).await.unwrap();
    match hello.channel {
        Channel::Launch => send_launch(stream, &launch, &files).await.unwrap(),
        Channel::Control => controls.send(stream).unwrap(),
        // This test replica sends no history (its launches have none).
        Channel::History => {}
        Channel::Gateway | Channel::Proxy => {
            let mut upstream = TcpStream::connect(backend).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
        }
    }
}

/// The HTTP responder behind the gateway: records each request's head and answers `hello`.
async fn respond(listener: TcpListener, requests: Arc<Mutex<Vec<String>>>) {
    loop {
        let (mut stream, _) = listener.accept().await.unwrap();
        let requests = requests.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if stream.read(&mut byte).await.unwrap() == 0 {
                    return;
                }
                head.push(byte[0]);
            }
            requests
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                )
                .await
                .unwrap();
            stream.shutdown().await.unwrap();
        });
    }
}

/// Two loopback ports free right now, for pod-run's listeners.
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

/// A test's directories: the replica's worktree (`files`), the pod's work directory and
/// `HOME`.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    files: PathBuf,
    workdir: PathBuf,
    home: PathBuf,
}

fn new_dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_owned();
    let files = root.join("worktree");
    std::fs::create_dir_all(files.join("src")).unwrap();
    // A worktree's `.git` is a file pointing at the replica's repository: never sent.
    std::fs::write(
        files.join(".git"),
        "gitdir: /nonexistent/.git/worktrees/x\n",
    )
    .unwrap();
    std::fs::write(files.join("README.md"), "# project\n").unwrap();
    std::fs::write(files.join("old.txt"), "to be deleted\n").unwrap();
    std::fs::write(files.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    std::os::unix::fs::symlink("README.md", files.join("README")).unwrap();
    Dirs {
        workdir: root.join("pod/repo"),
        home: root.join("pod/home"),
        files,
        root,
        _tmp: tmp,
    }
}

fn launch_of(dirs: &Dirs, script: &str, gateway_port: u16) -> Launch {
    Launch {
        argv: vec!["bash".into(), "-c".into(), script.into()],
        env: vec![
            ("PATH".into(), PATH.into()),
            ("HOME".into(), dirs.home.display().to_string()),
            ("ANTHROPIC_API_KEY".into(), KEY.into()),
            ("GATEWAY_PORT".into(), gateway_port.to_string()),
        ],
        stdin: String::new(),
        workdir: dirs.workdir.display().to_string(),
        home: dirs.home.display().to_string(),
        patch: true,
        stop_grace_ms: 2000,
        allow_api_reach: false,
        history: None,
    }
}

/// Starts pod-run against `endpoint`, listening on `ports`, with `extra` variables.
fn pod_run(
    dirs: &Dirs,
    endpoint: &str,
    ports: (u16, u16),
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(POD_RUN);
    command
        .env_clear()
        .env("PATH", PATH)
        .env("TMPDIR", &dirs.root)
        .env(pod::ENV_ENDPOINT, endpoint)
        .env(pod::ENV_KEY, KEY)
        .env(pod::ENV_LISTEN_PORTS, format!("{},{}", ports.0, ports.1))
        .envs(extra.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command.spawn().unwrap()
}

/// What the pod sent on a control connection, to its end.
#[derive(Debug, Default)]
struct Sent {
    stdout: Vec<u8>,
    patch: Vec<u8>,
    patch_frames: usize,
    result: Option<PodResult>,
}

impl Sent {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Reads frames from `control` until its stdout contains `text`; returns what came.
async fn read_until_stdout(control: &mut TcpStream, sent: &mut Sent, text: &str) {
    tokio::time::timeout(WITHIN, async {
        while !sent.stdout().contains(text) {
            match read_from_pod(control).await.unwrap() {
                Some(FromPod::Stdout(bytes)) => sent.stdout.extend(bytes),
                other => panic!("expected stdout, got {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {text:?} on stdout in time: {:?}", sent.stdout()));
}

/// Reads frames from `control` to its end (the result is last), then closes it.
async fn read_to_end(mut control: TcpStream, sent: &mut Sent) {
    tokio::time::timeout(WITHIN, async {
        while let Some(frame) = read_from_pod(&mut control).await.unwrap() {
            assert!(sent.result.is_none(), "a frame after the result: {frame:?}");
            match frame {
                FromPod::Stdout(bytes) => sent.stdout.extend(bytes),
                FromPod::Patch(bytes) => {
                    assert!(bytes.len() <= 1024 * 1024);
                    sent.patch.extend(bytes);
                    sent.patch_frames += 1;
                }
                FromPod::Result(result) => sent.result = Some(result),
            }
        }
    })
    .await
    .expect("the pod did not end the control connection in time");
    drop(control);
}

/// Waits for pod-run to exit; its exit code, stdout and stderr.
async fn finish(child: tokio::process::Child) -> (Option<i32>, String, String) {
    let output = tokio::time::timeout(WITHIN, child.wait_with_output())
        .await
        .expect("pod-run did not exit in time")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A whole run through pod-run: what the pod sent on its control connection, pod-run's exit
/// code, stdout and stderr, and the replica it ran against.
struct Ended {
    sent: Sent,
    code: Option<i32>,
    stdout: String,
    stderr: String,
    replica: Replica,
}

/// Runs `script` ([`launch_of`], then `shape`d) through pod-run with `extra` variables, on
/// two free ports, to its end: reads the control connection to its end and waits for pod-run
/// to exit.
async fn run_to_end(
    dirs: &Dirs,
    script: &str,
    shape: impl FnOnce(&mut Launch),
    extra: &[(&str, &str)],
) -> Ended {
    let ports = free_ports();
    let mut launch = launch_of(dirs, script, ports.0);
    shape(&mut launch);
    let mut replica = Replica::start(launch, dirs.files.clone()).await;
    let child = pod_run(dirs, &replica.endpoint, ports, extra);
    let mut sent = Sent::default();
    read_to_end(replica.control().await, &mut sent).await;
    let (code, stdout, stderr) = finish(child).await;
    Ended {
        sent,
        code,
        stdout,
        stderr,
        replica,
    }
}

/// The agent of the full run: prints, asks the gateway through the pod's loopback with
/// bash's `/dev/tcp`, changes a file, creates a text and a binary file, deletes one.
const AGENT: &str = r#"
echo "agent: starting in $PWD"
exec 3<>"/dev/tcp/127.0.0.1/$GATEWAY_PORT"
printf 'POST /v1/messages HTTP/1.1\r\nHost: gateway\r\nx-api-key: %s\r\nConnection: close\r\n\r\n' "$ANTHROPIC_API_KEY" >&3
response=$(cat <&3)
exec 3<&-
echo "agent: the gateway said ${response##*$'\r\n'}"
echo "changed by the agent" >> README.md
echo "a new file" > src/new.rs
printf '\000\001\002binary' > data.bin
rm old.txt
echo "agent: done"
echo "a warning" >&2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_streams_stdout_reaches_the_gateway_and_returns_a_patch() {
    let dirs = new_dirs();
    let Ended {
        sent,
        code,
        stdout,
        stderr,
        replica,
    } = run_to_end(&dirs, AGENT, |_| {}, &[]).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");

    let agent_stdout = sent.stdout();
    assert!(
        agent_stdout.contains(&format!("agent: starting in {}", dirs.workdir.display())),
        "{agent_stdout}"
    );
    assert!(
        agent_stdout.contains("agent: the gateway said hello"),
        "{agent_stdout}"
    );
    assert!(agent_stdout.ends_with("agent: done\n"), "{agent_stdout}");
    assert_eq!(
        stdout, agent_stdout,
        "pod-run prints the agent's stdout and nothing else"
    );

    let requests = replica.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(
        requests[0].starts_with("POST /v1/messages HTTP/1.1\r\n"),
        "{requests:?}"
    );
    assert!(
        requests[0].contains(&format!("x-api-key: {KEY}")),
        "{requests:?}"
    );
    let hellos = replica.hellos.lock().unwrap().clone();
    assert_eq!(
        hellos,
        vec![
            (Channel::Launch, true),
            (Channel::Control, true),
            (Channel::Gateway, true)
        ]
    );

    let result = sent.result.clone().expect("no result");
    assert_eq!(
        result.ended,
        PodEnded::Exited {
            code: Some(0),
            signal: None
        }
    );
    assert_eq!(result.failure, None);
    assert_eq!(result.stderr_tail, "a warning\n");

    // The patch gives the agent's changes when applied to a copy of the original files.
    assert!(sent.patch_frames >= 1);
    let copy = dirs.root.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for name in ["README.md", "old.txt"] {
        std::fs::copy(dirs.files.join(name), copy.join(name)).unwrap();
    }
    std::fs::create_dir_all(copy.join("src")).unwrap();
    std::fs::copy(dirs.files.join("src/lib.rs"), copy.join("src/lib.rs")).unwrap();
    std::os::unix::fs::symlink("README.md", copy.join("README")).unwrap();
    let patch_file = dirs.root.join("agent.patch");
    std::fs::write(&patch_file, &sent.patch).unwrap();
    git(&["apply", "--binary", patch_file.to_str().unwrap()], &copy);
    assert_eq!(
        std::fs::read_to_string(copy.join("README.md")).unwrap(),
        "# project\nchanged by the agent\n"
    );
    assert_eq!(
        std::fs::read_to_string(copy.join("src/new.rs")).unwrap(),
        "a new file\n"
    );
    assert_eq!(
        std::fs::read(copy.join("data.bin")).unwrap(),
        b"\x00\x01\x02binary"
    );
    assert!(!copy.join("old.txt").exists());
    assert_eq!(
        std::fs::read_link(copy.join("README")).unwrap(),
        Path::new("README.md")
    );
    let patch = String::from_utf8_lossy(&sent.patch);
    assert!(patch.contains("GIT binary patch"), "{patch}");
    assert!(!patch.contains("lib.rs"), "only the changes: {patch}");

    // The pod's repository is standalone: one base commit, no remote.
    let log = git(&["log", "--format=%s"], &dirs.workdir);
    assert_eq!(log.trim(), "base");
    assert_eq!(git(&["remote"], &dirs.workdir).trim(), "");
}

/// An agent that logs a SIGINT (and a SIGTERM) to `$HOME/signals`, says so and exits 130;
/// `ready` once its trap is set.
const TRAPPING_AGENT: &str = r#"
trap 'echo INT >> "$HOME/signals"; echo "agent: interrupted"; exit 130' INT
trap 'echo TERM >> "$HOME/signals"; exit 143' TERM
echo "agent: ready"
while :; do sleep 0.05; done
"#;

/// Starts a run of [`TRAPPING_AGENT`] and reads its stdout up to `ready`.
async fn trapping_run(dirs: &Dirs) -> (Replica, tokio::process::Child, TcpStream, Sent) {
    let ports = free_ports();
    let launch = launch_of(dirs, TRAPPING_AGENT, ports.0);
    let mut replica = Replica::start(launch, dirs.files.clone()).await;
    let child = pod_run(dirs, &replica.endpoint, ports, &[]);
    let mut control = replica.control().await;
    let mut sent = Sent::default();
    read_until_stdout(&mut control, &mut sent, "agent: ready").await;
    (replica, child, control, sent)
}

/// The signals the trapping agent logged.
fn signals(dirs: &Dirs) -> String {
    std::fs::read_to_string(dirs.home.join("signals")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_frame_interrupts_the_agent_first() {
    let dirs = new_dirs();
    let (_replica, child, mut control, mut sent) = trapping_run(&dirs).await;
    write_to_pod(&mut control, &ToPod::Stop).await.unwrap();
    read_to_end(control, &mut sent).await;
    let (code, _, stderr) = finish(child).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(signals(&dirs), "INT\n");
    assert!(sent.stdout().contains("agent: interrupted"));
    let result = sent.result.expect("no result");
    assert_eq!(result.ended, PodEnded::Stopped);
    assert_eq!(result.failure, None);
    assert_eq!(sent.patch_frames, 0, "a stopped run has no patch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_pod_run_runs_the_same_ladder() {
    let dirs = new_dirs();
    let (_replica, child, control, mut sent) = trapping_run(&dirs).await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    read_to_end(control, &mut sent).await;
    let (code, _, stderr) = finish(child).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(
        signals(&dirs),
        "INT\n",
        "SIGINT first, not the SIGTERM pod-run got"
    );
    assert_eq!(sent.result.expect("no result").ended, PodEnded::Stopped);
}

/// An agent that ignores SIGINT gets SIGTERM after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_ignoring_sigint_gets_sigterm_after_the_grace() {
    let dirs = new_dirs();
    let ports = free_ports();
    let script = r#"
trap 'echo INT >> "$HOME/signals"' INT
trap 'echo TERM >> "$HOME/signals"; exit 143' TERM
echo "agent: ready"
while :; do sleep 0.05; done
"#;
    let mut launch = launch_of(&dirs, script, ports.0);
    launch.stop_grace_ms = 300;
    let mut replica = Replica::start(launch, dirs.files.clone()).await;
    let child = pod_run(&dirs, &replica.endpoint, ports, &[]);
    let mut control = replica.control().await;
    let mut sent = Sent::default();
    read_until_stdout(&mut control, &mut sent, "agent: ready").await;
    write_to_pod(&mut control, &ToPod::Stop).await.unwrap();
    read_to_end(control, &mut sent).await;
    let (code, _, stderr) = finish(child).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(signals(&dirs), "INT\nTERM\n");
    assert_eq!(sent.result.expect("no result").ended, PodEnded::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_closing_control_stops_the_agent_and_pod_run_fails() {
    let dirs = new_dirs();
    let (_replica, child, control, _sent) = trapping_run(&dirs).await;
    drop(control);
    let (code, _, stderr) = finish(child).await;
    assert_eq!(code, Some(pod::EXIT_FAILED), "stderr: {stderr}");
    assert!(
        stderr.contains("the control connection to the replica ended"),
        "{stderr}"
    );
    assert_eq!(signals(&dirs), "INT\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reachable_kubernetes_api_fails_the_run_unless_allowed() {
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_port = api.local_addr().unwrap().port().to_string();
    let kube = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", api_port.as_str()),
    ];
    let script = "echo 'agent: ran'; touch ran";

    let dirs = new_dirs();
    let refused = run_to_end(&dirs, script, |_| {}, &kube).await;
    let stderr = &refused.stderr;
    assert_eq!(
        refused.code,
        Some(0),
        "the result was delivered; stderr: {stderr}"
    );
    let result = refused.sent.result.expect("no result");
    assert_eq!(result.ended, PodEnded::NotStarted);
    let failure = result.failure.expect("no failure");
    assert!(
        failure.starts_with(&format!(
            "the Kubernetes API at 127.0.0.1:{api_port} is reachable from the agent's pod: \
             the NetworkPolicy for agent pods is not enforced here"
        )),
        "{failure}"
    );
    assert!(
        failure.contains("AGENTRY_KUBE_ALLOW_API_REACH=1"),
        "{failure}"
    );
    assert!(!dirs.workdir.join("ran").exists());
    assert_eq!(refused.stdout, "");
    assert_eq!(refused.sent.patch_frames, 0);

    let dirs = new_dirs();
    let allowed = |launch: &mut Launch| launch.allow_api_reach = true;
    let Ended {
        sent, code, stderr, ..
    } = run_to_end(&dirs, script, allowed, &kube).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    let result = sent.result.expect("no result");
    assert_eq!(result.failure, None);
    assert_eq!(
        result.ended,
        PodEnded::Exited {
            code: Some(0),
            signal: None
        }
    );
    assert!(dirs.workdir.join("ran").exists());
    assert!(String::from_utf8_lossy(&sent.patch).contains("b/ran"));

    // A port where nothing listens is fine.
    drop(api);
    let dirs = new_dirs();
    let ended = run_to_end(&dirs, script, |_| {}, &kube).await;
    assert_eq!(ended.sent.result.expect("no result").failure, None);
}

/// An agent program that cannot be started: the result says so, nothing was started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_start_is_a_failure_sentence() {
    let dirs = new_dirs();
    let missing = |launch: &mut Launch| {
        launch.argv = vec!["/nonexistent/agent".into(), "-p".into()];
    };
    let Ended {
        sent, code, stderr, ..
    } = run_to_end(&dirs, "true", missing, &[]).await;
    assert_eq!(code, Some(0), "the result was delivered; stderr: {stderr}");
    let result = sent.result.expect("no result");
    assert_eq!(result.ended, PodEnded::NotStarted);
    let failure = result.failure.expect("no failure");
    assert!(
        failure.contains("cannot start agent program \"/nonexistent/agent\""),
        "{failure}"
    );
    assert!(stderr.contains(&failure), "{stderr}");
    assert_eq!(sent.patch_frames, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_environment_pod_run_exits_125_with_a_line() {
    let output = tokio::process::Command::new(POD_RUN)
        .env_clear()
        .env("PATH", PATH)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert_eq!(output.stdout, b"");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("agentry pod-run: AGENTRY_POD_ENDPOINT is not set"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// A wrong key: the replica refuses the launch, pod-run says so and exits 125.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_ends_pod_run_with_the_replicas_sentence() {
    let dirs = new_dirs();
    let ports = free_ports();
    let replica = Replica::start(launch_of(&dirs, "true", ports.0), dirs.files.clone()).await;
    let output = tokio::process::Command::new(POD_RUN)
        .env_clear()
        .env("PATH", PATH)
        .env(pod::ENV_ENDPOINT, &replica.endpoint)
        .env(pod::ENV_KEY, "agr_wrong")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refused the launch connection: no run has this key"),
        "{stderr}"
    );
    assert_eq!(
        replica.hellos.lock().unwrap().clone(),
        vec![(Channel::Launch, false)]
    );
    assert!(!dirs.workdir.exists(), "nothing was unpacked");
}
