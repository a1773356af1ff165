//! A sandboxed run's own network (docs/security.md#network): through [`LocalRunner`] with a
//! test [`Network`] that serves the run's two Unix sockets with a tiny HTTP/1 responder, the
//! forwarder of this crate (`agentry-sandbox-net`) and bubblewrap. From inside the sandbox
//! the gateway and the proxy answer on the sandbox's loopback and nothing else is reachable
//! (not a server on the host's loopback; no route, no interface but `lo`); the agent holds
//! the run's key, never the service's; a cancel, an exit code and a budget stop pass through
//! the forwarder. The forwarder itself is also run on its own (no sandbox needed). No test
//! sends anything off the machine.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use agentry_runner::agent::ServiceEnv;
use agentry_runner::network::{
    GATEWAY_SOCKET, Network, OpenFuture, PROXY_SOCKET, RunInfo, RunMeter, RunNetwork,
};
use agentry_runner::process::Ended;
use agentry_runner::{
    AgentOutcome, AgentSpec, Execution, Job, LocalConfig, LocalRunner, NetworkConfig, Sandbox,
    SandboxMode, Verdict,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use uuid::Uuid;

use crate::sandbox::{
    Rig, assert_pushed, assert_stopped_agent_reported, assert_verdict, failure, processes_with_env,
    run, sandbox_works_here, start, wait_for_init, wait_for_no_process_with,
};

/// The forwarder built with this crate.
const FORWARDER: &str = env!("CARGO_BIN_EXE_agentry-sandbox-net");

/// How long anything in these tests may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Awaits `io`, which must end within [`DEADLINE`] and succeed; `what` names it.
async fn within_deadline<T, E: std::fmt::Debug>(
    what: &str,
    io: impl Future<Output = Result<T, E>>,
) -> T {
    tokio::time::timeout(DEADLINE, io)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// The credential the service holds, which no agent with a network may ever see.
const SERVICE_KEY: &str = "sk-ant-service-secret-0f3c";

/// A run's network as the test network opened it.
#[derive(Debug, Clone)]
struct Opened {
    run: RunInfo,
    dir: PathBuf,
    key: String,
    meter: Arc<RunMeter>,
    /// Set once the [`RunNetwork`] was dropped.
    closed: Arc<AtomicBool>,
}

/// Serves each run's sockets with [`respond`]; refuses to open any when `refuse` is set.
#[derive(Debug, Default)]
pub(crate) struct TestNetwork {
    refuse: Option<String>,
    opened: Mutex<Vec<Opened>>,
}

impl TestNetwork {
    fn opened(&self) -> Vec<Opened> {
        self.opened.lock().unwrap().clone()
    }
}

/// Aborts the listeners of a run and marks it closed when dropped.
struct Listening {
    tasks: Vec<tokio::task::AbortHandle>,
    closed: Arc<AtomicBool>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Network for TestNetwork {
    fn open<'a>(&'a self, run: &'a RunInfo, dir: &'a Path) -> OpenFuture<'a> {
        Box::pin(async move {
            if let Some(why) = &self.refuse {
                return Err(why.clone());
            }
            let empty = std::fs::read_dir(dir).map_err(|e| e.to_string())?.count() == 0;
            let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
            assert!(empty && mode == 0o700, "{}: {mode:o}", dir.display());
            let mut tasks = Vec::new();
            for (socket, name) in [(GATEWAY_SOCKET, "gateway"), (PROXY_SOCKET, "proxy")] {
                let listener = UnixListener::bind(dir.join(socket)).map_err(|e| e.to_string())?;
                let task = tokio::spawn(async move {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            return;
                        };
                        tokio::spawn(respond(stream, name));
                    }
                });
                tasks.push(task.abort_handle());
            }
            let key = format!("run-key-{}", Uuid::new_v4().simple());
            let meter = Arc::new(RunMeter::default());
            let closed = Arc::new(AtomicBool::new(false));
            self.opened.lock().unwrap().push(Opened {
                run: run.clone(),
                dir: dir.to_owned(),
                key: key.clone(),
                meter: Arc::clone(&meter),
                closed: Arc::clone(&closed),
            });
            Ok(RunNetwork {
                key,
                meter,
                guard: Box::new(Listening { tasks, closed }),
            })
        })
    }
}

/// A tiny HTTP/1 server: reads the request head and answers `200` with the body `NAME
/// METHOD PATH`, then closes.
async fn respond<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(stream: S, name: &str) {
    let mut stream = tokio::io::BufReader::new(stream);
    let mut request_line = String::new();
    if stream.read_line(&mut request_line).await.is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        match stream.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" || line == "\n" => break,
            Ok(_) => {}
        }
    }
    let mut words = request_line.split_whitespace();
    let body = format!(
        "{name} {} {}",
        words.next().unwrap_or("?"),
        words.next().unwrap_or("?")
    );
    let response = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n{body}",
        body.len()
    );
    let stream = stream.get_mut();
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A TCP server on the host's loopback (a random port) answering as [`respond`] does, and
/// how many connections it accepted.
pub(crate) async fn host_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(respond(stream, "host"));
        }
    });
    (port, accepted)
}

/// `network` as a runner's, with `forwarder` run in the sandbox.
pub(crate) fn network_config(network: &Arc<TestNetwork>, forwarder: &str) -> Option<NetworkConfig> {
    Some(NetworkConfig {
        provider: Arc::clone(network) as Arc<dyn Network>,
        forwarder: vec![forwarder.to_owned()],
    })
}

/// A rig with a sandboxed runner metered by a new [`TestNetwork`] ([`metered_runner`]), or
/// `None` where the sandbox does not work.
fn metered_rig() -> Option<(Rig, Arc<TestNetwork>, Arc<LocalRunner>)> {
    if !sandbox_works_here() {
        return None;
    }
    let rig = Rig::new();
    let network = Arc::new(TestNetwork::default());
    let runner = metered_runner(&rig, &network, Sandbox::new(SandboxMode::Auto));
    Some((rig, network, runner))
}

/// A metered run of a new task's job "Do it", as `adjust` changed it, which must have
/// pushed, sandboxed and metered: the rig, the network, the job and what the run gave;
/// `None` where sandboxing does not work.
async fn metered_run(
    adjust: impl FnOnce(&mut Job),
) -> Option<(Rig, Arc<TestNetwork>, Job, Execution)> {
    let (rig, network, runner) = metered_rig()?;
    let mut job = rig.job(Uuid::new_v4(), "Do it");
    adjust(&mut job);
    let execution = run(&runner, job.clone()).await;
    assert_pushed(&execution);
    assert!(execution.sandboxed && execution.metered);
    Some((rig, network, job, execution))
}

/// A sandboxed runner of `rig` with `network`, the service holding [`SERVICE_KEY`] (and an
/// OpenAI key, and a corporate proxy passed to agents).
fn metered_runner(rig: &Rig, network: &Arc<TestNetwork>, sandbox: Sandbox) -> Arc<LocalRunner> {
    Arc::new(LocalRunner::new(LocalConfig {
        env: ServiceEnv {
            path: Some(crate::support::PATH.into()),
            credentials: vec![
                ("ANTHROPIC_API_KEY".into(), SERVICE_KEY.into()),
                ("OPENAI_API_KEY".into(), format!("{SERVICE_KEY}-openai")),
            ],
            passed: vec![
                (
                    "HTTPS_PROXY".into(),
                    "http://corp-proxy.invalid:3128".into(),
                ),
                (
                    "ANTHROPIC_BASE_URL".into(),
                    "https://api.anthropic.com".into(),
                ),
            ],
        },
        network: network_config(network, FORWARDER),
        ..rig.config(sandbox)
    }))
}

/// What [`network_checker`] wrote for `task` of `rig`: the gateway and the proxy reached
/// through the forwarder, the host's server not, no route and no interface but `lo`.
pub(crate) fn assert_only_gateway_and_proxy(rig: &Rig, task: Uuid) {
    let seen = std::fs::read_to_string(rig.home(task).join("net")).unwrap();
    assert_eq!(
        seen,
        "gateway reached: gateway GET /v1/messages\n\
         proxy reached: proxy GET /\n\
         host unreachable\n\
         routes 0\n\
         interfaces lo \n"
    );
}

/// An agent (posing as Claude Code) that checks what the network inside its sandbox
/// reaches and writes it to `$HOME/net`: the gateway and the proxy through the forwarder,
/// the host's server on `host_port`, the routes and the interfaces. Then it succeeds
/// without changing anything.
pub(crate) fn network_checker(rig: &Rig, host_port: u16) -> PathBuf {
    rig.program(
        "netcheck",
        &format!(
            r#"#!/bin/bash
if [ "${{1:-}}" = --version ]; then echo "2.1.197 (Claude Code)"; exit 0; fi
cat >/dev/null
out="$HOME/net"
: >"$out"
probe() {{
	if answer=$(timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$2 && printf 'GET $3 HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && cat <&3" 2>/dev/null); then
		printf '%s reached: %s\n' "$1" "$(printf '%s\n' "$answer" | tail -n 1)" >>"$out"
	else
		printf '%s unreachable\n' "$1" >>"$out"
	fi
}}
probe gateway 4810 /v1/messages
probe proxy 4811 /
probe host {host_port} /
printf 'routes %s\n' "$(tail -n +2 /proc/net/route | grep -c .)" >>"$out"
printf 'interfaces %s\n' "$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')" >>"$out"
printf '{{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"checked","total_cost_usd":0.01,"modelUsage":{{}}}}\n'
"#
        ),
    )
}

/// Inside the sandbox only the gateway and the proxy answer (through the forwarder, on the
/// sandbox's own loopback): the host's loopback server is not reached, there is no route
/// and no interface but `lo`. The same agent without a network reaches the host's server,
/// so the check itself works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_sandbox_only_the_gateway_and_the_proxy_are_reachable() {
    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    let (host_port, accepted) = host_server().await;
    let checker = network_checker(&rig, host_port);
    let network = Arc::new(TestNetwork::default());
    let runner = Arc::new(LocalRunner::new(LocalConfig {
        claude_bin: checker.clone(),
        network: network_config(&network, FORWARDER),
        ..rig.config(Sandbox::new(SandboxMode::Auto))
    }));
    let task = Uuid::new_v4();
    let execution = run(&runner, rig.job(task, "Check the network")).await;
    assert_verdict(&execution, Verdict::NoChanges);
    assert!(execution.sandboxed && execution.metered);
    assert_only_gateway_and_proxy(&rig, task);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    let opened = network.opened();
    assert_eq!(opened.len(), 1);
    assert!(
        opened[0].closed.load(Ordering::SeqCst),
        "the network was not closed"
    );

    // The control: sandboxed without a network, the host's server answers.
    let shared = rig.agent_runner(Sandbox::new(SandboxMode::Auto), &checker);
    let task = Uuid::new_v4();
    let execution = run(&shared, rig.job(task, "Check the network")).await;
    assert_verdict(&execution, Verdict::NoChanges);
    assert!(execution.sandboxed && !execution.metered);
    let seen = std::fs::read_to_string(rig.home(task).join("net")).unwrap();
    assert!(seen.contains("host reached: host GET /\n"), "{seen}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// The variables of an `env` dump, `NAME=value` per line.
fn env_lines(home: &Path) -> Vec<String> {
    std::fs::read_to_string(home.join("env"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Asserts `SERVICE_KEY` appears nowhere the agent could have shown it.
fn assert_no_service_key(home: &Path, execution: &Execution) {
    for name in ["env", "args"] {
        let text = std::fs::read_to_string(home.join(name)).unwrap();
        assert!(!text.contains(SERVICE_KEY), "{name}: {text}");
    }
    assert!(
        !execution.output.contains(SERVICE_KEY),
        "{}",
        execution.output
    );
}

/// A metered Claude Code holds the run's key, the gateway as its API and the proxy, none
/// of the service's credentials, base URL or proxy; its network was opened for its run and
/// closed once it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_claude_holds_the_run_key_and_not_the_service_credential() {
    let Some((rig, network, job, execution)) = metered_run(|_| {}).await else {
        return;
    };
    let task = job.task_id;
    let opened = network.opened();
    assert_eq!(opened.len(), 1);
    let opened = &opened[0];
    assert_eq!(
        (
            opened.run.task_id,
            opened.run.attempt,
            opened.run.repo_key.as_str()
        ),
        (task, 1, "repo-1")
    );
    assert_eq!(opened.run.agent, job.agent);
    assert_eq!(opened.dir, rig.home(task).parent().unwrap().join("net"));
    assert!(opened.closed.load(Ordering::SeqCst));
    let home = rig.home(task);
    let env = env_lines(&home);
    for wanted in [
        format!("ANTHROPIC_API_KEY={}", opened.key),
        "ANTHROPIC_BASE_URL=http://127.0.0.1:4810".to_owned(),
        "HTTPS_PROXY=http://127.0.0.1:4811".to_owned(),
        "HTTP_PROXY=http://127.0.0.1:4811".to_owned(),
        "https_proxy=http://127.0.0.1:4811".to_owned(),
        "http_proxy=http://127.0.0.1:4811".to_owned(),
        "NO_PROXY=127.0.0.1,localhost".to_owned(),
        "no_proxy=127.0.0.1,localhost".to_owned(),
    ] {
        assert!(env.contains(&wanted), "{wanted} missing: {env:#?}");
    }
    for name in ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "HTTPS_PROXY"] {
        let set = env
            .iter()
            .filter(|l| l.starts_with(&format!("{name}=")))
            .count();
        assert_eq!(set, 1, "{name}: {env:#?}");
    }
    assert!(
        !env.iter()
            .any(|l| l.contains("corp-proxy") || l.contains("OPENAI")),
        "{env:#?}"
    );
    assert_no_service_key(&home, &execution);
    // The fake says where its key came from, as Claude Code does.
    assert!(
        execution
            .output
            .contains("\"apiKeySource\":\"ANTHROPIC_API_KEY\""),
        "{}",
        execution.output
    );
}

/// A metered Codex gets the run's key as `CODEX_API_KEY` and the gateway as its
/// `openai_base_url` (on its command line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_codex_gets_the_run_key_and_the_gateway_base_url() {
    let Some((rig, network, job, execution)) = metered_run(|job| {
        job.agent = AgentSpec::unlimited(AgentType::Codex, "gpt-5-codex");
    })
    .await
    else {
        return;
    };
    let task = job.task_id;
    let key = network.opened()[0].key.clone();
    let home = rig.home(task);
    let env = env_lines(&home);
    assert!(env.contains(&format!("CODEX_API_KEY={key}")), "{env:#?}");
    assert!(
        env.contains(&"OPENAI_BASE_URL=http://127.0.0.1:4810/v1".to_owned()),
        "{env:#?}"
    );
    assert!(
        env.contains(&"HTTPS_PROXY=http://127.0.0.1:4811".to_owned()),
        "{env:#?}"
    );
    assert!(!env.iter().any(|l| l.starts_with("ANTHROPIC_")), "{env:#?}");
    let args = std::fs::read_to_string(home.join("args")).unwrap();
    assert!(
        args.lines()
            .any(|a| a == "openai_base_url=\"http://127.0.0.1:4810/v1\""),
        "{args}"
    );
    assert_no_service_key(&home, &execution);
}

/// A cancelled metered run ends as before: the stop reaches the agent through the
/// forwarder (which outlives it), the agent prints what it spent, nothing is left running
/// and the network is closed. An agent's exit code passes through the forwarder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_metered_run_still_reports_and_exit_codes_pass_through() {
    let Some((rig, network, runner)) = metered_rig() else {
        return;
    };
    let task = Uuid::new_v4();
    let mut started = start(&runner, rig.job(task, "Sleep\n[fake:sleep=300]"));
    (&mut started.started).await.unwrap();
    wait_for_init(&runner, task).await;
    let home = format!("HOME={}", rig.home(task).display());
    let pids = processes_with_env(&home);
    let cmdlines: Vec<String> = pids
        .iter()
        .map(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default()
        })
        .collect();
    assert!(
        cmdlines.iter().any(|c| c.starts_with(FORWARDER)),
        "the forwarder runs: {cmdlines:#?}"
    );
    started.cancel.send(true).unwrap();
    let execution = started.handle.await.unwrap();
    assert_eq!(execution.verdict, Verdict::Cancelled);
    assert!(execution.sandboxed && execution.metered);
    assert_stopped_agent_reported(&execution);
    wait_for_no_process_with(&home).await;
    assert!(network.opened()[0].closed.load(Ordering::SeqCst));

    let task = Uuid::new_v4();
    let execution = run(&runner, rig.job(task, "Fail\n[fake:fail][fake:exit=7]")).await;
    assert!(
        matches!(&execution.verdict, Verdict::Failed(m) if m.contains("fake:fail")),
        "{:?}",
        execution.verdict
    );
    assert_eq!(execution.exit_code(), Some(7));
}

/// Once the gateway marks the run's meter exhausted (it refused a call for the run's
/// budget), the run is stopped as at its allowance, with what the gateway metered as its
/// cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_meter_stops_the_run_at_its_budget() {
    let Some((rig, network, runner)) = metered_rig() else {
        return;
    };
    let task = Uuid::new_v4();
    let mut job = rig.job(task, "Sleep\n[fake:sleep=300]");
    job.agent.max_budget_usd = Some(Usd::parse("0.5").unwrap());
    let mut started = start(&runner, job);
    (&mut started.started).await.unwrap();
    wait_for_init(&runner, task).await;
    let meter = Arc::clone(&network.opened()[0].meter);
    meter.add(Usd::parse("0.42").unwrap());
    meter.exhaust();
    let execution = within_deadline("the exhausted run", started.handle).await;
    drop(started.cancel);
    assert_eq!(execution.ended, Some(Ended::Stopped));
    let message = failure(&execution);
    assert!(
        message.starts_with("budget reached")
            && message.contains("its priced usage reached 0.42 USD; this run's limit was 0.5 USD"),
        "{message}"
    );
    assert!(execution.metered);
    let report = execution.report.as_ref().unwrap();
    assert_eq!(report.outcome, AgentOutcome::MaxBudget);
    // The stop reached the agent through the forwarder: it printed its result.
    assert!(
        execution.output.contains("\"error_during_execution\""),
        "{}",
        execution.output
    );
}

/// A network that cannot be opened fails the run before anything is prepared or started;
/// an unsandboxed runner never opens one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_that_cannot_open_fails_the_run_before_it_starts() {
    let rig = Rig::new();
    let refusing = Arc::new(TestNetwork {
        refuse: Some("the gateway is not listening".into()),
        ..TestNetwork::default()
    });
    let unsandboxed = metered_runner(&rig, &refusing, Sandbox::new(SandboxMode::Off));
    let execution = run(&unsandboxed, rig.job(Uuid::new_v4(), "Do it")).await;
    assert!(
        matches!(execution.verdict, Verdict::Pushed { .. }),
        "{:?}",
        execution.verdict
    );
    assert!(!execution.sandboxed && !execution.metered);

    if !sandbox_works_here() {
        return;
    }
    let rig = Rig::new();
    let runner = metered_runner(&rig, &refusing, Sandbox::new(SandboxMode::Auto));
    let started = start(&runner, rig.job(Uuid::new_v4(), "Do it"));
    let execution = started.handle.await.unwrap();
    assert_eq!(
        execution.verdict,
        Verdict::Failed(
            "could not open the agent's network: the gateway is not listening".to_owned()
        )
    );
    assert!(execution.sandboxed && !execution.metered);
    assert!(execution.ended.is_none() && execution.report.is_none());
    assert!(started.started.await.is_err(), "the start signal fired");
    assert!(!rig.root.join("workspaces").exists());
}

// The forwarder on its own.

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The forwarder with `args`, its stdout and stderr piped, in a process group of its own.
fn forwarder(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(FORWARDER)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Its exit code, stdout and stderr, within [`DEADLINE`].
async fn finish(child: tokio::process::Child) -> (Option<i32>, String, String) {
    let out = within_deadline("the forwarder", child.wait_with_output()).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Connections to the port reach the socket and back (the server's close is passed on);
/// the program's output and exit code are the forwarder's.
#[tokio::test]
async fn the_forwarder_passes_connections_and_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gw.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(respond(stream, "gateway"));
        }
    });
    let port = free_port();
    let listen = format!("{port}={}", socket.display());
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'POST /v1/messages HTTP/1.1\\r\\n\\r\\n' \
         >&3 && cat <&3 && echo && exit 3"
    );
    let child = forwarder(&["--listen", &listen, "--", "bash", "-c", &script]);
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stdout.ends_with("\r\n\r\ngateway POST /v1/messages\n"),
        "{stdout}"
    );
}

/// The forwarder outlives `SIGTERM`, `SIGHUP` and the `SIGINT` its process group gets;
/// the program is not made to ignore them (its own trap runs and it reports); a program
/// killed by a signal gives 128 + its number.
#[tokio::test]
async fn the_forwarder_outlives_the_stop_signals_and_reports_the_programs_death() {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("{}={}", free_port(), dir.path().join("none.sock").display());
    let mut child = forwarder(&[
        "--listen",
        &listen,
        "--",
        "bash",
        "-c",
        // A foreground sleep: it dies of the group's SIGINT, then the trap runs, and no
        // background child is left holding stdout open.
        "trap 'echo interrupted; exit 0' INT; echo ready; while :; do sleep 0.1; done",
    ]);
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    within_deadline("the first line", stdout.read_line(&mut line)).await;
    assert_eq!(line, "ready\n");
    kill(pid, Signal::SIGTERM).unwrap();
    kill(pid, Signal::SIGHUP).unwrap();
    killpg(pid, Signal::SIGINT).unwrap();
    let mut rest = String::new();
    within_deadline("the rest of the output", stdout.read_to_string(&mut rest)).await;
    assert_eq!(rest, "interrupted\n");
    let status = within_deadline("the forwarder", child.wait()).await;
    assert_eq!(status.code(), Some(0), "{status:?}");

    let child = forwarder(&["--listen", &listen, "--", "sh", "-c", "kill -TERM $$"]);
    let (code, _, stderr) = finish(child).await;
    assert_eq!(code, Some(128 + 15), "{stderr}");
}

/// Its own failures: one line on stderr and 125 (arguments, a port it cannot bind), 126 (a
/// program it cannot execute) or 127 (no such program).
#[tokio::test]
async fn the_forwarder_fails_with_a_line_and_a_code() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock").display().to_string();
    let not_executable = dir.path().join("plain");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let listen = format!("{}={socket}", free_port());
    let taken_listen = format!("{taken_port}={socket}");
    for (args, code, why) in [
        (
            vec!["--listen", "80", "--", "true"],
            125,
            "bad --listen value",
        ),
        (
            vec!["--rlimit", "CPU=1", "--", "true"],
            125,
            "unknown --rlimit \"CPU\"",
        ),
        (
            vec!["--listen", &taken_listen, "--", "true"],
            125,
            "cannot listen on 127.0.0.1:",
        ),
        (
            vec!["--listen", &listen, "--", not_executable.to_str().unwrap()],
            126,
            "cannot run",
        ),
        (
            vec!["--listen", &listen, "--", "/nonexistent/agent"],
            127,
            "cannot run /nonexistent/agent",
        ),
    ] {
        let (got, stdout, stderr) = finish(forwarder(&args)).await;
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(
            stderr.starts_with("agentry sandbox-net: ")
                && stderr.contains(why)
                && stderr.lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
    drop(taken);
}
