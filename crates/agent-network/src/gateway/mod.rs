//! The model gateway (docs/contract.md#68-model-gateway): a sandboxed agent's only way to its
//! model API, and the meter its bill is made of.
//!
//! Each sandboxed run gets its own gateway socket ([`Gateway::open_run`]), reached from
//! inside the sandbox through the forwarder ([`agentry_runner::network`]). A request is
//! served when it carries the run's key (`x-api-key` or `Authorization: Bearer`); the
//! gateway then replaces that key by the real one (the `ANTHROPIC_API_KEY` or
//! `OPENAI_API_KEY` secret, else the service's environment variable) and passes the request
//! to the configured upstream, streaming the answer back chunk by chunk as it arrives.
//!
//! The gateway is a fail-closed meter and an allow-list ([`policy`]):
//!
//! - Only the endpoints the CLIs use pass, by their plain path (Anthropic `POST
//!   /v1/messages` and `/v1/messages/count_tokens`, OpenAI `POST /v1/responses` and
//!   `/v1/responses/compact`, `GET /v1/models`); a path with percent escapes, dot or empty
//!   segments answers `400`, any other `404`. `GET` and `HEAD /` (Claude Code's
//!   connectivity check) answer `200` here. OpenAI's WebSocket transport is refused with
//!   `426`, on which Codex falls back to HTTP streaming at once.
//! - Only the request headers the CLIs need pass upstream, by name and per provider
//!   ([`headers::FORWARDED_REQUEST_HEADERS`]); any other (the agent's key, an
//!   `OpenAI-Organization` or `OpenAI-Project` choosing what the real key bills, a header
//!   the list does not know) is dropped. The answer's headers come back but those naming the
//!   operator's account ([`headers::WITHHELD_RESPONSE_HEADERS`]).
//! - A `POST` body must be a JSON object (else `400`), at most [`MAX_BODY_BYTES`] and at most
//!   [`policy::MAX_JSON_VALUES`] values (else `413`; counted before it is parsed, so its
//!   parse is bounded, and the parse is dropped before the call is forwarded), arriving within [`BODY_TIMEOUT`] (else `408`); what goes upstream is the object
//!   as the gateway read it. MCP servers, provider-side tools and content the provider would
//!   fetch from a URL or read from its file storage are refused (`400`) unless the repository
//!   allows provider tools.
//! - Model calls (Anthropic `POST /v1/messages`, OpenAI `POST /v1/responses…`) are metered.
//!   A call to a model without a price, or at a rate the price table does not hold (OpenAI
//!   `priority` tier, Anthropic fast mode and long-context betas), is refused (`400`). Before a call is passed on, its
//!   largest possible cost is reserved in the run's meter, where the call must fit what is
//!   left of the task's cap beside the run's spend and its calls in flight, and then held in
//!   the database against the monthly budgets, beside what every run in progress holds
//!   (`budgets::hold_call`); otherwise `429` in the provider's error shape naming the limit,
//!   and the run is marked exhausted (the runner stops it, "budget reached"). The usage the provider returned is read from the answer as it passes
//!   ([`usage`]), priced, and recorded as a [`ModelCall`] as soon as the answer ends (or
//!   breaks off), so a crash or a kill loses none; a call whose final usage never came is
//!   recorded at its reservation.
//! - Token counting and model lists are passed on unmetered. An upstream that cannot be
//!   reached answers `502`; errors of the upstream pass through unchanged.
//!
//! When the run ends its [`RunGate`] is dropped: the socket closes, its file is removed, and
//! the key is refused on any connection still open.

pub mod headers;
pub mod policy;
pub mod usage;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agentry_domain::money::Usd;
use agentry_domain::{AgentType, BudgetScope};
use agentry_persistence::budgets::{self, CallHold};
use agentry_persistence::metering::{self, ModelCall};
use agentry_persistence::secrets::{self, MasterKey, SecretValue};
use agentry_persistence::{AnyConnection, Db};
use agentry_runner::PriceTable;
use agentry_runner::network::{RunInfo, RunMeter};
use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::net::UnixListener;
use tokio::task::JoinSet;
use uuid::Uuid;

pub use policy::{CallPlan, Refusal, Route};
pub use usage::{Provider, Usage, UsageReader};

/// The largest request body passed on (a model call with a long conversation is a few MB).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The secret (or service environment variable) holding the Anthropic key.
pub const ANTHROPIC_KEY: &str = "ANTHROPIC_API_KEY";

/// The secret (or service environment variable) holding the OpenAI key.
pub const OPENAI_KEY: &str = "OPENAI_API_KEY";

/// The default Anthropic upstream (`AGENTRY_ANTHROPIC_UPSTREAM`).
pub const DEFAULT_ANTHROPIC_UPSTREAM: &str = "https://api.anthropic.com";

/// The default OpenAI upstream (`AGENTRY_OPENAI_UPSTREAM`).
pub const DEFAULT_OPENAI_UPSTREAM: &str = "https://api.openai.com/v1";

/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the agent may take to send a request body; a slower one answers `408`.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the upstream may stay silent in the middle of an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// The body type of the gateway's answers.
type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// What the gateway needs from the service's configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where Anthropic calls go (`AGENTRY_ANTHROPIC_UPSTREAM`), e.g. `https://api.anthropic.com`.
    pub anthropic_upstream: url::Url,
    /// Where OpenAI calls go (`AGENTRY_OPENAI_UPSTREAM`), e.g. `https://api.openai.com/v1`.
    pub openai_upstream: url::Url,
    /// `ANTHROPIC_API_KEY` of the service's environment, used when no such secret is stored.
    pub anthropic_key: Option<SecretValue>,
    /// `OPENAI_API_KEY` (else `CODEX_API_KEY`) of the service's environment, used when no
    /// such secret is stored.
    pub openai_key: Option<SecretValue>,
    /// How long the agent may take to send a request body ([`BODY_TIMEOUT`]).
    pub body_timeout: Duration,
}

/// The model gateway of one service process (cheap to clone).
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

struct Shared {
    config: GatewayConfig,
    client: reqwest::Client,
    prices: PriceTable,
    db: Db,
    master_key: MasterKey,
    /// Metered calls not yet written, per run (task, attempt).
    inflight: parking_lot::Mutex<std::collections::HashMap<(Uuid, i32), usize>>,
    /// Notified whenever a metered call has been written.
    written: tokio::sync::Notify,
}

impl Shared {
    fn inflight(
        &self,
    ) -> parking_lot::MutexGuard<'_, std::collections::HashMap<(Uuid, i32), usize>> {
        self.inflight.lock()
    }

    fn call_started(&self, run: (Uuid, i32)) {
        *self.inflight().entry(run).or_insert(0) += 1;
    }

    fn call_written(&self, run: (Uuid, i32)) {
        let mut inflight = self.inflight();
        if let Some(n) = inflight.get_mut(&run) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inflight.remove(&run);
            }
        }
        drop(inflight);
        self.written.notify_waiters();
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field(
                "anthropic_upstream",
                &self.shared.config.anthropic_upstream.as_str(),
            )
            .field(
                "openai_upstream",
                &self.shared.config.openai_upstream.as_str(),
            )
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// The gateway of `config`, pricing calls with `prices` and recording them in `db`
    /// (secrets decrypted with `master_key`).
    pub fn new(
        config: GatewayConfig,
        prices: PriceTable,
        db: Db,
        master_key: MasterKey,
    ) -> Result<Gateway, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(90))
            .redirect(reqwest::redirect::Policy::none())
            // The service's own HTTPS_PROXY/NO_PROXY apply (an operator behind a proxy).
            .build()
            .map_err(|e| format!("cannot build the model gateway's HTTP client: {e}"))?;
        Ok(Gateway {
            shared: Arc::new(Shared {
                config,
                client,
                prices,
                db,
                master_key,
                inflight: parking_lot::Mutex::new(std::collections::HashMap::new()),
                written: tokio::sync::Notify::new(),
            }),
        })
    }

    /// Waits (at most `timeout`) until every metered call of the run has been written, so
    /// that the run's totals read afterwards include them all. Returns whether they were.
    pub async fn drain(&self, task_id: Uuid, attempt: i32, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.written.notified();
            if !self.shared.inflight().contains_key(&(task_id, attempt)) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return !self.shared.inflight().contains_key(&(task_id, attempt));
            }
        }
    }

    /// Serves `run`'s gateway on a new Unix socket at `socket` until the returned
    /// [`RunGate`] is dropped; the provider's outbound features pass only if
    /// `allow_provider_tools` (the repository's `allowProviderTools`). Returns the run's key
    /// and its meter with it.
    pub async fn open_run(
        &self,
        run: &RunInfo,
        socket: &Path,
        allow_provider_tools: bool,
    ) -> Result<(String, Arc<RunMeter>, RunGate), String> {
        let provider = match run.agent.agent_type {
            AgentType::ClaudeCode => Provider::Anthropic,
            AgentType::Codex => Provider::OpenAi,
        };
        let upstream_key = self.upstream_key(provider).await;
        if upstream_key.is_none() {
            tracing::warn!(
                task = %run.task_id,
                "no {} is stored or set: the agent's model calls will be refused",
                key_name(provider)
            );
        }
        let key = run_key()?;
        let meter = Arc::new(RunMeter::default());
        let run = Arc::new(RunCtx {
            task_id: run.task_id,
            attempt: run.attempt,
            provider,
            key_digest: Sha256::digest(key.as_bytes()).into(),
            upstream_key,
            allowance: run.agent.max_budget_usd,
            allow_provider_tools,
            meter: meter.clone(),
            revoked: AtomicBool::new(false),
            shared: self.shared.clone(),
        });
        let server = SocketServer::start(socket, "the gateway socket", |listener| {
            tokio::spawn(accept_loop(listener, run.clone()))
        })?;
        Ok((
            key,
            meter,
            RunGate {
                run,
                _server: server,
            },
        ))
    }

    /// The real key of `provider`: the stored secret, else the service's environment.
    async fn upstream_key(&self, provider: Provider) -> Option<SecretValue> {
        let name = key_name(provider);
        let db = self.shared.db.clone();
        let master = self.shared.master_key.clone();
        let stored = tokio::task::spawn_blocking(move || {
            let mut conn = db.conn().map_err(|e| e.to_string())?;
            secrets::get(&mut conn, &master, name).map_err(|e| e.to_string())
        })
        .await;
        match stored {
            Ok(Ok(Some(value))) => return Some(value),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::error!(secret = name, error = %e, "cannot read a model key"),
            Err(e) => tracing::error!(secret = name, error = %e, "cannot read a model key"),
        }
        match provider {
            Provider::Anthropic => self.shared.config.anthropic_key.clone(),
            Provider::OpenAi => self.shared.config.openai_key.clone(),
        }
    }
}

/// A Unix socket listening at `path`. A socket address holds at most 108 bytes of path, so
/// a longer one (a deep data directory) is bound through `/proc/self/fd/N/`, N being its
/// directory opened for the call.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::fd::AsRawFd;
    const MAX_SOCKET_PATH: usize = 100;
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return UnixListener::bind(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return UnixListener::bind(path);
    };
    let dir = std::fs::File::open(dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let listener = UnixListener::bind(&short);
    drop(dir);
    listener
}

/// A task serving a Unix socket: dropping it stops the task (and with it the connections
/// the task holds) and removes the socket's file.
pub struct SocketServer {
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl SocketServer {
    /// Listens at `path` ([`bind_unix`]) and hands the listener to `serve`, which spawns the
    /// task that serves it. The error names the socket as `what`.
    pub fn start(
        path: &Path,
        what: &str,
        serve: impl FnOnce(UnixListener) -> tokio::task::JoinHandle<()>,
    ) -> Result<SocketServer, String> {
        let listener = bind_unix(path)
            .map_err(|e| format!("cannot listen on {what} {}: {e}", path.display()))?;
        Ok(SocketServer {
            task: serve(listener),
            path: path.to_owned(),
        })
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The name of `provider`'s key.
pub fn key_name(provider: Provider) -> &'static str {
    match provider {
        Provider::Anthropic => ANTHROPIC_KEY,
        Provider::OpenAi => OPENAI_KEY,
    }
}

/// A new run key: `agentry-run-` and 32 random bytes.
fn run_key() -> Result<String, String> {
    let mut bytes = [0_u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a run key: {e}"))?;
    Ok(format!(
        "agentry-run-{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// A run's gateway, open while this value lives.
pub struct RunGate {
    run: Arc<RunCtx>,
    /// The accept loop; its connections (each in its JoinSet) end with it.
    _server: SocketServer,
}

impl std::fmt::Debug for RunGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunGate")
            .field("task", &self.run.task_id)
            .field("attempt", &self.run.attempt)
            .finish_non_exhaustive()
    }
}

impl Drop for RunGate {
    fn drop(&mut self) {
        // Calls already accepted see the revocation; `_server` then stops accepting.
        self.run.revoked.store(true, Ordering::SeqCst);
    }
}

/// One run, as its gateway sees it.
struct RunCtx {
    task_id: Uuid,
    attempt: i32,
    provider: Provider,
    key_digest: [u8; 32],
    upstream_key: Option<SecretValue>,
    allowance: Option<Usd>,
    /// Whether the provider's outbound features pass ([`policy::outbound_features`]).
    allow_provider_tools: bool,
    meter: Arc<RunMeter>,
    revoked: AtomicBool,
    shared: Arc<Shared>,
}

/// The most connections one run may hold open to its gateway at once (each may buffer a
/// request body of up to [`MAX_BODY_BYTES`]); more are closed as they come.
pub const MAX_CONNECTIONS_PER_RUN: usize = 16;

async fn accept_loop(listener: UnixListener, run: Arc<RunCtx>) {
    let mut connections = JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS_PER_RUN));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(
                            task = %run.task_id,
                            "the agent holds {MAX_CONNECTIONS_PER_RUN} connections to the gateway; closing another"
                        );
                        drop(stream);
                        continue;
                    };
                    let run = run.clone();
                    connections.spawn(async move {
                        let _slot = slot;
                        let service = hyper::service::service_fn(move |req| {
                            let run = run.clone();
                            async move { Ok::<_, Infallible>(handle(run, req).await) }
                        });
                        let served = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                        if let Err(e) = served {
                            tracing::debug!(error = %e, "a gateway connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the gateway could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The upstream URL of `path_and_query` (which starts with `/v1/`).
fn upstream_url(config: &GatewayConfig, provider: Provider, path_and_query: &str) -> String {
    match provider {
        Provider::Anthropic => format!(
            "{}{}",
            config.anthropic_upstream.as_str().trim_end_matches('/'),
            path_and_query
        ),
        // The OpenAI base URL includes its `/v1`.
        Provider::OpenAi => format!(
            "{}{}",
            config.openai_upstream.as_str().trim_end_matches('/'),
            path_and_query.strip_prefix("/v1").unwrap_or(path_and_query)
        ),
    }
}

/// Serves one request of the agent: the answer, or the gateway's own refusal in the
/// provider's error shape.
async fn handle(run: Arc<RunCtx>, req: Request<Incoming>) -> Response<Body> {
    match serve(&run, req).await {
        Ok(response) => response,
        Err(refusal) => error(run.provider, refusal.status, refusal.code, &refusal.message),
    }
}

/// The steps of one request: the connectivity check, the transport, the key, the route,
/// the body, the provider features, the call's plan and reservation, then the upstream.
async fn serve(run: &Arc<RunCtx>, req: Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let provider = run.provider;
    if req.uri().path() == "/" && matches!(*req.method(), Method::GET | Method::HEAD) {
        return Ok(plain(StatusCode::OK, ""));
    }
    if req.headers().contains_key(header::UPGRADE) {
        return Err(refusal(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_not_supported",
            "the agentry model gateway speaks HTTP only: send the request without Upgrade",
        ));
    }
    if run.revoked.load(Ordering::SeqCst) || !authorized(run, req.headers()) {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "invalid API key for this agentry run (it works only for its own run, while the \
             run lasts, through the gateway)",
        ));
    }
    let route = policy::route(provider, req.method(), req.uri().path())?;
    let Some(upstream_key) = run.upstream_key.clone() else {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            &format!(
                "agentry has no {} to call the model API with (PUT /api/secrets/{0} or set it \
                 in the service's environment)",
                key_name(provider)
            ),
        ));
    };
    let started = Instant::now();
    let started_at = agentry_persistence::now();
    let (parts, body) = req.into_parts();
    let body = read_body(&parts.headers, body, run.shared.config.body_timeout).await?;
    let plan = if parts.method == Method::POST {
        inspect(run, route, &parts.headers, &body).await?
    } else {
        policy::outbound_features(provider, &parts.headers, None, run.allow_provider_tools)?;
        None
    };
    let call = match plan {
        Some(plan) => Some(reserve(run, plan, started_at, started).await?),
        None => None,
    };
    Ok(forward(run, parts, body, upstream_key, call).await)
}

/// Bodies at least this long are parsed and checked on a blocking thread: a few MiB of JSON
/// take milliseconds to parse (and to free), which would stall the runtime's other
/// connections meanwhile.
const BLOCKING_INSPECT_BYTES: usize = 256 * 1024;

/// Checks a `POST` body and plans its call ([`policy::inspect`]): the parsed body lives only
/// while it is checked, never while the call is reserved and forwarded.
async fn inspect(
    run: &Arc<RunCtx>,
    route: Route,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Option<CallPlan>, Refusal> {
    let check = move |run: &RunCtx, headers: &HeaderMap, body: &[u8]| {
        policy::inspect(
            run.provider,
            route,
            headers,
            body,
            run.allow_provider_tools,
            &run.shared.prices,
        )
    };
    if body.len() < BLOCKING_INSPECT_BYTES {
        return check(run, headers, body);
    }
    let (owned_run, headers, body) = (run.clone(), headers.clone(), body.clone());
    tokio::task::spawn_blocking(move || check(&owned_run, &headers, &body))
        .await
        .unwrap_or_else(|e| {
            tracing::error!(task = %run.task_id, error = %e, "the check of a request body failed");
            Err(refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "the agentry model gateway could not check the request body; it was not sent",
            ))
        })
}

/// A refusal of the gateway's own.
fn refusal(status: StatusCode, code: &'static str, message: &str) -> Refusal {
    Refusal {
        status,
        code,
        message: message.to_owned(),
    }
}

/// Reads the request body: at most [`MAX_BODY_BYTES`] (else 413), within `timeout`
/// ([`GatewayConfig::body_timeout`], else 408), so a slow or endless body holds neither
/// memory nor a connection for long.
async fn read_body(
    headers: &HeaderMap,
    mut incoming: Incoming,
    timeout: Duration,
) -> Result<Bytes, Refusal> {
    let too_large = || {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            &format!(
                "the request body is larger than the gateway's limit of {} MiB",
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        )
    };
    // One buffer of the declared length (a long conversation is hundreds of KB): the body
    // is copied once, into memory that does not grow and move as it arrives.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let mut buffer =
        bytes::BytesMut::with_capacity(declared.map_or(0, |n| usize::try_from(n).unwrap_or(0)));
    let read = async {
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| {
                refusal(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("could not read the request body: {e}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                if buffer.len() + data.len() > MAX_BODY_BYTES {
                    return Err(too_large());
                }
                buffer.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => Ok(buffer.freeze()),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(refusal(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        )),
    }
}

/// Reserves the largest cost of a planned model call: in the run's meter against what is
/// left of the task's cap, then in the database against the monthly budgets, across every
/// run of every replica ([`budgets::hold_call`]). A call that does not fit is refused with
/// 429 (recorded as a refused call) and the run is marked exhausted, with the budget named.
async fn reserve(
    run: &Arc<RunCtx>,
    plan: CallPlan,
    started_at: OffsetDateTime,
    started: Instant,
) -> Result<CallRecorder, Refusal> {
    let recorder = CallRecorder::new(run.clone(), plan, started_at, started);
    let amount = recorder.plan.reservation;
    if let Err(ledger) = run.meter.reserve(amount, run.allowance) {
        let reason = format!(
            "this task's maxCostPerTaskUsd has {} USD left for this run, which has spent {} USD \
             with {} USD reserved by its calls in flight, and a call that may cost up to {} USD \
             was not sent",
            run.allowance.unwrap_or(Usd::ZERO),
            ledger.spent,
            ledger.reserved,
            amount,
        );
        return Err(over_budget(run, recorder, reason));
    }
    let held = {
        let db = run.shared.db.clone();
        let (task, attempt) = (run.task_id, run.attempt);
        tokio::task::spawn_blocking(move || {
            let mut conn = db.conn().map_err(|e| e.to_string())?;
            budgets::hold_call(&mut conn, task, attempt, amount, agentry_persistence::now())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|decided| decided)
    };
    match held {
        Ok(CallHold::Held) => Ok(recorder.reserved(amount)),
        Ok(CallHold::Unbudgeted) => Ok(recorder.reserved(Usd::ZERO)),
        Ok(CallHold::Refused(shortfall)) => {
            run.meter.release(amount);
            let reason = format!(
                "{} monthly budget of {} USD has {} USD left ({} USD spent this month by \
                 finished runs, {} USD held by runs in progress), and a call that may cost up \
                 to {} USD was not sent",
                match shortfall.scope {
                    BudgetScope::Repository => "the repository's",
                    BudgetScope::Instance => "the instance's",
                },
                shortfall.budget,
                shortfall.left(),
                shortfall.spent,
                shortfall.held,
                amount,
            );
            Err(over_budget(run, recorder, reason))
        }
        Ok(CallHold::NotRunning) => {
            run.meter.release(amount);
            recorder.refused(StatusCode::FORBIDDEN);
            Err(refusal(
                StatusCode::FORBIDDEN,
                "run_ended",
                "this agentry run is over (recorded, cancelled or recovered elsewhere); the \
                 call was not sent",
            ))
        }
        Err(e) => {
            // Fail closed: a call whose budgets cannot be checked is not sent.
            run.meter.release(amount);
            tracing::warn!(task = %run.task_id, error = %e, "could not check a model call against the budgets");
            recorder.refused(StatusCode::SERVICE_UNAVAILABLE);
            Err(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "budget_unavailable",
                "agentry could not check this call against the budgets (its database did not \
                 answer); the call was not sent, try again",
            ))
        }
    }
}

/// Refuses `recorder`'s call with 429 for `reason` (a budget it did not fit) and marks the
/// run exhausted: the runner stops it with that reason.
fn over_budget(run: &Arc<RunCtx>, recorder: CallRecorder, reason: String) -> Refusal {
    let message = format!("budget reached: {reason}");
    run.meter.exhaust_because(reason);
    recorder.refused(StatusCode::TOO_MANY_REQUESTS);
    refusal(StatusCode::TOO_MANY_REQUESTS, "budget_reached", &message)
}

/// Sends the request upstream with its listed headers and the real key, and streams the
/// answer back without the headers naming the operator's account ([`headers`]), reading a
/// model call's usage as it passes.
async fn forward(
    run: &Arc<RunCtx>,
    parts: hyper::http::request::Parts,
    body: Bytes,
    upstream_key: SecretValue,
    call: Option<CallRecorder>,
) -> Response<Body> {
    let provider = run.provider;
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str())
        .to_owned();
    let url = upstream_url(&run.shared.config, provider, &path_and_query);
    let mut headers = headers::forwarded_request(provider, &parts.headers);
    let auth = match provider {
        Provider::Anthropic => ("x-api-key", upstream_key.expose().to_owned()),
        Provider::OpenAi => ("authorization", format!("Bearer {}", upstream_key.expose())),
    };
    match HeaderValue::from_str(&auth.1) {
        Ok(mut value) => {
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static(auth.0), value);
        }
        Err(_) => {
            if let Some(call) = call {
                call.refused(StatusCode::BAD_GATEWAY);
            }
            return error(
                provider,
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!(
                    "the stored {} is not a valid header value",
                    key_name(provider)
                ),
            );
        }
    }
    // From here the upstream may do (and bill) the work, whatever happens to this request
    // (the agent hanging up, the run ending) before its answer comes.
    let mut call = call;
    if let Some(call) = &mut call {
        call.sent = true;
    }
    let sent = run
        .shared
        .client
        .request(parts.method.clone(), &url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream = match sent {
        Ok(response) => response,
        Err(e) => {
            if let Some(call) = call {
                // Nothing went out when the connection could not be made; otherwise the
                // upstream may have done (and billed) the work.
                call.failed(StatusCode::BAD_GATEWAY, !e.is_connect());
            }
            tracing::warn!(task = %run.task_id, error = %e, "the model API could not be reached");
            return error(
                provider,
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!("the agentry model gateway could not reach the model API: {e}"),
            );
        }
    };
    let status = upstream.status();
    let mut response = Response::builder().status(status);
    let streamed = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Some(headers) = response.headers_mut() {
        for (name, value) in upstream.headers() {
            if headers::answered(name) {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    let body: Body = match call {
        None => {
            let stream = upstream
                .bytes_stream()
                .map(|chunk| chunk.map(Frame::data).map_err(std::io::Error::other));
            http_body_util::StreamBody::new(stream).boxed_unsync()
        }
        Some(mut call) => {
            call.begin(status, streamed, upstream.content_length());
            let stream = futures_util::stream::unfold(
                (upstream.bytes_stream(), call),
                |(mut stream, mut call)| async move {
                    match stream.next().await {
                        Some(Ok(chunk)) => {
                            call.feed(&chunk);
                            Some((Ok(Frame::data(chunk)), (stream, call)))
                        }
                        Some(Err(e)) => {
                            call.broke_off();
                            Some((Err(std::io::Error::other(e)), (stream, call)))
                        }
                        None => {
                            call.ended();
                            None
                        }
                    }
                },
            );
            http_body_util::StreamBody::new(stream).boxed_unsync()
        }
    };
    response.body(body).unwrap_or_else(|e| {
        error(
            provider,
            StatusCode::BAD_GATEWAY,
            "api_error",
            &format!("the model API's answer could not be passed on: {e}"),
        )
    })
}

/// Whether `headers` carry the run's key.
fn authorized(run: &RunCtx, headers: &HeaderMap) -> bool {
    let presented = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        });
    // Compared by digest: the time taken says nothing about the key.
    presented.is_some_and(|key| {
        let digest: [u8; 32] = Sha256::digest(key.trim().as_bytes()).into();
        digest == run.key_digest
    })
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
}

/// An error in `provider`'s shape (Anthropic: `{"type":"error","error":{"type","message"}}`;
/// OpenAI: `{"error":{"message","type","param","code"}}`).
fn error(provider: Provider, status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = match provider {
        Provider::Anthropic => {
            let kind = match status {
                StatusCode::UNAUTHORIZED => "authentication_error",
                StatusCode::NOT_FOUND => "not_found_error",
                StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
                s if s.is_client_error() => "invalid_request_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Provider::OpenAi => {
            let (kind, code) = match status {
                // Codex does not retry an exhausted quota.
                StatusCode::TOO_MANY_REQUESTS => ("insufficient_quota", "insufficient_quota"),
                StatusCode::UNAUTHORIZED => ("invalid_request_error", "invalid_api_key"),
                s if s.is_client_error() => ("invalid_request_error", code),
                _ => ("server_error", code),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    };
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// One metered call: reads its answer as it passes and records it once, when it is
/// dropped (the answer ended, broke off, or the agent hung up). Its reservation is then
/// replaced by its cost: the priced usage the answer reported or, when the answer did not
/// carry its final usage, at least the reservation (unknown usage is spent, never free).
struct CallRecorder {
    run: Arc<RunCtx>,
    plan: CallPlan,
    /// What this call holds reserved in the run's meter (zero until it is reserved).
    reserved: Usd,
    /// What this call holds in the database against the monthly budgets.
    held: Usd,
    started_at: OffsetDateTime,
    started: Instant,
    status: StatusCode,
    outcome: &'static str,
    /// Whether the request went upstream.
    sent: bool,
    reader: Option<UsageReader>,
    /// The answer's length, when the upstream said it: once that much has passed, the
    /// answer is complete (the server may never ask for the end of a body it has all of).
    expected: Option<u64>,
    received: u64,
    recorded: bool,
}

impl CallRecorder {
    fn new(run: Arc<RunCtx>, plan: CallPlan, started_at: OffsetDateTime, started: Instant) -> Self {
        run.shared.call_started((run.task_id, run.attempt));
        CallRecorder {
            run,
            plan,
            reserved: Usd::ZERO,
            held: Usd::ZERO,
            started_at,
            started,
            status: StatusCode::OK,
            outcome: "interrupted",
            sent: false,
            reader: None,
            expected: None,
            received: 0,
            recorded: false,
        }
    }

    /// The call, its reservation made in the run's meter and `held` of it in the database
    /// against the monthly budgets (zero when none applies).
    fn reserved(mut self, held: Usd) -> Self {
        self.reserved = self.plan.reservation;
        self.held = held;
        self
    }

    /// The gateway answered `status` itself; nothing was sent.
    fn refused(mut self, status: StatusCode) {
        self.status = status;
        self.outcome = metering::REFUSED;
    }

    /// The call failed before an answer came: `sent` if the request may have reached the
    /// upstream (then its usage is unknown), else nothing went out.
    fn failed(mut self, status: StatusCode, sent: bool) {
        self.sent = sent;
        self.status = status;
        self.outcome = if sent {
            "interrupted"
        } else {
            "upstream_error"
        };
    }

    fn begin(&mut self, status: StatusCode, streamed: bool, length: Option<u64>) {
        self.status = status;
        self.reader = Some(UsageReader::new(self.run.provider, streamed));
        self.expected = length;
        if length == Some(0) {
            self.ended();
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        if let Some(reader) = &mut self.reader {
            reader.feed(chunk);
        }
        self.received = self.received.saturating_add(chunk.len() as u64);
        if self.expected == Some(self.received) {
            self.ended();
        }
    }

    fn broke_off(&mut self) {
        self.outcome = "interrupted";
    }

    fn ended(&mut self) {
        self.outcome = if self.status.is_success() {
            "completed"
        } else {
            "upstream_error"
        };
    }

    /// The call as recorded: its usage, model, outcome and cost.
    fn call(&mut self) -> ModelCall {
        let (usage, model, finished) = match &mut self.reader {
            Some(reader) => {
                reader.finish();
                let model = reader.model().unwrap_or(&self.plan.model).to_owned();
                (reader.usage(), model, reader.finished())
            }
            None => (Usage::default(), self.plan.model.clone(), false),
        };
        // Priced for the model that answered when it has a price, else as planned.
        let price = self
            .run
            .shared
            .prices
            .get(&model)
            .copied()
            .unwrap_or(self.plan.price);
        let priced = usage.cost(&price);
        // The usage is known when its final event came, or when the provider answered an
        // error to its end (an error is not billed). Otherwise (a broken-off answer, one
        // too large to read, a background request) the call cost at least its reservation.
        let known = !self.plan.unknown_usage
            && (finished || self.outcome == "upstream_error")
            && priced.is_some();
        let cost = if !self.sent {
            Usd::ZERO
        } else if known {
            priced.unwrap_or(self.plan.reservation)
        } else {
            if self.outcome == "completed" {
                self.outcome = "unmetered";
            }
            priced.map_or(self.plan.reservation, |p| p.max(self.plan.reservation))
        };
        ModelCall {
            id: Uuid::now_v7(),
            task_id: self.run.task_id,
            attempt: self.run.attempt,
            provider: self.run.provider.as_str().to_owned(),
            model: Some(model),
            status: i32::from(self.status.as_u16()),
            outcome: self.outcome.to_owned(),
            tokens: usage.tokens(),
            reasoning_tokens: usage.reasoning,
            cost_usd: Some(cost),
            started_at: self.started_at,
            duration_ms: i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

impl Drop for CallRecorder {
    fn drop(&mut self) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let call = self.call();
        self.run
            .meter
            .settle(self.reserved, call.cost_usd.unwrap_or(self.reserved));
        let shared = self.run.shared.clone();
        let held = self.held;
        let write = move || {
            let written = shared
                .db
                .conn()
                .map_err(|e| e.to_string())
                .and_then(|mut conn| record(&mut conn, &call, held));
            if let Err(e) = written {
                tracing::error!(task = %call.task_id, error = %e, "could not record a metered model call");
            }
            shared.call_written((call.task_id, call.attempt));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(write);
            }
            Err(_) => write(),
        }
    }
}

/// Records `call` and replaces what it `held` against the budgets by its cost, trying again
/// a few times while the database is busy.
fn record(conn: &mut AnyConnection, call: &ModelCall, held: Usd) -> Result<(), String> {
    let mut tries = 0;
    loop {
        match metering::record_held_call(conn, call, held) {
            Ok(()) => return Ok(()),
            Err(agentry_persistence::DbError::Busy(_)) if tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20 << tries));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_keep_the_query_and_join_the_base() {
        let config = GatewayConfig {
            anthropic_upstream: url::Url::parse("https://api.anthropic.com").unwrap(),
            openai_upstream: url::Url::parse("https://api.openai.com/v1/").unwrap(),
            anthropic_key: None,
            openai_key: None,
            body_timeout: BODY_TIMEOUT,
        };
        assert_eq!(
            upstream_url(&config, Provider::Anthropic, "/v1/messages?beta=true"),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        assert_eq!(
            upstream_url(&config, Provider::OpenAi, "/v1/responses"),
            "https://api.openai.com/v1/responses"
        );
    }
}
