//! Liveness, readiness, metrics and the OpenAPI document (no token needed).

use actix_web::{HttpResponse, get, web};
use serde::Serialize;
use utoipa::ToSchema;

use rust_decimal::Decimal;

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
#[utoipa::path(tag = "operations", responses((status = 200, body = Status)))]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Status> {
    web::Json(Status { status: "ok" })
}

/// The database answers.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, body = Status), (status = 503, body = ErrorBody))
)]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> Result<web::Json<Status>, ApiError> {
    state.db(|_conn| Ok(())).await?;
    Ok(web::Json(Status { status: "ready" }))
}

/// Prometheus metrics in the text exposition format: HTTP requests and latencies,
/// `agentry_cost_usd_total{repo,model,task_type}`, the recorded cost of agent runs, and
/// `agentry_budget_used_ratio{scope,repo}`, the share of each monthly budget spent this month
/// (both read from the database at each scrape, so every replica reports the same values).
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, content_type = "text/plain; version=0.0.4", body = String),
        (status = 503, body = ErrorBody)
    )
)]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let costs = state
        .db(|conn| Ok(agentry_persistence::rollups::run_cost_totals(conn)?))
        .await?
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
    let at = agentry_persistence::now();
    let budgets = state
        .db(move |conn| Ok(agentry_persistence::budgets::all_set(conn, None, at)?))
        .await?
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
    let egress = state
        .db(|conn| Ok(agentry_persistence::metering::blocked_by_repo(conn)?))
        .await?;
    let text = state
        .metrics
        .render_scrape(&costs, &budgets, &egress)
        .map_err(|e| ApiError::internal(&e))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text))
}

/// This API's OpenAPI 3 document.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, content_type = "application/json", body = Object))
)]
#[get("/openapi.json")]
pub async fn openapi_json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.openapi_json.clone())
}
