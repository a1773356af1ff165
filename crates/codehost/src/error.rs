//! [`CodeHostError`], the one error type of the client.

use std::time::Duration;

/// Why a code-host call failed.
///
/// Messages carry the request (method and path, never the query's secrets: there are none)
/// and GitHub's own `message`; they never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeHostError {
    /// 401: the token is missing, wrong, revoked or expired.
    #[error("code host: unauthorized (bad or expired token): {0}")]
    Unauthorized(String),
    /// 403 that is not a rate limit: the token may not do this.
    #[error("code host: forbidden: {0}")]
    Forbidden(String),
    /// 404: no such resource, or the token may not see it (GitHub answers 404 then too).
    #[error("code host: not found: {0}")]
    NotFound(String),
    /// Any other 4xx, e.g. 422 for a validation failure.
    #[error("code host rejected the request (HTTP {status}): {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// GitHub's message and error codes.
        message: String,
    },
    /// A rate limit whose wait would exceed [`ClientConfig::max_rate_limit_wait`]
    /// (or that persisted through every retry).
    ///
    /// [`ClientConfig::max_rate_limit_wait`]: crate::ClientConfig::max_rate_limit_wait
    #[error("code host rate limit: retry after {} s", retry_after.as_secs_f64().ceil())]
    RateLimited {
        /// How long to wait before the next request.
        retry_after: Duration,
    },
    /// 5xx, timeouts or connection errors, after every retry.
    #[error("code host unavailable: {0}")]
    Unavailable(String),
    /// A response that does not parse, or a pagination link that cannot be followed.
    #[error("invalid response from the code host: {0}")]
    InvalidResponse(String),
    /// The client cannot be built or used: a bad base URL, user agent or token characters,
    /// or no tokio runtime.
    #[error("code host client configuration: {0}")]
    Config(String),
}

impl CodeHostError {
    /// Whether trying again later may succeed ([`Self::RateLimited`], [`Self::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::RateLimited { .. } | Self::Unavailable(_))
    }

    /// The HTTP status GitHub answered, when the error is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Unauthorized(_) => Some(401),
            Self::Forbidden(_) => Some(403),
            Self::NotFound(_) => Some(404),
            Self::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }
}
