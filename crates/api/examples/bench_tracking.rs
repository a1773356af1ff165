//! Benchmark of pull-request tracking (docs/contract.md#9-performance-targets; docs/benchmarks.md).
//!
//! 1. **Poll cost.** 50 repositories holding 1,000 open agent pull requests on the fake
//!    GitHub (127.0.0.1), one task in `pr_opened` per pull request: the requests of one poll
//!    cycle when nothing changed and when 10 pull requests were merged, beside polling each
//!    pull request individually (`GET /repos/{o}/{r}/pulls/{n}`, the naive way).
//! 2. **Webhook merge → `completed`.** The real application on 127.0.0.1 (2 workers) over a
//!    fresh database, N tasks in `pr_opened`; an open-loop sender posts N signed
//!    `pull_request`/`closed` deliveries (GitHub's payload, merged), each for another task,
//!    at a fixed rate. The task is completed before the answer, so the response time is the
//!    merge → `completed` latency; every task is checked afterwards.
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_tracking -- \
//!     [--deliveries 2000] [--rate 200] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{HttpServer, web};
use agentry_api::state::AppState;
use agentry_codehost::{ClientConfig, GitHub};
use agentry_domain::{AgentType, RepoUrl, TaskState};
use agentry_fake_github::FakeGitHub;
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::secrets::{self, MasterKey, SecretValue};
use agentry_persistence::tasks::{self, TaskFilter};
use agentry_persistence::{AnyConnection, Db};
use agentry_service::codehost::{self, CodeHost, Timing};
use agentry_service::tracking;

type Error = Box<dyn std::error::Error + Send + Sync>;

const TOKEN: &str = "ghp_benchmarkTokenValue0123456789";
const SECRET: &str = "whsec-benchmark";

struct Args {
    deliveries: usize,
    rate: u32,
    pg: Option<String>,
}

fn args() -> Result<Args, Error> {
    let mut a = Args {
        deliveries: 2000,
        rate: 200,
        pg: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--deliveries" => a.deliveries = value.parse()?,
            "--rate" => a.rate = value.parse()?,
            "--pg" => a.pg = Some(value),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

fn state(db: &Db, api_url: &str, key: MasterKey) -> Result<web::Data<AppState>, Error> {
    // Benchmarks run no agents.
    let service = agentry_service::Service::new(
        db.clone(),
        CodeHost::new(
            key,
            ClientConfig {
                api_url: api_url.into(),
                ..ClientConfig::default()
            },
            Timing::default(),
        ),
        agentry_service::runs::Runs::disabled(
            std::env::temp_dir().join("agentry-bench-idle-runner"),
        ),
    );
    Ok(web::Data::new(AppState::new(service)?))
}

fn connect(conn: &mut AnyConnection, owner: &str, name: &str) -> Result<Repository, Error> {
    let new = NewRepository {
        url: RepoUrl::parse(&format!("https://github.com/{owner}/{name}"))?,
        default_branch: "main".into(),
        clone_url: format!("https://github.com/{owner}/{name}.git"),
        codehost_id: None,
    };
    Ok(repos::connect_repository(conn, &new, agentry_persistence::now())?.0)
}

/// An assigned issue whose (imagined) run opened pull request `pr`.
fn task_with_pull(
    conn: &mut AnyConnection,
    repo: &Repository,
    issue: i64,
    pr: i64,
) -> Result<(), Error> {
    let now = agentry_persistence::now();
    let (task, _) = codehost::assign(conn, repo, issue, "Fix", "", AgentType::ClaudeCode, now)?;
    agentry_persistence::test_support::open_pull_request(conn, task.id, pr, now)?;
    Ok(())
}

fn count_in(conn: &mut AnyConnection, state: TaskState) -> Result<usize, Error> {
    let filter = TaskFilter {
        state: Some(state),
        ..TaskFilter::default()
    };
    let mut n = 0;
    let mut cursor = None;
    loop {
        let page = tasks::list_tasks(conn, &filter, 200, cursor.as_ref())?;
        n += page.tasks.len();
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(n),
        }
    }
}

fn poll_cost(db: &Db) -> Result<(), Error> {
    let fake = FakeGitHub::try_start()?;
    fake.add_token(TOKEN, "agentry-bot");
    let key = MasterKey::generate()?;
    let mut conn = db.conn()?;
    secrets::put(
        &mut conn,
        &key,
        codehost::TOKEN_SECRET,
        &SecretValue::new(TOKEN),
        agentry_persistence::now(),
    )?;
    let mut pulls = Vec::new();
    for r in 0..50 {
        let name = format!("repo{r:02}");
        fake.add_repo("acme", &name, "main");
        let repo = connect(&mut conn, "acme", &name)?;
        for p in 0..20 {
            let issue = fake.add_issue("acme", &name, &format!("Issue {p}"), None, &[]);
            let pr = fake.add_pull("acme", &name, "Fix", &format!("agentry/task-{p}"), "main");
            task_with_pull(&mut conn, &repo, i64::try_from(issue)?, i64::try_from(pr)?)?;
            pulls.push((name.clone(), pr));
        }
    }
    drop(conn);
    let state = state(db, &fake.base_url(), key)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cycle = |label: &str| -> Result<(), Error> {
        fake.reset_counts();
        let t = Instant::now();
        let outcomes = rt.block_on(tracking::poll_pull_requests(&state.service))?;
        let elapsed = t.elapsed();
        let applied: usize = outcomes.iter().map(|(_, o)| o.applied).sum();
        println!(
            "  {label:<34} {:>5} requests ({:>4} answered 304), {applied:>2} tasks moved, {:>7.1} ms",
            fake.requests().len(),
            fake.count_status(304),
            elapsed.as_secs_f64() * 1e3
        );
        Ok(())
    };
    println!("poll of 50 repositories with 1,000 open agent pull requests:");
    cycle("first poll (no watermark yet)")?;
    cycle("nothing changed")?;
    fake.advance_clock(Duration::from_secs(60));
    for (name, pr) in pulls.iter().step_by(100).take(10) {
        fake.merge_pull("acme", name, *pr);
    }
    cycle("10 merged (in 10 repositories)")?;
    cycle("nothing changed again")?;
    // The naive way: one request per open pull request.
    let github = GitHub::new(
        &ClientConfig {
            api_url: fake.base_url(),
            ..ClientConfig::default()
        },
        TOKEN,
    )?;
    fake.reset_counts();
    let t = Instant::now();
    rt.block_on(async {
        for (name, pr) in &pulls {
            github.pull("acme", name, *pr).await?;
        }
        Ok::<_, agentry_codehost::CodeHostError>(())
    })?;
    println!(
        "  {:<34} {:>5} requests ({:>4} answered 304), {:>7.1} ms",
        "baseline: GET each pull request",
        fake.requests().len(),
        fake.count_status(304),
        t.elapsed().as_secs_f64() * 1e3
    );
    let completed = count_in(&mut *db.conn()?, TaskState::Completed)?;
    if completed != 10 {
        return Err(format!("{completed} tasks completed, expected 10").into());
    }
    Ok(())
}

fn webhook_latency(db: &Db, deliveries: usize, rate: u32) -> Result<(), Error> {
    let mut conn = db.conn()?;
    let repo = connect(&mut conn, "codertocat", "hello-world")?;
    for n in 1..=deliveries {
        let n = i64::try_from(n)?;
        task_with_pull(&mut conn, &repo, n, n)?;
    }
    drop(conn);
    let fixture = std::fs::read_to_string(format!(
        "{}/../codehost/tests/fixtures/github-webhooks/pull_request.closed.payload.json",
        env!("CARGO_MANIFEST_DIR")
    ))?
    .replace("\"merged\": false", "\"merged\": true")
    .replace(
        "\"merged_at\": null",
        "\"merged_at\": \"2026-11-22T10:00:00Z\"",
    );
    if !fixture.contains("\"number\": 2,") {
        return Err("the fixture changed".into());
    }
    let bodies: Vec<(String, Vec<u8>)> = (1..=deliveries)
        .map(|n| {
            let body = fixture
                .replace("\"number\": 2,", &format!("\"number\": {n},"))
                .into_bytes();
            (
                agentry_codehost::webhook::sign(SECRET.as_bytes(), &body),
                body,
            )
        })
        .collect();

    let state = state(db, "http://127.0.0.1:9", MasterKey::generate()?)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let server_thread = std::thread::spawn(move || -> std::io::Result<()> {
        actix_web::rt::System::new().block_on(async move {
            let server =
                HttpServer::new(move || agentry_api::app::build_app(state.clone(), Vec::new()))
                    .workers(2)
                    .listen(listener)?
                    .run();
            let _ = tx.send(server.handle());
            server.await
        })
    });
    let handle = rx.recv()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = reqwest::Client::new();
    let uri = Arc::new(format!("http://{addr}/api/webhooks/codehost"));
    let interval = Duration::from_secs(1) / rate;
    let started = Instant::now();
    let mut latencies: Vec<Duration> = rt.block_on(async {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut sent = Vec::with_capacity(bodies.len());
        for (i, (signature, body)) in bodies.into_iter().enumerate() {
            ticker.tick().await;
            let (client, uri) = (client.clone(), uri.clone());
            sent.push(tokio::spawn(async move {
                let t = Instant::now();
                let res = client
                    .post(uri.as_str())
                    .header("X-GitHub-Event", "pull_request")
                    .header("X-GitHub-Delivery", format!("bench-{i}"))
                    .header("X-Hub-Signature-256", signature)
                    .header("Content-Type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                let status = res.status();
                let text = res.text().await?;
                if status != 200 || text != r#"{"ok":true}"# {
                    return Err(format!("{status} {text}").into());
                }
                Ok::<_, Error>(t.elapsed())
            }));
        }
        let mut out = Vec::with_capacity(sent.len());
        for s in sent {
            out.push(s.await??);
        }
        Ok::<_, Error>(out)
    })?;
    let wall = started.elapsed();
    actix_web::rt::System::new().block_on(handle.stop(true));
    server_thread
        .join()
        .map_err(|_| "server thread panicked")??;
    let completed = count_in(&mut *db.conn()?, TaskState::Completed)?;
    if completed != deliveries {
        return Err(format!("{completed} of {deliveries} tasks completed").into());
    }
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64) * q).ceil() as usize;
        latencies[i.saturating_sub(1).min(latencies.len() - 1)]
    };
    println!(
        "  {deliveries} deliveries at {rate}/s (sent over {:.1} s): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {completed} tasks completed",
        wall.as_secs_f64(),
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args = args()?;
    let dir = tempfile::tempdir()?;
    let sqlite = |name: &str| -> Result<Db, Error> {
        let db = Db::connect(&format!("sqlite://{}", dir.path().join(name).display()), 8)?;
        db.migrate()?;
        Ok(db)
    };
    poll_cost(&sqlite("poll.db")?)?;
    println!("webhook merge -> completed, response time over HTTP:");
    print!("  sqlite    ");
    webhook_latency(&sqlite("webhook.db")?, args.deliveries, args.rate)?;
    if let Some(pg) = &args.pg {
        let name = format!("agentry_bench_{}", std::process::id());
        {
            use diesel::prelude::*;
            let mut admin = diesel::PgConnection::establish(pg)?;
            diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut admin)?;
        }
        let url = agentry_persistence::test_support::database_url(pg, &name);
        let db = Db::connect(&url, 16)?;
        db.migrate()?;
        print!("  postgres  ");
        webhook_latency(&db, args.deliveries, args.rate)?;
    }
    Ok(())
}
