//! Serde helpers for the report's wire form.

use rust_decimal::Decimal;
use serde::Serializer;
use time::Date;
use time::macros::format_description;

/// Serialises an exact [`Decimal`] as a JSON number.
///
/// The number is the `f64` nearest to the decimal, obtained by parsing the decimal's plain
/// string (never by float arithmetic), so `0.3` prints as `0.3`.
pub(crate) fn number<S: Serializer>(value: &Decimal, serializer: S) -> Result<S::Ok, S::Error> {
    let text = value.normalize().to_string();
    let float = text
        .parse::<f64>()
        .map_err(|e| serde::ser::Error::custom(format!("{text}: {e}")))?;
    serializer.serialize_f64(float)
}

/// Serialises an optional exact [`Decimal`] as a JSON number (as [`number`]) or null.
pub(crate) fn opt_number<S: Serializer>(
    value: &Option<Decimal>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => number(v, serializer),
        None => serializer.serialize_none(),
    }
}

/// Serialises a [`Date`] as `YYYY-MM-DD`.
pub(crate) fn date<S: Serializer>(value: &Date, serializer: S) -> Result<S::Ok, S::Error> {
    let text = value
        .format(format_description!("[year]-[month]-[day]"))
        .map_err(serde::ser::Error::custom)?;
    serializer.serialize_str(&text)
}

/// Serialises an optional [`Date`] as `YYYY-MM-DD` or null.
pub(crate) fn opt_date<S: Serializer>(
    value: &Option<Date>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(day) => date(day, serializer),
        None => serializer.serialize_none(),
    }
}
