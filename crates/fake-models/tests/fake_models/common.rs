//! Helpers shared by the fake model API's tests: server-sent events, and the answers they
//! assemble into.

use agentry_fake_models::{Call, FakeModels, Provider, Transport, Usage};
use serde_json::Value;

/// The events of a server-sent event stream, as (event name, data).
pub fn parse_sse(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|chunk| !chunk.trim().is_empty())
        .map(|chunk| {
            let mut name = String::new();
            let mut data = String::new();
            for line in chunk.lines() {
                if let Some(rest) = line.strip_prefix("event: ") {
                    name = rest.to_owned();
                } else if let Some(rest) = line.strip_prefix("data: ") {
                    data.push_str(rest);
                }
            }
            let value: Value = serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}"));
            (name, value)
        })
        .collect()
}

/// The events of a `200` server-sent event stream (asserting the status and content type).
pub fn sse_events(response: reqwest::blocking::Response) -> Vec<(String, Value)> {
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    parse_sse(&response.text().unwrap())
}

/// The items of the array `container[list]`, which must be one.
pub fn items<'v>(container: &'v Value, list: &str) -> &'v [Value] {
    container[list]
        .as_array()
        .unwrap_or_else(|| panic!("no array {list} in {container}"))
}

/// The first item of the array `container[list]` whose `type` is `kind`.
pub fn item_of_type(container: &Value, list: &str, kind: &str) -> Value {
    items(container, list)
        .iter()
        .find(|i| i["type"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} in {container}"))
}

/// The fake's main calls, asserting that there are two (steps 0 and 1) to `provider` over
/// `transport`, each with `usage` and the run tag `tag`.
pub fn two_main_calls(
    fake: &FakeModels,
    provider: Provider,
    transport: Transport,
    usage: Usage,
    tag: &str,
) -> Vec<Call> {
    let calls = fake.main_calls();
    assert_eq!(calls.len(), 2);
    for (step, call) in calls.iter().enumerate() {
        assert_eq!(call.provider, provider);
        assert_eq!(call.transport, transport);
        assert_eq!(call.step, Some(step as u32));
        assert_eq!(call.usage, Some(usage));
        assert_eq!(call.run_tag.as_deref(), Some(tag));
    }
    calls
}

/// `names` with consecutive repeats removed.
pub fn dedup_names(events: &[(String, Value)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (name, _) in events {
        if out.last() != Some(name) {
            out.push(name.clone());
        }
    }
    out
}

/// An Anthropic message assembled from its stream, as a client does: content blocks (tool
/// inputs parsed from their `input_json_delta`s), `stop_reason`, and the usage of
/// `message_start` updated by `message_delta`.
pub fn assemble_anthropic(events: &[(String, Value)]) -> Value {
    let mut message = Value::Null;
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    for (name, data) in events {
        assert_eq!(
            data["type"].as_str(),
            Some(name.as_str()),
            "event name and type"
        );
        match name.as_str() {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                let index = data["index"].as_u64().unwrap() as usize;
                assert_eq!(index, blocks.len(), "blocks start in order");
                blocks.push(data["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap() as usize;
                let delta = &data["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => {
                        let text = format!(
                            "{}{}",
                            blocks[index]["text"].as_str().unwrap(),
                            delta["text"].as_str().unwrap()
                        );
                        blocks[index]["text"] = Value::String(text);
                    }
                    "input_json_delta" => {
                        partial[index].push_str(delta["partial_json"].as_str().unwrap())
                    }
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                let index = data["index"].as_u64().unwrap() as usize;
                if blocks[index]["type"] == "tool_use" {
                    blocks[index]["input"] = serde_json::from_str(&partial[index]).unwrap();
                }
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                for (k, v) in data["usage"].as_object().unwrap() {
                    message["usage"][k] = v.clone();
                }
            }
            "message_stop" | "ping" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    message["content"] = Value::Array(blocks);
    message
}

/// The text of an assembled message's text blocks, joined.
pub fn anthropic_text(message: &Value) -> String {
    items(message, "content")
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The final response of an OpenAI event stream, checked against its deltas: every
/// `output_text.delta` adds up to its `output_text.done`, every function call's argument
/// deltas to its `arguments`, every custom tool call's input deltas to its `input`, and the
/// sequence numbers count from 0.
pub fn assemble_openai(events: &[Value]) -> Value {
    let mut text = String::new();
    let mut arguments = String::new();
    let mut input = String::new();
    let mut completed = Value::Null;
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"].as_u64(), Some(n as u64));
        match event["type"].as_str().unwrap() {
            "response.output_text.delta" => text.push_str(event["delta"].as_str().unwrap()),
            "response.output_text.done" => {
                assert_eq!(event["text"].as_str().unwrap(), text);
                text.clear();
            }
            "response.function_call_arguments.delta" => {
                arguments.push_str(event["delta"].as_str().unwrap())
            }
            "response.function_call_arguments.done" => {
                assert_eq!(event["arguments"].as_str().unwrap(), arguments);
                arguments.clear();
            }
            "response.custom_tool_call_input.delta" => {
                input.push_str(event["delta"].as_str().unwrap())
            }
            "response.custom_tool_call_input.done" => {
                assert_eq!(event["input"].as_str().unwrap(), input);
                input.clear();
            }
            "response.completed" => completed = event["response"].clone(),
            _ => {}
        }
    }
    assert!(completed.is_object(), "no response.completed in {events:?}");
    completed
}

/// The text of a response's message items, joined.
pub fn openai_text(response: &Value) -> String {
    items(response, "output")
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| items(i, "content"))
        .map(|c| c["text"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The run tag in a text (`fake-models run TAG`).
pub fn tag_in(text: &str) -> String {
    let at = text
        .find("fake-models run ")
        .unwrap_or_else(|| panic!("no run tag in {text:?}"));
    text[at + "fake-models run ".len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}
