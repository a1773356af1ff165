//! Every integration test of this crate, in one test binary (one link step instead of
//! 7); each module is one area, named as its file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

mod alerts;
mod budget;
mod codehost;
mod common;
mod costs;
mod hardening;
mod http;
mod me;
// Before `revisions`, which uses its `app!`.
#[macro_use]
mod runs;
mod revisions;
mod tracking;
