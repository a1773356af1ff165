//! The parser of OpenAI Codex's `codex exec --json` output.
//!
//! The output is JSON Lines events (openai/codex, `codex-rs/exec/src/exec_events.rs` and
//! `docs/exec.md`): `thread.started`, `turn.started`, `item.started` / `item.updated` /
//! `item.completed` (with an `item` of type `agent_message`, `reasoning`,
//! `command_execution`, `file_change`, …), `turn.completed` with
//! `usage: {input_tokens, cached_input_tokens, output_tokens}`, `turn.failed` with
//! `error: {message}`, and `error` with `message`.
//!
//! Codex reports no money: the cost is computed from the tokens with a [`PriceTable`].

use agentry_domain::money::Usd;

use crate::agent::{Count, LooseStr, Message, OutputParser, fields, read_object};
use std::path::Path;

use crate::codex_session::SessionMeter;
use crate::prices::{ModelPrice, PriceTable, Tokens};
use crate::{AgentOutcome, RunReport, Warnings, excerpt};

/// Parses the whole stdout of a Codex run launched with `model`, pricing it with `prices`.
///
/// - Lines that are not JSON objects are skipped with a warning.
/// - Tokens are summed over every `turn.completed` event (input includes the cached input;
///   `cache_read_tokens` = `cached_input_tokens`; Codex reports no cache writes);
///   turns = the number of `turn.completed` events; final text = the text of the last
///   `agent_message` item.
/// - `turn.failed` / `error` → [`AgentOutcome::Error`] with its message, unless a later
///   `turn.completed` shows the run went on (then it is only a warning).
/// - No `turn.completed` and no failure → [`AgentOutcome::Unparseable`].
/// - Cost = the exact price of the tokens when at least one `turn.completed` was seen and
///   `model` is in `prices`; an unpriced model gives no cost and a warning naming it (never
///   a fake $0).
///
/// The same as an [`OutputParser::codex`] fed `output`. Never panics.
pub fn parse_codex(output: &str, model: &str, prices: &PriceTable) -> RunReport {
    let mut parser = OutputParser::codex(model, prices);
    parser.feed(output.as_bytes());
    parser.finish()
}

/// The top-level fields of an event that the parser reads.
#[derive(Debug, Default)]
struct Event {
    kind: LooseStr,
    /// `usage` of `turn.completed`.
    usage: Option<Usage>,
    /// `error` of `turn.failed`.
    error: Option<Message>,
    /// `message` of `error`.
    message: LooseStr,
    /// `item` of `item.completed`.
    item: Option<Item>,
}

fields!(Event {
    "type" => kind: value,
    "usage" => usage: object,
    "error" => error: object,
    "message" => message: value,
    "item" => item: object,
});

/// The token counts of a `turn.completed` event.
#[derive(Debug, Default)]
struct Usage {
    input_tokens: Count,
    cached_input_tokens: Count,
    cache_write_input_tokens: Count,
    output_tokens: Count,
}

fields!(Usage {
    "input_tokens" => input_tokens: value,
    "cached_input_tokens" => cached_input_tokens: value,
    "cache_write_input_tokens" => cache_write_input_tokens: value,
    "output_tokens" => output_tokens: value,
});

/// The fields of an item that the parser reads.
#[derive(Debug, Default)]
struct Item {
    /// `type`, when the key is present (whatever its value).
    kind: Option<LooseStr>,
    /// `item_type`, the older name of `type`.
    item_type: LooseStr,
    text: LooseStr,
}

fields!(Item {
    "type" => kind: present,
    "item_type" => item_type: value,
    "text" => text: value,
});

/// Reads Codex output line by line (see [`parse_codex`]).
#[derive(Debug)]
pub(crate) struct CodexReader {
    report: RunReport,
    model: String,
    /// The price of `model`, if the table has it.
    price: Option<ModelPrice>,
    turns: i64,
    /// The failure reported last, unless a later `turn.completed` shows the run went on.
    pending_error: Option<AgentOutcome>,
    /// The exact price of the tokens of every `turn.completed` read so far; `None` when
    /// `model` is unpriced or the counts are too large to price.
    running_cost: Option<Usd>,
    /// The per-call usage Codex records in its session files, when the run's `HOME` is
    /// known ([`crate::codex_session`]).
    session: Option<SessionMeter>,
}

impl CodexReader {
    /// A reader of a run launched with `model`, priced with `prices`.
    pub(crate) fn new(model: &str, prices: &PriceTable) -> Self {
        let mut report = RunReport::empty(AgentOutcome::Success);
        report.model = Some(model.to_owned());
        let price = prices.get(model).copied();
        CodexReader {
            report,
            model: model.to_owned(),
            price,
            turns: 0,
            pending_error: None,
            running_cost: price.map(|_| Usd::ZERO),
            session: None,
        }
    }

    /// This reader, also reading the session files of a run whose `HOME` is `home`.
    pub(crate) fn with_session(mut self, home: &Path, prices: &PriceTable) -> Self {
        self.session = Some(SessionMeter::new(home, &self.model, prices));
        self
    }

    /// Reads what Codex appended to its session files since the last poll.
    pub(crate) fn poll(&mut self) {
        if let Some(session) = self.session.as_mut() {
            session.poll();
        }
    }

    /// The exact cost of the usage events read so far: the price of the tokens of every
    /// `turn.completed` event (zero before the first), the same figure [`Self::finish`]
    /// reports once the output ends there. `None` when the model is unpriced (or the counts
    /// are too large to price). A turn is priced only when its `turn.completed` arrives.
    pub(crate) fn cost_so_far(&self) -> Option<Usd> {
        match &self.session {
            Some(session) if session.calls() > 0 => {
                // The session files are read on polls, stdout as it comes: the later wins.
                match (session.cost(), self.running_cost) {
                    (Some(metered), Some(printed)) => Some(metered.max(printed)),
                    (metered, _) => metered,
                }
            }
            _ => self.running_cost,
        }
    }

    /// Reads one non-blank line.
    /// Lines that cannot be read are reported in `skipped`, the rest in `warnings`.
    pub(crate) fn line(
        &mut self,
        line_no: usize,
        line: &str,
        skipped: &mut Warnings,
        warnings: &mut Warnings,
    ) {
        let Some(event) = read_object::<Event>(line_no, line, skipped) else {
            return;
        };
        let report = &mut self.report;
        match event.kind.0.as_deref() {
            Some("turn.completed") => {
                self.turns += 1;
                if let Some(previous) = self.pending_error.take() {
                    warnings.push(format!(
                        "error before a completed turn: {}",
                        previous.describe()
                    ));
                }
                let usage = event.usage.unwrap_or_default();
                let mut count = |field: &str, value: Count| -> i64 {
                    match value.0 {
                        Some(n) => n,
                        None => {
                            warnings.push(format!(
                                "line {line_no}: turn.completed usage.{field} missing or not a \
                                 token count, counted as 0"
                            ));
                            0
                        }
                    }
                };
                let input = count("input_tokens", usage.input_tokens);
                let cached = count("cached_input_tokens", usage.cached_input_tokens);
                let output = count("output_tokens", usage.output_tokens);
                // Newer Codex reports cache writes (part of the input); older has none.
                let written = usage.cache_write_input_tokens.0.unwrap_or(0);
                report.tokens = report.tokens.saturating_add(Tokens {
                    input,
                    cache_read: cached,
                    cache_write: written,
                    output,
                });
                self.running_cost = self.price.and_then(|price| price.cost(report.tokens));
            }
            Some("turn.failed") => {
                let message = event.error.and_then(|e| e.0.0);
                let message = message
                    .as_deref()
                    .unwrap_or("turn failed without a message");
                // Over the WebSocket Codex names the status in the body it prints; over
                // HTTP (through agentry's gateway) it prints the provider's body alone.
                let provider_body = crate::is_provider_body(message);
                self.pending_error = Some(match crate::provider_message(message) {
                    (Some(status), message) => AgentOutcome::ApiError {
                        status: Some(status),
                        message,
                    },
                    (None, provider) if provider_body => AgentOutcome::ApiError {
                        status: None,
                        message: provider,
                    },
                    (None, _) => AgentOutcome::Error(format!("turn failed: {}", excerpt(message))),
                });
            }
            Some("error") => {
                let message = event.message.0;
                let message = message
                    .as_deref()
                    .unwrap_or("error event without a message");
                // Keep the turn failure if one is already pending: it is the more specific.
                if self.pending_error.is_none() {
                    self.pending_error = Some(AgentOutcome::Error(excerpt(message)));
                } else {
                    warnings.push(format!("error: {}", excerpt(message)));
                }
            }
            Some("item.completed") => {
                if let Some(item) = event.item {
                    let kind = match item.kind {
                        Some(kind) => kind.0,
                        None => item.item_type.0,
                    };
                    if matches!(kind.as_deref(), Some("agent_message" | "assistant_message"))
                        && let Some(text) = item.text.0
                    {
                        report.final_text = Some(text);
                    }
                }
            }
            _ => {}
        }
    }

    /// The report of the lines read.
    pub(crate) fn finish(mut self, mut warnings: Warnings) -> RunReport {
        self.poll();
        let CodexReader {
            mut report,
            model,
            price,
            turns,
            pending_error,
            running_cost: _,
            session,
        } = self;
        report.turns = Some(i32::try_from(turns).unwrap_or(i32::MAX));
        report.outcome = if let Some(failure) = pending_error {
            failure
        } else if turns == 0 {
            AgentOutcome::Unparseable(
                "the output has no turn.completed event (cut off?); no token usage is known".into(),
            )
        } else {
            AgentOutcome::Success
        };

        report.cost_usd = if turns == 0 {
            warnings.push("no turn.completed event: tokens and cost are unknown".into());
            None
        } else {
            match price {
                None => {
                    warnings.push(format!(
                        "no price for model {:?}: cost unknown (add it to AGENTRY_PRICES_FILE)",
                        excerpt(&model)
                    ));
                    None
                }
                Some(price) => {
                    if report.tokens.cache_read > report.tokens.input {
                        warnings.push(
                            "more cached input tokens than input tokens; cached counted as input"
                                .into(),
                        );
                    }
                    let cost = price.cost(report.tokens);
                    if cost.is_none() {
                        warnings.push("the token counts are too large to price".into());
                    }
                    cost
                }
            }
        };
        if let Some(session) = session.filter(|s| s.calls() > 0) {
            // The calls Codex recorded one by one: the whole run's usage, also when it was
            // stopped before its final event.
            let metered = session.tokens();
            if turns > 0 && metered != report.tokens {
                warnings.push(format!(
                    "Codex's final usage ({:?}) differs from the {} calls of its session \
                     records ({metered:?}); the session records are used",
                    report.tokens,
                    session.calls()
                ));
            }
            // Turns count model calls, as Claude Code's `num_turns` does.
            report.turns = Some(i32::try_from(session.calls()).unwrap_or(i32::MAX));
            report.tokens = metered;
            report.cost_usd = session.cost();
            report.cost_unknown = match session.cost() {
                Some(_) => None,
                None => Some(format!(
                    "no price for model {}: add it to AGENTRY_PRICES_FILE",
                    session.unpriced().join(", ")
                )),
            };
            if turns == 0 {
                warnings.push(format!(
                    "no turn.completed event: the usage is that of the {} model calls Codex \
                     recorded in its session file",
                    session.calls()
                ));
            }
        } else if report.cost_usd.is_none() {
            report.cost_unknown = Some(if turns == 0 {
                "Codex reports its usage only when a run ends, and this one ended without \
                 reporting it (stopped or cut off before its turn.completed event), with no \
                 usage in its session files"
                    .to_owned()
            } else if price.is_none() {
                format!(
                    "no price for model {}: add it to AGENTRY_PRICES_FILE",
                    excerpt(&model)
                )
            } else {
                "the token counts are too large to price".to_owned()
            });
        }
        report.warnings = warnings.finish();
        report
    }
}
