//! An exclusive role among the processes sharing one database, such as the pull-request
//! poller (docs/contract.md#55-pull-request-tracking, #8-scale-out): of several replicas on one PostgreSQL, one holds it at a time.
//!
//! On PostgreSQL the role is a session advisory lock taken with `pg_try_advisory_lock` on a
//! dedicated connection opened from the database URL (not taken from the pool, so it is never
//! handed to other work and never recycled while held). The lock lasts as long as that
//! session: [`LeaderLock::release`] or dropping the holder gives it up, and if the process
//! dies the server ends the session and frees the lock for another replica. On SQLite (one
//! process by design) the role is always held.
//!
//! The lock is taken in PostgreSQL's two-`int4` key space (the 64-bit key split into its high
//! and low halves), which PostgreSQL keeps apart from the single-`bigint` key space. The
//! migration lock ([`crate::connection::run_migrations`]) uses the latter, so no leader key,
//! whatever its value, can make a starting replica wait for a running poller.
//!
//! All calls block (diesel is synchronous): run them on a blocking thread.

use diesel::prelude::*;
use diesel::r2d2::R2D2Connection;
use diesel::sql_types::{Bool, Integer};

use crate::{DatabaseUrl, DbError};

/// An exclusive role among the processes sharing one database (see the module docs).
pub struct LeaderLock {
    key: i64,
    inner: Inner,
}

enum Inner {
    /// SQLite: one process, always the leader.
    Sqlite,
    /// PostgreSQL: the advisory lock on a dedicated session.
    Postgres(PgHolder),
}

struct PgHolder {
    /// The connection URL (kept private: it may hold a password).
    url: String,
    /// The key's high and low halves (`pg_try_advisory_lock(int4, int4)`).
    halves: (i32, i32),
    /// The dedicated session; kept between attempts so that a follower does not reconnect on
    /// every try.
    conn: Option<PgConnection>,
    /// Whether `conn` holds the lock.
    held: bool,
}

#[derive(QueryableByName)]
struct LockAnswer {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

impl std::fmt::Debug for LeaderLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL is left out on purpose: it may carry a password.
        let (backend, connected) = match &self.inner {
            Inner::Sqlite => ("sqlite", false),
            Inner::Postgres(pg) => ("postgres", pg.conn.is_some()),
        };
        f.debug_struct("LeaderLock")
            .field("backend", &backend)
            .field("key", &self.key)
            .field("connected", &connected)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LeaderLock {
    /// A holder of the role `key` (a constant chosen by the caller, one per role) on the
    /// database of `database_url`. Only parses the URL ([`DbError::InvalidUrl`]); the
    /// connection is opened by the first [`try_hold`](Self::try_hold).
    pub fn new(database_url: &str, key: i64) -> Result<LeaderLock, DbError> {
        let inner = match DatabaseUrl::parse(database_url)? {
            DatabaseUrl::Sqlite(_) => Inner::Sqlite,
            DatabaseUrl::Postgres(url) => Inner::Postgres(PgHolder {
                url,
                // High and low 32 bits, as two's-complement `int4`s.
                halves: ((key >> 32) as i32, key as i32),
                conn: None,
                held: false,
            }),
        };
        Ok(LeaderLock { key, inner })
    }

    /// The key this holder competes for.
    pub fn key(&self) -> i64 {
        self.key
    }

    /// Whether this process holds the role now.
    ///
    /// If it does not, tries to take it without waiting (connecting first if needed; a kept
    /// connection that turns out broken is replaced once). If it does, checks that the
    /// dedicated session still answers (`SELECT 1`); if the session broke (the server ended
    /// it, the network failed), the lock is gone with it, so the connection is dropped and the
    /// role is tried for again on a fresh one. Never blocks on the lock itself. On SQLite,
    /// always `Ok(true)`.
    ///
    /// Between a session breaking and the next call, this process may still believe it is
    /// the leader while another takes the role: work done under it must stay safe to run
    /// twice (the poller's transitions are compare-and-set).
    pub fn try_hold(&mut self) -> Result<bool, DbError> {
        match &mut self.inner {
            Inner::Sqlite => Ok(true),
            Inner::Postgres(pg) => pg.try_hold(self.key),
        }
    }

    /// Whether the last [`try_hold`](Self::try_hold) found the role held (always `true` on
    /// SQLite). Makes no database call.
    pub fn is_held(&self) -> bool {
        match &self.inner {
            Inner::Sqlite => true,
            Inner::Postgres(pg) => pg.held,
        }
    }

    /// Gives the role up: `pg_advisory_unlock`, then the dedicated connection is closed (which
    /// frees the lock even if the unlock failed). The next [`try_hold`](Self::try_hold) may
    /// take it again. Does nothing on SQLite.
    pub fn release(&mut self) {
        if let Inner::Postgres(pg) = &mut self.inner {
            pg.release(self.key);
        }
    }
}

impl PgHolder {
    fn try_hold(&mut self, key: i64) -> Result<bool, DbError> {
        if self.held {
            if self.conn.as_mut().is_some_and(|c| c.ping().is_ok()) {
                return Ok(true);
            }
            tracing::warn!(
                key,
                "the session holding a leader lock broke; the role is lost, trying to take it again"
            );
            self.conn = None;
            self.held = false;
        }
        // A connection kept from an earlier attempt may have broken while idle: if using it
        // fails, try once more on a fresh one.
        let reused = self.conn.is_some();
        match self.attempt() {
            Err(_) if reused => self.attempt(),
            other => other,
        }
    }

    /// One `pg_try_advisory_lock` on the dedicated session, connecting first if needed. A
    /// failed query drops the session.
    fn attempt(&mut self) -> Result<bool, DbError> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot @ None => slot.insert(
                PgConnection::establish(&self.url).map_err(|e| DbError::Connect(e.to_string()))?,
            ),
        };
        let answer = diesel::sql_query("SELECT pg_try_advisory_lock($1, $2) AS locked")
            .bind::<Integer, _>(self.halves.0)
            .bind::<Integer, _>(self.halves.1)
            .get_result::<LockAnswer>(conn);
        match answer {
            Ok(answer) => {
                self.held = answer.locked;
                Ok(answer.locked)
            }
            Err(e) => {
                self.conn = None;
                self.held = false;
                Err(DbError::Query(e))
            }
        }
    }

    fn release(&mut self, key: i64) {
        if self.held
            && let Some(conn) = self.conn.as_mut()
            && let Err(e) = diesel::sql_query("SELECT pg_advisory_unlock($1, $2)")
                .bind::<Integer, _>(self.halves.0)
                .bind::<Integer, _>(self.halves.1)
                .execute(conn)
        {
            // Closing the session below frees the lock anyway.
            tracing::debug!(key, error = %e, "pg_advisory_unlock failed");
        }
        self.held = false;
        self.conn = None;
    }
}
