//! Every integration test of this crate, in one test binary (one link step instead of
//! three): the use cases driven straight through `agentry_service::Service`, with no HTTP;
//! each module is one area, named as its file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

mod codehost;
mod common;
mod costs;
mod db_permits;
mod recovery;
mod tracking;
mod use_cases;

use agentry_test_rigs::{cost_data, rig};
