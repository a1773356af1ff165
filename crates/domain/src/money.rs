//! Exact money.
//!
//! [`Usd`] is an exact, non-negative amount of US dollars with at most nine
//! decimal places (a whole number of nano-dollars, stored as an `i64` count
//! of nano-dollars). Amounts never pass through floating point: text is
//! parsed digit by digit, and arithmetic is done on integers or
//! [`Decimal`]s.
//!
//! There are two parsers:
//!
//! - [`Usd::parse`] is strict, for amounts people write (import files, API
//!   bodies): plain decimal notation only, refusing anything it would have to
//!   round.
//! - [`Usd::from_json_number`] is lenient, for the raw text of JSON numbers
//!   printed by agents (`0.10837215000000001`, `1.2e-05`): full JSON number
//!   grammar, rounded half away from zero to nano-dollars.
//!
//! [`format_decimal`] prints any [`Decimal`] with a fixed number of
//! decimals, for summaries and percentages.

use std::fmt;

use rust_decimal::{Decimal, RoundingStrategy};

/// The number of decimal places of a [`Usd`]: amounts are whole nano-dollars.
pub const NANOS_SCALE: u32 = 9;

/// The longest excerpt of refused input quoted in [`MoneyError::Invalid`].
const MAX_QUOTED_CHARS: usize = 40;

/// Exponents beyond this magnitude are clamped while parsing; any non-zero
/// amount with such an exponent is far outside the nano-dollar range in
/// either direction, so clamping changes no result.
const EXPONENT_CLAMP: i64 = 1_000_000;

/// Why a text or number is not a valid [`Usd`] amount.
///
/// The messages are sentence fragments meant to follow a field name, e.g.
/// `"costUsd: must not be negative"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// Not a number in the accepted notation. Holds (an excerpt of) the
    /// refused text.
    #[error("not a plain decimal number: {0:?}")]
    Invalid(String),
    /// The amount is below zero (or written with a minus sign; see
    /// [`Usd::parse`]).
    #[error("must not be negative")]
    Negative,
    /// The amount has more than nine decimal places.
    #[error("must have at most 9 decimal places")]
    TooPrecise,
    /// The amount exceeds `i64::MAX` nano-dollars.
    #[error("must be at most 9223372036.854775807")]
    TooLarge,
}

impl MoneyError {
    /// An [`MoneyError::Invalid`] quoting at most [`MAX_QUOTED_CHARS`]
    /// characters of `text`.
    fn invalid(text: &str) -> Self {
        MoneyError::Invalid(crate::quote::excerpt(text, MAX_QUOTED_CHARS))
    }
}

/// An exact, non-negative amount of US dollars with at most nine decimal
/// places, no larger than `i64::MAX` nano-dollars (about 9.2 billion USD).
///
/// The inner [`Decimal`] is always normalised (no trailing fractional
/// zeros), so equality, ordering and hashing are by value and [`Display`]
/// prints the shortest plain form: `"0.123456"`, `"1.5"`, `"0"`.
///
/// Serialised as that string; deserialised from a string with
/// [`Usd::parse`].
///
/// [`Display`]: fmt::Display
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Usd(Decimal);

impl Usd {
    /// The number of decimal places of an amount (same as [`NANOS_SCALE`]).
    pub const SCALE: u32 = NANOS_SCALE;

    /// Zero dollars.
    pub const ZERO: Usd = Usd(Decimal::ZERO);

    /// Parses an amount written by a person, strictly.
    ///
    /// Accepts plain decimal notation only: one or more ASCII digits,
    /// optionally followed by `.` and one or more digits (`"12"`, `"0.123456"`,
    /// `"1.50"`, `"007"`). The result is normalised (`"1.50"` → `1.5`).
    /// Trailing fractional zeros do not count as decimal places, so
    /// `"1.5000000000"` is accepted as exactly 1.5.
    ///
    /// Refuses, with [`MoneyError::Invalid`]: the empty string, whitespace
    /// anywhere, a `+` sign, exponent notation, digit separators, `".5"` and
    /// `"5."`, and anything else. A leading `-` before an otherwise valid
    /// number gives [`MoneyError::Negative`] — even `"-0"`, since a sign is
    /// never accepted. More than nine significant decimal places give
    /// [`MoneyError::TooPrecise`]; more than `i64::MAX` nano-dollars
    /// [`MoneyError::TooLarge`].
    pub fn parse(text: &str) -> Result<Usd, MoneyError> {
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = match unsigned.split_once('.') {
            Some((int, frac)) => (int, Some(frac)),
            None => (unsigned, None),
        };
        let is_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !(is_digits(int) && frac.is_none_or(is_digits)) {
            return Err(MoneyError::invalid(text));
        }
        if negative {
            return Err(MoneyError::Negative);
        }
        let frac = frac.unwrap_or_default();
        let digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
        let exponent = -(frac.len() as i64);
        nanos_from_digits(&digits, exponent, Rounding::Exact).map(Usd::from_valid_nanos)
    }

    /// Converts the raw text of a JSON number, as printed by an agent, to an
    /// amount, rounding half away from zero to nine decimal places.
    ///
    /// Accepts exactly the JSON number grammar
    /// (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`), e.g.
    /// `"0.10837215000000001"` (→ `0.10837215`), `"1.2e-05"`, `"3E2"`, `"0"`.
    /// The value is computed exactly from the digits, never through `f64`, so
    /// only the final rounding to nano-dollars loses anything.
    ///
    /// A negative zero (`"-0"`, `"-0.0e5"`) is zero; any other negative value
    /// gives [`MoneyError::Negative`], even one that would round to zero.
    /// Values above `i64::MAX` nano-dollars after rounding give
    /// [`MoneyError::TooLarge`]; text outside the grammar
    /// [`MoneyError::Invalid`].
    pub fn from_json_number(text: &str) -> Result<Usd, MoneyError> {
        let number = JsonNumber::parse(text).ok_or_else(|| MoneyError::invalid(text))?;
        let digits: Vec<u8> = number.int.bytes().chain(number.frac.bytes()).collect();
        if number.negative && digits.iter().any(|&d| d != b'0') {
            return Err(MoneyError::Negative);
        }
        let exponent = number.exponent - number.frac.len() as i64;
        nanos_from_digits(&digits, exponent, Rounding::HalfAwayFromZero).map(Usd::from_valid_nanos)
    }

    /// Converts a [`Decimal`] exactly.
    ///
    /// Refuses negative values ([`MoneyError::Negative`]), values with more
    /// than nine significant decimal places ([`MoneyError::TooPrecise`]) and
    /// values above `i64::MAX` nano-dollars ([`MoneyError::TooLarge`]).
    /// A negative zero is zero.
    pub fn from_decimal(d: Decimal) -> Result<Usd, MoneyError> {
        if d.is_zero() {
            return Ok(Usd::ZERO);
        }
        if d.is_sign_negative() {
            return Err(MoneyError::Negative);
        }
        let d = d.normalize();
        let scale = d.scale();
        if scale > NANOS_SCALE {
            return Err(MoneyError::TooPrecise);
        }
        // |mantissa| < 2^96 and the factor is at most 10^9, so this fits.
        let nanos = d.mantissa() * 10_i128.pow(NANOS_SCALE - scale);
        i64::try_from(nanos)
            .map(Usd::from_valid_nanos)
            .map_err(|_| MoneyError::TooLarge)
    }

    /// Converts a whole number of nano-dollars (10⁻⁹ USD). Refuses negative
    /// counts.
    pub fn from_nanos(nanos: i64) -> Result<Usd, MoneyError> {
        if nanos < 0 {
            Err(MoneyError::Negative)
        } else {
            Ok(Usd::from_valid_nanos(nanos))
        }
    }

    /// The amount as a whole number of nano-dollars (10⁻⁹ USD), as stored.
    pub fn to_nanos(self) -> i64 {
        // Invariant: scale ≤ 9 and the value is in 0..=i64::MAX nanos.
        let nanos = self.0.mantissa() * 10_i128.pow(NANOS_SCALE - self.0.scale());
        i64::try_from(nanos).unwrap_or(i64::MAX)
    }

    /// The amount as a (normalised) [`Decimal`].
    pub fn as_decimal(self) -> Decimal {
        self.0
    }

    /// The sum, or `None` if it exceeds `i64::MAX` nano-dollars.
    pub fn checked_add(self, other: Usd) -> Option<Usd> {
        self.to_nanos()
            .checked_add(other.to_nanos())
            .map(Usd::from_valid_nanos)
    }

    /// The sum, or the largest amount (`i64::MAX` nano-dollars) if it would exceed it.
    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd::from_valid_nanos(self.to_nanos().saturating_add(other.to_nanos()))
    }

    /// The difference, or zero if `other` is larger.
    pub fn saturating_sub(self, other: Usd) -> Usd {
        Usd::from_valid_nanos(self.to_nanos().saturating_sub(other.to_nanos()).max(0))
    }

    /// Builds an amount from a nano-dollar count known to be non-negative.
    fn from_valid_nanos(nanos: i64) -> Usd {
        Usd(Decimal::new(nanos, NANOS_SCALE).normalize())
    }
}

impl fmt::Display for Usd {
    /// Prints the plain normalised form: `"0.123456"`, `"1.5"`, `"0"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A normalised Decimal of scale ≤ 9 displays in plain notation.
        fmt::Display::fmt(&self.0, f)
    }
}

text_form!(Usd, MoneyError, "a decimal string such as \"1.25\"");

/// Formats `value` rounded half away from zero to exactly `decimals`
/// decimal places, in plain notation.
///
/// There is no `+` sign, and a `-` only when the rounded value is non-zero:
/// `format_decimal(-0.00004, 4)` is `"0.0000"`, `format_decimal(-33.33, 1)`
/// is `"-33.3"`, `format_decimal(12.5, 4)` is `"12.5000"`,
/// `format_decimal(2.5, 0)` is `"3"` (no decimal point when `decimals` is 0).
pub fn format_decimal(value: Decimal, decimals: u32) -> String {
    let rounded = value.round_dp_with_strategy(decimals, RoundingStrategy::MidpointAwayFromZero);
    let mantissa = rounded.mantissa();
    // After rounding, the scale is at most `decimals`.
    let scale = rounded.scale().min(decimals) as usize;
    let mut digits = mantissa.unsigned_abs().to_string();
    if digits.len() <= scale {
        digits.insert_str(0, &"0".repeat(scale + 1 - digits.len()));
    }
    let (int, frac) = digits.split_at(digits.len() - scale);

    let mut out = String::with_capacity(int.len() + decimals as usize + 2);
    if mantissa < 0 {
        out.push('-');
    }
    out.push_str(int);
    if decimals > 0 {
        out.push('.');
        out.push_str(frac);
        out.extend(std::iter::repeat_n('0', decimals as usize - scale));
    }
    out
}

/// How [`nanos_from_digits`] treats digits below a nano-dollar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rounding {
    /// Refuse them with [`MoneyError::TooPrecise`].
    Exact,
    /// Round half away from zero.
    HalfAwayFromZero,
}

/// Converts the non-negative value `digits × 10^exponent` (`digits` being
/// ASCII decimal digits, possibly with leading or trailing zeros) to a
/// nano-dollar count, exactly on integers.
fn nanos_from_digits(digits: &[u8], exponent: i64, rounding: Rounding) -> Result<i64, MoneyError> {
    // Strip leading zeros (no effect on the value) and trailing zeros (moved
    // into the exponent), leaving the significant digits.
    let start = digits.iter().position(|&d| d != b'0');
    let Some(start) = start else {
        return Ok(0);
    };
    let mut significant = &digits[start..];
    let mut exponent = exponent;
    while let [rest @ .., b'0'] = significant {
        significant = rest;
        exponent = exponent.saturating_add(1);
    }
    // value = significant × 10^exponent = significant × 10^shift nanos.
    let shift = exponent.saturating_add(i64::from(NANOS_SCALE));
    let len = significant.len() as i64;

    let nanos: i128 = if shift >= 0 {
        // i64::MAX has 19 digits.
        if len.saturating_add(shift) > 19 {
            return Err(MoneyError::TooLarge);
        }
        // `shift` ≤ 18 here.
        digits_value(significant) * 10_i128.pow(shift as u32)
    } else {
        if rounding == Rounding::Exact {
            // The last significant digit is non-zero and below a nano-dollar.
            return Err(MoneyError::TooPrecise);
        }
        let dropped = shift.unsigned_abs();
        if dropped > len as u64 {
            // Less than a tenth of a nano-dollar: rounds to zero.
            0
        } else {
            let keep = (len as u64 - dropped) as usize;
            if keep > 19 {
                return Err(MoneyError::TooLarge);
            }
            let round_up = significant[keep] >= b'5';
            digits_value(&significant[..keep]) + i128::from(round_up)
        }
    };
    i64::try_from(nanos).map_err(|_| MoneyError::TooLarge)
}

/// The value of at most 19 ASCII decimal digits (fits an `i128` easily).
fn digits_value(digits: &[u8]) -> i128 {
    digits
        .iter()
        .fold(0_i128, |acc, &d| acc * 10 + i128::from(d - b'0'))
}

/// The parts of a text in JSON number grammar.
#[derive(Debug)]
struct JsonNumber<'a> {
    /// Whether it starts with `-`.
    negative: bool,
    /// The integer digits.
    int: &'a str,
    /// The fraction digits (possibly empty).
    frac: &'a str,
    /// The exponent, clamped to ±[`EXPONENT_CLAMP`].
    exponent: i64,
}

impl<'a> JsonNumber<'a> {
    /// Splits `text` if it matches
    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn parse(text: &'a str) -> Option<Self> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };

        let int_len = leading_digits(rest);
        let (int, rest) = rest.split_at(int_len);
        if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
            return None;
        }

        let (frac, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let n = leading_digits(after);
                if n == 0 {
                    return None;
                }
                after.split_at(n)
            }
            None => ("", rest),
        };

        let exponent = match rest.strip_prefix(['e', 'E']) {
            Some(after) => {
                let (sign, after) = match after.strip_prefix(['+', '-']) {
                    Some(unsigned) => (if after.starts_with('-') { -1 } else { 1 }, unsigned),
                    None => (1, after),
                };
                if after.is_empty() || leading_digits(after) != after.len() {
                    return None;
                }
                let magnitude = after.bytes().fold(0_i64, |acc, d| {
                    (acc * 10 + i64::from(d - b'0')).min(EXPONENT_CLAMP)
                });
                sign * magnitude
            }
            None if rest.is_empty() => 0,
            None => return None,
        };

        Some(JsonNumber {
            negative,
            int,
            frac,
            exponent,
        })
    }
}

/// The number of leading ASCII digits of `s`.
fn leading_digits(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

#[cfg(test)]
mod tests {

    use super::*;
    use proptest::prelude::*;

    fn usd(text: &str) -> Usd {
        Usd::parse(text).unwrap()
    }

    fn dec(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    #[test]
    fn saturating_sums_and_differences_stay_in_range() {
        let max = Usd::from_nanos(i64::MAX).unwrap();
        assert_eq!(usd("1.5").saturating_add(usd("0.25")), usd("1.75"));
        assert_eq!(max.saturating_add(usd("1")), max);
        assert_eq!(usd("1.5").saturating_sub(usd("0.25")), usd("1.25"));
        assert_eq!(usd("0.25").saturating_sub(usd("1.5")), Usd::ZERO);
        assert_eq!(usd("0.25").saturating_sub(max), Usd::ZERO);
    }

    #[test]
    fn parse_accepts_plain_decimals_and_normalises() {
        for (input, shown, nanos) in [
            ("0.123456", "0.123456", 123_456_000),
            ("12", "12", 12_000_000_000),
            ("1.50", "1.5", 1_500_000_000),
            ("0", "0", 0),
            ("0.0", "0", 0),
            ("007.10", "7.1", 7_100_000_000),
            ("0.000000001", "0.000000001", 1),
            ("1.5000000000000", "1.5", 1_500_000_000),
            ("9223372036.854775807", "9223372036.854775807", i64::MAX),
            (
                "0000000000009223372036",
                "9223372036",
                9_223_372_036_000_000_000,
            ),
        ] {
            let value = usd(input);
            assert_eq!(value.to_string(), shown, "{input}");
            assert_eq!(value.to_nanos(), nanos, "{input}");
        }
        assert_eq!(usd("1.50"), usd("1.5"));
    }

    /// Asserts that `parse` refuses each of `invalid` as [`MoneyError::Invalid`] and each
    /// input of `refused` with its error.
    fn assert_refusals(
        parse: fn(&str) -> Result<Usd, MoneyError>,
        invalid: &[&str],
        refused: &[(&str, MoneyError)],
    ) {
        for input in invalid {
            assert!(
                matches!(parse(input), Err(MoneyError::Invalid(_))),
                "{input:?} must be invalid"
            );
        }
        for (input, error) in refused {
            assert_eq!(parse(input), Err(error.clone()), "{input:?}");
        }
    }

    #[test]
    fn parse_refuses_everything_else() {
        assert_refusals(
            Usd::parse,
            &[
                "", " ", " 1", "1 ", "+1", "1e3", "1E3", "1_000", "1,5", ".5", "5.", ".", "1.2.3",
                "abc", "0x10", "NaN", "inf", "--1", "-", "١", "1.٥", "-1e3",
            ],
            &[
                ("-1", MoneyError::Negative),
                ("-0.5", MoneyError::Negative),
                ("-0", MoneyError::Negative),
                ("0.0000000001", MoneyError::TooPrecise),
                ("1.1234567891", MoneyError::TooPrecise),
                ("9223372036.854775808", MoneyError::TooLarge),
                ("10000000000", MoneyError::TooLarge),
                (
                    "99999999999999999999999999999999999999999",
                    MoneyError::TooLarge,
                ),
            ],
        );
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            MoneyError::Invalid("1e3".into()).to_string(),
            "not a plain decimal number: \"1e3\""
        );
        assert_eq!(MoneyError::Negative.to_string(), "must not be negative");
        assert_eq!(
            MoneyError::TooPrecise.to_string(),
            "must have at most 9 decimal places"
        );
        let long = "x".repeat(1000);
        let Err(MoneyError::Invalid(quoted)) = Usd::parse(&long) else {
            panic!("must be invalid");
        };
        assert_eq!(quoted.chars().count(), MAX_QUOTED_CHARS + 1);
    }

    #[test]
    fn from_json_number_rounds_float_noise() {
        for (input, shown) in [
            ("0.10837215000000001", "0.10837215"),
            ("1.2e-05", "0.000012"),
            ("3E2", "300"),
            ("3e+2", "300"),
            ("0", "0"),
            ("-0", "0"),
            ("-0.0e7", "0"),
            ("0.0000000005", "0.000000001"),
            ("0.00000000049999999999", "0"),
            ("0.0000000015", "0.000000002"),
            ("0.1234567894999", "0.123456789"),
            ("0.9999999995", "1"),
            ("1e-10", "0"),
            ("5e-10", "0.000000001"),
            ("1e-1000000000000000000000", "0"),
            ("0e999999999999999999999999", "0"),
            ("123.456e1", "1234.56"),
            ("9223372036.8547758074", "9223372036.854775807"),
        ] {
            assert_eq!(
                Usd::from_json_number(input).map(|u| u.to_string()),
                Ok(shown.to_owned()),
                "{input}"
            );
        }
    }

    #[test]
    fn from_json_number_refusals() {
        assert_refusals(
            Usd::from_json_number,
            &[
                "", " 1", "1 ", "+1", "01", "1.", ".5", "1e", "1e+", "e5", "1.5e5.5", "0x1", "NaN",
                "Infinity", "--1", "1_0", "\"1\"",
            ],
            &[
                ("-1", MoneyError::Negative),
                ("-1e-20", MoneyError::Negative),
                ("9223372036.8547758075", MoneyError::TooLarge),
                ("1e10", MoneyError::TooLarge),
                ("1e999999999999999", MoneyError::TooLarge),
            ],
        );
    }

    #[test]
    fn from_decimal_is_exact() {
        assert_eq!(Usd::from_decimal(dec("1.500")), Ok(usd("1.5")));
        assert_eq!(Usd::from_decimal(dec("-0.000")), Ok(Usd::ZERO));
        assert_eq!(Usd::from_decimal(dec("-0.01")), Err(MoneyError::Negative));
        assert_eq!(
            Usd::from_decimal(dec("0.0000000001")),
            Err(MoneyError::TooPrecise)
        );
        assert_eq!(
            Usd::from_decimal(dec("1.12345678900000")),
            Ok(usd("1.123456789"))
        );
        assert_eq!(
            Usd::from_decimal(dec("9223372036.854775808")),
            Err(MoneyError::TooLarge)
        );
        assert_eq!(Usd::from_decimal(Decimal::MAX), Err(MoneyError::TooLarge));
        assert_eq!(usd("2.5").as_decimal(), dec("2.5"));
        assert_eq!(usd("2.50").as_decimal().scale(), 1);
    }

    #[test]
    fn nanos_and_addition() {
        assert_eq!(Usd::from_nanos(-1), Err(MoneyError::Negative));
        assert_eq!(Usd::from_nanos(0), Ok(Usd::ZERO));
        assert_eq!(Usd::from_nanos(1_500_000_000).unwrap().to_string(), "1.5");
        assert_eq!(Usd::ZERO.to_nanos(), 0);
        assert_eq!(Usd::default(), Usd::ZERO);
        assert_eq!(usd("0.1").checked_add(usd("0.2")), Some(usd("0.3")));
        let max = Usd::from_nanos(i64::MAX).unwrap();
        assert_eq!(max.checked_add(Usd::ZERO), Some(max));
        assert_eq!(max.checked_add(usd("0.000000001")), None);
        assert!(usd("0.2") < usd("1.1"));
        assert_eq!(Usd::SCALE, NANOS_SCALE);
    }

    #[test]
    fn serde_uses_decimal_strings() {
        assert_eq!(serde_json::to_string(&usd("1.50")).unwrap(), "\"1.5\"");
        assert_eq!(serde_json::to_string(&Usd::ZERO).unwrap(), "\"0\"");
        assert_eq!(
            serde_json::from_str::<Usd>("\"0.25\"").unwrap(),
            usd("0.25")
        );
        assert!(serde_json::from_str::<Usd>("0.25").is_err());
        let err = serde_json::from_str::<Usd>("\"-1\"").unwrap_err();
        assert!(err.to_string().contains("must not be negative"), "{err}");
    }

    #[test]
    fn format_decimal_examples() {
        for (value, decimals, shown) in [
            ("-0.00004", 4, "0.0000"),
            ("-0.04", 1, "0.0"),
            ("-33.33", 1, "-33.3"),
            ("12.5", 4, "12.5000"),
            ("0.00005", 4, "0.0001"),
            ("-0.00005", 4, "-0.0001"),
            ("2.5", 0, "3"),
            ("-2.5", 0, "-3"),
            ("0", 0, "0"),
            ("0", 2, "0.00"),
            ("-0.0", 2, "0.00"),
            ("123.456", 2, "123.46"),
            ("0.5", 3, "0.500"),
            ("1e-28", 30, "0.000000000000000000000000000100"),
            (
                "79228162514264337593543950335",
                2,
                "79228162514264337593543950335.00",
            ),
        ] {
            let value = Decimal::from_scientific(value)
                .or_else(|_| value.parse())
                .unwrap();
            assert_eq!(
                format_decimal(value, decimals),
                shown,
                "{value} at {decimals}"
            );
        }
    }

    /// Reference for `format_decimal` on plain integers: `m × 10^-s`
    /// rounded half away from zero to `k` places.
    fn reference_format(m: i128, s: u32, k: u32) -> String {
        let scaled = if k >= s {
            m * 10_i128.pow(k - s)
        } else {
            let p = 10_i128.pow(s - k);
            let (q, r) = (m.abs() / p, m.abs() % p);
            let q = if 2 * r >= p { q + 1 } else { q };
            if m < 0 { -q } else { q }
        };
        let digits = format!("{:0>width$}", scaled.unsigned_abs(), width = k as usize + 1);
        let (int, frac) = digits.split_at(digits.len() - k as usize);
        let sign = if scaled < 0 { "-" } else { "" };
        if k == 0 {
            format!("{sign}{int}")
        } else {
            format!("{sign}{int}.{frac}")
        }
    }

    /// Reference for `from_json_number`: `mantissa × 10^exponent` with
    /// `mantissa` < 10^31, rounded half away from zero to nano-dollars.
    fn reference_json(negative: bool, mantissa: i128, exponent: i64) -> Result<Usd, MoneyError> {
        if mantissa == 0 {
            return Ok(Usd::ZERO);
        }
        if negative {
            return Err(MoneyError::Negative);
        }
        let shift = exponent + 9;
        let nanos = if shift >= 0 {
            10_i128
                .checked_pow(shift as u32)
                .and_then(|p| mantissa.checked_mul(p))
        } else {
            match 10_i128.checked_pow((-shift) as u32) {
                Some(p) => Some(mantissa / p + i128::from(2 * (mantissa % p) >= p)),
                None => Some(0),
            }
        };
        match nanos.and_then(|n| i64::try_from(n).ok()) {
            Some(n) => Usd::from_nanos(n),
            None => Err(MoneyError::TooLarge),
        }
    }

    /// The normalised form of a plain decimal text.
    fn normalised(int: &str, frac: &str) -> String {
        let int = int.trim_start_matches('0');
        let int = if int.is_empty() { "0" } else { int };
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            int.to_owned()
        } else {
            format!("{int}.{frac}")
        }
    }

    proptest! {
        #[test]
        fn nanos_display_parse_round_trip(n in 0..=i64::MAX) {
            let value = Usd::from_nanos(n).unwrap();
            let text = value.to_string();
            prop_assert!(!text.contains(['e', 'E']), "{}", text);
            if let Some((_, frac)) = text.split_once('.') {
                prop_assert!(!frac.ends_with('0'), "{}", text);
                prop_assert!(!frac.is_empty());
            }
            let back = Usd::parse(&text).unwrap();
            prop_assert_eq!(back, value);
            prop_assert_eq!(back.to_nanos(), n);
        }

        #[test]
        fn parse_display_round_trip(int in "[0-9]{1,11}", frac in "(\\.[0-9]{1,9})?") {
            let text = format!("{int}{frac}");
            let frac_digits = frac.trim_start_matches('.');
            let nanos = int.parse::<i128>().unwrap() * 1_000_000_000
                + format!("{frac_digits:0<9}").parse::<i128>().unwrap();
            match Usd::parse(&text) {
                Ok(value) => {
                    prop_assert_eq!(i128::from(value.to_nanos()), nanos);
                    let shown = value.to_string();
                    prop_assert_eq!(&shown, &normalised(&int, frac_digits));
                    prop_assert_eq!(Usd::parse(&shown), Ok(value));
                }
                Err(e) => {
                    prop_assert_eq!(e, MoneyError::TooLarge);
                    prop_assert!(nanos > i128::from(i64::MAX));
                }
            }
        }

        #[test]
        fn format_decimal_matches_integer_reference(
            m in -(1_i128 << 96) + 1..(1_i128 << 96),
            s in 0_u32..=28,
            k in 0_u32..=8,
        ) {
            let value = Decimal::from_i128_with_scale(m, s);
            let shown = format_decimal(value, k);
            prop_assert!(!shown.contains(['e', 'E', '+']));
            match shown.split_once('.') {
                Some((_, frac)) => prop_assert_eq!(frac.len(), k as usize),
                None => prop_assert_eq!(k, 0),
            }
            prop_assert_eq!(shown, reference_format(m, s, k));
        }

        #[test]
        fn format_decimal_small_values(m in -100_000_i128..100_000, s in 0_u32..=6, k in 0_u32..=6) {
            let value = Decimal::from_i128_with_scale(m, s);
            prop_assert_eq!(format_decimal(value, k), reference_format(m, s, k));
        }

        #[test]
        fn from_json_number_is_exactly_rounded(
            negative in any::<bool>(),
            int in "0|[1-9][0-9]{0,15}",
            frac in "(\\.[0-9]{1,15})?",
            exp in "([eE][+-]?[0-9]{1,2})?",
        ) {
            let sign = if negative { "-" } else { "" };
            let text = format!("{sign}{int}{frac}{exp}");
            let frac_digits = frac.trim_start_matches('.');
            let mantissa: i128 = format!("{int}{frac_digits}").parse().unwrap();
            let exponent = match exp.get(1..) {
                Some(e) if !e.is_empty() => e.parse::<i64>().unwrap(),
                _ => 0,
            } - frac_digits.len() as i64;
            prop_assert_eq!(
                Usd::from_json_number(&text),
                reference_json(negative, mantissa, exponent),
                "{}", text
            );
        }

        #[test]
        fn parsers_never_panic(text in ".*") {
            let _ = Usd::parse(&text);
            let _ = Usd::from_json_number(&text);
        }

        #[test]
        fn parsers_never_panic_on_number_like_text(
            text in "[-+]?[0-9]{0,40}(\\.[0-9]{0,40})?([eE][-+]?[0-9]{0,30})?"
        ) {
            let plain = Usd::parse(&text);
            let json = Usd::from_json_number(&text);
            // Whatever the strict parser accepts, the lenient one reads the
            // same (where the text is also valid JSON).
            if let (Ok(a), Ok(b)) = (&plain, &json) {
                prop_assert_eq!(a, b);
            }
        }
    }
}
