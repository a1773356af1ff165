//! Every integration test of this crate, in one test binary (one link step instead of
//! 17); each module is one area, named as its file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

mod alerts;
mod budgets;
mod common;
mod delivery;
mod file_modes;
mod import;
mod issues;
mod leader;
mod listing;
mod metering;
mod migrations;
mod outbox;
mod pulls;
mod read_plans;
mod repo_admin;
mod rollups;
mod runner;
mod runs;
mod scrape;
mod secrets;
mod tasks;
mod tokens;
mod transitions;
mod webhooks;
mod write_queue;
