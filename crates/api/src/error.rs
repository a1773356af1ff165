//! The one error type of the HTTP API and its JSON envelope (docs/contract.md#32-errors):
//! `{"error": {"code": "<snake_case>", "message": "<human sentence>"}}`.

use actix_web::body::MessageBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{HttpResponse, ResponseError};
use agentry_domain::FieldError;
use agentry_persistence::DbError;
use agentry_persistence::secrets::SecretError;
use agentry_service::ServiceError;
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_parameter`.
    pub code: String,
    /// A sentence for humans; names the offending field for validation errors.
    pub message: String,
}

/// An error answered to an API caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds for the `Retry-After` header, when the answer carries one.
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 `invalid_request`: the request as a whole is malformed (bad JSON, wrong type).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 400 `invalid_parameter`: one named field or parameter is wrong.
    pub fn invalid_parameter(field: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            format!("{field}: {message}"),
        )
    }

    /// 401 `unauthenticated`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 413 `payload_too_large`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 405 `method_not_allowed`: the path exists, with other methods.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
        )
    }

    /// 408 `request_timeout`: the request's body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
    }

    /// 411 `length_required`: a body of unknown length where its size must be known first.
    pub fn length_required() -> Self {
        Self::new(
            StatusCode::LENGTH_REQUIRED,
            "length_required",
            "send the body with a Content-Length header, not chunked",
        )
    }

    /// 503 `busy`: too many such requests at once; the answer carries `Retry-After`.
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }

    /// 412 `codehost_token_missing`: a code-host call is needed and no `CODEHOST_TOKEN` is
    /// stored.
    pub fn codehost_token_missing() -> Self {
        Self::new(
            StatusCode::PRECONDITION_FAILED,
            "codehost_token_missing",
            "no code-host token is stored; PUT /api/secrets/CODEHOST_TOKEN first",
        )
    }

    /// 422 `codehost_rejected`: the code host refused (bad token, no access, unknown
    /// repository).
    pub fn codehost_rejected(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "codehost_rejected",
            message,
        )
    }

    /// 503 `codehost_unavailable`: the code host failed or rate-limited us past our retries.
    pub fn codehost_unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "codehost_unavailable",
            message,
        )
    }

    /// 404 `webhook_disabled`: no `CODEHOST_WEBHOOK_SECRET` is configured.
    pub fn webhook_disabled() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "webhook_disabled",
            "the webhook is disabled: set CODEHOST_WEBHOOK_SECRET to enable it",
        )
    }

    /// 503 `unavailable` with `Retry-After: 1`: the database cannot be reached, or is too
    /// busy to take the write, right now; nothing was changed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }

    /// The `Retry-After` seconds the answer carries, if any.
    pub fn retry_after(&self) -> Option<u32> {
        self.retry_after
    }

    /// 500 `internal`. The cause is logged, never sent.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "an internal error occurred; it has been logged",
        )
    }

    /// The envelope for a bare status produced outside our handlers (actix's own 404, 405,
    /// 413, …), so that every error a client sees has the same shape.
    pub fn from_status(status: StatusCode) -> Self {
        match status {
            StatusCode::NOT_FOUND => Self::not_found("no such route"),
            StatusCode::METHOD_NOT_ALLOWED => {
                Self::method_not_allowed("this route does not take that method")
            }
            StatusCode::REQUEST_TIMEOUT => {
                Self::request_timeout("the request was not received in time")
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                Self::new(status, "payload_too_large", "the request body is too large")
            }
            StatusCode::UNAUTHORIZED => Self::unauthenticated("authentication required"),
            StatusCode::FORBIDDEN => Self::forbidden("not allowed"),
            s if s.is_client_error() => Self::invalid_request("the request is malformed"),
            s if s == StatusCode::SERVICE_UNAVAILABLE => Self::unavailable("service unavailable"),
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "an internal error occurred; it has been logged",
            ),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        response.json(ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message.clone(),
            },
        })
    }
}

/// For extractors that cannot fail, such as `()`.
impl From<std::convert::Infallible> for ApiError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::invalid_parameter(&e.field, e.message)
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ServiceError::from(e).into()
    }
}

impl From<SecretError> for ApiError {
    fn from(e: SecretError) -> Self {
        ServiceError::from(e).into()
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Invalid { field, message } => {
                ApiError::invalid_parameter(&field, message)
            }
            ServiceError::Malformed(message) => ApiError::invalid_request(message),
            ServiceError::NotFound(message) => ApiError::not_found(message),
            ServiceError::InvalidTransition(message) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_transition", message)
            }
            ServiceError::Conflict(message) => ApiError::conflict(message),
            ServiceError::CodeHostTokenMissing => ApiError::codehost_token_missing(),
            ServiceError::CodeHostRejected(message) => ApiError::codehost_rejected(message),
            ServiceError::CodeHostUnavailable(message) => ApiError::codehost_unavailable(message),
            ServiceError::Unavailable(message) => ApiError::unavailable(message),
            // Logged where it was made; the caller learns only that it happened.
            ServiceError::Internal(_) => ApiError::from_status(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }
}

impl From<actix_web::error::BlockingError> for ApiError {
    fn from(e: actix_web::error::BlockingError) -> Self {
        ApiError::internal(&e)
    }
}

/// `ErrorHandlers` default handler: rewrites any error response that is not already a JSON
/// envelope (actix's router, payload limits, panics caught by actix) into one.
pub fn envelope_fallback<B: MessageBody + 'static>(
    res: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == HeaderValue::from_static("application/json"));
    if is_json {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    let status = res.status();
    let (req, _) = res.into_parts();
    let response = ApiError::from_status(status).error_response();
    Ok(ErrorHandlerResponse::Response(
        ServiceResponse::new(req, response).map_into_right_body::<B>(),
    ))
}
