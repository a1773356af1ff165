//! Bulk import of historical tasks (docs/contract.md#39-import): new rows in batches, each
//! task with its creation event and its share of the rollups, all or nothing. On SQLite an
//! import into empty tables drops the secondary indexes first and builds them once at the
//! end.

use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Usd};
use diesel::prelude::*;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{EventInsert, TaskInsert};
use crate::convert::{self, to_db};
use crate::error::Rollback;
use crate::rollups::{self, Contribution, Deltas, Sums};
use crate::schema::{task_events, tasks};
use crate::{AnyConnection, DbError, write_tx};

/// A historical task record to import (already validated).
#[derive(Debug, Clone)]
pub struct ImportTask {
    /// Its id; a record whose id already exists is skipped.
    pub id: Uuid,
    /// Title.
    pub title: String,
    /// Normalised repository URL; linked to the connected repository of that URL if any.
    pub repo_url: RepoUrl,
    /// Coding or review.
    pub task_type: TaskType,
    /// Its state.
    pub state: TaskState,
    /// The agent that ran it.
    pub agent_type: AgentType,
    /// The model used, if known.
    pub model_used: Option<String>,
    /// Its total cost, if recorded.
    pub cost_usd: Option<Usd>,
    /// Input tokens (cache included).
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Creation time.
    pub created_at: OffsetDateTime,
    /// The pull request opened, if any.
    pub pr_url: Option<String>,
    /// Its number, if known.
    pub pr_number: Option<i64>,
    /// The issue it worked on, if any (stored on the task; imports create no issue link).
    pub issue_number: Option<i64>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportOutcome {
    /// Records written.
    pub imported: u64,
    /// Records skipped because their id already existed.
    pub skipped: u64,
}

/// SQLite page cache during an import, in KiB.
const IMPORT_CACHE_KIB: i64 = 256 * 1024;

/// Records per batch. SQLite looks a batch's ids up in one query (bound parameters stay under
/// its 32,766 limit) and inserts the batch in id order; PostgreSQL sends it as one `COPY` per
/// table (and its id lookup stays under the 65,535 bind limit).
const IMPORT_BATCH: usize = 10_000;

/// The tables an import writes rows to, whose secondary indexes an import into an empty
/// SQLite database builds once at the end instead of maintaining row by row.
const IMPORT_TABLES: [&str; 2] = ["tasks", "task_events"];

/// Imports task records in one transaction: all of them or, if `records` yields an error
/// or a write fails, none. Each imported task gets one event `{from: null, to: <state>,
/// reason: "imported"}` at its creation time.
///
/// Records whose id already exists, or repeats an earlier record of the same import, are
/// skipped (the first one wins). On SQLite, when the task and event tables are empty at the
/// start, the import drops their secondary indexes and creates them again (from their stored
/// definitions) after the last row, inside the same transaction: a sorted index build is far
/// cheaper than a million random index inserts, and a failure rolls the drop back with
/// everything else. Such an import also turns the records into rows and rollup deltas on a
/// second thread while this one writes. On PostgreSQL each batch is sent with
/// `COPY … FROM STDIN (FORMAT binary)`.
pub fn import_tasks<E, I>(conn: &mut AnyConnection, records: I) -> Result<ImportOutcome, E>
where
    I: IntoIterator<Item = Result<ImportTask, E>>,
    I::IntoIter: Send,
    E: From<DbError> + Send,
{
    let sqlite = matches!(conn, AnyConnection::Sqlite(_));
    if sqlite {
        sqlite_import_settings(conn, true)?;
    }
    let began = std::time::Instant::now();
    let result = write_tx(conn, |conn| {
        let repos = connected_repositories(conn)?;
        // `BEGIN IMMEDIATE` holds SQLite's write lock, so the tables stay empty until commit.
        let deferred = match conn {
            AnyConnection::Sqlite(c) => match import_tables_are_empty(c)? {
                true => Some(drop_secondary_indexes(c)?),
                false => None,
            },
            AnyConnection::Postgresql(_) => None,
        };
        let started = std::time::Instant::now();
        let (outcome, deltas) = match &deferred {
            Some(_) => import_into_empty_tables(conn, records, &repos)?,
            None => import_in_batches(conn, records, &repos)?,
        };
        tracing::debug!(
            imported = outcome.imported,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "import: rows written"
        );
        if let Some(definitions) = deferred {
            build_indexes(conn, &definitions)?;
        }
        let at = std::time::Instant::now();
        rollups::apply(conn, deltas)?;
        tracing::debug!(
            elapsed_ms = at.elapsed().as_millis() as u64,
            "import: rollups applied"
        );
        Ok(outcome)
    });
    tracing::debug!(
        elapsed_ms = began.elapsed().as_millis() as u64,
        "import: transaction ended"
    );
    if sqlite {
        sqlite_import_settings(conn, false)?;
    }
    result.map_err(|f| match f {
        Rollback::Refused(e) => e,
        Rollback::Db(e) => E::from(e),
    })
}

/// What an import's steps give back: how many rows, and their share of the rollups.
type Imported<E> = Result<(ImportOutcome, Deltas), Rollback<E>>;

/// Turns SQLite's import settings on (`true`) or back to the service's (`false`).
///
/// A bulk insert into tables keyed by random UUIDs touches index pages all over the file;
/// SQLite's default 2 MB page cache turns that into a storm of reads, so the connection gets
/// a large cache for the import (memory is only taken as pages are used). Foreign keys are
/// not checked while it writes: every row it writes refers to a repository read in the same
/// transaction or to the task row written just before.
fn sqlite_import_settings(conn: &mut AnyConnection, import: bool) -> Result<(), DbError> {
    let statements = if import {
        vec![
            format!("PRAGMA cache_size = -{IMPORT_CACHE_KIB}"),
            "PRAGMA foreign_keys = OFF".to_owned(),
        ]
    } else {
        vec![
            format!(
                "PRAGMA cache_size = -{}",
                crate::connection::SQLITE_CACHE_KIB
            ),
            "PRAGMA threads = 0".to_owned(),
            "PRAGMA foreign_keys = ON".to_owned(),
        ]
    };
    for sql in statements {
        diesel::sql_query(sql).execute(conn)?;
    }
    Ok(())
}

/// The connected repositories' ids by normalised URL.
fn connected_repositories(
    conn: &mut AnyConnection,
) -> Result<std::collections::HashMap<String, String>, DbError> {
    use crate::schema::repositories;
    Ok(repositories::table
        .filter(repositories::disconnected_at.is_null())
        .select((repositories::url, repositories::id))
        .load::<(String, String)>(conn)?
        .into_iter()
        .collect())
}

/// Imports into tables that held no row: the records become rows and rollup deltas on a
/// second thread (or here, between the writes, when no thread can be started) while this
/// one writes them.
fn import_into_empty_tables<E, I>(
    conn: &mut AnyConnection,
    records: I,
    repos: &std::collections::HashMap<String, String>,
) -> Imported<E>
where
    I: IntoIterator<Item = Result<ImportTask, E>>,
    I::IntoIter: Send,
    E: Send,
{
    // Lent to the second thread, and taken back if it cannot be started.
    let records = parking_lot::Mutex::new(Some(records.into_iter()));
    let take = || records.lock().take();
    let (written, prepared) = std::thread::scope(|scope| {
        let (sender, receiver) = std::sync::mpsc::sync_channel(2);
        let preparer = std::thread::Builder::new()
            .name("import-rows".into())
            .spawn_scoped(scope, || {
                prepare_new_rows(take().into_iter().flatten(), repos, move |rows| {
                    sender.send(rows).is_ok()
                })
            });
        let mut written = 0;
        let mut failed = None;
        let prepared = match preparer {
            Ok(preparer) => {
                for rows in receiver {
                    match insert_rows(conn, &rows) {
                        Ok(n) => written += n,
                        Err(e) => {
                            // Dropping the receiver stops the preparer.
                            failed = Some(e);
                            break;
                        }
                    }
                }
                preparer
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
            // No second thread to be had: prepare here, between the writes.
            Err(_) => prepare_new_rows(take().into_iter().flatten(), repos, |rows| {
                match insert_rows(conn, &rows) {
                    Ok(n) => written += n,
                    Err(e) => failed = Some(e),
                }
                failed.is_none()
            }),
        };
        match failed {
            Some(e) => Err(Rollback::Db(e)),
            None => Ok((written, prepared)),
        }
    })?;
    let (skipped, deltas) = prepared.map_err(|e| match e {
        Prepared::Record(e) => Rollback::Refused(e),
        Prepared::Db(e) => Rollback::Db(e),
    })?;
    let outcome = ImportOutcome {
        imported: written as u64,
        skipped,
    };
    Ok((outcome, deltas))
}

/// Imports batch by batch into tables that may hold rows already (whose ids are skipped).
fn import_in_batches<E>(
    conn: &mut AnyConnection,
    records: impl IntoIterator<Item = Result<ImportTask, E>>,
    repos: &std::collections::HashMap<String, String>,
) -> Imported<E> {
    let mut outcome = ImportOutcome::default();
    let mut deltas = Deltas::default();
    let mut batch = Vec::with_capacity(IMPORT_BATCH);
    for record in records {
        batch.push(record.map_err(Rollback::Refused)?);
        if batch.len() == IMPORT_BATCH {
            import_batch(conn, repos, &mut batch, &mut outcome, &mut deltas)?;
        }
    }
    import_batch(conn, repos, &mut batch, &mut outcome, &mut deltas)?;
    Ok((outcome, deltas))
}

/// Creates the secondary indexes dropped for an import again, from their definitions.
fn build_indexes(conn: &mut AnyConnection, definitions: &[String]) -> Result<(), DbError> {
    // Let SQLite's sorter use helper threads for the index builds (the parsing thread is
    // done by now, so the cores are free).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    diesel::sql_query(format!("PRAGMA threads = {threads}")).execute(conn)?;
    for sql in definitions {
        let at = std::time::Instant::now();
        diesel::sql_query(sql).execute(conn)?;
        tracing::debug!(
            index = %sql,
            elapsed_ms = at.elapsed().as_millis() as u64,
            "import: index built"
        );
    }
    Ok(())
}

/// Whether the tables an import writes hold no row at all.
fn import_tables_are_empty(c: &mut diesel::SqliteConnection) -> Result<bool, DbError> {
    let any_task: bool =
        diesel::select(diesel::dsl::exists(tasks::table.select(tasks::id))).get_result(c)?;
    let any_event: bool = diesel::select(diesel::dsl::exists(
        task_events::table.select(task_events::id),
    ))
    .get_result(c)?;
    Ok(!any_task && !any_event)
}

/// Drops the indexes of [`IMPORT_TABLES`] that have a stored definition (every index but the
/// primary keys' own) and returns those definitions, to be executed again after the rows.
fn drop_secondary_indexes(c: &mut diesel::SqliteConnection) -> Result<Vec<String>, DbError> {
    use diesel::sql_types::Text;

    #[derive(QueryableByName)]
    struct Index {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        sql: String,
    }
    let indexes: Vec<Index> = diesel::sql_query(
        "SELECT name, sql FROM sqlite_schema \
         WHERE type = 'index' AND tbl_name IN (?, ?) AND sql IS NOT NULL ORDER BY name",
    )
    .bind::<Text, _>(IMPORT_TABLES[0])
    .bind::<Text, _>(IMPORT_TABLES[1])
    .load(c)?;
    for index in &indexes {
        diesel::sql_query(format!(
            "DROP INDEX \"{}\"",
            index.name.replace('"', "\"\"")
        ))
        .execute(c)?;
    }
    Ok(indexes.into_iter().map(|i| i.sql).collect())
}

/// Why preparing an import's rows stopped.
enum Prepared<E> {
    /// A record was bad.
    Record(E),
    /// A record's rollup contribution overflowed.
    Db(DbError),
}

/// Turns the records of an import into empty tables into batches of rows, in id order
/// within each batch, skipping an id that repeats an earlier record (with nothing stored
/// before, an id can only repeat one of this import's own). Hands each batch to `write`,
/// which answers whether to go on. Returns the number of records skipped and the rollup
/// deltas of the rows prepared.
fn prepare_new_rows<E>(
    records: impl Iterator<Item = Result<ImportTask, E>>,
    repos: &std::collections::HashMap<String, String>,
    mut write: impl FnMut(ImportRows) -> bool,
) -> Result<(u64, Deltas), Prepared<E>> {
    let mut seen = std::collections::HashSet::new();
    let mut skipped = 0;
    let mut deltas = Deltas::default();
    let mut batch = Vec::with_capacity(IMPORT_BATCH);
    let mut records = records.peekable();
    while records.peek().is_some() {
        batch.clear();
        for record in records.by_ref() {
            let record = record.map_err(Prepared::Record)?;
            if seen.insert(record.id) {
                batch.push(record);
            } else {
                skipped += 1;
            }
            if batch.len() == IMPORT_BATCH {
                break;
            }
        }
        batch.sort_unstable_by_key(|t| t.id);
        let rows = import_rows(repos, batch.drain(..), &mut deltas).map_err(Prepared::Db)?;
        if !write(rows) {
            break;
        }
    }
    Ok((skipped, deltas))
}

/// Writes one batch into tables that may hold rows: skips the records whose id is stored or
/// appears earlier in the batch, and inserts the others with their events, in id order.
fn import_batch(
    conn: &mut AnyConnection,
    repos: &std::collections::HashMap<String, String>,
    batch: &mut Vec<ImportTask>,
    outcome: &mut ImportOutcome,
    deltas: &mut Deltas,
) -> Result<(), DbError> {
    if batch.is_empty() {
        return Ok(());
    }
    let given = batch.len();
    let ids: Vec<String> = batch.iter().map(|t| t.id.to_string()).collect();
    let mut known: std::collections::HashSet<Uuid> = tasks::table
        .filter(tasks::id.eq_any(&ids))
        .select(tasks::id)
        .load::<String>(conn)?
        .iter()
        .map(|id| convert::uuid(id))
        .collect::<Result<_, _>>()?;
    // `known` also collects this batch's ids, so a repeated id inside it is skipped too.
    let mut fresh: Vec<ImportTask> = batch.drain(..).filter(|t| known.insert(t.id)).collect();
    outcome.skipped += (given - fresh.len()) as u64;
    // Random ids make every primary-key insert a descent to a random leaf; in id order the
    // descents of a batch walk the index from left to right.
    fresh.sort_unstable_by_key(|t| t.id);
    let rows = import_rows(repos, fresh.into_iter(), deltas)?;
    outcome.imported += insert_rows(conn, &rows)? as u64;
    Ok(())
}

/// The rows of a batch of imported tasks: each task and its one event.
struct ImportRows {
    tasks: Vec<TaskInsert>,
    events: Vec<EventInsert>,
}

/// Builds the rows of `fresh` (records known to be new) and adds their contributions to
/// `deltas`.
fn import_rows(
    repos: &std::collections::HashMap<String, String>,
    fresh: impl ExactSizeIterator<Item = ImportTask>,
    deltas: &mut Deltas,
) -> Result<ImportRows, DbError> {
    let mut rows = Vec::with_capacity(fresh.len());
    let mut events = Vec::with_capacity(fresh.len());
    for t in fresh {
        let at = to_db(t.created_at);
        deltas.add_parts(
            Contribution {
                created_at: t.created_at,
                repo_url: t.repo_url.as_str(),
                task_type: t.task_type,
                model: t.model_used.as_deref(),
                state: t.state,
                sums: Sums::from_parts(t.cost_usd, t.state, t.input_tokens, t.output_tokens, true),
            },
            1,
        )?;
        events.push(EventInsert::new(
            t.id,
            None,
            t.state,
            "imported",
            t.created_at,
        ));
        rows.push(TaskInsert {
            id: t.id.to_string(),
            title: t.title,
            prompt: String::new(),
            repo_id: repos.get(t.repo_url.as_str()).cloned(),
            repo_url: t.repo_url.to_string(),
            task_type: t.task_type.as_str(),
            state: t.state.as_str(),
            agent_type: t.agent_type.as_str(),
            model_used: t.model_used,
            cost_nanos: t.cost_usd.map(Usd::to_nanos),
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            pr_url: t.pr_url,
            pr_number: t.pr_number,
            issue_number: t.issue_number,
            parent_task_id: None,
            attempt: 1,
            created_at: at,
            updated_at: at,
            imported: true,
        });
    }
    Ok(ImportRows {
        tasks: rows,
        events,
    })
}

/// Inserts a batch's rows; returns the number of tasks inserted.
fn insert_rows(conn: &mut AnyConnection, batch: &ImportRows) -> Result<usize, DbError> {
    let ImportRows {
        tasks: rows,
        events,
    } = batch;
    if rows.is_empty() {
        return Ok(0);
    }
    Ok(match conn {
        // In-process SQLite: one cached prepared statement per table, executed per row,
        // beats re-parsing a multi-row statement for every batch.
        AnyConnection::Sqlite(c) => {
            let mut n = 0;
            for (row, event) in rows.iter().zip(events) {
                n += diesel::insert_into(tasks::table).values(row).execute(c)?;
                diesel::insert_into(task_events::table)
                    .values(event)
                    .execute(c)?;
            }
            n
        }
        // PostgreSQL: a round trip per statement; stream each table's rows in one COPY
        // (binary format), which diesel's MultiBackend cannot express, hence the
        // concrete connection.
        AnyConnection::Postgresql(c) => {
            let n = diesel::copy_from(tasks::table)
                .from_insertable(rows)
                .execute(c)?;
            diesel::copy_from(task_events::table)
                .from_insertable(events)
                .execute(c)?;
            n
        }
    })
}
