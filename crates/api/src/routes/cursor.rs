//! Opaque page cursors: the fields of a list position joined with `:`, base64url-encoded.
//! A cursor this API did not make is refused with one error, whatever is wrong with it.

use std::str::FromStr;

use base64::Engine;
use time::OffsetDateTime;

use crate::error::ApiError;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// 400 for a cursor that is not one of ours.
pub(crate) fn malformed() -> ApiError {
    ApiError::invalid_parameter("cursor", "malformed cursor; pass nextCursor unchanged")
}

/// The cursor of a position's `text`.
pub(crate) fn encode(text: impl AsRef<[u8]>) -> String {
    B64.encode(text)
}

/// The text of a cursor made by [`encode`].
pub(crate) fn decode(cursor: &str) -> Result<String, ApiError> {
    let bytes = B64.decode(cursor).map_err(|_| malformed())?;
    String::from_utf8(bytes).map_err(|_| malformed())
}

/// One field of a cursor's text.
pub(crate) fn field<T: FromStr>(text: &str) -> Result<T, ApiError> {
    text.parse().map_err(|_| malformed())
}

/// A time as a cursor field: whole microseconds since the epoch.
pub(crate) fn micros(at: OffsetDateTime) -> i128 {
    at.unix_timestamp_nanos() / 1_000
}

/// The time of a cursor field made by [`micros`].
pub(crate) fn time(text: &str) -> Result<OffsetDateTime, ApiError> {
    let micros: i128 = field(text)?;
    let nanos = micros.checked_mul(1_000).ok_or_else(malformed)?;
    OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| malformed())
}
