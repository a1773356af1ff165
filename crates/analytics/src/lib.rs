//! # agentry-analytics
//!
//! agentry's cost report (docs/contract.md#4-cost-report, `GET /api/analytics/costs` and `agentry costs`) as pure
//! functions over plain data: no database, no I/O, no clock.
//!
//! The report is computed in two steps so that storage never has to hand every task over:
//!
//! 1. [`ReportInputs`] is the input contract: pre-aggregated [`Totals`] (per day, per
//!    repository, per task type, per model, …) plus two short candidate lists of
//!    [`TaskFact`]s (anomaly and top-task candidates). Storage builds it with `GROUP BY`
//!    queries or rollups; [`ReportInputs::from_tasks`] builds it the straightforward way
//!    from a full task list (tests, benchmark baseline).
//! 2. [`report`] turns the inputs into a [`CostReport`], whose serde form is exactly the JSON
//!    of docs/contract.md#42-members.
//!
//! [`Window`] is the report's period (the `days` UTC days ending today) and
//! [`anomaly_threshold_nanos`] lets storage fetch anomaly candidates with an index.
//!
//! Money is exact end to end: every sum, comparison and rounding works on
//! [`rust_decimal::Decimal`] (or exact integers), never on floating point. Conversion to a JSON
//! number happens only when the report is serialised.

pub mod budgets;
mod exact;
mod inputs;
mod report;
mod window;
mod wire;

pub use inputs::{OutcomeTotals, ReportInputs, TaskFact, Totals, anomaly_threshold_nanos};
pub use report::{
    Anomaly, ChartCost, CostReport, CostedTask, DailyCost, Forecast, ModelCost, ModelOutcome,
    ModelSuggestion, OutcomeFigures, Outcomes, RepoCost, RepoOutcome, Summary, TopTask, TypeCost,
    report,
};
pub use window::{MAX_DAYS, Window, WindowError};

#[cfg(test)]
mod tests;
