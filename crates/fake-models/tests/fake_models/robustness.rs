//! Odd and hostile input: every request gets an answer (a handler that panicked would drop
//! the connection instead), in the JSON shape of an answer or an error.
use std::time::Duration;

use agentry_fake_models::{DEFAULT_KEY, FakeModels};
use agentry_testkit::SplitMix64;
use reqwest::blocking::Client;
use serde_json::{Value, json};

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Bodies that are valid JSON in odd shapes, or not JSON at all.
fn odd_bodies() -> Vec<Vec<u8>> {
    let huge = u64::MAX;
    let mut bodies: Vec<Vec<u8>> = [
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": {"x": 1}}, {"type": "text"}, 7, null]}],
            "tools": [{"name": "Bash"}, 3, {"name": null}], "stream": "yes"}),
        json!({"model": "m", "messages": [{"role": "user",
            "content": format!("x [model:usage={huge},{huge},{huge},{huge},{huge}] [model:calls=4294967295] [model:slow=1e300] [model:api-error=65535]")}],
            "tools": [{"name": "Write"}], "system": [{"type": "text", "text": "Working directory: /"}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": "[model:slow=NaN][model:slow=inf][model:usage=1,2,3][model:x][model:"}],
            "tools": [{"name": "Bash"}]}),
        json!({"model": "m", "input": [{"type": "function_call_output"}, {"role": "user"}, 5, null,
            {"type": "message", "role": "assistant", "content": "fake-models run "}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": []}]}),
        json!({"model": "m", "input": "hi `git diff` there", "tools": [{"type": "function", "name": "shell",
            "parameters": {"properties": {"command": 3}}}], "text": {"format": {"schema": {"type": 5}}}}),
        json!({"model": "m", "input": [], "previous_response_id": 42, "generate": "no"}),
        json!({"model": "m", "messages": [], "output_config": {"format": {"schema":
            {"type": "object", "properties": {"a": {"type": "array"}, "b": {"enum": [1]}}}}}}),
        json!({"model": ["m"], "messages": {}, "input": {}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    bodies.push(nested(100).into_bytes());
    bodies.push(nested(10_000).into_bytes());
    bodies.push(vec![0xff, 0xfe, b'{', 0x80]);
    bodies.push(
        b"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}"
            .to_vec(),
    );
    bodies.push(Vec::new());
    bodies
}

#[test]
fn every_odd_request_gets_an_answer() {
    let fake = FakeModels::start();
    let client = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(7);
    let paths = [
        "/v1/messages",
        "/v1/messages?beta=true",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/models",
        "/",
        "/v1/anything/else",
    ];
    let mut bodies = odd_bodies();
    // Random bytes and random truncations of the odd bodies.
    for _ in 0..40 {
        let len = rng.below(200) as usize;
        bodies.push((0..len).map(|_| rng.next_u64() as u8).collect());
    }
    for body in odd_bodies() {
        let cut = rng.below(body.len() as u64 + 1) as usize;
        bodies.push(body[..cut].to_vec());
    }
    for path in paths {
        for body in &bodies {
            for method in [reqwest::Method::POST, reqwest::Method::GET] {
                let response = client
                    .request(method.clone(), format!("{}{path}", fake.base_url()))
                    .header("x-api-key", DEFAULT_KEY)
                    .bearer_auth(DEFAULT_KEY)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .unwrap_or_else(|e| panic!("{method} {path} {body:?}: no answer: {e}"));
                let status = response.status().as_u16();
                assert!(
                    [200, 400, 404].contains(&status) || (400..600).contains(&status),
                    "{method} {path}: {status}"
                );
                let text = response.text().unwrap();
                if status != 200 {
                    let error: Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("{method} {path} {status}: {e}: {text}"));
                    assert!(error["error"]["message"].is_string(), "{text}");
                }
            }
        }
    }
    assert!(fake.calls().len() >= bodies.len());
}
