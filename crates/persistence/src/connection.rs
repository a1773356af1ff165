//! One connection type for both backends, the pool that hands it out, migrations, and the
//! write-transaction helper every mutating query goes through.

use std::time::Duration;

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::prelude::*;
use diesel::r2d2::R2D2Connection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::DbError;

/// The migrations of `migrations/` at the workspace root, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// SQLite page cache per connection, in KiB (SQLite's default is 2 MiB). Memory is taken
/// only as pages are read, so an idle service stays small.
pub const SQLITE_CACHE_KIB: i64 = 32 * 1024;

/// Key of the PostgreSQL advisory lock held while migrations run, so that replicas starting
/// together do not apply the same migration twice.
const MIGRATION_LOCK_KEY: i64 = 0x6167_656e_7472_7901;

mod any {
    // The derive generates public items (the backend enum, bind collectors) with no docs.
    #![allow(missing_docs)]

    /// A database connection that is either PostgreSQL or SQLite. All query code is written
    /// once against this type; backend-specific SQL matches on the variant in one function.
    #[derive(diesel::MultiConnection)]
    pub enum AnyConnection {
        /// A PostgreSQL connection (production, several replicas).
        Postgresql(diesel::PgConnection),
        /// An SQLite connection (the embedded default, one process).
        Sqlite(diesel::SqliteConnection),
    }
}
pub use any::AnyConnection;

/// Which database engine a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite through the bundled library.
    Sqlite,
    /// PostgreSQL through the bundled libpq.
    Postgres,
}

impl Backend {
    /// Lower-case name of the backend, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// A parsed `AGENTRY_DATABASE_URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `sqlite://PATH`: the path of the database file.
    Sqlite(String),
    /// `postgres://…` or `postgresql://…`, passed to libpq unchanged.
    Postgres(String),
}

impl DatabaseUrl {
    /// Parses a database URL; only the `sqlite://` and `postgres(ql)://` schemes are accepted,
    /// so a typo can never silently create an SQLite file named like a connection string.
    pub fn parse(url: &str) -> Result<Self, DbError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(DbError::InvalidUrl("sqlite:// needs a file path".into()));
            }
            Ok(DatabaseUrl::Sqlite(path.to_owned()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(DatabaseUrl::Postgres(url.to_owned()))
        } else {
            Err(DbError::InvalidUrl(
                "expected sqlite://PATH or postgres://USER@HOST/DB".into(),
            ))
        }
    }

    /// The backend this URL selects.
    pub fn backend(&self) -> Backend {
        match self {
            DatabaseUrl::Sqlite(_) => Backend::Sqlite,
            DatabaseUrl::Postgres(_) => Backend::Postgres,
        }
    }

    /// Opens one connection, with the per-connection settings of the backend.
    pub fn connect(&self) -> Result<AnyConnection, DbError> {
        match self {
            DatabaseUrl::Sqlite(path) => {
                let mut conn = diesel::SqliteConnection::establish(path)
                    .map_err(|e| DbError::Connect(e.to_string()))?;
                // WAL lets readers proceed beside the single writer; busy_timeout makes a
                // second writer wait instead of failing; foreign keys are off by default;
                // temp_store keeps statement journals of multi-row INSERTs off the disk.
                conn.batch_execute(&format!(
                    "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                     PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; \
                     PRAGMA cache_size = -{SQLITE_CACHE_KIB};"
                ))
                .map_err(|e| DbError::Connect(e.to_string()))?;
                Ok(AnyConnection::Sqlite(conn))
            }
            DatabaseUrl::Postgres(url) => diesel::PgConnection::establish(url)
                .map(AnyConnection::Postgresql)
                .map_err(|e| DbError::Connect(e.to_string())),
        }
    }
}

/// The r2d2 connection manager: dispatches on the URL's scheme (diesel's derived
/// `establish` would try PostgreSQL then SQLite with the same string and hide the real error).
#[derive(Debug)]
pub struct ConnectionManager {
    url: DatabaseUrl,
}

/// Why the pool could not open a connection.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

impl r2d2::ManageConnection for ConnectionManager {
    type Connection = AnyConnection;
    type Error = ConnectError;

    fn connect(&self) -> Result<AnyConnection, ConnectError> {
        self.url.connect().map_err(|e| ConnectError(e.to_string()))
    }

    fn is_valid(&self, conn: &mut AnyConnection) -> Result<(), ConnectError> {
        conn.ping().map_err(|e| ConnectError(e.to_string()))
    }

    fn has_broken(&self, conn: &mut AnyConnection) -> bool {
        <AnyConnection as Connection>::TransactionManager::is_broken_transaction_manager(conn)
    }
}

/// A pooled connection.
pub type PooledConnection = r2d2::PooledConnection<ConnectionManager>;

/// The database: a connection pool over one backend. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: r2d2::Pool<ConnectionManager>,
    backend: Backend,
}

impl Db {
    /// Connects to `url` with a pool of at most `max_connections`. Fails at once (within the
    /// connection timeout) when the database cannot be reached.
    pub fn connect(url: &str, max_connections: u32) -> Result<Db, DbError> {
        let url = DatabaseUrl::parse(url)?;
        let backend = url.backend();
        // Open one connection first so that a bad URL reports the driver's own message.
        drop(url.connect()?);
        let pool = r2d2::Pool::builder()
            .max_size(max_connections.max(1))
            .min_idle(Some(1))
            .connection_timeout(Duration::from_secs(10))
            .build(ConnectionManager { url })
            .map_err(|e| DbError::Connect(e.to_string()))?;
        Ok(Db { pool, backend })
    }

    /// The backend behind this pool.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Takes a connection from the pool.
    pub fn conn(&self) -> Result<PooledConnection, DbError> {
        self.pool.get().map_err(DbError::Pool)
    }

    /// Applies pending migrations; returns the versions applied. On PostgreSQL this holds an
    /// advisory lock so that concurrently starting replicas migrate one at a time.
    pub fn migrate(&self) -> Result<Vec<String>, DbError> {
        let mut conn = self.conn()?;
        run_migrations(&mut conn)
    }

    /// Checks that the database answers (`/readyz`).
    pub fn ping(&self) -> Result<(), DbError> {
        let mut conn = self.conn()?;
        conn.ping().map_err(DbError::Query)
    }
}

/// Applies pending migrations on one connection (see [`Db::migrate`]).
pub fn run_migrations(conn: &mut AnyConnection) -> Result<Vec<String>, DbError> {
    let is_pg = matches!(conn, AnyConnection::Postgresql(_));
    if is_pg {
        diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
            .execute(conn)?;
    }
    let result = conn
        .run_pending_migrations(MIGRATIONS)
        .map(|versions| versions.iter().map(|v| v.to_string()).collect())
        .map_err(|e| DbError::Migration(e.to_string()));
    if is_pg {
        diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))
            .execute(conn)?;
    }
    result
}

/// Runs `f` in a write transaction and commits when it returns `Ok`, rolls back otherwise.
///
/// On SQLite the transaction starts with `BEGIN IMMEDIATE`: it takes the write lock up front
/// (waiting up to the busy timeout), so a read-then-write transaction can never fail half way
/// with `SQLITE_BUSY` because another writer slipped in. On PostgreSQL it is a plain
/// `BEGIN` (READ COMMITTED); writers there rely on compare-and-set updates and unique keys.
/// Called inside another `write_tx`, it runs as a savepoint of the outer transaction.
pub fn write_tx<T, E, F>(conn: &mut AnyConnection, f: F) -> Result<T, E>
where
    F: FnOnce(&mut AnyConnection) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    // Inside an open transaction (a query function called from a caller's `write_tx`), the
    // work becomes a savepoint of the outer transaction: it commits with it, or not at all.
    let depth =
        <AnyConnection as Connection>::TransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()?;
    if depth.is_some() {
        return conn.transaction(f);
    }
    match conn {
        AnyConnection::Sqlite(c) => {
            AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE")?;
        }
        AnyConnection::Postgresql(c) => {
            AnsiTransactionManager::begin_transaction(c)?;
        }
    }
    match f(conn) {
        Ok(value) => {
            <AnyConnection as Connection>::TransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(err) => {
            // The caller's error is the one worth reporting; a failed rollback leaves the
            // connection marked broken and the pool discards it.
            let _ = <AnyConnection as Connection>::TransactionManager::rollback_transaction(conn);
            Err(err)
        }
    }
}
