//! Reading what a model call used from the provider's response as it streams through the
//! gateway: Anthropic Messages (`message_start` and `message_delta` events, or one JSON
//! message) and OpenAI Responses (`response.completed`, `response.incomplete` or
//! `response.failed` events, or one JSON response).
//!
//! Bytes are fed in chunks cut anywhere. Only server-sent-event `data:` lines that mention
//! `usage`, `model` or `error` are parsed as JSON; the rest passes by. Memory is bounded: at
//! most one unfinished line of [`MAX_LINE_BYTES`] (a longer line is skipped), or for a
//! non-streamed answer at most [`MAX_JSON_BYTES`] of the body.

use agentry_domain::money::Usd;
use agentry_runner::Tokens;
use agentry_runner::prices::ModelPrice;
use serde_json::Value;

/// The longest event line read.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The largest non-streamed answer read for its usage.
pub const MAX_JSON_BYTES: usize = 16 * 1024 * 1024;

/// Which API a call speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Anthropic Messages (Claude Code).
    Anthropic,
    /// OpenAI Responses (Codex).
    OpenAi,
}

impl Provider {
    /// `anthropic` or `openai`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        }
    }
}

/// What one call used, as the provider reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uncached input tokens.
    pub input: i64,
    /// Input tokens read from the prompt cache.
    pub cache_read: i64,
    /// Input tokens written to the prompt cache.
    pub cache_write: i64,
    /// The part of `cache_write` written to Anthropic's 1-hour cache (`cache_creation`'s
    /// `ephemeral_1h_input_tokens`), which costs twice the input price.
    pub cache_write_one_hour: i64,
    /// Output tokens (reasoning included).
    pub output: i64,
    /// The part of the output spent on reasoning.
    pub reasoning: i64,
}

impl Usage {
    /// The tokens as the price table applies to them (all input together).
    pub fn tokens(&self) -> Tokens {
        Tokens::from_uncached(self.input, self.cache_read, self.cache_write, self.output)
    }

    /// What these tokens cost at `price`, the 1-hour cache writes at their own price
    /// ([`ModelPrice::cost_with_one_hour_writes`]); `None` on a negative count or overflow.
    pub fn cost(&self, price: &ModelPrice) -> Option<Usd> {
        price.cost_with_one_hour_writes(self.tokens(), self.cache_write_one_hour)
    }

    /// Whether any token was used.
    pub fn is_empty(&self) -> bool {
        self.tokens().input == 0 && self.output == 0
    }
}

/// Reads one response's usage as it passes.
#[derive(Debug)]
pub struct UsageReader {
    provider: Provider,
    streamed: bool,
    line: Vec<u8>,
    skipping_line: bool,
    body: Vec<u8>,
    body_too_large: bool,
    usage: Usage,
    model: Option<String>,
    error: Option<String>,
    /// Whether the response's final usage event arrived (a streamed answer that breaks off
    /// before it has only what `message_start` said).
    finished: bool,
}

impl UsageReader {
    /// A reader of a `provider` answer, streamed as server-sent events or not.
    pub fn new(provider: Provider, streamed: bool) -> Self {
        UsageReader {
            provider,
            streamed,
            line: Vec::new(),
            skipping_line: false,
            body: Vec::new(),
            body_too_large: false,
            usage: Usage::default(),
            model: None,
            error: None,
            finished: false,
        }
    }

    /// Reads the next chunk of the answer.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.streamed {
            if self.body.len() + chunk.len() > MAX_JSON_BYTES {
                self.body_too_large = true;
                self.body = Vec::new();
            }
            if !self.body_too_large {
                self.body.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let (part, after) = rest.split_at(end);
            if !self.skipping_line {
                self.line.extend_from_slice(part);
                let line = std::mem::take(&mut self.line);
                self.event_line(&line);
            }
            self.skipping_line = false;
            self.line.clear();
            rest = &after[1..];
        }
        if !self.skipping_line {
            if self.line.len() + rest.len() > MAX_LINE_BYTES {
                self.skipping_line = true;
                self.line = Vec::new();
            } else {
                self.line.extend_from_slice(rest);
            }
        }
    }

    /// Reads what is left (an unterminated last line, a non-streamed body).
    pub fn finish(&mut self) {
        if self.streamed {
            if !self.skipping_line && !self.line.is_empty() {
                let line = std::mem::take(&mut self.line);
                self.event_line(&line);
            }
            return;
        }
        if self.body_too_large {
            return;
        }
        let body = std::mem::take(&mut self.body);
        if let Ok(value) = serde_json::from_slice::<Value>(&body) {
            self.read_object(&value);
            if value.get("usage").is_some() {
                self.finished = true;
            }
        }
    }

    /// What the call used, as far as read.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The model the provider answered with, if it said.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The provider's error message, if the answer was (or ended with) an error.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether the answer's final usage arrived.
    pub fn finished(&self) -> bool {
        self.finished
    }

    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let interesting = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
        if !(interesting(b"usage") || interesting(b"\"model\"") || interesting(b"error")) {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return;
        };
        let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
        match (self.provider, kind) {
            (Provider::Anthropic, "message_start") => {
                if let Some(message) = value.get("message") {
                    self.read_object(message);
                }
            }
            (Provider::Anthropic, "message_delta") => {
                self.read_object(&value);
                self.finished = true;
            }
            (
                Provider::OpenAi,
                "response.completed" | "response.incomplete" | "response.failed",
            ) => {
                if let Some(response) = value.get("response") {
                    self.read_object(response);
                }
                self.finished = true;
            }
            (Provider::OpenAi, "response.created" | "response.in_progress") => {
                if let Some(model) = value
                    .get("response")
                    .and_then(|r| r.get("model"))
                    .and_then(Value::as_str)
                {
                    self.model = Some(model.to_owned());
                }
            }
            (_, "error") => self.read_error(&value),
            _ => {}
        }
    }

    /// Reads `model`, `usage` and `error` of a message or response object.
    fn read_object(&mut self, object: &Value) {
        if let Some(model) = object.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_owned());
        }
        if let Some(usage) = object.get("usage").filter(|u| u.is_object()) {
            self.read_usage(usage);
        }
        if object.get("error").is_some_and(|e| !e.is_null()) {
            self.read_error(object);
        }
    }

    fn read_error(&mut self, value: &Value) {
        let error = value.get("error").unwrap_or(value);
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .unwrap_or("error");
        self.error = Some(agentry_domain::quote::excerpt(message, 500));
    }

    /// Anthropic counts are cumulative per message (`message_delta` repeats or raises
    /// them): the largest seen counts. OpenAI's come once, at the end.
    fn read_usage(&mut self, usage: &Value) {
        let count = |v: Option<&Value>| v.and_then(Value::as_i64).filter(|n| *n >= 0);
        match self.provider {
            Provider::Anthropic => {
                let u = &mut self.usage;
                if let Some(n) = count(usage.get("input_tokens")) {
                    u.input = u.input.max(n);
                }
                if let Some(n) = count(usage.get("cache_read_input_tokens")) {
                    u.cache_read = u.cache_read.max(n);
                }
                if let Some(n) = count(usage.get("cache_creation_input_tokens")) {
                    u.cache_write = u.cache_write.max(n);
                }
                if let Some(n) = count(usage.get("output_tokens")) {
                    u.output = u.output.max(n);
                }
                // The writes split by cache lifetime (a 1-hour write costs 2× input, a
                // 5-minute one 1.25×); their sum is `cache_creation_input_tokens`.
                if let Some(creation) = usage.get("cache_creation").filter(|c| c.is_object()) {
                    let five = count(creation.get("ephemeral_5m_input_tokens")).unwrap_or(0);
                    let hour = count(creation.get("ephemeral_1h_input_tokens")).unwrap_or(0);
                    u.cache_write_one_hour = u.cache_write_one_hour.max(hour);
                    u.cache_write = u.cache_write.max(five.saturating_add(hour));
                }
            }
            Provider::OpenAi => {
                let details = usage.get("input_tokens_details");
                let all_input = count(usage.get("input_tokens")).unwrap_or(0);
                let cached = count(details.and_then(|d| d.get("cached_tokens"))).unwrap_or(0);
                let written = count(details.and_then(|d| d.get("cache_write_tokens"))).unwrap_or(0);
                let cache_read = cached.min(all_input);
                let cache_write = written.min(all_input - cache_read);
                self.usage = Usage {
                    input: all_input - cache_read - cache_write,
                    cache_read,
                    cache_write,
                    cache_write_one_hour: 0,
                    output: count(usage.get("output_tokens")).unwrap_or(0),
                    reasoning: count(
                        usage
                            .get("output_tokens_details")
                            .and_then(|d| d.get("reasoning_tokens")),
                    )
                    .unwrap_or(0),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_STREAM: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-5\",\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the usage of a model\"}}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":77}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

    const OPENAI_STREAM: &str = "event: response.created\n\
data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-6.1-sol\",\"usage\":null}}\n\n\
event: response.output_text.delta\n\
data: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-6.1-sol\",\"usage\":{\"input_tokens\":5000,\"input_tokens_details\":{\"cached_tokens\":3000},\"output_tokens\":200,\"output_tokens_details\":{\"reasoning_tokens\":50},\"total_tokens\":5200}}}\n\n";

    fn read_in_chunks(provider: Provider, text: &str, size: usize) -> UsageReader {
        let mut reader = UsageReader::new(provider, true);
        for chunk in text.as_bytes().chunks(size) {
            reader.feed(chunk);
        }
        reader.finish();
        reader
    }

    #[test]
    fn anthropic_usage_is_read_from_start_and_delta_in_any_chunking() {
        for size in [1, 2, 7, 64, 10_000] {
            let reader = read_in_chunks(Provider::Anthropic, ANTHROPIC_STREAM, size);
            assert_eq!(
                reader.usage(),
                Usage {
                    input: 12,
                    cache_read: 4000,
                    cache_write: 300,
                    cache_write_one_hour: 0,
                    output: 77,
                    reasoning: 0
                },
                "chunks of {size}"
            );
            assert_eq!(reader.model(), Some("claude-sonnet-5"));
            assert!(reader.finished());
            assert_eq!(reader.usage().tokens().input, 4312);
        }
    }

    #[test]
    fn openai_usage_counts_cached_input_apart() {
        for size in [1, 3, 100, 10_000] {
            let reader = read_in_chunks(Provider::OpenAi, OPENAI_STREAM, size);
            assert_eq!(
                reader.usage(),
                Usage {
                    input: 2000,
                    cache_read: 3000,
                    cache_write: 0,
                    cache_write_one_hour: 0,
                    output: 200,
                    reasoning: 50
                }
            );
            assert_eq!(reader.model(), Some("gpt-6.1-sol"));
            assert!(reader.finished());
        }
    }

    #[test]
    fn one_hour_cache_writes_are_read_apart_and_cost_twice_the_input_price() {
        let stream = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-5\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":3000,\"cache_read_input_tokens\":0,\"cache_creation\":{\"ephemeral_5m_input_tokens\":1000,\"ephemeral_1h_input_tokens\":2000},\"output_tokens\":1}}}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":100}}\n\n";
        let json = br#"{"model":"claude-sonnet-5","usage":{"input_tokens":10,"cache_creation_input_tokens":3000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":100}}"#;
        let mut whole = UsageReader::new(Provider::Anthropic, false);
        whole.feed(json);
        whole.finish();
        let price = agentry_runner::PriceTable::builtin()
            .get("claude-sonnet-5")
            .copied()
            .unwrap();
        for reader in [read_in_chunks(Provider::Anthropic, stream, 7), whole] {
            let usage = reader.usage();
            assert_eq!(
                (usage.cache_write, usage.cache_write_one_hour),
                (3000, 2000)
            );
            // claude-sonnet-5: $2 input, $2.5 a 5-minute write, $4 a 1-hour write, $10 output
            // per million: 10 × 2 + 1,000 × 2.5 + 2,000 × 4 + 100 × 10 = $0.01152.
            assert_eq!(usage.cost(&price), Some(Usd::parse("0.01152").unwrap()));
            // Not all at the 5-minute price (10 × 2 + 3,000 × 2.5 + 100 × 10: $0.00852).
            assert_eq!(
                price.cost(usage.tokens()),
                Some(Usd::parse("0.00852").unwrap())
            );
        }
    }

    #[test]
    fn a_stream_cut_before_its_end_keeps_what_it_said_and_is_not_finished() {
        let cut = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM.find("event: message_delta").unwrap()];
        let reader = read_in_chunks(Provider::Anthropic, cut, 5);
        assert_eq!(reader.usage().input, 12);
        assert_eq!(reader.usage().output, 1);
        assert!(!reader.finished());
    }

    #[test]
    fn non_streamed_answers_are_read_whole() {
        let mut reader = UsageReader::new(Provider::Anthropic, false);
        let body = br#"{"id":"m","type":"message","model":"claude-haiku-5","usage":{"input_tokens":10,"output_tokens":3}}"#;
        for chunk in body.chunks(4) {
            reader.feed(chunk);
        }
        reader.finish();
        assert_eq!(reader.usage().input, 10);
        assert_eq!(reader.usage().output, 3);
        assert_eq!(reader.model(), Some("claude-haiku-5"));
        assert!(reader.finished());

        let mut reader = UsageReader::new(Provider::OpenAi, false);
        reader.feed(br#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#);
        reader.finish();
        assert_eq!(reader.error(), Some("bad key"));
        assert!(reader.usage().is_empty());
    }

    #[test]
    fn error_events_and_junk_are_read_without_panicking() {
        let text = "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\
data: not json at all, with usage\n\
data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-5}}\n";
        let reader = read_in_chunks(Provider::Anthropic, text, 3);
        assert_eq!(reader.error(), Some("Overloaded"));
        assert_eq!(reader.usage().output, 0);
    }

    #[test]
    fn an_overlong_line_is_skipped_and_reading_goes_on() {
        let mut text = String::from("data: {\"usage\":");
        text.push_str(&"x".repeat(MAX_LINE_BYTES + 10));
        text.push('\n');
        text.push_str(ANTHROPIC_STREAM);
        let reader = read_in_chunks(Provider::Anthropic, &text, 4096);
        assert_eq!(reader.usage().output, 77);
    }
}
