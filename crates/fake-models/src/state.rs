//! The fake's shared state: the key, the recorded calls, queued faults, run tags and the
//! conversations that chained OpenAI responses continue.

use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use agentry_testkit::SplitMix64;

use crate::Call;

/// The most conversations kept for `previous_response_id` (the oldest are forgotten).
const MAX_CONVERSATIONS: usize = 10_000;

/// What an OpenAI response left behind, for a request that continues it through
/// `previous_response_id` (which sends only the new input items).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conversation {
    /// The run tag.
    pub tag: String,
    /// The agent's prompt (the user text of the first request).
    pub prompt: String,
    /// Tool results seen so far.
    pub tool_results: u32,
    /// The newest tool result's text.
    pub last_result: Option<String>,
    /// The tools offered so far (top-level `tools` and code mode's `additional_tools`,
    /// flattened), for a continuation that sends none.
    pub tools: Vec<serde_json::Value>,
}

/// Everything behind the fake's mutex.
#[derive(Debug)]
pub(crate) struct State {
    /// The only API key accepted.
    pub key: String,
    /// Whether `GET /v1/responses` may become a WebSocket.
    pub websocket: bool,
    /// Every request answered (or being answered), oldest first.
    pub calls: Vec<Call>,
    /// How many `[model:gather]` calls arrived.
    pub gathered: u32,
    /// `calls[i].seq == first_seq + i` (what [`State::clear_calls`] forgot before).
    first_seq: u64,
    /// Statuses the next main calls answer instead of their answer.
    pub faults: VecDeque<u16>,
    rng: SplitMix64,
    /// Run tags by session (Claude Code's `x-claude-code-session-id`, Codex's
    /// `prompt_cache_key`), so side requests and continuations find their run.
    pub sessions: HashMap<String, String>,
    /// Conversations by the id of the response that ended them.
    pub responses: HashMap<String, Conversation>,
    response_order: VecDeque<String>,
}

impl State {
    /// A state accepting `key`, whose ids come from a generator seeded with `seed`.
    pub(crate) fn new(key: String, seed: u64) -> Self {
        Self {
            key,
            websocket: true,
            calls: Vec::new(),
            gathered: 0,
            first_seq: 0,
            faults: VecDeque::new(),
            rng: SplitMix64::new(seed),
            sessions: HashMap::new(),
            responses: HashMap::new(),
            response_order: VecDeque::new(),
        }
    }

    /// `prefix` and `hex_len` random lower-case hex digits.
    pub(crate) fn new_id(&mut self, prefix: &str, hex_len: usize) -> String {
        let mut out = String::with_capacity(prefix.len() + hex_len);
        out.push_str(prefix);
        while out.len() < prefix.len() + hex_len {
            let word = format!("{:016x}", self.rng.next_u64());
            let missing = prefix.len() + hex_len - out.len();
            out.push_str(&word[..missing.min(word.len())]);
        }
        out
    }

    /// A fresh run tag: `prefix` (`r` for Anthropic, `c` for OpenAI) and 12 hex digits.
    pub(crate) fn new_tag(&mut self, prefix: &str) -> String {
        self.new_id(prefix, 12)
    }

    /// Records `call` (its `seq` is set here) and returns its sequence number.
    pub(crate) fn record(&mut self, mut call: Call) -> u64 {
        let seq = self.first_seq + self.calls.len() as u64;
        call.seq = seq;
        self.calls.push(call);
        seq
    }

    /// Marks call `seq` as answered now (nothing when it was forgotten).
    pub(crate) fn answered(&mut self, seq: u64) {
        let Some(index) = seq.checked_sub(self.first_seq) else {
            return;
        };
        if let Some(call) = usize::try_from(index)
            .ok()
            .and_then(|i| self.calls.get_mut(i))
        {
            call.answered_at = Some(SystemTime::now());
        }
    }

    /// Forgets the recorded calls.
    pub(crate) fn clear_calls(&mut self) {
        self.first_seq += self.calls.len() as u64;
        self.calls.clear();
    }

    /// The status of the next queued fault, if any (and removes it).
    pub(crate) fn take_fault(&mut self) -> Option<u16> {
        self.faults.pop_front()
    }

    /// Keeps `conversation` as what response `id` left.
    pub(crate) fn keep_response(&mut self, id: &str, conversation: Conversation) {
        if self.responses.len() >= MAX_CONVERSATIONS
            && let Some(oldest) = self.response_order.pop_front()
        {
            self.responses.remove(&oldest);
        }
        self.responses.insert(id.to_owned(), conversation);
        self.response_order.push_back(id.to_owned());
    }
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A seed that differs between fakes: the clock's nanoseconds and the port.
pub(crate) fn seed(port: u16) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (nanos as u64) ^ (u64::from(port) << 48) ^ u64::from(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_asked_length() {
        let mut s = State::new("k".into(), 7);
        let id = s.new_id("msg_", 24);
        assert_eq!(id.len(), 28);
        assert!(id.starts_with("msg_"));
        assert!(id[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(s.new_tag("r").len(), 13);
        assert_ne!(s.new_tag("r"), s.new_tag("r"));
    }
}
