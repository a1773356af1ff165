//! agentry's code-host integration: the one GitHub REST client (rate limits, retries,
//! conditional requests), webhook signature checks and event parsing, and a fake GitHub for
//! tests.
//!
//! So far it holds the fake: [`fake::FakeGitHub`] (feature `test-support`), a stateful GitHub
//! REST v3 server on 127.0.0.1 with GitHub's JSON shapes, pagination, ETags and 304s,
//! per-route request counters and fault injection (5xx, timeouts, rate limits). The client
//! and the webhook code arrive with the code-host capability; nothing in the service depends
//! on this crate yet.

#[cfg(feature = "test-support")]
pub mod fake;
