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

/// Serialises a [`Date`] as `YYYY-MM-DD`.
pub(crate) fn date<S: Serializer>(value: &Date, serializer: S) -> Result<S::Ok, S::Error> {
    let text = value
        .format(format_description!("[year]-[month]-[day]"))
        .map_err(serde::ser::Error::custom)?;
    serializer.serialize_str(&text)
}

/// A value with a wire form of its own: [`number`] for a [`Decimal`], [`date`] for a
/// [`Date`].
pub(crate) trait WireForm {
    /// Serialises `self` in its wire form.
    fn serialize_wire<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
}

impl WireForm for Decimal {
    fn serialize_wire<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        number(self, serializer)
    }
}

impl WireForm for Date {
    fn serialize_wire<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        date(self, serializer)
    }
}

/// Serialises an optional value in its wire form ([`WireForm`]), or null.
pub(crate) fn opt<T: WireForm, S: Serializer>(
    value: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => v.serialize_wire(serializer),
        None => serializer.serialize_none(),
    }
}
