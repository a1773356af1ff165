//! Model prices, for agents that report tokens but no cost (Codex) and for comparing what
//! an agent reports with what its tokens cost.
//!
//! A [`PriceTable`] maps a model name to its [`ModelPrice`]: USD per million input,
//! cached-input (cache read), cache-write and output tokens, as exact [`Decimal`]s.
//! [`PriceTable::builtin`] holds the current Anthropic and OpenAI models as listed on
//! [`PRICES_AS_OF`]; [`PriceTable::from_json`] reads an override file
//! (`AGENTRY_PRICES_FILE`), which [`PriceTable::merged_with`] lays over the built-in table.
//!
//! # Override file format
//!
//! One JSON object; each member is a model name mapped to an object with decimal *strings*
//! (JSON numbers are refused, so no price ever passes through a float): `input`,
//! `cachedInput` and `output` (required), `cacheWrite` (optional; without it a cache
//! write costs as much as uncached input), and `maxOutputTokens` (optional, a positive
//! integer: the most output tokens one call of the model can produce; without it
//! [`DEFAULT_MAX_OUTPUT_TOKENS`], used to reserve a call that does not name its own limit):
//!
//! ```json
//! {
//!   "gpt-6.1-sol": {"input": "2", "cachedInput": "0.1", "cacheWrite": "2.5", "output": "10"},
//!   "my-proxy-model": {"input": "0.5", "cachedInput": "0.05", "output": "1.5",
//!                      "maxOutputTokens": 16384}
//! }
//! ```
//!
//! Prices are USD per million tokens, plain decimal notation, non-negative. Unknown members
//! are refused. Every error names the model entry (and field) at fault.

use std::collections::BTreeMap;

/// The token counts a price is applied to (defined in the domain).
pub use agentry_domain::Tokens;
use agentry_domain::money::Usd;
use rust_decimal::{Decimal, RoundingStrategy};

/// The prices of one model, in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPrice {
    /// Per million uncached input tokens.
    pub input: Decimal,
    /// Per million input tokens read from the prompt cache.
    pub cached_input: Decimal,
    /// Per million input tokens written to the prompt cache (Anthropic's 5-minute cache
    /// write; OpenAI's cache write where it is charged); `None` charges them as uncached
    /// input.
    pub cache_write: Option<Decimal>,
    /// Per million output tokens (reasoning tokens included).
    pub output: Decimal,
    /// The most output tokens one call can produce; `None`: [`DEFAULT_MAX_OUTPUT_TOKENS`].
    pub max_output_tokens: Option<u32>,
}

/// The most output tokens a call of a model is taken to produce when neither the call
/// (`max_tokens`, `max_output_tokens`) nor the price table says: at least the largest
/// output limit of the models listed, so a reservation made with it is never short.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 128_000;

impl ModelPrice {
    /// The exact cost of `tokens`, rounded half away from zero to nano-dollars:
    /// `(uncached·input + cache_read·cached_input + cache_write·cache_write_price +
    /// output·output) / 10⁶`, where uncached = input − cache_read − cache_write.
    ///
    /// The cache parts are clamped so that they never exceed the input (cache reads
    /// first). Returns `None` if a count is negative or the amount overflows.
    pub fn cost(&self, tokens: Tokens) -> Option<Usd> {
        self.cost_with_one_hour_writes(tokens, 0)
    }

    /// The exact cost of `tokens` of which `one_hour_writes` cache writes went to Anthropic's
    /// 1-hour prompt cache, at [`ModelPrice::one_hour_cache_write`]; the other cache writes
    /// at [`ModelPrice::cache_write`], the rest as [`ModelPrice::cost`] says. The 1-hour
    /// writes are clamped to the cache writes. `None` if a count is negative or the amount
    /// overflows.
    pub fn cost_with_one_hour_writes(&self, tokens: Tokens, one_hour_writes: i64) -> Option<Usd> {
        let Tokens {
            input,
            cache_read,
            cache_write,
            output,
        } = tokens;
        if input < 0 || cache_read < 0 || cache_write < 0 || output < 0 || one_hour_writes < 0 {
            return None;
        }
        let read = cache_read.min(input);
        let write = cache_write.min(input - read);
        let one_hour = one_hour_writes.min(write);
        let uncached = input - read - write;
        let mut total = Decimal::from(uncached)
            .checked_mul(self.input)?
            .checked_add(Decimal::from(read).checked_mul(self.cached_input)?)?
            .checked_add(
                Decimal::from(write - one_hour)
                    .checked_mul(self.cache_write.unwrap_or(self.input))?,
            )?
            .checked_add(Decimal::from(output).checked_mul(self.output)?)?;
        if one_hour > 0 {
            total = total
                .checked_add(Decimal::from(one_hour).checked_mul(self.one_hour_cache_write()?)?)?;
        }
        to_usd(total, RoundingStrategy::MidpointAwayFromZero)
    }

    /// Per million input tokens written to Anthropic's 1-hour prompt cache (`cache_control`
    /// with `"ttl": "1h"`): twice the input price, as Anthropic lists it for every model (the
    /// 5-minute write, [`ModelPrice::cache_write`], is 1.25× input). `None` on overflow.
    pub fn one_hour_cache_write(&self) -> Option<Decimal> {
        self.input.checked_mul(Decimal::TWO)
    }

    /// The most a call with at most `input` input tokens and `output` output tokens can
    /// cost, rounded up to nano-dollars: every input token at the dearer of the input and
    /// cache-write prices (a cache read is cheaper than both), every output token at the
    /// output price. `None` on overflow.
    pub fn max_cost(&self, input: u64, output: u64) -> Option<Usd> {
        let input_price = self.input.max(self.cache_write.unwrap_or(self.input));
        let total = Decimal::from(input)
            .checked_mul(input_price)?
            .checked_add(Decimal::from(output).checked_mul(self.output)?)?;
        to_usd(total, RoundingStrategy::AwayFromZero)
    }

    /// The output limit of one call: [`ModelPrice::max_output_tokens`], else
    /// [`DEFAULT_MAX_OUTPUT_TOKENS`].
    pub fn output_limit(&self) -> u32 {
        self.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS)
    }
}

/// `total` USD-per-million-tokens × tokens, as dollars rounded to nano-dollars by `rounding`.
fn to_usd(total: Decimal, rounding: RoundingStrategy) -> Option<Usd> {
    let dollars = total.checked_div(Decimal::from(1_000_000))?;
    Usd::from_decimal(dollars.round_dp_with_strategy(Usd::SCALE, rounding)).ok()
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

/// The date the built-in prices were taken from the providers' price lists.
pub const PRICES_AS_OF: &str = "2026-11-25";

/// The built-in prices: (model, input, cached input / cache read, cache write, output), USD
/// per million tokens, standard tier, as listed on [`PRICES_AS_OF`]. An empty cache-write
/// price charges cache writes as input. docs/runner.md lists the source of each line.
const BUILTIN: &[(&str, &str, &str, &str, &str)] = &[
    // Anthropic (platform.claude.com/docs/en/about-claude/pricing and the model pages):
    // a 5-minute cache write is 1.25× input, a cache read 0.1× input. Claude Code 2.1
    // resolves `sonnet` to claude-sonnet-5, `opus` to claude-opus-4-8 and `haiku` to
    // claude-haiku-4-5-20251001; the CLI itself prices claude-sonnet-5 at 3 / 15, not at
    // the listed 2 / 10.
    ("claude-sonnet-5", "2", "0.2", "2.5", "10"),
    ("claude-sonnet-4-6", "3", "0.3", "3.75", "15"),
    ("claude-sonnet-4-5", "3", "0.3", "3.75", "15"),
    ("claude-sonnet-4-5-20250929", "3", "0.3", "3.75", "15"),
    ("claude-opus-5", "5", "0.5", "6.25", "25"),
    ("claude-opus-4-8", "5", "0.5", "6.25", "25"),
    ("claude-opus-4-7", "5", "0.5", "6.25", "25"),
    ("claude-opus-4-6", "5", "0.5", "6.25", "25"),
    ("claude-opus-4-5", "5", "0.5", "6.25", "25"),
    ("claude-opus-4-1", "15", "1.5", "18.75", "75"),
    ("claude-fable-5", "10", "1", "12.5", "50"),
    ("claude-haiku-4-5", "1", "0.1", "1.25", "5"),
    ("claude-haiku-4-5-20251001", "1", "0.1", "1.25", "5"),
    // OpenAI (developers.openai.com/api/docs/models/<model>): the GPT-6 and GPT-5.6
    // families charge cache writes at 1.25× input (30-minute retention).
    ("gpt-6-astra", "10", "1", "12.5", "50"),
    ("gpt-6.1-sol", "2", "0.1", "2.5", "10"),
    ("gpt-6.1-terra", "1", "0.05", "1.25", "5"),
    ("gpt-6-sol", "2", "0.2", "2.5", "10"),
    ("gpt-6-luna", "0.1", "0.01", "0.125", "0.5"),
    ("gpt-5.6-sol", "5", "0.5", "6.25", "30"),
    ("gpt-5.6-terra", "2", "0.2", "2.5", "12"),
    ("gpt-5.6-luna", "0.2", "0.02", "0.25", "1.2"),
    ("gpt-5.5", "5", "0.5", "", "30"),
    ("gpt-5.2", "1.75", "0.175", "", "14"),
    ("gpt-5.1", "1.25", "0.125", "", "10"),
    ("gpt-5.1-codex", "1.25", "0.125", "", "10"),
    ("gpt-5.1-codex-max", "1.25", "0.125", "", "10"),
    ("gpt-5.1-codex-mini", "0.25", "0.025", "", "2"),
    ("gpt-5", "1.25", "0.125", "", "10"),
    ("gpt-5-codex", "1.25", "0.125", "", "10"),
    ("gpt-5-mini", "0.25", "0.025", "", "2"),
    ("gpt-5-nano", "0.05", "0.005", "", "0.4"),
    ("codex-mini-latest", "1.5", "0.375", "", "6"),
    ("gpt-4.1", "2", "0.5", "", "8"),
    ("gpt-4.1-mini", "0.4", "0.1", "", "1.6"),
    ("o3", "2", "0.5", "", "8"),
    ("o4-mini", "1.1", "0.275", "", "4.4"),
];

impl PriceTable {
    /// The built-in table: the list prices of current Anthropic and OpenAI models as of
    /// [`PRICES_AS_OF`] (standard tier; long-context, priority and batch tiers are not
    /// applied). Names match exactly or without a date suffix ([`PriceTable::get`]; no
    /// aliases: `sonnet` is not a model id). Prices change: `AGENTRY_PRICES_FILE`
    /// ([`PriceTable::from_json`]) overrides any entry and adds models; the gateway refuses
    /// a call to a model absent from both, and a cost computed from an agent's report for
    /// one is null, never zero.
    pub fn builtin() -> Self {
        let decimal = |text: &str| Decimal::from_str_exact(text).ok();
        let models = BUILTIN
            .iter()
            .filter_map(|&(model, input, cached, write, output)| {
                let price = ModelPrice {
                    input: decimal(input)?,
                    cached_input: decimal(cached)?,
                    cache_write: if write.is_empty() {
                        None
                    } else {
                        Some(decimal(write)?)
                    },
                    output: decimal(output)?,
                    max_output_tokens: None,
                };
                Some((model.to_owned(), price))
            })
            .collect();
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
                    "must be an object with \"input\", \"cachedInput\", \"output\" and \
                     optionally \"cacheWrite\" and \"maxOutputTokens\""
                        .into(),
                ));
            };
            if let Some(unknown) = fields.keys().find(|k| {
                !matches!(
                    k.as_str(),
                    "input" | "cachedInput" | "cacheWrite" | "output" | "maxOutputTokens"
                )
            }) {
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
                cache_write: if fields.contains_key("cacheWrite") {
                    Some(price("cacheWrite")?)
                } else {
                    None
                },
                output: price("output")?,
                max_output_tokens: match fields.get("maxOutputTokens") {
                    None => None,
                    Some(value) => Some(
                        value
                            .as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .filter(|n| *n > 0)
                            .ok_or_else(|| {
                                bad(format!(
                                    "maxOutputTokens: {value} is not a positive integer of at \
                                     most {}",
                                    u32::MAX
                                ))
                            })?,
                    ),
                },
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

    /// The price of `model`, if listed: by its exact name, else (for a dated id such as
    /// `claude-haiku-4-5-20251001` or `gpt-5-2025-08-07` that is not listed itself) by the
    /// name without its date.
    pub fn get(&self, model: &str) -> Option<&ModelPrice> {
        self.models
            .get(model)
            .or_else(|| undated(model).and_then(|base| self.models.get(base)))
    }

    /// The listed model names, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }
}

/// `model` without a trailing date (`-YYYYMMDD` or `-YYYY-MM-DD`), if it has one.
fn undated(model: &str) -> Option<&str> {
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let compact = model.rsplit_once('-').filter(|(base, date)| {
        !base.is_empty() && date.len() == 8 && digits(date) && date.starts_with("20")
    });
    if let Some((base, _)) = compact {
        return Some(base);
    }
    let mut parts = model.rsplitn(4, '-');
    let (day, month, year, base) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let dated = year.len() == 4
        && year.starts_with("20")
        && month.len() == 2
        && day.len() == 2
        && digits(year)
        && digits(month)
        && digits(day);
    (dated && !base.is_empty()).then_some(base)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_ids_are_priced_as_their_model_and_nothing_else_is_guessed() {
        let table = PriceTable::builtin();
        let sonnet = table.get("claude-sonnet-5").copied();
        assert!(sonnet.is_some());
        assert_eq!(table.get("claude-sonnet-5-20261101").copied(), sonnet);
        let gpt5 = table.get("gpt-5").copied();
        assert_eq!(table.get("gpt-5-2025-08-07").copied(), gpt5);
        // A listed dated id keeps its own entry.
        assert!(table.get("claude-haiku-4-5-20251001").is_some());
        for unknown in [
            "sonnet",
            "claude-sonnet-5-latest",
            "claude-sonnet-5-2026110",
            "claude-sonnet-5-19991231",
            "gpt-5-2025-8-07",
            "-20251001",
            "20251001",
            "claude-unknown-20251001",
            "",
        ] {
            assert!(table.get(unknown).is_none(), "{unknown:?} was priced");
        }
    }

    #[test]
    fn the_largest_cost_of_a_call_rounds_up_at_the_dearest_input_price() {
        let price = ModelPrice {
            input: Decimal::from(2),
            cached_input: Decimal::from_str_exact("0.2").unwrap(),
            cache_write: Some(Decimal::from_str_exact("2.5").unwrap()),
            output: Decimal::from(10),
            max_output_tokens: None,
        };
        // 1,000 input at $2.5 + 100 output at $10 per million = $0.0035.
        assert_eq!(price.max_cost(1_000, 100), Usd::parse("0.0035").ok());
        // One token at $2.5 per million is $0.0000025: rounded up, never down.
        assert_eq!(price.max_cost(1, 0), Usd::parse("0.000002500").ok());
        let third = ModelPrice {
            input: Decimal::from_str_exact("0.000001").unwrap(),
            cache_write: None,
            ..price
        };
        assert_eq!(third.max_cost(1, 0), Usd::parse("0.000000001").ok());
        assert_eq!(price.output_limit(), DEFAULT_MAX_OUTPUT_TOKENS);
        assert_eq!(price.max_cost(u64::MAX, u64::MAX), None);
    }

    #[test]
    fn a_price_file_may_give_the_output_limit() {
        let table = PriceTable::from_json(
            r#"{"m": {"input": "1", "cachedInput": "0.1", "output": "2", "maxOutputTokens": 16384}}"#,
        )
        .unwrap();
        assert_eq!(table.get("m").map(ModelPrice::output_limit), Some(16_384));
        for bad in ["0", "-1", "1.5", "\"100\"", "4294967296"] {
            let text = format!(
                r#"{{"m": {{"input": "1", "cachedInput": "0.1", "output": "2", "maxOutputTokens": {bad}}}}}"#
            );
            let err = PriceTable::from_json(&text).unwrap_err().to_string();
            assert!(err.contains("maxOutputTokens"), "{bad}: {err}");
        }
    }
}
