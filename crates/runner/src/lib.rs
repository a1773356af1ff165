//! agentry's agent runner: everything that happens on the machine that runs an agent
//! (docs/contract.md#6-agent-runs), and nothing of the database or the code-host API.
//!
//! - [`job`]: the seam. A [`Job`] (task, repository, agent, prompt, limits) goes into a
//!   [`Runner`], an [`Execution`] (verdict, parsed report, output) comes out. The service
//!   claims tasks, opens pull requests and records runs; a runner prepares the workspace,
//!   runs the agent and pushes. [`LocalRunner`] ([`local`]) runs jobs as local processes;
//!   a Kubernetes Job runner would be another implementation.
//! - [`workspace`]: git with the real `git` executable: a bare mirror per repository, a
//!   worktree per task, commit and push with the token in git's environment only.
//! - [`process`]: the agent process in its own process group, with a minimal environment,
//!   a wall-time limit and cancellation that kills the whole group; output streamed to a
//!   log file.
//! - [`sandbox`]: the bubblewrap sandbox every agent runs in (unless turned off): the
//!   system read-only, the data directory, the service user's `HOME` and other processes
//!   hidden, only the worktree and the run's `HOME` writable.
//! - [`network`]: the network of a sandboxed run (with a [`local::NetworkConfig`]): its own
//!   network namespace, where only the service's model gateway and egress proxy are
//!   reachable, through the forwarder ([`network::forwarder_main`], `agentry sandbox-net`);
//!   the agent holds a key of its run only, and the run stops when its meter is exhausted.
//! - [`agent`]: the two CLIs' command lines and API-key variables.
//! - [`claude::parse_claude`] reads `claude -p --output-format stream-json --verbose`
//!   output (one JSON event per line) and takes cost, tokens, turns, model and outcome from
//!   the final `result` event. The cost is read exactly from the JSON text.
//! - [`codex::parse_codex`] reads `codex exec --json` output (JSON Lines events), sums the
//!   tokens of every `turn.completed` event and prices them with a [`PriceTable`];
//!   [`codex_session::SessionMeter`] reads the usage Codex records after every model call
//!   in its session files, so a Codex run is priced as it goes and when it is stopped.
//! - [`prices::PriceTable`]: per-million-token prices as exact decimals, a built-in table
//!   and a JSON override format (`AGENTRY_PRICES_FILE`).
//! - [`version`]: the agent CLI versions agentry supports, and checking the installed one.
//!
//! Both parsers return a [`RunReport`]; they never panic and never fail: whatever could not
//! be understood becomes an [`AgentOutcome::Unparseable`] outcome or a warning.

pub mod agent;
pub mod cgroup;
pub mod claude;
pub mod codex;
pub mod codex_session;
mod files;
pub mod job;
pub mod kube;
pub mod local;
pub mod network;
pub mod pod;
pub mod prices;
pub mod process;
pub mod sandbox;
pub mod user;
pub mod version;
pub mod workspace;

use agentry_domain::money::Usd;

pub use agent::AgentSpec;
pub use claude::parse_claude;
pub use codex::parse_codex;
pub use job::{Control, Execution, Job, JobKind, Runner, Salvaged, Verdict};
pub use local::{LocalConfig, LocalRunner, NetworkConfig};
pub use prices::{ModelPrice, PRICES_AS_OF, PriceError, PriceTable, Tokens};
pub use sandbox::{AgentLimits, BwrapFeatures, InvalidSandboxMode, Sandbox, SandboxMode};

/// What one agent run reported, as read from its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The model that did (most of) the work, if known.
    pub model: Option<String>,
    /// The exact cost of the run, if known. `None` means unknown, never zero.
    pub cost_usd: Option<Usd>,
    /// Why [`RunReport::cost_usd`] is unknown, one sentence (`None` when it is known).
    pub cost_unknown: Option<String>,
    /// The run's tokens (all input, its cache reads and writes, output).
    pub tokens: Tokens,
    /// The number of turns, if reported.
    pub turns: Option<i32>,
    /// How the run ended.
    pub outcome: AgentOutcome,
    /// The agent's final message, if any.
    pub final_text: Option<String>,
    /// Things that were odd in the output but did not stop the parse (skipped lines,
    /// unparseable figures, an unpriced model…), one sentence each.
    pub warnings: Vec<String>,
}

impl RunReport {
    /// An empty report with the given outcome: no model, no cost, zero tokens.
    fn empty(outcome: AgentOutcome) -> Self {
        RunReport {
            model: None,
            cost_usd: None,
            cost_unknown: None,
            tokens: Tokens::default(),
            turns: None,
            outcome,
            final_text: None,
            warnings: Vec::new(),
        }
    }
}

/// How an agent run ended, according to its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentOutcome {
    /// The agent finished its work.
    Success,
    /// The agent stopped because it reached its turn limit.
    MaxTurns,
    /// The agent stopped because it reached its spending limit.
    MaxBudget,
    /// The model API refused a call (the agent gave up on it): the HTTP status if known and
    /// the provider's message.
    ApiError {
        /// The HTTP status of the model API's answer, if reported.
        status: Option<u16>,
        /// The provider's message (an excerpt).
        message: String,
    },
    /// The agent reported an error; holds its message.
    Error(String),
    /// The output could not be understood (e.g. it was cut off before the final event);
    /// holds a sentence saying why.
    Unparseable(String),
}

impl AgentOutcome {
    /// Whether the run succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, AgentOutcome::Success)
    }

    /// How the run ended, as a person reads it (`model API error 400: …`, `turn failed: …`).
    pub fn describe(&self) -> String {
        match self {
            AgentOutcome::Success => "success".to_owned(),
            AgentOutcome::MaxTurns => "the turn limit was reached".to_owned(),
            AgentOutcome::MaxBudget => "the spending limit was reached".to_owned(),
            AgentOutcome::ApiError {
                status: Some(status),
                message,
            } => format!("model API error {status}: {message}"),
            AgentOutcome::ApiError {
                status: None,
                message,
            } => format!("model API error: {message}"),
            AgentOutcome::Error(message) | AgentOutcome::Unparseable(message) => message.clone(),
        }
    }
}

/// The provider's message in an error text an agent printed: the `error.message` (or
/// `message`) of a JSON error body, where the text is or ends with one
/// (`{"type":"error","status":400,"error":{"message":"…"}}`), else the text; and the status
/// such a body names.
///
/// The body is read into the few fields above (the rest skipped, not kept), so a huge
/// body costs no more memory than its text.
fn provider_message(text: &str) -> (Option<u16>, String) {
    let text = text.trim();
    let json = text
        .find('{')
        .and_then(|start| serde_json::from_str::<agent::Object<ErrorBody>>(&text[start..]).ok());
    let Some(agent::Object(Some(body))) = json else {
        return (None, excerpt(text));
    };
    // The `message` of an `error` object if it has one (whatever its value), else the
    // body's own `message`; either counts only if it is a string.
    let message = match body.error {
        Some(ErrorObject {
            message: Some(message),
        }) => message,
        _ => body.message.unwrap_or_default(),
    };
    let message = message.0.map_or_else(|| excerpt(text), |m| excerpt(&m));
    (body.status.0, message)
}

/// Whether `text` is a provider's error body: a JSON object whose `error` is an object.
fn is_provider_body(text: &str) -> bool {
    let text = text.trim();
    text.starts_with('{')
        && serde_json::from_str::<agent::Object<ErrorBody>>(text)
            .is_ok_and(|body| body.0.is_some_and(|b| b.error.is_some()))
}

/// The fields of a provider's JSON error body that are read.
#[derive(Debug, Default)]
struct ErrorBody {
    status: agent::Status,
    /// `error`, if it is an object.
    error: Option<ErrorObject>,
    /// `message`, if present (whatever its value).
    message: Option<agent::LooseStr>,
}

agent::fields!(ErrorBody {
    "status" => status: value,
    "error" => error: object,
    "message" => message: present,
});

/// The `message` of a body's `error` object, if present (whatever its value).
#[derive(Debug, Default)]
struct ErrorObject {
    message: Option<agent::LooseStr>,
}

agent::fields!(ErrorObject { "message" => message: present });

/// The longest excerpt of agent text quoted in a warning or message.
const MAX_QUOTED_CHARS: usize = 200;

/// At most [`MAX_QUOTED_CHARS`] characters of `text`, with `…` if cut.
fn excerpt(text: &str) -> String {
    agentry_domain::quote::excerpt(text, MAX_QUOTED_CHARS)
}

/// The most warnings kept in a report; further ones are counted in a last warning.
const MAX_WARNINGS: usize = 50;

/// Collects warnings up to [`MAX_WARNINGS`], counting the rest.
#[derive(Debug, Default)]
struct Warnings {
    kept: Vec<String>,
    dropped: usize,
}

impl Warnings {
    /// Records one warning.
    fn push(&mut self, warning: String) {
        if self.kept.len() < MAX_WARNINGS {
            self.kept.push(warning);
        } else {
            self.dropped += 1;
        }
    }

    /// The warnings, with a final count of dropped ones if any.
    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.kept
                .push(format!("{} more warnings not shown", self.dropped));
        }
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`provider_message`] as it was, through a `serde_json::Value`.
    fn by_value(text: &str) -> (Option<u16>, String) {
        let text = text.trim();
        let json = text
            .find('{')
            .and_then(|start| serde_json::from_str::<serde_json::Value>(&text[start..]).ok());
        let Some(body) = json else {
            return (None, excerpt(text));
        };
        let status = body
            .get("status")
            .and_then(serde_json::Value::as_u64)
            .and_then(|s| u16::try_from(s).ok());
        let message = body
            .get("error")
            .and_then(|e| e.get("message"))
            .or_else(|| body.get("message"))
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| excerpt(text), excerpt);
        (status, message)
    }

    /// An error body is read into a few fields, as a `serde_json::Value` read it before,
    /// and a huge one gives the same answer without being built whole.
    #[test]
    fn provider_messages_read_as_through_a_json_value() {
        let huge = format!(
            r#"{{"status":429,"padding":[{}1],"error":{{"message":"slow down"}}}}"#,
            "1,".repeat(500_000)
        );
        let texts = [
            "",
            "plain text",
            r#"{"type":"error","status":400,"error":{"message":"bad request"}}"#,
            r#"API Error: 400 {"error":{"message":"nested","type":"x"}}"#,
            r#"{"message":"top"}"#,
            r#"{"error":"a string","message":"top"}"#,
            r#"{"error":{"message":5},"message":"top"}"#,
            r#"{"error":{"code":1},"message":"top"}"#,
            r#"{"error":[{"message":"no"}],"message":"top"}"#,
            r#"{"status":"400","message":"m"}"#,
            r#"{"status":-1,"message":"m"}"#,
            r#"{"status":70000,"message":"m"}"#,
            r#"{"status":400.0,"message":"m"}"#,
            r#"{"status":400,"status":401,"error":{"message":"a"},"error":3,"message":"b"}"#,
            r#"{"error":{"message":"a","message":"b"}}"#,
            r#"{"message":"x"} trailing"#,
            r#"{"message":"x""#,
            r#"text {not json"#,
            &huge,
        ];
        for text in texts {
            assert_eq!(provider_message(text), by_value(text), "{}", excerpt(text));
            let before = text.trim().starts_with('{')
                && serde_json::from_str::<serde_json::Value>(text.trim())
                    .is_ok_and(|v| v.get("error").is_some_and(serde_json::Value::is_object));
            assert_eq!(is_provider_body(text), before, "{}", excerpt(text));
        }
        assert_eq!(provider_message(&huge), (Some(429), "slow down".to_owned()));
    }
}
