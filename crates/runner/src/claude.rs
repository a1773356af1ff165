//! The parser of Claude Code's `claude -p --output-format stream-json --verbose` output.
//!
//! The output is one JSON object per line: a `system`/`init` event (with the `model`), then
//! `assistant` and `user` events, and last a `result` event:
//!
//! ```json
//! {"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"Done.",
//!  "total_cost_usd":0.123456,"usage":{…},
//!  "modelUsage":{"claude-sonnet-4-5-20250929":{"inputTokens":12,"outputTokens":845,
//!    "cacheReadInputTokens":40100,"cacheCreationInputTokens":9200,"costUSD":0.118…}}}
//! ```
//!
//! `subtype` is `success`, `error_max_turns`, `error_max_budget_usd` or
//! `error_during_execution`. Cost and tokens exist only in the `result` event: output cut
//! off before it reports no cost at all.

use std::collections::BTreeMap;

use agentry_domain::money::Usd;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::agent::{List, LooseStr, Message, OutputParser, StrOr, fields, read_object};
use crate::{AgentOutcome, RunReport, Tokens, Warnings, excerpt, token_count};

/// The fields of the final `result` event that agentry reads. Money fields stay raw JSON
/// text so they are parsed exactly by [`Usd::from_json_number`]; so do the counts, read at
/// the end from that last event only.
#[derive(Debug, Deserialize)]
pub(crate) struct ResultEvent {
    subtype: Option<String>,
    is_error: Option<bool>,
    /// The HTTP status of a model API error (`null` otherwise).
    #[serde(default, deserialize_with = "status_or_none")]
    api_error_status: Option<u16>,
    num_turns: Option<Box<RawValue>>,
    result: Option<LooseStr>,
    total_cost_usd: Option<Box<RawValue>>,
    #[serde(rename = "modelUsage")]
    model_usage: Option<BTreeMap<String, ModelUsage>>,
    errors: Option<List<StrOr<Message>>>,
}

/// One model's entry of `modelUsage`.
#[derive(Debug, Deserialize)]
struct ModelUsage {
    #[serde(rename = "inputTokens")]
    input_tokens: Option<Box<RawValue>>,
    #[serde(rename = "outputTokens")]
    output_tokens: Option<Box<RawValue>>,
    #[serde(rename = "cacheReadInputTokens")]
    cache_read_input_tokens: Option<Box<RawValue>>,
    #[serde(rename = "cacheCreationInputTokens")]
    cache_creation_input_tokens: Option<Box<RawValue>>,
    #[serde(rename = "costUSD")]
    cost_usd: Option<Box<RawValue>>,
}

/// The top-level fields of any event: enough to recognise `system`/`init` (and its model)
/// and `result` events.
#[derive(Debug, Default)]
struct Event {
    kind: LooseStr,
    subtype: LooseStr,
    model: LooseStr,
}

fields!(Event {
    "type" => kind: value,
    "subtype" => subtype: value,
    "model" => model: value,
});

/// Reads Claude Code output line by line (see [`parse_claude`]).
#[derive(Debug, Default)]
pub(crate) struct ClaudeReader {
    init_model: Option<String>,
    /// The last `result` event: its line number and its fields, or why they could not be
    /// read.
    last_result: Option<(usize, Result<ResultEvent, String>)>,
    results_seen: usize,
}

/// Parses the whole stdout of a Claude Code run.
///
/// - Lines that are not JSON objects (stderr noise) are skipped with a warning.
/// - The model of the `system`/`init` event is remembered as a fallback.
/// - The last `result` event gives: cost = `total_cost_usd` exactly; tokens summed over
///   `modelUsage` (input = `inputTokens` + `cacheReadInputTokens` +
///   `cacheCreationInputTokens`, the two cache parts also reported separately; output =
///   `outputTokens`); model = the `modelUsage` key with the largest `costUSD` (compared
///   exactly; ties go to the first name in sorted order), else the init model;
///   turns = `num_turns`; final text = `result`; outcome from `subtype`/`is_error`.
/// - No `result` event → [`AgentOutcome::Unparseable`], no cost and zero tokens (Claude
///   Code reports neither before that event), the init model if seen.
///
/// The same as an [`OutputParser::claude`] fed `output`. Never panics.
pub fn parse_claude(output: &str) -> RunReport {
    let mut parser = OutputParser::claude();
    parser.feed(output.as_bytes());
    parser.finish()
}

impl ClaudeReader {
    /// Reads one non-blank line.
    /// Lines that cannot be read are reported in `skipped`.
    pub(crate) fn line(&mut self, line_no: usize, line: &str, skipped: &mut Warnings) {
        let Some(event) = read_object::<Event>(line_no, line, skipped) else {
            return;
        };
        match event.kind.0.as_deref() {
            Some("system") => {
                if event.subtype.0.as_deref() == Some("init")
                    && let Some(model) = event.model.0
                {
                    self.init_model = Some(model);
                }
            }
            Some("result") => {
                self.results_seen += 1;
                let fields = serde_json::from_str::<ResultEvent>(line).map_err(|e| e.to_string());
                self.last_result = Some((line_no, fields));
            }
            _ => {}
        }
    }

    /// The report of the lines read.
    pub(crate) fn finish(self, mut warnings: Warnings) -> RunReport {
        let ClaudeReader {
            init_model,
            last_result,
            results_seen,
        } = self;
        if results_seen > 1 {
            warnings.push(format!(
                "{results_seen} result events; the last one is used"
            ));
        }

        let Some((line_no, fields)) = last_result else {
            let mut report = RunReport::empty(AgentOutcome::Unparseable(
                "the output ended without a result event (cut off?); Claude Code reports cost \
                 and tokens only in that event, so none are known"
                    .into(),
            ));
            report.cost_unknown = Some(
                "Claude Code reports what it spent only in its final result event, which it \
                 did not print (it was killed, or crashed, before)"
                    .into(),
            );
            report.model = init_model;
            report.warnings = warnings.finish();
            return report;
        };

        let mut event = match fields {
            Ok(e) => e,
            Err(e) => {
                let mut report = RunReport::empty(AgentOutcome::Unparseable(format!(
                    "line {line_no}: the result event has an unexpected shape: {}",
                    excerpt(&e)
                )));
                report.cost_unknown =
                    Some("Claude Code's result event could not be read".to_owned());
                report.model = init_model;
                report.warnings = warnings.finish();
                return report;
            }
        };

        let mut report = RunReport::empty(AgentOutcome::Success);

        // Cost, exactly from the JSON text.
        report.cost_usd = match &event.total_cost_usd {
            None => {
                warnings.push("the result event has no total_cost_usd".into());
                report.cost_unknown = Some("Claude Code's result event has no cost".into());
                None
            }
            Some(raw) => match Usd::from_json_number(raw.get()) {
                Ok(cost) => Some(cost),
                Err(e) => {
                    let why = format!(
                        "total_cost_usd {} is not a valid amount: {e}",
                        excerpt(raw.get())
                    );
                    warnings.push(why.clone());
                    report.cost_unknown = Some(why);
                    None
                }
            },
        };

        // Tokens and the costliest model.
        let mut costliest: Option<(&str, Usd)> = None;
        for (model, usage) in event.model_usage.iter().flatten() {
            let mut count = |field: &str, raw: Option<&Box<RawValue>>| -> i64 {
                let value = raw.map(|raw| json_value(raw));
                let value = value.as_ref();
                match (value, token_count(value)) {
                    (_, Some(n)) => n,
                    (None, None) => 0,
                    (Some(v), None) => {
                        warnings.push(format!(
                            "modelUsage {:?}: {field} {} is not a token count, counted as 0",
                            excerpt(model),
                            excerpt(&v.to_string())
                        ));
                        0
                    }
                }
            };
            let input = count("inputTokens", usage.input_tokens.as_ref());
            let read = count(
                "cacheReadInputTokens",
                usage.cache_read_input_tokens.as_ref(),
            );
            let write = count(
                "cacheCreationInputTokens",
                usage.cache_creation_input_tokens.as_ref(),
            );
            let output = count("outputTokens", usage.output_tokens.as_ref());
            report.tokens = report
                .tokens
                .saturating_add(Tokens::from_uncached(input, read, write, output));

            if let Some(raw) = &usage.cost_usd {
                match Usd::from_json_number(raw.get()) {
                    Ok(cost) => {
                        if costliest.is_none_or(|(_, best)| cost > best) {
                            costliest = Some((model, cost));
                        }
                    }
                    Err(e) => warnings.push(format!(
                        "modelUsage {:?}: costUSD {} is not a valid amount: {e}",
                        excerpt(model),
                        excerpt(raw.get())
                    )),
                }
            }
        }
        if event.model_usage.is_none() {
            warnings.push("the result event has no modelUsage; token counts are unknown".into());
        }
        report.model = costliest.map(|(m, _)| m.to_owned()).or(init_model);

        report.turns = match event.num_turns.as_deref().map(json_value) {
            None => None,
            Some(v) => match v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .filter(|n| *n >= 0)
            {
                Some(n) => Some(n),
                None => {
                    warnings.push(format!(
                        "num_turns {} is not a turn count",
                        excerpt(&v.to_string())
                    ));
                    None
                }
            },
        };

        report.final_text = event.result.take().and_then(|text| text.0);

        report.outcome = outcome(&event, report.final_text.as_deref());
        report.warnings = warnings.finish();
        report
    }
}

/// A status code, or `None` for `null`, a missing value or anything that is not one.
fn status_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(value.as_u64().and_then(|s| u16::try_from(s).ok()))
}

/// The JSON value of `raw` text (already checked to be JSON when its line was read).
fn json_value(raw: &RawValue) -> serde_json::Value {
    serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null)
}

/// The outcome of a `result` event. A model API error is reported as `subtype: success`
/// with `is_error: true`, `api_error_status` and a `result` like `API Error: 400 <body>`.
fn outcome(event: &ResultEvent, final_text: Option<&str>) -> AgentOutcome {
    let is_error = event.is_error.unwrap_or(false);
    if is_error && let Some(status) = event.api_error_status {
        let text = final_text.unwrap_or_default().trim();
        let text = text
            .strip_prefix("API Error:")
            .map(str::trim_start)
            .map(|t| t.strip_prefix(&status.to_string()).unwrap_or(t))
            .unwrap_or(text);
        let (_, message) = crate::provider_message(text);
        return AgentOutcome::ApiError {
            status: Some(status),
            message,
        };
    }
    match event.subtype.as_deref() {
        Some("success") | None if !is_error => AgentOutcome::Success,
        Some("error_max_turns") => AgentOutcome::MaxTurns,
        Some("error_max_budget_usd") => AgentOutcome::MaxBudget,
        subtype => {
            let detail = error_detail(event.errors.as_ref())
                .or_else(|| final_text.filter(|t| !t.trim().is_empty()).map(excerpt));
            let subtype = subtype.map_or_else(|| "error".to_owned(), excerpt);
            AgentOutcome::Error(match detail {
                Some(detail) => format!("{subtype}: {detail}"),
                None => format!("{subtype}: the agent reported an error"),
            })
        }
    }
}

/// The `errors` array of a result event as one sentence, if it has any text.
fn error_detail(errors: Option<&List<StrOr<Message>>>) -> Option<String> {
    let items = errors?.0.as_ref()?;
    let texts: Vec<&str> = items
        .iter()
        .filter_map(|e| match e {
            StrOr::Str(s) => Some(s.as_str()),
            StrOr::Object(message) => message.0.0.as_deref(),
            StrOr::Other => None,
        })
        .filter(|s| !s.trim().is_empty())
        .collect();
    if texts.is_empty() {
        None
    } else {
        Some(excerpt(&texts.join("; ")))
    }
}
