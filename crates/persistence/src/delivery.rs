//! Leased delivery: a table whose rows are delivered somewhere after they are written, at
//! least once, by workers in any number of replicas. The [`outbox`](crate::outbox) (code-host
//! effects) and the [`budget alerts`](crate::alerts) are such tables; each declares its
//! [`Queue`], and everything about claiming, leasing, retrying and marking is here, once.
//!
//! A queue's rows carry `id` (UUID text), `attempts`, `next_attempt_at`, `delivered_at` and
//! `last_error`; the queue says which rows are pending and how a row is marked delivered.
//!
//! * [`Queue::claim_due`] leases the pending rows that are due (`next_attempt_at <= now`):
//!   it moves `next_attempt_at` to the end of the lease with a compare-and-set on the value
//!   just read, so of two workers claiming at once only one gets a given row, and a row is
//!   not due again before its lease ends. A worker that dies leaves its rows to become due
//!   again when the lease runs out, and another worker (or replica) claims them then.
//! * The worker renews each entry's lease ([`Queue::renew`], a compare-and-set on the lease
//!   it holds) just before sending it, and skips an entry whose lease it lost; it then
//!   reports [`Queue::mark_delivered`] (final, idempotent) or [`Queue::mark_failed`], which
//!   counts the attempt and sets the retry time, normally
//!   [`agentry_domain::backoff::Backoff::retry_at`], only while the lease is still its own.
//! * [`Queue::next_due`] tells a worker how long it may sleep.
//!
//! Every write runs in [`write_tx`]: on its own it is one transaction, and inside a caller's
//! transaction it is a savepoint that commits or rolls back with the caller.
//!
//! The queries are written once for every queue as SQL over the queue's table name and
//! conditions (static text, never input); values go in as bind parameters.

use diesel::sql_types::{BigInt, Text, Timestamp};
use diesel::{QueryResult, QueryableByName};
use time::{Duration, OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::connection::{native_execute, native_load};
use crate::convert::{from_db, to_db};
use crate::{AnyConnection, DbError, write_tx};

/// A row of a delivery queue, as its module reads it.
pub trait Entry {
    /// Its id.
    fn id(&self) -> Uuid;
    /// Failed delivery attempts so far.
    fn attempts(&self) -> i32;
    /// Its `next_attempt_at` as read: for a claimed entry, the end of its worker's lease.
    fn next_attempt_at(&self) -> OffsetDateTime;
}

/// A table used as a leased delivery queue of entries `T` (see the [module](self)).
pub struct Queue<T> {
    /// The table.
    table: &'static str,
    /// The SQL condition of a row still to be delivered.
    pending: &'static str,
    /// The SQL assignments that mark a row delivered; `#1` is the delivery time, which goes
    /// into `delivered_at`.
    delivered: &'static str,
    /// The SQL order in which due rows are claimed (oldest first).
    order: &'static str,
    /// Reads the entries of the given ids, in any order.
    load: fn(&mut AnyConnection, &[String]) -> Result<Vec<T>, DbError>,
}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// Declares the leased delivery queue of a table, once for every queue: the [`Queue`]
/// constant `NAME` over the table `TABLE` (its schema module, whose name is the table's),
/// the [`Entry`] implementation of its entries (their `id` and `attempts` fields), and the
/// read of entries by id, selected as `ROW` and decoded into the entry type.
///
/// ```text
/// queue! {
///     /// What the queue holds.
///     pub const NAME: Queue<EntryType> = TABLE as ROW {
///         pending: "SQL condition",
///         delivered: "SQL assignments (#1: the delivery time)",
///         order: "SQL order",
///     }
/// }
/// ```
macro_rules! queue {
    (
        $(#[$doc:meta])*
        $vis:vis const $name:ident: Queue<$entry:ty> = $table:ident as $row:ty {
            pending: $pending:literal,
            delivered: $delivered:literal,
            order: $order:literal $(,)?
        }
    ) => {
        $(#[$doc])*
        $vis const $name: $crate::delivery::Queue<$entry> = $crate::delivery::Queue::new(
            stringify!($table),
            $pending,
            $delivered,
            $order,
            |conn, ids| {
                use ::diesel::prelude::*;
                use $crate::fetch::Fetch;
                $table::table
                    .filter($table::id.eq_any(ids))
                    .select(<$row>::as_select())
                    .load_as(conn)
            },
        );

        impl $crate::delivery::Entry for $entry {
            fn id(&self) -> ::uuid::Uuid {
                self.id
            }

            fn attempts(&self) -> i32 {
                self.attempts
            }

            fn next_attempt_at(&self) -> ::time::OffsetDateTime {
                self.next_attempt_at
            }
        }
    };
}
pub(crate) use queue;

/// The id and due time of a candidate for a claim.
#[derive(QueryableByName)]
struct Due {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Timestamp)]
    next_attempt_at: PrimitiveDateTime,
}

#[derive(QueryableByName)]
struct At {
    #[diesel(sql_type = Timestamp)]
    next_attempt_at: PrimitiveDateTime,
}

impl<T: Entry> Queue<T> {
    /// The queue of `table`, whose pending rows match the SQL condition `pending`, which a
    /// delivery updates with the SQL assignments `delivered` (`#1`: the delivery time), which
    /// are claimed in the SQL order `order`, and whose entries `load` reads by id.
    pub(crate) const fn new(
        table: &'static str,
        pending: &'static str,
        delivered: &'static str,
        order: &'static str,
        load: fn(&mut AnyConnection, &[String]) -> Result<Vec<T>, DbError>,
    ) -> Queue<T> {
        Queue {
            table,
            pending,
            delivered,
            order,
            load,
        }
    }

    /// Claims up to `limit` pending entries that are due (`next_attempt_at <= now`), oldest
    /// first, for one worker, leased until `now + lease` (see the [module](self)). The
    /// returned entries carry the new `next_attempt_at`. A lease shorter than a microsecond
    /// counts as one, so the due time always moves strictly forward.
    pub fn claim_due(
        &self,
        conn: &mut AnyConnection,
        now: OffsetDateTime,
        lease: Duration,
        limit: i64,
    ) -> Result<Vec<T>, DbError> {
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let due = to_db(now);
        // Strictly later than any due value, so the compare-and-set of a competitor can't match.
        let until = to_db(now + lease.max(Duration::microseconds(1)));
        let select = format!(
            "SELECT id, next_attempt_at FROM {} WHERE {} AND next_attempt_at <= #1 \
             ORDER BY {} LIMIT #2",
            self.table, self.pending, self.order
        );
        let lease_one = format!(
            "UPDATE {} SET next_attempt_at = #1 WHERE id = #2 AND {} AND next_attempt_at = #3",
            self.table, self.pending
        );
        write_tx(conn, |conn| {
            let candidates: Vec<Due> = native_load(
                conn,
                sql(conn, &select)
                    .bind::<Timestamp, _>(due)
                    .bind::<BigInt, _>(limit),
            )?;
            let mut won = Vec::with_capacity(candidates.len());
            for candidate in candidates {
                let updated = native_execute(
                    conn,
                    sql(conn, &lease_one)
                        .bind::<Timestamp, _>(until)
                        .bind::<Text, _>(&candidate.id)
                        .bind::<Timestamp, _>(candidate.next_attempt_at),
                )?;
                if updated == 1 {
                    won.push(candidate.id);
                }
            }
            if won.is_empty() {
                return Ok(Vec::new());
            }
            let mut entries = (self.load)(conn, &won)?;
            // In claim order.
            entries.sort_by_cached_key(|e| {
                let id = e.id().to_string();
                won.iter().position(|w| *w == id)
            });
            Ok(entries)
        })
    }

    /// Renews the lease of a claimed entry, leased until `held` (its claim's or its last
    /// renewal's end), to `now + lease`, if it is still that worker's: pending, and leased
    /// until `held` (a compare-and-set, like the claim's). Returns the new end, or `None`
    /// when the lease was lost (it ran out and another worker claimed the entry, or the
    /// entry was delivered). A worker renews each entry just before sending it, so a batch
    /// sent one by one never outlives its leases.
    pub fn renew(
        &self,
        conn: &mut AnyConnection,
        id: Uuid,
        held: OffsetDateTime,
        now: OffsetDateTime,
        lease: Duration,
    ) -> Result<Option<OffsetDateTime>, DbError> {
        let until = now + lease.max(Duration::microseconds(1));
        let update = format!(
            "UPDATE {} SET next_attempt_at = #1 WHERE id = #2 AND {} AND next_attempt_at = #3",
            self.table, self.pending
        );
        let id = id.to_string();
        let updated = write_tx(conn, |conn| {
            native_execute(
                conn,
                sql(conn, &update)
                    .bind::<Timestamp, _>(to_db(until))
                    .bind::<Text, _>(&id)
                    .bind::<Timestamp, _>(to_db(held)),
            )
        })?;
        Ok((updated == 1).then_some(until))
    }

    /// Records that an entry was delivered at `now`. Idempotent: a delivered entry keeps its
    /// first delivery time (a worker whose lease ran out may report after another did).
    /// [`DbError::NotFound`] for an unknown id.
    pub fn mark_delivered(
        &self,
        conn: &mut AnyConnection,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<(), DbError> {
        let update = format!(
            "UPDATE {} SET {} WHERE id = #2 AND {}",
            self.table, self.delivered, self.pending
        );
        let id = id.to_string();
        self.mark(conn, &id, |conn| {
            native_execute(
                conn,
                sql(conn, &update)
                    .bind::<Timestamp, _>(to_db(now))
                    .bind::<Text, _>(&id),
            )
        })
    }

    /// Records a failed delivery attempt of an entry leased until `held`: `attempts + 1`,
    /// `last_error = error`, `next_attempt_at = retry_at`. Does nothing to an entry no longer
    /// pending (delivered by another worker after this one's lease ran out), nor to one whose
    /// lease is no longer `held` (another worker claimed it since: its lease stands).
    /// [`DbError::NotFound`] for an unknown id.
    pub fn mark_failed(
        &self,
        conn: &mut AnyConnection,
        id: Uuid,
        held: OffsetDateTime,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<(), DbError> {
        let update = format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = #1, next_attempt_at = #2 \
             WHERE id = #3 AND {} AND next_attempt_at = #4",
            self.table, self.pending
        );
        let id = id.to_string();
        self.mark(conn, &id, |conn| {
            native_execute(
                conn,
                sql(conn, &update)
                    .bind::<Text, _>(error)
                    .bind::<Timestamp, _>(to_db(retry_at))
                    .bind::<Text, _>(&id)
                    .bind::<Timestamp, _>(to_db(held)),
            )
        })
    }

    /// When the next pending entry is due (possibly already past), or `None` when none is
    /// pending: lets a worker sleep exactly until there is work.
    pub fn next_due(&self, conn: &mut AnyConnection) -> Result<Option<OffsetDateTime>, DbError> {
        let select = format!(
            "SELECT next_attempt_at FROM {} WHERE {} ORDER BY next_attempt_at LIMIT 1",
            self.table, self.pending
        );
        let first: Vec<At> = native_load(conn, sql(conn, &select))?;
        Ok(first.into_iter().next().map(|a| from_db(a.next_attempt_at)))
    }

    /// Runs `update`, a write of the pending entry `id`, in [`write_tx`]; an update that
    /// matched nothing is fine for an entry no longer pending, and [`DbError::NotFound`] for
    /// an unknown id.
    fn mark<F>(&self, conn: &mut AnyConnection, id: &str, update: F) -> Result<(), DbError>
    where
        F: FnOnce(&mut AnyConnection) -> QueryResult<usize>,
    {
        write_tx(conn, |conn| {
            if update(conn)? == 0 {
                self.ensure_exists(conn, id)?;
            }
            Ok(())
        })
    }

    fn ensure_exists(&self, conn: &mut AnyConnection, id: &str) -> Result<(), DbError> {
        let select = format!("SELECT next_attempt_at FROM {} WHERE id = #1", self.table);
        let found: Vec<At> = native_load(conn, sql(conn, &select).bind::<Text, _>(id))?;
        if found.is_empty() {
            Err(DbError::NotFound)
        } else {
            Ok(())
        }
    }
}

/// `text` with its `#n` placeholders written for the backend of `conn`.
fn sql(conn: &AnyConnection, text: &str) -> diesel::query_builder::SqlQuery {
    let mark = match conn {
        AnyConnection::Postgresql(_) => "$",
        AnyConnection::Sqlite(_) => "?",
    };
    diesel::sql_query(text.replace('#', mark))
}
