//! One connection type for both backends, the pool that hands it out, migrations, and the
//! write-transaction helper every mutating query goes through.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::{
    AnsiTransactionManager, Instrumentation, InstrumentationEvent, SimpleConnection,
    TransactionManager,
};
use diesel::prelude::*;
use diesel::query_dsl::LoadQuery;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::r2d2::R2D2Connection;
use diesel::result::DatabaseErrorKind;
use diesel::{PgConnection, SqliteConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::DbError;

/// The migrations of `migrations/` at the workspace root, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// SQLite page cache per connection, in KiB (SQLite's default is 2 MiB). Memory is taken
/// only as pages are read, so an idle service stays small; under load every connection of
/// the pool fills its own, so the pool's share is up to 8 × this. Pages beyond it come from
/// the operating system's file cache (a read call, no disk access on a warm machine).
pub const SQLITE_CACHE_KIB: i64 = 8 * 1024;

/// Page size of a new SQLite database, in bytes (SQLite's default is 4,096). An import of a
/// million tasks writes about 900 MB twice, to the WAL and then into the database, a page
/// (plus a 24-byte frame header) per write call: 16 KiB pages take that from 31 s to 26 s
/// (median of 3, docs/benchmarks.md). A database keeps the page size it was created with.
pub const SQLITE_PAGE_SIZE: u32 = 16 * 1024;

/// How much write-ahead log an SQLite connection lets grow before the commit that crosses it
/// copies the log back into the database file (`wal_autocheckpoint`, which SQLite counts in
/// pages: 256 pages of [`SQLITE_PAGE_SIZE`]). That checkpoint runs inside the commit, while
/// the writer holds the file's write turn, so every write queued behind it waits for it: its
/// size is the tail of write latency. SQLite's default of 1,000 pages was 4 MiB at 4 KiB
/// pages and became 16 MiB with 16 KiB pages, which took the webhook merge's p99 from 7 to
/// 18 ms (docs/benchmarks.md); the threshold is therefore set in bytes, whatever the file's
/// page size.
pub const SQLITE_WAL_CHECKPOINT_BYTES: i64 = 4 * 1024 * 1024;

/// Sets the connection's `wal_autocheckpoint` to about `bytes` of log, in pages of the
/// database's own page size (an existing file keeps the size it was created with).
fn set_wal_checkpoint(conn: &mut SqliteConnection, bytes: i64) -> QueryResult<()> {
    #[derive(QueryableByName)]
    struct PageSize {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        page_size: i64,
    }
    let page: PageSize = diesel::sql_query("PRAGMA page_size").get_result(conn)?;
    let pages = (bytes / page.page_size.max(512)).max(1);
    conn.batch_execute(&format!("PRAGMA wal_autocheckpoint = {pages}"))
}

/// How long an SQLite writer waits for its turn: first in this process's write queue, then
/// for SQLite's own lock (`busy_timeout`, against other processes). Past it the write fails
/// with [`DbError::Busy`].
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Opens one connection, with the per-connection settings of the backend (on SQLite a
    /// writer waits up to [`SQLITE_BUSY_TIMEOUT`]).
    pub fn connect(&self) -> Result<AnyConnection, DbError> {
        self.connect_with(SQLITE_BUSY_TIMEOUT)
    }

    /// [`DatabaseUrl::connect`] with another SQLite busy timeout (ignored on PostgreSQL).
    ///
    /// An SQLite connection to a file joins the process-wide write queue of that file (see
    /// [`write_tx`]), whichever pool or caller opened it.
    pub fn connect_with(&self, busy_timeout: Duration) -> Result<AnyConnection, DbError> {
        match self {
            DatabaseUrl::Sqlite(path) => {
                let mut conn = diesel::SqliteConnection::establish(path)
                    .map_err(|e| DbError::Connect(e.to_string()))?;
                // The page size takes effect only when this connection creates the database
                // (before WAL mode is set); an existing file keeps its own. WAL lets readers
                // proceed beside the single writer; busy_timeout makes a
                // second writer wait instead of failing; foreign keys are off by default;
                // temp_store keeps statement journals of multi-row INSERTs off the disk.
                let busy_ms = busy_timeout.as_millis().min(i32::MAX as u128);
                conn.batch_execute(&format!(
                    "PRAGMA page_size = {SQLITE_PAGE_SIZE}; PRAGMA busy_timeout = {busy_ms}; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                     PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; \
                     PRAGMA cache_size = -{SQLITE_CACHE_KIB};"
                ))
                .map_err(|e| DbError::Connect(e.to_string()))?;
                set_wal_checkpoint(&mut conn, SQLITE_WAL_CHECKPOINT_BYTES)
                    .map_err(|e| DbError::Connect(e.to_string()))?;
                // The file exists once SQLite has opened it; a name that is not a file
                // (`:memory:`, a URI) is a database of this connection alone: no queue.
                if let Ok(file) = std::fs::canonicalize(path) {
                    conn.set_instrumentation(WriteGate {
                        queue: WriteQueue::of_file(file),
                        wait: busy_timeout,
                        inner: diesel::connection::get_default_instrumentation(),
                    });
                }
                Ok(AnyConnection::Sqlite(conn))
            }
            DatabaseUrl::Postgres(url) => {
                let mut conn = diesel::PgConnection::establish(url)
                    .map_err(|e| DbError::Connect(e.to_string()))?;
                // Dates are cast to text in SQL (a day's or a month's key, in the rollups and
                // their migrations): ISO whatever the server's or the database's DateStyle.
                conn.batch_execute("SET DateStyle = 'ISO, YMD'")
                    .map_err(|e| DbError::Connect(e.to_string()))?;
                Ok(AnyConnection::Postgresql(conn))
            }
        }
    }
}

/// The process's writers of one SQLite file, served first come, first served.
///
/// SQLite's busy handler lets a waiting writer poll with growing sleeps, so under a steady
/// stream of writers a late poller keeps losing to the newcomers and times out. Writers of
/// this process instead wait their turn here, and only the writer whose turn it is asks
/// SQLite for the lock (`BEGIN IMMEDIATE`), which it then gets at once unless another
/// process holds it.
#[derive(Debug, Default)]
struct WriteQueue {
    state: Mutex<QueueState>,
    turn: Condvar,
}

#[derive(Debug, Default)]
struct QueueState {
    /// Whether a writer holds the turn.
    held: bool,
    /// Tickets of the waiting writers, oldest first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

/// One write queue per SQLite file open in this process (several test databases live in one
/// test process, each with its own queue).
static WRITE_QUEUES: LazyLock<Mutex<HashMap<PathBuf, Weak<WriteQueue>>>> =
    LazyLock::new(Default::default);

impl WriteQueue {
    /// The queue of the file `file` (a canonical path), shared by every connection of this
    /// process to it; dropped with the last of them.
    fn of_file(file: PathBuf) -> Arc<WriteQueue> {
        let mut queues = WRITE_QUEUES.lock();
        if let Some(queue) = queues.get(&file).and_then(Weak::upgrade) {
            return queue;
        }
        queues.retain(|_, queue| queue.strong_count() > 0);
        let queue = Arc::new(WriteQueue::default());
        queues.insert(file, Arc::downgrade(&queue));
        queue
    }

    /// Waits (blocking) up to `wait` for this writer's turn; `None` when it did not come.
    fn take_turn(self: &Arc<Self>, wait: Duration) -> Option<WriteTurn> {
        let deadline = Instant::now() + wait;
        let mut state = self.state.lock();
        if !state.held && state.waiting.is_empty() {
            state.held = true;
            return Some(WriteTurn(self.clone()));
        }
        let ticket = state.next_ticket;
        state.next_ticket = state.next_ticket.wrapping_add(1);
        state.waiting.push_back(ticket);
        loop {
            if !state.held && state.waiting.front() == Some(&ticket) {
                state.waiting.pop_front();
                state.held = true;
                return Some(WriteTurn(self.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let was_first = state.waiting.front() == Some(&ticket);
                state.waiting.retain(|t| *t != ticket);
                drop(state);
                if was_first {
                    // The next writer may be free to go now.
                    self.turn.notify_all();
                }
                return None;
            }
            self.turn.wait_for(&mut state, left);
        }
    }
}

/// A writer's turn in its [`WriteQueue`]; the next writer goes when it is dropped.
struct WriteTurn(Arc<WriteQueue>);

impl Drop for WriteTurn {
    fn drop(&mut self) {
        self.0.state.lock().held = false;
        self.0.turn.notify_all();
    }
}

/// Rides on an SQLite connection as its diesel instrumentation (the one slot a connection
/// has for our own data), so that [`write_tx`] finds the connection's write queue. Events go
/// on to the default instrumentation, if one is set.
struct WriteGate {
    queue: Arc<WriteQueue>,
    wait: Duration,
    inner: Option<Box<dyn Instrumentation>>,
}

impl Instrumentation for WriteGate {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let Some(inner) = self.inner.as_mut() {
            inner.on_connection_event(event);
        }
    }
}

/// The message of a write that waited its whole turn in vain; it reads like SQLite's own
/// `SQLITE_BUSY` so that both become [`DbError::Busy`].
fn queue_timeout(wait: Duration) -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new(format!(
            "database is locked: no turn to write within {} ms",
            wait.as_millis()
        )),
    )
}

/// The r2d2 connection manager: dispatches on the URL's scheme (diesel's derived
/// `establish` would try PostgreSQL then SQLite with the same string and hide the real error).
#[derive(Debug)]
pub struct ConnectionManager {
    url: DatabaseUrl,
    busy_timeout: Duration,
}

/// Why the pool could not open a connection.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

impl r2d2::ManageConnection for ConnectionManager {
    type Connection = AnyConnection;
    type Error = ConnectError;

    fn connect(&self) -> Result<AnyConnection, ConnectError> {
        self.url
            .connect_with(self.busy_timeout)
            .map_err(|e| ConnectError(e.to_string()))
    }

    fn is_valid(&self, conn: &mut AnyConnection) -> Result<(), ConnectError> {
        conn.ping().map_err(|e| ConnectError(e.to_string()))
    }

    fn has_broken(&self, conn: &mut AnyConnection) -> bool {
        <AnyConnection as Connection>::TransactionManager::is_broken_transaction_manager(conn)
    }
}

/// The files of an SQLite database next to its main file: what SQLite writes beside it in
/// WAL mode (`-wal`, `-shm`) and in rollback mode (`-journal`).
pub const SQLITE_COMPANIONS: &[&str] = &["-wal", "-shm", "-journal"];

/// Makes the SQLite database `path` readable and writable by the service's user alone
/// (docs/security.md): a new file is created with mode 0600 before SQLite opens it (SQLite
/// then gives its `-wal` and `-shm` files the database's mode), and an existing one and its
/// companions ([`SQLITE_COMPANIONS`]) lose every permission of their group and of others.
/// Names that are not files (`:memory:`, a `file:` URI) are left to SQLite.
///
/// # Errors
///
/// [`DbError::Connect`] naming the file, when it exists but its mode cannot be changed (it
/// belongs to another user).
pub fn private_sqlite_files(path: &str) -> Result<(), DbError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if path.is_empty() || path == ":memory:" || path.starts_with("file:") {
        return Ok(());
    }
    // Created empty here (an empty file is an empty database) so that it never exists with
    // SQLite's own mode, 0644. A directory that does not exist is SQLite's to report.
    if let Err(e) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return Ok(());
    }
    let files = std::iter::once(PathBuf::from(path)).chain(
        SQLITE_COMPANIONS
            .iter()
            .map(|suffix| PathBuf::from(format!("{path}{suffix}"))),
    );
    for file in files {
        // Not following a symbolic link: the mode of what it points to is not ours to change.
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if !meta.is_file() || mode & 0o077 == 0 {
            continue;
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode & 0o700)).map_err(
            |e| {
                DbError::Connect(format!(
                    "the database file {} is readable by other users and its mode cannot be \
                     made 0600: {e}",
                    file.display()
                ))
            },
        )?;
    }
    Ok(())
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
        Db::connect_with(url, max_connections, SQLITE_BUSY_TIMEOUT)
    }

    /// [`Db::connect`] with another SQLite busy timeout: how long a writer waits for its turn
    /// before it fails with [`DbError::Busy`] (ignored on PostgreSQL).
    pub fn connect_with(
        url: &str,
        max_connections: u32,
        busy_timeout: Duration,
    ) -> Result<Db, DbError> {
        let url = DatabaseUrl::parse(url)?;
        let backend = url.backend();
        if let DatabaseUrl::Sqlite(path) = &url {
            private_sqlite_files(path)?;
        }
        // Open one connection first so that a bad URL reports the driver's own message.
        drop(url.connect_with(busy_timeout)?);
        let pool = r2d2::Pool::builder()
            .max_size(max_connections.max(1))
            .min_idle(Some(1))
            .connection_timeout(Duration::from_secs(10))
            .build(ConnectionManager { url, busy_timeout })
            .map_err(|e| DbError::Connect(e.to_string()))?;
        Ok(Db { pool, backend })
    }

    /// The most connections the pool opens at once.
    pub fn max_connections(&self) -> u32 {
        self.pool.max_size()
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
        conn.ping().map_err(DbError::from)
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

/// Runs the reads of `f` on one snapshot of the database, so that what they return is
/// consistent (a task and its runs, say, never a run the task's totals do not count yet):
/// `BEGIN` on SQLite (in WAL mode the snapshot is taken at the first read), `BEGIN
/// ISOLATION LEVEL REPEATABLE READ, READ ONLY` on PostgreSQL, where READ COMMITTED would give
/// each statement a snapshot of its own. Inside an open transaction, `f` simply runs in it.
pub fn read_tx<T, E, F>(conn: &mut AnyConnection, f: F) -> Result<T, E>
where
    F: FnOnce(&mut AnyConnection) -> Result<T, E>,
    E: From<DbError>,
{
    let failed = |e: diesel::result::Error| E::from(DbError::from(e));
    let depth =
        <AnyConnection as Connection>::TransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .map_err(failed)?;
    if depth.is_some() {
        return f(conn);
    }
    match conn {
        AnyConnection::Sqlite(c) => {
            AnsiTransactionManager::begin_transaction_sql(c, "BEGIN").map_err(failed)?;
        }
        AnyConnection::Postgresql(c) => {
            AnsiTransactionManager::begin_transaction_sql(
                c,
                "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            )
            .map_err(failed)?;
        }
    }
    let result = f(conn);
    // Nothing was written: the end of the transaction only releases the snapshot. A failed
    // end leaves the connection marked broken and the pool discards it.
    let _ = <AnyConnection as Connection>::TransactionManager::rollback_transaction(conn);
    result
}

/// Runs `f` in a write transaction and commits when it returns `Ok`, rolls back otherwise.
///
/// On SQLite the writer first waits its turn in the process's FIFO queue of writers of that
/// file, then starts with `BEGIN IMMEDIATE`: it takes the write lock up front, so a
/// read-then-write transaction can never fail half way with `SQLITE_BUSY` because another
/// writer slipped in. The turn is held until commit or rollback, so writers of one process
/// never poll SQLite's busy handler against each other and are served in arrival order. A
/// writer whose turn does not come within the busy timeout (a long import holds it), or that
/// still finds the database locked by another process, fails with a "database is locked"
/// error ([`DbError::Busy`]). On PostgreSQL it is a plain
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
    // Held until this function returns: after the commit or the rollback.
    let mut _turn = None;
    match conn {
        AnyConnection::Sqlite(c) => {
            if let Some(gate) = c.instrumentation().downcast_ref::<WriteGate>() {
                let wait = gate.wait;
                match gate.queue.take_turn(wait) {
                    Some(turn) => _turn = Some(turn),
                    None => return Err(queue_timeout(wait).into()),
                }
            }
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

/// Runs the insert `insert` in its own savepoint ([`write_tx`]): `true` when it wrote a row,
/// `false` when it met a unique violation (the key is already there, e.g. written at the same
/// moment by another replica). Either way the caller's transaction stays usable.
pub(crate) fn insert_once<F>(conn: &mut AnyConnection, insert: F) -> Result<bool, DbError>
where
    F: FnOnce(&mut AnyConnection) -> QueryResult<usize>,
{
    match write_tx::<_, DbError, _>(conn, |conn| Ok(insert(conn)?)) {
        Ok(_) => Ok(true),
        Err(e) if e.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs a statement that the backends' own connections can run but [`AnyConnection`] cannot
/// (an upsert, or raw SQL: queries that are not written for the multi-backend) on the
/// backend of `conn`, built once for both.
pub(crate) fn native_execute<Q>(conn: &mut AnyConnection, query: Q) -> QueryResult<usize>
where
    Q: RunQueryDsl<PgConnection>
        + RunQueryDsl<SqliteConnection>
        + ExecuteDsl<PgConnection>
        + ExecuteDsl<SqliteConnection>,
{
    match conn {
        AnyConnection::Postgresql(c) => RunQueryDsl::<PgConnection>::execute(query, c),
        AnyConnection::Sqlite(c) => RunQueryDsl::<SqliteConnection>::execute(query, c),
    }
}

/// Loads the rows of a query that the backends' own connections can run but
/// [`AnyConnection`] cannot (see [`native_execute`]), on the backend of `conn`.
pub(crate) fn native_load<'q, Q, U>(conn: &mut AnyConnection, query: Q) -> QueryResult<Vec<U>>
where
    Q: RunQueryDsl<PgConnection>
        + RunQueryDsl<SqliteConnection>
        + LoadQuery<'q, PgConnection, U>
        + LoadQuery<'q, SqliteConnection, U>,
{
    match conn {
        AnyConnection::Postgresql(c) => RunQueryDsl::<PgConnection>::load(query, c),
        AnyConnection::Sqlite(c) => RunQueryDsl::<SqliteConnection>::load(query, c),
    }
}
