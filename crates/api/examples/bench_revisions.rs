//! Benchmark of revisions (docs/contract.md#57-revisions; docs/benchmarks.md): the time from
//! a reviewer's "changes requested" webhook delivery to the revision's agent start.
//!
//! The service in process over a fresh SQLite database (or `--pg URL`), the fake GitHub on
//! 127.0.0.1 with a local bare repository as the clone URL, and the fake Claude Code
//! (`crates/runner/tests/fake-agents/claude`). `--tasks` coding tasks (default 30) run first
//! and open their pull requests; then, one task at a time, a `pull_request_review` delivery
//! (GitHub's payload, `changes_requested` by a writer) is handed to the service as the
//! webhook endpoint does after checking its signature, and the time until the task's
//! `provisioning → running` event (the agent process started) is taken. The quiet period is
//! 0 here (`AGENTRY_REVISION_QUIET_SECS` adds itself to every figure); the first delivery
//! asks the code host for the author's permission, the others find it cached.
//!
//! ```text
//! cargo run --release -p agentry-api --example bench_revisions -- [--tasks 30] [--sandbox off|auto] [--pg URL]
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_codehost::webhook::parse_event;
use agentry_domain::{RepoUrl, TaskState};
use agentry_fake_github::{FakeGitHub, payloads};
use agentry_persistence::Db;
use agentry_persistence::repos::{self, NewRepository};
use agentry_persistence::secrets::MasterKey;
use agentry_persistence::tasks;
use agentry_runner::{AgentLimits, PriceTable, SandboxMode};
use agentry_service::codehost::{CodeHost, Timing};
use agentry_service::revisions::RevisionSettings;
use agentry_service::runs::{RunSettings, Runs};
use agentry_service::tasks::NewCodingTask;
use agentry_service::{BackgroundLoop, Service};

#[path = "common/bench.rs"]
mod bench;

use bench::{Error, ms, percentile};

const TOKEN: &str = "ghp_benchmarkRevisionsToken0123456789";

fn fake_agent(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../runner/tests/fake-agents/{name}"))
}

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Revisions measured.
    #[arg(long, default_value_t = 30)]
    tasks: usize,
    /// The agents' sandbox (`off` or `auto`).
    #[arg(long, default_value = "off")]
    sandbox: SandboxMode,
    /// A PostgreSQL server's URL, instead of a SQLite file.
    #[arg(long)]
    pg: Option<String>,
}

async fn wait_until(
    service: &Service,
    what: &str,
    within: Duration,
    mut done: impl FnMut(&agentry_domain::Task) -> bool,
    id: uuid::Uuid,
) -> Result<agentry_domain::Task, Error> {
    agentry_testkit::wait::poll_async(within, Duration::from_millis(2), async || {
        match service.db(move |conn| Ok(tasks::get_task(conn, id)?)).await {
            Ok(task) if done(&task) => Ok(task),
            Ok(task) => Err(format!("task {id} is {}", task.state)),
            Err(e) => Err(format!("task {id} could not be read: {e}")),
        }
    })
    .await
    .map_err(|seen| format!("timed out waiting for {what}: {seen}").into())
}

#[actix_web::main]
async fn main() -> Result<(), Error> {
    let Args {
        tasks: count,
        sandbox,
        pg,
    } = clap::Parser::parse();
    let dir = tempfile::tempdir()?;
    let fake = FakeGitHub::start();
    fake.add_token(TOKEN, "agentry-bot");
    fake.add_repo("acme", "web", "main");
    fake.set_permission("acme", "web", "alice", "write");
    let source = agentry_testkit::git::source_repo(dir.path());
    fake.set_clone_url("acme", "web", source.to_str().ok_or("path")?);

    let url = match &pg {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", dir.path().join("bench.db").display()),
    };
    let db = Db::connect(&url, 8)?;
    db.migrate()?;
    let key = MasterKey::generate()?;
    let now = agentry_persistence::now();
    let repo = {
        let mut conn = db.conn()?;
        bench::store_codehost_token(&mut conn, &key, TOKEN)?;
        let (repo, _) = repos::connect_repository(
            &mut conn,
            &NewRepository {
                url: RepoUrl::parse("https://github.com/acme/web")?,
                default_branch: "main".into(),
                clone_url: source.to_string_lossy().into_owned(),
                codehost_id: None,
            },
            now,
        )?;
        let mut settings = repo.settings.clone();
        settings.auto_review = false;
        settings.max_revisions = 50;
        repos::update_settings(&mut conn, repo.id, &settings, now)?
    };
    let codehost = CodeHost::new(
        agentry_codehost::ClientConfig {
            api_url: fake.base_url(),
            ..agentry_codehost::ClientConfig::default()
        },
        Timing::default(),
    )
    .with_revisions(RevisionSettings {
        mention: "@agentry".into(),
        quiet: Duration::ZERO,
    });
    let settings = RunSettings {
        max_concurrent: 2,
        sandbox,
        agent_limits: AgentLimits::default(),
        ..RunSettings::default()
    };
    let service = Service::new(
        db,
        key,
        codehost,
        Runs::local(
            dir.path().join("agentry"),
            fake_agent("claude"),
            fake_agent("codex"),
            PriceTable::builtin(),
            &[],
            settings,
            None,
        ),
    );
    let _loops = agentry_service::Background::start(
        &service,
        vec![BackgroundLoop::runner(), BackgroundLoop::revisions()],
    );

    // The pull requests.
    let mut ids = Vec::new();
    for i in 0..count {
        let task = service
            .create_task(NewCodingTask {
                repo_id: repo.id,
                title: format!("Task {i}"),
                prompt: "Do it.".into(),
                agent_type: None,
            })
            .await?;
        ids.push(task.id);
    }
    let mut numbers = Vec::new();
    for &id in &ids {
        let task = wait_until(
            &service,
            "the pull request",
            Duration::from_secs(120),
            |t| t.state == TaskState::PrOpened,
            id,
        )
        .await?;
        numbers.push(u64::try_from(task.pr_number.ok_or("no pull request")?)?);
    }
    // The poller is not running: the webhook is the only path.

    let mut samples = Vec::new();
    for (i, (&id, &number)) in ids.iter().zip(&numbers).enumerate() {
        // Waits (at most a minute) until this task is as `done` says.
        let wait = |what: &'static str, done: fn(&agentry_domain::Task) -> bool| {
            wait_until(&service, what, Duration::from_secs(60), done, id)
        };
        let review = fake.add_review(
            "acme",
            "web",
            number,
            "alice",
            "CHANGES_REQUESTED",
            "Please add a test.",
        );
        let body = serde_json::to_vec(&payloads::pull_request_review_submitted(
            &fake, "acme", "web", number, review,
        ))?;
        let event = parse_event("pull_request_review", &body)?;
        let sent = agentry_persistence::now();
        service
            .webhook_event(format!("bench-{i}"), "pull_request_review".into(), event)
            .await?;
        wait("the revision's agent", |t| {
            t.state == TaskState::Running && t.attempt == 2
        })
        .await?;
        let events = service
            .db(move |conn| Ok(tasks::task_events(conn, id)?))
            .await?;
        let started = events
            .iter()
            .rev()
            .find(|e| e.from == Some(TaskState::Provisioning) && e.to == TaskState::Running)
            .ok_or("no agent start")?
            .at;
        samples.push(Duration::try_from(started - sent)?);
        wait("the revision pushed", |t| {
            t.state == TaskState::PrOpened && t.revisions == 1
        })
        .await?;
    }
    println!(
        "webhook (changes requested) -> revision agent start, {} revisions, quiet period 0, sandbox {:?}, {}:",
        samples.len(),
        sandbox,
        if pg.is_some() { "PostgreSQL" } else { "SQLite" }
    );
    println!(
        "  p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        ms(percentile(&mut samples, 50)),
        ms(percentile(&mut samples, 90)),
        ms(percentile(&mut samples, 99)),
        ms(samples.last().copied().unwrap_or_default()),
    );
    Ok(())
}
