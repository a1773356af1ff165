//! `GET /api/analytics/costs` (docs/contract.md#4-cost-report).

use actix_web::{HttpRequest, HttpResponse, get, web};
use agentry_domain::RepoUrl;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::query::Query;
use crate::routes::QueryErrors;
use crate::state::AppState;
use agentry_service::costs;

/// Default report period in days.
pub const DEFAULT_DAYS: i64 = 30;

/// The cost report: summary cards, forecast, daily series, breakdowns by repository, task
/// type and model, anomalies, model suggestions and the costliest tasks.
#[utoipa::path(
    tag = "analytics",
    params(
        ("days" = Option<u32>, Query, minimum = 1, maximum = 365,
            description = "Period length in days, 1 to 365 (default 30)"),
        ("repoUrl" = Option<String>, Query, min_length = 1,
            pattern = r"^https://[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}/[A-Za-z0-9_-]{1,40}/[A-Za-z0-9_-]{1,40}$",
            description = "Only this repository (any accepted URL form)"),
    ),
    responses(
        (status = 200, description = "The cost report (docs/contract.md#4-cost-report)", body = agentry_analytics::CostReport),
        QueryErrors,
    ),
)]
#[get("/analytics/costs")]
pub async fn cost_report(
    _caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let q = Query::parse(req.query_string(), &["days", "repoUrl"])?;
    let days = q.int_in("days", 1, 365)?.unwrap_or(DEFAULT_DAYS);
    let repo = q
        .get("repoUrl")
        .map(|v| RepoUrl::parse(v).map_err(|e| ApiError::invalid_parameter("repoUrl", e)))
        .transpose()?;
    let window = costs::window_ending_now(u32::try_from(days).unwrap_or(30))
        .map_err(|e| ApiError::invalid_parameter("days", e))?;
    let report = state.service.cost_report(window, repo).await?;
    Ok(HttpResponse::Ok().json(report))
}
