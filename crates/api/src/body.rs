//! Request bodies: a size-limited read, and JSON with errors that name the offending field.

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, web};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Largest JSON body accepted by the API's JSON endpoints.
pub const JSON_LIMIT: usize = 1024 * 1024;

/// Reads a whole body, refusing (413) as soon as it exceeds `limit` bytes.
pub async fn read_limited<S>(mut payload: S, limit: usize) -> Result<web::Bytes, ApiError>
where
    S: futures_util::Stream<Item = Result<web::Bytes, actix_web::error::PayloadError>> + Unpin,
{
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| match e {
            actix_web::error::PayloadError::Overflow => ApiError::payload_too_large(limit),
            other => ApiError::invalid_request(format!("could not read the request body: {other}")),
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::payload_too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Checks the request's media type (parameters such as `charset` are allowed).
pub fn require_content_type(req: &HttpRequest, expected: &str) -> Result<(), ApiError> {
    let given = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(expected) {
        Ok(())
    } else if given.is_empty() {
        Err(ApiError::invalid_request(format!(
            "Content-Type must be {expected}"
        )))
    } else {
        Err(ApiError::invalid_request(format!(
            "Content-Type must be {expected}, not {given}"
        )))
    }
}

/// Parses JSON text, which must be an object, into `T`; a failure names the member path
/// (`issueNumber: invalid type…`).
///
/// A number with a zero fraction that fits an `i64` (`6067.0`, `1e3`) is taken as that
/// integer: JSON does not tell `1.0` from `1`, and JSON Schema counts both as integers, so
/// a client (or a generator working from the OpenAPI document) may send either.
pub fn parse_json<T: DeserializeOwned>(text: &[u8]) -> Result<T, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(text)
        .map_err(|e| ApiError::invalid_request(format!("the body is not valid JSON: {e}")))?;
    // Every body of the API is an object; serde would also read a struct from an array of
    // its members in order (`[null]` for `{"monthlyBudgetUsd": null}`), which no client means.
    if !value.is_object() {
        return Err(ApiError::invalid_request("the body must be a JSON object"));
    }
    integral_numbers_as_integers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::invalid_request(format!(
                "the body does not have the expected shape: {inner}"
            ))
        } else {
            ApiError::invalid_parameter(&path, inner)
        }
    })
}

/// Replaces every float with a zero fraction within the `i64` range by that integer.
fn integral_numbers_as_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                // i64::MAX as f64 rounds up to 2^63, which does not fit: strictly less.
                && f >= i64::MIN as f64
                && f < i64::MAX as f64
            {
                *value = serde_json::Value::from(f as i64);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        serde_json::Value::Object(members) => {
            members.values_mut().for_each(integral_numbers_as_integers)
        }
        _ => {}
    }
}

/// A JSON request body: `Content-Type: application/json`, at most [`JSON_LIMIT`] bytes,
/// deserialised with field-naming errors.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = ApiError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let content_type = require_content_type(req, "application/json");
        let payload = payload.take();
        Box::pin(async move {
            content_type?;
            let bytes = read_limited(payload, JSON_LIMIT).await?;
            parse_json(&bytes).map(JsonBody)
        })
    }
}
