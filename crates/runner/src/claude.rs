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
use std::fmt;

use agentry_domain::money::Usd;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::agent::{
    Count, Key, LooseStr, Message, OutputParser, Status, StrOr, any_json, fields, read_object,
    scalars,
};
use crate::{AgentOutcome, RunReport, Tokens, Warnings, excerpt};

/// The most texts of a result event's `errors` kept (the rest is skipped, not read): they
/// are quoted as one excerpt of 200 characters, and Claude Code reports one or two.
const MAX_ERRORS: usize = 20;

/// The most models of a result event's `modelUsage` read (the rest is skipped, not read,
/// and said in a warning): a run uses one to three (the main model, a small one for side
/// requests).
const MAX_MODEL_USAGES: usize = 64;

/// The longest JSON text of a figure that is re-read whole to be quoted in a warning; a
/// longer one is quoted from its text.
const MAX_QUOTED_JSON: usize = 1024;

/// The fields of the final `result` event that agentry reads. Money fields stay raw JSON
/// text so they are parsed exactly by [`Usd::from_json_number`]; so do the counts, read at
/// the end from that last event only. What is kept is bounded whatever the line holds:
/// at most [`MAX_ERRORS`] error texts and [`MAX_MODEL_USAGES`] models, the rest skipped
/// without being kept.
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
    model_usage: Option<ModelUsages>,
    errors: Option<ErrorTexts>,
}

/// `modelUsage`: the entries of its first [`MAX_MODEL_USAGES`] model names (of a name
/// repeated, the last entry), and how many entries were skipped.
#[derive(Debug, Default)]
struct ModelUsages {
    entries: BTreeMap<String, ModelUsage>,
    skipped: usize,
}

impl<'de> Deserialize<'de> for ModelUsages {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ModelUsages;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of model usages")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ModelUsages, A::Error> {
                let mut usages = ModelUsages::default();
                while let Some(Key(model)) = map.next_key::<Key<'de>>()? {
                    if usages.entries.len() < MAX_MODEL_USAGES
                        || usages.entries.contains_key(model.as_ref())
                    {
                        let usage = map.next_value::<ModelUsage>()?;
                        usages.entries.insert(model.into_owned(), usage);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                        usages.skipped += 1;
                    }
                }
                Ok(usages)
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// The non-blank texts of `errors` (each a string, or an object's `message` string), the
/// first [`MAX_ERRORS`]; anything else in it, and the rest, is skipped without being kept.
/// Any JSON is accepted: a value that is not an array has none.
#[derive(Debug, Default)]
struct ErrorTexts(Vec<String>);

any_json! {
    impl<> for ErrorTexts, V {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ErrorTexts, A::Error> {
            let mut texts = Vec::new();
            while texts.len() < MAX_ERRORS {
                let Some(item) = seq.next_element::<StrOr<Message>>()? else {
                    return Ok(ErrorTexts(texts));
                };
                let text = match item {
                    StrOr::Str(text) => Some(text),
                    StrOr::Object(message) => message.0.0,
                    StrOr::Other => None,
                };
                texts.extend(text.filter(|t| !t.trim().is_empty()));
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(ErrorTexts(texts))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ErrorTexts, A::Error> {
            IgnoredAny.visit_map(map)?;
            Ok(ErrorTexts::default())
        }
        scalars!(ErrorTexts::default());
    }
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
        for (model, usage) in event.model_usage.iter().flat_map(|u| &u.entries) {
            let mut count = |field: &str, raw: Option<&Box<RawValue>>| -> i64 {
                let Some(raw) = raw else {
                    return 0;
                };
                match token_count(raw) {
                    Some(n) => n,
                    None => {
                        warnings.push(format!(
                            "modelUsage {:?}: {field} {} is not a token count, counted as 0",
                            excerpt(model),
                            quoted(raw)
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
        match &event.model_usage {
            None => {
                warnings.push("the result event has no modelUsage; token counts are unknown".into())
            }
            Some(usages) if usages.skipped > 0 => warnings.push(format!(
                "modelUsage names {} more models than the {MAX_MODEL_USAGES} read; their \
                 tokens are not counted",
                usages.skipped
            )),
            Some(_) => {}
        }
        report.model = costliest.map(|(m, _)| m.to_owned()).or(init_model);

        report.turns = match event.num_turns.as_deref() {
            None => None,
            Some(raw) => match token_count(raw).and_then(|n| i32::try_from(n).ok()) {
                Some(n) => Some(n),
                None => {
                    warnings.push(format!("num_turns {} is not a turn count", quoted(raw)));
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

/// A status code, or `None` for `null`, a missing value or anything that is not one (an
/// array or object is skipped, not kept).
fn status_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    Ok(Status::deserialize(d)?.0)
}

/// The non-negative integer `raw` is, else `None` (read without building a JSON value).
fn token_count(raw: &RawValue) -> Option<i64> {
    serde_json::from_str::<Count>(raw.get())
        .ok()
        .and_then(|c| c.0)
}

/// `raw` as a warning quotes it: its JSON value as serde_json prints it when the text is
/// short, else an excerpt of the text (a long value is not re-read whole).
fn quoted(raw: &RawValue) -> String {
    let text = raw.get();
    if text.len() <= MAX_QUOTED_JSON
        && let Ok(value) = serde_json::from_str::<serde_json::Value>(text)
    {
        return excerpt(&value.to_string());
    }
    excerpt(text)
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
fn error_detail(errors: Option<&ErrorTexts>) -> Option<String> {
    let texts = &errors?.0;
    if texts.is_empty() {
        None
    } else {
        Some(excerpt(&texts.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result event near the line limit made of tiny errors or model entries keeps a few
    /// of them, not millions.
    #[test]
    fn a_result_event_keeps_few_errors_and_model_entries() {
        let n = 200_000;
        let mut line =
            String::from(r#"{"type":"result","subtype":"error_during_execution","errors":["#);
        line.push_str(&"1,".repeat(n));
        line.push_str(r#""the real error"],"modelUsage":{"#);
        for i in 0..n {
            line.push_str(&format!(r#""a{i:06}":{{"inputTokens":1}},"#));
        }
        line.push_str(r#""z":{"inputTokens":1}},"api_error_status":["#);
        line.push_str(&"1,".repeat(n));
        line.push_str("1]}");
        let event = serde_json::from_str::<ResultEvent>(&line).unwrap();
        let errors = event.errors.as_ref().unwrap().0.len();
        let models = event.model_usage.as_ref().unwrap().entries.len();
        assert!(errors <= 20, "{errors} errors kept");
        assert!(models <= 64, "{models} model entries kept");
        // The error text after the numbers is kept; the status array is no status.
        assert_eq!(event.errors.as_ref().unwrap().0, ["the real error"]);
        assert_eq!(event.api_error_status, None);

        // The report: the tokens of the models read, a warning for the rest, the error.
        let report = parse_claude(&line);
        assert_eq!(report.tokens.input, MAX_MODEL_USAGES as i64);
        assert!(
            report.warnings.iter().any(|w| w.contains(&format!(
                "modelUsage names {} more models than the {MAX_MODEL_USAGES} read",
                n + 1 - MAX_MODEL_USAGES
            ))),
            "{:?}",
            report.warnings
        );
        assert_eq!(
            report.outcome,
            AgentOutcome::Error("error_during_execution: the real error".into())
        );
    }

    /// What is kept of `errors`, `modelUsage` and `api_error_status` reads as before for
    /// ordinary events: texts in order, blank and non-text items left out, a model repeated
    /// read from its last entry, a status only for an integer that fits.
    #[test]
    fn result_fields_read_as_before() {
        let event = |fields: &str| {
            serde_json::from_str::<ResultEvent>(&format!(r#"{{"type":"result",{fields}}}"#))
        };
        let errors = |fields: &str| event(fields).unwrap().errors.map(|e| e.0);
        assert_eq!(
            errors(r#""errors":["a",{"message":"b"}," ",1,null,{"message":2},[],{"x":1},"c"]"#),
            Some(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()])
        );
        assert_eq!(errors(r#""errors":{"a":"b"}"#), Some(vec![]));
        assert_eq!(errors(r#""errors":"text""#), Some(vec![]));
        assert_eq!(errors(r#""errors":null"#), None);
        let many = format!(r#""errors":[{}"last"]"#, r#""e","#.repeat(2 * MAX_ERRORS));
        assert_eq!(errors(&many).unwrap().len(), MAX_ERRORS);

        let usage = event(r#""modelUsage":{"b":{"inputTokens":1},"a":{},"b":{"inputTokens":2}}"#)
            .unwrap()
            .model_usage
            .unwrap();
        assert_eq!(usage.entries.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            usage.entries["b"].input_tokens.as_ref().map(|r| r.get()),
            Some("2")
        );
        assert_eq!(usage.skipped, 0);
        assert!(event(r#""modelUsage":5"#).is_err());
        assert!(event(r#""modelUsage":{"a":5}"#).is_err());
        assert!(event(r#""modelUsage":null"#).unwrap().model_usage.is_none());

        let status = |value: &str| {
            event(&format!(r#""api_error_status":{value}"#))
                .unwrap()
                .api_error_status
        };
        assert_eq!(status("400"), Some(400));
        assert_eq!(status("null"), None);
        assert_eq!(status("-1"), None);
        assert_eq!(status("70000"), None);
        assert_eq!(status("400.0"), None);
        assert_eq!(status(r#""400""#), None);
        assert_eq!(status(r#"{"a":[400]}"#), None);
        assert_eq!(event(r#""subtype":"x""#).unwrap().api_error_status, None);
    }
}
