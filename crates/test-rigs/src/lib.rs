//! The service's test rigs (never shipped): the service under test over a fresh database with
//! the fake GitHub ([`rig`]), and a randomized cost history ([`cost_data`]), for the test
//! binaries of `agentry-service` and `agentry-api`.
//!
//! A crate of its own rather than a part of `agentry-testkit`: the fakes depend on the
//! testkit, and the rigs on a fake (and on the service), so in the testkit they would make a
//! cycle. The service's tests depend on this crate as a dev-dependency, which cargo allows:
//! the integration tests and this crate link the same `agentry-service`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test rigs: a failed unwrap is the test that called it failing"
)]

pub mod cost_data;
pub mod rig;
