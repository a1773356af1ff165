//! Prometheus metrics: request counts and latencies per route, and the recorded agent run
//! cost (computed from the database at each scrape), rendered at `/metrics`.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};
use rust_decimal::Decimal;

/// One series of `agentry_cost_usd_total`: the exact recorded run cost of a repository,
/// model and task type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCost {
    /// The repository URL (label `repo`).
    pub repo: String,
    /// The run's model, `unknown` when none was recorded (label `model`).
    pub model: String,
    /// `coding` or `review` (label `task_type`).
    pub task_type: String,
    /// The exact sum, in USD.
    pub usd: Decimal,
}

/// One series of `agentry_budget_used_ratio`: how much of a monthly budget this month has
/// spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetUse {
    /// `instance` or `repository` (label `scope`).
    pub scope: String,
    /// The repository URL, empty for the instance's budget (label `repo`).
    pub repo: String,
    /// The month's spend, in USD.
    pub spent: Decimal,
    /// The budget, in USD.
    pub budget: Decimal,
}

impl BudgetUse {
    /// `spent / budget`; for a zero budget 0 while nothing is spent and +Inf after.
    pub fn ratio(&self) -> Result<f64, prometheus::Error> {
        if self.budget.is_zero() {
            return Ok(if self.spent.is_zero() {
                0.0
            } else {
                f64::INFINITY
            });
        }
        let ratio = self
            .spent
            .checked_div(self.budget)
            .ok_or_else(|| prometheus::Error::Msg("budget ratio overflows".into()))?;
        exposed(ratio)
    }
}

/// An exact value as the nearest `f64`, through its decimal text (never by float
/// arithmetic on parts).
fn exposed(value: Decimal) -> Result<f64, prometheus::Error> {
    let text = value.normalize().to_string();
    text.parse()
        .map_err(|e| prometheus::Error::Msg(format!("{text}: {e}")))
}

/// A labelled metric: its name under the `agentry` prefix, its help text and its label
/// names.
struct MetricSpec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

impl MetricSpec {
    /// The metric, made by `make` (`IntCounterVec::new`, `GaugeVec::new`, …) from its name,
    /// help and labels.
    fn build<M>(
        &self,
        make: impl FnOnce(Opts, &[&str]) -> Result<M, prometheus::Error>,
    ) -> Result<M, prometheus::Error> {
        make(Opts::new(self.name, self.help), self.labels)
    }
}

/// `agentry_http_requests_total`.
const HTTP_REQUESTS: MetricSpec = MetricSpec {
    name: "http_requests_total",
    help: "HTTP requests answered, by route and status.",
    labels: &["method", "route", "status"],
};

/// `agentry_egress_blocked_total`.
const EGRESS_BLOCKED: MetricSpec = MetricSpec {
    name: "egress_blocked_total",
    help: "Connections of sandboxed agents the egress proxy refused, by repository.",
    labels: &["repo"],
};

/// `agentry_budget_used_ratio`.
const BUDGET_USED: MetricSpec = MetricSpec {
    name: "budget_used_ratio",
    help: "Share of each monthly budget spent this UTC month (1 = all of it), by scope and repository.",
    labels: &["scope", "repo"],
};

/// `agentry_cost_usd_total`.
const COST: MetricSpec = MetricSpec {
    name: "cost_usd_total",
    help: "Recorded cost of agent runs in US dollars, by repository, model and task type.",
    labels: &["repo", "model", "task_type"],
};

/// The families of a metric computed at a scrape: the metric of `spec` (made by `make`),
/// registered alone under the `agentry` prefix, with a series `set` for each of `items`;
/// none without items.
fn scraped<M: Collector + Clone + 'static, T>(
    spec: &MetricSpec,
    make: impl FnOnce(Opts, &[&str]) -> Result<M, prometheus::Error>,
    items: &[T],
    set: impl Fn(&M, &T) -> Result<(), prometheus::Error>,
) -> Result<Vec<MetricFamily>, prometheus::Error> {
    let metric = spec.build(make)?;
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let scrape = Registry::new_custom(Some("agentry".into()), None)?;
    scrape.register(Box::new(metric.clone()))?;
    for item in items {
        set(&metric, item)?;
    }
    Ok(scrape.gather())
}

/// The service's metric registry.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
}

impl Metrics {
    /// Creates the registry with the HTTP metrics registered.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some("agentry".into()), None)?;
        let requests = HTTP_REQUESTS.build(IntCounterVec::new)?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request latency, by route.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ]),
            &["method", "route"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
        })
    }

    /// Records one answered request.
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[method, route, &status.to_string()])
            .inc();
        self.latency
            .with_label_values(&[method, route])
            .observe(seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        self.render_with_costs(&[])
    }

    /// The Prometheus text exposition of every metric plus the counter
    /// `agentry_cost_usd_total{repo,model,task_type}` holding `costs`.
    ///
    /// The counter is read from the database at each scrape, so every replica exposes the
    /// same totals; each exact sum becomes the nearest `f64` here, at exposition, through its
    /// decimal text (never by float arithmetic on parts).
    pub fn render_with_costs(&self, costs: &[RunCost]) -> Result<String, prometheus::Error> {
        self.render_scrape(costs, &[], &[])
    }

    /// [`Metrics::render_with_costs`] plus the gauge
    /// `agentry_budget_used_ratio{scope,repo}`: for each monthly budget that is set, the
    /// share of it this UTC month has spent (1 = all of it; above 1 after an overshoot), read
    /// from the database at each scrape.
    ///
    /// And the counter `agentry_egress_blocked_total{repo}`: the connections the egress
    /// proxy refused to sandboxed agents, by repository URL (`egress`, read from the
    /// database at each scrape, so every replica exposes the same totals).
    pub fn render_scrape(
        &self,
        costs: &[RunCost],
        budgets: &[BudgetUse],
        egress: &[(String, i64)],
    ) -> Result<String, prometheus::Error> {
        let mut families = self.registry.gather();
        families.extend(scraped(
            &EGRESS_BLOCKED,
            IntCounterVec::new,
            egress,
            |counter, (repo, count)| {
                counter
                    .with_label_values(&[repo.as_str()])
                    .inc_by(u64::try_from(*count).unwrap_or(0));
                Ok(())
            },
        )?);
        families.extend(scraped(
            &BUDGET_USED,
            GaugeVec::new,
            budgets,
            |gauge, b| {
                gauge
                    .with_label_values(&[b.scope.as_str(), b.repo.as_str()])
                    .set(b.ratio()?);
                Ok(())
            },
        )?);
        families.extend(scraped(&COST, CounterVec::new, costs, |counter, c| {
            counter
                .with_label_values(&[c.repo.as_str(), c.model.as_str(), c.task_type.as_str()])
                .inc_by(exposed(c.usd)?);
            Ok(())
        })?);
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        TextEncoder::new().encode(&families, &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// The method label: one of the methods the API serves, or `OTHER`, so that requests with
/// made-up methods (anyone can send them, unauthenticated) cannot grow the label set.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

/// Middleware: times each request, counts it by method (see [`method_label`]) and route
/// pattern (never by raw path, so ids and made-up paths do not explode the label set) and
/// logs one line.
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let start = Instant::now();
    let method = req.method().to_string();
    let method_label = method_label(req.method());
    let path = req.path().to_owned();
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let res = next.call(req).await?;
    let elapsed = start.elapsed();
    let route = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let status = res.status().as_u16();
    if let Some(metrics) = metrics {
        metrics.observe(method_label, &route, status, elapsed.as_secs_f64());
    }
    tracing::info!(
        target: "agentry::http",
        method = %method,
        path = %path,
        status,
        micros = elapsed.as_micros() as u64,
        "request"
    );
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget_use(spent: &str, budget: &str) -> BudgetUse {
        BudgetUse {
            scope: "instance".into(),
            repo: String::new(),
            spent: spent.parse().unwrap(),
            budget: budget.parse().unwrap(),
        }
    }

    #[test]
    fn budget_use_is_spend_over_budget_and_a_zero_budget_is_zero_then_infinite() {
        assert_eq!(budget_use("0", "10").ratio().unwrap(), 0.0);
        assert_eq!(budget_use("2.5", "10").ratio().unwrap(), 0.25);
        assert_eq!(budget_use("1", "3").ratio().unwrap(), 1.0 / 3.0);
        assert_eq!(budget_use("12", "10").ratio().unwrap(), 1.2);
        assert_eq!(budget_use("0", "0").ratio().unwrap(), 0.0);
        assert_eq!(
            budget_use("0.000000001", "0").ratio().unwrap(),
            f64::INFINITY
        );
        let text = Metrics::new()
            .unwrap()
            .render_scrape(&[], &[budget_use("0.000000001", "0")], &[])
            .unwrap();
        // The encoder writes infinity as `inf`, which Prometheus' parser reads as +Inf.
        assert!(
            text.contains("agentry_budget_used_ratio{repo=\"\",scope=\"instance\"} inf\n"),
            "{text}"
        );
    }
}
