//! `PUT /api/secrets/{name}`, `GET /api/secrets`, `DELETE /api/secrets/{name}` (admin,
//! docs/contract.md#33-secrets). Values are encrypted at rest and never returned or logged.

use actix_web::{HttpResponse, delete, get, put, web};
use agentry_persistence::secrets::{SecretInfo, SecretValue};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::{ObjectBuilder, Type};
use utoipa::{IntoParams, ToSchema};

use crate::auth::AdminRole;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::routes::{
    AdminReadErrors, Authorized, BodyErrors, ChangeErrors, CodeHostErrors, PathParam, Target,
    parameter,
};
use crate::state::AppState;

/// Longest secret name.
const MAX_NAME_CHARS: usize = 64;
/// Largest secret value, in bytes.
const MAX_VALUE_BYTES: usize = 16 * 1024;

/// A secret's new value.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSecret {
    /// The value (1 to 16 KiB, not blank). Never returned.
    #[schema(min_length = 1, max_length = 16384, pattern = r"[^\s\u0085]")]
    pub value: String,
}

/// A stored secret (never its value).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretDto {
    /// Name, e.g. `CODEHOST_TOKEN`.
    pub name: String,
    /// When it was first stored.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When its value last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl From<SecretInfo> for SecretDto {
    fn from(s: SecretInfo) -> Self {
        SecretDto {
            name: s.name,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// The stored secrets.
#[derive(Serialize, ToSchema)]
pub struct SecretListDto {
    /// By name.
    pub secrets: Vec<SecretDto>,
}

/// `{name}`: a secret's name (an upper-case letter, then upper-case letters, digits and
/// `_`, at most 64 characters).
pub struct SecretName;

impl PathParam for SecretName {
    type Value = String;

    fn parse(segment: &str) -> Result<String, ApiError> {
        check_name(segment)?;
        Ok(segment.to_owned())
    }
}

impl IntoParams for SecretName {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(
                "^[A-Z][A-Z0-9_]{{0,{}}}$",
                MAX_NAME_CHARS - 1
            )));
        vec![parameter(
            "name",
            ParameterIn::Path,
            "Secret name, e.g. CODEHOST_TOKEN",
            schema,
        )]
    }
}

/// Checks a secret name: an upper-case letter, then upper-case letters, digits and `_`.
fn check_name(name: &str) -> Result<(), ApiError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= MAX_NAME_CHARS;
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid_parameter(
            "name",
            format!(
                "must be an upper-case letter followed by upper-case letters, digits or _, at \
                 most {MAX_NAME_CHARS} characters (e.g. CODEHOST_TOKEN)"
            ),
        ))
    }
}

/// Stores a secret, replacing any earlier value. `CODEHOST_TOKEN` is first checked against
/// the code host (`GET /user`); a token it refuses is not stored (422).
#[utoipa::path(
    tag = "secrets",
    params(SecretName),
    request_body = PutSecret,
    responses(
        (status = 200, body = SecretDto),
        BodyErrors,
        CodeHostErrors,
    ),
)]
#[put("/secrets/{name}")]
pub async fn put_secret(
    Target {
        caller,
        id: name,
        body,
        ..
    }: Target<AdminRole, SecretName, JsonBody<PutSecret>>,
    state: web::Data<AppState>,
) -> Result<web::Json<SecretDto>, ApiError> {
    let value = SecretValue::new(body.0.value);
    if value.expose().trim().is_empty() || value.expose().len() > MAX_VALUE_BYTES {
        return Err(ApiError::invalid_parameter(
            "value",
            format!("must be a non-blank string of at most {MAX_VALUE_BYTES} bytes"),
        ));
    }
    let info = state.service.store_secret(name.clone(), value).await?;
    tracing::info!(secret = %name, by = %caller.token_id, "secret stored");
    Ok(web::Json(info.into()))
}

/// Lists the stored secrets: names and times, never values.
#[utoipa::path(
    tag = "secrets",
    responses((status = 200, body = SecretListDto), AdminReadErrors),
)]
#[get("/secrets")]
pub async fn list_secrets(
    _admin: Authorized<AdminRole>,
    state: web::Data<AppState>,
) -> Result<web::Json<SecretListDto>, ApiError> {
    let list = state.service.secrets().await?;
    Ok(web::Json(SecretListDto {
        secrets: list.into_iter().map(SecretDto::from).collect(),
    }))
}

/// Deletes a secret.
#[utoipa::path(
    tag = "secrets",
    params(SecretName),
    responses((status = 204), ChangeErrors),
)]
#[delete("/secrets/{name}")]
pub async fn delete_secret(
    Target {
        caller, id: name, ..
    }: Target<AdminRole, SecretName>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.service.delete_secret(name.clone()).await?;
    tracing::info!(secret = %name, by = %caller.token_id, "secret deleted");
    Ok(HttpResponse::NoContent().finish())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn secret_names_are_upper_snake_case() {
        for good in ["CODEHOST_TOKEN", "A", "ANTHROPIC_API_KEY", "K2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = "A".repeat(65);
        for bad in [
            "",
            "codehost_token",
            "_X",
            "1X",
            "A-B",
            "A B",
            "É",
            long.as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
