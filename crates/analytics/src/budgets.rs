//! The `budgets` member of the report (docs/contract.md#67-budgets): for each monthly budget
//! that is set, this month's spend, the month's forecast at the current daily average, and
//! the day the budget runs out at that rate.

use rust_decimal::Decimal;
use serde::Serialize;
use time::{Date, Duration};

use crate::exact::{div_round, mul, quotient};
use crate::wire;
use agentry_domain::format_decimal;

/// One monthly budget as storage reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetInput {
    /// `None` for the instance-wide budget, else the repository's normalised URL.
    pub repo_url: Option<String>,
    /// The monthly budget in USD.
    pub monthly_budget: Decimal,
    /// What the runs that finished this month (up to now) cost.
    pub month_to_date: Decimal,
}

/// A monthly budget and its forecast. Money is a decimal string with 4 decimals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BudgetForecast {
    /// `instance` or `repository`.
    pub scope: String,
    /// The repository of a repository's budget; null for the instance's.
    pub repo_url: Option<String>,
    /// The budget for the month.
    pub monthly_budget_usd: String,
    /// Spent by the runs that finished this month.
    pub month_to_date_usd: String,
    /// `monthToDate / daysElapsed × daysInMonth`: the month at the current daily average
    /// (today counts as elapsed).
    pub forecast_usd: String,
    /// The day the budget runs out at the current daily average (today when it is spent
    /// already); null when nothing was spent or it lasts the month.
    #[serde(serialize_with = "wire::opt")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = Date))]
    pub exhausts_on: Option<Date>,
}

/// The forecast of `input` on `today` (UTC). Exact: the run-out day compares
/// `monthToDate + k × (monthToDate / elapsed)` with the budget without rounding.
pub fn forecast(input: &BudgetInput, today: Date) -> BudgetForecast {
    let elapsed = Decimal::from(today.day());
    let length = today.month().length(today.year());
    let in_month = Decimal::from(length);
    let spent = input.month_to_date;
    let budget = input.monthly_budget;
    let exhausts_on = if spent >= budget {
        Some(today)
    } else if spent.is_zero() {
        None
    } else {
        // The smallest k ≥ 1 with spent + k × spent / elapsed ≥ budget, i.e.
        // k ≥ (budget − spent) × elapsed / spent.
        let needed = quotient(mul(budget - spent, elapsed), spent).ceil();
        let last = today.replace_day(length).unwrap_or(today);
        i64::try_from(needed)
            .ok()
            .and_then(|k| today.checked_add(Duration::days(k)))
            .filter(|day| *day <= last)
    };
    BudgetForecast {
        scope: if input.repo_url.is_some() {
            "repository".into()
        } else {
            "instance".into()
        },
        repo_url: input.repo_url.clone(),
        monthly_budget_usd: format_decimal(budget, 4),
        month_to_date_usd: format_decimal(spent, 4),
        forecast_usd: format_decimal(div_round(mul(spent, in_month), elapsed, 4), 4),
        exhausts_on,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    fn input(budget: &str, spent: &str) -> BudgetInput {
        BudgetInput {
            repo_url: None,
            monthly_budget: budget.parse().unwrap(),
            month_to_date: spent.parse().unwrap(),
        }
    }

    #[test]
    fn the_forecast_runs_the_daily_average_to_the_month_end() {
        // 10 days of 30 elapsed, $100 spent: $10 a day, $300 for the month; a $150 budget
        // runs out after 5 more days.
        let f = forecast(&input("150", "100"), date!(2026 - 11 - 10));
        assert_eq!(f.forecast_usd, "300.0000");
        assert_eq!(f.month_to_date_usd, "100.0000");
        assert_eq!(f.exhausts_on, Some(date!(2026 - 11 - 15)));
        assert_eq!(f.scope, "instance");
        // Exactly on the boundary: $10 left at $10 a day is the next day.
        let f = forecast(&input("110", "100"), date!(2026 - 11 - 10));
        assert_eq!(f.exhausts_on, Some(date!(2026 - 11 - 11)));
        // A budget the average never reaches this month.
        let f = forecast(&input("1000", "100"), date!(2026 - 11 - 10));
        assert_eq!(f.exhausts_on, None);
        // Spent already: today. Nothing spent: never.
        assert_eq!(
            forecast(&input("50", "50"), date!(2026 - 11 - 3)).exhausts_on,
            Some(date!(2026 - 11 - 3))
        );
        let f = forecast(&input("50", "0"), date!(2026 - 11 - 3));
        assert_eq!((f.exhausts_on, f.forecast_usd.as_str()), (None, "0.0000"));
    }

    #[test]
    fn thirds_are_exact() {
        // $1 in 3 days of a 31-day month: 10.3333 forecast; $2 budget: 1/3 a day needs 3 more.
        let f = forecast(&input("2", "1"), date!(2026 - 12 - 03));
        assert_eq!(f.forecast_usd, "10.3333");
        assert_eq!(f.exhausts_on, Some(date!(2026 - 12 - 06)));
    }
}
