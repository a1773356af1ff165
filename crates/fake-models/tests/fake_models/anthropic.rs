//! The fake's Anthropic Messages API over real HTTP, with a plain client.

use std::time::{Duration, Instant};

use super::common::{
    anthropic_text, assemble_anthropic, dedup_names, item_of_type, sse_events, tag_in,
    two_main_calls,
};
use agentry_fake_models::{
    ANTHROPIC_MAIN_USAGE, ANTHROPIC_SIDE_USAGE, CallKind, DEFAULT_KEY, FakeModels, Provider,
    Transport, Usage,
};
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A request body like Claude Code's: a system prompt stating the working directory, the
/// `Bash` and `Write` tools, and `messages`.
fn body(messages: Value, stream: bool) -> Value {
    json!({
        "model": "claude-sonnet-5",
        "max_tokens": 32000,
        "stream": stream,
        "system": [
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "# Environment\n - Primary working directory: /srv/repo\n - Is a git repository: true"}
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
            {"name": "Write", "description": "Write a file", "input_schema": {"type": "object"}}
        ],
        "messages": messages,
    })
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nSkills: run `git diff --stat` to see.\n</system-reminder>"},
        {"type": "text", "text": text}
    ]})
}

fn post(fake: &FakeModels, body: &Value) -> Response {
    client()
        .post(format!("{}/v1/messages?beta=true", fake.base_url()))
        .header("x-api-key", DEFAULT_KEY)
        .header("anthropic-version", "2023-06-01")
        .header("x-claude-code-session-id", "session-1")
        .json(body)
        .send()
        .unwrap()
}

/// Posts a streaming request and assembles the answer.
fn stream(fake: &FakeModels, body: &Value) -> (Vec<(String, Value)>, Value) {
    let events = sse_events(post(fake, body));
    let message = assemble_anthropic(&events);
    (events, message)
}

/// The answer's `tool_use` block.
fn tool_use(message: &Value) -> Value {
    item_of_type(message, "content", "tool_use")
}

/// The history after `first`'s answer and a tool result `result`.
fn after_tool(first: &[Value], answer: &Value, result: &str) -> Vec<Value> {
    let tool = tool_use(answer);
    let mut messages = first.to_vec();
    messages.push(json!({"role": "assistant", "content": answer["content"]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool["id"], "content": [{"type": "text", "text": result}]}
    ]}));
    messages
}

#[test]
fn connectivity_check_answers_200() {
    let fake = FakeModels::start();
    assert!(fake.base_url().starts_with("http://127.0.0.1:"));
    assert_eq!(fake.openai_base_url(), format!("{}/v1", fake.base_url()));
    let head = client().head(fake.base_url()).send().unwrap();
    assert_eq!(head.status(), 200);
    let get = client()
        .get(format!("{}/", fake.base_url()))
        .send()
        .unwrap();
    assert_eq!(get.status(), 200);
    let calls = fake.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.kind == CallKind::Other && c.status == 200)
    );
    assert_eq!(calls[0].method, "HEAD");
}

#[test]
fn a_coding_conversation_streams_a_write_then_the_final_text() {
    let fake = FakeModels::start();
    let first = vec![user("Please add the notes.")];
    let (events, answer) = stream(&fake, &body(json!(first), true));
    assert_eq!(
        dedup_names(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(answer["model"], "claude-sonnet-5");
    assert!(answer["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 1000, "cache_creation_input_tokens": 2000,
               "cache_read_input_tokens": 3000, "output_tokens": 50,
               "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0},
               "service_tier": "standard"})
    );
    let intro = anthropic_text(&answer);
    let tag = tag_in(&intro);
    let tool = tool_use(&answer);
    assert_eq!(tool["name"], "Write");
    assert!(tool["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tool["input"]["file_path"], "/srv/repo/AGENT_NOTES.md");
    assert_eq!(
        tool["input"]["content"],
        format!("notes written by a real agent CLI (fake-models run {tag})\n")
    );

    let (_, answer2) = stream(
        &fake,
        &body(json!(after_tool(&first, &answer, "File created")), true),
    );
    assert_eq!(answer2["stop_reason"], "end_turn");
    assert_eq!(
        anthropic_text(&answer2),
        format!("Done: added a line to AGENT_NOTES.md. (fake-models run {tag})")
    );

    let calls = two_main_calls(
        &fake,
        Provider::Anthropic,
        Transport::Sse,
        ANTHROPIC_MAIN_USAGE,
        &tag,
    );
    for call in &calls {
        assert_eq!(call.path, "/v1/messages");
        assert_eq!(call.query, "beta=true");
        assert_eq!(call.model.as_deref(), Some("claude-sonnet-5"));
        assert_eq!(call.status, 200);
        assert!(call.key_ok);
        assert!(call.answered_at.is_some());
        assert_eq!(call.header("x-claude-code-session-id"), Some("session-1"));
    }
    assert_eq!(fake.run_tags(), vec![tag.clone()]);
    assert_eq!(fake.calls_of_run(&tag).len(), 2);
    assert_eq!(
        fake.usage_where(Provider::Anthropic, |_| true),
        Usage::sum([&ANTHROPIC_MAIN_USAGE, &ANTHROPIC_MAIN_USAGE])
    );
}

#[test]
fn without_a_stated_directory_notes_are_appended_with_bash() {
    let fake = FakeModels::start();
    let mut b = body(json!([user("Add notes")]), false);
    b["system"] = json!("You are Claude Code.");
    let answer: Value = post(&fake, &b).json().unwrap();
    let tool = tool_use(&answer);
    assert_eq!(tool["name"], "Bash");
    let tag = tag_in(&anthropic_text(&answer));
    assert_eq!(
        tool["input"]["command"],
        format!(
            "printf '%s\\n' 'notes written by a real agent CLI (fake-models run {tag})' >> AGENT_NOTES.md"
        )
    );
}

#[test]
fn a_plain_json_answer_when_not_streaming() {
    let fake = FakeModels::start();
    let response = post(&fake, &body(json!([user("Add notes")]), false));
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("request-id"));
    let answer: Value = response.json().unwrap();
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(answer["usage"]["output_tokens"], 50);
    assert_eq!(tool_use(&answer)["name"], "Write");
    assert_eq!(fake.calls()[0].transport, Transport::Json);
}

#[test]
fn a_review_runs_the_named_diff_and_quotes_its_output() {
    let fake = FakeModels::start();
    let first = vec![user(
        "Review the branch: run `git diff origin/main...HEAD` and say what you think.",
    )];
    let (_, answer) = stream(&fake, &body(json!(first), true));
    let tool = tool_use(&answer);
    assert_eq!(tool["name"], "Bash");
    assert_eq!(tool["input"]["command"], "git diff origin/main...HEAD");
    let tag = tag_in(&anthropic_text(&answer));
    let diff = format!("diff --git a/x b/x\n+{}", "y".repeat(5000));
    let (_, answer2) = stream(
        &fake,
        &body(json!(after_tool(&first, &answer, &diff)), true),
    );
    let text = anthropic_text(&answer2);
    let head = format!("fake-models review (fake-models run {tag}). What the command gave:\n");
    assert!(text.starts_with(&head), "{text}");
    assert_eq!(text[head.len()..], diff[..4000]);
}

#[test]
fn a_title_request_is_a_side_call_answered_in_its_schema() {
    let fake = FakeModels::start();
    let b = json!({
        "model": "claude-sonnet-5",
        "max_tokens": 64000,
        "stream": true,
        "system": [{"type": "text", "text": "Generate a concise, sentence-case title."}],
        "tools": [],
        "output_config": {"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"title": {"type": "string"}},
            "required": ["title"], "additionalProperties": false}}},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<session>\nAdd notes\n</session>"}]}],
    });
    let (_, answer) = stream(&fake, &b);
    let title: Value = serde_json::from_str(&anthropic_text(&answer)).unwrap();
    assert_eq!(title, json!({"title": "fake-models title"}));
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["usage"]["input_tokens"], 200);
    let side = fake.side_calls();
    assert_eq!(side.len(), 1);
    assert!(side[0].is_side());
    assert_eq!(side[0].usage, Some(ANTHROPIC_SIDE_USAGE));
    assert!(fake.main_calls().is_empty());
    // The main call of the same session gets the side call's run tag.
    let (_, main) = stream(&fake, &body(json!([user("Add notes")]), true));
    assert_eq!(Some(tag_in(&anthropic_text(&main))), side[0].run_tag);
}

#[test]
fn the_key_is_checked() {
    let fake = FakeModels::start_with_key("sk-right");
    assert_eq!(fake.key(), "sk-right");
    let b = body(json!([user("Add notes")]), false);
    let url = format!("{}/v1/messages", fake.base_url());
    // A message with the key sent as `x-api-key` (or none), or as a bearer token.
    let send = |key: Option<&str>, bearer: bool| {
        let request = client().post(&url).json(&b);
        let request = match (key, bearer) {
            (Some(key), false) => request.header("x-api-key", key),
            (Some(key), true) => request.bearer_auth(key),
            (None, _) => request,
        };
        request.send().unwrap()
    };
    let missing = send(None, false);
    assert_eq!(missing.status(), 401);
    let error: Value = missing.json().unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "authentication_error");
    assert_eq!(send(Some("sk-wrong"), false).status(), 401);
    assert_eq!(send(Some("sk-right"), true).status(), 200);
    assert_eq!(send(Some("sk-right"), false).status(), 200);
    let oks: Vec<bool> = fake.calls().iter().map(|c| c.key_ok).collect();
    assert_eq!(oks, [false, false, true, true]);
    fake.set_key("sk-new");
    assert_eq!(send(Some("sk-right"), false).status(), 401);
}

#[test]
fn directives_set_errors_usage_and_the_number_of_calls() {
    let fake = FakeModels::start();
    let refused = post(
        &fake,
        &body(json!([user("Do it [model:api-error=503]")]), true),
    );
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["x-should-retry"], "false");
    let error: Value = refused.json().unwrap();
    assert_eq!(error["error"]["type"], "api_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fake-models refuses this request (API-ERROR)")
    );
    let refused_call = fake.calls().pop().unwrap();
    assert_eq!(refused_call.status, 503);
    assert_eq!(refused_call.usage, None);

    let first = vec![user("Do it [model:usage=11,22,33,44] [model:calls=3]")];
    let mut messages = first.clone();
    let mut tag = String::new();
    for n in 1..=3 {
        let (_, answer) = stream(&fake, &body(json!(messages), true));
        assert_eq!(
            answer["usage"]["input_tokens"], 11,
            "call {n}: {}",
            answer["usage"]
        );
        assert_eq!(answer["usage"]["output_tokens"], 22);
        assert_eq!(answer["usage"]["cache_read_input_tokens"], 33);
        assert_eq!(answer["usage"]["cache_creation_input_tokens"], 44);
        let content = tool_use(&answer)["input"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        tag = tag_in(&anthropic_text(&answer));
        assert_eq!(content.lines().count(), n, "{content}");
        if n > 1 {
            assert!(content.contains(&format!(
                "note {n} of 3 written by a real agent CLI (fake-models run {tag})"
            )));
        }
        messages = after_tool(&messages, &answer, "ok");
    }
    let (_, last) = stream(&fake, &body(json!(messages), true));
    assert_eq!(
        anthropic_text(&last),
        format!("Done: added 3 lines to AGENT_NOTES.md. (fake-models run {tag})")
    );
    let usage = fake.usage_where(Provider::Anthropic, |c| c.kind == CallKind::Main);
    assert_eq!(usage.input_tokens, 44);
    assert_eq!(usage.cache_write_tokens, 176);
}

#[test]
fn slow_delays_the_second_and_later_main_calls() {
    let fake = FakeModels::start();
    let first = vec![user("Do it [model:slow=0.4]")];
    let started = Instant::now();
    let (_, answer) = stream(&fake, &body(json!(first), true));
    assert!(started.elapsed() < Duration::from_millis(400));
    let started = Instant::now();
    let (_, _) = stream(&fake, &body(json!(after_tool(&first, &answer, "ok")), true));
    assert!(started.elapsed() >= Duration::from_millis(400));
    let calls = fake.main_calls();
    let waited = calls[1]
        .answered_at
        .unwrap()
        .duration_since(calls[1].received_at)
        .unwrap();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
}

#[test]
fn slow_calls_are_recorded_before_they_are_answered() {
    let fake = FakeModels::start();
    let first = vec![user("Do it [model:slow=2]")];
    let (_, answer) = stream(&fake, &body(json!(first), true));
    let second = body(json!(after_tool(&first, &answer, "ok")), true);
    let url = fake.base_url();
    let thread = std::thread::spawn(move || {
        client()
            .post(format!("{url}/v1/messages"))
            .header("x-api-key", DEFAULT_KEY)
            .json(&second)
            .send()
            .unwrap()
            .status()
    });
    assert!(fake.wait_for(Duration::from_secs(5), |calls| {
        calls
            .iter()
            .any(|c| c.step == Some(1) && c.answered_at.is_none())
    }));
    assert!(fake.wait_for(Duration::from_secs(10), |calls| {
        calls
            .iter()
            .any(|c| c.step == Some(1) && c.answered_at.is_some())
    }));
    assert_eq!(thread.join().unwrap(), 200);
}

#[test]
fn fail_next_answers_main_calls_with_errors_then_recovers() {
    let fake = FakeModels::start();
    fake.fail_next(2, 529);
    let b = body(json!([user("Add notes")]), true);
    for _ in 0..2 {
        let response = post(&fake, &b);
        assert_eq!(response.status(), 529);
        assert!(!response.headers().contains_key("x-should-retry"));
        let error: Value = response.json().unwrap();
        assert_eq!(error["error"]["type"], "overloaded_error");
    }
    assert_eq!(post(&fake, &b).status(), 200);
    let statuses: Vec<u16> = fake.main_calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [529, 529, 200]);
    fake.fail_next(1, 200);
    fake.clear_faults();
    assert_eq!(post(&fake, &b).status(), 200);
}

#[test]
fn malformed_requests_get_400_and_unknown_paths_404() {
    let fake = FakeModels::start();
    let url = format!("{}/v1/messages", fake.base_url());
    let send = |body: &str| {
        client()
            .post(&url)
            .header("x-api-key", DEFAULT_KEY)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .unwrap()
    };
    for bad in [
        "not json",
        "[1, 2]",
        r#"{"model": "m"}"#,
        r#"{"messages": []}"#,
        r#"{"model": 3, "messages": [{"role": 5}]}"#,
        "",
    ] {
        let response = send(bad);
        assert_eq!(response.status(), 400, "{bad}");
        let error: Value = response.json().unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{bad}");
    }
    // Odd but well-formed shapes still get an answer.
    for odd in [
        r#"{"model": "m", "messages": []}"#,
        r#"{"model": "m", "messages": [{"role": "user", "content": 7}], "tools": [{"name": "Bash"}]}"#,
        r#"{"model": "m", "messages": [{"role": "assistant"}, "x", null], "system": 3, "tools": "x"}"#,
    ] {
        assert_eq!(send(odd).status(), 200, "{odd}");
    }
    let unknown = client()
        .get(format!("{}/v1/nothing", fake.base_url()))
        .header("anthropic-version", "2023-06-01")
        .send()
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let error: Value = unknown.json().unwrap();
    assert_eq!(error["error"]["type"], "not_found_error");
}

#[test]
fn count_tokens_and_models() {
    let fake = FakeModels::start();
    let counted: Value = client()
        .post(format!("{}/v1/messages/count_tokens", fake.base_url()))
        .header("x-api-key", DEFAULT_KEY)
        .json(&body(json!([user("hello")]), false))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(counted["input_tokens"].as_u64().unwrap() > 0);
    let models: Value = client()
        .get(format!("{}/v1/models", fake.base_url()))
        .header("x-api-key", DEFAULT_KEY)
        .header("anthropic-version", "2023-06-01")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["type"], "model");
    let kinds: Vec<CallKind> = fake.calls().iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [CallKind::CountTokens, CallKind::Other]);
}

/// `[model:gather=3]`: the first three calls wait until all three have arrived, so none is
/// answered before the last is sent; a fourth goes through at once.
#[test]
fn gathered_calls_are_answered_together_once_all_have_arrived() {
    let fake = FakeModels::start();
    let request = body(json!([user("Go [model:gather=3]")]), false);
    let (answered_tx, answered) = std::sync::mpsc::channel();
    let early: Vec<_> = (0..2)
        .map(|_| {
            let (url, request, answered_tx) =
                (fake.base_url(), request.clone(), answered_tx.clone());
            std::thread::spawn(move || {
                let status = client()
                    .post(format!("{url}/v1/messages"))
                    .header("x-api-key", DEFAULT_KEY)
                    .header("anthropic-version", "2023-06-01")
                    .json(&request)
                    .send()
                    .unwrap()
                    .status();
                answered_tx.send(Instant::now()).unwrap();
                status
            })
        })
        .collect();
    assert!(fake.wait_for(Duration::from_secs(10), |calls| calls.len() == 2));
    // Two are in flight and stay there while the third is not sent.
    assert!(answered.recv_timeout(Duration::from_millis(300)).is_err());
    let third_sent = Instant::now();
    assert_eq!(post(&fake, &request).status(), 200);
    for handle in early {
        assert_eq!(handle.join().unwrap(), 200);
    }
    for _ in 0..2 {
        assert!(answered.recv().unwrap() >= third_sent);
    }
    let started = Instant::now();
    assert_eq!(post(&fake, &request).status(), 200);
    assert!(started.elapsed() < Duration::from_secs(5));
}
