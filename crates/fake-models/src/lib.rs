//! A fake model API for agentry's tests (a dev-dependency only, never shipped): the real
//! agent CLIs (Claude Code, OpenAI Codex) run against it on loopback, with no real model.
//!
//! [`FakeModels::start`] runs a real HTTP/1.1 server (actix-web) on `127.0.0.1` (a free port)
//! on its own thread; dropping the [`FakeModels`] stops it. It speaks two APIs on the same
//! port, answers every model call from a deterministic script driven by the agent's prompt,
//! and records every request it answered as a [`Call`] for assertions ([`FakeModels::calls`],
//! [`FakeModels::main_calls`], [`FakeModels::usage_where`], [`FakeModels::wait_for`]).
//!
//! # Pointing the CLIs at it
//! Give each run a scratch `HOME` outside `/tmp` (Codex cannot create its helper binaries
//! under `/tmp`) and a git repository as its working directory.
//! * Claude Code: `ANTHROPIC_BASE_URL=`[`FakeModels::base_url`]
//!   `ANTHROPIC_API_KEY=`[`FakeModels::key`] (as root also `IS_SANDBOX=1`), `claude -p
//!   --output-format stream-json --verbose --model sonnet --permission-mode …`.
//! * Codex: `CODEX_API_KEY=`[`FakeModels::key`] `codex -c
//!   'openai_base_url="`[`FakeModels::openai_base_url`]`"' exec --json --model gpt-5.5
//!   --dangerously-bypass-approvals-and-sandbox -` (Codex ignores `OPENAI_BASE_URL`, and
//!   `codex exec` ignores `OPENAI_API_KEY`). With the GPT-6 family (`gpt-6.1-sol`,
//!   `gpt-6-luna`, `gpt-6-astra`) and `gpt-5.6-sol`, Codex works in [code
//!   mode](#codexs-code-mode); the fake answers either way.
//!
//! ```
//! use agentry_fake_models::{CallKind, FakeModels};
//!
//! let fake = FakeModels::start();
//! let base = fake.base_url(); // ANTHROPIC_BASE_URL; fake.openai_base_url() for Codex
//! assert!(base.starts_with("http://127.0.0.1:"));
//! // … run the CLI, then:
//! assert!(fake.calls().iter().all(|c| c.kind != CallKind::Main));
//! ```
//!
//! # What it speaks
//! Anthropic Messages API (Claude Code):
//! * `HEAD /` and `GET /` answer 200 (Claude Code's connectivity check, no key needed);
//! * `POST /v1/messages` (the query, e.g. `?beta=true`, is ignored): with `"stream": true`
//!   the events `message_start`, `content_block_start`, `ping`, `content_block_delta`
//!   (`text_delta`, `input_json_delta`), `content_block_stop`, `message_delta` (stop reason
//!   and usage), `message_stop`, as `text/event-stream`; otherwise one JSON message;
//! * `POST /v1/messages/count_tokens` (a quarter of the body's bytes) and `GET /v1/models`
//!   (with Anthropic headers);
//! * the key as `x-api-key` or `Authorization: Bearer`; else `401` and Anthropic's error
//!   JSON `{"type": "error", "error": {"type": "authentication_error", "message"}}`.
//!
//! OpenAI Responses API (Codex):
//! * `GET /v1/responses` with `Upgrade: websocket`: the WebSocket transport Codex tries
//!   first (it sends `OpenAI-Beta: responses_websockets=2026-02-06`). Each client text frame
//!   `{"type": "response.create", …}` is answered with the same events as the streamed HTTP
//!   answer, one JSON text frame each, or one frame `{"type": "error", "status", "error"}`.
//!   A `response.create` with `"generate": false` is a prewarm ([`CallKind::Prewarm`]:
//!   `response.created`, `response.in_progress`, `response.completed` with no output and
//!   zero usage). A `previous_response_id` continues the conversation that response ended
//!   (its `input` has only the new items); an unknown one answers 400
//!   `previous_response_not_found`. [`FakeModels::set_websocket_enabled`] refuses the
//!   upgrade with `426`, on which Codex falls back to HTTP at once (a `404` costs it six
//!   retries, about 6 s);
//! * `POST /v1/responses`: with `"stream": true` the events `response.created`,
//!   `response.in_progress`, then per output item `response.output_item.added`,
//!   (`response.content_part.added`, `response.output_text.delta`,
//!   `response.output_text.done`, `response.content_part.done`) or
//!   (`response.function_call_arguments.delta`, `response.function_call_arguments.done`) or,
//!   for a `custom_tool_call`, (`response.custom_tool_call_input.delta`,
//!   `response.custom_tool_call_input.done`), `response.output_item.done`, and `response.completed` with `usage` (`input_tokens`,
//!   `input_tokens_details.cached_tokens`/`cache_write_tokens`, `output_tokens`,
//!   `output_tokens_details.reasoning_tokens`, `total_tokens`); every event has a
//!   `sequence_number`. Otherwise one JSON response object;
//! * `GET /v1/models`: a model list;
//! * the key as `Authorization: Bearer`; else `401` and OpenAI's error JSON
//!   `{"error": {"message", "type", "param", "code": "invalid_api_key"}}`.
//!
//! Any other path answers 404 in the shape of the provider it looks like. A body that is not
//! a JSON object, or lacks `model` (or Anthropic's `messages`), answers 400 in the
//! provider's error shape; no input makes the fake panic.
//!
//! # The script
//! A *main* call is a model call of the agent loop: one that offers tools (OpenAI: in its
//! top-level `tools` or in an `additional_tools` input item), or continues by
//! `previous_response_id` a conversation whose tools were offered earlier (the fake keeps
//! the tools offered so far per response). A *side* call offers none or, for Anthropic, asks
//! for a JSON `output_config.format` (Claude Code's session title). Side calls get a short
//! answer (JSON following the requested schema, e.g. `{"title": "fake-models title"}`, or
//! text) and their own usage.
//!
//! The conversation is driven by the agent's prompt: the first user message without its
//! `<system-reminder>` sections (Claude Code), or the user messages that are not Codex's
//! context (`<environment_context>`, `# AGENTS.md instructions`, …). Each conversation gets
//! a *run tag* (`r` or `c` and 12 hex digits) that every answer names as `fake-models run
//! TAG`; the fake finds it again in the assistant messages of the history, the
//! `previous_response_id`, or the session (`x-claude-code-session-id`, `prompt_cache_key`).
//! The step is the number of tool results in the conversation (Anthropic `tool_result`
//! blocks; OpenAI `function_call_output` and `custom_tool_call_output` items).
//! * **Coding** (the default): each of the first N main calls (N = 1, or
//!   `[model:calls=N]`) answers a short text (`I will add the notes. [fake-models run
//!   TAG]`) and a tool call that writes `AGENT_NOTES.md` in the working directory: Claude
//!   Code's `Write` with the absolute path its system prompt states (the whole file: line 1
//!   to line k; `Bash` appending the line when there is no `Write` or no stated directory),
//!   Codex's shell tool (`exec_command` with `cmd`, `shell_command`, or `shell` with a
//!   `command` array, whichever the request offers; in code mode the custom tool `exec`)
//!   appending line k with `printf`. Line 1
//!   is `notes written by a real agent CLI (fake-models run TAG)`, line k `note k of N
//!   written by a real agent CLI (fake-models run TAG)`. The next call answers `Done: added
//!   a line to AGENT_NOTES.md. (fake-models run TAG)` (`added N lines` when N > 1).
//! * **Review**: when the prompt has a command in single backticks that starts with `git
//!   diff` (e.g. `` `git diff origin/main...HEAD` ``), call 1 runs exactly that command
//!   (Claude Code's `Bash`, Codex's shell tool or code mode's `exec`) and call 2 answers
//!   `fake-models review (fake-models run TAG). What the command gave:\n` and the first 4000
//!   characters of the tool result (its text parts joined by newlines).
//!
//! Directives anywhere in the prompt:
//! * `[model:api-error=CODE]`: every model call answers HTTP CODE (400–599) with the
//!   provider's error JSON, message `fake-models refuses this request (API-ERROR)`; the
//!   Anthropic answer carries `x-should-retry: false` (Claude Code honours it for 500 but
//!   not for 529, which it retries for about 3 minutes; Codex retries a 500 for about 30 s,
//!   falling back from the WebSocket to HTTP on the way; 400 and 429 fail at once);
//! * `[model:usage=IN,OUT,CACHE_READ,CACHE_WRITE]` (and an optional fifth, REASONING): the
//!   usage of every main call, in the provider's own fields (see [`Usage`]);
//! * `[model:slow=SECS]` (fractions allowed, at most 3600): the second and later main calls
//!   wait SECS before answering, so a test can stop a run in the middle (the waiting call is
//!   recorded at once, with `answered_at: None`);
//! * `[model:calls=N]` (1–100): N tool calls before the final answer;
//! * `[model:hold=SECS]` (as `slow`): every model call of the conversation, the first and
//!   side calls too, waits SECS before answering (a burst of calls stays in flight together);
//! * `[model:gather=N]` (Anthropic, 1–1000): the first N model calls that carry it wait
//!   (at most 60 s) until all N have arrived, then go on together (so a test can show that
//!   N calls were in flight at once: a caller that sends them one at a time waits the whole
//!   minute); later calls do not wait;
//! * `[model:cut]` (Anthropic): a streamed answer breaks off after `message_start` and its
//!   first block's start (the connection closes without the events that carry the final
//!   usage); the call is recorded with the usage the whole answer would have had, as a
//!   provider bills the work it did.
//!
//! As the providers do, a call's output stops at its limit: the `output_tokens` (and
//! reasoning) of its usage are at most its `max_tokens` (Anthropic) or `max_output_tokens`
//! (OpenAI), when it gives one.
//!
//! # Codex's code mode
//! With the GPT-6 family and `gpt-5.6-sol`, Codex 0.169.0 sends no top-level `tools` (and
//! no `instructions`). Its tools come as an input item
//! `{"type": "additional_tools", "role": "developer", "tools": [{"type": "namespace",
//! "name": "functions", "tools": [{"type": "custom", "name": "exec", "format": {"type":
//! "grammar", …}, "description"}, {"type": "function", "name": "wait", …}, …]}, {"type":
//! "namespace", "name": "clock", …}, …]}`: over the WebSocket once, in the first call after
//! the (tool-less, input-less) prewarm, later calls continuing by `previous_response_id` with
//! only their new items; over HTTP at the head of the whole history, every call. `exec`
//! runs JavaScript in a V8 isolate whose global `tools` object holds the nested tools
//! (`await tools.exec_command({cmd})` resolves to `{output, exit_code, wall_time_seconds,
//! …}`) and whose `text(value)` adds to the result.
//!
//! The fake opens the namespaces (a tool of namespace `functions` counts as one offered
//! directly) and, when no shell function is offered, runs a command with the item
//! `{"type": "custom_tool_call", "call_id", "name": "exec", "input"}` (no `namespace`),
//! `input` being
//! ```text
//! const r = await tools.exec_command({cmd: "COMMAND AS A JSON STRING"});
//! text(typeof r === "string" ? r : (r.output ?? JSON.stringify(r)));
//! ```
//! (`tools.shell_command({command})` when `exec`'s description declares only that one).
//! Codex reports the nested command as a `command_execution` item and sends back
//! `{"type": "custom_tool_call_output", "call_id", "output": [{"type": "input_text",
//! "text": "Script completed\nWall time 0.1 seconds\nOutput:\n"}, {"type": "input_text",
//! "text": "…what text() got…"}]}` (the second part only when the command printed
//! something).
//!
//! # Usage numbers
//! | call | Anthropic | OpenAI |
//! |---|---|---|
//! | main | [`ANTHROPIC_MAIN_USAGE`]: input 1000, output 50, cache read 3000, cache write 2000 | [`OPENAI_MAIN_USAGE`]: input 3000 (1000 cached), output 100 (20 reasoning) |
//! | side | [`ANTHROPIC_SIDE_USAGE`]: input 200, output 10 | [`OPENAI_SIDE_USAGE`]: input 300, output 10 |
//! | prewarm | — | 0 |
//!
//! What the CLIs then report, as checked by this crate's tests: Claude Code's
//! `total_cost_usd` is the price of every answered Anthropic call, side calls included
//! (its top-level `usage` counts the main calls only); Codex's `turn.completed` usage is the
//! sum over the answered OpenAI calls (`input_tokens` includes `cached_input_tokens`), and
//! its session file gets one `token_usage_record` (with the fake's `response_id`) per main
//! call as the run goes.
//!
//! For runs by hand, `cargo run -p agentry-fake-models --example serve [DUMP_DIR]` serves a
//! fake and prints each call as a JSON line (and writes it whole to `DUMP_DIR`).
//!
//! # Faults
//! [`FakeModels::fail_next`] answers the next main calls with an error status (no
//! `x-should-retry`, so the CLIs retry as they would against the real API).

mod anthropic;
mod openai;
mod script;
mod state;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use agentry_testkit::served::Served;
use serde::Serialize;

use parking_lot::{Mutex, MutexGuard};
use state::State;

/// The key [`FakeModels::start`] accepts.
pub const DEFAULT_KEY: &str = "test-key";

/// The largest request body read, in bytes (longer ones answer 413).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The usage of a main Anthropic call: input 1000, output 50, cache read 3000, cache write
/// 2000.
pub const ANTHROPIC_MAIN_USAGE: Usage = Usage {
    input_tokens: 1000,
    output_tokens: 50,
    cache_read_tokens: 3000,
    cache_write_tokens: 2000,
    reasoning_tokens: 0,
};

/// The usage of an Anthropic side request: input 200, output 10.
pub const ANTHROPIC_SIDE_USAGE: Usage = Usage {
    input_tokens: 200,
    output_tokens: 10,
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    reasoning_tokens: 0,
};

/// The usage of a main OpenAI call: input 3000 of which 1000 cached, output 100 of which 20
/// reasoning.
pub const OPENAI_MAIN_USAGE: Usage = Usage {
    input_tokens: 3000,
    output_tokens: 100,
    cache_read_tokens: 1000,
    cache_write_tokens: 0,
    reasoning_tokens: 20,
};

/// The usage of an OpenAI side request (one that offers no tools): input 300, output 10.
pub const OPENAI_SIDE_USAGE: Usage = Usage {
    input_tokens: 300,
    output_tokens: 10,
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    reasoning_tokens: 0,
};

/// Which API a request spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Provider {
    /// The Anthropic Messages API (Claude Code).
    Anthropic,
    /// The OpenAI Responses API (Codex).
    OpenAi,
}

/// How a request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Transport {
    /// One plain (JSON, or empty) HTTP answer.
    Json,
    /// An HTTP answer streamed as server-sent events.
    Sse,
    /// Over a WebSocket: the upgrade itself (status 101), or one `response.create` frame and
    /// the event frames that answered it.
    WebSocket,
}

/// What a request was, for the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum CallKind {
    /// A model call of the agent loop (it offers tools, or continues a conversation that
    /// did): the scripted conversation.
    Main,
    /// A model call outside the agent loop (Claude Code's session title, anything that offers
    /// no tools or asks for a JSON `output_config.format`).
    Side,
    /// Codex's WebSocket prewarm (`generate: false`): no output, no tokens.
    Prewarm,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// Anything else: connectivity checks, model lists, WebSocket upgrades, unknown paths.
    Other,
}

/// Token counts, in each provider's own terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Usage {
    /// Anthropic: `input_tokens` (the uncached input). OpenAI: `input_tokens` (all input,
    /// cached tokens included).
    pub input_tokens: u64,
    /// `output_tokens` (OpenAI's include the reasoning tokens).
    pub output_tokens: u64,
    /// Anthropic: `cache_read_input_tokens`. OpenAI: `input_tokens_details.cached_tokens`.
    pub cache_read_tokens: u64,
    /// Anthropic: `cache_creation_input_tokens` (all 5-minute writes). OpenAI: sent as
    /// `input_tokens_details.cache_write_tokens`, 0 unless a directive sets it.
    pub cache_write_tokens: u64,
    /// OpenAI: `output_tokens_details.reasoning_tokens`. Anthropic: 0.
    pub reasoning_tokens: u64,
}

impl Usage {
    /// This usage with its output (and reasoning) at most `limit` tokens, as a provider
    /// stops at the call's `max_tokens` / `max_output_tokens`.
    pub fn capped(self, limit: Option<u64>) -> Usage {
        let Some(limit) = limit else { return self };
        Usage {
            output_tokens: self.output_tokens.min(limit),
            reasoning_tokens: self.reasoning_tokens.min(limit),
            ..self
        }
    }

    /// The sum of every field of `usages` (saturating).
    pub fn sum<'a>(usages: impl IntoIterator<Item = &'a Usage>) -> Usage {
        usages.into_iter().fold(Usage::default(), |a, u| Usage {
            input_tokens: a.input_tokens.saturating_add(u.input_tokens),
            output_tokens: a.output_tokens.saturating_add(u.output_tokens),
            cache_read_tokens: a.cache_read_tokens.saturating_add(u.cache_read_tokens),
            cache_write_tokens: a.cache_write_tokens.saturating_add(u.cache_write_tokens),
            reasoning_tokens: a.reasoning_tokens.saturating_add(u.reasoning_tokens),
        })
    }
}

/// One request the fake answered (or is answering).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Call {
    /// Sequence number, from 0 at the start, in the order requests arrived.
    pub seq: u64,
    /// The API it spoke.
    pub provider: Provider,
    /// How it was answered.
    pub transport: Transport,
    /// What it was.
    pub kind: CallKind,
    /// Upper-case HTTP method (`GET` for WebSocket frames).
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string without `?` (empty when none).
    pub query: String,
    /// The model the request named, if any.
    pub model: Option<String>,
    /// The run tag of its conversation (main and side calls, prewarms), if known.
    pub run_tag: Option<String>,
    /// For a main call: how many tool results its conversation held (0 for the first call).
    pub step: Option<u32>,
    /// The usage the answer reported (`None` for errors and calls that report none).
    pub usage: Option<Usage>,
    /// The id of the answer: Anthropic's message id (`msg_…`, the `message.id` of Claude
    /// Code's `assistant` events), OpenAI's response id (`resp_…`, the `response_id` of
    /// Codex's `token_usage_record` session entries). `None` for errors and other requests.
    pub answer_id: Option<String>,
    /// The HTTP status answered (an error frame's `status` on a WebSocket, 101 for the
    /// upgrade).
    pub status: u16,
    /// Whether it carried the right key (true for requests that need none).
    pub key_ok: bool,
    /// When it arrived.
    pub received_at: SystemTime,
    /// When its answer was sent: later than `received_at` by a `[model:slow=…]` or fault
    /// delay; `None` while it waits (or when the client left before).
    pub answered_at: Option<SystemTime>,
    /// The request's headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The request body (a WebSocket frame without its `type`), when it was JSON.
    pub body: Option<serde_json::Value>,
}

impl Call {
    /// Whether this is a model call outside the agent loop.
    pub fn is_side(&self) -> bool {
        self.kind == CallKind::Side
    }

    /// Whether it answered a 2xx (or 101) status.
    pub fn is_success(&self) -> bool {
        (100..300).contains(&self.status)
    }

    /// The value of header `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a request body as a JSON object, or says why not (status, message); `not_json`
/// words the provider's message for a body that is not JSON.
pub(crate) fn parse_body(
    body: Result<Vec<u8>, u16>,
    not_json: fn(&serde_json::Error) -> String,
) -> Result<serde_json::Value, (u16, String)> {
    match body {
        Err(413) => Err((413, "fake-models: the request body is too large".into())),
        Err(_) => Err((
            400,
            "fake-models: the request body could not be read".into(),
        )),
        Ok(bytes) => parse_object(&bytes, not_json),
    }
}

/// Parses a JSON object, or says why not (400 and a message, worded by `not_json` for
/// bytes that are not JSON).
pub(crate) fn parse_object(
    bytes: &[u8],
    not_json: fn(&serde_json::Error) -> String,
) -> Result<serde_json::Value, (u16, String)> {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err((400, "fake-models: the body is not a JSON object".into())),
        Err(e) => Err((400, not_json(&e))),
    }
}

/// A request as the handlers see it.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub received_at: SystemTime,
}

impl Incoming {
    fn of(req: &HttpRequest) -> Self {
        Self {
            method: req.method().as_str().to_owned(),
            path: req.uri().path().to_owned(),
            query: req.uri().query().unwrap_or_default().to_owned(),
            headers: req
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            received_at: SystemTime::now(),
        }
    }

    /// The value of header `name` (lower case), if sent.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The token of `Authorization: Bearer TOKEN`, if sent (untrimmed).
    pub(crate) fn bearer(&self) -> Option<&str> {
        self.header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
    }

    /// A call record of this request, to complete.
    pub(crate) fn call(&self, provider: Provider, transport: Transport, kind: CallKind) -> Call {
        Call {
            seq: 0,
            provider,
            transport,
            kind,
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            model: None,
            run_tag: None,
            step: None,
            usage: None,
            answer_id: None,
            status: 200,
            key_ok: true,
            received_at: self.received_at,
            answered_at: None,
            headers: self.headers.clone(),
            body: None,
        }
    }
}

/// A plain HTTP answer.
#[derive(Debug)]
pub(crate) enum Body {
    Json(serde_json::Value),
    Sse(Vec<String>),
    /// These events, then the connection breaks off (no end of the chunked body).
    SseCut(Vec<String>),
    Text(String),
    Empty,
}

/// An HTTP answer, built while the state is locked and sent after it is released.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// Wait this long before answering.
    pub delay: Option<Duration>,
    /// The call to mark answered when the answer goes out.
    pub seq: Option<u64>,
    /// `[model:gather=N]`: among the first N such calls, wait until all N have arrived.
    pub gather: Option<u32>,
}

impl Reply {
    pub(crate) fn json(status: u16, body: serde_json::Value) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Json(body),
            delay: None,
            seq: None,
            gather: None,
        }
    }

    pub(crate) fn with_seq(mut self, seq: u64) -> Self {
        self.seq = Some(seq);
        self
    }
}

pub(crate) type Shared = Arc<Mutex<State>>;

async fn handle(req: HttpRequest, payload: web::Payload, state: web::Data<Shared>) -> HttpResponse {
    let incoming = Incoming::of(&req);
    let state: Shared = Arc::clone(state.get_ref());
    if incoming.path.trim_end_matches('/') == "/v1/responses"
        && openai::is_websocket_upgrade(&incoming)
    {
        return openai::websocket(&req, payload, incoming, state);
    }
    let body = match payload.to_bytes_limited(MAX_BODY_BYTES).await {
        Ok(Ok(bytes)) => Ok(bytes.to_vec()),
        Ok(Err(_)) => Err(400),
        Err(_) => Err(413),
    };
    let reply = route(&incoming, body, &state);
    send(reply, &state).await
}

/// Picks the handler of a request.
fn route(incoming: &Incoming, body: Result<Vec<u8>, u16>, state: &Shared) -> Reply {
    let method = incoming.method.as_str();
    let path = incoming.path.trim_end_matches('/');
    match (method, path) {
        ("HEAD" | "GET", "") => anthropic::root(incoming, state),
        ("POST", "/v1/messages") => anthropic::messages(incoming, body, state),
        ("POST", "/v1/messages/count_tokens") => anthropic::count_tokens(incoming, body, state),
        ("POST", "/v1/responses") => openai::responses(incoming, body, state),
        ("GET", "/v1/models") if anthropic::looks_anthropic(incoming) => {
            anthropic::models(incoming, state)
        }
        ("GET", "/v1/models") => openai::models(incoming, state),
        _ => unknown(incoming, state),
    }
}

/// A 404 in the shape of the provider the request looks like.
fn unknown(incoming: &Incoming, state: &Shared) -> Reply {
    let anthropic = anthropic::looks_anthropic(incoming);
    let message = format!(
        "fake-models: no route for {} {}",
        incoming.method, incoming.path
    );
    let (provider, body) = if anthropic {
        (Provider::Anthropic, anthropic::error_body(404, &message))
    } else {
        (Provider::OpenAi, openai::error_body(404, &message, None))
    };
    let mut call = incoming.call(provider, Transport::Json, CallKind::Other);
    call.status = 404;
    call.answered_at = Some(SystemTime::now());
    state.lock().record(call);
    Reply::json(404, body)
}

/// The longest a `[model:gather=N]` call waits for the others.
const GATHER_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends `reply` (after its gathering and its delay), marking its call answered.
async fn send(reply: Reply, state: &Shared) -> HttpResponse {
    if let Some(n) = reply.gather {
        let arrival = {
            let mut s = state.lock();
            s.gathered += 1;
            s.gathered
        };
        if arrival <= n {
            let deadline = std::time::Instant::now() + GATHER_TIMEOUT;
            while state.lock().gathered < n && std::time::Instant::now() < deadline {
                actix_web::rt::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    if let Some(delay) = reply.delay {
        actix_web::rt::time::sleep(delay).await;
    }
    if let Some(seq) = reply.seq {
        state.lock().answered(seq);
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    for (name, value) in reply.headers {
        builder.insert_header((name, value));
    }
    match reply.body {
        Body::Json(value) => builder
            .content_type("application/json")
            .body(value.to_string()),
        Body::Sse(chunks) => builder
            .content_type("text/event-stream")
            .insert_header(("cache-control", "no-cache"))
            .streaming(futures_util::stream::iter(
                chunks
                    .into_iter()
                    .map(|c| Ok::<_, std::convert::Infallible>(web::Bytes::from(c))),
            )),
        Body::SseCut(chunks) => builder
            .content_type("text/event-stream")
            .insert_header(("cache-control", "no-cache"))
            .streaming(futures_util::StreamExt::chain(
                futures_util::stream::iter(
                    chunks
                        .into_iter()
                        .map(|c| Ok::<_, std::io::Error>(web::Bytes::from(c))),
                ),
                // The events go out (the server flushes while the body waits), then the
                // connection breaks off.
                futures_util::stream::once(async {
                    actix_web::rt::time::sleep(Duration::from_millis(50)).await;
                    Err(std::io::Error::other("fake-models: [model:cut]"))
                }),
            )),
        Body::Text(text) => builder.content_type("text/plain").body(text),
        Body::Empty => builder.finish(),
    }
}

/// A running fake model API server. See the [module docs](self).
#[derive(Debug)]
pub struct FakeModels {
    state: Shared,
    /// The server; dropping the fake stops it.
    served: Served,
}

impl FakeModels {
    /// Starts a fake on `127.0.0.1` and a free port, accepting the key [`DEFAULT_KEY`].
    ///
    /// # Panics
    /// If no port can be bound or the server thread cannot start (see [`Self::try_start`]).
    #[track_caller]
    pub fn start() -> Self {
        Self::start_with_key(DEFAULT_KEY)
    }

    /// Starts a fake on `127.0.0.1` and a free port, accepting only `key`.
    ///
    /// # Panics
    /// If no port can be bound or the server thread cannot start.
    #[track_caller]
    pub fn start_with_key(key: &str) -> Self {
        match Self::try_start_with_key(key) {
            Ok(fake) => fake,
            Err(e) => panic!("fake models: cannot start: {e}"),
        }
    }

    /// Starts a fake accepting [`DEFAULT_KEY`], or says why it could not.
    pub fn try_start() -> std::io::Result<Self> {
        Self::try_start_with_key(DEFAULT_KEY)
    }

    /// Starts a fake accepting only `key`, or says why it could not.
    pub fn try_start_with_key(key: &str) -> std::io::Result<Self> {
        let (served, state) = Served::on_loopback(
            "fake-models",
            |addr| -> Shared {
                Arc::new(Mutex::new(State::new(
                    key.to_owned(),
                    state::seed(addr.port()),
                )))
            },
            handle,
            // Agents send a whole conversation in one request.
            Duration::from_secs(60),
        )?;
        Ok(Self { state, served })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash: Claude Code's `ANTHROPIC_BASE_URL`.
    pub fn base_url(&self) -> String {
        self.served.base_url().to_owned()
    }

    /// `http://127.0.0.1:PORT/v1`: Codex's `openai_base_url` (`-c
    /// 'openai_base_url="…"'`), or any OpenAI client's base URL.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.served.base_url())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The only API key accepted.
    pub fn key(&self) -> String {
        self.state().key.clone()
    }

    /// Accepts `key` from now on (and no other).
    pub fn set_key(&self, key: &str) {
        self.state().key = key.to_owned();
    }

    /// Whether `GET /v1/responses` may become a WebSocket (the default). When not, the
    /// upgrade is refused with `426 Upgrade Required` and Codex falls back to
    /// `POST /v1/responses` with server-sent events, after retrying the WebSocket.
    pub fn set_websocket_enabled(&self, enabled: bool) {
        self.state().websocket = enabled;
    }

    /// Every request answered (or being answered) since the start or [`Self::clear_calls`],
    /// in the order they arrived.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The main calls (the agent loop's model calls), in order.
    pub fn main_calls(&self) -> Vec<Call> {
        self.calls_where(|c| c.kind == CallKind::Main)
    }

    /// The side calls (model calls outside the agent loop), in order.
    pub fn side_calls(&self) -> Vec<Call> {
        self.calls_where(Call::is_side)
    }

    /// The model calls (main, side and prewarm) of the run `tag`, in order.
    pub fn calls_of_run(&self, tag: &str) -> Vec<Call> {
        self.calls_where(|c| c.run_tag.as_deref() == Some(tag))
    }

    /// The calls for which `keep` is true, in order.
    pub fn calls_where(&self, keep: impl Fn(&Call) -> bool) -> Vec<Call> {
        self.state()
            .calls
            .iter()
            .filter(|c| keep(c))
            .cloned()
            .collect()
    }

    /// The run tags of the conversations seen, in the order they started.
    pub fn run_tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = Vec::new();
        for call in &self.state().calls {
            if let Some(tag) = &call.run_tag
                && !tags.contains(tag)
            {
                tags.push(tag.clone());
            }
        }
        tags
    }

    /// The summed usage of the answered calls of `provider` for which `keep` is true.
    pub fn usage_where(&self, provider: Provider, keep: impl Fn(&Call) -> bool) -> Usage {
        let calls = self.calls_where(|c| {
            c.provider == provider && c.answered_at.is_some() && c.usage.is_some() && keep(c)
        });
        Usage::sum(calls.iter().filter_map(|c| c.usage.as_ref()))
    }

    /// Forgets the recorded calls (sequence numbers go on).
    pub fn clear_calls(&self) {
        self.state().clear_calls();
    }

    /// Polls every 10 ms, until `timeout`, for `done` to hold of the recorded calls; says
    /// whether it did.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[Call]) -> bool) -> bool {
        agentry_testkit::wait::poll(timeout, Duration::from_millis(10), || {
            done(&self.state().calls)
        })
        .is_ok()
    }

    /// Answers the next `n` main calls (of either provider, on any transport) with HTTP
    /// `status` (anything outside 400–599 becomes 500) and that provider's error JSON, whose
    /// message contains `fake-models fault`. Side calls, prewarms and other requests are not
    /// affected.
    pub fn fail_next(&self, n: usize, status: u16) {
        let status = if (400..=599).contains(&status) {
            status
        } else {
            500
        };
        let mut s = self.state();
        for _ in 0..n {
            s.faults.push_back(status);
        }
    }

    /// Drops the faults not used yet.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }
}
