//! Benchmark of the model gateway's added latency and memory (docs/contract.md#68-model-gateway;
//! docs/benchmarks.md).
//!
//! Everything runs in this process: a fast fake Anthropic upstream on 127.0.0.1 (HTTP/1.1,
//! keep-alive, `TCP_NODELAY`) that answers `POST /v1/messages` with a streamed answer
//! (`text/event-stream`, chunked: `message_start` with usage, text deltas, `message_delta`
//! with usage, `message_stop`; ~4.7 KB in 8 chunks, each its own write), the real
//! [`Gateway`] over a fresh SQLite database (a task row, one open run), and one HTTP/1.1
//! client (hyper's connection-level client, keep-alive) used both ways.
//!
//! 1. **Added latency.** `--calls` streamed calls (default 1,000) straight to the upstream
//!    over TCP, and as many through the gateway over the run's Unix socket with the run key
//!    in `x-api-key` (the upstream checks that the real key arrives), one at a time, in
//!    alternating blocks of `--block` calls (default 50) so machine noise hits both alike,
//!    after 100 warm-up calls each way. For each call: the time to the first byte of the body
//!    (the first SSE chunk) and to its end. `--request-kb N` pads the request body to N KiB
//!    (default: a ~150-byte body).
//! 2. **Memory per concurrent streamed call.** `--concurrency` calls (default 200) through
//!    the gateway, each on its own connection, whose upstream holds the answer open after
//!    the first chunk; VmRSS of the process (/proc/self/status) before and while all are
//!    open, divided by their number. The figure includes the in-process client's and fake
//!    upstream's share of each call, so the same is measured for direct calls in a fresh
//!    child process (this binary with `--memory-baseline`) and subtracted: the rest is the
//!    gateway's own share. Then the calls are released and each is checked to be complete.
//! 3. Every metered call must be in the database afterwards, `completed`.
//!
//! Prints a table and, last, one JSON line with the figures.
//!
//! ```text
//! cargo run --release -p agentry-agent-network --example bench_gateway -- \
//!     [--calls 1000] [--concurrency 200] [--block 50] [--request-kb 0]
//! ```

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentry_agent_network::gateway::{Gateway, GatewayConfig, MAX_CONNECTIONS_PER_RUN, RunGate};
use agentry_domain::{AgentType, RepoUrl, Usd};
use agentry_persistence::metering;
use agentry_persistence::repos::{self, NewRepository};
use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::tasks::{self, NewTask};
use agentry_persistence::test_support::TestDb;
use agentry_runner::network::RunInfo;
use agentry_runner::{AgentSpec, PriceTable};
use agentry_testkit::stats::quantile;
use bytes::Bytes;
use clap::builder::RangedU64ValueParser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The upstream's real key: the gateway puts it in place of the run key.
const REAL_KEY: &str = "sk-ant-benchmark-real-upstream-key";

/// The model of every call (in the built-in price table, so each call is priced).
const MODEL: &str = "claude-sonnet-5";

/// The request header asking the fake upstream to hold the answer after its first chunk
/// until released (passed on by the gateway like any other header).
const HOLD: &str = "x-bench-hold";

/// Warm-up calls each way before the measured ones.
const WARMUP: usize = 100;

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Streamed calls measured each way.
    #[arg(long, default_value_t = 1000, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    calls: usize,
    /// Calls held open at once for the memory figure.
    #[arg(long, default_value_t = 200, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    concurrency: usize,
    /// Calls per measured block.
    #[arg(long, default_value_t = 50, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    block: usize,
    /// KiB of padding in each request body.
    #[arg(long, default_value_t = 0)]
    request_kb: usize,
    /// Internal: only measure direct held calls' memory (in a fresh process) and print it.
    #[arg(long, hide = true)]
    memory_baseline: bool,
}

// ---------------------------------------------------------------------------------------
// The fake upstream
// ---------------------------------------------------------------------------------------

/// The streamed answer's SSE events, grouped into the chunks the upstream writes.
fn answer_events() -> Vec<String> {
    let start = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_01BenchGateway\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"{MODEL}\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":1200,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":24000,\"output_tokens\":1}}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: ping\ndata: {{\"type\": \"ping\"}}\n\n"
    );
    let text = "The failing test expects the parser to accept a trailing comma in the list of \
                arguments; the grammar rejects it because the rule for the argument list ends \
                at the last expression. Allowing an optional comma there fixes it. ";
    let delta = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"
    );
    let mut chunks = vec![start];
    for _ in 0..6 {
        chunks.push(delta.repeat(2));
    }
    chunks.push(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
         event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":600}}\n\n\
         event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
            .to_owned(),
    );
    chunks
}

/// The bytes the upstream writes, one element per write: the head with the first chunk,
/// the middle chunks, and the last chunk with the end of the chunked body.
fn answer_writes(events: &[String]) -> Vec<Bytes> {
    let chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    let last = events.len() - 1;
    events
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut out = String::new();
            if i == 0 {
                out.push_str(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\
                     cache-control: no-cache\r\nrequest-id: req_bench\r\n\
                     transfer-encoding: chunked\r\n\r\n",
                );
            }
            out.push_str(&chunk(text));
            if i == last {
                out.push_str("0\r\n\r\n");
            }
            Bytes::from(out)
        })
        .collect()
}

/// The fake upstream: its address, its requests so far, and the switch that releases held
/// answers.
struct Upstream {
    addr: std::net::SocketAddr,
    requests: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

async fn start_upstream(writes: Arc<Vec<Bytes>>) -> Result<Upstream, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let requests = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let counter = requests.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve_upstream(
                stream,
                writes.clone(),
                counter.clone(),
                released.clone(),
            ));
        }
    });
    Ok(Upstream {
        addr,
        requests,
        release,
    })
}

/// One keep-alive connection of the upstream.
async fn serve_upstream(
    stream: TcpStream,
    writes: Arc<Vec<Bytes>>,
    requests: Arc<AtomicUsize>,
    mut released: watch::Receiver<bool>,
) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let mut body = Vec::new();
    loop {
        let (mut length, mut key_ok, mut hold) = (0_usize, false, false);
        loop {
            line.clear();
            match stream.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("x-api-key") {
                    key_ok = value == REAL_KEY;
                } else if name.eq_ignore_ascii_case(HOLD) {
                    hold = true;
                }
            }
        }
        body.resize(length, 0);
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        requests.fetch_add(1, Ordering::Relaxed);
        let out = stream.get_mut();
        if !key_ok {
            let text = r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                text.len()
            );
            if out.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        for (i, bytes) in writes.iter().enumerate() {
            if out.write_all(bytes).await.is_err() {
                return;
            }
            if i == 0 && hold && released.wait_for(|&r| r).await.is_err() {
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------

/// One keep-alive HTTP/1.1 connection, to the upstream or to the gateway.
struct Client {
    send: SendRequest<Full<Bytes>>,
    key: String,
}

/// What one call took.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// Until the first byte of the body.
    ttfb: Duration,
    /// Until the end of the body.
    total: Duration,
}

impl Client {
    async fn tcp(addr: std::net::SocketAddr, key: &str) -> Result<Client, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Client::over(stream, key).await
    }

    async fn unix(path: &Path, key: &str) -> Result<Client, Error> {
        Client::over(UnixStream::connect(path).await?, key).await
    }

    async fn over<S>(stream: S, key: &str) -> Result<Client, Error>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Client {
            send,
            key: key.to_owned(),
        })
    }

    /// One streamed model call; `first` is told when the first body chunk has arrived.
    /// Checks the answer is `200` and exactly `expected` bytes long.
    async fn call(
        &mut self,
        body: &Bytes,
        expected: usize,
        hold: bool,
        first: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<Timing, Error> {
        self.send.ready().await?;
        let mut request = hyper::Request::post("/v1/messages")
            .header(hyper::header::HOST, "api.anthropic.com")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "text/event-stream")
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", self.key.as_str());
        if hold {
            request = request.header(HOLD, "1");
        }
        let request = request.body(Full::new(body.clone()))?;
        let started = Instant::now();
        let response = self.send.send_request(request).await?;
        if response.status() != hyper::StatusCode::OK {
            let status = response.status();
            let text = response.into_body().collect().await?.to_bytes();
            return Err(format!("answer {status}: {}", String::from_utf8_lossy(&text)).into());
        }
        let mut body = response.into_body();
        let mut ttfb = None;
        let mut first = first;
        let mut received = 0;
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame?.data_ref() {
                if data.is_empty() {
                    continue;
                }
                if ttfb.is_none() {
                    ttfb = Some(started.elapsed());
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                }
                received += data.len();
            }
        }
        let total = started.elapsed();
        if received != expected {
            return Err(format!("the answer has {received} bytes, not {expected}").into());
        }
        Ok(Timing {
            ttfb: ttfb.unwrap_or(total),
            total,
        })
    }
}

/// The request body: a streamed model call, its user message padded to `kb` KiB.
fn request_body(kb: usize) -> Bytes {
    let sentence = "Fix the failing test in the parser and explain the change. ";
    let content = if kb == 0 {
        sentence.to_owned()
    } else {
        sentence.repeat(kb * 1024 / sentence.len() + 1)
    };
    let body = serde_json::json!({
        "model": MODEL,
        "max_tokens": 8192,
        "stream": true,
        "messages": [{"role": "user", "content": content}],
    });
    Bytes::from(body.to_string())
}

// ---------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------

/// The resident set of this process, in KiB.
fn rss_kib() -> Result<u64, Error> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// p50, p90, p99 and max (nearest rank) of `values`, in ms.
#[derive(Debug, Clone, Copy)]
struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Stats {
    fn of(values: &[Duration]) -> Stats {
        let mut ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let mut rank = |q: f64| quantile(&mut ms, q).unwrap_or(f64::NAN);
        Stats {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: rank(1.0),
        }
    }

    fn json(&self) -> serde_json::Value {
        let r = |v: f64| (v * 1000.0).round() / 1000.0;
        serde_json::json!({"p50": r(self.p50), "p90": r(self.p90), "p99": r(self.p99), "max": r(self.max)})
    }
}

// ---------------------------------------------------------------------------------------
// The phases
// ---------------------------------------------------------------------------------------

/// The database, with the task the gateway's run belongs to.
fn database() -> Result<(TestDb, Uuid), Error> {
    let test_db = TestDb::sqlite();
    let mut conn = test_db.db.conn()?;
    let now = agentry_persistence::now();
    let (repo, _) = repos::connect_repository(
        &mut conn,
        &NewRepository {
            url: RepoUrl::parse("https://github.com/acme/web")?,
            default_branch: "main".into(),
            clone_url: "https://github.com/acme/web.git".into(),
            codehost_id: Some(1),
        },
        now,
    )?;
    let task_id = Uuid::new_v4();
    tasks::create_task(
        &mut conn,
        &NewTask {
            id: task_id,
            title: "gateway benchmark".into(),
            ..agentry_persistence::test_support::coding_task(&repo, now)
        },
        "created",
    )?;
    Ok((test_db, task_id))
}

/// Opens `n` streamed calls at once (each on its own connection, made by `connect`) whose
/// answers the upstream holds after the first chunk; returns the RSS growth (KiB) while all
/// are open, after releasing them and checking every one completed.
async fn held_calls<F, Fut>(
    n: usize,
    connect: F,
    body: &Bytes,
    expected: usize,
    upstream: &Upstream,
) -> Result<u64, Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Client, Error>> + Send + 'static,
{
    upstream.release.send_replace(false);
    let before = rss_kib()?;
    let mut calls = tokio::task::JoinSet::new();
    let mut firsts = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = tokio::sync::oneshot::channel();
        firsts.push(rx);
        let connecting = connect();
        let body = body.clone();
        calls.spawn(async move {
            let mut client = connecting.await?;
            client.call(&body, expected, true, Some(tx)).await
        });
    }
    for first in firsts {
        tokio::time::timeout(Duration::from_secs(30), first)
            .await
            .map_err(|_| "a held call got no first chunk within 30 s")?
            .map_err(|_| "a held call failed before its first chunk")?;
    }
    // Let every connection settle (buffers allocated, tasks parked) before reading.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let during = rss_kib()?;
    upstream.release.send_replace(true);
    let mut completed = 0;
    while let Some(joined) = calls.join_next().await {
        joined??;
        completed += 1;
    }
    if completed != n {
        return Err(format!("{completed} of {n} held calls completed").into());
    }
    Ok(during.saturating_sub(before))
}

/// `--memory-baseline`: the RSS growth of `n` held calls straight to the upstream, in a
/// fresh process; prints `{"rss_delta_kib": …}`.
async fn memory_baseline(a: &Args) -> Result<(), Error> {
    let events = answer_events();
    let expected: usize = events.iter().map(String::len).sum();
    let upstream = start_upstream(Arc::new(answer_writes(&events))).await?;
    let body = request_body(a.request_kb);
    let mut warm = Client::tcp(upstream.addr, REAL_KEY).await?;
    for _ in 0..WARMUP {
        warm.call(&body, expected, false, None).await?;
    }
    let addr = upstream.addr;
    let delta = held_calls(
        a.concurrency,
        || Client::tcp(addr, REAL_KEY),
        &body,
        expected,
        &upstream,
    )
    .await?;
    println!("{}", serde_json::json!({ "rss_delta_kib": delta }));
    Ok(())
}

/// Runs the memory baseline in a fresh child process and returns its RSS growth (KiB).
fn child_baseline(a: &Args) -> Result<u64, Error> {
    let output = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--memory-baseline",
            "--concurrency",
            &a.concurrency.to_string(),
            "--request-kb",
            &a.request_kb.to_string(),
        ])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "the memory baseline failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .last()
        .ok_or("the memory baseline printed nothing")?;
    let value: serde_json::Value = serde_json::from_str(line)?;
    value["rss_delta_kib"]
        .as_u64()
        .ok_or_else(|| format!("unexpected memory baseline output: {line}").into())
}

/// The gateway under test, over a fresh database with one task, calling `upstream`; and
/// the first run of that task.
async fn start_gateway(upstream: &Upstream) -> Result<(Gateway, TestDb, RunInfo), Error> {
    let (test_db, task_id) = database()?;
    let base = url::Url::parse(&format!("http://{}", upstream.addr))?;
    let gateway = Gateway::new(
        GatewayConfig {
            anthropic_upstream: base.clone(),
            openai_upstream: base.join("/v1")?,
            anthropic_key: Some(SecretValue::new(REAL_KEY)),
            openai_key: None,
            body_timeout: agentry_agent_network::gateway::BODY_TIMEOUT,
        },
        PriceTable::builtin(),
        test_db.db.clone(),
        MasterKey::generate()?,
    )?;
    let run = RunInfo {
        task_id,
        attempt: 1,
        repo_key: String::new(),
        agent: AgentSpec {
            agent_type: AgentType::ClaudeCode,
            model: MODEL.into(),
            max_turns: None,
            // An allowance far from reached: the budget check runs on every call.
            max_budget_usd: Some(Usd::parse("1000000")?),
        },
    };
    Ok((gateway, test_db, run))
}

/// The latency figures: total and first byte, straight to the upstream and through the
/// gateway.
struct Latency {
    direct_total: Stats,
    direct_ttfb: Stats,
    gateway_total: Stats,
    gateway_ttfb: Stats,
}

/// Phase 1, the added latency: after the warm-up, `a.calls` streamed calls each way, one at
/// a time, in alternating blocks of `a.block`.
async fn added_latency(
    a: &Args,
    upstream: &Upstream,
    socket: &Path,
    key: &str,
    body: &Bytes,
    expected: usize,
) -> Result<Latency, Error> {
    let mut direct = Client::tcp(upstream.addr, REAL_KEY).await?;
    let mut through = Client::unix(socket, key).await?;
    for _ in 0..WARMUP {
        direct.call(body, expected, false, None).await?;
        through.call(body, expected, false, None).await?;
    }
    let mut direct_times = Vec::with_capacity(a.calls);
    let mut gateway_times = Vec::with_capacity(a.calls);
    while direct_times.len() < a.calls || gateway_times.len() < a.calls {
        for _ in 0..a.block.min(a.calls - direct_times.len()) {
            direct_times.push(direct.call(body, expected, false, None).await?);
        }
        for _ in 0..a.block.min(a.calls - gateway_times.len()) {
            gateway_times.push(through.call(body, expected, false, None).await?);
        }
    }
    let stats = |times: &[Timing], f: fn(&Timing) -> Duration| {
        Stats::of(&times.iter().map(f).collect::<Vec<_>>())
    };
    Ok(Latency {
        direct_total: stats(&direct_times, |t| t.total),
        direct_ttfb: stats(&direct_times, |t| t.ttfb),
        gateway_total: stats(&gateway_times, |t| t.total),
        gateway_ttfb: stats(&gateway_times, |t| t.ttfb),
    })
}

/// The runs the held calls go through: their sockets, keys, gates and attempts.
type HeldRuns = Vec<(std::path::PathBuf, String, RunGate, i32)>;

/// Phase 2, the memory per concurrent streamed call: `a.concurrency` held calls through the
/// gateway, spread over as many runs (attempts 2, 3, …) as [`MAX_CONNECTIONS_PER_RUN`]
/// needs, opened before the first measurement; returns the RSS growth (KiB) and the runs.
async fn held_through_gateway(
    a: &Args,
    gateway: &Gateway,
    run: &RunInfo,
    dir: &Path,
    upstream: &Upstream,
    body: &Bytes,
    expected: usize,
) -> Result<(u64, HeldRuns), Error> {
    let held_runs = a.concurrency.div_ceil(MAX_CONNECTIONS_PER_RUN);
    let mut held = Vec::with_capacity(held_runs);
    for i in 0..held_runs {
        let socket = dir.join(format!("held-{i}.sock"));
        let attempt = i32::try_from(i + 2)?;
        let (key, _meter, gate) = gateway
            .open_run(
                &RunInfo {
                    attempt,
                    ..run.clone()
                },
                &socket,
                false,
            )
            .await?;
        held.push((socket, key, gate, attempt));
    }
    let targets: Arc<Vec<(std::path::PathBuf, String)>> = Arc::new(
        held.iter()
            .map(|(socket, key, _, _)| (socket.clone(), key.clone()))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let delta = held_calls(
        a.concurrency,
        move || {
            let i = next.fetch_add(1, Ordering::Relaxed) % targets.len();
            let (socket, key) = targets[i].clone();
            async move { Client::unix(&socket, &key).await }
        },
        body,
        expected,
        upstream,
    )
    .await?;
    Ok((delta, held))
}

/// Phase 3: every one of the `metered` calls of `attempts` recorded, completed; returns how
/// many rows there are.
async fn check_recorded(
    gateway: &Gateway,
    test_db: &TestDb,
    task_id: Uuid,
    attempts: impl Iterator<Item = i32>,
    metered: usize,
) -> Result<usize, Error> {
    for attempt in attempts {
        if !gateway
            .drain(task_id, attempt, Duration::from_secs(60))
            .await
        {
            return Err("the gateway's calls were not all written within 60 s".into());
        }
    }
    let mut conn = test_db.db.conn()?;
    let recorded = metering::task_calls(&mut conn, task_id, None)?;
    let completed = recorded.iter().filter(|c| c.outcome == "completed").count();
    if recorded.len() != metered || completed != metered {
        return Err(format!(
            "{} calls recorded ({completed} completed), {metered} expected",
            recorded.len()
        )
        .into());
    }
    Ok(recorded.len())
}

/// Everything the report prints.
struct Figures {
    expected: usize,
    chunks: usize,
    request_bytes: usize,
    latency: Latency,
    gateway_delta: u64,
    baseline_delta: u64,
    metered: usize,
    recorded: usize,
    upstream_requests: usize,
}

/// Phase 4, the report: a table and sentences, then the same as one JSON line.
fn report(a: &Args, f: &Figures) {
    let Latency {
        direct_total,
        direct_ttfb,
        gateway_total,
        gateway_ttfb,
    } = f.latency;
    let per_call = |kib: u64| kib as f64 / a.concurrency as f64;
    let gateway_share = per_call(f.gateway_delta) - per_call(f.baseline_delta);
    let added_p50 = gateway_total.p50 - direct_total.p50;
    let added_p99 = gateway_total.p99 - direct_total.p99;
    let added_ttfb_p50 = gateway_ttfb.p50 - direct_ttfb.p50;
    let added_ttfb_p99 = gateway_ttfb.p99 - direct_ttfb.p99;
    println!(
        "model gateway: {} streamed calls each way, one at a time, in alternating blocks of {} \
         (after {WARMUP} warm-up calls each way)",
        a.calls, a.block
    );
    println!(
        "answer: {} bytes of SSE in {} chunks; request body: {} bytes",
        f.expected, f.chunks, f.request_bytes
    );
    println!();
    println!(
        "{:<26} {:>8} {:>8} {:>8} {:>8}",
        "ms", "p50", "p90", "p99", "max"
    );
    for (name, s) in [
        ("direct, total", direct_total),
        ("gateway, total", gateway_total),
        ("direct, first byte", direct_ttfb),
        ("gateway, first byte", gateway_ttfb),
    ] {
        println!(
            "{name:<26} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            s.p50, s.p90, s.p99, s.max
        );
    }
    println!();
    println!(
        "added by the gateway: total p50 {added_p50:+.3} ms, p99 {added_p99:+.3} ms \
         (target: p99 under 2 ms: {}); first byte p50 {added_ttfb_p50:+.3} ms, p99 \
         {added_ttfb_p99:+.3} ms",
        if added_p99 < 2.0 { "met" } else { "NOT met" }
    );
    println!(
        "memory: {} concurrent streamed calls held open through the gateway: RSS +{:.1} MiB, \
         {:.1} KiB per call (client, gateway and fake upstream, all in this process); the same \
         straight to the upstream in a fresh process: {:.1} KiB per call; the gateway's share: \
         {gateway_share:.1} KiB per call",
        a.concurrency,
        f.gateway_delta as f64 / 1024.0,
        per_call(f.gateway_delta),
        per_call(f.baseline_delta)
    );
    println!(
        "checks: all {} held calls completed; {} metered calls recorded, all completed; \
         the upstream saw {} requests, each with the real key",
        a.concurrency, f.metered, f.upstream_requests
    );
    println!(
        "database: each call is recorded once the upstream's answer has ended \
         (CallRecorder::drop builds the row, microseconds, and hands the write to the blocking \
         pool with spawn_blocking): the database write is not on the answer's path"
    );
    let json = serde_json::json!({
        "calls": a.calls,
        "block": a.block,
        "concurrency": a.concurrency,
        "request_bytes": f.request_bytes,
        "answer_bytes": f.expected,
        "answer_chunks": f.chunks,
        "direct_total_ms": direct_total.json(),
        "gateway_total_ms": gateway_total.json(),
        "direct_ttfb_ms": direct_ttfb.json(),
        "gateway_ttfb_ms": gateway_ttfb.json(),
        "added_total_p50_ms": (added_p50 * 1000.0).round() / 1000.0,
        "added_total_p99_ms": (added_p99 * 1000.0).round() / 1000.0,
        "added_ttfb_p50_ms": (added_ttfb_p50 * 1000.0).round() / 1000.0,
        "added_ttfb_p99_ms": (added_ttfb_p99 * 1000.0).round() / 1000.0,
        "target_added_p99_met": added_p99 < 2.0,
        "rss_delta_kib": f.gateway_delta,
        "rss_per_call_kib": (per_call(f.gateway_delta) * 10.0).round() / 10.0,
        "direct_rss_per_call_kib": (per_call(f.baseline_delta) * 10.0).round() / 10.0,
        "gateway_rss_per_call_kib": (gateway_share * 10.0).round() / 10.0,
        "held_completed": a.concurrency,
        "metered_recorded": f.recorded,
    });
    println!("{json}");
}

/// The benchmark: the upstream and the gateway, then the four phases in order.
async fn bench(a: &Args) -> Result<(), Error> {
    let events = answer_events();
    let expected: usize = events.iter().map(String::len).sum();
    let writes = Arc::new(answer_writes(&events));
    let chunks = writes.len();
    let upstream = start_upstream(writes).await?;
    let (gateway, test_db, run) = start_gateway(&upstream).await?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("gateway.sock");
    let (key, _meter, gate) = gateway.open_run(&run, &socket, false).await?;
    let body = request_body(a.request_kb);
    let latency = added_latency(a, &upstream, &socket, &key, &body, expected).await?;
    let (gateway_delta, held) =
        held_through_gateway(a, &gateway, &run, dir.path(), &upstream, &body, expected).await?;
    let baseline_delta = child_baseline(a)?;
    let metered = WARMUP + a.calls + a.concurrency;
    let attempts = std::iter::once(1).chain(held.iter().map(|h| h.3));
    let recorded = check_recorded(&gateway, &test_db, run.task_id, attempts, metered).await?;
    let upstream_requests = upstream.requests.load(Ordering::Relaxed);
    drop(gate);
    drop(held);
    report(
        a,
        &Figures {
            expected,
            chunks,
            request_bytes: body.len(),
            latency,
            gateway_delta,
            baseline_delta,
            metered,
            recorded,
            upstream_requests,
        },
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let a = <Args as clap::Parser>::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if a.memory_baseline {
        runtime.block_on(memory_baseline(&a))
    } else {
        runtime.block_on(bench(&a))
    }
}
