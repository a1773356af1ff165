//! `POST /api/webhooks/codehost` (docs/contract.md#56-webhook): GitHub's webhook, authenticated by its
//! signature instead of a bearer token.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError, post, web};
use agentry_codehost::webhook::{
    self, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, SignatureError,
};
use futures_util::StreamExt;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use utoipa::ToSchema;

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
/// - **memory**: bodies are held in at most [`WebhookLimits::MEMORY`] bytes at once, each
///   taking what it has **received** so far (not what it declares: a body that is not
///   arriving holds nothing); a body that finds the memory full waits up to `queue_wait`
///   for more, then gets 503 with `Retry-After`. So a slow upload costs the server a
///   connection and its buffer, and filling the memory takes sending that many bytes;
/// - **large bodies** (over [`WebhookLimits::LARGE_BODY`]) are also read at most
///   `concurrent_reads` at a time, waiting up to `queue_wait` for a slot;
/// - **pace**: after its first second a body must keep arriving at
///   [`WebhookLimits::MIN_RATE`] (at any moment `t`, at least `(t − 1 s) × MIN_RATE` bytes
///   in), and take no more than `read_timeout` in all; a body that falls behind is cut off
///   at once (408, the connection closed): a stalled or trickling upload lasts about a
///   second, whatever length it declares.
///
/// One value is shared by all the workers of a server (`app_data`).
#[derive(Debug, Clone)]
pub struct WebhookLimits {
    memory: Arc<Semaphore>,
    large: Arc<Semaphore>,
    queue_wait: Duration,
    read_timeout: Duration,
    min_rate: usize,
}

impl WebhookLimits {
    /// Large bodies read at once by default.
    pub const CONCURRENT_READS: usize = 2;
    /// How long a delivery waits for a large slot or for memory by default.
    pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
    /// The longest a body may take. GitHub itself gives up on a delivery after 10 seconds,
    /// so a read that takes longer is never a real delivery.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Bytes of bodies held at once by default (4 × the largest body).
    pub const MEMORY: usize = 4 * WEBHOOK_LIMIT;
    /// A body above this many bytes is large.
    pub const LARGE_BODY: usize = 1024 * 1024;
    /// The slowest pace a body may arrive at after its first second, in bytes per second.
    pub const MIN_RATE: usize = 256 * 1024;
    /// How long a body may take before it must keep [`WebhookLimits::MIN_RATE`].
    pub const GRACE: Duration = Duration::from_secs(1);

    /// Limits of `concurrent_reads` large bodies at once, `queue_wait` for a large slot or
    /// memory and `read_timeout` per body at most (the memory and pace are the defaults).
    pub fn new(concurrent_reads: usize, queue_wait: Duration, read_timeout: Duration) -> Self {
        WebhookLimits {
            memory: Arc::new(Semaphore::new(Self::MEMORY / 1024)),
            large: Arc::new(Semaphore::new(concurrent_reads)),
            queue_wait,
            read_timeout,
            min_rate: Self::MIN_RATE,
        }
    }

    /// These limits with `bytes` of bodies held at once (at least 1 KiB).
    pub fn with_memory(mut self, bytes: usize) -> Self {
        self.memory = Arc::new(Semaphore::new(bytes.div_ceil(1024).max(1)));
        self
    }

    /// These limits with bodies allowed to arrive as slowly as `bytes_per_second` (at least
    /// 1), still within `read_timeout`.
    pub fn with_min_rate(mut self, bytes_per_second: usize) -> Self {
        self.min_rate = bytes_per_second.max(1);
        self
    }

    /// When a body whose read started at `start` must have more than `received` bytes:
    /// [`WebhookLimits::GRACE`] plus `received` at the minimum pace, and never later than
    /// `read_timeout` after `start`.
    fn due(&self, start: tokio::time::Instant, received: usize) -> tokio::time::Instant {
        let pace =
            Self::GRACE + Duration::from_secs_f64(received as f64 / self.min_rate.max(1) as f64);
        start + pace.min(self.read_timeout)
    }

    /// The memory of `more_kib` KiB more of a body, waiting up to `queue_wait` when it is
    /// all taken; `None` when it did not come in time.
    async fn memory(&self, more_kib: usize) -> Option<OwnedSemaphorePermit> {
        let more = u32::try_from(more_kib).ok()?;
        if let Ok(permit) = self.memory.clone().try_acquire_many_owned(more) {
            return Some(permit);
        }
        match tokio::time::timeout(
            self.queue_wait,
            self.memory.clone().acquire_many_owned(more),
        )
        .await
        {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }
}

/// Why a webhook body was not read whole.
enum Unread {
    /// It cannot be accepted (larger than the limit, a broken stream).
    Refused(ApiError),
    /// There was no memory for it in time.
    Busy,
    /// It fell behind the pace: `received` bytes had arrived after `elapsed`.
    Slow { received: usize, elapsed: Duration },
}

/// Reads a body of the declared `length`, holding the memory of what has arrived
/// ([`WebhookLimits`]) until the returned permit is dropped, and cutting it off as soon as
/// it falls behind the pace.
async fn read_body(
    mut payload: web::Payload,
    limits: &WebhookLimits,
) -> Result<(web::Bytes, Option<OwnedSemaphorePermit>), Unread> {
    let start = tokio::time::Instant::now();
    let mut body = web::BytesMut::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut held_kib = 0_usize;
    loop {
        let chunk =
            match tokio::time::timeout_at(limits.due(start, body.len()), payload.next()).await {
                Err(_) => {
                    return Err(Unread::Slow {
                        received: body.len(),
                        elapsed: start.elapsed(),
                    });
                }
                Ok(None) => break,
                Ok(Some(Err(actix_web::error::PayloadError::Overflow))) => {
                    return Err(Unread::Refused(ApiError::payload_too_large(WEBHOOK_LIMIT)));
                }
                Ok(Some(Err(other))) => {
                    return Err(Unread::Refused(ApiError::invalid_request(format!(
                        "could not read the request body: {other}"
                    ))));
                }
                Ok(Some(Ok(chunk))) => chunk,
            };
        let total = body.len() + chunk.len();
        if total > WEBHOOK_LIMIT {
            return Err(Unread::Refused(ApiError::payload_too_large(WEBHOOK_LIMIT)));
        }
        let kib = total.div_ceil(1024);
        if kib > held_kib {
            let more = limits.memory(kib - held_kib).await.ok_or(Unread::Busy)?;
            match &mut held {
                Some(permit) => permit.merge(more),
                None => held = Some(more),
            }
            held_kib = kib;
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), held))
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
    // A large body takes a large slot first.
    let large = if length > WebhookLimits::LARGE_BODY {
        match tokio::time::timeout(limits.queue_wait, limits.large.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => return Ok(busy()),
        }
    } else {
        None
    };
    let body = match read_body(payload, &limits).await {
        Ok((body, memory)) => {
            drop((memory, large));
            body
        }
        Err(Unread::Refused(error)) => return Err(error),
        Err(Unread::Busy) => return Ok(busy()),
        Err(Unread::Slow { received, elapsed }) => {
            return Ok(closing(ApiError::request_timeout(format!(
                "the body arrived too slowly: {received} of {length} bytes in {:.1} seconds \
                 (after the first second, at least {} bytes per second)",
                elapsed.as_secs_f32(),
                limits.min_rate
            ))));
        }
    };
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
