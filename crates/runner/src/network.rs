//! The network of a sandboxed agent (docs/security.md#network): default-deny.
//!
//! A sandboxed run gets its own network namespace (`bwrap --unshare-net`): a loopback
//! interface and no route anywhere else. Two Unix sockets of the service are bound into the
//! sandbox under [`SANDBOX_NET_DIR`]: the model gateway's ([`GATEWAY_SOCKET`]) and the
//! egress proxy's ([`PROXY_SOCKET`]). Inside, a small forwarder (the agentry binary itself,
//! [`forwarder`]) listens on `127.0.0.1:`[`GATEWAY_PORT`] and `127.0.0.1:`[`PROXY_PORT`] of
//! the sandbox's own loopback and passes every connection to its socket; then it starts the
//! agent and waits for it. The agent is given the gateway as its model API
//! (`ANTHROPIC_BASE_URL`, Codex's `openai_base_url`) with a key of its run only, and the
//! proxy as `HTTPS_PROXY`/`HTTP_PROXY`. It holds no real key and reaches nothing else: not a
//! loopback service of the host, not the local network, not the internet.
//!
//! What listens on the sockets is the service's business: a [`Network`] opens them for each
//! run ([`Network::open`]) and closes them when the [`RunNetwork`] it returned is dropped.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use agentry_domain::money::Usd;
use uuid::Uuid;

use crate::agent::AgentSpec;

/// Where the run's network directory (holding [`GATEWAY_SOCKET`] and [`PROXY_SOCKET`]) is
/// mounted inside the sandbox, read-only.
pub const SANDBOX_NET_DIR: &str = "/run/agentry";

/// The model gateway's Unix socket, in the run's network directory.
pub const GATEWAY_SOCKET: &str = "gateway.sock";

/// The egress proxy's Unix socket, in the run's network directory.
pub const PROXY_SOCKET: &str = "proxy.sock";

/// The port of the sandbox's loopback on which the forwarder passes connections to the
/// gateway.
pub const GATEWAY_PORT: u16 = 4810;

/// The port of the sandbox's loopback on which the forwarder passes connections to the
/// egress proxy.
pub const PROXY_PORT: u16 = 4811;

/// The run a network is opened for.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The task.
    pub task_id: Uuid,
    /// The attempt.
    pub attempt: i32,
    /// The repository's key ([`crate::workspace::RepoSpec::key`]: its id).
    pub repo_key: String,
    /// The agent and its allowance.
    pub agent: AgentSpec,
}

/// What a run's metered calls add up to, shared between the gateway (which adds every call
/// as it finishes and marks the run exhausted when it refuses a call for its budget) and the
/// runner (which stops an exhausted run as at its allowance).
#[derive(Debug, Default)]
pub struct RunMeter {
    spent_nanos: AtomicI64,
    calls: AtomicI64,
    exhausted: AtomicBool,
}

impl RunMeter {
    /// Adds one finished call and what it cost (`None`: unpriced, adds nothing).
    pub fn add(&self, cost: Option<Usd>) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(cost) = cost {
            self.spent_nanos.fetch_add(cost.to_nanos(), Ordering::SeqCst);
        }
    }

    /// The priced cost of the calls added so far.
    pub fn spent(&self) -> Usd {
        Usd::from_nanos(self.spent_nanos.load(Ordering::SeqCst)).unwrap_or(Usd::ZERO)
    }

    /// How many calls were added.
    pub fn calls(&self) -> i64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Marks the run as having spent its allowance: the runner stops it.
    pub fn exhaust(&self) {
        self.exhausted.store(true, Ordering::SeqCst);
    }

    /// Whether the gateway refused a call of this run for its budget.
    pub fn is_exhausted(&self) -> bool {
        self.exhausted.load(Ordering::SeqCst)
    }
}

/// The network of one run, as long as it is held: dropping it closes the run's sockets and
/// revokes its key.
pub struct RunNetwork {
    /// The key the agent presents to the gateway (its only credential; good for this run,
    /// through the gateway, while this value lives).
    pub key: String,
    /// What the run's metered calls add up to.
    pub meter: Arc<RunMeter>,
    /// Whatever keeps the run's listeners open.
    pub guard: Box<dyn Send + Sync>,
}

impl fmt::Debug for RunNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunNetwork")
            .field("key", &"…")
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

/// A boxed future of a [`RunNetwork`] or why none could be opened.
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = Result<RunNetwork, String>> + Send + 'a>>;

/// What serves the sockets of sandboxed runs (the service's model gateway and egress
/// proxy).
pub trait Network: Send + Sync + fmt::Debug {
    /// Listens on [`GATEWAY_SOCKET`] and [`PROXY_SOCKET`] in `dir` (an empty directory of
    /// the run) for `run`, until the returned [`RunNetwork`] is dropped. An `Err` (a sentence
    /// saying why) fails the run before its agent starts.
    fn open<'a>(&'a self, run: &'a RunInfo, dir: &'a Path) -> OpenFuture<'a>;
}
