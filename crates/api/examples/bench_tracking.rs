//! Benchmark of pull-request tracking (docs/contract.md#9-performance-targets; docs/benchmarks.md).
//!
//! 1. **Poll cost.** `--repos` repositories (default 50) holding `--pulls` open agent pull
//!    requests (default 1,000, spread evenly) on the fake GitHub (127.0.0.1), one task in
//!    `pr_opened` per pull request: the requests, 304s and rate-limit units of one poll
//!    cycle when nothing changed and when 10 pull requests were merged, with its wall time
//!    and where an unchanged cycle's time goes (database reads against the conditional
//!    requests alone), beside polling each pull request individually
//!    (`GET /repos/{o}/{r}/pulls/{n}`, the naive way). `--history N` first gives each
//!    repository N closed pull requests (the history a first poll reads). `--rtt-ms` puts a delay line on
//!    127.0.0.1 between the client and the fake that adds that much to every request, as a
//!    real code host's latency would (the baseline is then left out).
//! 2. **Webhook merge → `completed`.** The real application on 127.0.0.1 (2 workers) over a
//!    fresh database, N tasks in `pr_opened`; an open-loop sender posts N signed
//!    `pull_request`/`closed` deliveries (GitHub's payload, merged), each for another task,
//!    at a fixed rate. The task is completed before the answer, so the response time is the
//!    merge → `completed` latency; every task is checked afterwards. `--deliveries 0` skips
//!    it.
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_tracking -- \
//!     [--repos 50] [--pulls 1000] [--history 0] [--rtt-ms 0] \
//!     [--deliveries 2000] [--rate 200] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web;
use agentry_api::state::AppState;
use agentry_codehost::{ClientConfig, Conditional, GitHub};
use agentry_domain::{AgentType, TaskState};
use agentry_fake_github::FakeGitHub;
use agentry_persistence::repos::Repository;
use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::tasks::{self, TaskFilter};
use agentry_persistence::{AnyConnection, Db, DbError, pulls, write_tx};
use agentry_service::codehost;
use agentry_service::tracking::POLL_CONCURRENCY;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

#[path = "common/bench.rs"]
mod bench;

use bench::{Error, ms, percentile};

const TOKEN: &str = "ghp_benchmarkTokenValue0123456789";
const SECRET: &str = "whsec-benchmark-secret";

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Repositories with open agent pull requests.
    #[arg(long, default_value_t = 50, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    repos: usize,
    /// Open agent pull requests over all repositories.
    #[arg(long, default_value_t = 1000)]
    pulls: usize,
    /// Older closed pull requests per repository.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Milliseconds added to every code-host request.
    #[arg(long = "rtt-ms", value_name = "MS", default_value = "0", value_parser = millis)]
    rtt: Duration,
    /// Webhook deliveries sent (0: the poll part only).
    #[arg(long, default_value_t = 2000)]
    deliveries: usize,
    /// Deliveries per second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// A PostgreSQL server's URL: measure there too.
    #[arg(long)]
    pg: Option<String>,
}

fn millis(text: &str) -> Result<Duration, std::num::ParseIntError> {
    text.parse().map(Duration::from_millis)
}

fn state(db: &Db, api_url: &str, key: MasterKey) -> Result<web::Data<AppState>, Error> {
    let codehost = bench::code_host(api_url).with_webhook_secret(Some(SecretValue::new(SECRET)));
    bench::state(db, key, codehost)
}

/// Connects `https://github.com/{owner}/{name}` now ([`bench::connect_repo`]).
fn connect(conn: &mut AnyConnection, owner: &str, name: &str) -> Result<Repository, Error> {
    bench::connect_repo(conn, owner, name, agentry_persistence::now())
}

/// An assigned issue whose (imagined) run opened pull request `pr`.
fn task_with_pull(
    conn: &mut AnyConnection,
    repo: &Repository,
    issue: i64,
    pr: i64,
) -> Result<(), DbError> {
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

/// The fake's address (`http://127.0.0.1:PORT` → `127.0.0.1:PORT`).
fn socket_of(base_url: &str) -> Result<SocketAddr, Error> {
    Ok(base_url
        .strip_prefix("http://")
        .ok_or("the fake's URL is not http://")?
        .parse()?)
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (a delay line: the
/// chunks behind it are read meanwhile, so only latency is added, not a rate limit).
async fn delay_line(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + delay;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// A TCP proxy on 127.0.0.1 in front of `upstream` that delays every byte by `rtt / 2` in
/// each direction, so each request over it takes `rtt` longer, as over a link with that
/// round-trip time (a code host's own processing time included). Runs on `rt`.
fn start_delay_proxy(
    rt: &tokio::runtime::Runtime,
    upstream: SocketAddr,
    rtt: Duration,
) -> Result<SocketAddr, Error> {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let one_way = rtt / 2;
    rt.spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    delay_line(client_read, server_write, one_way),
                    delay_line(server_read, client_write, one_way)
                );
            });
        }
    });
    Ok(addr)
}

/// The poll benchmark: `repos` repositories holding `pulls` open agent pull requests (spread
/// evenly) after `history` closed ones each, with `rtt` added to every request to the code
/// host.
fn poll_cost(
    db: &Db,
    repos: usize,
    pulls: usize,
    history: usize,
    rtt: Duration,
) -> Result<(), Error> {
    let fake = FakeGitHub::try_start()?;
    fake.add_token(TOKEN, "agentry-bot");
    let key = MasterKey::generate()?;
    let mut conn = db.conn()?;
    bench::store_codehost_token(&mut conn, &key, TOKEN)?;
    let setup = Instant::now();
    let by_repo = seed_pulls(&mut conn, &fake, repos, pulls, history)?;
    drop(conn);
    println!(
        "poll of {repos} repositories with {pulls} open agent pull requests \
         and {history} closed ones each (set up in {:.1} s), {} ms added to each request:",
        setup.elapsed().as_secs_f64(),
        rtt.as_millis()
    );
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let api_url = if rtt.is_zero() {
        fake.base_url()
    } else {
        let proxy = start_delay_proxy(&proxy_rt, socket_of(&fake.base_url())?, rtt)?;
        format!("http://{proxy}")
    };
    let state = state(db, &api_url, key)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cycle = |label: &str| -> Result<Duration, Error> {
        fake.reset_counts();
        let units = fake.rate_limit_remaining();
        let t = Instant::now();
        let outcomes = rt.block_on(state.service.poll_pull_requests())?;
        let elapsed = t.elapsed();
        let applied: usize = outcomes.iter().map(|(_, o)| o.applied).sum();
        let failed = outcomes.iter().filter(|(_, o)| o.error.is_some()).count();
        if failed > 0 {
            return Err(format!("{failed} repositories failed to poll").into());
        }
        println!(
            "  {label:<34} {:>5} requests ({:>5} answered 304, {:>5} rate-limit units), \
             {applied:>2} tasks moved, {:>9.1} ms",
            fake.requests().len(),
            fake.count_status(304),
            units.saturating_sub(fake.rate_limit_remaining()),
            ms(elapsed)
        );
        Ok(elapsed)
    };
    cycle("first poll (no watermark yet)")?;
    let unchanged = cycle("nothing changed")?;
    unchanged_cycle_breakdown(db, &fake, &rt, &state, unchanged)?;
    fake.advance_clock(Duration::from_secs(60));
    let step = (repos / 10).max(1);
    let mut merged = 0;
    for (name, numbers) in by_repo.iter().step_by(step) {
        if let Some(pr) = numbers.first()
            && merged < 10
        {
            fake.merge_pull("acme", name, *pr);
            merged += 1;
        }
    }
    cycle(&format!("{merged} merged (in {merged} repositories)"))?;
    cycle("nothing changed again")?;
    let completed = count_in(&mut *db.conn()?, TaskState::Completed)?;
    if completed != merged {
        return Err(format!("{completed} tasks completed, expected {merged}").into());
    }
    if !rtt.is_zero() {
        // The naive way would take `pulls` × rtt one by one: not worth waiting for.
        return Ok(());
    }
    naive_baseline(&fake, &rt, &by_repo, pulls)
}

/// The code host's repositories with `history` closed pull requests each, then `pulls` open
/// agent pull requests spread evenly, each with its task in the database; gives each
/// repository's name and open pull request numbers.
fn seed_pulls(
    conn: &mut AnyConnection,
    fake: &FakeGitHub,
    repos: usize,
    pulls: usize,
    history: usize,
) -> Result<Vec<(String, Vec<u64>)>, Error> {
    let mut by_repo: Vec<(String, Vec<u64>)> = Vec::with_capacity(repos);
    let name_of = |r: usize| format!("repo{r:05}");
    for r in 0..repos {
        fake.add_repo("acme", &name_of(r), "main");
        for h in 0..history {
            let old = fake.add_pull("acme", &name_of(r), "Old", &format!("old-{h}"), "main");
            fake.close_pull("acme", &name_of(r), old);
        }
    }
    if history > 0 {
        // The history is a day older than agentry's pull requests, as it would be.
        fake.advance_clock(Duration::from_secs(86_400));
    }
    for r in 0..repos {
        let name = name_of(r);
        let repo = connect(conn, "acme", &name)?;
        let here = pulls / repos + usize::from(r < pulls % repos);
        // One transaction per repository (each task's own is a savepoint of it): the same
        // rows as one by one, written faster.
        let numbers = write_tx(conn, |conn| -> Result<Vec<u64>, DbError> {
            let mut numbers = Vec::with_capacity(here);
            for p in 0..here {
                let issue = fake.add_issue("acme", &name, &format!("Issue {p}"), None, &[]);
                let pr = fake.add_pull("acme", &name, "Fix", &format!("agentry/task-{p}"), "main");
                let (issue, pr_number) = match (i64::try_from(issue), i64::try_from(pr)) {
                    (Ok(i), Ok(n)) => (i, n),
                    _ => return Err(DbError::Corrupt("issue number out of range".into())),
                };
                task_with_pull(conn, &repo, issue, pr_number)?;
                numbers.push(pr);
            }
            Ok(numbers)
        })?;
        by_repo.push((name, numbers));
    }
    Ok(by_repo)
}

/// Where the time of an unchanged cycle goes: the database reads, then the same conditional
/// requests sent by the client alone, as many at once as the poller sends.
fn unchanged_cycle_breakdown(
    db: &Db,
    fake: &FakeGitHub,
    rt: &tokio::runtime::Runtime,
    state: &web::Data<AppState>,
    unchanged: Duration,
) -> Result<(), Error> {
    let t = Instant::now();
    let to_poll = pulls::repos_to_poll(&mut *db.conn()?)?;
    let db_read = t.elapsed();
    let t = Instant::now();
    let github = rt.block_on(state.service.github())?;
    let token_read = t.elapsed();
    fake.reset_counts();
    let t = Instant::now();
    let not_modified = rt.block_on(async {
        futures_util::stream::iter(&to_poll)
            .map(|(repo, poll)| {
                github.pulls_updated_since(
                    repo.url.owner(),
                    repo.url.name(),
                    poll.etag.as_deref(),
                    poll.watermark.or(poll.first_since),
                )
            })
            .buffer_unordered(POLL_CONCURRENCY)
            .filter(|answer| std::future::ready(matches!(answer, Ok(Conditional::NotModified))))
            .count()
            .await
    });
    let http = t.elapsed();
    println!(
        "  {:<34} repositories to poll {:.1} ms, token {:.1} ms, {} conditional requests \
         ({not_modified} answered 304) {POLL_CONCURRENCY} at a time {:.1} ms, of {:.1} ms",
        "where an unchanged cycle's time goes:",
        ms(db_read),
        ms(token_read),
        to_poll.len(),
        ms(http),
        ms(unchanged),
    );
    Ok(())
}

/// The naive way: one request per open pull request, from a full rate-limit window.
fn naive_baseline(
    fake: &FakeGitHub,
    rt: &tokio::runtime::Runtime,
    by_repo: &[(String, Vec<u64>)],
    pulls: usize,
) -> Result<(), Error> {
    // The naive way: one request per open pull request, from a full rate-limit window.
    let github = GitHub::new(
        &ClientConfig {
            api_url: fake.base_url(),
            ..ClientConfig::default()
        },
        TOKEN,
    )?;
    fake.set_rate_limit_remaining(5000);
    fake.reset_counts();
    let t = Instant::now();
    let answered = rt.block_on(async {
        let mut answered = 0usize;
        for (name, numbers) in by_repo {
            for pr in numbers {
                match github.pull("acme", name, *pr).await {
                    Ok(_) => answered += 1,
                    // The window's 5,000 units are spent: the rest would wait for the next.
                    Err(agentry_codehost::CodeHostError::RateLimited { .. }) => {
                        return Ok(answered);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok::<_, agentry_codehost::CodeHostError>(answered)
    })?;
    let limited = if answered < pulls {
        format!(", rate limit exhausted after {answered} of {pulls}")
    } else {
        String::new()
    };
    println!(
        "  {:<34} {:>5} requests ({:>5} answered 304{limited}), {:>9.1} ms",
        "baseline: GET each pull request",
        fake.requests().len(),
        fake.count_status(304),
        ms(t.elapsed())
    );
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
    let served = bench::serve(state)?;
    let addr = served.addr;
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
    served.stop()?;
    let completed = count_in(&mut *db.conn()?, TaskState::Completed)?;
    if completed != deliveries {
        return Err(format!("{completed} of {deliveries} tasks completed").into());
    }
    let mut at = |p: usize| percentile(&mut latencies, p);
    println!(
        "  {deliveries} deliveries at {rate}/s (sent over {:.1} s): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {completed} tasks completed",
        wall.as_secs_f64(),
        ms(at(50)),
        ms(at(99)),
        ms(at(100)),
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let args = <Args as clap::Parser>::parse();
    let dir = tempfile::tempdir()?;
    let sqlite = |name: &str| -> Result<Db, Error> {
        let db = Db::connect(&format!("sqlite://{}", dir.path().join(name).display()), 8)?;
        db.migrate()?;
        Ok(db)
    };
    poll_cost(
        &sqlite("poll.db")?,
        args.repos,
        args.pulls,
        args.history,
        args.rtt,
    )?;
    if args.deliveries == 0 {
        return Ok(());
    }
    println!("webhook merge -> completed, response time over HTTP:");
    print!("  sqlite    ");
    webhook_latency(&sqlite("webhook.db")?, args.deliveries, args.rate)?;
    if let Some(pg) = &args.pg {
        let name = format!("agentry_bench_{}", std::process::id());
        let url = agentry_persistence::test_support::fresh_database(pg, &name)?;
        let db = Db::connect(&url, 16)?;
        db.migrate()?;
        print!("  postgres  ");
        webhook_latency(&db, args.deliveries, args.rate)?;
    }
    Ok(())
}
