//! `POST /api/webhooks/codehost` (docs/contract.md#56-webhook): GitHub's webhook, authenticated by its
//! signature instead of a bearer token.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError, post, web};
use agentry_codehost::webhook::{
    self, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, SignatureError,
};
use serde::Serialize;
use tokio::sync::Semaphore;
use utoipa::ToSchema;

use crate::body::read_limited;
use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;
use agentry_service::tracking::WebhookOutcome;

/// Largest webhook body accepted (GitHub caps payloads at 25 MB).
pub const WEBHOOK_LIMIT: usize = 25 * 1024 * 1024;
/// Longest accepted `X-GitHub-Delivery` / `X-GitHub-Event` value.
const MAX_HEADER_CHARS: usize = 200;

/// What one server allows the webhook, so that unauthenticated uploads (anyone can send
/// them) cannot starve signed deliveries:
///
/// - **memory**: bodies are read into at most [`WebhookLimits::MEMORY`] bytes at once, each
///   taking its declared length of it; a delivery waits up to `queue_wait` for its share,
///   then gets 503 with `Retry-After`;
/// - **large bodies** (over [`WebhookLimits::LARGE_BODY`]) are also read at most
///   `concurrent_reads` at a time, so they can never take more than half the memory: small
///   deliveries (nearly all of GitHub's) always find room;
/// - **pace**: a body must arrive within 1 s plus its length at [`WebhookLimits::MIN_RATE`],
///   and never more than `read_timeout`; a slow upload is cut off (408) in about a second
///   unless it is large, so holding memory costs an attacker a connection per second.
///
/// One value is shared by all the workers of a server (`app_data`).
#[derive(Debug, Clone)]
pub struct WebhookLimits {
    memory: Arc<Semaphore>,
    memory_kib: usize,
    large: Arc<Semaphore>,
    queue_wait: Duration,
    read_timeout: Duration,
    min_rate: usize,
}

impl WebhookLimits {
    /// Large bodies read at once by default.
    pub const CONCURRENT_READS: usize = 2;
    /// How long a delivery waits for its share by default.
    pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
    /// The longest a body may take. GitHub itself gives up on a delivery after 10 seconds,
    /// so a read that takes longer is never a real delivery.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Bytes of bodies held at once by default (4 × the largest body).
    pub const MEMORY: usize = 4 * WEBHOOK_LIMIT;
    /// A body above this many bytes is large.
    pub const LARGE_BODY: usize = 1024 * 1024;
    /// The slowest pace a body may arrive at, in bytes per second.
    pub const MIN_RATE: usize = 256 * 1024;

    /// Limits of `concurrent_reads` large bodies at once, `queue_wait` for a share of the
    /// memory and `read_timeout` per body at most (the memory and pace are the defaults).
    pub fn new(concurrent_reads: usize, queue_wait: Duration, read_timeout: Duration) -> Self {
        let memory_kib = Self::MEMORY / 1024;
        WebhookLimits {
            memory: Arc::new(Semaphore::new(memory_kib)),
            memory_kib,
            large: Arc::new(Semaphore::new(concurrent_reads)),
            queue_wait,
            read_timeout,
            min_rate: Self::MIN_RATE,
        }
    }

    /// These limits with `bytes` of bodies held at once (at least 1 KiB).
    pub fn with_memory(mut self, bytes: usize) -> Self {
        self.memory_kib = bytes.div_ceil(1024).max(1);
        self.memory = Arc::new(Semaphore::new(self.memory_kib));
        self
    }

    /// These limits with bodies allowed to arrive as slowly as `bytes_per_second` (at least
    /// 1), still within `read_timeout`.
    pub fn with_min_rate(mut self, bytes_per_second: usize) -> Self {
        self.min_rate = bytes_per_second.max(1);
        self
    }

    /// How long a body of `length` bytes may take to arrive.
    fn deadline(&self, length: usize) -> Duration {
        let pace = Duration::from_secs(1)
            + Duration::from_secs_f64(length as f64 / self.min_rate.max(1) as f64);
        pace.min(self.read_timeout)
    }
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits::new(Self::CONCURRENT_READS, Self::QUEUE_WAIT, Self::READ_TIMEOUT)
    }
}

/// The answer to a delivery.
#[derive(Serialize, ToSchema)]
pub struct WebhookAck {
    /// Always true: the delivery was accepted.
    pub ok: bool,
    /// Present and true when agentry does not act on this event.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ignored: bool,
    /// Present and true for a delivery id seen before (nothing done again).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

fn header(req: &HttpRequest, name: impl header::AsHeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn required_header<'r>(req: &'r HttpRequest, name: &str) -> Result<&'r str, ApiError> {
    header(req, name)
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= MAX_HEADER_CHARS)
        .ok_or_else(|| {
            ApiError::invalid_request(format!(
                "the {name} header is missing, empty or longer than {MAX_HEADER_CHARS} characters"
            ))
        })
}

/// The declared body length, checked against [`WEBHOOK_LIMIT`] before anything is read. A
/// request without `Content-Length` has no body, unless it is chunked: that one is refused
/// (411), since its size is only known after reading it.
fn declared_length(req: &HttpRequest) -> Result<usize, ApiError> {
    match req.headers().get(header::CONTENT_LENGTH) {
        Some(value) => {
            let length = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid_request("Content-Length is not a number"))?;
            match usize::try_from(length) {
                Ok(length) if length <= WEBHOOK_LIMIT => Ok(length),
                _ => Err(ApiError::payload_too_large(WEBHOOK_LIMIT)),
            }
        }
        None if req.headers().contains_key(header::TRANSFER_ENCODING) => {
            Err(ApiError::length_required())
        }
        None => Ok(0),
    }
}

/// Everything that can be checked before the body is read, cheapest first: the webhook is
/// enabled (404), the signature header is present and well formed (401), the event and
/// delivery headers are present (400), and the declared length is within the limit (413,
/// 411). Returns the event name and the delivery id.
fn check_head(req: &HttpRequest, state: &AppState) -> Result<(String, String), ApiError> {
    let Some(secret) = state.service.webhook_secret() else {
        return Err(ApiError::webhook_disabled());
    };
    // The MAC of an empty body is computed only to reuse the header's parsing: a missing or
    // malformed header is told apart from a mismatch, which is decided after the read.
    match webhook::verify_signature(
        secret.expose().as_bytes(),
        b"",
        header(req, SIGNATURE_HEADER),
    ) {
        Ok(()) | Err(SignatureError::Mismatch) => {}
        Err(e) => return Err(ApiError::unauthenticated(format!("webhook signature: {e}"))),
    }
    let event = required_header(req, EVENT_HEADER)?.to_owned();
    let delivery = required_header(req, DELIVERY_HEADER)?.to_owned();
    declared_length(req)?;
    Ok((event, delivery))
}

/// An error answer after which the connection is closed: the unread rest of the body is
/// never read.
fn closing(error: ApiError) -> HttpResponse {
    let mut res = error.error_response();
    res.head_mut()
        .set_connection_type(actix_web::http::ConnectionType::Close);
    res
}

/// Receives a code-host webhook delivery. Before any of the body is read, the request must
/// carry a well-formed signature header, the event and delivery headers, and a
/// `Content-Length` within 25 MiB; then the body is read (a few at a time, each within a time
/// limit) and the signature (`X-Hub-Signature-256`, HMAC-SHA256 of the raw body with
/// `CODEHOST_WEBHOOK_SECRET`) is checked in constant time before anything is parsed. A merged
/// or closed pull request moves its task at once; a labelled issue starts a sync of its
/// repository after the answer; a delivery id seen before is acknowledged and not processed
/// again.
#[utoipa::path(
    tag = "webhooks",
    params(
        ("X-Hub-Signature-256" = String, Header, pattern = "^sha256=[0-9a-fA-F]{64}$",
            description = "sha256=<hex HMAC-SHA256 of the body>"),
        ("X-GitHub-Event" = String, Header, min_length = 1, max_length = 200,
            pattern = "^[\\x21-\\x7E]+$", description = "ping, issues, pull_request, …"),
        ("X-GitHub-Delivery" = String, Header, min_length = 1, max_length = 200,
            pattern = "^[\\x21-\\x7E]+$", description = "Delivery id (de-duplicated)"),
    ),
    request_body(content = Object, description = "GitHub's webhook payload"),
    responses(
        (status = 200, body = WebhookAck),
        (status = 400, body = ErrorBody),
        (status = 401, description = "Missing or wrong signature", body = ErrorBody),
        (status = 404, description = "webhook_disabled: no CODEHOST_WEBHOOK_SECRET", body = ErrorBody),
        (status = 408, description = "The body was not received in time", body = ErrorBody),
        (status = 411, description = "A chunked body without Content-Length", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 503, description = "Too many deliveries being read; retry after Retry-After",
            body = ErrorBody),
    ),
    // Signed by the code host instead of a bearer token.
    security()
)]
#[post("/webhooks/codehost")]
pub async fn codehost_webhook(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (event_name, delivery) = check_head(&req, &state).map_err(|e| {
        // Refused before the body: whatever the client still sends is never read.
        tracing::debug!(error = %e, "webhook refused before its body");
        e
    })?;
    let limits = req
        .app_data::<web::Data<WebhookLimits>>()
        .map_or_else(WebhookLimits::default, |l| l.get_ref().clone());
    let length = declared_length(&req)?;
    let busy = || {
        let mut res = closing(ApiError::busy(
            "too many webhook deliveries are being received; retry shortly",
        ));
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        res
    };
    let queued = tokio::time::Instant::now() + limits.queue_wait;
    // A large body takes a large slot first, then its share of the memory.
    let large = if length > WebhookLimits::LARGE_BODY {
        match tokio::time::timeout_at(queued, limits.large.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => return Ok(busy()),
        }
    } else {
        None
    };
    let share =
        u32::try_from(length.div_ceil(1024).clamp(1, limits.memory_kib)).unwrap_or(u32::MAX);
    let Ok(Ok(memory)) =
        tokio::time::timeout_at(queued, limits.memory.clone().acquire_many_owned(share)).await
    else {
        return Ok(busy());
    };
    let deadline = limits.deadline(length);
    let body = match tokio::time::timeout(deadline, read_limited(payload, WEBHOOK_LIMIT)).await {
        Ok(body) => body?,
        Err(_) => {
            return Ok(closing(ApiError::request_timeout(format!(
                "the body ({length} bytes) was not received within {:.1} seconds",
                deadline.as_secs_f32()
            ))));
        }
    };
    drop((memory, large));
    let Some(secret) = state.service.webhook_secret() else {
        return Err(ApiError::webhook_disabled());
    };
    webhook::verify_signature(
        secret.expose().as_bytes(),
        &body,
        header(&req, SIGNATURE_HEADER),
    )
    .map_err(|e| ApiError::unauthenticated(format!("webhook signature: {e}")))?;
    let event = webhook::parse_event(&event_name, &body)
        .map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let outcome = state
        .service
        .webhook_event(delivery, event_name, event)
        .await?;
    Ok(HttpResponse::Ok().json(WebhookAck {
        ok: true,
        ignored: outcome == WebhookOutcome::Ignored,
        duplicate: outcome == WebhookOutcome::Duplicate,
    }))
}
