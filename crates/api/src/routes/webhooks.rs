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

/// What one server allows the webhook: how many bodies are read at once (each up to
/// [`WEBHOOK_LIMIT`] in memory), how long a delivery waits for its turn before a 503, and
/// how long reading one body may take before a 408. One value is shared by all the workers
/// of a server (`app_data`).
#[derive(Debug, Clone)]
pub struct WebhookLimits {
    reads: Arc<Semaphore>,
    queue_wait: Duration,
    read_timeout: Duration,
}

impl WebhookLimits {
    /// Bodies read at once by default (4 × 25 MiB of memory at most).
    pub const CONCURRENT_READS: usize = 4;
    /// How long a delivery waits for a free read slot by default.
    pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
    /// The default time limit of one body read. GitHub itself gives up on a delivery after
    /// 10 seconds, so a read that takes longer is never a real delivery.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// Limits of `concurrent_reads` bodies at once, `queue_wait` for a slot and
    /// `read_timeout` per body.
    pub fn new(concurrent_reads: usize, queue_wait: Duration, read_timeout: Duration) -> Self {
        WebhookLimits {
            reads: Arc::new(Semaphore::new(concurrent_reads)),
            queue_wait,
            read_timeout,
        }
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
    let Some(secret) = state.service.codehost.webhook_secret() else {
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
    )
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
    let Ok(Ok(permit)) =
        tokio::time::timeout(limits.queue_wait, limits.reads.clone().acquire_owned()).await
    else {
        let mut res = closing(ApiError::busy(
            "too many webhook deliveries are being received; retry shortly",
        ));
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return Ok(res);
    };
    let body = match tokio::time::timeout(limits.read_timeout, read_limited(payload, WEBHOOK_LIMIT))
        .await
    {
        Ok(body) => body?,
        Err(_) => {
            return Ok(closing(ApiError::request_timeout(format!(
                "the body was not received within {} seconds",
                limits.read_timeout.as_secs_f32()
            ))));
        }
    };
    drop(permit);
    let Some(secret) = state.service.codehost.webhook_secret() else {
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
