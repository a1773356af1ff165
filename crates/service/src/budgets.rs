//! Monthly budgets as users set them (docs/contract.md#67-budgets): the instance-wide
//! budget and a repository's settings (its budget among them). A change commits, then
//! wakes the runner, since tasks a budget blocked may run now.

use agentry_domain::{RepoSettings, Usd};
use agentry_persistence::budgets::{self, MonthToDate};
use agentry_persistence::repos;
use uuid::Uuid;

use crate::wake::Loops;
use crate::{Service, ServiceError, now};

/// A monthly budget and what its month has used so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetView {
    /// The first day of the month (UTC) the figures are for.
    pub month: time::Date,
    /// The budget and the month's spend and reserves.
    pub figures: MonthToDate,
    /// The month at the current daily average, and the day the budget runs out at it
    /// (`None` without a budget).
    pub forecast: Option<agentry_analytics::budgets::BudgetForecast>,
}

impl Service {
    /// Every monthly budget that is set (the instance's, then the connected repositories'
    /// by URL), with this month's spend and forecast.
    pub async fn budget_forecasts(
        &self,
    ) -> Result<Vec<agentry_analytics::budgets::BudgetForecast>, ServiceError> {
        let at = now();
        let set = self
            .db(move |conn| Ok(budgets::all_set(conn, None, at)?))
            .await?;
        Ok(set
            .into_iter()
            .map(|b| {
                agentry_analytics::budgets::forecast(
                    &agentry_analytics::budgets::BudgetInput {
                        repo_url: b.repo_url.map(|u| u.to_string()),
                        monthly_budget: b.budget.as_decimal(),
                        month_to_date: b.spent.as_decimal(),
                    },
                    at.date(),
                )
            })
            .collect())
    }

    /// The instance-wide monthly budget with its month to date.
    pub async fn instance_budget(&self) -> Result<BudgetView, ServiceError> {
        let at = now();
        let figures = self
            .db(move |conn| Ok(budgets::instance_month(conn, at)?))
            .await?;
        let forecast = figures.budget.map(|budget| {
            agentry_analytics::budgets::forecast(
                &agentry_analytics::budgets::BudgetInput {
                    repo_url: None,
                    monthly_budget: budget.as_decimal(),
                    month_to_date: figures.spent.as_decimal(),
                },
                at.date(),
            )
        });
        Ok(BudgetView {
            month: budgets::month_start(at).date(),
            figures,
            forecast,
        })
    }

    /// Sets (or with `None` removes) the instance-wide monthly budget, then wakes the
    /// runner: tasks it blocked may run now.
    pub async fn set_instance_budget(
        &self,
        budget: Option<Usd>,
    ) -> Result<BudgetView, ServiceError> {
        self.commit(
            move |conn| Ok(budgets::set_instance_budget(conn, budget, now())?),
            |_| Loops::RUNNER,
        )
        .await?;
        // A lowered budget may be past a threshold already.
        self.check_budget_alerts_logged().await;
        self.instance_budget().await
    }

    /// Changes a repository's settings with a PATCH body (all or nothing; the error names
    /// the first bad member), then wakes the runner: a changed budget may unblock tasks.
    pub async fn patch_repo_settings(
        &self,
        id: Uuid,
        patch: serde_json::Value,
    ) -> Result<RepoSettings, ServiceError> {
        let repo = self
            .commit(
                move |conn| match repos::patch_settings(conn, id, now(), |current| {
                    current.apply_patch(&patch)
                }) {
                    Ok(Ok(repo)) => Ok(repo),
                    Ok(Err(field)) => Err(ServiceError::from(field)),
                    Err(agentry_persistence::DbError::NotFound) => {
                        Err(ServiceError::NotFound(format!("repository {id} not found")))
                    }
                    Err(e) => Err(e.into()),
                },
                |_| Loops::RUNNER,
            )
            .await?;
        // A lowered budget may be past a threshold already.
        self.check_budget_alerts_logged().await;
        Ok(repo.settings)
    }
}
