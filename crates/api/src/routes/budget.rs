//! `GET|PUT /api/budget`: the instance-wide monthly budget with its month to date, and
//! `GET /api/budget/alerts`, the budget alerts recorded (docs/contract.md#67-budgets).

use actix_web::{HttpRequest, get, put, web};
use agentry_service::budgets::BudgetView;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{AdminRole, Caller};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::routes::page::{IdCursor, Limit};
use crate::routes::{AuthErrors, Authorized, BodyErrors, QueryErrors, cursor};
use crate::state::AppState;

/// The instance-wide monthly budget and its month so far.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetDto {
    /// The budget for each UTC calendar month, exact decimal USD; null for none.
    #[schema(example = "500.00")]
    pub monthly_budget_usd: Option<String>,
    /// The month the figures are for, `YYYY-MM`.
    #[schema(example = "2026-11")]
    pub month: String,
    /// Spent by the runs that finished this month, exact decimal USD.
    #[schema(example = "123.456")]
    pub month_to_date_usd: String,
    /// Held by the runs in progress, exact decimal USD: a sandboxed run's metered calls so far
    /// and its calls in flight (each at its largest cost); an unsandboxed run's whole allowance.
    #[schema(example = "2.5")]
    pub reserved_usd: String,
    /// What is left this month after the spend and what runs hold; null without a budget.
    #[schema(example = "374.044")]
    pub remaining_usd: Option<String>,
    /// The month's spend at the current daily average (4 decimals); null without a budget.
    #[schema(example = "1234.5600")]
    pub forecast_usd: Option<String>,
    /// The day (`YYYY-MM-DD`, UTC) the budget runs out at that rate; null when it lasts the
    /// month, nothing was spent, or there is no budget.
    #[schema(example = "2026-11-27")]
    pub exhausts_on: Option<String>,
}

impl From<BudgetView> for BudgetDto {
    fn from(v: BudgetView) -> Self {
        let f = v.figures;
        let remaining = f.budget.map(|b| {
            let left = b
                .to_nanos()
                .saturating_sub(f.spent.to_nanos())
                .saturating_sub(f.reserved.to_nanos())
                .max(0);
            agentry_domain::Usd::from_nanos(left)
                .map(|u| u.to_string())
                .unwrap_or_else(|_| "0".into())
        });
        let exhausts_on = v
            .forecast
            .as_ref()
            .and_then(|f| f.exhausts_on)
            .map(|d| format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day()));
        BudgetDto {
            forecast_usd: v.forecast.map(|f| f.forecast_usd),
            exhausts_on,
            monthly_budget_usd: f.budget.map(|b| b.to_string()),
            month: year_month(v.month),
            month_to_date_usd: f.spent.to_string(),
            reserved_usd: f.reserved.to_string(),
            remaining_usd: remaining,
        }
    }
}

/// The month of `day` as `YYYY-MM`.
fn year_month(day: time::Date) -> String {
    format!("{:04}-{:02}", day.year(), u8::from(day.month()))
}

/// A new instance-wide budget.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutBudget {
    /// A decimal string of at least 0 with at most 9 decimals (e.g. `"500.00"`), or null to
    /// remove the budget.
    #[schema(value_type = Option<String>, required = true, example = "500.00",
        pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?$")]
    pub monthly_budget_usd: serde_json::Value,
}

/// The instance-wide monthly budget and what this month has spent and reserved (viewer).
#[utoipa::path(
    tag = "budget",
    responses((status = 200, body = BudgetDto), AuthErrors),
)]
#[get("/budget")]
pub async fn get_budget(
    _caller: Caller,
    state: web::Data<AppState>,
) -> Result<web::Json<BudgetDto>, ApiError> {
    Ok(web::Json(state.service.instance_budget().await?.into()))
}

/// Sets or removes the instance-wide monthly budget (admin). Queued tasks it blocked start
/// by themselves once it leaves money for them.
#[utoipa::path(
    tag = "budget",
    request_body = PutBudget,
    responses((status = 200, body = BudgetDto), BodyErrors),
)]
#[put("/budget")]
pub async fn put_budget(
    Authorized { caller, body, .. }: Authorized<AdminRole, JsonBody<PutBudget>>,
    state: web::Data<AppState>,
) -> Result<web::Json<BudgetDto>, ApiError> {
    let budget = match &body.0.monthly_budget_usd {
        serde_json::Value::Null => None,
        value => Some(agentry_domain::settings::budget_value(value)?),
    };
    let view = state.service.set_instance_budget(budget).await?;
    tracing::info!(budget = ?budget.map(|b| b.to_string()), by = %caller.token_id, "instance budget set");
    Ok(web::Json(view.into()))
}

/// A budget alert: a monthly budget reached 50 %, 80 % or 100 % (once per budget, month and
/// threshold).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetAlertDto {
    /// The alert's id; also the `Idempotency-Key` of its webhook delivery.
    pub id: uuid::Uuid,
    /// Which budget: `instance` or `repository`.
    #[schema(example = "repository")]
    pub scope: String,
    /// The repository, for a repository's budget; null for the instance's.
    #[schema(example = "https://github.com/acme/web")]
    pub repo_url: Option<String>,
    /// The month, `YYYY-MM` (UTC).
    #[schema(example = "2026-11")]
    pub month: String,
    /// The percentage of the budget reached: 50, 80 or 100.
    #[schema(example = 80)]
    pub threshold: i32,
    /// The month's spend when the alert was recorded, exact decimal USD.
    #[schema(example = "0.8")]
    pub spent_usd: String,
    /// The budget when the alert was recorded, exact decimal USD.
    #[schema(example = "1")]
    pub monthly_budget_usd: String,
    /// When it was recorded (RFC 3339 UTC).
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: time::OffsetDateTime,
    /// `pending` (to the webhook, retried until it answers 2xx), `delivered`, or `unsent`
    /// (recorded while no `AGENTRY_ALERT_WEBHOOK_URL` was set).
    #[schema(example = "delivered")]
    pub delivery: String,
    /// Failed delivery attempts so far.
    pub delivery_attempts: i32,
    /// When the webhook took it (RFC 3339 UTC).
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub delivered_at: Option<time::OffsetDateTime>,
    /// Why the last attempt failed (never the webhook's URL).
    pub last_error: Option<String>,
}

impl From<agentry_persistence::alerts::BudgetAlert> for BudgetAlertDto {
    fn from(a: agentry_persistence::alerts::BudgetAlert) -> Self {
        BudgetAlertDto {
            id: a.id,
            scope: a.scope.as_str().to_owned(),
            repo_url: a.repo_url.map(|u| u.to_string()),
            month: year_month(a.month),
            threshold: a.threshold,
            spent_usd: a.spent.to_string(),
            monthly_budget_usd: a.budget.to_string(),
            created_at: a.created_at,
            delivery: a.delivery.as_str().to_owned(),
            delivery_attempts: a.attempts,
            delivered_at: a.delivered_at,
            last_error: a.last_error,
        }
    }
}

/// A page of budget alerts, newest first.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetAlertListDto {
    /// At most `limit` alerts.
    pub alerts: Vec<BudgetAlertDto>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The alert list's `limit`.
type AlertLimit = Limit<50, { agentry_persistence::alerts::MAX_PAGE }>;

/// The budget alerts recorded, newest first (viewer). Cursor-paginated.
#[utoipa::path(
    tag = "budget",
    params(
        AlertLimit,
        IdCursor,
    ),
    responses((status = 200, body = BudgetAlertListDto), QueryErrors),
)]
#[get("/budget/alerts")]
pub async fn list_budget_alerts(
    _caller: Caller,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<BudgetAlertListDto>, ApiError> {
    let q = crate::query::Query::parse(req.query_string(), &["limit", "cursor"])?;
    let limit = AlertLimit::read(&q)?;
    let after = q
        .get("cursor")
        .map(cursor::field::<uuid::Uuid>)
        .transpose()?;
    let page = state.service.budget_alerts(limit, after).await?;
    Ok(web::Json(BudgetAlertListDto {
        alerts: page.alerts.into_iter().map(BudgetAlertDto::from).collect(),
        next_cursor: page.next.map(|id| id.to_string()),
    }))
}
