//! agentry's storage layer: the diesel schema, the embedded migrations, and every query the
//! service runs, written once for SQLite (the embedded default) and PostgreSQL (production).
//!
//! The backend is chosen at run time by the database URL ([`Db::connect`]); all queries take an
//! [`AnyConnection`]. Writes go through [`write_tx`], so a state change, its task event, its
//! cost and the code-host effects it causes (the [`outbox`]) commit together or not at all.
//! Domain types ([`agentry_domain`]) come in and go out; diesel rows stay inside this crate.
//!
//! Modules by resource: [`tasks`] (creation, transitions, runs, listing, import), [`repos`]
//! (connected repositories, settings, issue-sync state), [`issues`] (the synced copy of open
//! code-host issues behind the issues view), [`outbox`] (code-host side effects),
//! [`delivery`] (the leased, retried delivery of the outbox and of the budget [`alerts`]),
//! [`pulls`] (pull-request tracking: what the poller visits, applying a pull request's fate),
//! [`webhooks`] (delivery de-duplication), [`revisions`] (review feedback and revision rounds), [`leader`] (an exclusive role among replicas, such
//! as the poller), [`runner`] (task claims and leases, run logs), [`rollups`] (cost rollups), [`tokens`], [`secrets`] and [`meta`].
//!
//! Storage conventions (shared by both backends): ids are UUID text, times are UTC
//! `TIMESTAMP`s at microsecond precision, money is `BIGINT` nano-dollars.

pub mod alerts;
pub mod budgets;
pub mod connection;
mod convert;
pub mod delivery;
mod error;
mod fetch;
pub mod issues;
pub mod leader;
pub mod meta;
pub mod metering;
pub mod outbox;
pub mod pulls;
pub mod repos;
pub mod revisions;
pub mod rollups;
pub mod runner;
pub mod schema;
pub mod scrape;
pub mod secrets;
pub mod tasks;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod tokens;
pub mod webhooks;

pub use connection::{
    AnyConnection, Backend, DatabaseUrl, Db, PooledConnection, read_tx, write_tx,
};
pub use convert::now;
pub use error::DbError;
