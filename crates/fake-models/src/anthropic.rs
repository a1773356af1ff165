//! The Anthropic Messages API as Claude Code uses it: `HEAD /`, `POST /v1/messages`
//! (streaming or not), `POST /v1/messages/count_tokens`, `GET /v1/models`.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::script::{self, Directives, Mode, NOTES_FILE, Step, ToolAction};
use crate::state::State;
use crate::{
    ANTHROPIC_MAIN_USAGE, ANTHROPIC_SIDE_USAGE, Body, Call, CallKind, Incoming, Provider, Reply,
    Shared, Transport, Usage, parse_body,
};

/// The message of an error asked for by `[model:api-error=CODE]`.
pub(crate) const API_ERROR_MESSAGE: &str = "fake-models refuses this request (API-ERROR)";

/// The message of an error queued by `fail_next`.
pub(crate) const FAULT_MESSAGE: &str = "fake-models fault (FAULT)";

/// Whether a request looks like it was meant for the Anthropic API.
pub(crate) fn looks_anthropic(incoming: &Incoming) -> bool {
    incoming.header("anthropic-version").is_some()
        || incoming.header("x-api-key").is_some()
        || incoming.path.starts_with("/v1/messages")
}

/// Whether the request carries the key: `x-api-key`, or `Authorization: Bearer` (what
/// Claude Code sends with `ANTHROPIC_AUTH_TOKEN`).
fn authorized(incoming: &Incoming, key: &str) -> bool {
    incoming.header("x-api-key") == Some(key) || incoming.bearer().map(str::trim) == Some(key)
}

/// The `error.type` Anthropic gives a status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ if status >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error JSON.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    json!({
        "type": "error",
        "error": { "type": error_type(status), "message": message },
    })
}

/// Records `call` as answered with an error, and the error reply.
fn error_reply(s: &mut State, mut call: Call, status: u16, message: &str, no_retry: bool) -> Reply {
    call.status = status;
    call.usage = None;
    call.answered_at = Some(SystemTime::now());
    let request_id = s.new_id("req_", 24);
    s.record(call);
    let mut body = error_body(status, message);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("request_id".into(), Value::String(request_id.clone()));
    }
    let mut reply = Reply::json(status, body);
    reply.headers.push(("request-id".into(), request_id));
    if no_retry {
        // The Anthropic SDK does not retry an answer that says so.
        reply
            .headers
            .push(("x-should-retry".into(), "false".into()));
    }
    reply
}

/// `HEAD /` and `GET /`: Claude Code's connectivity check.
pub(crate) fn root(incoming: &Incoming, state: &Shared) -> Reply {
    let mut call = incoming.call(Provider::Anthropic, Transport::Json, CallKind::Other);
    call.answered_at = Some(SystemTime::now());
    state.lock().record(call);
    Reply {
        status: 200,
        headers: Vec::new(),
        body: if incoming.method == "HEAD" {
            Body::Empty
        } else {
            Body::Text("fake-models: ok\n".into())
        },
        delay: None,
        seq: None,
        gather: None,
    }
}

/// `GET /v1/models` with Anthropic headers.
pub(crate) fn models(incoming: &Incoming, state: &Shared) -> Reply {
    let mut s = state.lock();
    let mut call = incoming.call(Provider::Anthropic, Transport::Json, CallKind::Other);
    call.key_ok = authorized(incoming, &s.key);
    if !call.key_ok {
        return error_reply(&mut s, call, 401, "invalid x-api-key", false);
    }
    call.answered_at = Some(SystemTime::now());
    s.record(call);
    let models = [
        ("claude-sonnet-5", "Claude Sonnet 5"),
        ("claude-haiku-4-5-20251001", "Claude Haiku 4.5"),
        ("claude-opus-4-1-20250805", "Claude Opus 4.1"),
    ];
    let data: Vec<Value> = models
        .iter()
        .map(|(id, name)| {
            json!({"type": "model", "id": id, "display_name": name,
                   "created_at": "2025-01-01T00:00:00Z"})
        })
        .collect();
    Reply::json(
        200,
        json!({"data": data, "has_more": false,
               "first_id": models.first().map(|m| m.0),
               "last_id": models.last().map(|m| m.0)}),
    )
}

/// Anthropic's 400 message for a body that is not JSON.
fn not_json(e: &serde_json::Error) -> String {
    format!("fake-models: the body is not JSON: {e}")
}

/// `POST /v1/messages/count_tokens`: a rough count (a quarter of the body's bytes).
pub(crate) fn count_tokens(
    incoming: &Incoming,
    body: Result<Vec<u8>, u16>,
    state: &Shared,
) -> Reply {
    let mut s = state.lock();
    let mut call = incoming.call(Provider::Anthropic, Transport::Json, CallKind::CountTokens);
    call.key_ok = authorized(incoming, &s.key);
    let len = body.as_ref().map(Vec::len).unwrap_or(0);
    let parsed = parse_body(body, not_json);
    if let Ok(v) = &parsed {
        call.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
        call.body = Some(v.clone());
    }
    if !call.key_ok {
        return error_reply(&mut s, call, 401, "invalid x-api-key", false);
    }
    if let Err((status, message)) = parsed {
        return error_reply(&mut s, call, status, &message, false);
    }
    call.answered_at = Some(SystemTime::now());
    s.record(call);
    Reply::json(200, json!({ "input_tokens": (len / 4).max(1) }))
}

/// The text of a message's `content` (a string, or the `text` of its text blocks).
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// What a request's conversation holds.
#[derive(Debug, Default)]
struct Conversation {
    /// The user text of the first user message, without system reminders.
    prompt: String,
    /// All user text (for side requests, whose prompt may be anywhere).
    all_user_text: String,
    /// A run tag the fake wrote in an earlier assistant message.
    history_tag: Option<String>,
    /// `tool_result` blocks in the history.
    tool_results: u32,
    /// The newest tool result's text.
    last_result: Option<String>,
    /// The names of the tools offered.
    tools: Vec<String>,
    /// The working directory the system prompt names.
    cwd: Option<String>,
}

impl Conversation {
    fn of(body: &Value) -> Self {
        let mut out = Self::default();
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut first_user = true;
        let mut user_texts = Vec::new();
        for message in messages {
            let role = message.get("role").and_then(Value::as_str);
            let content = message.get("content").unwrap_or(&Value::Null);
            match role {
                Some("user") => {
                    let text = script::strip_system_reminders(&content_text(content));
                    if first_user {
                        out.prompt = text.trim().to_owned();
                        first_user = false;
                    }
                    user_texts.push(text);
                    for block in content.as_array().map(Vec::as_slice).unwrap_or_default() {
                        if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                            out.tool_results += 1;
                            out.last_result =
                                Some(content_text(block.get("content").unwrap_or(&Value::Null)));
                        }
                    }
                }
                Some("assistant") => {
                    if let Some(tag) = script::find_tag(&content_text(content)) {
                        out.history_tag = Some(tag);
                    }
                }
                _ => {}
            }
        }
        out.all_user_text = user_texts.join("\n");
        out.tools = body
            .get("tools")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        out.cwd = find_cwd(&content_text(body.get("system").unwrap_or(&Value::Null)));
        out
    }
}

/// The working directory Claude Code's system prompt states (`Primary working directory:
/// /path`, or `Working directory: /path`).
fn find_cwd(system: &str) -> Option<String> {
    system.lines().find_map(|line| {
        let lower = line.to_ascii_lowercase();
        let at = lower.find("working directory:")?;
        let rest = line.get(at + "working directory:".len()..)?.trim();
        rest.starts_with('/').then(|| rest.to_owned())
    })
}

/// Whether a request is a side request: it offers no tools, or asks for a JSON format.
fn is_side(body: &Value) -> bool {
    let no_tools = body
        .get("tools")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    let json_format = body
        .get("output_config")
        .and_then(|c| c.get("format"))
        .is_some_and(|f| !f.is_null());
    no_tools || json_format
}

/// A content block of the answer.
#[derive(Debug, Clone)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// The answer to a side request: JSON following `output_config.format`'s schema, or text.
fn side_answer(body: &Value, tag: &str) -> String {
    let schema = body
        .get("output_config")
        .and_then(|c| c.get("format"))
        .and_then(|f| f.get("schema"));
    match schema {
        Some(schema) => script::example_of(schema, "value").to_string(),
        None => format!("fake-models side answer (fake-models run {tag})"),
    }
}

/// The content blocks of a main call's answer.
fn main_answer(s: &mut State, conversation: &Conversation, step: Step) -> Vec<Block> {
    match step {
        Step::Final(text) => vec![Block::Text(text)],
        Step::Tool { intro, action } => match tool_use(conversation, &action) {
            Ok((name, input)) => vec![
                Block::Text(intro),
                Block::ToolUse {
                    id: s.new_id("toolu_", 24),
                    name,
                    input,
                },
            ],
            Err(why) => vec![Block::Text(format!("fake-models: {why}"))],
        },
    }
}

/// A tool call in Claude Code's tools: `Write` (absolute path) or `Bash`.
fn tool_use(conversation: &Conversation, action: &ToolAction) -> Result<(String, Value), String> {
    let has = |name: &str| conversation.tools.iter().any(|t| t == name);
    match action {
        ToolAction::Notes { lines } => {
            if has("Write")
                && let Some(cwd) = &conversation.cwd
            {
                let mut content = lines.join("\n");
                content.push('\n');
                return Ok((
                    "Write".into(),
                    json!({
                        "file_path": format!("{}/{NOTES_FILE}", cwd.trim_end_matches('/')),
                        "content": content,
                    }),
                ));
            }
            if has("Bash") {
                let line = lines.last().map(String::as_str).unwrap_or_default();
                return Ok((
                    "Bash".into(),
                    json!({
                        "command": format!("printf '%s\\n' {} >> {NOTES_FILE}", script::shell_quote(line)),
                        "description": format!("Add a line to {NOTES_FILE}"),
                    }),
                ));
            }
            Err(format!(
                "no Write or Bash tool is offered to write {NOTES_FILE}"
            ))
        }
        ToolAction::Run { command } => {
            if has("Bash") {
                Ok((
                    "Bash".into(),
                    json!({"command": command, "description": "Run the command the task names"}),
                ))
            } else {
                Err(format!("no Bash tool is offered to run `{command}`"))
            }
        }
    }
}

/// Anthropic's `usage` object.
fn usage_json(usage: &Usage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_write_tokens,
            "ephemeral_1h_input_tokens": 0,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    })
}

/// `POST /v1/messages`.
pub(crate) fn messages(incoming: &Incoming, body: Result<Vec<u8>, u16>, state: &Shared) -> Reply {
    let mut s = state.lock();
    let mut call = incoming.call(Provider::Anthropic, Transport::Json, CallKind::Main);
    call.key_ok = authorized(incoming, &s.key);
    let parsed = parse_body(body, not_json);
    if let Ok(v) = &parsed {
        call.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
        call.kind = if is_side(v) {
            CallKind::Side
        } else {
            CallKind::Main
        };
        if v.get("stream").and_then(Value::as_bool) == Some(true) {
            call.transport = Transport::Sse;
        }
        call.body = Some(v.clone());
    }
    if !call.key_ok {
        return error_reply(&mut s, call, 401, "invalid x-api-key", false);
    }
    let v = match parsed {
        Ok(v) => v,
        Err((status, message)) => return error_reply(&mut s, call, status, &message, false),
    };
    if !v.get("messages").is_some_and(Value::is_array) {
        return error_reply(&mut s, call, 400, "messages: Field required", false);
    }
    let Some(model) = call.model.clone() else {
        return error_reply(&mut s, call, 400, "model: Field required", false);
    };
    let conversation = Conversation::of(&v);
    let session = incoming
        .header("x-claude-code-session-id")
        .map(str::to_owned);
    let known = session.as_ref().and_then(|k| s.sessions.get(k).cloned());
    let tag = conversation
        .history_tag
        .clone()
        .or(known)
        .unwrap_or_else(|| s.new_tag("r"));
    if let Some(k) = session {
        s.sessions.entry(k).or_insert_with(|| tag.clone());
    }
    call.run_tag = Some(tag.clone());
    let side = call.kind == CallKind::Side;
    let directives = Directives::parse(if side {
        &conversation.all_user_text
    } else {
        &conversation.prompt
    });
    if !side {
        call.step = Some(conversation.tool_results);
    }
    if let Some(code) = directives.api_error {
        return error_reply(&mut s, call, code, API_ERROR_MESSAGE, true);
    }
    if !side && let Some(code) = s.take_fault() {
        return error_reply(&mut s, call, code, FAULT_MESSAGE, false);
    }
    let (usage, blocks) = if side {
        (
            ANTHROPIC_SIDE_USAGE,
            vec![Block::Text(side_answer(&v, &tag))],
        )
    } else {
        // Anthropic reports no reasoning tokens of their own.
        let usage = Usage {
            reasoning_tokens: 0,
            ..directives.main_usage(ANTHROPIC_MAIN_USAGE)
        }
        .capped(v.get("max_tokens").and_then(Value::as_u64));
        let mode = Mode::of(&conversation.prompt, &directives);
        let step = script::step(
            &mode,
            &tag,
            conversation.tool_results,
            conversation.last_result.as_deref(),
        );
        (usage, main_answer(&mut s, &conversation, step))
    };
    let delay = directives.delay(!side && conversation.tool_results >= 1);
    call.usage = Some(usage);
    let streaming = call.transport == Transport::Sse;
    let message_id = s.new_id("msg_", 24);
    let request_id = s.new_id("req_", 24);
    call.answer_id = Some(message_id.clone());
    let seq = s.record(call);
    drop(s);
    let stop_reason = if blocks.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
        "tool_use"
    } else {
        "end_turn"
    };
    let mut reply = if streaming {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: {
                let chunks = sse_chunks(&message_id, &model, &blocks, stop_reason, &usage);
                if directives.cut {
                    // message_start and the first block's start: no message_delta.
                    Body::SseCut(chunks.into_iter().take(2).collect())
                } else {
                    Body::Sse(chunks)
                }
            },
            delay: None,
            seq: None,
            gather: None,
        }
    } else {
        Reply::json(
            200,
            json!({
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks.iter().map(block_json).collect::<Vec<_>>(),
                "stop_reason": stop_reason,
                "stop_sequence": null,
                "usage": usage_json(&usage, usage.output_tokens),
            }),
        )
    };
    reply.headers.push(("request-id".into(), request_id));
    reply.delay = delay;
    reply.gather = directives.gather;
    reply.with_seq(seq)
}

/// A block as the non-streaming answer writes it.
fn block_json(block: &Block) -> Value {
    match block {
        Block::Text(text) => json!({"type": "text", "text": text}),
        Block::ToolUse { id, name, input } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
    }
}

/// One server-sent event.
fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// `s` in pieces of at most `n` characters (at least one piece).
pub(crate) fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// The events of a streamed answer, as the real API sends them.
fn sse_chunks(
    id: &str,
    model: &str,
    blocks: &[Block],
    stop_reason: &str,
    usage: &Usage,
) -> Vec<String> {
    let mut out = vec![event(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage_json(usage, 1),
            }
        }),
    )];
    for (index, block) in blocks.iter().enumerate() {
        match block {
            Block::Text(text) => {
                out.push(event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": index,
                            "content_block": {"type": "text", "text": ""}}),
                ));
                if index == 0 {
                    out.push(event("ping", &json!({"type": "ping"})));
                }
                for piece in pieces(text, 40) {
                    out.push(event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "text_delta", "text": piece}}),
                    ));
                }
            }
            Block::ToolUse { id, name, input } => {
                out.push(event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": index,
                            "content_block": {"type": "tool_use", "id": id, "name": name,
                                              "input": {}}}),
                ));
                for piece in pieces(&input.to_string(), 64) {
                    out.push(event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": piece}}),
                    ));
                }
            }
        }
        out.push(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    out.push(event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {
                "input_tokens": usage.input_tokens,
                "cache_creation_input_tokens": usage.cache_write_tokens,
                "cache_read_input_tokens": usage.cache_read_tokens,
                "output_tokens": usage.output_tokens,
            },
        }),
    ));
    out.push(event("message_stop", &json!({"type": "message_stop"})));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_from_the_system_prompt() {
        assert_eq!(
            find_cwd(
                "Here is useful information:\n<env>\nWorking directory: /srv/repo\nIs a git repo: true"
            ),
            Some("/srv/repo".to_owned())
        );
        assert_eq!(
            find_cwd(" - Primary working directory: /a b/c"),
            Some("/a b/c".to_owned())
        );
        assert_eq!(find_cwd("no directory here"), None);
    }

    #[test]
    fn pieces_split_on_characters() {
        assert_eq!(pieces("héllo", 2), vec!["hé", "ll", "o"]);
        assert_eq!(pieces("", 3), vec![""]);
    }
}
