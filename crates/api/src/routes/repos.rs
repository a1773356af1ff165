//! `POST /api/repos`, `GET /api/repos`, `GET|DELETE /api/repos/{id}` and
//! `GET|PATCH /api/repos/{id}/settings` (docs/contract.md#34-repositories–#35-repository-settings).

use actix_web::{HttpResponse, delete, get, patch, post, web};
use agentry_domain::{RepoSettings, RepoUrl};
use agentry_persistence::repos::Repository;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::{AdminRole, AnyRole, Caller};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::routes::{
    AuthErrors, Authorized, BodyChangeErrors, BodyErrors, ChangeErrors, CodeHostErrors,
    LookupErrors, RepoId, Target, TokenErrors, created_or_existing,
};
use crate::state::AppState;

/// A repository to connect.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectRepo {
    /// Any accepted form: `https://github.com/org/repo`, `git@github.com:org/repo.git`, …
    #[schema(
        min_length = 1,
        pattern = r"^https://[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}/[A-Za-z0-9_-]{1,40}/[A-Za-z0-9_-]{1,40}$"
    )]
    pub repo_url: String,
}

/// A repository known to the service.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepoDto {
    /// Repository id.
    pub id: Uuid,
    /// Normalised URL.
    pub repo_url: String,
    /// Owner (lower case).
    pub owner: String,
    /// Name (lower case).
    pub name: String,
    /// The default branch on the code host.
    pub default_branch: String,
    /// The clone URL the code host reports.
    pub clone_url: String,
    /// Agent settings (docs/contract.md#35-repository-settings).
    #[schema(value_type = Object)]
    pub settings: RepoSettings,
    /// When it was (last) connected.
    #[serde(with = "time::serde::rfc3339")]
    pub connected_at: OffsetDateTime,
    /// When it was disconnected; null while connected.
    #[serde(with = "time::serde::rfc3339::option")]
    pub disconnected_at: Option<OffsetDateTime>,
    /// First connection.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// Its monthly budget with this month's spend and forecast
    /// (docs/contract.md#67-budgets); null without a budget.
    pub budget: Option<agentry_analytics::budgets::BudgetForecast>,
}

impl From<Repository> for RepoDto {
    fn from(r: Repository) -> Self {
        RepoDto {
            id: r.id,
            repo_url: r.url.to_string(),
            owner: r.url.owner().to_owned(),
            name: r.url.name().to_owned(),
            default_branch: r.default_branch,
            clone_url: r.clone_url,
            settings: r.settings,
            connected_at: r.connected_at,
            disconnected_at: r.disconnected_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            budget: None,
        }
    }
}

/// The connected repositories.
#[derive(Serialize, ToSchema)]
pub struct RepoListDto {
    /// By URL.
    pub repos: Vec<RepoDto>,
}

/// Connects a repository: looks it up on the code host (default branch, clone URL) and
/// stores it with default settings. Connecting one already connected returns it (200).
#[utoipa::path(
    tag = "repos",
    request_body = ConnectRepo,
    responses(
        (status = 201, description = "Connected now", body = RepoDto),
        (status = 200, description = "Already connected", body = RepoDto),
        BodyErrors,
        TokenErrors,
        CodeHostErrors,
    ),
)]
#[post("/repos")]
pub async fn connect_repo(
    Authorized { caller, body, .. }: Authorized<AdminRole, JsonBody<ConnectRepo>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let url =
        RepoUrl::parse(&body.0.repo_url).map_err(|e| ApiError::invalid_parameter("repoUrl", e))?;
    let (repo, created) = state.service.connect_repository(url).await?;
    if created {
        tracing::info!(repo = %repo.url, id = %repo.id, by = %caller.token_id, "repository connected");
    }
    Ok(created_or_existing(created, RepoDto::from(repo)))
}

/// Lists the connected repositories.
#[utoipa::path(
    tag = "repos",
    responses((status = 200, body = RepoListDto), AuthErrors),
)]
#[get("/repos")]
pub async fn list_repos(
    _caller: Caller,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoListDto>, ApiError> {
    let list = state.service.connected_repositories().await?;
    let budgets = state.service.budget_forecasts().await?;
    Ok(web::Json(RepoListDto {
        repos: list
            .into_iter()
            .map(|r| with_budget(r.into(), &budgets))
            .collect(),
    }))
}

/// One repository (also a disconnected one, with `disconnectedAt`).
#[utoipa::path(
    tag = "repos",
    params(RepoId),
    responses((status = 200, body = RepoDto), LookupErrors),
)]
#[get("/repos/{id}")]
pub async fn get_repo(
    Target { id, .. }: Target<AnyRole, RepoId>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoDto>, ApiError> {
    let repo = state.service.repository(id).await?;
    let budgets = state.service.budget_forecasts().await?;
    Ok(web::Json(with_budget(repo.into(), &budgets)))
}

/// The repository with its budget's forecast, if it has a budget.
fn with_budget(
    mut dto: RepoDto,
    budgets: &[agentry_analytics::budgets::BudgetForecast],
) -> RepoDto {
    dto.budget = budgets
        .iter()
        .find(|b| b.repo_url.as_deref() == Some(dto.repo_url.as_str()))
        .cloned();
    dto
}

/// Disconnects a repository: no more syncs or runs; its tasks and costs stay.
#[utoipa::path(
    tag = "repos",
    params(RepoId),
    responses((status = 200, body = RepoDto), ChangeErrors),
)]
#[delete("/repos/{id}")]
pub async fn disconnect_repo(
    Target { caller, id, .. }: Target<AdminRole, RepoId>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoDto>, ApiError> {
    let repo = state.service.disconnect_repository(id).await?;
    tracing::info!(repo = %repo.url, by = %caller.token_id, "repository disconnected");
    Ok(web::Json(repo.into()))
}

/// A repository's settings.
#[utoipa::path(
    tag = "repos",
    params(RepoId),
    responses(
        (status = 200, description = "The settings (docs/contract.md#35-repository-settings)", body = Object),
        LookupErrors,
    ),
)]
#[get("/repos/{id}/settings")]
pub async fn get_settings(
    Target { id, .. }: Target<AnyRole, RepoId>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoSettings>, ApiError> {
    Ok(web::Json(state.service.repository(id).await?.settings))
}

/// Changes any subset of a repository's settings. An unknown member or any bad value is a
/// 400 naming it, and nothing changes.
#[utoipa::path(
    tag = "repos",
    params(RepoId),
    request_body(content = Object, description = "Any subset of codingModel, reviewModel, \
        maxTurnsCoding, maxTurnsReview, agentType, autoReview, maxCostPerTaskUsd, \
        monthlyBudgetUsd, egressAllow"),
    responses(
        (status = 200, description = "The settings after the change", body = Object),
        BodyChangeErrors,
    ),
)]
#[patch("/repos/{id}/settings")]
pub async fn patch_settings(
    Target {
        caller, id, body, ..
    }: Target<AdminRole, RepoId, JsonBody<serde_json::Value>>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoSettings>, ApiError> {
    let settings = state.service.patch_repo_settings(id, body.0).await?;
    tracing::info!(repo = %id, by = %caller.token_id, "repository settings changed");
    Ok(web::Json(settings))
}
