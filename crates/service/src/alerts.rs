//! Budget alerts (docs/contract.md#67-budgets): at 50 %, 80 % and 100 % of each monthly
//! budget, once per budget, month and threshold; recorded, and delivered to the optional
//! outbound webhook `AGENTRY_ALERT_WEBHOOK_URL`.
//!
//! [`Service::check_budget_alerts`] runs after a run's cost is recorded (a run ends or a
//! lost run is recovered), after a budget changes, and once when the background loops
//! start (a process that died between recording a run and checking finds it then). The
//! storage's unique key makes each alert one row however many replicas check at once.
//!
//! Delivery goes through the alert rows as an outbox, with the service's one leased delivery
//! worker (the code-host outbox's too): `alert_step` claims due alerts with a lease, POSTs
//! each (its id also in the `Idempotency-Key` header), marks it delivered on a 2xx answer,
//! and otherwise retries with capped exponential backoff. A receiver sees an alert once,
//! unless it took one and the answer was lost (then the same id comes again).

use std::fmt;
use std::time::Duration;

use agentry_domain::BudgetScope;
use agentry_domain::backoff::Backoff;
use agentry_persistence::alerts::{self, BudgetAlert};
use uuid::Uuid;

use crate::background::{Pass, StepResult};
use crate::config::WebhookUrl;
use crate::delivery::{self, Worker};
use crate::wake::Loops;
use crate::{Service, ServiceError, now};

/// Delivery timings of the alert webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlertTiming {
    /// Delay before the first retry; doubled after each failure.
    pub retry_base: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// How long a claimed alert stays its worker's (a dead worker's alerts are due again
    /// after it). Longer than `request_timeout`, so a slow answer is never sent twice.
    pub lease: Duration,
    /// Longest sleep of the worker when nothing is due (it also wakes when told to).
    pub idle: Duration,
    /// Longest wait for the webhook's answer.
    pub request_timeout: Duration,
}

impl Default for AlertTiming {
    fn default() -> Self {
        AlertTiming {
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(600),
            lease: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            request_timeout: Duration::from_secs(15),
        }
    }
}

/// The alert webhook of a service: where alerts go (if anywhere), the HTTP client, and the
/// wake-up of the delivery loop.
pub struct Alerts {
    webhook: Option<(WebhookUrl, reqwest::Client)>,
    timing: AlertTiming,
    /// The alerts' delivery worker.
    pub(crate) delivery: Worker<BudgetAlert>,
}

impl fmt::Debug for Alerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerts")
            .field("webhook", &self.webhook.as_ref().map(|(url, _)| url))
            .field("timing", &self.timing)
            .finish()
    }
}

impl Alerts {
    /// Alerts recorded only (no webhook): each is stored as `unsent`.
    pub fn disabled() -> Alerts {
        Alerts::with_webhook(None, AlertTiming::default())
    }

    /// Alerts delivered to `webhook` (when given) with `timing`. Fails only if the HTTP
    /// client cannot be built (no TLS roots).
    pub fn new(webhook: Option<WebhookUrl>, timing: AlertTiming) -> Result<Alerts, String> {
        let webhook = match webhook {
            None => None,
            Some(url) => {
                let client = reqwest::Client::builder()
                    .timeout(timing.request_timeout)
                    .connect_timeout(timing.request_timeout)
                    // A redirect could take the alert (and the request) somewhere else.
                    .redirect(reqwest::redirect::Policy::none())
                    .user_agent(format!("agentry/{}", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| format!("cannot build the alert webhook's client: {e}"))?;
                Some((url, client))
            }
        };
        Ok(Alerts::with_webhook(webhook, timing))
    }

    fn with_webhook(webhook: Option<(WebhookUrl, reqwest::Client)>, timing: AlertTiming) -> Self {
        let backoff = Backoff {
            base: timing.retry_base,
            max: timing.retry_max,
        };
        Alerts {
            webhook,
            timing,
            delivery: Worker::new(
                &alerts::QUEUE,
                "budget alert",
                timing.lease,
                backoff,
                timing.idle,
            ),
        }
    }

    /// Whether a webhook is configured.
    pub(crate) fn webhook_configured(&self) -> bool {
        self.webhook.is_some()
    }
}

/// The JSON body POSTed for an alert. `text` is what a Slack incoming webhook shows; the
/// other members are for programs.
pub fn payload(alert: &BudgetAlert) -> serde_json::Value {
    let month = format!(
        "{:04}-{:02}",
        alert.month.year(),
        u8::from(alert.month.month())
    );
    let repo_url = alert.repo_url.as_ref().map(ToString::to_string);
    let whose = match (&alert.scope, &repo_url) {
        (BudgetScope::Repository, Some(url)) => format!("the monthly budget of {url}"),
        _ => "the instance's monthly budget".to_owned(),
    };
    let text = format!(
        "agentry: {whose} has reached {}% in {month}: ${} spent of ${}.",
        alert.threshold, alert.spent, alert.budget
    );
    let created_at = alert
        .created_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    serde_json::json!({
        "text": text,
        "id": alert.id.to_string(),
        "event": "budget_alert",
        "scope": alert.scope.as_str(),
        "repoUrl": repo_url,
        "month": month,
        "threshold": alert.threshold,
        "spentUsd": alert.spent.to_string(),
        "monthlyBudgetUsd": alert.budget.to_string(),
        "createdAt": created_at,
    })
}

/// Why one delivery attempt failed, without the URL (it may hold a credential).
async fn post(
    client: &reqwest::Client,
    url: &WebhookUrl,
    alert: &BudgetAlert,
) -> Result<(), String> {
    let response = client
        .post(url.expose().clone())
        .header("Idempotency-Key", alert.id.to_string())
        .json(&payload(alert))
        .send()
        .await
        .map_err(|e| e.without_url().to_string())?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the webhook answered HTTP {}", status.as_u16()))
    }
}

/// One page of recorded alerts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertPage {
    /// The alerts, newest first.
    pub alerts: Vec<BudgetAlert>,
    /// The alert to continue after (the last of this page); `None` on the last page.
    pub next: Option<Uuid>,
}

impl Service {
    /// Records the budget alerts reached this month and not yet recorded (by this process or
    /// any other), then wakes the delivery loop if there are new ones. Returns them.
    pub async fn check_budget_alerts(&self) -> Result<Vec<BudgetAlert>, ServiceError> {
        let deliver = self.parts.alerts.webhook_configured();
        let recorded = self
            .db(move |conn| Ok(alerts::check(conn, now(), deliver)?))
            .await?;
        for a in &recorded {
            tracing::info!(
                alert = %a.id, scope = a.scope.as_str(),
                repo = a.repo_url.as_ref().map(ToString::to_string),
                threshold = a.threshold, spent = %a.spent, budget = %a.budget,
                "budget alert"
            );
        }
        self.wake(Loops::ALERTS.when(deliver && !recorded.is_empty()));
        Ok(recorded)
    }

    /// [`Service::check_budget_alerts`] where a failure must not stop the caller (after a
    /// run, after a budget change): it is logged, and the next check finds the alert.
    pub(crate) async fn check_budget_alerts_logged(&self) {
        if let Err(e) = self.check_budget_alerts().await {
            tracing::warn!(error = %e, "could not check the budget alerts");
        }
    }

    /// A page of recorded alerts, newest first: up to `limit` (1–200), after the alert
    /// `after` (the last of the previous page).
    pub async fn budget_alerts(
        &self,
        limit: i64,
        after: Option<Uuid>,
    ) -> Result<AlertPage, ServiceError> {
        if !(1..=alerts::MAX_PAGE).contains(&limit) {
            return Err(ServiceError::invalid(
                "limit",
                format!("expected 1 to {}", alerts::MAX_PAGE),
            ));
        }
        let mut alerts = self
            .db(move |conn| Ok(alerts::list(conn, limit + 1, after)?))
            .await?;
        let more = alerts.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        alerts.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let next = if more {
            alerts.last().map(|a| a.id)
        } else {
            None
        };
        Ok(AlertPage { alerts, next })
    }

    /// Delivers the alerts due at `at` to the webhook; returns how many were delivered.
    /// Without a webhook, does nothing.
    pub async fn deliver_due_alerts(
        &self,
        at: time::OffsetDateTime,
    ) -> Result<usize, ServiceError> {
        let Some((url, client)) = &self.parts.alerts.webhook else {
            return Ok(0);
        };
        delivery::deliver_due(
            self,
            &self.parts.alerts.delivery,
            at,
            |alert: BudgetAlert| async move { post(client, url, &alert).await },
        )
        .await
    }
}

/// The alert loop's step: the `first` checks the budgets (and without a webhook the loop
/// ends there); each then delivers the due alerts and says when the next is due.
pub(crate) async fn alert_step(service: &Service, first: bool) -> StepResult {
    if first {
        service.check_budget_alerts_logged().await;
    }
    if !service.parts.alerts.webhook_configured() {
        return Ok(Pass::Stop);
    }
    delivery::step(service, &service.parts.alerts.delivery, || {
        service.deliver_due_alerts(now())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_checked_and_never_shown_whole() {
        for refused in [
            "http://hooks.example.com/x",
            "http://10.0.0.1/x",
            "ftp://example.com/x",
            "https://user:pw@example.com/x",
            "not a url",
        ] {
            assert!(WebhookUrl::parse(refused).is_err(), "{refused}");
        }
        for allowed in [
            "https://hooks.slack.com/services/T0/B0/secret",
            "http://127.0.0.1:9000/alerts",
            "http://[::1]:9000/",
            "http://localhost/",
        ] {
            assert!(WebhookUrl::parse(allowed).is_ok(), "{allowed}");
        }
        let url = WebhookUrl::parse("https://hooks.slack.com/services/T0/B0/secret").unwrap();
        assert!(!format!("{url:?} {url}").contains("secret"));
        let alerts = Alerts::new(Some(url), AlertTiming::default()).unwrap();
        assert!(!format!("{alerts:?}").contains("secret"));
    }
}
