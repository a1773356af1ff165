//! The one error type of the use cases. It says what went wrong in the product's terms; an
//! adapter (the HTTP API, a command line) decides how to show it (docs/contract.md#32-errors
//! maps each kind to a status and a code).

use agentry_codehost::CodeHostError;
use agentry_domain::FieldError;
use agentry_persistence::DbError;
use agentry_persistence::secrets::SecretError;

/// Why a use case did not happen. Nothing was changed unless the variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// A named input is wrong (`field`: its name as the caller sent it).
    #[error("{field}: {message}")]
    Invalid {
        /// The field or parameter.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The input as a whole is malformed (e.g. a bad line of an import).
    #[error("{0}")]
    Malformed(String),
    /// The thing asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The task's state does not allow the change (docs/contract.md#22-states-and-transitions).
    #[error("{0}")]
    InvalidTransition(String),
    /// The change conflicts with what is stored.
    #[error("{0}")]
    Conflict(String),
    /// A code-host call is needed and no `CODEHOST_TOKEN` is stored.
    #[error("no code-host token is stored; PUT /api/secrets/CODEHOST_TOKEN first")]
    CodeHostTokenMissing,
    /// The code host refused (bad token, no access, unknown repository).
    #[error("{0}")]
    CodeHostRejected(String),
    /// The code host failed or rate-limited us past the client's retries.
    #[error("{0}")]
    CodeHostUnavailable(String),
    /// The database cannot be reached, or is too busy to take the write, right now; nothing
    /// was changed and the same request may succeed shortly.
    #[error("{0}")]
    Unavailable(String),
    /// A defect or an unexpected failure; the cause is logged where it is made, never shown.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError {
    /// [`ServiceError::Invalid`] for `field`.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        ServiceError::Invalid {
            field: field.to_owned(),
            message: message.to_string(),
        }
    }

    /// [`ServiceError::Internal`], logging the cause.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        ServiceError::Internal(cause.to_string())
    }
}

impl From<FieldError> for ServiceError {
    fn from(e: FieldError) -> Self {
        ServiceError::invalid(&e.field, e.message)
    }
}

impl From<DbError> for ServiceError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::NotFound => ServiceError::NotFound("not found".into()),
            DbError::InvalidTransition(t) => ServiceError::InvalidTransition(t.to_string()),
            DbError::Conflict(message) => ServiceError::Conflict(message),
            DbError::Pool(_) | DbError::Connect(_) => {
                tracing::warn!(error = %e, "database unavailable");
                ServiceError::Unavailable("the database is unavailable; try again shortly".into())
            }
            DbError::Busy(_) => {
                tracing::warn!(error = %e, "database busy");
                ServiceError::Unavailable("the database is busy; try again shortly".into())
            }
            other => ServiceError::internal(&other),
        }
    }
}

impl From<SecretError> for ServiceError {
    fn from(e: SecretError) -> Self {
        match e {
            SecretError::Db(db) => db.into(),
            other => ServiceError::internal(&other),
        }
    }
}

impl From<CodeHostError> for ServiceError {
    fn from(e: CodeHostError) -> Self {
        let error = ServiceError::of_code_host(&e, e.to_string());
        if let ServiceError::CodeHostUnavailable(_) = error {
            tracing::warn!(error = %e, "code host unavailable");
        }
        error
    }
}

impl ServiceError {
    /// The code host's error `e` met while `doing` something: refused or unavailable as
    /// for `From<CodeHostError>`, its message starting with what was being done. Unlike
    /// that conversion it logs nothing but a configuration error: the caller logs with
    /// what it was doing.
    pub fn code_host(doing: &str, e: &CodeHostError) -> Self {
        ServiceError::of_code_host(e, format!("{doing}: {e}"))
    }

    fn of_code_host(e: &CodeHostError, message: String) -> Self {
        match e {
            CodeHostError::Unauthorized(_)
            | CodeHostError::Forbidden(_)
            | CodeHostError::NotFound(_)
            | CodeHostError::Rejected { .. } => ServiceError::CodeHostRejected(message),
            CodeHostError::RateLimited { .. }
            | CodeHostError::Unavailable(_)
            | CodeHostError::InvalidResponse(_) => ServiceError::CodeHostUnavailable(message),
            CodeHostError::Config(_) => ServiceError::internal(e),
        }
    }
}

impl From<tokio::task::JoinError> for ServiceError {
    fn from(e: tokio::task::JoinError) -> Self {
        ServiceError::internal(&e)
    }
}
