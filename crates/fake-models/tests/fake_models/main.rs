//! Every integration test of the fake model API, in one test binary: the Anthropic and
//! OpenAI APIs over real HTTP and WebSocket, odd input, and the real agent CLIs against it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

mod anthropic;
mod common;
mod openai;
mod real_agents;
mod robustness;
