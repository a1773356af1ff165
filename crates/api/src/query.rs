//! Strict query-string parsing: unknown and repeated parameters are refused, and every error
//! names the parameter (docs/contract.md#32-errors: out of range is refused, never clamped).

use std::str::FromStr;

use crate::error::ApiError;

/// The parameters of one query string, checked against the names a route accepts.
#[derive(Debug)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parses `query`; refuses names not in `allowed` and names given twice.
    pub fn parse(query: &str, allowed: &[&str]) -> Result<Query, ApiError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                let expected = if allowed.is_empty() {
                    "this route takes no query parameters".to_owned()
                } else {
                    format!("expected one of: {}", allowed.join(", "))
                };
                return Err(ApiError::invalid_parameter(
                    &name,
                    format!("unknown parameter; {expected}"),
                ));
            }
            if pairs.iter().any(|(n, _)| n == name.as_ref()) {
                return Err(ApiError::invalid_parameter(&name, "given more than once"));
            }
            pairs.push((name.into_owned(), value.into_owned()));
        }
        Ok(Query { pairs })
    }

    /// The raw value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name` parsed with `FromStr`, naming the parameter on failure.
    pub fn parsed<T>(&self, name: &str) -> Result<Option<T>, ApiError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        self.get(name)
            .map(|v| {
                v.parse::<T>()
                    .map_err(|e| ApiError::invalid_parameter(name, e))
            })
            .transpose()
    }

    /// `name` as a UUID, naming the parameter on failure (like a UUID in the path).
    pub fn uuid(&self, name: &str) -> Result<Option<uuid::Uuid>, ApiError> {
        self.get(name)
            .map(|v| crate::routes::path_uuid(name, v))
            .transpose()
    }

    /// An integer parameter within `min..=max` (plain decimal digits only).
    pub fn int_in(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let out_of_range =
            || ApiError::invalid_parameter(name, format!("must be an integer from {min} to {max}"));
        if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(out_of_range());
        }
        let n: i64 = v.parse().map_err(|_| out_of_range())?;
        if n < min || n > max {
            return Err(out_of_range());
        }
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unknown_and_repeated_names() {
        assert!(Query::parse("limit=5&limit=6", &["limit"]).is_err());
        let e = Query::parse("lmit=5", &["limit"]).unwrap_err();
        assert!(e.message().starts_with("lmit:"), "{}", e.message());
        assert!(Query::parse("", &[]).is_ok());
    }

    #[test]
    fn integers_are_strict() {
        let q = |s: &str| Query::parse(s, &["n"]).unwrap();
        assert_eq!(q("n=5").int_in("n", 1, 10).unwrap(), Some(5));
        assert_eq!(q("").int_in("n", 1, 10).unwrap(), None);
        for bad in [
            "n=0",
            "n=11",
            "n=abc",
            "n=7.5",
            "n=-1",
            "n=+5",
            "n=",
            "n=99999999999999999999999",
        ] {
            assert!(q(bad).int_in("n", 1, 10).is_err(), "{bad}");
        }
    }
}
