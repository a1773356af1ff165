//! Every integration test of this crate, in one test binary (one link step instead of
//! three): the use cases driven straight through `agentry_service::Service`, with no HTTP;
//! each module is one area, named as its file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

/// Runs the async test `$name(db)` once on SQLite and once on PostgreSQL (skipped, and
/// reported ignored, where the suite has no server), as `$name::sqlite` and
/// `$name::postgres`.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            use agentry_persistence::test_support::TestDb;

            #[tokio::test]
            async fn sqlite() {
                super::$name(TestDb::sqlite()).await;
            }

            #[tokio::test]
            #[cfg_attr(
                agentry_pg_skipped,
                ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
            )]
            async fn postgres() {
                if let Some(db) = TestDb::postgres() {
                    super::$name(db).await;
                }
            }
        }
    };
}

mod codehost;
mod common;
#[path = "../../../testkit/rigs/cost_data.rs"]
mod cost_data;
mod costs;
mod db_permits;
#[path = "../../../testkit/rigs/service.rs"]
mod rig;
mod tracking;
mod use_cases;
