//! The fake's OpenAI Responses API over real HTTP (server-sent events, JSON) and WebSocket,
//! with plain clients.

use std::time::{Duration, Instant};

use super::common::{
    assemble_openai, item_of_type, items, openai_text, sse_events, tag_in, two_main_calls,
};
use agentry_fake_models::{
    CallKind, DEFAULT_KEY, FakeModels, OPENAI_MAIN_USAGE, OPENAI_SIDE_USAGE, Provider, Transport,
    Usage,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Codex's tools for `gpt-5.5` (abridged): `exec_command` takes a `cmd` string.
fn tools() -> Value {
    json!([
        {"type": "function", "name": "exec_command", "parameters": {"type": "object",
            "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}}}},
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"}
    ])
}

/// Codex's code mode (`gpt-6.1-sol`, abridged): no top-level `tools`; an input item
/// `additional_tools` offers namespaces, `functions` holding the custom tool `exec`
/// (JavaScript, whose nested tools include `exec_command`).
fn additional_tools() -> Value {
    json!({"type": "additional_tools", "role": "developer", "id": "at_1", "tools": [
        {"type": "namespace", "name": "functions", "description": "", "tools": [
            {"type": "custom", "name": "exec",
             "description": "Run JavaScript code to orchestrate/compose tool calls\n- All nested tools are available on the global `tools` object, for example `await tools.exec_command(...)`.\n### `exec_command`\n```ts\ndeclare const tools: { exec_command(args: {\n  cmd: string;\n}): Promise<{\n  exit_code?: number;\n  output: string;\n}>; };\n```",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: SOURCE\nSOURCE: /[\\s\\S]+/\n"}},
            {"type": "function", "name": "wait", "strict": false, "parameters": {
                "type": "object", "properties": {"cell_id": {"type": "string"}}}}
        ]},
        {"type": "namespace", "name": "clock", "description": "Time.", "tools": [
            {"type": "function", "name": "sleep", "parameters": {"type": "object",
                "properties": {"duration_ms": {"type": "number"}}}}
        ]}
    ]})
}

/// A code-mode request body: `input` (which should hold an `additional_tools` item when it
/// starts a conversation) and no top-level `tools`.
fn code_mode_body(input: &[Value], stream: bool) -> Value {
    json!({"model": "gpt-6.1-sol", "input": input, "tool_choice": "auto",
           "parallel_tool_calls": false, "store": false, "stream": stream,
           "reasoning": {"context": "all_turns", "effort": "low"},
           "prompt_cache_key": "thread-6"})
}

/// The `custom_tool_call` item of a response.
fn custom_call(response: &Value) -> Value {
    item_of_type(response, "output", "custom_tool_call")
}

/// What Codex sends back for a finished `exec`: a status text, then what `text(…)` gave.
fn custom_output(call: &Value, text: &str) -> Value {
    let mut output = vec![json!({"type": "input_text",
        "text": "Script completed\nWall time 0.1 seconds\nOutput:\n"})];
    if !text.is_empty() {
        output.push(json!({"type": "input_text", "text": text}));
    }
    json!({"type": "custom_tool_call_output", "call_id": call["call_id"], "id": "ctco_1",
           "output": output})
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The full input of a first request, as Codex sends it over HTTP.
fn first_input(prompt: &str) -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        user("<environment_context>\n  <cwd>/srv/repo</cwd>\n</environment_context>"),
        user(prompt),
    ]
}

fn body(input: &[Value], stream: bool) -> Value {
    json!({"model": "gpt-5.5", "instructions": "", "input": input, "tools": tools(),
           "tool_choice": "auto", "parallel_tool_calls": false, "store": false,
           "stream": stream, "prompt_cache_key": "thread-1"})
}

mod http {
    use super::*;
    use reqwest::blocking::{Client, Response};

    fn post(fake: &FakeModels, body: &Value) -> Response {
        Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
            .post(format!("{}/responses", fake.openai_base_url()))
            .bearer_auth(DEFAULT_KEY)
            .json(body)
            .send()
            .unwrap()
    }

    /// Posts a streaming request; the events and the final response.
    fn stream(fake: &FakeModels, body: &Value) -> (Vec<Value>, Value) {
        let events: Vec<Value> = sse_events(post(fake, body))
            .into_iter()
            .map(|(name, data)| {
                assert_eq!(data["type"].as_str(), Some(name.as_str()));
                data
            })
            .collect();
        let response = assemble_openai(&events);
        (events, response)
    }

    fn function_call(response: &Value) -> Value {
        item_of_type(response, "output", "function_call")
    }

    #[test]
    fn a_coding_conversation_streams_a_shell_call_then_the_final_text() {
        let fake = FakeModels::start();
        let input = first_input("Please add the notes.");
        let (events, response) = stream(&fake, &body(&input, true));
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let mut kinds = types.clone();
        kinds.dedup();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(response["status"], "completed");
        assert_eq!(response["model"], "gpt-5.5");
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 3000, "input_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 0},
                   "output_tokens": 100, "output_tokens_details": {"reasoning_tokens": 20},
                   "total_tokens": 3100})
        );
        let tag = tag_in(&openai_text(&response));
        let call = function_call(&response);
        assert_eq!(call["name"], "exec_command");
        assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(
            arguments,
            json!({"cmd": format!("printf '%s\\n' 'notes written by a real agent CLI (fake-models run {tag})' >> AGENT_NOTES.md")})
        );

        let mut input2 = input.clone();
        input2.extend(items(&response, "output").iter().cloned());
        input2.push(
            json!({"type": "function_call_output", "call_id": call["call_id"],
                           "output": "Process exited with code 0\nOutput:\n"}),
        );
        let (_, response2) = stream(&fake, &body(&input2, true));
        assert_eq!(
            openai_text(&response2),
            format!("Done: added a line to AGENT_NOTES.md. (fake-models run {tag})")
        );
        two_main_calls(
            &fake,
            Provider::OpenAi,
            Transport::Sse,
            OPENAI_MAIN_USAGE,
            &tag,
        );
    }

    #[test]
    fn shell_tools_of_other_shapes_are_used() {
        let fake = FakeModels::start();
        let mut b = body(&first_input("Add notes"), false);
        b["tools"] = json!([{"type": "function", "name": "shell", "parameters": {
            "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}]);
        let response: Value = post(&fake, &b).json().unwrap();
        assert_eq!(response["object"], "response");
        let call = function_call(&response);
        assert_eq!(call["name"], "shell");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments["command"][0], "bash");
        assert_eq!(arguments["command"][1], "-lc");
        assert_eq!(fake.calls()[0].transport, Transport::Json);
    }

    #[test]
    fn a_review_runs_the_named_diff() {
        let fake = FakeModels::start();
        let input = first_input("Review: `git diff origin/main...HEAD`, then judge.");
        let (_, response) = stream(&fake, &body(&input, true));
        let call = function_call(&response);
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"cmd": "git diff origin/main...HEAD"}));
        let mut input2 = input.clone();
        input2.extend(items(&response, "output").iter().cloned());
        input2.push(
            json!({"type": "function_call_output", "call_id": call["call_id"],
                           "output": [{"type": "input_text", "text": "diff --git a/x b/x"}]}),
        );
        let (_, response2) = stream(&fake, &body(&input2, true));
        let tag = tag_in(&openai_text(&response));
        assert_eq!(
            openai_text(&response2),
            format!(
                "fake-models review (fake-models run {tag}). What the command gave:\ndiff --git a/x b/x"
            )
        );
    }

    #[test]
    fn errors_have_openai_shapes() {
        let fake = FakeModels::start();
        let url = format!("{}/responses", fake.openai_base_url());
        let client = Client::new();
        // A request with no key or the wrong one: 401 and OpenAI's error JSON.
        let refused_without = |key: Option<&str>| -> Value {
            let request = client.post(&url).json(&body(&first_input("x"), true));
            let request = match key {
                Some(key) => request.bearer_auth(key),
                None => request,
            };
            let response = request.send().unwrap();
            assert_eq!(response.status(), 401);
            response.json().unwrap()
        };
        let error = refused_without(None);
        assert_eq!(error["error"]["type"], "invalid_request_error");
        let error = refused_without(Some("nope"));
        assert_eq!(error["error"]["code"], "invalid_api_key");

        let refused = post(&fake, &body(&first_input("x [model:api-error=429]"), true));
        assert_eq!(refused.status(), 429);
        let error: Value = refused.json().unwrap();
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("fake-models refuses this request (API-ERROR)")
        );

        for bad in [
            "nope",
            "[]",
            r#"{"input": []}"#,
            r#"{"model": "m", "input": 3}"#,
        ] {
            let response = client
                .post(&url)
                .bearer_auth(DEFAULT_KEY)
                .header("content-type", "application/json")
                .body(bad)
                .send()
                .unwrap();
            assert_eq!(response.status(), 400, "{bad}");
            let error: Value = response.json().unwrap();
            assert!(error["error"]["message"].is_string(), "{bad}");
        }
        let mut unknown = body(&[], true);
        unknown["previous_response_id"] = json!("resp_unknown");
        let response = post(&fake, &unknown);
        assert_eq!(response.status(), 400);
        let error: Value = response.json().unwrap();
        assert_eq!(error["error"]["code"], "previous_response_not_found");

        fake.fail_next(1, 500);
        let failed = post(&fake, &body(&first_input("x"), true));
        assert_eq!(failed.status(), 500);
        let error: Value = failed.json().unwrap();
        assert_eq!(error["error"]["type"], "server_error");
        assert_eq!(post(&fake, &body(&first_input("x"), true)).status(), 200);
    }

    #[test]
    fn a_request_without_tools_is_a_side_call() {
        let fake = FakeModels::start();
        let mut b = body(&[user("Name this thread")], true);
        b["tools"] = json!([]);
        b["text"] = json!({"format": {"type": "json_schema", "name": "t", "schema": {
            "type": "object", "properties": {"title": {"type": "string"}}}}});
        let (_, response) = stream(&fake, &b);
        let title: Value = serde_json::from_str(&openai_text(&response)).unwrap();
        assert_eq!(title, json!({"title": "fake-models title"}));
        assert_eq!(fake.side_calls()[0].usage, Some(OPENAI_SIDE_USAGE));
    }

    #[test]
    fn code_mode_offers_its_tools_in_an_additional_tools_item() {
        let fake = FakeModels::start();
        let mut input = vec![additional_tools()];
        input.extend(first_input("Please add the notes. [model:calls=2]"));
        let (events, response) = stream(&fake, &code_mode_body(&input, true));
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let mut kinds = types.clone();
        kinds.dedup();
        assert_eq!(
            kinds[7..],
            [
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let tag = tag_in(&openai_text(&response));
        let call = custom_call(&response);
        assert_eq!(call["name"], "exec");
        assert_eq!(call["status"], "completed");
        assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call.get("namespace"), None);
        let added = events
            .iter()
            .find(|e| {
                e["type"] == "response.output_item.added" && e["item"]["type"] == "custom_tool_call"
            })
            .unwrap();
        assert_eq!(added["item"]["input"], "");
        assert_eq!(added["item"]["status"], "in_progress");
        let line = format!("notes written by a real agent CLI (fake-models run {tag})");
        let command = format!("printf '%s\\n' '{line}' >> AGENT_NOTES.md");
        assert_eq!(
            call["input"].as_str().unwrap(),
            format!(
                "const r = await tools.exec_command({{cmd: {}}});\n\
                 text(typeof r === \"string\" ? r : (r.output ?? JSON.stringify(r)));\n",
                json!(command)
            )
        );

        // Over HTTP every call sends the whole history, the additional_tools item first.
        let mut history = input.clone();
        for n in 1..=2 {
            let previous = if n == 1 {
                response.clone()
            } else {
                stream(&fake, &code_mode_body(&history, true)).1
            };
            let call = custom_call(&previous);
            history.extend(items(&previous, "output").iter().cloned());
            history.push(custom_output(&call, ""));
        }
        let (_, last) = stream(&fake, &code_mode_body(&history, true));
        assert_eq!(
            openai_text(&last),
            format!("Done: added 2 lines to AGENT_NOTES.md. (fake-models run {tag})")
        );
        let steps: Vec<Option<u32>> = fake.main_calls().iter().map(|c| c.step).collect();
        assert_eq!(steps, [Some(0), Some(1), Some(2)]);
        assert!(fake.side_calls().is_empty());

        // The same request without the additional_tools item offers nothing: a side call.
        let (_, side) = stream(&fake, &code_mode_body(&input[1..], true));
        assert!(openai_text(&side).starts_with("fake-models side answer"));
        assert_eq!(fake.side_calls().len(), 1);
    }

    #[test]
    fn a_code_mode_review_quotes_what_exec_gave() {
        let fake = FakeModels::start();
        let mut input = vec![additional_tools()];
        input.extend(first_input(
            "Review: `git diff origin/main...HEAD`, then judge.",
        ));
        let (_, response) = stream(&fake, &code_mode_body(&input, true));
        let call = custom_call(&response);
        assert!(
            call["input"].as_str().unwrap().starts_with(
                r#"const r = await tools.exec_command({cmd: "git diff origin/main...HEAD"});"#
            ),
            "{call}"
        );
        input.extend(items(&response, "output").iter().cloned());
        input.push(custom_output(&call, "diff --git a/x b/x\n+hello\n"));
        let (_, response2) = stream(&fake, &code_mode_body(&input, true));
        let tag = tag_in(&openai_text(&response));
        assert_eq!(
            openai_text(&response2),
            format!(
                "fake-models review (fake-models run {tag}). What the command gave:\n\
                 Script completed\nWall time 0.1 seconds\nOutput:\n\n\
                 diff --git a/x b/x\n+hello\n"
            )
        );
        assert_eq!(fake.main_calls()[1].step, Some(1));
    }

    #[test]
    fn models_are_listed() {
        let fake = FakeModels::start();
        let response = Client::new()
            .get(format!("{}/models", fake.openai_base_url()))
            .bearer_auth(DEFAULT_KEY)
            .send()
            .unwrap();
        assert_eq!(response.status(), 200);
        let list: Value = response.json().unwrap();
        assert_eq!(list["object"], "list");
        assert!(
            items(&list, "data").iter().any(|m| m["id"] == "gpt-5.5"),
            "{list}"
        );
    }
}

mod websocket {
    use super::*;
    use tokio::net::TcpStream;
    use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

    type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

    fn request(
        fake: &FakeModels,
        key: &str,
    ) -> tokio_tungstenite::tungstenite::handshake::client::Request {
        let url = fake.openai_base_url().replace("http://", "ws://") + "/responses";
        let mut request = url.into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
        headers.insert(
            "openai-beta",
            "responses_websockets=2026-02-06".parse().unwrap(),
        );
        request
    }

    async fn connect(fake: &FakeModels) -> Socket {
        let (socket, response) = tokio_tungstenite::connect_async(request(fake, DEFAULT_KEY))
            .await
            .unwrap();
        assert_eq!(response.status(), 101);
        socket
    }

    /// Sends one `response.create` and reads frames until `response.completed` or `error`.
    async fn create(socket: &mut Socket, frame: Value) -> Vec<Value> {
        socket
            .send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        read_answer(socket).await
    }

    async fn read_answer(socket: &mut Socket) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
                .await
                .expect("a frame within 10 s")
                .expect("the socket stays open")
                .unwrap();
            let Message::Text(text) = message else {
                continue;
            };
            let event: Value = serde_json::from_str(&text).unwrap();
            let kind = event["type"].as_str().unwrap().to_owned();
            events.push(event);
            if kind == "response.completed" || kind == "error" {
                return events;
            }
        }
    }

    fn create_frame(input: &[Value], previous: Option<&str>) -> Value {
        let mut frame = body(input, true);
        frame["type"] = json!("response.create");
        if let Some(previous) = previous {
            frame["previous_response_id"] = json!(previous);
        }
        frame
    }

    #[tokio::test]
    async fn a_prewarmed_chained_conversation() {
        let fake = FakeModels::start();
        let mut socket = connect(&fake).await;
        // The prewarm: the developer instructions only, no generation.
        let mut prewarm = create_frame(&first_input("x")[..1], None);
        prewarm["generate"] = json!(false);
        let events = create(&mut socket, prewarm).await;
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.completed"
            ]
        );
        let prewarmed = assemble_openai(&events);
        assert_eq!(prewarmed["output"], json!([]));
        assert_eq!(prewarmed["usage"]["input_tokens"], 0);

        // The first call: only the items after the prewarm's.
        let started = Instant::now();
        let events = create(
            &mut socket,
            create_frame(
                &first_input("Add notes [model:calls=2]")[1..],
                prewarmed["id"].as_str(),
            ),
        )
        .await;
        let response = assemble_openai(&events);
        assert_eq!(response["previous_response_id"], prewarmed["id"]);
        let tag = tag_in(&openai_text(&response));
        let mut previous = response;
        for n in 1..=2 {
            let call = item_of_type(&previous, "output", "function_call");
            let output =
                json!({"type": "function_call_output", "call_id": call["call_id"], "output": "ok"});
            let events = create(
                &mut socket,
                create_frame(&[output], previous["id"].as_str()),
            )
            .await;
            previous = assemble_openai(&events);
            if n == 2 {
                assert_eq!(
                    openai_text(&previous),
                    format!("Done: added 2 lines to AGENT_NOTES.md. (fake-models run {tag})")
                );
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        let calls = fake.calls();
        let kinds: Vec<(CallKind, Transport)> =
            calls.iter().map(|c| (c.kind, c.transport)).collect();
        assert_eq!(
            kinds,
            [
                (CallKind::Other, Transport::WebSocket),
                (CallKind::Prewarm, Transport::WebSocket),
                (CallKind::Main, Transport::WebSocket),
                (CallKind::Main, Transport::WebSocket),
                (CallKind::Main, Transport::WebSocket)
            ]
        );
        assert_eq!(calls[0].status, 101);
        assert_eq!(
            calls[0].header("openai-beta"),
            Some("responses_websockets=2026-02-06")
        );
        assert_eq!(calls[1].usage, Some(Usage::default()));
        assert!(
            calls[1..]
                .iter()
                .all(|c| c.run_tag.as_deref() == Some(tag.as_str()))
        );
        let steps: Vec<Option<u32>> = fake.main_calls().iter().map(|c| c.step).collect();
        assert_eq!(steps, [Some(0), Some(1), Some(2)]);
        assert_eq!(
            fake.usage_where(Provider::OpenAi, |_| true),
            Usage::sum([&OPENAI_MAIN_USAGE; 3])
        );
    }

    #[tokio::test]
    async fn code_mode_tools_offered_once_carry_over_the_chain() {
        let fake = FakeModels::start();
        let mut socket = connect(&fake).await;
        // Codex's code-mode prewarm: no input, no tools.
        let mut prewarm = code_mode_body(&[], true);
        prewarm["type"] = json!("response.create");
        prewarm["generate"] = json!(false);
        let prewarmed = assemble_openai(&create(&mut socket, prewarm).await);
        // The first call: the additional_tools item and the context, after the prewarm.
        let mut input = vec![additional_tools()];
        input.extend(first_input("Add notes"));
        let mut frame = code_mode_body(&input, true);
        frame["type"] = json!("response.create");
        frame["previous_response_id"] = prewarmed["id"].clone();
        let first = assemble_openai(&create(&mut socket, frame).await);
        let tag = tag_in(&openai_text(&first));
        let call = custom_call(&first);
        // The continuation: only the exec's output; the tools come from the chain.
        let mut frame = code_mode_body(&[custom_output(&call, "")], true);
        frame["type"] = json!("response.create");
        frame["previous_response_id"] = first["id"].clone();
        let last = assemble_openai(&create(&mut socket, frame).await);
        assert_eq!(
            openai_text(&last),
            format!("Done: added a line to AGENT_NOTES.md. (fake-models run {tag})")
        );
        let kinds: Vec<(CallKind, Option<u32>)> =
            fake.calls().iter().map(|c| (c.kind, c.step)).collect();
        assert_eq!(
            kinds,
            [
                (CallKind::Other, None),
                (CallKind::Prewarm, None),
                (CallKind::Main, Some(0)),
                (CallKind::Main, Some(1))
            ]
        );
    }

    #[tokio::test]
    async fn bad_frames_get_error_frames_and_the_socket_goes_on() {
        let fake = FakeModels::start();
        let mut socket = connect(&fake).await;
        socket.send(Message::Text("not json".into())).await.unwrap();
        let error = read_answer(&mut socket).await.pop().unwrap();
        assert_eq!(error["type"], "error");
        assert_eq!(error["status"], 400);
        let events = create(&mut socket, json!({"type": "response.cancel"})).await;
        assert_eq!(events[0]["status"], 400);
        socket
            .send(Message::Binary(vec![1, 2].into()))
            .await
            .unwrap();
        assert_eq!(read_answer(&mut socket).await[0]["status"], 400);
        let events = create(&mut socket, create_frame(&[], Some("resp_nope"))).await;
        assert_eq!(events[0]["error"]["code"], "previous_response_not_found");
        let events = create(
            &mut socket,
            create_frame(&first_input("x [model:api-error=400]"), None),
        )
        .await;
        assert_eq!(events[0]["status"], 400);
        assert!(
            events[0]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("fake-models refuses this request (API-ERROR)")
        );
        fake.fail_next(1, 503);
        let events = create(&mut socket, create_frame(&first_input("x"), None)).await;
        assert_eq!(events[0]["status"], 503);
        let events = create(&mut socket, create_frame(&first_input("x"), None)).await;
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        socket.send(Message::Ping(vec![7].into())).await.unwrap();
        socket.close(None).await.unwrap();
    }

    #[tokio::test]
    async fn the_upgrade_checks_the_key_and_can_be_refused() {
        let fake = FakeModels::start();
        match tokio_tungstenite::connect_async(request(&fake, "wrong")).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401)
            }
            other => panic!("expected a 401, got {other:?}"),
        }
        fake.set_websocket_enabled(false);
        match tokio_tungstenite::connect_async(request(&fake, DEFAULT_KEY)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 426)
            }
            other => panic!("expected a 426, got {other:?}"),
        }
        let statuses: Vec<(u16, bool)> =
            fake.calls().iter().map(|c| (c.status, c.key_ok)).collect();
        assert_eq!(statuses, [(401, false), (426, true)]);
    }

    #[tokio::test]
    async fn slow_answers_wait_and_dropping_the_fake_with_an_open_socket_is_quick() {
        let fake = FakeModels::start();
        let mut socket = connect(&fake).await;
        let input = first_input("x [model:slow=0.3]");
        let events = create(&mut socket, create_frame(&input, None)).await;
        let first = assemble_openai(&events);
        let call = first["output"][1].clone();
        let started = Instant::now();
        let output =
            json!({"type": "function_call_output", "call_id": call["call_id"], "output": "ok"});
        create(&mut socket, create_frame(&[output], first["id"].as_str())).await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        let started = Instant::now();
        tokio::task::spawn_blocking(move || drop(fake))
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
