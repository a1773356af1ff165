//! `POST /api/webhooks/codehost` (SPEC §5.6): GitHub's webhook, authenticated by its
//! signature instead of a bearer token.

use actix_web::{HttpRequest, post, web};
use agentry_codehost::webhook::{self, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER};
use serde::Serialize;
use utoipa::ToSchema;

use crate::body::read_limited;
use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;
use crate::tracking::{self, WebhookOutcome};

/// Largest webhook body accepted (GitHub caps payloads at 25 MB).
pub const WEBHOOK_LIMIT: usize = 25 * 1024 * 1024;
/// Longest accepted `X-GitHub-Delivery` / `X-GitHub-Event` value.
const MAX_HEADER_CHARS: usize = 200;

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

fn header<'r>(req: &'r HttpRequest, name: &str) -> Option<&'r str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn required_header<'r>(req: &'r HttpRequest, name: &str) -> Result<&'r str, ApiError> {
    header(req, name)
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= MAX_HEADER_CHARS)
        .ok_or_else(|| {
            ApiError::invalid_request(format!(
                "the {name} header is missing or longer than {MAX_HEADER_CHARS} characters"
            ))
        })
}

/// Receives a code-host webhook delivery. The signature (`X-Hub-Signature-256`, HMAC-SHA256
/// of the raw body with `CODEHOST_WEBHOOK_SECRET`) is checked in constant time before
/// anything is parsed. A merged or closed pull request moves its task at once; a labelled
/// issue starts a sync of its repository after the answer; a delivery id seen before is
/// acknowledged and not processed again.
#[utoipa::path(
    tag = "webhooks",
    params(
        ("X-Hub-Signature-256" = String, Header, description = "sha256=<hex HMAC-SHA256 of the body>"),
        ("X-GitHub-Event" = String, Header, description = "ping, issues, pull_request, …"),
        ("X-GitHub-Delivery" = String, Header, description = "Delivery id (de-duplicated)"),
    ),
    request_body(content = Object, description = "GitHub's webhook payload"),
    responses(
        (status = 200, body = WebhookAck),
        (status = 400, body = ErrorBody),
        (status = 401, description = "Missing or wrong signature", body = ErrorBody),
        (status = 404, description = "webhook_disabled: no CODEHOST_WEBHOOK_SECRET", body = ErrorBody),
        (status = 413, body = ErrorBody),
    )
)]
#[post("/webhooks/codehost")]
pub async fn codehost_webhook(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<web::Json<WebhookAck>, ApiError> {
    let Some(secret) = state.codehost.webhook_secret() else {
        return Err(ApiError::webhook_disabled());
    };
    let body = read_limited(payload, WEBHOOK_LIMIT).await?;
    webhook::verify_signature(
        secret.expose().as_bytes(),
        &body,
        header(&req, SIGNATURE_HEADER),
    )
    .map_err(|e| ApiError::unauthenticated(format!("webhook signature: {e}")))?;
    let event_name = required_header(&req, EVENT_HEADER)?.to_owned();
    let delivery = required_header(&req, DELIVERY_HEADER)?.to_owned();
    let event = webhook::parse_event(&event_name, &body)
        .map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let (outcome, sync) = state
        .db(move |conn| {
            Ok(tracking::handle_webhook(
                conn,
                &delivery,
                &event_name,
                &event,
                agentry_persistence::now(),
            )?)
        })
        .await?;
    if let Some(repo_id) = sync {
        actix_web::rt::spawn(tracking::sync_after_webhook(state.clone(), repo_id));
    }
    if outcome == WebhookOutcome::Handled {
        state.codehost.wake_outbox();
    }
    Ok(web::Json(WebhookAck {
        ok: true,
        ignored: outcome == WebhookOutcome::Ignored,
        duplicate: outcome == WebhookOutcome::Duplicate,
    }))
}
