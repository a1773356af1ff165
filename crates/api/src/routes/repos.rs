//! `POST /api/repos`, `GET /api/repos`, `GET|DELETE /api/repos/{id}` and
//! `GET|PATCH /api/repos/{id}/settings` (docs/contract.md#34-repositories–#35-repository-settings).

use actix_web::{HttpResponse, delete, get, patch, post, web};
use agentry_domain::{AgentType, EgressPattern, RepoSettings, RepoUrl, Usd};
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
    pub settings: RepoSettingsDto,
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
            settings: r.settings.into(),
            connected_at: r.connected_at,
            disconnected_at: r.disconnected_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            budget: None,
        }
    }
}

/// A repository's agent settings (docs/contract.md#35-repository-settings): every member,
/// always present. `PATCH /api/repos/{id}/settings` takes any subset of the same members.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepoSettingsDto {
    /// The model of coding tasks (1 to 100 of `A-Za-z0-9._:/-`, not starting with `-`).
    #[schema(example = "sonnet")]
    pub coding_model: String,
    /// The model of review tasks (same rule as `codingModel`).
    #[schema(example = "haiku")]
    pub review_model: String,
    /// The agent's turn limit of coding tasks, 1 to 1000; null for the agent's own limit.
    #[schema(required = true, minimum = 1, maximum = 1000)]
    pub max_turns_coding: Option<i32>,
    /// The agent's turn limit of review tasks, 1 to 1000.
    #[schema(minimum = 1, maximum = 1000)]
    pub max_turns_review: i32,
    /// The agent of assigned issues and of tasks created without one.
    #[schema(value_type = crate::dto::names::AgentTypeName)]
    pub agent_type: AgentType,
    /// Whether a review task is queued for each pull request a coding task opens.
    pub auto_review: bool,
    /// The most one task may cost, a decimal string greater than 0; null for no cap.
    #[schema(value_type = Option<String>, required = true, example = "5.00")]
    pub max_cost_per_task_usd: Option<Usd>,
    /// What this repository's runs may spend per UTC calendar month, a decimal string of at
    /// least 0; null for no budget.
    #[schema(value_type = Option<String>, required = true, example = "500.00")]
    pub monthly_budget_usd: Option<Usd>,
    /// Hosts (names, addresses or `*.` wildcards, in normal form) the repository's sandboxed
    /// agents may reach through the egress proxy, besides the instance's; at most 100.
    #[schema(value_type = Vec<String>, max_items = 100)]
    pub egress_allow: Vec<EgressPattern>,
    /// How many revision rounds review feedback may start on one pull request, 0 (off) to 50.
    #[schema(minimum = 0, maximum = 50)]
    pub max_revisions: i32,
    /// Whether the findings of agentry's own review agent start a revision round.
    pub revise_on_agent_review: bool,
    /// Whether the model gateway passes on calls that ask the provider to reach out on the
    /// agent's behalf (MCP servers, server-side web fetch and search, code execution, …).
    /// Off by default: such calls reach hosts from the provider's servers, past the egress
    /// allow-list (docs/security.md).
    pub allow_provider_tools: bool,
}

impl From<RepoSettings> for RepoSettingsDto {
    fn from(s: RepoSettings) -> Self {
        // Destructured in full, so that a new setting cannot be left out of the API.
        let RepoSettings {
            coding_model,
            review_model,
            max_turns_coding,
            max_turns_review,
            agent_type,
            auto_review,
            max_cost_per_task_usd,
            monthly_budget_usd,
            egress_allow,
            max_revisions,
            revise_on_agent_review,
            allow_provider_tools,
        } = s;
        RepoSettingsDto {
            coding_model,
            review_model,
            max_turns_coding,
            max_turns_review,
            agent_type,
            auto_review,
            max_cost_per_task_usd,
            monthly_budget_usd,
            egress_allow,
            max_revisions,
            revise_on_agent_review,
            allow_provider_tools,
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
        (status = 200, description = "The settings (docs/contract.md#35-repository-settings)", body = RepoSettingsDto),
        LookupErrors,
    ),
)]
#[get("/repos/{id}/settings")]
pub async fn get_settings(
    Target { id, .. }: Target<AnyRole, RepoId>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoSettingsDto>, ApiError> {
    Ok(web::Json(
        state.service.repository(id).await?.settings.into(),
    ))
}

/// Changes any subset of a repository's settings. An unknown member or any bad value is a
/// 400 naming it, and nothing changes.
#[utoipa::path(
    tag = "repos",
    params(RepoId),
    request_body(content = Object, description = "Any subset of the members of \
        RepoSettingsDto: codingModel, reviewModel, maxTurnsCoding, maxTurnsReview, agentType, \
        autoReview, maxCostPerTaskUsd, monthlyBudgetUsd, egressAllow, maxRevisions, \
        reviseOnAgentReview, allowProviderTools"),
    responses(
        (status = 200, description = "The settings after the change", body = RepoSettingsDto),
        BodyChangeErrors,
    ),
)]
#[patch("/repos/{id}/settings")]
pub async fn patch_settings(
    Target {
        caller, id, body, ..
    }: Target<AdminRole, RepoId, JsonBody<serde_json::Value>>,
    state: web::Data<AppState>,
) -> Result<web::Json<RepoSettingsDto>, ApiError> {
    let settings = state.service.patch_repo_settings(id, body.0).await?;
    tracing::info!(repo = %id, by = %caller.token_id, "repository settings changed");
    Ok(web::Json(settings.into()))
}
