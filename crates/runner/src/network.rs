//! The network of a sandboxed agent (docs/security.md#network): default-deny.
//!
//! A sandboxed run gets its own network namespace (`bwrap --unshare-net`): a loopback
//! interface and no route anywhere else. Two Unix sockets of the service are bound into the
//! sandbox under [`SANDBOX_NET_DIR`]: the model gateway's ([`GATEWAY_SOCKET`]) and the
//! egress proxy's ([`PROXY_SOCKET`]). Inside, a small forwarder (the agentry binary itself,
//! [`forwarder`]) listens on `127.0.0.1:`[`GATEWAY_PORT`] and `127.0.0.1:`[`PROXY_PORT`] of
//! the sandbox's own loopback and passes every connection to its socket; then it starts the
//! agent and waits for it ([`forwarder_main`]). The agent is given the gateway as its model API
//! (`ANTHROPIC_BASE_URL`, Codex's `openai_base_url`) with a key of its run only, and the
//! proxy as `HTTPS_PROXY`/`HTTP_PROXY`. It holds no real key and reaches nothing else: not a
//! loopback service of the host, not the local network, not the internet.
//!
//! What listens on the sockets is the service's business: a [`Network`] opens them for each
//! run ([`Network::open`]) and closes them when the [`RunNetwork`] it returned is dropped.
//! The runner ([`crate::local::LocalRunner`], given a [`crate::local::NetworkConfig`]) opens
//! the network of every sandboxed run, gives the agent [`agent_environment`], and stops the
//! run when its [`RunMeter`] is exhausted.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use agentry_domain::money::Usd;
use uuid::Uuid;

use agentry_domain::AgentType;

use crate::agent::{self, AgentSpec};

pub mod forwarder;

pub use forwarder::forwarder_main;

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

/// The model gateway as the agent reaches it inside the sandbox (Claude Code's
/// `ANTHROPIC_BASE_URL`; Codex's `openai_base_url` is this with `/v1`).
pub const GATEWAY_URL: &str = "http://127.0.0.1:4810";

/// The egress proxy as the agent reaches it inside the sandbox (`HTTPS_PROXY`,
/// `HTTP_PROXY`).
pub const PROXY_URL: &str = "http://127.0.0.1:4811";

/// What the agent reaches without the proxy (`NO_PROXY`): the sandbox's own loopback, where
/// the gateway is.
pub const NO_PROXY: &str = "127.0.0.1,localhost";

/// The variables of the agent's environment that name a proxy, in any case.
const PROXY_VARS: &[&str] = &["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"];

/// The arguments of the forwarder inside the sandbox, after its program and leading
/// arguments and before the agent's command line: `--listen 4810=/run/agentry/gateway.sock
/// --listen 4811=/run/agentry/proxy.sock --`.
pub fn forwarder_args() -> Vec<String> {
    vec![
        "--listen".to_owned(),
        format!("{GATEWAY_PORT}={SANDBOX_NET_DIR}/{GATEWAY_SOCKET}"),
        "--listen".to_owned(),
        format!("{PROXY_PORT}={SANDBOX_NET_DIR}/{PROXY_SOCKET}"),
        "--".to_owned(),
    ]
}

/// The environment of an agent whose network is the run's ([`Network::open`]), from the
/// one it would have had (`env`, see [`agent::environment`]): without any credential
/// variable ([`agent::api_key_vars`] of both agents), `ANTHROPIC_BASE_URL`,
/// `OPENAI_BASE_URL` and proxy variables (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`,
/// `NO_PROXY`, in any case); with the run's `key` and the gateway as the model API (Claude
/// Code: `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL` = [`GATEWAY_URL`]; Codex:
/// `CODEX_API_KEY`, `OPENAI_BASE_URL` = [`GATEWAY_URL`]`/v1`, which becomes its
/// `openai_base_url`), and the proxy: `HTTPS_PROXY`, `HTTP_PROXY`, `https_proxy`,
/// `http_proxy` = [`PROXY_URL`], `NO_PROXY`, `no_proxy` = [`NO_PROXY`].
pub fn agent_environment(
    agent_type: AgentType,
    env: Vec<(String, String)>,
    key: &str,
) -> Vec<(String, String)> {
    let removed = |name: &str| {
        agent::api_key_vars(AgentType::ClaudeCode)
            .iter()
            .chain(agent::api_key_vars(AgentType::Codex))
            .chain(&["ANTHROPIC_BASE_URL", agent::OPENAI_BASE_URL])
            .any(|n| *n == name)
            || PROXY_VARS.iter().any(|p| p.eq_ignore_ascii_case(name))
    };
    let mut env: Vec<(String, String)> = env.into_iter().filter(|(k, _)| !removed(k)).collect();
    let mut set = |name: &str, value: &str| env.push((name.to_owned(), value.to_owned()));
    match agent_type {
        AgentType::ClaudeCode => {
            set("ANTHROPIC_BASE_URL", GATEWAY_URL);
            set("ANTHROPIC_API_KEY", key);
        }
        AgentType::Codex => {
            set("CODEX_API_KEY", key);
            set(agent::OPENAI_BASE_URL, &format!("{GATEWAY_URL}/v1"));
        }
    }
    for name in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        set(name, PROXY_URL);
    }
    for name in ["NO_PROXY", "no_proxy"] {
        set(name, NO_PROXY);
    }
    env
}

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

/// What a run's metered calls add up to, shared between the gateway and the runner.
///
/// The gateway reserves each model call's largest possible cost before passing it on
/// ([`RunMeter::reserve`]): a call is passed on only if what the run has spent, what its
/// calls in flight have reserved and this call's reservation together stay within the run's
/// allowance. When the call ends its reservation is replaced by its metered cost
/// ([`RunMeter::settle`]). The gateway marks the run exhausted when it refuses a call for
/// its budget, and the runner stops an exhausted run as at its allowance.
#[derive(Debug, Default)]
pub struct RunMeter {
    ledger: Mutex<Ledger>,
    exhausted: AtomicBool,
    /// Why the gateway refused a call for a budget, when it said.
    reason: Mutex<Option<String>>,
}

/// The money of a run's calls, changed only under [`RunMeter`]'s lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ledger {
    /// The metered cost of the calls that ended.
    pub spent: Usd,
    /// The reservations of the calls in flight.
    pub reserved: Usd,
    /// How many calls ended.
    pub calls: i64,
}

impl RunMeter {
    fn ledger(&self) -> parking_lot::MutexGuard<'_, Ledger> {
        self.ledger.lock()
    }

    /// Reserves `amount` for one call if the run's spend, its reservations in flight and
    /// `amount` together stay within `allowance` (always, without one). On refusal returns
    /// the ledger as it stood; nothing is reserved then.
    pub fn reserve(&self, amount: Usd, allowance: Option<Usd>) -> Result<(), Ledger> {
        let mut ledger = self.ledger();
        let total = ledger
            .spent
            .saturating_add(ledger.reserved)
            .saturating_add(amount);
        if allowance.is_some_and(|allowance| total > allowance) {
            return Err(*ledger);
        }
        ledger.reserved = ledger.reserved.saturating_add(amount);
        Ok(())
    }

    /// Ends one call: releases its `reserved` amount and adds its metered `cost`.
    pub fn settle(&self, reserved: Usd, cost: Usd) {
        let mut ledger = self.ledger();
        ledger.reserved = ledger.reserved.saturating_sub(reserved);
        ledger.spent = ledger.spent.saturating_add(cost);
        ledger.calls += 1;
    }

    /// Gives back `amount` reserved for a call that was then not sent.
    pub fn release(&self, amount: Usd) {
        let mut ledger = self.ledger();
        ledger.reserved = ledger.reserved.saturating_sub(amount);
    }

    /// Adds one finished call that reserved nothing, and what it cost.
    pub fn add(&self, cost: Usd) {
        self.settle(Usd::ZERO, cost);
    }

    /// The metered cost of the calls that ended.
    pub fn spent(&self) -> Usd {
        self.ledger().spent
    }

    /// What the calls in flight have reserved.
    pub fn reserved(&self) -> Usd {
        self.ledger().reserved
    }

    /// How many calls ended.
    pub fn calls(&self) -> i64 {
        self.ledger().calls
    }

    /// Marks the run as having spent its allowance: the runner stops it.
    pub fn exhaust(&self) {
        self.exhausted.store(true, Ordering::SeqCst);
    }

    /// Marks the run exhausted because of `reason`: which budget a call did not fit, in a
    /// sentence that completes "budget reached: " (the first reason given is kept).
    pub fn exhaust_because(&self, reason: String) {
        let mut kept = self.reason.lock();
        kept.get_or_insert(reason);
        drop(kept);
        self.exhaust();
    }

    /// Why the run is exhausted, when the gateway said.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_reserved_within_the_allowance_and_settled_at_their_cost() {
        let usd = |s: &str| Usd::parse(s).unwrap();
        let meter = RunMeter::default();
        let allowance = Some(usd("5"));
        // Reservations in flight count: a second $3 call does not fit a $5 allowance.
        assert_eq!(meter.reserve(usd("3"), allowance), Ok(()));
        let refused = meter.reserve(usd("3"), allowance).unwrap_err();
        assert_eq!((refused.spent, refused.reserved), (Usd::ZERO, usd("3")));
        assert_eq!(meter.reserve(usd("2"), allowance), Ok(()));
        assert_eq!(meter.reserved(), usd("5"));
        // Settled: the reservation is replaced by the metered cost.
        meter.settle(usd("3"), usd("0.25"));
        assert_eq!(
            (meter.spent(), meter.reserved(), meter.calls()),
            (usd("0.25"), usd("2"), 1)
        );
        assert_eq!(meter.reserve(usd("2.75"), allowance), Ok(()));
        assert!(meter.reserve(usd("0.000000001"), allowance).is_err());
        // A cost above the reservation counts whole; no allowance admits everything.
        meter.settle(usd("2"), usd("4"));
        meter.settle(usd("2.75"), usd("0"));
        assert_eq!(
            (meter.spent(), meter.reserved(), meter.calls()),
            (usd("4.25"), Usd::ZERO, 3)
        );
        assert!(meter.reserve(usd("1"), allowance).is_err());
        assert_eq!(meter.reserve(usd("1000"), None), Ok(()));
    }

    #[test]
    fn the_urls_name_the_ports() {
        assert_eq!(GATEWAY_URL, format!("http://127.0.0.1:{GATEWAY_PORT}"));
        assert_eq!(PROXY_URL, format!("http://127.0.0.1:{PROXY_PORT}"));
        assert_eq!(
            forwarder_args().join(" "),
            "--listen 4810=/run/agentry/gateway.sock --listen 4811=/run/agentry/proxy.sock --"
        );
    }

    /// No credential, base URL or proxy of the service reaches a metered agent: the run's
    /// key, the gateway and the proxy replace them; the rest is kept in order.
    #[test]
    fn a_metered_agent_holds_only_its_run_key() {
        let env: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("HOME", "/h"),
            ("ANTHROPIC_API_KEY", "sk-ant-real"),
            ("ANTHROPIC_AUTH_TOKEN", "tok"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "oauth"),
            ("CODEX_API_KEY", "sk-codex"),
            ("OPENAI_API_KEY", "sk-openai"),
            ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            ("https_proxy", "http://corp:3128"),
            ("Http_Proxy", "http://corp:3128"),
            ("ALL_PROXY", "socks5://corp"),
            ("no_proxy", "corp"),
            ("SSL_CERT_FILE", "/etc/ca.pem"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let text = |agent| {
            agent_environment(agent, env.clone(), "run-key")
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        let proxies = [
            "HTTPS_PROXY=http://127.0.0.1:4811",
            "HTTP_PROXY=http://127.0.0.1:4811",
            "https_proxy=http://127.0.0.1:4811",
            "http_proxy=http://127.0.0.1:4811",
            "NO_PROXY=127.0.0.1,localhost",
            "no_proxy=127.0.0.1,localhost",
        ];
        let mut claude = vec![
            "PATH=/usr/bin",
            "HOME=/h",
            "SSL_CERT_FILE=/etc/ca.pem",
            "ANTHROPIC_BASE_URL=http://127.0.0.1:4810",
            "ANTHROPIC_API_KEY=run-key",
        ];
        claude.extend(proxies);
        assert_eq!(text(AgentType::ClaudeCode), claude);
        let mut codex = vec![
            "PATH=/usr/bin",
            "HOME=/h",
            "SSL_CERT_FILE=/etc/ca.pem",
            "CODEX_API_KEY=run-key",
            "OPENAI_BASE_URL=http://127.0.0.1:4810/v1",
        ];
        codex.extend(proxies);
        assert_eq!(text(AgentType::Codex), codex);
    }
}
