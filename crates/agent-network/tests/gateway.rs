//! The model gateway on its own (docs/contract.md#68-model-gateway): a run's socket, its key,
//! streaming through chunk by chunk, metering into a real SQLite file, the per-call budget,
//! and the errors it passes on or gives itself. The upstream is a scripted HTTP/1.1 server
//! on 127.0.0.1 written here, so each test controls exactly when each byte goes out.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry_agent_network::gateway::{Gateway, GatewayConfig, RunGate};
use agentry_domain::{AgentType, RepoUrl, Usd};
use agentry_persistence::metering;
use agentry_persistence::repos::{self, NewRepository};
use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::tasks::{self, NewTask};
use agentry_persistence::test_support::TestDb;
use agentry_runner::AgentSpec;
use agentry_runner::network::{RunInfo, RunMeter};
use agentry_testkit::http;
use agentry_testkit::wait::eventually_async;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

const REAL_KEY: &str = "sk-real-upstream-key";

/// What the scripted upstream does with one request.
#[derive(Clone)]
enum Script {
    /// Answers `status` with a JSON `body`.
    Json(u16, String),
    /// Answers 200 with a JSON `body` and these header lines (each ending in CRLF) besides.
    JsonWithHeaders { headers: String, body: String },
    /// Streams `first`, waits for `go`, then streams `rest` and ends the chunked body.
    Stream {
        first: String,
        go: Arc<Notify>,
        rest: String,
    },
    /// Streams `first`, then closes the connection without ending the body.
    BreakOff(String),
    /// Reads the request and never answers.
    Silent,
}

impl Script {
    /// A message of claude-sonnet-5 that used `input` and `output` tokens, as one JSON answer.
    fn message(input: u32, output: u32) -> Script {
        let usage = format!(r#"{{"input_tokens":{input},"output_tokens":{output}}}"#);
        Script::Json(
            200,
            format!(r#"{{"model":"claude-sonnet-5","usage":{usage}}}"#),
        )
    }

    /// Anthropic's stream of one message: [`START`], then (once `go` is notified) [`END`].
    fn message_stream(go: &Arc<Notify>) -> Script {
        Script::Stream {
            first: START.into(),
            go: go.clone(),
            rest: END.into(),
        }
    }
}

/// One request the upstream received.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    body: Vec<u8>,
}

struct Upstream {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn upstream(script: Script) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let script = script.clone();
            let record = record.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let Some(head) = read_head(&mut stream).await else {
                        return;
                    };
                    let length = http::content_length(&head);
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).await.unwrap();
                    record.lock().unwrap().push(Seen { head, body });
                    let out = stream.get_mut();
                    match &script {
                        Script::Json(status, body) => {
                            let text = format!(
                                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            out.write_all(text.as_bytes()).await.unwrap();
                        }
                        Script::JsonWithHeaders { headers, body } => {
                            let text = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            out.write_all(text.as_bytes()).await.unwrap();
                        }
                        Script::Stream { first, go, rest } => {
                            start_stream(out, first).await;
                            go.notified().await;
                            out.write_all(chunk(rest).as_bytes()).await.unwrap();
                            out.write_all(b"0\r\n\r\n").await.unwrap();
                        }
                        Script::BreakOff(first) => {
                            start_stream(out, first).await;
                            return;
                        }
                        Script::Silent => std::future::pending::<()>().await,
                    }
                }
            });
        }
    });
    Upstream { url, seen }
}

/// Reads the lines of an HTTP head, up to and including the blank line that ends it; `None`
/// when the connection ends (or fails) before.
async fn read_head<R: AsyncBufRead + Unpin>(reader: &mut R) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            return Some(head);
        }
    }
}

fn chunk(text: &str) -> String {
    format!("{:x}\r\n{text}\r\n", text.len())
}

/// Sends a streaming answer's head and its first chunk, `first`, at once.
async fn start_stream(out: &mut tokio::net::TcpStream, first: &str) {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    out.write_all(head.as_bytes()).await.unwrap();
    out.write_all(chunk(first).as_bytes()).await.unwrap();
    out.flush().await.unwrap();
}

const START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-5\",\"usage\":{\"input_tokens\":1000,\"cache_read_input_tokens\":0,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n";
const END: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"done\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":500}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// The gateway over a fresh SQLite database with one task, its upstream scripted.
struct Rig {
    up: Upstream,
    _db: TestDb,
    db: agentry_persistence::Db,
    gateway: Gateway,
    dir: tempfile::TempDir,
    task_id: Uuid,
}

/// Claims the next queued task, which must be `task`, holding its budgets per call.
fn claim(conn: &mut agentry_persistence::AnyConnection, task: Uuid) {
    let claimed = agentry_persistence::runner::claim_next_holding(
        conn,
        "me",
        agentry_persistence::now(),
        time::Duration::seconds(600),
        agentry_persistence::budgets::Holding::PerCall,
    )
    .unwrap()
    .unwrap();
    assert_eq!(claimed.id, task);
}

impl Rig {
    /// The gateway in front of an upstream that follows `script`, its task's first attempt
    /// claimed (a gateway sends only the calls of a run in progress).
    async fn start(script: Script) -> Rig {
        Rig::start_budgeted(script, None).await
    }

    /// As [`Rig::start`], with the instance's monthly budget set to `budget` before the claim.
    async fn start_budgeted(script: Script, budget: Option<&str>) -> Rig {
        let up = upstream(script).await;
        let test_db = TestDb::sqlite();
        let db = test_db.db.clone();
        let mut conn = db.conn().unwrap();
        let now = agentry_persistence::now();
        let (repo, _) = repos::connect_repository(
            &mut conn,
            &NewRepository {
                url: RepoUrl::parse("https://github.com/acme/web").unwrap(),
                default_branch: "main".into(),
                clone_url: "https://github.com/acme/web.git".into(),
                codehost_id: Some(1),
            },
            now,
        )
        .unwrap();
        let task_id = Uuid::new_v4();
        tasks::create_task(
            &mut conn,
            &NewTask {
                id: task_id,
                title: "t".into(),
                ..agentry_persistence::test_support::coding_task(&repo, now)
            },
            "created",
        )
        .unwrap();
        if let Some(budget) = budget {
            let budget = Usd::parse(budget).unwrap();
            agentry_persistence::budgets::set_instance_budget(&mut conn, Some(budget), now)
                .unwrap();
        }
        claim(&mut conn, task_id);
        let url = url::Url::parse(&up.url).unwrap();
        let gateway = Gateway::new(
            GatewayConfig {
                anthropic_upstream: url.clone(),
                openai_upstream: url.join("/v1").unwrap(),
                anthropic_key: Some(SecretValue::new(REAL_KEY)),
                openai_key: Some(SecretValue::new(REAL_KEY)),
                body_timeout: Duration::from_millis(500),
            },
            agentry_runner::PriceTable::builtin(),
            db.clone(),
            MasterKey::generate().unwrap(),
        )
        .unwrap();
        Rig {
            up,
            _db: test_db,
            db,
            gateway,
            dir: tempfile::tempdir().unwrap(),
            task_id,
        }
    }

    /// Ends the task's current attempt (failed) and claims the next one, as a retry does.
    fn next_attempt(&self) {
        let mut conn = self.db.conn().unwrap();
        for trigger in [
            agentry_domain::Trigger::Fail,
            agentry_domain::Trigger::Retry,
        ] {
            tasks::transition_task(
                &mut conn,
                self.task_id,
                trigger,
                &tasks::TransitionDetails::default(),
                agentry_persistence::now(),
            )
            .unwrap();
        }
        claim(&mut conn, self.task_id);
    }

    /// The requests the upstream received.
    fn seen(&self) -> Vec<Seen> {
        self.up.seen.lock().unwrap().clone()
    }

    /// Opens attempt `attempt` of the task's run with `agent_type` and `allowance`.
    async fn open(&self, attempt: i32, agent_type: AgentType, allowance: Option<&str>) -> OpenRun {
        let socket = self.dir.path().join(format!("gateway-{attempt}.sock"));
        let run = RunInfo {
            task_id: self.task_id,
            attempt,
            repo_key: String::new(),
            agent: AgentSpec {
                agent_type,
                model: "claude-sonnet-5".into(),
                max_turns: None,
                max_budget_usd: allowance.map(|a| Usd::parse(a).unwrap()),
            },
        };
        let (key, meter, gate) = self.gateway.open_run(&run, &socket, false).await.unwrap();
        OpenRun {
            socket,
            key,
            meter,
            gate,
        }
    }

    /// Opens attempt 1 of a Claude Code run without an allowance.
    async fn open_claude(&self) -> OpenRun {
        self.open(1, AgentType::ClaudeCode, None).await
    }

    async fn calls(&self, attempt: i32) -> Vec<metering::ModelCall> {
        assert!(
            self.gateway
                .drain(self.task_id, attempt, Duration::from_secs(10))
                .await
        );
        let mut conn = self.db.conn().unwrap();
        metering::task_calls(&mut conn, self.task_id, Some(attempt)).unwrap()
    }
}

/// A run the gateway serves: its socket and key, its meter, and the gate that closes it when
/// dropped.
struct OpenRun {
    socket: PathBuf,
    key: String,
    meter: Arc<RunMeter>,
    gate: RunGate,
}

impl OpenRun {
    /// `POST /v1/messages` of [`MESSAGE`] with the run's key in `x-api-key`.
    async fn message(&self) -> (BufReader<UnixStream>, u16, String) {
        let auth = [("x-api-key", self.key.as_str())];
        send(&self.socket, "POST", "/v1/messages", &auth, MESSAGE).await
    }

    /// `POST path` of `body` with the run's key as a bearer token.
    async fn post_with_bearer(
        &self,
        path: &str,
        body: &[u8],
    ) -> (BufReader<UnixStream>, u16, String) {
        let bearer = format!("Bearer {}", self.key);
        send(
            &self.socket,
            "POST",
            path,
            &[("authorization", &bearer)],
            body,
        )
        .await
    }
}

/// A raw HTTP/1.1 request on the run's socket; returns the connection, the response head
/// read, and a reader for the rest.
async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (BufReader<UnixStream>, u16, String) {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let length = body.len().to_string();
    let mut all = vec![
        ("host", "127.0.0.1:4810"),
        ("connection", "close"),
        ("content-length", length.as_str()),
    ];
    all.extend_from_slice(headers);
    let head = http::head(&format!("{method} {path} HTTP/1.1"), &all);
    stream.write_all(head.as_bytes()).await.unwrap();
    // The gateway may answer (and stop reading) before a refused body is all sent.
    let _ = stream.write_all(body).await;
    let mut reader = BufReader::new(stream);
    let response = read_head(&mut reader).await.unwrap_or_default();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (reader, status, response)
}

async fn rest(mut reader: BufReader<UnixStream>) -> String {
    let mut text = Vec::new();
    let _ = reader.read_to_end(&mut text).await;
    String::from_utf8_lossy(&text).into_owned()
}

const MESSAGE: &[u8] = br#"{"model":"claude-sonnet-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn streaming_passes_through_chunk_by_chunk_and_the_call_is_metered_with_the_real_key() {
    let go = Arc::new(Notify::new());
    let rig = Rig::start(Script::message_stream(&go)).await;
    let run = rig.open_claude().await;
    let key = &run.key;
    let (mut reader, status, head) = send(
        &run.socket,
        "POST",
        "/v1/messages?beta=true",
        &[("x-api-key", key), ("anthropic-version", "2023-06-01")],
        MESSAGE,
    )
    .await;
    assert_eq!(status, 200, "{head}");
    // The first event arrives while the upstream is still holding the rest back.
    let (found, lines) = mpsc::unbounded_channel::<String>();
    let mut lines = lines;
    let reading = tokio::spawn(async move {
        let mut all = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                break;
            }
            all.push_str(&line);
            let _ = found.send(line);
        }
        all
    });
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let line = lines.recv().await.unwrap();
            if line.starts_with("data:") && line.contains("message_start") {
                return line;
            }
        }
    })
    .await
    .expect("the first event came through before the upstream finished");
    assert!(first.contains("\"input_tokens\":1000"));
    go.notify_one();
    let all = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .unwrap()
        .unwrap();
    assert!(all.contains("message_stop"), "{all}");

    // The upstream saw the real key, never the run's.
    let seen = rig.seen();
    assert_eq!(seen.len(), 1);
    let upstream_head = seen[0].head.to_ascii_lowercase();
    assert!(
        upstream_head.starts_with("post /v1/messages?beta=true "),
        "{upstream_head}"
    );
    assert!(
        upstream_head.contains(&format!("x-api-key: {REAL_KEY}")),
        "{upstream_head}"
    );
    assert!(!upstream_head.contains(&key.to_ascii_lowercase()));
    assert!(upstream_head.contains("anthropic-version: 2023-06-01"));
    assert_eq!(seen[0].body, MESSAGE);

    // Metered: 1000 input and 500 output tokens of claude-sonnet-5 ($2 and $10 per million).
    let calls = rig.calls(1).await;
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(
        (
            call.tokens.input,
            call.tokens.output,
            call.status,
            call.outcome.as_str()
        ),
        (1000, 500, 200, "completed")
    );
    assert_eq!(call.model.as_deref(), Some("claude-sonnet-5"));
    assert_eq!(call.cost_usd, Some(Usd::parse("0.007").unwrap()));
    assert_eq!(run.meter.spent(), Usd::parse("0.007").unwrap());
    assert_eq!(run.meter.calls(), 1);
}

#[tokio::test]
async fn a_run_key_works_only_for_its_own_run_and_only_while_it_lasts() {
    let rig = Rig::start(Script::message(10, 1)).await;
    let run1 = rig.open_claude().await;
    let (_, status, _) = run1.message().await;
    assert_eq!(status, 200);
    // The attempt fails and is retried: its agent, were it still alive, sends nothing more.
    rig.next_attempt();
    let run2 = rig.open(2, AgentType::ClaudeCode, None).await;
    assert_ne!(run1.key, run2.key);
    let (reader, status, _) = run1.message().await;
    assert_eq!(status, 403);
    assert!(rest(reader).await.contains("this agentry run is over"));
    // Another run's key, no key, the upstream's own key: refused, in Anthropic's shape.
    for headers in [
        vec![("x-api-key", run1.key.as_str())],
        vec![],
        vec![("x-api-key", REAL_KEY)],
    ] {
        let (reader, status, _) =
            send(&run2.socket, "POST", "/v1/messages", &headers, MESSAGE).await;
        assert_eq!(status, 401);
        let body = rest(reader).await;
        assert!(body.contains("authentication_error"), "{body}");
    }
    let (_, status, _) = run2.post_with_bearer("/v1/messages", MESSAGE).await;
    assert_eq!(status, 200);
    assert_eq!(rig.seen().len(), 2);
    // After the run, its socket is gone.
    drop(run1.gate);
    assert!(UnixStream::connect(&run1.socket).await.is_err());
    assert!(!run1.socket.exists());
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged_and_are_recorded() {
    let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let rig = Rig::start(Script::Json(529, body.into())).await;
    let (reader, status, _) = rig.open_claude().await.message().await;
    assert_eq!(status, 529);
    assert_eq!(rest(reader).await, body);
    let calls = rig.calls(1).await;
    assert_eq!(
        (calls[0].status, calls[0].outcome.as_str()),
        (529, "upstream_error")
    );
    assert_eq!(calls[0].cost_usd, Some(Usd::ZERO));
}

#[tokio::test]
async fn a_stream_the_upstream_breaks_off_breaks_off_for_the_agent_and_keeps_what_it_used() {
    let rig = Rig::start(Script::BreakOff(START.into())).await;
    let (reader, status, _) = rig.open_claude().await.message().await;
    assert_eq!(status, 200);
    let body = tokio::time::timeout(Duration::from_secs(10), rest(reader))
        .await
        .unwrap();
    assert!(body.contains("message_start"));
    // The chunked body never ends properly: no terminating zero-length chunk.
    assert!(!body.ends_with("0\r\n\r\n"), "{body:?}");
    let calls = rig.calls(1).await;
    assert_eq!(calls[0].outcome, "interrupted");
    assert_eq!((calls[0].tokens.input, calls[0].tokens.output), (1000, 1));
    assert_eq!(calls[0].cost_usd, Some(Usd::parse("0.00201").unwrap()));
}

#[tokio::test]
async fn bad_requests_get_clear_errors_in_the_providers_shape_and_reach_nothing() {
    let rig = Rig::start(Script::Json(200, "{}".into())).await;
    let run = rig.open_claude().await;
    let (socket, auth) = (&run.socket, [("x-api-key", run.key.as_str())]);
    for (method, path, body, want, text) in [
        ("POST", "/v1/messages", &b"not json"[..], 400, "JSON object"),
        ("POST", "/v1/messages", br#"{"messages":[]}"#, 400, "model"),
        ("POST", "/v1/complete", b"{}", 404, "does not serve"),
        ("DELETE", "/v1/messages", b"", 404, "does not serve"),
        // Other resources, and paths that are not plain, never reach the upstream.
        ("GET", "/v1/files", b"", 404, "does not serve"),
        ("POST", "/v1/messages/batches", b"{}", 404, "does not serve"),
        ("GET", "/v1/models/../files", b"", 400, "dot segment"),
        ("GET", "/v1/models/%2e%2e/files", b"", 400, "percent escape"),
        ("POST", "/v1//messages", MESSAGE, 400, "empty segment"),
        ("POST", "/v1/messages/../messages", MESSAGE, 400, "dot segment"),
        // A model without a price, a member named twice, provider-side tools.
        (
            "POST",
            "/v1/messages",
            br#"{"model":"claude-free-9","max_tokens":10,"messages":[]}"#,
            400,
            "AGENTRY_PRICES_FILE",
        ),
        (
            "POST",
            "/v1/messages",
            br#"{"model":"claude-sonnet-5","model":"claude-free-9","max_tokens":10}"#,
            400,
            "named twice",
        ),
        (
            "POST",
            "/v1/messages",
            br#"{"model":"claude-sonnet-5","max_tokens":10,"messages":[],"mcp_servers":[{"type":"url","url":"https://x.example"}]}"#,
            400,
            "allowProviderTools",
        ),
        (
            "POST",
            "/v1/messages/count_tokens",
            br#"{"model":"claude-sonnet-5","messages":[],"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}"#,
            400,
            "allowProviderTools",
        ),
        // Content the provider would fetch itself, here inside a tool result.
        (
            "POST",
            "/v1/messages",
            br#"{"model":"claude-sonnet-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://x.example/?d=secret"}}]}]}]}"#,
            400,
            "fetch a URL",
        ),
    ] {
        let (reader, status, _) = send(socket, method, path, &auth, body).await;
        assert_eq!(status, want, "{method} {path}");
        let answer = rest(reader).await;
        assert!(answer.contains(text), "{answer}");
        assert!(answer.contains("\"type\":\"error\""), "{answer}");
    }
    // Oversized: refused once the limit is passed.
    let big = vec![b' '; 33 * 1024 * 1024];
    let (reader, status, _) = send(socket, "POST", "/v1/messages", &auth, &big).await;
    assert_eq!(status, 413);
    assert!(rest(reader).await.contains("request_too_large"));
    // Codex's WebSocket transport: 426, on which it falls back to HTTP.
    let (_, status, _) = send(
        socket,
        "GET",
        "/v1/responses",
        &[("upgrade", "websocket"), ("connection", "Upgrade")],
        b"",
    )
    .await;
    assert_eq!(status, 426);
    // Claude Code's connectivity check needs no key.
    let (_, status, _) = send(socket, "HEAD", "/", &[], b"").await;
    assert_eq!(status, 200);
    // A beta value that switches a provider-side fetch on.
    let beta = [
        ("x-api-key", run.key.as_str()),
        (
            "anthropic-beta",
            "claude-code-20250219,web-fetch-2025-09-10",
        ),
    ];
    let (reader, status, _) = send(socket, "POST", "/v1/messages", &beta, MESSAGE).await;
    assert_eq!(status, 400);
    assert!(rest(reader).await.contains("web-fetch-2025-09-10"));
    // A body that does not come in time: 408 (the rig allows 500 ms).
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let head = http::head(
        "POST /v1/messages HTTP/1.1",
        &[
            ("host", "127.0.0.1:4810"),
            ("x-api-key", run.key.as_str()),
            ("content-length", "1000"),
        ],
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"{\"model\":").await.unwrap();
    let mut reader = BufReader::new(stream);
    let answer = tokio::time::timeout(Duration::from_secs(10), read_head(&mut reader))
        .await
        .expect("the gateway answers a slow body within its deadline")
        .unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(rig.seen().is_empty());
    assert!(rig.calls(1).await.is_empty());
}

/// A body of `len` bytes asking claude-sonnet-5 for at most `max_tokens`, streamed.
fn message_of(max_tokens: u64, len: usize) -> Vec<u8> {
    let start = format!(
        r#"{{"model":"claude-sonnet-5","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":""#
    );
    let end = r#""}]}"#;
    let mut body = start.into_bytes();
    body.resize(len - end.len(), b'x');
    body.extend_from_slice(end.as_bytes());
    body
}

/// What claude-sonnet-5 ($2.5 per million for a cache write, the dearest input; $10 per
/// million output) may cost at most for a body of `len` bytes and `max_tokens`.
fn reservation(len: usize, max_tokens: u64) -> Usd {
    let nanos = len as i64 * 2_500 + max_tokens as i64 * 10_000;
    Usd::from_nanos(nanos).unwrap()
}

#[tokio::test]
async fn concurrent_calls_go_out_only_while_their_reservations_fit_the_allowance() {
    let go = Arc::new(Notify::new());
    let rig = Rig::start(Script::message_stream(&go)).await;
    let run = rig.open(1, AgentType::ClaudeCode, Some("5")).await;
    // Each call may cost $3.0025 (1,000 bytes, 300,000 output tokens); the upstream bills
    // $0.007 (1,000 input and 500 output tokens) for each.
    let body = message_of(300_000, 1000);
    assert_eq!(reservation(1000, 300_000), Usd::parse("3.0025").unwrap());
    let auth = [("x-api-key", run.key.as_str())];
    let burst = (0..8).map(|_| send(&run.socket, "POST", "/v1/messages", &auth, &body));
    let answers = futures_util::future::join_all(burst).await;
    let mut streaming = Vec::new();
    let mut refused = 0;
    for (reader, status, head) in answers {
        match status {
            200 => streaming.push(reader),
            429 => {
                refused += 1;
                let text = rest(reader).await;
                assert!(text.contains("budget reached"), "{text}");
                assert!(
                    text.contains("3.0025 USD reserved by its calls in flight"),
                    "{text}"
                );
            }
            other => panic!("unexpected {other}: {head}"),
        }
    }
    // One call fits a $5 allowance; the seven others would have overshot it.
    assert_eq!((streaming.len(), refused), (1, 7));
    assert_eq!(rig.seen().len(), 1);
    assert_eq!(run.meter.reserved(), Usd::parse("3.0025").unwrap());
    assert!(run.meter.is_exhausted());
    go.notify_one();
    for reader in streaming {
        assert!(rest(reader).await.contains("message_stop"));
    }
    let calls = rig.calls(1).await;
    assert_eq!(calls.len(), 8);
    // Once it ended its reservation became its metered cost, and the next call fits again.
    assert_eq!(run.meter.spent(), Usd::parse("0.007").unwrap());
    assert_eq!(run.meter.reserved(), Usd::ZERO);
    go.notify_one();
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, &body).await;
    assert_eq!(status, 200);
    rest(reader).await;
    assert_eq!(rig.seen().len(), 2);
    let calls = rig.calls(1).await;
    let outcomes: Vec<&str> = calls.iter().map(|c| c.outcome.as_str()).collect();
    assert_eq!(outcomes.iter().filter(|o| **o == "refused").count(), 7);
    assert_eq!(outcomes.iter().filter(|o| **o == "completed").count(), 2);
    let billed: Usd = calls
        .iter()
        .filter_map(|c| c.cost_usd)
        .fold(Usd::ZERO, |a, c| a.checked_add(c).unwrap());
    assert_eq!(billed, Usd::parse("0.014").unwrap());
}

#[tokio::test]
async fn a_call_whose_final_usage_never_came_costs_at_least_its_reservation() {
    // Cut after message_start: the upstream billed the whole answer, which the gateway
    // never saw; the call is recorded at its reservation, never at what passed.
    let rig = Rig::start(Script::BreakOff(START.into())).await;
    let run = rig.open_claude().await;
    let body = message_of(200_000, 500);
    let auth = [("x-api-key", run.key.as_str())];
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, &body).await;
    assert_eq!(status, 200);
    rest(reader).await;
    let calls = rig.calls(1).await;
    assert_eq!(calls[0].outcome, "interrupted");
    assert_eq!(calls[0].tokens.input, 1000);
    assert_eq!(calls[0].cost_usd, Some(reservation(500, 200_000)));
    assert_eq!(run.meter.spent(), reservation(500, 200_000));

    // A whole answer that carries no usage: `unmetered`, at its reservation.
    let rig = Rig::start(Script::Json(200, r#"{"id":"msg_1"}"#.into())).await;
    let run = rig.open_claude().await;
    let auth = [("x-api-key", run.key.as_str())];
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, &body).await;
    assert_eq!(status, 200);
    rest(reader).await;
    let calls = rig.calls(1).await;
    assert_eq!(
        (calls[0].outcome.as_str(), calls[0].cost_usd),
        ("unmetered", Some(reservation(500, 200_000)))
    );

    // A whole answer too large to read for its usage (over 16 MiB, not streamed): its
    // usage is unknown, so it costs its reservation, not the usage its end would show.
    let padding = "x".repeat(17 * 1024 * 1024);
    let large = format!(
        r#"{{"id":"msg_2","padding":"{padding}","model":"claude-sonnet-5","usage":{{"input_tokens":1,"output_tokens":1}}}}"#
    );
    let rig = Rig::start(Script::Json(200, large)).await;
    let run = rig.open_claude().await;
    let auth = [("x-api-key", run.key.as_str())];
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, &body).await;
    assert_eq!(status, 200);
    assert!(rest(reader).await.len() > 17 * 1024 * 1024);
    let calls = rig.calls(1).await;
    assert_eq!(
        (calls[0].outcome.as_str(), calls[0].cost_usd),
        ("unmetered", Some(reservation(500, 200_000)))
    );

    // An OpenAI background request: answered before its work, billed at its reservation.
    let queued = r#"{"id":"resp_1","status":"queued","model":"gpt-6.1-sol","usage":null}"#;
    let rig = Rig::start(Script::Json(200, queued.into())).await;
    let run = rig.open(1, AgentType::Codex, None).await;
    let body = br#"{"model":"gpt-6.1-sol","background":true,"max_output_tokens":1000,"input":[]}"#;
    let (reader, status, _) = run.post_with_bearer("/v1/responses", body).await;
    assert_eq!(status, 200);
    rest(reader).await;
    let calls = rig.calls(1).await;
    // gpt-6.1-sol: $2.5 per million for a cache write, $10 output.
    let reserved = Usd::from_nanos(body.len() as i64 * 2_500 + 1000 * 10_000).unwrap();
    assert_eq!(
        (calls[0].outcome.as_str(), calls[0].cost_usd),
        ("unmetered", Some(reserved))
    );

    // The run ends while the upstream works on a call (the agent stopped, its answer not
    // yet begun): the upstream may bill it, so it costs its reservation.
    let rig = Rig::start(Script::Silent).await;
    let run = rig.open_claude().await;
    let socket = run.socket.clone();
    let key = run.key.clone();
    let sent = message_of(100_000, 500);
    let pending = tokio::spawn(async move {
        send(
            &socket,
            "POST",
            "/v1/messages",
            &[("x-api-key", &key)],
            &sent,
        )
        .await
    });
    eventually_async(
        Duration::from_secs(10),
        "the call to reach the upstream",
        async || !rig.seen().is_empty(),
    )
    .await;
    drop(run);
    let calls = rig.calls(1).await;
    assert_eq!(
        (calls[0].outcome.as_str(), calls[0].cost_usd),
        ("interrupted", Some(reservation(500, 100_000)))
    );
    pending.abort();

    // An error the provider answered whole is not billed.
    let rig = Rig::start(Script::Json(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#.into(),
    ))
    .await;
    let run = rig.open_claude().await;
    let (reader, status, _) = run.message().await;
    assert_eq!(status, 529);
    rest(reader).await;
    let calls = rig.calls(1).await;
    assert_eq!(
        (calls[0].outcome.as_str(), calls[0].cost_usd),
        ("upstream_error", Some(Usd::ZERO))
    );
}

#[tokio::test]
async fn once_the_allowance_is_spent_the_next_call_is_refused_and_the_run_marked_exhausted() {
    // Each call: 1000 input + 500 output tokens of claude-sonnet-5 = $0.007.
    let rig = Rig::start(Script::message(1000, 500)).await;
    let run = rig.open(1, AgentType::ClaudeCode, Some("0.01")).await;
    let meter = &run.meter;
    for _ in 0..2 {
        let (reader, status, _) = run.message().await;
        assert_eq!(status, 200);
        rest(reader).await;
        rig.gateway
            .drain(rig.task_id, 1, Duration::from_secs(10))
            .await;
    }
    assert!(!meter.is_exhausted());
    let (reader, status, _) = run.message().await;
    assert_eq!(status, 429);
    let answer = rest(reader).await;
    assert!(answer.contains("budget reached"), "{answer}");
    assert!(answer.contains("rate_limit_error"), "{answer}");
    assert!(meter.is_exhausted());
    // Two calls went out: one over the allowance at most.
    assert_eq!(rig.seen().len(), 2);
    assert_eq!(meter.spent(), Usd::parse("0.014").unwrap());
    let calls = rig.calls(1).await;
    assert_eq!(
        calls.iter().map(|c| c.outcome.as_str()).collect::<Vec<_>>(),
        ["completed", "completed", "refused"]
    );
    assert_eq!(calls[2].status, 429);
}

#[tokio::test]
async fn codex_calls_are_metered_from_the_responses_stream_and_refused_in_openais_shape() {
    let go = Arc::new(Notify::new());
    go.notify_one();
    let rig = Rig::start(Script::Stream {
        first: "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-6.1-sol\"}}\n\n".into(),
        go,
        rest: "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-6.1-sol\",\"usage\":{\"input_tokens\":3000,\"input_tokens_details\":{\"cached_tokens\":2000},\"output_tokens\":100,\"output_tokens_details\":{\"reasoning_tokens\":40}}}}\n\n".into(),
    }).await;
    let run = rig.open(1, AgentType::Codex, None).await;
    let body = br#"{"model":"gpt-6.1-sol","stream":true,"input":[]}"#;
    let (reader, status, _) = run.post_with_bearer("/v1/responses", body).await;
    assert_eq!(status, 200);
    assert!(rest(reader).await.contains("response.completed"));
    let seen = rig.seen();
    // The OpenAI base URL carries its /v1: the path is joined to it once.
    assert!(
        seen[0].head.starts_with("POST /v1/responses "),
        "{}",
        seen[0].head
    );
    assert!(
        seen[0]
            .head
            .to_ascii_lowercase()
            .contains(&format!("authorization: bearer {REAL_KEY}"))
    );
    let calls = rig.calls(1).await;
    assert_eq!(
        (
            calls[0].tokens.uncached(),
            calls[0].tokens.cache_read,
            calls[0].tokens.output,
            calls[0].reasoning_tokens
        ),
        (1000, 2000, 100, 40)
    );
    // gpt-6.1-sol: $2 input, $0.1 cached, $10 output per million.
    assert_eq!(calls[0].cost_usd, Some(Usd::parse("0.0032").unwrap()));
    let (reader, status, _) = send(&run.socket, "POST", "/v1/responses", &[], body).await;
    assert_eq!(status, 401);
    assert!(rest(reader).await.contains("invalid_api_key"));
}

#[tokio::test]
async fn a_run_holds_at_most_its_share_of_connections() {
    use agentry_agent_network::gateway::MAX_CONNECTIONS_PER_RUN;
    let go = Arc::new(Notify::new());
    let rig = Rig::start(Script::message_stream(&go)).await;
    let run = rig.open_claude().await;
    let mut open = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_RUN {
        let (reader, status, _) = run.message().await;
        assert_eq!(status, 200);
        open.push(reader);
    }
    // One more is closed at once, while the others stream on.
    let (_, status, head) = run.message().await;
    assert_eq!(status, 0, "{head}");
    for _ in 0..MAX_CONNECTIONS_PER_RUN {
        go.notify_one();
    }
    for reader in open {
        let body = tokio::time::timeout(Duration::from_secs(10), rest(reader))
            .await
            .unwrap();
        assert!(body.contains("message_stop"), "{body}");
    }
    assert_eq!(rig.calls(1).await.len(), MAX_CONNECTIONS_PER_RUN);
}

/// Under a monthly budget a call holds its largest cost in the database before it goes out,
/// and its cost once it ended; the call that does not fit beside what the run holds is
/// refused naming the budget and its figures, and the run is marked exhausted with that
/// reason. A call of a run that is over is refused without reaching the upstream.
#[tokio::test]
async fn a_call_over_the_monthly_budget_is_refused_naming_it() {
    use agentry_persistence::budgets;
    // Each call: 1000 input + 500 output tokens of claude-sonnet-5 = $0.007.
    let rig = Rig::start_budgeted(Script::message(1000, 500), Some("0.01")).await;
    let held = || {
        let mut conn = rig.db.conn().unwrap();
        budgets::reserve_of(&mut conn, rig.task_id).unwrap()
    };
    assert_eq!(held(), Some(Usd::ZERO));
    let run = rig.open_claude().await;
    for spent in ["0.007", "0.014"] {
        let (reader, status, _) = run.message().await;
        assert_eq!(status, 200);
        rest(reader).await;
        assert!(
            rig.gateway
                .drain(rig.task_id, 1, Duration::from_secs(10))
                .await
        );
        assert_eq!(held(), Some(Usd::parse(spent).unwrap()));
    }
    // $0.014 held (the upstream billed more than the calls reserved), $0.01 budget.
    let (reader, status, _) = run.message().await;
    assert_eq!(status, 429);
    let answer = rest(reader).await;
    let reason = format!(
        "the instance's monthly budget of 0.01 USD has 0 USD left (0 USD spent this month by \
         finished runs, 0.014 USD held by runs in progress), and a call that may cost up to {} \
         USD was not sent",
        reservation(MESSAGE.len(), 100)
    );
    assert!(
        answer.contains(&format!("budget reached: {reason}")),
        "{answer}"
    );
    assert!(run.meter.is_exhausted());
    assert_eq!(run.meter.reason().as_deref(), Some(reason.as_str()));
    assert_eq!(held(), Some(Usd::parse("0.014").unwrap()));
    assert_eq!(rig.seen().len(), 2);

    // The task is cancelled: its run is over, and its calls are refused.
    {
        let mut conn = rig.db.conn().unwrap();
        tasks::transition_task(
            &mut conn,
            rig.task_id,
            agentry_domain::Trigger::Cancel,
            &tasks::TransitionDetails::default(),
            agentry_persistence::now(),
        )
        .unwrap();
    }
    let (reader, status, _) = run.message().await;
    assert_eq!(status, 403);
    assert!(rest(reader).await.contains("this agentry run is over"));
    assert_eq!(rig.seen().len(), 2);
}

#[tokio::test]
async fn one_hour_cache_writes_are_billed_at_their_price_and_unpriced_rates_refused() {
    // The upstream bills 2,000 one-hour and 1,000 five-minute cache writes.
    let answer = r#"{"model":"claude-sonnet-5","usage":{"input_tokens":10,"cache_creation_input_tokens":3000,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":100}}"#;
    let rig = Rig::start(Script::Json(200, answer.into())).await;
    let run = rig.open_claude().await;
    let auth = [("x-api-key", run.key.as_str())];
    let cached = br#"{"model":"claude-sonnet-5","max_tokens":100,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}"#;
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, cached).await;
    assert_eq!(status, 200);
    rest(reader).await;
    let calls = rig.calls(1).await;
    // 10 × $2 + 1,000 × $2.5 + 2,000 × $4 + 100 × $10 per million.
    assert_eq!(calls[0].cost_usd, Some(Usd::parse("0.01152").unwrap()));
    assert_eq!(calls[0].tokens.cache_write, 3000);

    // Rates the price table does not hold never reach the upstream.
    let fast = br#"{"model":"claude-sonnet-5","max_tokens":10,"speed":"fast","messages":[]}"#;
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, fast).await;
    assert_eq!(status, 400);
    assert!(rest(reader).await.contains("speed \\\"fast\\\""));
    let long = [
        ("x-api-key", run.key.as_str()),
        (
            "anthropic-beta",
            "claude-code-20250219,context-1m-2025-08-07",
        ),
    ];
    let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &long, MESSAGE).await;
    assert_eq!(status, 400);
    assert!(rest(reader).await.contains("context-1m-2025-08-07"));
    let codex = rig.open(2, AgentType::Codex, None).await;
    let priority = br#"{"model":"gpt-6.1-sol","service_tier":"priority","input":[]}"#;
    let (reader, status, _) = codex.post_with_bearer("/v1/responses", priority).await;
    assert_eq!(status, 400);
    let text = rest(reader).await;
    assert!(text.contains("tier_not_priced"), "{text}");
    assert_eq!(rig.seen().len(), 1);
}

#[tokio::test]
async fn a_body_of_too_many_json_values_is_refused_before_it_is_parsed() {
    let rig = Rig::start(Script::message(10, 1)).await;
    let run = rig.open_claude().await;
    let auth = [("x-api-key", run.key.as_str())];
    let start = r#"{"model":"claude-sonnet-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"metadata":{"pad":["#;
    // 1,100,000 zeros (2.2 MB): over the limit of 1,048,576 values.
    let mut zeros = start.as_bytes().to_vec();
    zeros.extend_from_slice("0,".repeat(1_100_000).as_bytes());
    zeros.extend_from_slice(b"0]}}");
    // 70,000 empty objects, each counting as 16 values.
    let mut objects = start.as_bytes().to_vec();
    objects.extend_from_slice("{},".repeat(70_000).as_bytes());
    objects.extend_from_slice(b"{}]}}");
    for body in [zeros, objects] {
        let (reader, status, _) = send(&run.socket, "POST", "/v1/messages", &auth, &body).await;
        assert_eq!(status, 413);
        let text = rest(reader).await;
        assert!(
            text.contains("more than 1048576 JSON values") && text.contains("request_too_large"),
            "{text}"
        );
    }
    assert!(rig.seen().is_empty());
    // A large real body (an 8 MiB image, checked on a blocking thread) passes whole.
    let image = "A".repeat(8 * 1024 * 1024);
    let body = format!(
        r#"{{"model":"claude-sonnet-5","max_tokens":10,"messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{image}"}}}},{{"type":"text","text":"what is it?"}}]}}]}}"#
    );
    let (reader, status, _) =
        send(&run.socket, "POST", "/v1/messages", &auth, body.as_bytes()).await;
    assert_eq!(status, 200);
    rest(reader).await;
    let seen = rig.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, body.as_bytes());
}

/// The header names of an HTTP head, in lower case, without its first line.
fn header_names(head: &str) -> Vec<String> {
    head.lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_ascii_lowercase())
        .collect()
}

/// The agent chooses nothing of what the operator's key pays for: headers selecting an
/// OpenAI organization or project, or any the gateway does not list, never reach the
/// upstream, while those the CLIs' protocol needs do.
#[tokio::test]
async fn only_the_listed_request_headers_reach_the_upstream() {
    let rig = Rig::start(Script::message(10, 1)).await;
    let hostile = [
        ("OpenAI-Organization", "org-OTHER"),
        ("OpenAI-Project", "proj_OTHER"),
        ("X-Evil", "1"),
    ];
    let claude = rig.open_claude().await;
    let mut sent = vec![
        ("x-api-key", claude.key.as_str()),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "claude-code-20250219"),
        ("x-stainless-retry-count", "0"),
        ("x-claude-code-session-id", "session-1"),
    ];
    sent.extend_from_slice(&hostile);
    let (reader, status, _) = send(&claude.socket, "POST", "/v1/messages", &sent, MESSAGE).await;
    assert_eq!(status, 200);
    rest(reader).await;

    rig.next_attempt();
    let codex = rig.open(2, AgentType::Codex, None).await;
    let bearer = format!("Bearer {}", codex.key);
    let mut sent = vec![
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
        ("session_id", "session-2"),
        ("originator", "codex_exec"),
    ];
    sent.extend_from_slice(&hostile);
    let body = br#"{"model":"gpt-6.1-sol","input":[]}"#;
    let (reader, status, _) = send(&codex.socket, "POST", "/v1/responses", &sent, body).await;
    assert_eq!(status, 200);
    rest(reader).await;

    let seen = rig.seen();
    assert_eq!(seen.len(), 2);
    let (anthropic, openai) = (header_names(&seen[0].head), header_names(&seen[1].head));
    for names in [&anthropic, &openai] {
        for dropped in ["openai-organization", "openai-project", "x-evil"] {
            assert!(!names.iter().any(|n| n == dropped), "{dropped}: {names:?}");
        }
    }
    for needed in [
        "x-api-key",
        "content-type",
        "anthropic-version",
        "anthropic-beta",
        "x-stainless-retry-count",
        "x-claude-code-session-id",
    ] {
        assert!(
            anthropic.iter().any(|n| n == needed),
            "{needed}: {anthropic:?}"
        );
    }
    for needed in [
        "authorization",
        "content-type",
        "accept",
        "session_id",
        "originator",
    ] {
        assert!(openai.iter().any(|n| n == needed), "{needed}: {openai:?}");
    }
    let head = seen[0].head.to_ascii_lowercase();
    assert!(
        head.contains("x-claude-code-session-id: session-1"),
        "{head}"
    );
    assert!(head.contains(&format!("x-api-key: {REAL_KEY}")), "{head}");
}

/// The organization and project the operator's key belongs to, which the upstream names in
/// its answer, do not reach the agent; the answer's other headers do.
#[tokio::test]
async fn the_upstreams_organization_and_project_do_not_reach_the_agent() {
    let rig = Rig::start(Script::JsonWithHeaders {
        headers: "openai-organization: org-operator\r\nopenai-project: proj_operator\r\n\
                  anthropic-organization-id: 4f9c\r\nx-request-id: req_1\r\n\
                  x-ratelimit-remaining-requests: 99\r\n"
            .into(),
        body: r#"{"model":"gpt-6.1-sol","usage":{"input_tokens":10,"output_tokens":1}}"#.into(),
    })
    .await;
    let run = rig.open(1, AgentType::Codex, None).await;
    let body = br#"{"model":"gpt-6.1-sol","input":[]}"#;
    let (reader, status, head) = run.post_with_bearer("/v1/responses", body).await;
    assert_eq!(status, 200, "{head}");
    rest(reader).await;
    let names = header_names(&head);
    for withheld in [
        "openai-organization",
        "openai-project",
        "anthropic-organization-id",
    ] {
        assert!(!names.iter().any(|n| n == withheld), "{withheld}: {head}");
    }
    assert!(
        !head.contains("org-operator") && !head.contains("proj_operator"),
        "{head}"
    );
    for passed in [
        "content-type",
        "x-request-id",
        "x-ratelimit-remaining-requests",
    ] {
        assert!(names.iter().any(|n| n == passed), "{passed}: {head}");
    }
}
