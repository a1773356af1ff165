//! Benchmark of API reads while an agent floods its egress proxy (docs/benchmarks.md,
//! "Egress flood"): the latency of `GET /api/tasks/{id}` and `GET /api/tasks` while the
//! run's proxy refuses `--connects` connections (default 20,000).
//!
//! On a fresh database (`--tasks` tasks, default 200, on one repository) it serves the real
//! application on 127.0.0.1 (2 workers) and times `--requests` reads of each endpoint with a
//! viewer token while nothing else happens ("idle"). Then, for each way of recording
//! refusals, it serves a run's egress proxy on a Unix socket (the real `egress::serve`, on a
//! Tokio runtime of 2 workers, with an empty allow-list) and floods it from 8 concurrent
//! clients, each sending `CONNECT host:port` and reading the 403; three connects in four go
//! to one host, every fourth to a new `host:port`. Meanwhile (from the flood's start until
//! its last refusal is in the database) one client reads the task being flooded and the
//! task list alternately, as fast as answers come, each read timed.
//! The ways:
//!
//! - `batched`: agentry's [`RunRefusals`]: counted in memory, written at most once a
//!   second and when the run's network closes, at most 32 destinations listed;
//! - `per-refusal`: the write pattern it replaced, one write transaction per refusal
//!   (`metering::record_blocked` on a blocking thread; the rows are bounded as today).
//!
//! After the flood the recorder is dropped (the run's network closes) and the count in the
//! database must reach exactly the connects made. Printed: the flood's rate, the write
//! transactions, the reads' median and 99th percentile, the task detail's size.
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_egress -- \
//!     [--connects 20000] [--requests 300] [--tasks 200] [--pg postgres://USER@127.0.0.1:PORT/postgres]
//! ```
//! Without `--pg` only SQLite is measured.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentry_agent_network::egress::{self, EgressEvents, EgressPolicy};
use agentry_agent_network::network::RunRefusals;
use agentry_domain::EgressPattern;
use agentry_persistence::{Db, metering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use uuid::Uuid;

#[path = "common/bench.rs"]
mod bench;

use bench::{Error, ms, percentile};

/// Concurrent clients of the flood.
const FLOODERS: u64 = 8;

/// How long the count may take to reach the database once the flood is over.
const SETTLE: Duration = Duration::from_secs(60);

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Connects the flooding agent makes.
    #[arg(long, default_value_t = 20_000)]
    connects: u64,
    /// Timed reads per measurement.
    #[arg(long, default_value_t = 300)]
    requests: usize,
    /// Tasks in the database.
    #[arg(long, default_value_t = 200)]
    tasks: u64,
    /// A PostgreSQL server's URL: measure there too.
    #[arg(long)]
    pg: Option<String>,
}

/// One way of recording refusals.
#[derive(Clone, Copy)]
enum Mode {
    Batched,
    PerRefusal,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Batched => "batched",
            Mode::PerRefusal => "per-refusal",
        }
    }
}

/// The recording before batching: one write transaction per refusal.
struct PerRefusal {
    db: Db,
    task: Uuid,
    writes: AtomicU64,
}

impl EgressEvents for PerRefusal {
    fn blocked(&self, host: &str, port: u16, _why: &str) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let (db, task, host) = (self.db.clone(), self.task, host.to_owned());
        tokio::task::spawn_blocking(move || {
            let written = db.conn().map_err(|e| e.to_string()).and_then(|mut conn| {
                metering::record_blocked(
                    &mut conn,
                    task,
                    1,
                    &host,
                    port,
                    agentry_persistence::now(),
                )
                .map_err(|e| e.to_string())
            });
            if let Err(e) = written {
                eprintln!("could not record a refusal: {e}");
            }
        });
    }
}

/// The repository and `n` tasks on it; their ids.
fn seed(db: &Db, n: u64) -> Result<Vec<Uuid>, Error> {
    let mut conn = db.conn()?;
    let now = agentry_persistence::now();
    let repo = bench::connect_repo(&mut conn, "bench", "egress", now)?;
    let n = usize::try_from(n)?;
    Ok(agentry_persistence::test_support::create_coding_tasks(
        &mut conn, &repo, n, now,
    )?)
}

/// `CONNECT host:port` through the proxy at `socket`; whether it answered 403.
async fn refused(socket: &Path, host: &str, port: u16) -> Result<bool, Error> {
    let mut stream = UnixStream::connect(socket).await?;
    stream
        .write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(answer.starts_with(b"HTTP/1.1 403 "))
}

/// `connects` refused connects from [`FLOODERS`] concurrent clients: three in four to one
/// host, every fourth to a new `host:port`.
async fn flood(socket: &Path, connects: u64) -> Result<(), Error> {
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..FLOODERS {
        let socket = socket.to_owned();
        clients.spawn(async move {
            let mut i = c;
            while i < connects {
                let ok = if i % 4 == 3 {
                    let port = u16::try_from(1_000 + i % 60_000).unwrap_or(1_000);
                    refused(&socket, &format!("h{i}.flood.example"), port).await?
                } else {
                    refused(&socket, "flood.example", 443).await?
                };
                if !ok {
                    return Err::<(), Error>("a connect was not refused with 403".into());
                }
                i += FLOODERS;
            }
            Ok(())
        });
    }
    while let Some(done) = clients.join_next().await {
        done??;
    }
    Ok(())
}

/// The refusals recorded for `task`, summed, and its rows.
fn recorded(db: &Db, task: Uuid) -> Result<(i64, usize), Error> {
    let rows = metering::task_blocked(&mut *db.conn()?, task)?;
    Ok((rows.iter().map(|r| r.count).sum(), rows.len()))
}

/// Median and 99th percentile of `times`, in milliseconds.
fn summary(times: &mut [Duration]) -> String {
    format!(
        "median {:.2} ms, p99 {:.2} ms",
        ms(percentile(times, 50)),
        ms(percentile(times, 99))
    )
}

/// One flood of `task`'s proxy recorded the `mode` way, with reads timed meanwhile.
fn flooded(
    db: &Db,
    base: &str,
    token: &str,
    task: Uuid,
    mode: Mode,
    connects: u64,
) -> Result<(), Error> {
    let client = reqwest::blocking::Client::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("proxy.sock");
    let (recorder, events): (Option<RunRefusals>, Arc<dyn EgressEvents>) = match mode {
        Mode::Batched => {
            let r = runtime.block_on(async { RunRefusals::start(db.clone(), task, 1, "bench") });
            let events = r.events();
            (Some(r), events)
        }
        Mode::PerRefusal => (
            None,
            Arc::new(PerRefusal {
                db: db.clone(),
                task,
                writes: AtomicU64::new(0),
            }),
        ),
    };
    let proxy = runtime.block_on(async {
        let listener = UnixListener::bind(&socket)?;
        let nothing: [EgressPattern; 0] = [];
        Ok::<_, Error>(egress::serve(listener, EgressPolicy::new(nothing), events))
    })?;
    let (detail_uri, list_uri) = (
        format!("{base}/api/tasks/{task}"),
        format!("{base}/api/tasks"),
    );
    // The reader: from the flood's start until its last refusal is in the database.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, client) = (Arc::clone(&stop), client.clone());
        let (detail_uri, list_uri, token) = (detail_uri.clone(), list_uri, token.to_owned());
        std::thread::spawn(move || -> Result<(Vec<Duration>, Vec<Duration>), Error> {
            let (mut detail, mut list) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::SeqCst) {
                for (uri, times) in [(&detail_uri, &mut detail), (&list_uri, &mut list)] {
                    let t = Instant::now();
                    let res = client.get(uri.as_str()).bearer_auth(&token).send()?;
                    let status = res.status();
                    let body = res.bytes()?;
                    if !status.is_success() {
                        let body = String::from_utf8_lossy(&body);
                        return Err(format!("{status}: {body}").into());
                    }
                    times.push(t.elapsed());
                }
            }
            Ok((detail, list))
        })
    };
    let start = Instant::now();
    let flooding = runtime.block_on(flood(&socket, connects));
    let took = start.elapsed();
    if let Err(e) = flooding {
        stop.store(true, Ordering::SeqCst);
        return Err(e);
    }
    let writes = match &recorder {
        Some(r) => r.writes(),
        None => connects,
    };
    // The run ends: the proxy stops, then what is left is written.
    runtime.block_on(async {
        proxy.abort();
        drop(recorder);
    });
    let settle = Instant::now();
    let (count, rows) = loop {
        let (count, rows) = recorded(db, task)?;
        if count == i64::try_from(connects)? {
            break (count, rows);
        }
        if settle.elapsed() > SETTLE {
            return Err(format!("{count} refusals recorded of {connects}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let settled = settle.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (mut detail, mut list) = reader.join().map_err(|_| "the reader panicked")??;
    runtime.shutdown_timeout(Duration::from_secs(5));
    let body = client
        .get(detail_uri.as_str())
        .bearer_auth(token)
        .send()?
        .bytes()?;
    println!(
        "  {:11} {connects} connects in {:.2} s ({:.0}/s), {writes} write transactions; \
         recorded {count} in {rows} rows ({:.0} ms after the end); task detail {} bytes",
        mode.name(),
        took.as_secs_f64(),
        connects as f64 / took.as_secs_f64(),
        ms(settled),
        body.len()
    );
    println!(
        "              meanwhile GET /api/tasks/{{id}} {} over {} reads; GET /api/tasks {} over {} reads",
        summary(&mut detail),
        detail.len(),
        summary(&mut list),
        list.len()
    );
    Ok(())
}

fn measure(args: &Args, backend: &str, url: &str) -> Result<(), Error> {
    let db = Db::connect(url, 8)?;
    db.migrate()?;
    let ids = seed(&db, args.tasks.max(2))?;
    let token = bench::viewer_token(&db)?;
    let served = bench::serve(bench::offline_state(&db)?)?;
    let base = format!("http://{}", served.addr);
    let client = reqwest::blocking::Client::new();
    let (mut detail, _) = bench::timed_gets(
        &client,
        &format!("{base}/api/tasks/{}", ids[0]),
        &token,
        args.requests,
    )?;
    let (mut list, _) =
        bench::timed_gets(&client, &format!("{base}/api/tasks"), &token, args.requests)?;
    println!("{backend}, {} tasks", args.tasks.max(2));
    println!(
        "  idle        GET /api/tasks/{{id}} {}; GET /api/tasks {}",
        summary(&mut detail),
        summary(&mut list)
    );
    flooded(&db, &base, &token, ids[0], Mode::Batched, args.connects)?;
    flooded(&db, &base, &token, ids[1], Mode::PerRefusal, args.connects)?;
    served.stop()
}

fn main() -> Result<(), Error> {
    let args = <Args as clap::Parser>::parse();
    let sizes = bench::SizeArgs {
        sizes: vec![args.tasks],
        requests: args.requests,
        pg: args.pg.clone(),
    };
    println!(
        "API reads while a run's egress proxy refuses {} connects ({FLOODERS} clients)",
        args.connects
    );
    bench::each_backend_and_size(&sizes, "bench-egress", |backend, url, _, _| {
        measure(&args, backend, url)
    })
}
