//! The network of sandboxed agents (docs/security.md#network): the servers the service runs
//! on each run's own Unix sockets, which the runner binds into the sandbox or the pod.
//!
//! - [`gateway`]: the model gateway, a sandboxed agent's only way to its model API. It
//!   authenticates the run by its run key, bounds and checks each request, reserves the
//!   largest cost of each model call against the task's cap and holds it against the monthly
//!   budgets, forwards the call upstream with the real key, and meters the streamed answer
//!   into the database.
//! - [`egress`]: the egress proxy, a sandboxed agent's only other way out, allowing the hosts
//!   of the repository's and the instance's allow-lists and recording what it refuses.
//! - [`network`]: [`AgentNetwork`], which opens both for each run and implements the
//!   runner's seam ([`agentry_runner::network::Network`]); the half inside the sandbox (the
//!   forwarder, `agentry sandbox-net` / `agentry pod-run`) stays in the runner.
//!
//! The service builds one [`AgentNetwork`] from its configuration ([`AgentNetwork::start`])
//! and hands it to the runner; the network holds no state of the service beyond the
//! database.

pub mod egress;
pub mod gateway;
pub mod network;

pub use network::AgentNetwork;
