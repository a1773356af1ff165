//! Liveness, readiness, metrics and the OpenAPI document (no token needed, except for
//! `/metrics` unless `AGENTRY_METRICS_PUBLIC=1`).

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, HttpResponse, get, web};
use serde::Serialize;
use utoipa::ToSchema;

use rust_decimal::Decimal;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::metrics::{BudgetUse, RunCost};
use crate::state::AppState;

/// Health status.
#[derive(Serialize, ToSchema)]
pub struct Status {
    /// `ok` or `ready`.
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, body = Status)),
    security()
)]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Status> {
    web::Json(Status { status: "ok" })
}

/// The database answers.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, body = Status), (status = 503, body = ErrorBody)),
    security()
)]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> Result<web::Json<Status>, ApiError> {
    state.service.check_database().await?;
    Ok(web::Json(Status { status: "ready" }))
}

/// Prometheus metrics in the text exposition format: HTTP requests and latencies,
/// `agentry_cost_usd_total{repo,model,task_type}`, the recorded cost of agent runs,
/// `agentry_budget_used_ratio{scope,repo}`, the share of each monthly budget spent this month,
/// and `agentry_egress_blocked_total{repo}` (read from the database's rollups at each scrape,
/// so every replica reports the same values; per-repository series only for connected
/// repositories).
///
/// Needs a valid API token of any role unless `AGENTRY_METRICS_PUBLIC=1`.
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, content_type = "text/plain; version=0.0.4", body = String),
        (status = 401, body = ErrorBody),
        (status = 503, body = ErrorBody)
    ),
)]
#[get("/metrics")]
pub async fn metrics(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !state.metrics_public {
        Caller::from_request(&req, &mut Payload::None).await?;
    }
    let scrape = state.service.metrics_scrape().await?;
    let costs = scrape
        .costs
        .into_iter()
        .map(|((repo, task_type, model), nanos)| RunCost {
            repo,
            model: if model.is_empty() {
                "unknown".to_owned()
            } else {
                model
            },
            task_type,
            usd: Decimal::from_i128_with_scale(i128::from(nanos), 9),
        })
        .collect::<Vec<_>>();
    let budgets = scrape
        .budgets
        .into_iter()
        .map(|b| BudgetUse {
            scope: if b.repo_url.is_some() {
                "repository"
            } else {
                "instance"
            }
            .to_owned(),
            repo: b.repo_url.map(|u| u.to_string()).unwrap_or_default(),
            spent: b.spent.as_decimal(),
            budget: b.budget.as_decimal(),
        })
        .collect::<Vec<_>>();
    let text = state
        .metrics
        .render_scrape(&costs, &budgets, &scrape.egress_blocked)
        .map_err(|e| ApiError::internal(&e))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text))
}

/// This API's OpenAPI 3 document.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, content_type = "application/json", body = Object)),
    security()
)]
#[get("/openapi.json")]
pub async fn openapi_json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.openapi_json.clone())
}
