use agentry_domain::TransitionError;

/// Everything a storage call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `AGENTRY_DATABASE_URL` is not a URL this service understands.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// The database could not be reached or refused the connection.
    #[error("could not connect to the database: {0}")]
    Connect(String),
    /// No connection could be taken from the pool in time.
    #[error("database pool: {0}")]
    Pool(#[source] r2d2::Error),
    /// A migration failed to apply.
    #[error("migration failed: {0}")]
    Migration(String),
    /// The row asked for does not exist.
    #[error("not found")]
    NotFound,
    /// The state machine refuses the transition from the task's current state.
    #[error(transparent)]
    InvalidTransition(#[from] TransitionError),
    /// The write conflicts with the current data (a concurrent change, a duplicate).
    #[error("{0}")]
    Conflict(String),
    /// A stored value does not decode into its domain type.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
}

impl DbError {
    /// Whether this is a unique-key violation (a concurrent insert of the same key).
    pub fn is_unique_violation(&self) -> bool {
        matches!(
            self,
            DbError::Query(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _
            ))
        )
    }
}
