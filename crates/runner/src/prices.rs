//! Model prices for agents that report tokens but no cost (Codex).
//!
//! A [`PriceTable`] maps a model name to its [`ModelPrice`]: USD per million input,
//! cached-input and output tokens, as exact [`Decimal`]s. [`PriceTable::builtin`] holds
//! current OpenAI models; [`PriceTable::from_json`] reads an override file
//! (`AGENTRY_PRICES_FILE`), which [`PriceTable::merged_with`] lays over the built-in table.
//!
//! # Override file format
//!
//! One JSON object; each member is a model name mapped to an object with three decimal
//! *strings* (JSON numbers are refused, so no price ever passes through a float):
//!
//! ```json
//! {
//!   "gpt-5": {"input": "1.25", "cachedInput": "0.125", "output": "10"},
//!   "my-proxy-model": {"input": "0.5", "cachedInput": "0.05", "output": "1.5"}
//! }
//! ```
//!
//! Prices are USD per million tokens, plain decimal notation, non-negative. Unknown members
//! are refused. Every error names the model entry (and field) at fault.

use std::collections::BTreeMap;

use agentry_domain::money::Usd;
use rust_decimal::{Decimal, RoundingStrategy};

/// The prices of one model, in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPrice {
    /// Per million uncached input tokens.
    pub input: Decimal,
    /// Per million input tokens read from the prompt cache.
    pub cached_input: Decimal,
    /// Per million output tokens (reasoning tokens included).
    pub output: Decimal,
}

impl ModelPrice {
    /// The exact cost of a run, rounded half away from zero to nano-dollars:
    /// `((input − cached)·input_price + cached·cached_price + output·output_price) / 10⁶`.
    ///
    /// `input_tokens` includes the cached ones (as Codex reports them); a cached count
    /// above the input count is clamped to it. Returns `None` if a count is negative or the
    /// amount overflows.
    pub fn cost(
        &self,
        input_tokens: i64,
        cached_input_tokens: i64,
        output_tokens: i64,
    ) -> Option<Usd> {
        if input_tokens < 0 || cached_input_tokens < 0 || output_tokens < 0 {
            return None;
        }
        let cached = cached_input_tokens.min(input_tokens);
        let uncached = input_tokens - cached;
        let total = Decimal::from(uncached)
            .checked_mul(self.input)?
            .checked_add(Decimal::from(cached).checked_mul(self.cached_input)?)?
            .checked_add(Decimal::from(output_tokens).checked_mul(self.output)?)?;
        let dollars = total.checked_div(Decimal::from(1_000_000))?;
        let rounded =
            dollars.round_dp_with_strategy(Usd::SCALE, RoundingStrategy::MidpointAwayFromZero);
        Usd::from_decimal(rounded).ok()
    }
}

/// Why a price file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    /// The file is not valid JSON.
    #[error("price file is not valid JSON: {0}")]
    Json(String),
    /// The file is not a JSON object of model entries.
    #[error("price file must be a JSON object mapping model names to prices")]
    NotAnObject,
    /// One model's entry is wrong.
    #[error("price entry {model:?}: {reason}")]
    Entry {
        /// The model name of the faulty entry.
        model: String,
        /// What is wrong with it, naming the field.
        reason: String,
    },
}

/// Prices per model name (exact match).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PriceTable {
    models: BTreeMap<String, ModelPrice>,
}

/// The built-in prices: (model, input, cached input, output), USD per million tokens.
///
/// Source: OpenAI's API pricing page (<https://openai.com/api/pricing/>, also
/// <https://platform.openai.com/docs/pricing>), standard tier, as published in 2025 for the
/// GPT-5 family (gpt-5 / gpt-5-codex / gpt-5.1 / gpt-5.1-codex at $1.25 / $0.125 / $10,
/// the mini models at $0.25 / $0.025 / $2, nano at $0.05 / $0.005 / $0.40) and the older
/// models Codex can still be launched with. Prices change: override them with
/// `AGENTRY_PRICES_FILE` rather than trusting this list blindly.
const BUILTIN: &[(&str, &str, &str, &str)] = &[
    ("gpt-5", "1.25", "0.125", "10"),
    ("gpt-5-codex", "1.25", "0.125", "10"),
    ("gpt-5.1", "1.25", "0.125", "10"),
    ("gpt-5.1-codex", "1.25", "0.125", "10"),
    ("gpt-5.1-codex-max", "1.25", "0.125", "10"),
    ("gpt-5-mini", "0.25", "0.025", "2"),
    ("gpt-5.1-codex-mini", "0.25", "0.025", "2"),
    ("codex-mini-latest", "1.5", "0.375", "6"),
    ("gpt-5-nano", "0.05", "0.005", "0.4"),
    ("gpt-4.1", "2", "0.5", "8"),
    ("gpt-4.1-mini", "0.4", "0.1", "1.6"),
    ("o3", "2", "0.5", "8"),
    ("o4-mini", "1.1", "0.275", "4.4"),
];

impl PriceTable {
    /// The built-in table: OpenAI's 2025 list prices of the GPT-5 / GPT-5.1 / Codex / o-series
    /// models.
    ///
    /// Source: OpenAI's API pricing page (<https://platform.openai.com/docs/pricing>) as
    /// published in 2025, standard tier, USD per million tokens
    /// (input / cached input / output): gpt-5, gpt-5-codex, gpt-5.1, gpt-5.1-codex and
    /// gpt-5.1-codex-max 1.25 / 0.125 / 10; gpt-5-mini and gpt-5.1-codex-mini
    /// 0.25 / 0.025 / 2; gpt-5-nano 0.05 / 0.005 / 0.40; codex-mini-latest 1.50 / 0.375 / 6;
    /// gpt-4.1 and o3 2 / 0.50 / 8; gpt-4.1-mini 0.40 / 0.10 / 1.60; o4-mini
    /// 1.10 / 0.275 / 4.40. Names match exactly (no aliases, no date suffixes). Models
    /// released later (gpt-5.2 and newer) are deliberately absent: their runs record tokens
    /// and a null cost with a warning until `AGENTRY_PRICES_FILE` prices them
    /// ([`PriceTable::from_json`]), which also overrides any entry here.
    pub fn builtin() -> Self {
        let mut models = BTreeMap::new();
        for &(model, input, cached, output) in BUILTIN {
            if let (Ok(input), Ok(cached_input), Ok(output)) = (
                Decimal::from_str_exact(input),
                Decimal::from_str_exact(cached),
                Decimal::from_str_exact(output),
            ) {
                models.insert(
                    model.to_owned(),
                    ModelPrice {
                        input,
                        cached_input,
                        output,
                    },
                );
            }
        }
        PriceTable { models }
    }

    /// Reads a price file (format in the [module docs](self)).
    pub fn from_json(text: &str) -> Result<Self, PriceError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PriceError::Json(e.to_string()))?;
        let serde_json::Value::Object(entries) = value else {
            return Err(PriceError::NotAnObject);
        };
        let mut models = BTreeMap::new();
        for (model, entry) in entries {
            let bad = |reason: String| PriceError::Entry {
                model: model.clone(),
                reason,
            };
            if model.trim().is_empty() {
                return Err(bad("the model name must not be empty".into()));
            }
            let serde_json::Value::Object(fields) = entry else {
                return Err(bad(
                    "must be an object with \"input\", \"cachedInput\" and \"output\"".into(),
                ));
            };
            if let Some(unknown) = fields
                .keys()
                .find(|k| !matches!(k.as_str(), "input" | "cachedInput" | "output"))
            {
                return Err(bad(format!("unknown field {unknown:?}")));
            }
            let price = |field: &str| -> Result<Decimal, PriceError> {
                match fields.get(field) {
                    None => Err(bad(format!("{field}: missing"))),
                    Some(serde_json::Value::String(s)) => parse_price(s).ok_or_else(|| {
                        bad(format!(
                            "{field}: {s:?} is not a non-negative plain decimal"
                        ))
                    }),
                    Some(_) => Err(bad(format!(
                        "{field}: must be a decimal string such as \"1.25\""
                    ))),
                }
            };
            let parsed = ModelPrice {
                input: price("input")?,
                cached_input: price("cachedInput")?,
                output: price("output")?,
            };
            models.insert(model, parsed);
        }
        Ok(PriceTable { models })
    }

    /// This table with `overrides`' entries added or replacing same-named ones.
    pub fn merged_with(mut self, overrides: PriceTable) -> Self {
        self.models.extend(overrides.models);
        self
    }

    /// The price of `model` (exact name match), if listed.
    pub fn get(&self, model: &str) -> Option<&ModelPrice> {
        self.models.get(model)
    }

    /// The listed model names, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }
}

/// A non-negative plain decimal (`"1.25"`, `"10"`), or `None`.
fn parse_price(text: &str) -> Option<Decimal> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(int) && frac.is_none_or(digits)) {
        return None;
    }
    Decimal::from_str_exact(text).ok()
}
