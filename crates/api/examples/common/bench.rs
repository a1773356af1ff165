//! What the HTTP benchmarks share: their command line (`--sizes`, `--requests`, `--pg`, by clap), a
//! fresh database per measurement, a connected repository, a viewer token, the real application
//! served on 127.0.0.1, timed requests and the figures printed.
//!
//! Included by the `bench_*` examples as a `#[path]` module; benchmark support, not part
//! of the library.
#![allow(dead_code, reason = "each benchmark uses a part")]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use actix_web::{HttpServer, web};
use agentry_api::auth::{generate_token, hash_token};
use agentry_api::state::AppState;
use agentry_codehost::ClientConfig;
use agentry_domain::Role;
use agentry_persistence::Db;
use agentry_persistence::secrets::MasterKey;
use agentry_service::codehost::{CodeHost, Timing};
use agentry_testkit::stats::quantile;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The command line of a benchmark over database sizes.
#[derive(clap::Parser)]
pub struct SizeArgs {
    /// Database sizes, comma-separated (default: the benchmark's own).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Timed requests per size.
    #[arg(long, default_value_t = 50)]
    pub requests: usize,
    /// A PostgreSQL server's URL: measure there too.
    #[arg(long)]
    pub pg: Option<String>,
}

/// `--sizes a,b,c` (default `sizes`), `--requests n` (default 50) and `--pg URL`; exits
/// with clap's message on a bad command line.
pub fn size_args(sizes: &[u64]) -> SizeArgs {
    let mut a = <SizeArgs as clap::Parser>::parse();
    if a.sizes.is_empty() {
        a.sizes = sizes.to_vec();
    }
    a
}

/// Connects `https://github.com/{owner}/{name}` (default branch `main`, no code-host id)
/// at `now`.
pub fn connect_repo(
    conn: &mut agentry_persistence::AnyConnection,
    owner: &str,
    name: &str,
    now: time::OffsetDateTime,
) -> Result<agentry_persistence::repos::Repository, Error> {
    let new = agentry_persistence::repos::NewRepository {
        url: agentry_domain::RepoUrl::parse(&format!("https://github.com/{owner}/{name}"))?,
        default_branch: "main".into(),
        clone_url: format!("https://github.com/{owner}/{name}.git"),
        codehost_id: None,
    };
    Ok(agentry_persistence::repos::connect_repository(conn, &new, now)?.0)
}

/// Calls `measure(backend, url, size, requests)` on a fresh database for each size, on
/// SQLite and (with `--pg`) PostgreSQL; databases are named after `label`.
pub fn each_backend_and_size(
    args: &SizeArgs,
    label: &str,
    mut measure: impl FnMut(&str, &str, u64, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let mut backends = vec!["sqlite"];
    if args.pg.is_some() {
        backends.push("postgres");
    }
    for backend in backends {
        for &size in &args.sizes {
            let url = fresh(backend, args.pg.as_deref(), label, size, dir.path())?;
            measure(backend, &url, size, args.requests)?;
        }
    }
    Ok(())
}

/// A fresh database for one measurement: a file in `dir`, or a new database on the
/// PostgreSQL server `pg`.
fn fresh(
    backend: &str,
    pg: Option<&str>,
    label: &str,
    size: u64,
    dir: &std::path::Path,
) -> Result<String, Error> {
    match backend {
        "sqlite" => Ok(format!(
            "sqlite://{}",
            dir.join(format!("{label}-{size}.db")).display()
        )),
        _ => {
            let server = pg.ok_or("no PostgreSQL URL")?;
            let name = format!("agentry_{}_{size}", label.replace('-', "_"));
            Ok(agentry_persistence::test_support::fresh_database(
                server, &name,
            )?)
        }
    }
}

/// The `p`th percentile of `v` ([`quantile`]: nearest rank; sorts it), zero when `v` is
/// empty.
pub fn percentile(v: &mut [Duration], p: usize) -> Duration {
    quantile(v, p as f64 / 100.0).unwrap_or_default()
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// A new viewer token stored in `db`.
pub fn viewer_token(db: &Db) -> Result<String, Error> {
    let token = generate_token().map_err(|e| e.to_string())?;
    agentry_persistence::tokens::create_token(
        &mut *db.conn()?,
        "bench",
        Role::Viewer,
        &hash_token(&token),
        agentry_persistence::now(),
    )?;
    Ok(token)
}

/// Stores `token` as the code-host token, encrypted with `key`.
pub fn store_codehost_token(
    conn: &mut agentry_persistence::AnyConnection,
    key: &MasterKey,
    token: &str,
) -> Result<(), Error> {
    agentry_persistence::secrets::put(
        conn,
        key,
        agentry_service::codehost::TOKEN_SECRET,
        &agentry_persistence::secrets::SecretValue::new(token),
        agentry_persistence::now(),
    )?;
    Ok(())
}

/// A code-host integration at `api_url` with default timings.
pub fn code_host(api_url: &str) -> CodeHost {
    CodeHost::new(
        ClientConfig {
            api_url: api_url.into(),
            ..ClientConfig::default()
        },
        Timing::default(),
    )
}

/// Application state over `db` with its secrets under `key` and `codehost`; benchmarks run
/// no agents.
pub fn state(db: &Db, key: MasterKey, codehost: CodeHost) -> Result<web::Data<AppState>, Error> {
    let service = agentry_service::Service::new(
        db.clone(),
        key,
        codehost,
        agentry_service::runs::Runs::disabled(
            std::env::temp_dir().join("agentry-bench-idle-runner"),
        ),
    );
    Ok(web::Data::new(AppState::new(service)?))
}

/// Application state over `db` for an endpoint that never calls the code host (nothing
/// listens on port 9).
pub fn offline_state(db: &Db) -> Result<web::Data<AppState>, Error> {
    state(db, MasterKey::generate()?, code_host("http://127.0.0.1:9"))
}

/// The real application served on 127.0.0.1 (2 workers) in a thread of its own.
pub struct Served {
    pub addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

/// Serves the application over `state`.
pub fn serve(state: web::Data<AppState>) -> Result<Served, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || -> std::io::Result<()> {
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
    Ok(Served {
        addr,
        handle,
        thread,
    })
}

impl Served {
    /// Stops the server gracefully and waits for its thread.
    pub fn stop(self) -> Result<(), Error> {
        actix_web::rt::System::new().block_on(self.handle.stop(true));
        self.thread.join().map_err(|_| "server thread panicked")??;
        Ok(())
    }
}

/// Sends 5 warm-up and then `requests` timed `GET uri` with `token`; returns the times of
/// the timed ones and the last body. An answer other than a success is an error.
pub fn timed_gets(
    client: &reqwest::blocking::Client,
    uri: &str,
    token: &str,
    requests: usize,
) -> Result<(Vec<Duration>, String), Error> {
    let mut times = Vec::with_capacity(requests);
    let mut last = String::new();
    for i in 0..requests + 5 {
        let t = Instant::now();
        let res = client.get(uri).bearer_auth(token).send()?;
        let status = res.status();
        let body = res.text()?;
        let elapsed = t.elapsed();
        if !status.is_success() {
            return Err(format!("{status}: {body}").into());
        }
        if i >= 5 {
            times.push(elapsed);
        }
        last = body;
    }
    Ok((times, last))
}
