//! Budget alerts (docs/contract.md#67-budgets): at 50 %, 80 % and 100 % of each monthly
//! budget, one alert per budget, month and threshold, and its delivery to the outbound
//! webhook.
//!
//! [`check`] compares every budget that is set with its month's spend and records the
//! thresholds reached. The unique key (budget, month, threshold) decides: each insert runs
//! in its own savepoint, so of two replicas (or a process and its restart) that find the
//! same threshold reached, exactly one records it and the other gets nothing back.
//!
//! A recorded alert is also its own outbox entry: `pending` alerts are delivered through the
//! alerts' leased delivery [`QUEUE`] ([`crate::delivery`]): claimed under a lease, then
//! marked delivered or failed (which schedules the retry). An alert recorded while no
//! webhook is configured is `unsent` and never delivered.

use agentry_domain::{BudgetScope, RepoUrl, Usd};
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::budgets::{instance_budget, month_start, repository_budgets, spent_nanos};
use crate::connection::insert_once;
use crate::convert::{self, from_db, opt_from_db, to_db};
use crate::fetch::Fetch;
use crate::schema::budget_alerts;
use crate::{AnyConnection, DbError};

/// The thresholds, in percent of the budget, at which an alert is recorded.
pub const THRESHOLDS: [i32; 3] = [50, 80, 100];

/// The most alerts one page of [`list`] holds.
pub const MAX_PAGE: i64 = 200;

/// Where an alert stands with the outbound webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// To be delivered (or being delivered, or waiting for a retry).
    Pending,
    /// The webhook answered with a 2xx status.
    Delivered,
    /// Recorded while no webhook was configured: never delivered.
    Unsent,
}

agentry_domain::wire_enum!(Delivery, "alert delivery state", [
    Pending => "pending",
    Delivered => "delivered",
    Unsent => "unsent",
]);

/// A recorded budget alert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetAlert {
    /// Its id (UUID v7, time-ordered); also the webhook's idempotency key.
    pub id: Uuid,
    /// Which budget.
    pub scope: BudgetScope,
    /// The repository, for a repository's budget.
    pub repo_id: Option<Uuid>,
    /// The repository's URL, for a repository's budget.
    pub repo_url: Option<RepoUrl>,
    /// The first day (UTC) of the month it is for.
    pub month: time::Date,
    /// 50, 80 or 100 (percent of the budget).
    pub threshold: i32,
    /// The month's spend when the alert was recorded.
    pub spent: Usd,
    /// The budget when the alert was recorded.
    pub budget: Usd,
    /// When it was recorded.
    pub created_at: OffsetDateTime,
    /// Its delivery state.
    pub delivery: Delivery,
    /// Failed delivery attempts so far.
    pub attempts: i32,
    /// When a pending alert is due next (the retry time, or the end of a worker's lease).
    pub next_attempt_at: OffsetDateTime,
    /// When the webhook took it.
    pub delivered_at: Option<OffsetDateTime>,
    /// What went wrong at the last failed attempt.
    pub last_error: Option<String>,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = budget_alerts)]
struct AlertRow {
    id: String,
    scope: String,
    repo_id: Option<String>,
    repo_url: Option<String>,
    month: String,
    threshold: i32,
    spent_nanos: i64,
    budget_nanos: i64,
    created_at: PrimitiveDateTime,
    delivery: String,
    attempts: i32,
    next_attempt_at: PrimitiveDateTime,
    delivered_at: Option<PrimitiveDateTime>,
    last_error: Option<String>,
}

impl TryFrom<AlertRow> for BudgetAlert {
    type Error = DbError;

    fn try_from(r: AlertRow) -> Result<BudgetAlert, DbError> {
        Ok(BudgetAlert {
            id: convert::uuid(&r.id)?,
            scope: convert::parse("budget scope", &r.scope)?,
            repo_id: convert::opt_uuid(r.repo_id.as_deref())?,
            repo_url: r
                .repo_url
                .as_deref()
                .map(|u| convert::parse("repository URL", u))
                .transpose()?,
            month: parse_month(&r.month)?,
            threshold: r.threshold,
            spent: convert::usd_of(r.spent_nanos)?,
            budget: convert::usd_of(r.budget_nanos)?,
            created_at: from_db(r.created_at),
            delivery: r.delivery.parse()?,
            attempts: r.attempts,
            next_attempt_at: from_db(r.next_attempt_at),
            delivered_at: opt_from_db(r.delivered_at),
            last_error: r.last_error,
        })
    }
}

/// `YYYY-MM` of the month of `now` (UTC).
pub fn month_key(now: OffsetDateTime) -> String {
    let start = month_start(now);
    format!("{:04}-{:02}", start.year(), u8::from(start.month()))
}

fn parse_month(text: &str) -> Result<time::Date, DbError> {
    let corrupt = || DbError::Corrupt(format!("invalid alert month {text:?}"));
    let (year, month) = text.split_once('-').ok_or_else(corrupt)?;
    let year: i32 = year.parse().map_err(|_| corrupt())?;
    let month: u8 = month.parse().map_err(|_| corrupt())?;
    let month = time::Month::try_from(month).map_err(|_| corrupt())?;
    time::Date::from_calendar_date(year, month, 1).map_err(|_| corrupt())
}

/// The thresholds a month's spend has reached: those `t` with `spent ≥ t % × budget`, compared
/// exactly, and only once something was spent (a zero budget with nothing spent reaches
/// none; with any spend it reaches all three).
pub fn reached(spent_nanos: i64, budget_nanos: i64) -> Vec<i32> {
    if spent_nanos <= 0 {
        return Vec::new();
    }
    THRESHOLDS
        .into_iter()
        .filter(|t| i128::from(spent_nanos) * 100 >= i128::from(budget_nanos) * i128::from(*t))
        .collect()
}

/// One budget that is set, as [`check`] sees it.
struct Budget {
    key: String,
    scope: BudgetScope,
    repo: Option<(Uuid, String)>,
    nanos: i64,
}

/// Records the alerts every budget that is set has reached in `now`'s month and not had yet:
/// the instance's and each connected repository's. Returns the alerts recorded by this call
/// (none when another caller recorded them first). `deliver` says whether they go to the
/// webhook (`pending`) or not (`unsent`, no webhook configured).
///
/// A budget whose three alerts of the month exist already is not looked at again, so a
/// check after every run costs one small read once the thresholds are passed.
pub fn check(
    conn: &mut AnyConnection,
    now: OffsetDateTime,
    deliver: bool,
) -> Result<Vec<BudgetAlert>, DbError> {
    let month = month_key(now);
    let mut set = Vec::new();
    if let Some(budget) = instance_budget(conn)? {
        set.push(Budget {
            key: BudgetScope::Instance.as_str().to_owned(),
            scope: BudgetScope::Instance,
            repo: None,
            nanos: budget.to_nanos(),
        });
    }
    for (id, url, nanos) in repository_budgets(conn, None)? {
        set.push(Budget {
            key: id.clone(),
            scope: BudgetScope::Repository,
            repo: Some((convert::uuid(&id)?, url)),
            nanos,
        });
    }
    if set.is_empty() {
        return Ok(Vec::new());
    }
    let had: Vec<(String, i32)> = budget_alerts::table
        .filter(budget_alerts::month.eq(&month))
        .select((budget_alerts::budget_key, budget_alerts::threshold))
        .load(conn)?;
    let mut recorded = Vec::new();
    for budget in set {
        let missing = |t: &i32| !had.iter().any(|(k, h)| *k == budget.key && h == t);
        if !THRESHOLDS.iter().any(missing) {
            continue;
        }
        let spent = spent_nanos(conn, budget.repo.as_ref().map(|(id, _)| *id), now)?;
        for threshold in reached(spent, budget.nanos)
            .into_iter()
            .filter(|t| missing(t))
        {
            if let Some(alert) = record(conn, &budget, &month, threshold, spent, now, deliver)? {
                recorded.push(alert);
            }
        }
    }
    Ok(recorded)
}

/// Inserts one alert unless (budget, month, threshold) exists; `None` when it did.
fn record(
    conn: &mut AnyConnection,
    budget: &Budget,
    month: &str,
    threshold: i32,
    spent: i64,
    now: OffsetDateTime,
    deliver: bool,
) -> Result<Option<BudgetAlert>, DbError> {
    let id = Uuid::now_v7().to_string();
    let at = to_db(now);
    let delivery = if deliver {
        Delivery::Pending
    } else {
        Delivery::Unsent
    };
    // Its own savepoint: a concurrent insert of the same key (a unique violation) leaves a
    // caller's transaction usable.
    let inserted = insert_once(conn, |conn| {
        diesel::insert_into(budget_alerts::table)
            .values((
                budget_alerts::id.eq(&id),
                budget_alerts::budget_key.eq(&budget.key),
                budget_alerts::scope.eq(budget.scope.as_str()),
                budget_alerts::repo_id.eq(budget.repo.as_ref().map(|(id, _)| id.to_string())),
                budget_alerts::repo_url.eq(budget.repo.as_ref().map(|(_, url)| url.clone())),
                budget_alerts::month.eq(month),
                budget_alerts::threshold.eq(threshold),
                budget_alerts::spent_nanos.eq(spent),
                budget_alerts::budget_nanos.eq(budget.nanos),
                budget_alerts::created_at.eq(at),
                budget_alerts::delivery.eq(delivery.as_str()),
                budget_alerts::attempts.eq(0),
                budget_alerts::next_attempt_at.eq(at),
                budget_alerts::delivered_at.eq(None::<PrimitiveDateTime>),
                budget_alerts::last_error.eq(None::<String>),
            ))
            .execute(conn)
    })?;
    if !inserted {
        return Ok(None);
    }
    Ok(Some(get(conn, convert::uuid(&id)?)?))
}

/// One alert. [`DbError::NotFound`] for an unknown id.
pub fn get(conn: &mut AnyConnection, id: Uuid) -> Result<BudgetAlert, DbError> {
    budget_alerts::table
        .find(id.to_string())
        .select(AlertRow::as_select())
        .get_as(conn)
}

/// Up to `limit` alerts (1 to [`MAX_PAGE`] + 1, so a caller can ask one more than a page to
/// tell whether another follows), newest first (by id, a time-ordered UUID v7), starting
/// after the alert `after` (the last of the previous page) when given.
pub fn list(
    conn: &mut AnyConnection,
    limit: i64,
    after: Option<Uuid>,
) -> Result<Vec<BudgetAlert>, DbError> {
    let mut query = budget_alerts::table
        .order(budget_alerts::id.desc())
        .limit(limit.clamp(1, MAX_PAGE + 1))
        .select(AlertRow::as_select())
        .into_boxed();
    if let Some(after) = after {
        query = query.filter(budget_alerts::id.lt(after.to_string()));
    }
    query.load_as(conn)
}

crate::delivery::queue! {
    /// The alerts as a leased delivery queue ([`crate::delivery`]): `pending` alerts, claimed
    /// oldest first; delivery makes them `delivered` and sets `delivered_at`.
    pub const QUEUE: Queue<BudgetAlert> = budget_alerts as AlertRow {
        pending: "delivery = 'pending'",
        delivered: "delivery = 'delivered', delivered_at = #1",
        order: "id",
    }
}
