//! `GET /api/me`: the calling token's name and role, so that a client (the web pages) knows
//! what the token may do without trying.

use actix_web::{get, web};
use agentry_domain::Role;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::AuthErrors;

/// The calling token (never the token itself).
#[derive(Serialize, ToSchema)]
pub struct MeDto {
    /// The token's name.
    #[schema(example = "ci")]
    pub name: String,
    /// `viewer`, `member` or `admin`.
    #[schema(value_type = crate::dto::names::RoleName, example = "member")]
    pub role: Role,
}

/// The name and role of the token that makes the request (any role).
#[utoipa::path(
    tag = "tokens",
    responses((status = 200, body = MeDto), AuthErrors),
)]
#[get("/me")]
pub async fn me(caller: Caller) -> Result<web::Json<MeDto>, ApiError> {
    Ok(web::Json(MeDto {
        name: caller.name,
        role: caller.role,
    }))
}
