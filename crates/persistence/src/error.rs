use agentry_domain::{TransitionError, UnknownValue};

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
    /// The database is too busy to take this write now: SQLite stayed locked (by a long
    /// write, or another process) past the busy timeout, or PostgreSQL could not serialise
    /// the transaction. Nothing was written; the same request may succeed shortly.
    #[error("the database is busy: {0}")]
    Busy(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Query(#[source] diesel::result::Error),
}

/// `Ok` when a write by key touched `rows` > 0 rows, [`DbError::NotFound`] when it touched
/// none (there is no row with that key).
pub(crate) fn touched(rows: usize) -> Result<(), DbError> {
    if rows == 0 {
        return Err(DbError::NotFound);
    }
    Ok(())
}

/// A stored name that names no variant of its enumeration: the row does not decode.
impl From<UnknownValue> for DbError {
    fn from(e: UnknownValue) -> Self {
        DbError::Corrupt(e.to_string())
    }
}

impl From<diesel::result::Error> for DbError {
    fn from(e: diesel::result::Error) -> Self {
        if is_busy(&e) {
            DbError::Busy(e.to_string())
        } else {
            DbError::Query(e)
        }
    }
}

/// Whether `e` says the database is locked or the transaction could not be serialised, so
/// that trying again later may succeed. diesel reports SQLite's `SQLITE_BUSY` and
/// `SQLITE_LOCKED` as unknown errors carrying SQLite's message (`sqlite3_errmsg`), so the
/// message is what tells them apart.
fn is_busy(e: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    match e {
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
        Error::DatabaseError(DatabaseErrorKind::Unknown, info) => {
            let message = info.message();
            message.starts_with("database is locked")
                || message.starts_with("database table is locked")
                || message.starts_with("database schema is locked")
        }
        _ => false,
    }
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

/// Why a write transaction rolled back when the caller's own check can refuse it as well as
/// the database fail: `Refused` carries the caller's reason, `Db` the database's error.
pub(crate) enum Rollback<E> {
    /// The caller's check (a bad record, a refused change) stopped the transaction.
    Refused(E),
    /// A read or write failed.
    Db(DbError),
}

impl<E> From<diesel::result::Error> for Rollback<E> {
    fn from(e: diesel::result::Error) -> Self {
        Rollback::Db(e.into())
    }
}

impl<E> From<DbError> for Rollback<E> {
    fn from(e: DbError) -> Self {
        Rollback::Db(e)
    }
}
