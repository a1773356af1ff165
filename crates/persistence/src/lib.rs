//! agentry's storage layer: the diesel schema, the embedded migrations, and every query the
//! service runs, written once for SQLite (the embedded default) and PostgreSQL (production).
//!
//! The backend is chosen at run time by the database URL ([`Db::connect`]); all queries take an
//! [`AnyConnection`]. Writes go through [`write_tx`], so a state change, its task event and
//! its cost commit together or not at all. Domain types ([`agentry_domain`]) come in and go
//! out; diesel rows stay inside this crate.
//!
//! Storage conventions (shared by both backends): ids are UUID text, times are UTC
//! `TIMESTAMP`s at microsecond precision, money is `BIGINT` nano-dollars.

pub mod connection;
mod convert;
mod error;
pub mod meta;
pub mod repos;
pub mod rollups;
pub mod schema;
pub mod secrets;
pub mod tasks;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod tokens;

pub use connection::{AnyConnection, Backend, DatabaseUrl, Db, PooledConnection, write_tx};
pub use convert::now;
pub use error::DbError;
