//! Every integration test of this crate, in one test binary (one link step instead of
//! 7); each module is one area, named as its file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is the test failing; clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers"
)]

mod agent_user;
mod budget;
mod fake_agents;
mod git_safety;
mod limits;
mod network;
mod parsers;
mod pod;
mod process;
mod sandbox;
mod seccomp;
mod support;
mod workspace;
