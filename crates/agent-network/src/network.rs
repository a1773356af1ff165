//! The network of sandboxed agents, as the service serves it (docs/security.md#network): for
//! each run, the model gateway ([`crate::gateway`]) and the egress proxy
//! ([`crate::egress`]) on the run's own Unix sockets, which the runner binds into the
//! sandbox ([`agentry_runner::network`]). [`AgentNetwork`] implements the runner's
//! [`Network`] seam.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentry_domain::egress::EgressPattern;
use agentry_persistence::metering::BlockedTally;
use agentry_persistence::secrets::MasterKey;
use agentry_persistence::{Db, metering, repos};
use agentry_runner::PriceTable;
use agentry_runner::network::{
    GATEWAY_SOCKET, Network, OpenFuture, PROXY_SOCKET, RunInfo, RunNetwork,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::egress::{self, EgressEvents, EgressPolicy};
use crate::gateway::{Gateway, GatewayConfig, SocketServer};

/// Serves the gateway and the egress proxy of every sandboxed run.
#[derive(Debug, Clone)]
pub struct AgentNetwork {
    gateway: Gateway,
    db: Db,
    /// `AGENTRY_EGRESS_ALLOW`: hosts every repository's agents may reach.
    instance_allow: Vec<EgressPattern>,
}

impl AgentNetwork {
    /// The network of `gateway`, with the instance's egress allow-list; refused connections
    /// are recorded in `db`.
    pub fn new(gateway: Gateway, db: Db, instance_allow: Vec<EgressPattern>) -> Self {
        AgentNetwork {
            gateway,
            db,
            instance_allow,
        }
    }

    /// Starts the network of a service process: the model gateway of `gateway`, pricing
    /// calls with `prices`, metering them and holding their budgets in `db` and reading the
    /// stored provider keys with `master_key`; and the egress proxy with the instance's
    /// allow-list `instance_allow` (`AGENTRY_EGRESS_ALLOW`). Fails when the gateway's
    /// upstream client cannot be built.
    pub fn start(
        gateway: GatewayConfig,
        instance_allow: Vec<EgressPattern>,
        prices: PriceTable,
        db: Db,
        master_key: MasterKey,
    ) -> Result<AgentNetwork, String> {
        let gateway = Gateway::new(gateway, prices, db.clone(), master_key)?;
        Ok(AgentNetwork::new(gateway, db, instance_allow))
    }

    /// The model gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    async fn open_run(&self, run: &RunInfo, dir: &Path) -> Result<RunNetwork, String> {
        let RepoNetwork {
            egress_allow,
            allow_provider_tools,
        } = self.repo_network(&run.repo_key).await?;
        let (key, meter, gate) = self
            .gateway
            .open_run(run, &dir.join(GATEWAY_SOCKET), allow_provider_tools)
            .await?;
        let mut allow = egress_allow;
        allow.extend(self.instance_allow.iter().cloned());
        let refusals = RunRefusals::start(self.db.clone(), run.task_id, run.attempt, &run.repo_key);
        let events = refusals.events();
        let proxy = SocketServer::start(&dir.join(PROXY_SOCKET), "the egress proxy socket", |l| {
            egress::serve(l, EgressPolicy::new(allow), events)
        })?;
        // Dropped in this order: the proxy stops, then the gateway, then what the proxy
        // refused is written.
        Ok(RunNetwork {
            key,
            meter,
            guard: Box::new((proxy, gate, refusals)),
        })
    }

    /// What the repository's settings allow its agents on the network.
    async fn repo_network(&self, repo_key: &str) -> Result<RepoNetwork, String> {
        let Ok(repo_id) = repo_key.parse::<Uuid>() else {
            return Ok(RepoNetwork::default());
        };
        let db = self.db.clone();
        let repo = tokio::task::spawn_blocking(move || {
            let mut conn = db.conn().map_err(|e| e.to_string())?;
            repos::get_repository(&mut conn, repo_id).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| format!("cannot read the repository's network settings: {e}"))?;
        Ok(RepoNetwork {
            egress_allow: repo.settings.egress_allow.clone(),
            allow_provider_tools: repo.settings.allow_provider_tools,
        })
    }
}

/// A repository's network settings, as a run of it gets them.
#[derive(Debug, Default)]
struct RepoNetwork {
    /// `egressAllow`.
    egress_allow: Vec<EgressPattern>,
    /// `allowProviderTools`.
    allow_provider_tools: bool,
}

impl Network for AgentNetwork {
    fn open<'a>(&'a self, run: &'a RunInfo, dir: &'a Path) -> OpenFuture<'a> {
        Box::pin(self.open_run(run, dir))
    }
}

/// How often, at most, a run's refused connections are written to the database (and once
/// more when its network closes).
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// At most one warning per run and destination in this interval; the next one says how many
/// refusals it stood for.
pub const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Counts, logs and records the connections a run's egress proxy refused.
///
/// Cheap under a flood: each refusal is counted in memory (for at most
/// [`metering::MAX_BLOCKED_TARGETS`] destinations of the run; any further one is counted
/// under [`metering::OTHER_HOST`]), written in one transaction per [`FLUSH_INTERVAL`] at
/// most ([`metering::record_blocked_batch`]) by the run's flusher and once more when the run's
/// network closes ([`RunRefusals`]), and logged at most once per destination per
/// [`WARN_INTERVAL`] with the count of refusals since the last line (`suppressed`).
struct Refusals {
    db: Db,
    task_id: Uuid,
    attempt: i32,
    repo_key: String,
    tally: Mutex<Tally>,
    /// Held while writing, so that the run's writes add up one after the other.
    writing: Mutex<()>,
    /// How many write transactions there were (for tests and the benchmark).
    writes: AtomicU64,
}

/// What a run's refusals add up to since the last write.
#[derive(Default)]
struct Tally {
    /// The run's first destinations, in the order of their first refusal.
    targets: Vec<Target>,
    /// The refusals to any further destination.
    other: Target,
    /// The network closed: a refusal still arriving is written at once.
    closed: bool,
}

/// One destination's refusals since the last write, and its logging.
#[derive(Default)]
struct Target {
    host: String,
    port: u16,
    /// Refusals not yet written.
    pending: i64,
    first_at: Option<OffsetDateTime>,
    last_at: Option<OffsetDateTime>,
    /// When the last warning about it was logged.
    warned_at: Option<Instant>,
    /// Refusals since that warning, not logged.
    suppressed: u64,
}

impl Target {
    /// The refusals not yet written, then none.
    fn take(&mut self) -> Option<BlockedTally> {
        if self.pending == 0 {
            return None;
        }
        let tally = BlockedTally {
            host: self.host.clone(),
            port: self.port,
            count: self.pending,
            first_at: self.first_at.take()?,
            last_at: self.last_at.take()?,
        };
        self.pending = 0;
        Some(tally)
    }

    /// Counts `count` refusals between `first_at` and `last_at`.
    fn add(&mut self, count: i64, first_at: OffsetDateTime, last_at: OffsetDateTime) {
        self.pending = self.pending.saturating_add(count);
        self.first_at = Some(self.first_at.map_or(first_at, |t| t.min(first_at)));
        self.last_at = Some(self.last_at.map_or(last_at, |t| t.max(last_at)));
    }
}

impl Tally {
    /// Everything not yet written.
    fn take(&mut self) -> Vec<BlockedTally> {
        let mut taken: Vec<BlockedTally> =
            self.targets.iter_mut().filter_map(Target::take).collect();
        taken.extend(self.other.take());
        taken
    }

    /// The target counting refusals to `host:port`.
    fn target(&mut self, host: &str, port: u16) -> &mut Target {
        let found = self
            .targets
            .iter()
            .position(|t| t.port == port && t.host == host);
        match found {
            Some(index) => &mut self.targets[index],
            None if self.targets.len() < metering::MAX_BLOCKED_TARGETS => {
                self.targets.push(Target {
                    host: host.to_owned(),
                    port,
                    ..Target::default()
                });
                let last = self.targets.len() - 1;
                &mut self.targets[last]
            }
            None => &mut self.other,
        }
    }
}

impl Refusals {
    fn new(db: Db, task_id: Uuid, attempt: i32, repo_key: &str) -> Refusals {
        Refusals {
            db,
            task_id,
            attempt,
            repo_key: repo_key.to_owned(),
            tally: Mutex::new(Tally {
                other: Target {
                    host: metering::OTHER_HOST.to_owned(),
                    port: metering::OTHER_PORT,
                    ..Target::default()
                },
                ..Tally::default()
            }),
            writing: Mutex::new(()),
            writes: AtomicU64::new(0),
        }
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock()
    }

    /// Writes what was counted since the last write, in one transaction, on a blocking
    /// thread (this one, outside a runtime). What cannot be written is counted again.
    fn flush(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let tallies = self.tally().take();
        if tallies.is_empty() {
            return None;
        }
        let this = Arc::clone(self);
        let write = move || this.write(tallies);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => Some(runtime.spawn_blocking(write)),
            Err(_) => {
                write();
                None
            }
        }
    }

    /// Writes `tallies`; on failure counts them again, for the next write.
    fn write(&self, tallies: Vec<BlockedTally>) {
        let _writing = self.writing.lock();
        self.writes.fetch_add(1, Ordering::Relaxed);
        let written = self
            .db
            .conn()
            .map_err(|e| e.to_string())
            .and_then(|mut conn| {
                metering::record_blocked_batch(&mut conn, self.task_id, self.attempt, &tallies)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            let count: i64 = tallies.iter().map(|t| t.count).sum();
            tracing::error!(
                task = %self.task_id,
                attempt = self.attempt,
                count,
                error = %e,
                "could not record refused connections; they are counted again for the next write"
            );
            let mut tally = self.tally();
            for t in tallies {
                let target = if t.host == metering::OTHER_HOST {
                    &mut tally.other
                } else {
                    tally.target(&t.host, t.port)
                };
                target.add(t.count, t.first_at, t.last_at);
            }
        }
    }

    /// The network closed: no more warnings are due; each destination with refusals not
    /// logged since its last warning gets one last line saying how many.
    fn close(&self) {
        let mut tally = self.tally();
        tally.closed = true;
        let Tally { targets, other, .. } = &mut *tally;
        for target in targets.iter_mut().chain(std::iter::once(other)) {
            if target.suppressed > 0 {
                let suppressed = std::mem::take(&mut target.suppressed);
                self.warn_end(&target.host, target.port, suppressed);
            }
        }
    }

    /// Logs a refusal of `host:port` (its first ones, or one of the run's destinations
    /// beyond the first [`metering::MAX_BLOCKED_TARGETS`] when `other`).
    fn warn(&self, host: &str, port: u16, why: &str, suppressed: u64, other: bool) {
        let what = if other {
            format!(
                "egress refused (one of the run's destinations beyond the first {}; counted \
                 together)",
                metering::MAX_BLOCKED_TARGETS
            )
        } else {
            "egress refused".to_owned()
        };
        self.log(host, port, Some(why), suppressed, &what);
    }

    /// Logs, when the run's network closes, that `host:port` was refused `suppressed` times
    /// more than logged.
    fn warn_end(&self, host: &str, port: u16, suppressed: u64) {
        self.log(
            host,
            port,
            None,
            suppressed,
            "egress refused more times than logged until the run's network closed",
        );
    }

    /// One warning about the run's refusals of `host:port`, naming the run.
    fn log(&self, host: &str, port: u16, why: Option<&str>, suppressed: u64, what: &str) {
        tracing::warn!(
            task = %self.task_id,
            attempt = self.attempt,
            repo = %self.repo_key,
            host,
            port,
            why,
            suppressed,
            "{what}"
        );
    }
}

impl EgressEvents for Refusals {
    fn blocked(&self, host: &str, port: u16, why: &str) {
        let now = agentry_persistence::now();
        let mut tally = self.tally();
        let closed = tally.closed;
        let target = tally.target(host, port);
        let other = target.host == metering::OTHER_HOST;
        target.add(1, now, now);
        let due = target
            .warned_at
            .is_none_or(|at| at.elapsed() >= WARN_INTERVAL);
        let suppressed = if due {
            target.warned_at = Some(Instant::now());
            Some(std::mem::take(&mut target.suppressed))
        } else {
            target.suppressed += 1;
            None
        };
        // Late (the network is closing): written at once, there is no flusher any more.
        let late = closed.then(|| tally.take());
        drop(tally);
        if let Some(suppressed) = suppressed {
            self.warn(host, port, why, suppressed, other);
        }
        if let Some(tallies) = late {
            self.write(tallies);
        }
    }
}

/// Writes a run's refusals every [`FLUSH_INTERVAL`] while something was counted.
async fn flush_every_interval(refusals: Arc<Refusals>) {
    let mut ticks = tokio::time::interval(FLUSH_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Some(write) = refusals.flush() {
            // A write that outlasts the interval delays the next one.
            let _ = write.await;
        }
    }
}

/// A run's record of refused connections, while its network is open: hand
/// [`RunRefusals::events`] to the run's egress proxy ([`egress::serve`]); dropped (after
/// the proxy, so nothing is refused any more), it stops the flusher and writes what is
/// left.
pub struct RunRefusals {
    refusals: Arc<Refusals>,
    flusher: tokio::task::JoinHandle<()>,
}

impl RunRefusals {
    /// Starts counting the refusals of the run `attempt` of `task_id` (of the repository
    /// `repo_key`, for the log) into `db`, with its flusher. Must be called within a Tokio
    /// runtime.
    pub fn start(db: Db, task_id: Uuid, attempt: i32, repo_key: &str) -> RunRefusals {
        let refusals = Arc::new(Refusals::new(db, task_id, attempt, repo_key));
        let flusher = tokio::spawn(flush_every_interval(Arc::clone(&refusals)));
        RunRefusals { refusals, flusher }
    }

    /// Where the proxy reports refusals.
    pub fn events(&self) -> Arc<dyn EgressEvents> {
        Arc::clone(&self.refusals) as Arc<dyn EgressEvents>
    }

    /// How many write transactions were started so far (a flood should make about one a
    /// second).
    pub fn writes(&self) -> u64 {
        self.refusals.writes.load(Ordering::Relaxed)
    }
}

impl Drop for RunRefusals {
    fn drop(&mut self) {
        self.flusher.abort();
        self.refusals.close();
        // A write the flusher started goes on (a blocking task is not cancelled); this one
        // follows it.
        self.refusals.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_persistence::test_support::{TestDb, coding_task};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    /// How long any wait of a test may take.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// How many refused connects the flood makes to one destination.
    const FLOOD: i64 = 10_000;

    /// What the test's tracing subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        /// The warning lines about refused connections.
        fn refusals(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock())
                .lines()
                .filter(|l| l.contains("WARN") && l.contains("egress refused"))
                .map(str::to_owned)
                .collect()
        }
    }

    /// A task in a fresh database.
    fn a_task(db: &Db) -> Uuid {
        let mut conn = db.conn().unwrap();
        let new = repos::NewRepository {
            url: agentry_domain::RepoUrl::parse("https://github.com/acme/web").unwrap(),
            default_branch: "main".into(),
            clone_url: "https://github.com/acme/web.git".into(),
            codehost_id: Some(1),
        };
        let now = agentry_persistence::now();
        let (repo, _) = repos::connect_repository(&mut conn, &new, now).unwrap();
        let task = coding_task(&repo, now);
        agentry_persistence::tasks::create_task(&mut conn, &task, "created").unwrap();
        task.id
    }

    /// Sends `CONNECT host:port` through the proxy at `socket`; the answer's status line.
    async fn connect(socket: &Path, host: &str, port: u16) -> String {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        let request = format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer).to_string();
        answer.lines().next().unwrap_or_default().to_owned()
    }

    /// The run's refused destinations as (host, port, count).
    fn recorded(db: &Db, task: Uuid) -> Vec<(String, i32, i64)> {
        let mut conn = db.conn().unwrap();
        metering::task_blocked(&mut conn, task)
            .unwrap()
            .into_iter()
            .map(|b| (b.host, b.port, b.count))
            .collect()
    }

    /// A flood of refused connects through the real proxy socket: counted exactly, written
    /// in a few transactions (at most one per second, then one as the network closes),
    /// logged once per destination (plus one closing line where lines were held back), and
    /// listed within the run's bound whatever the number of destinations.
    #[tokio::test]
    async fn a_flood_of_refusals_is_counted_exactly_in_few_writes_and_lines() {
        let test_db = TestDb::sqlite();
        let db = test_db.db.clone();
        let task = a_task(&db);
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        // The runtime is this thread's only one: the proxy's tasks log here.
        let _logging = tracing::subscriber::set_default(subscriber);

        let refusals = RunRefusals::start(db.clone(), task, 1, "repo-key");
        let counter = Arc::clone(&refusals.refusals);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("proxy.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let policy = EgressPolicy::new([EgressPattern::parse("pypi.org").unwrap()]);
        let proxy = egress::serve(listener, policy, refusals.events());

        let started = Instant::now();
        for _ in 0..FLOOD {
            let status = connect(&socket, "evil.example", 443).await;
            assert_eq!(status, "HTTP/1.1 403 Forbidden");
        }
        // 100 more destinations: the first 31 beside evil.example are listed, the rest
        // counted together.
        for i in 0..100 {
            connect(&socket, &format!("h{i:03}.evil.example"), 8000 + i).await;
        }
        // Allowed on 443 only.
        connect(&socket, "pypi.org", 80).await;
        // The flusher writes while the network is open.
        let flood = ("evil.example".to_owned(), 443, FLOOD);
        agentry_testkit::wait::eventually_async(DEADLINE, "the flood written", async || {
            recorded(&db, task).first() == Some(&flood)
        })
        .await;
        let elapsed = started.elapsed();
        for _ in 0..7 {
            connect(&socket, "evil.example", 443).await;
        }
        // The run ends: the proxy stops, then what is left is written.
        proxy.abort();
        drop(refusals);
        let last =
            agentry_testkit::wait::eventually_async(DEADLINE, "the rest written", async || {
                let rows = recorded(&db, task);
                (rows.first().map(|r| r.2) == Some(FLOOD + 7)
                    && rows.iter().map(|r| r.2).sum::<i64>() == FLOOD + 7 + 101)
                    .then_some(rows)
            })
            .await;

        // Listed: evil.example, 31 more, and one row for the other 70 (69 + pypi.org:80).
        assert_eq!(last.len(), metering::MAX_BLOCKED_TARGETS + 1, "{last:?}");
        assert_eq!(last[1], ("h000.evil.example".to_owned(), 8000, 1));
        assert_eq!(last.last(), Some(&(metering::OTHER_HOST.to_owned(), 0, 70)));
        // One write a second at most while the flood lasted, and one at the end.
        let writes = counter.writes.load(Ordering::Relaxed);
        let bound = elapsed.as_secs() + 3;
        assert!(writes <= bound, "{writes} writes in {elapsed:?}");

        // One line per destination listed, one for the others, and a closing line for
        // each that held lines back: evil.example and the others.
        let lines = captured.refusals();
        assert_eq!(
            lines.len(),
            metering::MAX_BLOCKED_TARGETS + 1 + 2,
            "{lines:#?}"
        );
        let evil: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("host=\"evil.example\"") || l.contains("host=evil.example"))
            .collect();
        assert_eq!(evil.len(), 2, "{evil:#?}");
        assert!(evil[0].contains("suppressed=0"), "{}", evil[0]);
        assert!(
            evil[1].contains(&format!("suppressed={}", FLOOD + 7 - 1)),
            "{}",
            evil[1]
        );
        let closing = lines.last().unwrap();
        assert!(closing.contains("suppressed=69"), "{closing}");
        // Each line is short whatever the flood.
        assert!(lines.iter().all(|l| l.len() < 400), "{lines:#?}");
    }
}
