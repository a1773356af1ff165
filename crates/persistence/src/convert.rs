//! Conversions between stored column values and domain values.

use std::str::FromStr;

use agentry_domain::Usd;
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};
use uuid::Uuid;

use crate::DbError;

/// The current UTC time at the precision the database keeps (microseconds), so that a value
/// written and read back compares equal on both backends.
pub fn now() -> OffsetDateTime {
    truncate(OffsetDateTime::now_utc())
}

fn truncate(t: OffsetDateTime) -> OffsetDateTime {
    let micros = t.microsecond();
    t.replace_nanosecond(micros * 1_000).unwrap_or(t)
}

/// `text` as a text column can hold it on both backends: without NUL characters, which
/// PostgreSQL refuses (an agent's output, quoted in an error, may have them).
pub(crate) fn text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "").into()
    } else {
        text.into()
    }
}

/// [`text`] of an optional owned value.
pub(crate) fn opt_text(value: Option<&str>) -> Option<String> {
    value.map(|v| text(v).into_owned())
}

pub(crate) fn to_db(t: OffsetDateTime) -> PrimitiveDateTime {
    let t = truncate(t.to_offset(UtcOffset::UTC));
    PrimitiveDateTime::new(t.date(), t.time())
}

pub(crate) fn opt_to_db(t: Option<OffsetDateTime>) -> Option<PrimitiveDateTime> {
    t.map(to_db)
}

pub(crate) fn from_db(t: PrimitiveDateTime) -> OffsetDateTime {
    t.assume_utc()
}

pub(crate) fn opt_from_db(t: Option<PrimitiveDateTime>) -> Option<OffsetDateTime> {
    t.map(from_db)
}

pub(crate) fn uuid(s: &str) -> Result<Uuid, DbError> {
    Uuid::parse_str(s).map_err(|_| DbError::Corrupt(format!("not a UUID: {s:?}")))
}

pub(crate) fn opt_uuid(s: Option<&str>) -> Result<Option<Uuid>, DbError> {
    s.map(uuid).transpose()
}

pub(crate) fn parse<T: FromStr>(what: &str, s: &str) -> Result<T, DbError> {
    s.parse()
        .map_err(|_| DbError::Corrupt(format!("invalid {what}: {s:?}")))
}

pub(crate) fn usd(nanos: Option<i64>) -> Result<Option<Usd>, DbError> {
    nanos.map(usd_of).transpose()
}

/// The amount of a column of nano-dollars that is never null.
pub(crate) fn usd_of(nanos: i64) -> Result<Usd, DbError> {
    Usd::from_nanos(nanos).map_err(|e| DbError::Corrupt(format!("cost {nanos}: {e}")))
}
