//! Budget alerts (docs/contract.md#67-budgets): recorded when a budget changes or a run
//! ends, listed at `GET /api/budget/alerts`, exported as `agentry_budget_used_ratio`, and
//! delivered to a webhook on 127.0.0.1 exactly once through its failures and a restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::env::json_req;
use crate::common::*;
use actix_web::web;
use agentry_api::state::AppState;
use agentry_domain::Usd;
use agentry_persistence::Db;
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::tasks::{self, Run};
use agentry_persistence::test_support::TestDb;
use agentry_service::alerts::{AlertTiming, Alerts};
use agentry_service::config::WebhookUrl;
use agentry_testkit::wait::eventually_async;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
struct Receipt {
    idempotency_key: Option<String>,
    body: Value,
    status: u16,
}

/// A webhook on 127.0.0.1 that answers 500 to its first `fail_first` requests, then 200.
struct Receiver {
    url: String,
    log: Arc<Mutex<Vec<Receipt>>>,
}

impl Receiver {
    async fn start(fail_first: usize) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // The path stands for a chat webhook's secret path.
        let url = format!("http://{}/hook/s3cr3t", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        actix_web::rt::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = shared.clone();
                actix_web::rt::spawn(async move { serve(socket, &log, fail_first).await });
            }
        });
        Receiver { url, log }
    }

    fn receipts(&self) -> Vec<Receipt> {
        self.log.lock().unwrap().clone()
    }

    /// The bodies it answered 200, by alert id.
    fn delivered(&self) -> Vec<Value> {
        self.receipts()
            .into_iter()
            .filter(|r| r.status == 200)
            .map(|r| r.body)
            .collect()
    }

    /// Waits (at most 30 s) until `n` requests were answered 200.
    async fn wait_for_deliveries(&self, n: usize) {
        let what = format!("{n} deliveries");
        eventually_async(PATIENCE, what, async || {
            if self.delivered().len() >= n {
                Ok(())
            } else {
                Err(format!("{:#?}", self.receipts()))
            }
        })
        .await;
    }
}

async fn serve(mut socket: tokio::net::TcpStream, log: &Mutex<Vec<Receipt>>, fail_first: usize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + length {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = serde_json::from_slice(&buf[header_end..header_end + length]).unwrap_or(Value::Null);
    let status = {
        let mut log = log.lock().unwrap();
        let status = if log.len() < fail_first { 500 } else { 200 };
        log.push(Receipt {
            idempotency_key: header("idempotency-key"),
            body,
            status,
        });
        status
    };
    let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = socket.write_all(answer.as_bytes()).await;
    let _ = socket.shutdown().await;
}

/// Application state over `db` whose alerts go to `webhook` (if any), with fast retries.
fn state_with_alerts(db: &Db, webhook: Option<&str>) -> web::Data<AppState> {
    let alerts = Alerts::new(
        webhook.map(|url| WebhookUrl::parse(url).unwrap()),
        AlertTiming {
            retry_base: Duration::from_millis(50),
            retry_max: Duration::from_millis(200),
            lease: Duration::from_secs(30),
            idle: Duration::from_millis(200),
            request_timeout: Duration::from_secs(5),
        },
    )
    .unwrap();
    state_of(agentry_service::Service::with_alerts(
        db.clone(),
        agentry_persistence::secrets::MasterKey::generate().unwrap(),
        rig::no_code_host(),
        rig::idle_runs(),
        alerts,
    ))
}

fn connect(db: &Db) -> Repository {
    repos::connect_repository(
        &mut db.conn().unwrap(),
        &NewRepository {
            url: agentry_domain::RepoUrl::parse("https://github.com/acme/web").unwrap(),
            default_branch: "main".into(),
            clone_url: "https://github.com/acme/web.git".into(),
            codehost_id: Some(1),
        },
        agentry_persistence::now(),
    )
    .unwrap()
    .0
}

/// A queued coding task of `repo`.
fn queued(db: &Db, repo: &Repository) -> agentry_domain::Task {
    create(
        db,
        &tasks::NewTask {
            repo_id: Some(repo.id),
            ..new_task(
                "https://github.com/acme/web",
                agentry_domain::TaskType::Coding,
                agentry_persistence::now(),
            )
        },
    )
}

/// Records a finished run of a new task of `repo` that cost `cost`, finished now (as a run
/// recorded by another process would be: nothing here checks the budgets).
fn spend(db: &Db, repo: &Repository, cost: &str) {
    let task = queued(db, repo);
    let at = agentry_persistence::now();
    tasks::record_run(
        &mut db.conn().unwrap(),
        &Run {
            model: Some("sonnet".into()),
            cost_usd: Some(Usd::parse(cost).unwrap()),
            tokens: agentry_domain::Tokens::from_uncached(1, 0, 0, 1),
            turns: Some(1),
            sandboxed: Some(true),
            ..agentry_persistence::test_support::succeeded_run(task.id, task.attempt, at)
        },
    )
    .unwrap();
    tasks::transition_task(
        &mut db.conn().unwrap(),
        task.id,
        agentry_domain::Trigger::Cancel,
        &tasks::TransitionDetails::default(),
        at,
    )
    .unwrap();
}

/// Waits (at most 30 s) until the worker has recorded every alert as delivered (the receiver
/// answers before the worker records it).
async fn wait_until_all_delivered(state: &web::Data<AppState>) {
    eventually_async(PATIENCE, "every alert delivered", async || {
        let page = state.service.budget_alerts(200, None).await.unwrap();
        if page
            .alerts
            .iter()
            .all(|a| a.delivery == agentry_persistence::alerts::Delivery::Delivered)
        {
            Ok(())
        } else {
            Err(format!("{page:#?}"))
        }
    })
    .await;
}

fn this_month() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!("{:04}-{:02}", now.year(), u8::from(now.month()))
}

/// A $1 instance budget set after $0.85 was spent: the 50 % and 80 % alerts are recorded at
/// once and reach a webhook that fails its first 3 requests, each exactly once (with its id
/// as the idempotency key). A "restarted" service over the same database records and sends
/// nothing again; the 100 % alert it records later is delivered once too.
async fn alerts_reach_a_failing_webhook_once_and_not_again_after_a_restart(db: TestDb) {
    let receiver = Receiver::start(3).await;
    let web = connect(&db.db);
    let t = tokens(&db.db);
    spend(&db.db, &web, "0.85");
    let state = state_with_alerts(&db.db, Some(&receiver.url));
    let app = service_with(state.clone()).await;
    let worker = agentry_service::BackgroundLoop::alerts().start(&state.service);
    let (status, body) = call(
        &app,
        json_req(
            "PUT",
            "/api/budget",
            &t.admin,
            &json!({"monthlyBudgetUsd": "1"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    receiver.wait_for_deliveries(2).await;

    let receipts = receiver.receipts();
    assert_eq!(
        receipts.len(),
        5,
        "3 failures, then 2 deliveries: {receipts:#?}"
    );
    let delivered = receiver.delivered();
    let mut thresholds: Vec<i64> = delivered
        .iter()
        .map(|b| b["threshold"].as_i64().unwrap())
        .collect();
    thresholds.sort_unstable();
    assert_eq!(thresholds, [50, 80]);
    for r in &receipts {
        assert_eq!(r.idempotency_key.as_deref(), r.body["id"].as_str(), "{r:?}");
    }
    let eighty = delivered.iter().find(|b| b["threshold"] == 80).unwrap();
    assert_eq!(
        eighty["text"],
        format!(
            "agentry: the instance's monthly budget has reached 80% in {}: $0.85 spent of $1.",
            this_month()
        )
    );
    assert_eq!(eighty["event"], "budget_alert");
    assert_eq!(eighty["scope"], "instance");
    assert_eq!(eighty["repoUrl"], Value::Null);
    assert_eq!(eighty["spentUsd"], "0.85");
    assert_eq!(eighty["monthlyBudgetUsd"], "1");

    // The record shows each delivered (the receiver answers before the worker records
    // it), with the failed attempts it took.
    let page = eventually_async(PATIENCE, "every alert marked delivered", async || {
        let (status, page) = call(&app, get("/api/budget/alerts", &t.viewer)).await;
        assert_eq!(status, 200, "{page}");
        let alerts = page["alerts"].as_array().unwrap();
        if alerts.iter().all(|a| a["delivery"] == "delivered") {
            Ok(page)
        } else {
            Err(format!("{page:#}"))
        }
    })
    .await;
    let alerts = page["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 2, "{page:#}");
    assert_eq!(page["nextCursor"], Value::Null);
    let attempts: i64 = alerts
        .iter()
        .map(|a| a["deliveryAttempts"].as_i64().unwrap())
        .sum();
    assert_eq!(attempts, 3, "{page:#}");
    assert!(
        !page.to_string().contains("s3cr3t"),
        "the URL is never shown"
    );
    let failed = alerts
        .iter()
        .find(|a| a["deliveryAttempts"].as_i64().unwrap() > 0)
        .unwrap();
    assert_eq!(failed["lastError"], "the webhook answered HTTP 500");
    worker.abort();
    drop(app);
    drop(state);

    // A restart: a new service over the same database checks at start and finds nothing
    // new, and nothing is due even an hour on.
    let state = state_with_alerts(&db.db, Some(&receiver.url));
    let check = async || state.service.check_budget_alerts().await.unwrap();
    assert!(check().await.is_empty());
    let later = agentry_persistence::now() + time::Duration::hours(1);
    assert_eq!(state.service.deliver_due_alerts(later).await.unwrap(), 0);
    assert_eq!(receiver.receipts().len(), 5);
    // Past 100 %: recorded once, delivered once.
    spend(&db.db, &web, "0.15");
    let recorded = check().await;
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].threshold, 100);
    assert!(check().await.is_empty());
    let worker = agentry_service::BackgroundLoop::alerts().start(&state.service);
    receiver.wait_for_deliveries(3).await;
    wait_until_all_delivered(&state).await;
    worker.abort();
    assert_eq!(
        state.service.deliver_due_alerts(later).await.unwrap(),
        0,
        "nothing left to send"
    );
    let ids: std::collections::HashSet<String> = receiver
        .delivered()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(receiver.delivered().len(), 3);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    alerts_reach_a_failing_webhook_once_and_not_again_after_a_restart
);

/// A repository's budget reached by spend recorded elsewhere: the end of the next run here
/// records the alert (without a webhook, `unsent`). The gauge shows each budget's use, and
/// the list refuses bad parameters.
#[actix_web::test]
async fn a_run_that_ends_records_the_alerts_and_the_gauge_shows_the_use() {
    let db = sqlite();
    let t = tokens(&db.db);
    let web = connect(&db.db);
    repos::patch_settings(
        &mut db.db.conn().unwrap(),
        web.id,
        agentry_persistence::now(),
        |s| s.apply_patch(&json!({"monthlyBudgetUsd": "1"})),
    )
    .unwrap()
    .unwrap();
    agentry_persistence::budgets::set_instance_budget(
        &mut db.db.conn().unwrap(),
        Some(Usd::parse("4").unwrap()),
        agentry_persistence::now(),
    )
    .unwrap();
    spend(&db.db, &web, "0.6");
    let state = state_with_alerts(&db.db, None);
    let app = service_with(state.clone()).await;
    let (status, page) = call(&app, get("/api/budget/alerts", &t.viewer)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["alerts"], json!([]), "nothing checked yet");

    // The run fails at once (no code-host token is stored); its end checks the budgets.
    let task = queued(&db.db, &web);
    assert_eq!(state.service.run_next().await.unwrap(), Some(task.id));
    let (status, page) = call(&app, get("/api/budget/alerts?limit=1", &t.viewer)).await;
    assert_eq!(status, 200, "{page}");
    let alert = &page["alerts"][0];
    assert_eq!(alert["scope"], "repository", "{page:#}");
    assert_eq!(alert["repoUrl"], "https://github.com/acme/web");
    assert_eq!(alert["month"], this_month());
    assert_eq!(alert["threshold"], 50);
    assert_eq!(alert["spentUsd"], "0.6");
    assert_eq!(alert["monthlyBudgetUsd"], "1");
    assert_eq!(alert["delivery"], "unsent");
    assert_eq!(alert["deliveryAttempts"], 0);
    assert_eq!(alert["deliveredAt"], Value::Null);
    assert_eq!(page["alerts"].as_array().unwrap().len(), 1);
    assert_eq!(page["nextCursor"], Value::Null);

    // The gauge: 0.6 of the repository's dollar, 0.15 of the instance's four.
    let text = metrics_text(&app, &t.viewer).await;
    assert!(
        text.contains("# TYPE agentry_budget_used_ratio gauge"),
        "{text}"
    );
    assert!(
        text.contains(
            "agentry_budget_used_ratio{repo=\"https://github.com/acme/web\",scope=\"repository\"} 0.6\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("agentry_budget_used_ratio{repo=\"\",scope=\"instance\"} 0.15\n"),
        "{text}"
    );

    for bad in ["limit=0", "limit=201", "limit=x", "cursor=nope", "since=1"] {
        let (status, body) = call(&app, get(&format!("/api/budget/alerts?{bad}"), &t.viewer)).await;
        assert_eq!(status, 400, "{bad}: {body}");
        envelope(&body, "invalid_parameter");
    }
    assert_unauthenticated(&app, anonymous_get("/api/budget/alerts")).await;
}
