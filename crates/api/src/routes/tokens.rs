//! `POST /api/tokens`, `GET /api/tokens`, `DELETE /api/tokens/{id}` (admin).

use actix_web::{HttpResponse, delete, get, post, web};
use agentry_domain::Role;
use agentry_persistence::tokens::ApiToken;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::{AdminRole, generate_token, hash_token};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::routes::{AdminReadErrors, Authorized, BodyErrors, ChangeErrors, Target, TokenId};
use crate::state::AppState;

/// Longest token name.
const MAX_NAME_CHARS: usize = 100;

/// A token to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for (1 to 100 characters).
    #[schema(min_length = 1, max_length = 100, pattern = r"[^\s\u0085]")]
    pub name: String,
    /// `viewer`, `member` or `admin`.
    #[schema(value_type = crate::dto::names::RoleName, example = "member")]
    pub role: Role,
}

/// A stored token (never the token itself).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenDto {
    /// Token id.
    pub id: Uuid,
    /// Name.
    pub name: String,
    /// Role.
    #[schema(value_type = String)]
    pub role: Role,
    /// Creation time.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl From<ApiToken> for TokenDto {
    fn from(t: ApiToken) -> Self {
        TokenDto {
            id: t.id,
            name: t.name,
            role: t.role,
            created_at: t.created_at,
        }
    }
}

/// A newly created token: the only time the token is shown.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedTokenDto {
    /// The stored token.
    #[serde(flatten)]
    pub record: TokenDto,
    /// The bearer token. Store it now; only its hash is kept.
    pub token: String,
}

/// The list of active tokens.
#[derive(Serialize, ToSchema)]
pub struct TokenListDto {
    /// Active tokens, oldest first.
    pub tokens: Vec<TokenDto>,
}

/// Creates an API token and returns it once.
#[utoipa::path(
    tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, body = CreatedTokenDto), BodyErrors),
)]
#[post("/tokens")]
pub async fn create_token(
    Authorized { caller, body, .. }: Authorized<AdminRole, JsonBody<CreateToken>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(CreateToken { name, role }) = body;
    // NUL characters are not stored (docs/contract.md#32-errors): a name of them is blank.
    let name = name.replace('\0', "").trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::invalid_parameter(
            "name",
            format!("must be 1 to {MAX_NAME_CHARS} characters"),
        ));
    }
    let token = generate_token().map_err(|e| ApiError::internal(&e))?;
    let hash = hash_token(&token);
    let record = state.service.create_token(name, role, hash).await?;
    tracing::info!(token_id = %record.id, role = %record.role, by = %caller.token_id, "API token created");
    Ok(HttpResponse::Created().json(CreatedTokenDto {
        record: record.into(),
        token,
    }))
}

/// Lists the active API tokens.
#[utoipa::path(
    tag = "tokens",
    responses((status = 200, body = TokenListDto), AdminReadErrors),
)]
#[get("/tokens")]
pub async fn list_tokens(
    _admin: Authorized<AdminRole>,
    state: web::Data<AppState>,
) -> Result<web::Json<TokenListDto>, ApiError> {
    let list = state.service.active_tokens().await?;
    Ok(web::Json(TokenListDto {
        tokens: list.into_iter().map(TokenDto::from).collect(),
    }))
}

/// Revokes an API token.
#[utoipa::path(
    tag = "tokens",
    params(TokenId),
    responses((status = 204), ChangeErrors),
)]
#[delete("/tokens/{id}")]
pub async fn revoke_token(
    Target { caller, id, .. }: Target<AdminRole, TokenId>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    state.service.revoke_token(id).await?;
    tracing::info!(token_id = %id, by = %caller.token_id, "API token revoked");
    Ok(HttpResponse::NoContent().finish())
}
