//! The OpenAI Responses API as Codex uses it: `POST /v1/responses` (server-sent events, or
//! one JSON answer), the WebSocket transport on `GET /v1/responses`, and `GET /v1/models`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use actix_web::{HttpRequest, HttpResponse, web};
use actix_ws::AggregatedMessage;
use serde_json::{Value, json};

use crate::anthropic::{API_ERROR_MESSAGE, FAULT_MESSAGE, pieces};
use crate::script::{self, Directives, Mode, NOTES_FILE, Step, ToolAction};
use crate::state::{Conversation, State, unix_now};
use crate::{
    Body, Call, CallKind, Incoming, MAX_BODY_BYTES, OPENAI_MAIN_USAGE, OPENAI_SIDE_USAGE, Provider,
    Reply, Shared, Transport, Usage, parse_body, parse_object,
};

/// Whether a request asks to become a WebSocket.
pub(crate) fn is_websocket_upgrade(incoming: &Incoming) -> bool {
    incoming.method == "GET"
        && incoming
            .header("upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Whether the request carries `Authorization: Bearer KEY`.
fn authorized(incoming: &Incoming, key: &str) -> bool {
    incoming.bearer().map(str::trim) == Some(key)
}

/// The `error.type` OpenAI gives a status.
fn error_type(status: u16) -> &'static str {
    match status {
        429 => "requests",
        _ if status >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// The inner `error` object of OpenAI's error JSON.
fn error_object(status: u16, message: &str, code: Option<&str>) -> Value {
    json!({"message": message, "type": error_type(status), "param": null, "code": code})
}

/// OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`.
pub(crate) fn error_body(status: u16, message: &str, code: Option<&str>) -> Value {
    json!({ "error": error_object(status, message, code) })
}

/// The 401 message, with the key shown the way OpenAI redacts it.
fn bad_key_message(incoming: &Incoming) -> String {
    let given = incoming.bearer().unwrap_or_default();
    if given.is_empty() {
        "You didn't provide an API key. You need to provide your API key in an Authorization \
         header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            .to_owned()
    } else {
        let shown: String = given.chars().take(3).collect();
        format!("Incorrect API key provided: {shown}***. (fake-models)")
    }
}

/// `GET /v1/models`.
pub(crate) fn models(incoming: &Incoming, state: &Shared) -> Reply {
    let mut s = state.lock();
    let mut call = incoming.call(Provider::OpenAi, Transport::Json, CallKind::Other);
    call.key_ok = authorized(incoming, &s.key);
    call.answered_at = Some(SystemTime::now());
    if !call.key_ok {
        call.status = 401;
        s.record(call);
        return Reply::json(
            401,
            error_body(401, &bad_key_message(incoming), Some("invalid_api_key")),
        );
    }
    s.record(call);
    let data: Vec<Value> = ["gpt-5.5", "gpt-5", "gpt-5-codex", "gpt-5-mini"]
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 1_754_000_000, "owned_by": "openai"}))
        .collect();
    Reply::json(200, json!({"object": "list", "data": data}))
}

/// An output item of an answer.
#[derive(Debug, Clone)]
enum Item {
    Message {
        id: String,
        text: String,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A call of a custom (freeform) tool: code mode's `exec` with JavaScript as `input`.
    CustomToolCall {
        id: String,
        call_id: String,
        name: String,
        input: String,
    },
}

impl Item {
    /// The item as `response.output_item.done` and `response.output` write it.
    fn done_json(&self) -> Value {
        match self {
            Item::Message { id, text } => json!({
                "id": id, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            }),
            Item::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id, "type": "function_call", "status": "completed",
                "arguments": arguments, "call_id": call_id, "name": name,
            }),
            Item::CustomToolCall {
                id,
                call_id,
                name,
                input,
            } => custom_call_json(id, call_id, name, input, "completed"),
        }
    }
}

/// A `custom_tool_call` item (code mode's `exec`; `input` is the tool's freeform text).
fn custom_call_json(id: &str, call_id: &str, name: &str, input: &str, status: &str) -> Value {
    json!({
        "id": id, "type": "custom_tool_call", "status": status, "call_id": call_id,
        "name": name, "input": input,
    })
}

/// How a request ends: the events of an answer, or an error.
#[derive(Debug)]
enum Outcome {
    Answer {
        /// Every event, `response.created` to `response.completed`.
        events: Vec<Value>,
        /// The final response object (what a non-streaming request gets).
        response: Value,
        delay: Option<Duration>,
        seq: u64,
    },
    Error {
        status: u16,
        /// The inner `error` object.
        error: Value,
        seq: u64,
    },
}

/// Records `call` as answered with an error.
fn error_outcome(
    s: &mut State,
    mut call: Call,
    status: u16,
    message: &str,
    code: Option<&str>,
) -> Outcome {
    call.status = status;
    call.usage = None;
    call.answered_at = Some(SystemTime::now());
    let seq = s.record(call);
    Outcome::Error {
        status,
        error: error_object(status, message, code),
        seq,
    }
}

/// The text of a message item's content (a string, or its text parts).
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Whether a user text is context Codex adds rather than the user's prompt
/// (`<environment_context>`, `<user_instructions>`, `# AGENTS.md instructions …`).
fn is_context(text: &str) -> bool {
    let t = text.trim_start();
    (t.starts_with('<') && t.trim_end().ends_with('>')) || t.starts_with("# AGENTS.md")
}

/// The prompt of a full input: the user messages' texts that are not context.
fn prompt_of(input: &[Value]) -> String {
    input
        .iter()
        .filter(|i| {
            i.get("role").and_then(Value::as_str) == Some("user")
                && i.get("type")
                    .and_then(Value::as_str)
                    .is_none_or(|t| t == "message")
        })
        .map(|i| content_text(i.get("content").unwrap_or(&Value::Null)))
        .filter(|t| !is_context(t))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

/// A tool result's text (`output` is a string or a list of content items).
fn output_text(item: &Value) -> String {
    content_text(item.get("output").unwrap_or(&Value::Null))
}

/// The namespace Codex's code mode offers its own tools in (`exec`, `wait`, …): the one a
/// tool without a namespace is in.
const DEFAULT_NAMESPACE: &str = "functions";

/// The tools a request offers, flattened: its top-level `tools` and the `tools` of its
/// `additional_tools` input items (Codex's code mode), in order. A tool inside a
/// `{"type": "namespace", "name", "tools"}` gets the namespace's name as `namespace`.
fn offered_tools(body: &Value, input: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    flatten_tools(body.get("tools"), None, &mut out);
    for item in input {
        if item.get("type").and_then(Value::as_str) == Some("additional_tools") {
            flatten_tools(item.get("tools"), None, &mut out);
        }
    }
    out
}

/// Appends the tools of `tools` (a JSON array, else nothing) to `out`, namespaces opened.
fn flatten_tools(tools: Option<&Value>, namespace: Option<&str>, out: &mut Vec<Value>) {
    for tool in tools.and_then(Value::as_array).into_iter().flatten() {
        if !tool.is_object() {
            continue;
        }
        if tool.get("type").and_then(Value::as_str) == Some("namespace") {
            if namespace.is_none() {
                let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                flatten_tools(tool.get("tools"), Some(name), out);
            }
            continue;
        }
        let mut tool = tool.clone();
        if let (Some(ns), Some(obj)) = (namespace, tool.as_object_mut()) {
            obj.insert("namespace".into(), json!(ns));
        }
        out.push(tool);
    }
}

/// `known` with `offered` added: an offered tool replaces a known one of the same name,
/// type and namespace.
fn merge_tools(known: &mut Vec<Value>, offered: Vec<Value>) {
    let mut index: HashMap<(String, String, String), usize> = known
        .iter()
        .enumerate()
        .map(|(i, t)| (owned_key(t), i))
        .collect();
    for tool in offered {
        let key = owned_key(&tool);
        match index.get(&key).and_then(|&i| known.get_mut(i)) {
            Some(old) => *old = tool,
            None => {
                index.insert(key, known.len());
                known.push(tool);
            }
        }
    }
}

/// [`tool_key`], owned.
fn owned_key(tool: &Value) -> (String, String, String) {
    let (namespace, name, kind) = tool_key(tool);
    (namespace.to_owned(), name.to_owned(), kind.to_owned())
}

/// A tool's (namespace, name, type), the namespace [`DEFAULT_NAMESPACE`] when it has none.
fn tool_key(tool: &Value) -> (&str, &str, &str) {
    let field = |k: &str| tool.get(k).and_then(Value::as_str);
    (
        field("namespace").unwrap_or(DEFAULT_NAMESPACE),
        field("name").unwrap_or_default(),
        field("type").unwrap_or_default(),
    )
}

/// The tool of `tools` with this type and name, in the default namespace.
fn find_tool<'a>(tools: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    tools
        .iter()
        .find(|t| tool_key(t) == (DEFAULT_NAMESPACE, name, kind))
}

/// A shell tool call for `command` in the terms of the tools offered: `exec_command`
/// (`{"cmd"}`), `shell_command` (`{"command": "…"}`) or `shell` (`{"command": ["bash",
/// "-lc", "…"]}`), judged by each tool's parameters.
fn shell_call(tools: &[Value], command: &str) -> Option<(String, String)> {
    const NAMES: [&str; 4] = ["exec_command", "shell_command", "shell", "container.exec"];
    NAMES.iter().find_map(|name| {
        let tool = find_tool(tools, "function", name)?;
        let props = tool.get("parameters").and_then(|p| p.get("properties"));
        let has = |p: &str| props.and_then(|x| x.get(p));
        let arguments = if has("cmd").is_some() {
            json!({ "cmd": command })
        } else if let Some(spec) = has("command") {
            if spec.get("type").and_then(Value::as_str) == Some("array") {
                json!({ "command": ["bash", "-lc", command] })
            } else {
                json!({ "command": command })
            }
        } else {
            return None;
        };
        Some(((*name).to_owned(), arguments.to_string()))
    })
}

/// A call of code mode's custom tool `exec` that runs `command`: the tool's `input` is
/// JavaScript that calls the nested shell tool on the global `tools` object
/// (`tools.exec_command({cmd})`, or `tools.shell_command({command})` when the tool's
/// description declares only that one) and hands its `output` to `text(…)`. `None` when no
/// custom `exec` is offered. Returns the tool's name and the JavaScript.
fn code_mode_call(tools: &[Value], command: &str) -> Option<(String, String)> {
    let tool = find_tool(tools, "custom", "exec")?;
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let declares = |name: &str| description.contains(&format!("{name}(args"));
    let literal = Value::String(command.to_owned()).to_string();
    let call = if !declares("exec_command") && declares("shell_command") {
        format!("tools.shell_command({{command: {literal}}})")
    } else {
        format!("tools.exec_command({{cmd: {literal}}})")
    };
    let source = format!(
        "const r = await {call};\n\
         text(typeof r === \"string\" ? r : (r.output ?? JSON.stringify(r)));\n"
    );
    Some(("exec".to_owned(), source))
}

/// The output items of a main call's answer.
fn main_items(s: &mut State, tools: &[Value], step: Step) -> Vec<Item> {
    let message = |s: &mut State, text: String| Item::Message {
        id: s.new_id("msg_", 32),
        text,
    };
    match step {
        Step::Final(text) => vec![message(s, text)],
        Step::Tool { intro, action } => {
            let command = match &action {
                ToolAction::Notes { lines } => format!(
                    "printf '%s\\n' {} >> {NOTES_FILE}",
                    script::shell_quote(lines.last().map(String::as_str).unwrap_or_default())
                ),
                ToolAction::Run { command } => command.clone(),
            };
            if let Some((name, arguments)) = shell_call(tools, &command) {
                vec![
                    message(s, intro),
                    Item::FunctionCall {
                        id: s.new_id("fc_", 32),
                        call_id: s.new_id("call_", 24),
                        name,
                        arguments,
                    },
                ]
            } else if let Some((name, input)) = code_mode_call(tools, &command) {
                vec![
                    message(s, intro),
                    Item::CustomToolCall {
                        id: s.new_id("ctc_", 32),
                        call_id: s.new_id("call_", 24),
                        name,
                        input,
                    },
                ]
            } else {
                vec![message(
                    s,
                    format!("fake-models: no shell tool is offered to run `{command}`"),
                )]
            }
        }
    }
}

/// OpenAI's `usage` object.
fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {
            "cached_tokens": u.cache_read_tokens,
            "cache_write_tokens": u.cache_write_tokens,
        },
        "output_tokens": u.output_tokens,
        "output_tokens_details": { "reasoning_tokens": u.reasoning_tokens },
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
    })
}

/// A response object.
fn response_json(
    id: &str,
    model: &str,
    status: &str,
    previous: Option<&str>,
    output: Vec<Value>,
    usage: Option<&Usage>,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": unix_now(),
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": previous,
        "reasoning": {"effort": null, "summary": null},
        "service_tier": "default",
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage.map(usage_json),
        "user": null,
        "metadata": {},
    })
}

/// The events of an answer, as the real API streams them.
fn events_of(
    id: &str,
    model: &str,
    previous: Option<&str>,
    items: &[Item],
    usage: &Usage,
) -> (Vec<Value>, Value) {
    let mut events = Vec::new();
    let mut push = |mut event: Value| {
        let n = events.len();
        if let Some(obj) = event.as_object_mut() {
            obj.insert("sequence_number".into(), json!(n));
        }
        events.push(event);
    };
    let pending = response_json(id, model, "in_progress", previous, Vec::new(), None);
    push(json!({"type": "response.created", "response": pending}));
    push(json!({"type": "response.in_progress", "response": pending}));
    for (index, item) in items.iter().enumerate() {
        match item {
            Item::Message { id: item_id, text } => {
                push(
                    json!({"type": "response.output_item.added", "output_index": index,
                    "item": {"id": item_id, "type": "message", "status": "in_progress",
                             "role": "assistant", "content": []}}),
                );
                push(
                    json!({"type": "response.content_part.added", "item_id": item_id,
                    "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}),
                );
                for piece in pieces(text, 40) {
                    push(
                        json!({"type": "response.output_text.delta", "item_id": item_id,
                        "output_index": index, "content_index": 0, "delta": piece,
                        "logprobs": []}),
                    );
                }
                push(
                    json!({"type": "response.output_text.done", "item_id": item_id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                push(
                    json!({"type": "response.content_part.done", "item_id": item_id,
                    "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": text}}),
                );
            }
            Item::FunctionCall {
                id: item_id,
                call_id,
                name,
                arguments,
            } => {
                push(
                    json!({"type": "response.output_item.added", "output_index": index,
                    "item": {"id": item_id, "type": "function_call", "status": "in_progress",
                             "arguments": "", "call_id": call_id, "name": name}}),
                );
                for piece in pieces(arguments, 64) {
                    push(json!({"type": "response.function_call_arguments.delta",
                        "item_id": item_id, "output_index": index, "delta": piece}));
                }
                push(
                    json!({"type": "response.function_call_arguments.done", "item_id": item_id,
                    "output_index": index, "name": name, "arguments": arguments}),
                );
            }
            Item::CustomToolCall {
                id: item_id,
                call_id,
                name,
                input,
            } => {
                push(
                    json!({"type": "response.output_item.added", "output_index": index,
                    "item": custom_call_json(item_id, call_id, name, "", "in_progress")}),
                );
                for piece in pieces(input, 64) {
                    push(json!({"type": "response.custom_tool_call_input.delta",
                        "item_id": item_id, "output_index": index, "delta": piece}));
                }
                push(json!({"type": "response.custom_tool_call_input.done",
                    "item_id": item_id, "output_index": index, "input": input}));
            }
        }
        push(
            json!({"type": "response.output_item.done", "output_index": index,
                    "item": item.done_json()}),
        );
    }
    let done = response_json(
        id,
        model,
        "completed",
        previous,
        items.iter().map(Item::done_json).collect(),
        Some(usage),
    );
    push(json!({"type": "response.completed", "response": done}));
    (events, done)
}

/// The request's `input` as a list of items (a string is one user message); `None` when it
/// is neither a string nor an array.
fn input_of(v: &Value) -> Option<Vec<Value>> {
    match v.get("input") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(text)) => Some(vec![
            json!({"type": "message", "role": "user", "content": text}),
        ]),
        Some(Value::Array(items)) => Some(items.clone()),
        Some(_) => None,
    }
}

/// What the input's items tell about the conversation: the tool results it returns (counted,
/// the last one kept) and the run tag an earlier assistant message carries.
fn read_input(conversation: &mut Conversation, input: &[Value]) {
    for item in input {
        match item.get("type").and_then(Value::as_str) {
            Some("function_call_output" | "custom_tool_call_output") => {
                conversation.tool_results += 1;
                conversation.last_result = Some(output_text(item));
            }
            Some("message") | None
                if conversation.tag.is_empty()
                    && item.get("role").and_then(Value::as_str) == Some("assistant") =>
            {
                if let Some(tag) =
                    script::find_tag(&content_text(item.get("content").unwrap_or(&Value::Null)))
                {
                    conversation.tag = tag;
                }
            }
            _ => {}
        }
    }
}

/// The answer to a call of this kind, with its usage: nothing to a prewarm, the script's next
/// step to a main call, a text (or a schema's example) to a side call.
fn answer_of(
    s: &mut State,
    kind: CallKind,
    v: &Value,
    directives: &Directives,
    conversation: &Conversation,
) -> (Usage, Vec<Item>) {
    match kind {
        CallKind::Prewarm => (Usage::default(), Vec::new()),
        CallKind::Main => {
            let usage = directives
                .main_usage(OPENAI_MAIN_USAGE)
                .capped(v.get("max_output_tokens").and_then(Value::as_u64));
            let mode = Mode::of(&conversation.prompt, directives);
            let step = script::step(
                &mode,
                &conversation.tag,
                conversation.tool_results,
                conversation.last_result.as_deref(),
            );
            (usage, main_items(s, &conversation.tools, step))
        }
        _ => {
            let text = match v
                .get("text")
                .and_then(|t| t.get("format"))
                .and_then(|f| f.get("schema"))
            {
                Some(schema) => script::example_of(schema, "value").to_string(),
                None => format!(
                    "fake-models side answer (fake-models run {})",
                    conversation.tag
                ),
            };
            let id = s.new_id("msg_", 32);
            (OPENAI_SIDE_USAGE, vec![Item::Message { id, text }])
        }
    }
}

/// A model request (an HTTP body, or a WebSocket `response.create` without its `type`).
fn model_call(
    s: &mut State,
    incoming: &Incoming,
    transport: Transport,
    key_ok: bool,
    parsed: Result<Value, (u16, String)>,
) -> Outcome {
    let mut call = incoming.call(Provider::OpenAi, transport, CallKind::Main);
    call.key_ok = key_ok;
    if let Ok(v) = &parsed {
        call.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
        call.body = Some(v.clone());
    }
    if !key_ok {
        return error_outcome(
            s,
            call,
            401,
            &bad_key_message(incoming),
            Some("invalid_api_key"),
        );
    }
    let v = match parsed {
        Ok(v) => v,
        Err((status, message)) => return error_outcome(s, call, status, &message, None),
    };
    let Some(model) = call.model.clone() else {
        return error_outcome(
            s,
            call,
            400,
            "Missing required parameter: 'model'.",
            Some("missing_required_parameter"),
        );
    };
    let Some(input) = input_of(&v) else {
        return error_outcome(
            s,
            call,
            400,
            "Invalid type for 'input': expected a string or an array.",
            Some("invalid_type"),
        );
    };
    let previous = v
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut conversation = match &previous {
        Some(id) => match s.responses.get(id) {
            Some(c) => c.clone(),
            None => {
                let message = format!("Previous response with id '{id}' not found.");
                return error_outcome(s, call, 400, &message, Some("previous_response_not_found"));
            }
        },
        None => Conversation {
            tag: String::new(),
            prompt: prompt_of(&input),
            tool_results: 0,
            last_result: None,
            tools: Vec::new(),
        },
    };
    if conversation.prompt.is_empty() {
        // Codex's prewarm sends only the developer instructions; the prompt comes with the
        // first call that continues it.
        conversation.prompt = prompt_of(&input);
    }
    read_input(&mut conversation, &input);
    merge_tools(&mut conversation.tools, offered_tools(&v, &input));
    let session = v
        .get("prompt_cache_key")
        .and_then(Value::as_str)
        .or_else(|| incoming.header("session_id"))
        .map(str::to_owned);
    if conversation.tag.is_empty() {
        conversation.tag = match session.as_ref().and_then(|k| s.sessions.get(k)) {
            Some(tag) => tag.clone(),
            None => s.new_tag("c"),
        };
    }
    if let Some(k) = session {
        s.sessions
            .entry(k)
            .or_insert_with(|| conversation.tag.clone());
    }
    call.run_tag = Some(conversation.tag.clone());
    call.kind = if v.get("generate").and_then(Value::as_bool) == Some(false) {
        CallKind::Prewarm
    } else if conversation.tools.is_empty() {
        CallKind::Side
    } else {
        CallKind::Main
    };
    let directives = Directives::parse(&if call.kind == CallKind::Side {
        prompt_of(&input)
    } else {
        conversation.prompt.clone()
    });
    if call.kind == CallKind::Main {
        call.step = Some(conversation.tool_results);
    }
    if let Some(code) = directives.api_error {
        return error_outcome(s, call, code, API_ERROR_MESSAGE, None);
    }
    if call.kind == CallKind::Main
        && let Some(code) = s.take_fault()
    {
        return error_outcome(s, call, code, FAULT_MESSAGE, None);
    }
    let (usage, items) = answer_of(s, call.kind, &v, &directives, &conversation);
    let delay = directives.delay(call.kind == CallKind::Main && conversation.tool_results >= 1);
    call.usage = Some(usage);
    let id = s.new_id("resp_", 32);
    call.answer_id = Some(id.clone());
    let seq = s.record(call);
    s.keep_response(&id, conversation);
    let (events, response) = events_of(&id, &model, previous.as_deref(), &items, &usage);
    Outcome::Answer {
        events,
        response,
        delay,
        seq,
    }
}

/// OpenAI's 400 message for a body that is not JSON.
fn not_json(e: &serde_json::Error) -> String {
    format!("We could not parse the JSON body of your request. (fake-models: {e})")
}

/// `POST /v1/responses`.
pub(crate) fn responses(incoming: &Incoming, body: Result<Vec<u8>, u16>, state: &Shared) -> Reply {
    let mut s = state.lock();
    let key_ok = authorized(incoming, &s.key);
    let parsed = parse_body(body, not_json);
    let streaming = parsed
        .as_ref()
        .ok()
        .and_then(|v| v.get("stream"))
        .and_then(Value::as_bool)
        == Some(true);
    let transport = if streaming {
        Transport::Sse
    } else {
        Transport::Json
    };
    let outcome = model_call(&mut s, incoming, transport, key_ok, parsed);
    drop(s);
    let request_id = format!("req_{:x}", unix_now());
    let mut reply = match outcome {
        Outcome::Error { status, error, seq } => {
            Reply::json(status, json!({ "error": error })).with_seq(seq)
        }
        Outcome::Answer {
            events,
            response,
            delay,
            seq,
        } => {
            let mut reply = if streaming {
                Reply {
                    status: 200,
                    headers: Vec::new(),
                    body: Body::Sse(
                        events
                            .iter()
                            .map(|e| {
                                let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
                                format!("event: {kind}\ndata: {e}\n\n")
                            })
                            .collect(),
                    ),
                    delay: None,
                    seq: None,
                    gather: None,
                }
            } else {
                Reply::json(200, response)
            };
            reply.delay = delay;
            reply.with_seq(seq)
        }
    };
    reply.headers.push(("x-request-id".into(), request_id));
    reply
}

/// `GET /v1/responses` with `Upgrade: websocket`: the transport Codex tries first. Each text
/// frame `{"type": "response.create", …}` is answered with the events of
/// `POST /v1/responses` as text frames, or one `{"type": "error", "status", "error"}` frame.
pub(crate) fn websocket(
    req: &HttpRequest,
    payload: web::Payload,
    incoming: Incoming,
    state: Shared,
) -> HttpResponse {
    let mut call = incoming.call(Provider::OpenAi, Transport::WebSocket, CallKind::Other);
    call.answered_at = Some(SystemTime::now());
    let (key_ok, enabled) = {
        let s = state.lock();
        (authorized(&incoming, &s.key), s.websocket)
    };
    call.key_ok = key_ok;
    if !enabled {
        call.status = 426;
        state.lock().record(call);
        return HttpResponse::build(actix_web::http::StatusCode::UPGRADE_REQUIRED)
            .content_type("application/json")
            .body(
                error_body(
                    426,
                    "fake-models: the WebSocket transport is disabled",
                    None,
                )
                .to_string(),
            );
    }
    if !key_ok {
        call.status = 401;
        state.lock().record(call);
        return HttpResponse::Unauthorized()
            .content_type("application/json")
            .body(
                error_body(401, &bad_key_message(&incoming), Some("invalid_api_key")).to_string(),
            );
    }
    match actix_ws::handle(req, payload) {
        Ok((response, session, stream)) => {
            call.status = 101;
            state.lock().record(call);
            actix_web::rt::spawn(serve_websocket(session, stream, incoming, state));
            response
        }
        Err(e) => {
            let response = e.error_response();
            call.status = response.status().as_u16();
            state.lock().record(call);
            response
        }
    }
}

/// Answers the frames of one WebSocket until it closes.
async fn serve_websocket(
    mut session: actix_ws::Session,
    stream: actix_ws::MessageStream,
    incoming: Incoming,
    state: Shared,
) {
    let mut stream = stream
        .max_frame_size(MAX_BODY_BYTES)
        .aggregate_continuations()
        .max_continuation_size(MAX_BODY_BYTES);
    while let Some(message) = stream.recv().await {
        let Ok(message) = message else { break };
        match message {
            AggregatedMessage::Text(text) => {
                let frame = Incoming {
                    received_at: SystemTime::now(),
                    ..incoming.clone()
                };
                let (frames, delay, seq) = {
                    let mut s = state.lock();
                    websocket_frame(&mut s, &frame, text.as_bytes())
                };
                if let Some(delay) = delay {
                    actix_web::rt::time::sleep(delay).await;
                }
                if let Some(seq) = seq {
                    state.lock().answered(seq);
                }
                for f in frames {
                    if session.text(f).await.is_err() {
                        return;
                    }
                }
            }
            AggregatedMessage::Binary(_) => {
                let frame = json!({"type": "error", "status": 400, "error": error_object(
                    400, "fake-models: binary frames are not supported", None)});
                if session.text(frame.to_string()).await.is_err() {
                    return;
                }
            }
            AggregatedMessage::Ping(bytes) => {
                if session.pong(&bytes).await.is_err() {
                    return;
                }
            }
            AggregatedMessage::Pong(_) => {}
            AggregatedMessage::Close(reason) => {
                let _ = session.close(reason).await;
                return;
            }
        }
    }
    let _ = session.close(None).await;
}

/// The frames that answer one client text frame, the delay before them, and the call.
fn websocket_frame(
    s: &mut State,
    incoming: &Incoming,
    bytes: &[u8],
) -> (Vec<String>, Option<Duration>, Option<u64>) {
    let parsed = parse_object(bytes, not_json).and_then(|mut v| {
        let kind = v
            .as_object_mut()
            .and_then(|o| o.remove("type"))
            .and_then(|t| t.as_str().map(str::to_owned));
        match kind.as_deref() {
            Some("response.create") => Ok(v),
            other => Err((
                400,
                format!(
                    "fake-models: unsupported WebSocket message type {}",
                    other.unwrap_or("(none)")
                ),
            )),
        }
    });
    match model_call(s, incoming, Transport::WebSocket, true, parsed) {
        Outcome::Error { status, error, seq } => (
            vec![json!({"type": "error", "status": status, "error": error}).to_string()],
            None,
            Some(seq),
        ),
        Outcome::Answer {
            events, delay, seq, ..
        } => (
            events.iter().map(Value::to_string).collect(),
            delay,
            Some(seq),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_call_follows_the_parameters() {
        let exec = json!([{"type": "function", "name": "exec_command",
            "parameters": {"properties": {"cmd": {"type": "string"}}}}]);
        assert_eq!(
            shell_call(exec.as_array().unwrap(), "ls"),
            Some(("exec_command".into(), r#"{"cmd":"ls"}"#.into()))
        );
        let shell = json!([{"type": "function", "name": "shell",
            "parameters": {"properties": {"command": {"type": "array"}}}}]);
        assert_eq!(
            shell_call(shell.as_array().unwrap(), "ls"),
            Some(("shell".into(), r#"{"command":["bash","-lc","ls"]}"#.into()))
        );
        assert_eq!(shell_call(&[], "ls"), None);
    }

    #[test]
    fn additional_tools_are_offered_with_their_namespaces() {
        let body = json!({"tools": [{"type": "function", "name": "exec_command",
            "parameters": {"properties": {"cmd": {}}}}]});
        let input = json!([
            {"type": "additional_tools", "tools": [
                {"type": "namespace", "name": "functions", "tools": [
                    {"type": "custom", "name": "exec"}, 7]},
                {"type": "namespace", "name": "clock", "tools": [
                    {"type": "namespace", "name": "nested", "tools": [{"name": "x"}]},
                    {"type": "function", "name": "sleep"}]},
                {"type": "function", "name": "plain"}]},
            {"type": "additional_tools", "tools": "not a list"},
            {"type": "message", "role": "user", "tools": [{"name": "ignored"}]}
        ]);
        let tools = offered_tools(&body, input.as_array().unwrap());
        let keys: Vec<_> = tools.iter().map(tool_key).collect();
        assert_eq!(
            keys,
            [
                ("functions", "exec_command", "function"),
                ("functions", "exec", "custom"),
                ("clock", "sleep", "function"),
                ("functions", "plain", "function")
            ]
        );
        // A later offer adds tools, replacing the ones of the same key.
        let mut known = tools.clone();
        merge_tools(
            &mut known,
            vec![
                json!({"type": "custom", "name": "exec", "namespace": "functions", "v": 2}),
                json!({"type": "function", "name": "sleep"}),
            ],
        );
        assert_eq!(known.len(), 5);
        assert_eq!(known[1]["v"], 2);
        // Only tools of the default namespace run commands.
        let clock_exec = json!([{"type": "custom", "name": "exec", "namespace": "clock"}]);
        assert_eq!(code_mode_call(clock_exec.as_array().unwrap(), "ls"), None);
    }

    #[test]
    fn code_mode_runs_the_command_through_exec() {
        let exec = json!([{"type": "custom", "name": "exec", "namespace": "functions",
            "description": "declare const tools: { exec_command(args: { cmd: string; }) }"}]);
        let (name, source) = code_mode_call(exec.as_array().unwrap(), "echo \"hi\" 'x'").unwrap();
        assert_eq!(name, "exec");
        assert_eq!(
            source,
            "const r = await tools.exec_command({cmd: \"echo \\\"hi\\\" 'x'\"});\n\
             text(typeof r === \"string\" ? r : (r.output ?? JSON.stringify(r)));\n"
        );
        let shell = json!([{"type": "custom", "name": "exec",
            "description": "declare const tools: { shell_command(args: { command: string; }) }"}]);
        let (_, source) = code_mode_call(shell.as_array().unwrap(), "ls").unwrap();
        assert!(source.starts_with(r#"const r = await tools.shell_command({command: "ls"});"#));
        // A shell function offered directly wins over exec.
        let both = json!([
            {"type": "custom", "name": "exec"},
            {"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {}}}}
        ]);
        assert_eq!(
            shell_call(both.as_array().unwrap(), "ls").map(|c| c.0),
            Some("exec_command".into())
        );
    }

    #[test]
    fn prompt_skips_context() {
        let input = json!([
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/x</cwd>\n</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it [model:calls=2]"}]}
        ]);
        assert_eq!(
            prompt_of(input.as_array().unwrap()),
            "Fix it [model:calls=2]"
        );
    }
}
