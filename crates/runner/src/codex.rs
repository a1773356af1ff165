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

use crate::prices::PriceTable;
use crate::{AgentOutcome, RunReport, Warnings, excerpt, json_objects, token_count};

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
/// Never panics.
pub fn parse_codex(output: &str, model: &str, prices: &PriceTable) -> RunReport {
    let mut warnings = Warnings::default();
    let mut report = RunReport::empty(AgentOutcome::Success);
    report.model = Some(model.to_owned());
    let mut turns: i64 = 0;
    let mut pending_error: Option<String> = None;

    for (line_no, _, object) in json_objects(output, &mut warnings) {
        let object = &object;
        match object.get("type").and_then(serde_json::Value::as_str) {
            Some("turn.completed") => {
                turns += 1;
                if let Some(previous) = pending_error.take() {
                    warnings.push(format!("error before a completed turn: {previous}"));
                }
                let usage = object.get("usage");
                let mut count = |field: &str| -> i64 {
                    let value = usage.and_then(|u| u.get(field));
                    match token_count(value) {
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
                let input = count("input_tokens");
                let cached = count("cached_input_tokens");
                let output = count("output_tokens");
                report.input_tokens = report.input_tokens.saturating_add(input);
                report.cache_read_tokens = report.cache_read_tokens.saturating_add(cached);
                report.output_tokens = report.output_tokens.saturating_add(output);
            }
            Some("turn.failed") => {
                let message = object
                    .get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("turn failed without a message");
                pending_error = Some(format!("turn failed: {}", excerpt(message)));
            }
            Some("error") => {
                let message = object
                    .get("message")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("error event without a message");
                // Keep the turn failure if one is already pending: it is the more specific.
                if pending_error.is_none() {
                    pending_error = Some(excerpt(message));
                } else {
                    warnings.push(format!("error: {}", excerpt(message)));
                }
            }
            Some("item.completed") => {
                let item = object.get("item");
                let kind = item
                    .and_then(|i| i.get("type").or_else(|| i.get("item_type")))
                    .and_then(serde_json::Value::as_str);
                if matches!(kind, Some("agent_message" | "assistant_message"))
                    && let Some(text) = item
                        .and_then(|i| i.get("text"))
                        .and_then(serde_json::Value::as_str)
                {
                    report.final_text = Some(text.to_owned());
                }
            }
            _ => {}
        }
    }

    report.turns = Some(i32::try_from(turns).unwrap_or(i32::MAX));
    report.outcome = if let Some(message) = pending_error {
        AgentOutcome::Error(message)
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
        match prices.get(model) {
            None => {
                warnings.push(format!(
                    "no price for model {:?}: cost unknown (add it to AGENTRY_PRICES_FILE)",
                    excerpt(model)
                ));
                None
            }
            Some(price) => {
                if report.cache_read_tokens > report.input_tokens {
                    warnings.push(
                        "more cached input tokens than input tokens; cached counted as input"
                            .into(),
                    );
                }
                let cost = price.cost(
                    report.input_tokens,
                    report.cache_read_tokens,
                    report.output_tokens,
                );
                if cost.is_none() {
                    warnings.push("the token counts are too large to price".into());
                }
                cost
            }
        }
    };
    report.warnings = warnings.finish();
    report
}
