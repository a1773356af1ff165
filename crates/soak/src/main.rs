//! The soak harness behind `scripts/soak-replicas.sh` (docs/soak.md): two `agentry serve`
//! replicas on one PostgreSQL, a fake code host failing a share of its calls, a fake agent
//! with random costs and durations, issues assigned through the API and by labelling, pull
//! requests merged and announced by webhook or left to the poll, and a replica killed with
//! SIGKILL and restarted every so often. At the end, with the faults off, it waits for
//! quiescence and checks that nothing was lost, doubled or left stuck, and that every cost
//! adds up.
//!
//! Exit status: 0 when every check passed, 1 when one failed (each violation printed), 2
//! when the harness itself could not run.

mod agent;
mod args;
mod check;
mod cluster;
mod faults;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use agentry_fake_github::FakeGitHub;
use agentry_testkit::SplitMix64;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::args::Params;
use crate::cluster::{Api, Cluster, On5xx};

const OWNER: &str = "soak";
const NAME: &str = "app";
const CODEHOST_TOKEN: &str = "ghp_soak0000000000000000000000000000000000";

fn main() -> ExitCode {
    let params = match Params::parse(std::env::args().skip(1)) {
        Ok(p) => p,
        Err(e) => e.exit(),
    };
    match run(&params) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints a progress line with the time since the start.
fn say(start: Instant, line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[{:>6.1}s] {line}", start.elapsed().as_secs_f64());
    let _ = out.flush();
}

fn random_bytes(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64().to_le_bytes()[0]).collect()
}

/// `sha256=` + the hex HMAC-SHA256 of `body` under `secret` (GitHub's webhook signature).
fn sign(secret: &[u8], body: &[u8]) -> Result<String, String> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).map_err(|e| format!("HMAC key: {e}"))?;
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

/// How an issue is handed to agentry.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// `POST /api/issues/assign` on this replica.
    Api(usize),
    /// The label on the code host; with `Some(replica)`, also an `issues labeled` webhook.
    Label(Option<usize>),
}

/// One scheduled hand-over.
#[derive(Debug, Clone, Copy)]
struct Planned {
    at: Duration,
    issue: u64,
    via: Via,
}

/// What the threads report.
#[derive(Debug, Default)]
struct Tally {
    assigned_api: usize,
    labelled: usize,
    label_webhooks: usize,
    merged: usize,
    merge_webhooks: usize,
    problems: Vec<String>,
}

/// The soak from start to verdict: the fake agent, the code host and the replicas set up,
/// the repository connected, the hand-overs planned, the chaos run until quiescence, then the
/// checks and the summary.
fn run(p: &Params) -> Result<bool, String> {
    let start = Instant::now();
    let mut rng = SplitMix64::new(p.seed);
    std::fs::create_dir_all(&p.work).map_err(|e| format!("{}: {e}", p.work.display()))?;
    let work = std::path::absolute(&p.work).map_err(|e| format!("{}: {e}", p.work.display()))?;
    let (ledger, agent_path) = write_fake_agent(p, &work)?;
    let (fake, issues) = start_code_host(p, &work)?;
    let (cluster, api, webhook_secret) =
        start_replicas(p, start, &work, &fake, &agent_path, &mut rng)?;
    let repo_id = connect_repository(&api)?;
    let plan = plan_hand_overs(p, &mut rng, &issues);
    faults::inject(&fake, p.fault_rate, rng.next_u64());
    say(
        start,
        &format!(
            "chaos for {:.0} s: {} issues, {:.0} % faults, a kill every {}-{} s (seed {})",
            p.chaos.as_secs_f64(),
            p.issues,
            p.fault_rate * 100.0,
            p.kill_every.0,
            p.kill_every.1,
            p.seed
        ),
    );
    let soak = Soak {
        p,
        start,
        fake: &fake,
        cluster: &cluster,
        api: &api,
        repo_id: &repo_id,
        webhook_secret: webhook_secret.as_bytes(),
        repository: json!({
            "name": NAME,
            "full_name": format!("{OWNER}/{NAME}"),
            "owner": {"login": OWNER},
            "html_url": format!("https://github.com/{OWNER}/{NAME}"),
        }),
        chaos_start: Instant::now(),
        chaos_over: AtomicBool::new(false),
        all_over: AtomicBool::new(false),
        plan_done: AtomicBool::new(false),
        deliveries: AtomicUsize::new(0),
        tally: Mutex::new(Tally::default()),
        crashes: Mutex::new(Vec::new()),
    };
    let mut chaos_rng = SplitMix64::new(rng.next_u64());
    let mut merge_rng = SplitMix64::new(rng.next_u64());
    let (quiet, to_quiet) = soak.run_chaos(&plan, &issues, &mut chaos_rng, &mut merge_rng)?;
    if quiet {
        say(
            start,
            &format!("quiet after {:.1} s; checking", to_quiet.as_secs_f64()),
        );
    }
    let world = check::World {
        fake: &fake,
        api: &api,
        repo: (OWNER, NAME),
        issues,
    };
    let outcome = Outcome {
        quiet,
        to_quiet,
        tally: soak.tally.into_inner(),
        crashes: soak.crashes.into_inner(),
    };
    check_and_report(p, start, &world, &cluster, &ledger, outcome)
}

/// Writes the fake agent (an executable `claude`) and its empty ledger into the work
/// directory; gives (the ledger, the agent).
fn write_fake_agent(p: &Params, work: &Path) -> Result<(PathBuf, PathBuf), String> {
    let ledger = work.join("ledger");
    std::fs::write(&ledger, "").map_err(|e| format!("{}: {e}", ledger.display()))?;
    let agent_path = work.join("claude");
    std::fs::write(&agent_path, agent::script(&ledger, p.seed, p.agent_ms))
        .map_err(|e| format!("{}: {e}", agent_path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent_path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", agent_path.display()))?;
    }

    Ok((ledger, agent_path))
}

/// The code host: one repository whose clone URL is a real local repository, and the soak's
/// issues in it (their numbers).
fn start_code_host(p: &Params, work: &Path) -> Result<(FakeGitHub, Vec<u64>), String> {
    let source = agentry_testkit::git::source_repo(work);
    let fake = FakeGitHub::try_start().map_err(|e| format!("fake GitHub: {e}"))?;
    fake.add_token(CODEHOST_TOKEN, "soak-bot");
    fake.add_repo(OWNER, NAME, "main");
    fake.set_clone_url(OWNER, NAME, &source.display().to_string());
    fake.set_rate_limit_remaining(100_000_000);
    let mut issues = Vec::new();
    for i in 1..=p.issues {
        let n = fake.add_issue(
            OWNER,
            NAME,
            &format!("Soak issue {i}"),
            Some(&format!("Change number {i} of the soak.")),
            &[],
        );
        issues.push(n);
    }

    Ok((fake, issues))
}

/// Two replicas on one database, one master key, one webhook secret: replica a started
/// first (it writes the admin token), then b; gives the cluster, its API and the webhook
/// secret once both answer.
fn start_replicas(
    p: &Params,
    start: Instant,
    work: &Path,
    fake: &FakeGitHub,
    agent_path: &Path,
    rng: &mut SplitMix64,
) -> Result<(Cluster, Api, String), String> {
    let master_key = STANDARD.encode(random_bytes(rng, 32));
    let webhook_secret = hex::encode(random_bytes(rng, 32));
    let mut env: Vec<(String, String)> = vec![
        ("AGENTRY_DATABASE_URL".into(), p.database_url.clone()),
        ("AGENTRY_CODEHOST_API_URL".into(), fake.base_url()),
        ("AGENTRY_MASTER_KEY".into(), master_key),
        ("CODEHOST_WEBHOOK_SECRET".into(), webhook_secret.clone()),
        ("AGENTRY_POLL_INTERVAL_SECS".into(), "2".into()),
        ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS".into(), "5".into()),
        (
            "AGENTRY_MAX_CONCURRENT_RUNS".into(),
            p.runs_per_replica.to_string(),
        ),
        (
            "AGENTRY_CLAUDE_BIN".into(),
            agent_path.display().to_string(),
        ),
        ("AGENTRY_RUN_LEASE_SECS".into(), p.lease_secs.to_string()),
        ("AGENTRY_RUN_TIME_LIMIT_SECS".into(), "300".into()),
        ("AGENTRY_AGENT_SANDBOX".into(), "off".into()),
        // The fake agent runs unsandboxed as the harness's user, which is root in CI: a root
        // service refuses unsandboxed agents unless allowed (docs/security.md#the-agents-user).
        ("AGENTRY_ALLOW_ROOT".into(), "1".into()),
        (
            "RUST_LOG".into(),
            std::env::var("SOAK_RUST_LOG").unwrap_or_else(|_| "info".into()),
        ),
    ];
    for var in ["PATH", "HOME", "TMPDIR"] {
        if let Ok(v) = std::env::var(var) {
            env.push((var.into(), v));
        }
    }
    let cluster = Cluster::new(&p.agentry, work, &["a", "b"], env)?;
    cluster.start(0)?;
    let token_file = cluster.data_dir(0).join("admin-token");
    let token = wait_for(Duration::from_secs(60), || {
        std::fs::read_to_string(&token_file)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    })
    .ok_or_else(|| {
        format!(
            "replica a wrote no {} within 60 s (see {})",
            token_file.display(),
            work.join("a.log").display()
        )
    })?;
    cluster.start(1)?;
    let urls: Vec<String> = (0..cluster.len()).map(|i| cluster.url(i)).collect();
    let api = Api::new(urls, &token)?;
    for i in 0..cluster.len() {
        if !api.wait_ready(i, Duration::from_secs(60)) {
            return Err(format!(
                "replica {} is not ready after 60 s (see {})",
                cluster.name(i),
                work.join(format!("{}.log", cluster.name(i))).display()
            ));
        }
    }
    say(
        start,
        &format!(
            "replicas up: {} ; fake code host {} ; work {}",
            (0..cluster.len())
                .map(|i| format!("{}={}", cluster.name(i), cluster.url(i)))
                .collect::<Vec<_>>()
                .join(" "),
            fake.base_url(),
            work.display()
        ),
    );
    Ok((cluster, api, webhook_secret))
}

/// The code-host token, the repository and its settings, through the API; gives the
/// repository's id.
fn connect_repository(api: &Api) -> Result<String, String> {
    let expect = |what: &str, a: cluster::Answer, ok: &[u16]| -> Result<Value, String> {
        if ok.contains(&a.status) {
            Ok(a.body)
        } else {
            Err(format!("{what}: {} {}", a.status, a.body))
        }
    };
    expect(
        "PUT /api/secrets/CODEHOST_TOKEN",
        api.call(
            "PUT",
            "/api/secrets/CODEHOST_TOKEN",
            Some(&json!({"value": CODEHOST_TOKEN})),
            0,
            On5xx::Retry,
        )?,
        &[200],
    )?;
    let repo = expect(
        "POST /api/repos",
        api.call(
            "POST",
            "/api/repos",
            Some(&json!({"repoUrl": format!("https://github.com/{OWNER}/{NAME}")})),
            1,
            On5xx::Retry,
        )?,
        &[200, 201],
    )?;
    let repo_id = repo["id"]
        .as_str()
        .ok_or_else(|| format!("POST /api/repos: no id in {repo}"))?
        .to_owned();
    expect(
        "PATCH settings",
        api.call(
            "PATCH",
            &format!("/api/repos/{repo_id}/settings"),
            Some(&json!({"autoReview": true})),
            0,
            On5xx::Retry,
        )?,
        &[200],
    )?;

    Ok(repo_id)
}

/// The plan: half the issues through the API (alternating replicas), half by label (half
/// of those also announced by webhook), at random times in the first 60 % of the chaos.
fn plan_hand_overs(p: &Params, rng: &mut SplitMix64, issues: &[u64]) -> Vec<Planned> {
    let mut order = issues.to_vec();
    rng.shuffle(&mut order);
    let window_ms = (p.chaos.as_millis() as u64 * 6 / 10).max(1);
    let mut plan: Vec<Planned> = order
        .iter()
        .enumerate()
        .map(|(k, &issue)| {
            let via = if k % 2 == 0 {
                Via::Api(k / 2 % 2)
            } else if rng.chance(50) {
                Via::Label(Some(rng.below(2) as usize))
            } else {
                Via::Label(None)
            };
            Planned {
                at: Duration::from_millis(rng.below(window_ms)),
                issue,
                via,
            }
        })
        .collect();
    plan.sort_by_key(|x| x.at);

    plan
}

/// What the chaos leaves for the checks.
struct Outcome {
    /// Whether everything settled before the quiescence deadline.
    quiet: bool,
    /// How long settling took.
    to_quiet: Duration,
    /// What the threads reported.
    tally: Tally,
    /// Replicas that exited by themselves.
    crashes: Vec<String>,
}

/// The checks once quiet (nothing lost, doubled or stuck; every cost adds up), every
/// violation printed, and the summary; gives whether the soak passed.
fn check_and_report(
    p: &Params,
    start: Instant,
    world: &check::World<'_>,
    cluster: &Cluster,
    ledger: &Path,
    outcome: Outcome,
) -> Result<bool, String> {
    let Outcome {
        quiet,
        to_quiet,
        tally,
        crashes,
    } = outcome;
    let fake = world.fake;
    let snap = world.snapshot()?;
    let ledger_text =
        std::fs::read_to_string(ledger).map_err(|e| format!("{}: {e}", ledger.display()))?;
    let entries = agent::read_ledger(&ledger_text)?;
    let kills = cluster.kills();
    let mut findings = check::verify(world, &snap, &entries, &kills)?;
    let requests = fake.requests();
    cluster.stop_all();

    findings.other.extend(tally.problems.iter().cloned());
    findings.other.extend(crashes);
    let fault_counts = faults::count(&requests);
    let injected: usize = fault_counts.values().sum();
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for k in &kills {
        *per_replica.entry(k.replica.as_str()).or_default() += 1;
    }

    for note in &findings.notes {
        println!("note: {note}");
    }
    let all: Vec<(&str, &Vec<String>)> = vec![
        ("DUPLICATE", &findings.duplicates),
        ("LOST", &findings.lost),
        ("STUCK", &findings.stuck),
        ("VIOLATION", &findings.other),
    ];
    for (kind, list) in &all {
        for v in *list {
            println!("{kind}: {v}");
        }
    }
    println!();
    println!("soak summary (seed {})", p.seed);
    println!(
        "  issues:              {} ({} assigned through the API, {} labelled on the code host, {} of them announced by webhook)",
        p.issues, tally.assigned_api, tally.labelled, tally.label_webhooks
    );
    for (name, value) in &findings.figures {
        println!("  {:<20} {value}", format!("{name}:"));
    }
    println!(
        "  merges:              {} by the code host, {} announced by webhook, the rest left to the poll",
        tally.merged, tally.merge_webhooks
    );
    println!(
        "  kills:               {} ({})",
        kills.len(),
        per_replica
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  faults injected:     {injected} of {} code-host requests ({:.1} %)",
        requests.len(),
        if requests.is_empty() {
            0.0
        } else {
            injected as f64 * 100.0 / requests.len() as f64
        }
    );
    for (kind, n) in &fault_counts {
        println!("    {n:>6}  {kind}");
    }
    println!("  duplicates:          {}", findings.duplicates.len());
    println!("  lost:                {}", findings.lost.len());
    println!("  stuck:               {}", findings.stuck.len());
    println!("  other violations:    {}", findings.other.len());
    println!(
        "  time to quiescence:  {:.1} s{}",
        to_quiet.as_secs_f64(),
        if quiet {
            ""
        } else {
            " (deadline passed: NOT quiet)"
        }
    );
    println!(
        "  wall time:           {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let ok = quiet && findings.clean();
    println!(
        "  result:              {}",
        if ok { "PASS" } else { "FAIL" }
    );
    Ok(ok)
}

/// The soak under way: what its threads share.
struct Soak<'a> {
    p: &'a Params,
    /// When the soak started (for the progress lines).
    start: Instant,
    fake: &'a FakeGitHub,
    cluster: &'a Cluster,
    api: &'a Api,
    repo_id: &'a str,
    webhook_secret: &'a [u8],
    /// The repository as webhooks carry it.
    repository: Value,
    /// When the chaos started (the plan's times count from it).
    chaos_start: Instant,
    chaos_over: AtomicBool,
    all_over: AtomicBool,
    plan_done: AtomicBool,
    /// Webhook deliveries sent (their ids).
    deliveries: AtomicUsize,
    tally: Mutex<Tally>,
    crashes: Mutex<Vec<String>>,
}

impl Soak<'_> {
    /// The chaos: the hand-overs, the kills and the merges on threads of their own, until
    /// everything settles or the quiescence deadline passes; gives (quiet, time to quiet).
    fn run_chaos(
        &self,
        plan: &[Planned],
        issues: &[u64],
        chaos_rng: &mut SplitMix64,
        merge_rng: &mut SplitMix64,
    ) -> Result<(bool, Duration), String> {
        std::thread::scope(|s| {
            s.spawn(|| self.hand_over(plan));
            s.spawn(|| self.kill_replicas(chaos_rng));
            s.spawn(|| self.merge_pulls(merge_rng));
            let result = self.wait_for_quiescence(issues);
            self.all_over.store(true, Ordering::SeqCst);
            result
        })
    }

    /// Sends a signed webhook to a replica; gives its status.
    fn send_webhook(&self, event: &str, body: &Value, replica: usize) -> Result<u16, String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let n = self.deliveries.fetch_add(1, Ordering::SeqCst);
        let id = format!("soak-{}-{n}", self.p.seed);
        self.api.webhook(
            event,
            &id,
            &body,
            &sign(self.webhook_secret, &body)?,
            replica,
        )
    }

    /// The hand-overs, in plan order.
    fn hand_over(&self, plan: &[Planned]) {
        for item in plan {
            let due = self.chaos_start + item.at;
            while Instant::now() < due {
                std::thread::sleep(Duration::from_millis(50));
            }
            match item.via {
                Via::Api(replica) => {
                    let body = json!({
                        "issueNumber": item.issue,
                        "repoId": self.repo_id,
                        "title": format!("Soak issue {}", item.issue),
                    });
                    match assign(self.api, &body, replica) {
                        Ok(()) => self.tally.lock().assigned_api += 1,
                        Err(e) => self
                            .tally
                            .lock()
                            .problems
                            .push(format!("issue #{}: {e}", item.issue)),
                    }
                }
                Via::Label(webhook) => {
                    self.fake.add_label(OWNER, NAME, item.issue, "agentry");
                    self.tally.lock().labelled += 1;
                    if let Some(replica) = webhook {
                        let payload = json!({
                            "action": "labeled",
                            "issue": {"number": item.issue},
                            "label": {"name": "agentry"},
                            "repository": self.repository,
                        });
                        match self.send_webhook("issues", &payload, replica) {
                            Ok(200) => self.tally.lock().label_webhooks += 1,
                            Ok(status) => self.tally.lock().problems.push(format!(
                                "issue #{}: the labeled webhook answered {status}",
                                item.issue
                            )),
                            Err(e) => self.tally.lock().problems.push(e),
                        }
                    }
                }
            }
        }
        self.plan_done.store(true, Ordering::SeqCst);
    }

    /// The kills: kill -9 a random replica now and then, restart it at once; a replica that
    /// exits by itself is a crash (reported) and is restarted too.
    fn kill_replicas(&self, chaos_rng: &mut SplitMix64) {
        let pause = |rng: &mut SplitMix64| {
            Duration::from_secs(
                rng.range(self.p.kill_every.0 as i64, self.p.kill_every.1 as i64) as u64,
            )
        };
        let mut next = Instant::now() + pause(chaos_rng);
        while !self.all_over.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
            for i in 0..self.cluster.len() {
                if !self.cluster.alive(i) && !self.all_over.load(Ordering::SeqCst) {
                    self.crashes.lock().push(format!(
                        "replica {} exited by itself at {:.1} s (see {}.log)",
                        self.cluster.name(i),
                        self.start.elapsed().as_secs_f64(),
                        self.cluster.name(i)
                    ));
                    if let Err(e) = self.cluster.start(i) {
                        say(
                            self.start,
                            &format!("could not restart {}: {e}", self.cluster.name(i)),
                        );
                    }
                }
            }
            if self.chaos_over.load(Ordering::SeqCst) || Instant::now() < next {
                continue;
            }
            let i = chaos_rng.below(self.cluster.len() as u64) as usize;
            match self.cluster.kill_and_restart(i) {
                Ok(()) => say(
                    self.start,
                    &format!(
                        "kill -9 replica {} (kill {}), restarted",
                        self.cluster.name(i),
                        self.cluster.kills().len()
                    ),
                ),
                Err(e) => say(
                    self.start,
                    &format!("kill/restart {}: {e}", self.cluster.name(i)),
                ),
            }
            next = Instant::now() + pause(chaos_rng);
        }
    }

    /// The merges: a pull request is merged a few seconds after its review appears (or 45 s
    /// after it opened); half are announced by a webhook to a random replica.
    fn merge_pulls(&self, merge_rng: &mut SplitMix64) {
        let mut seen: HashMap<u64, Instant> = HashMap::new();
        let mut due: BTreeMap<u64, (Instant, Option<usize>)> = BTreeMap::new();
        while !self.all_over.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(250));
            for pull in self.fake.pulls(OWNER, NAME) {
                if pull.state != "open" || due.contains_key(&pull.number) {
                    continue;
                }
                let first = *seen.entry(pull.number).or_insert_with(Instant::now);
                let reviewed = self
                    .fake
                    .reviews(OWNER, NAME, pull.number)
                    .iter()
                    .any(|b| b.contains("<!-- agentry:review:"));
                if reviewed || first.elapsed() > Duration::from_secs(45) {
                    let delay = Duration::from_millis(merge_rng.below(5000));
                    let webhook = merge_rng
                        .chance(50)
                        .then(|| merge_rng.below(self.cluster.len() as u64) as usize);
                    due.insert(pull.number, (Instant::now() + delay, webhook));
                }
            }
            let now = Instant::now();
            let ready: Vec<(u64, Option<usize>)> = due
                .iter()
                .filter(|(_, (at, _))| *at <= now)
                .map(|(n, (_, w))| (*n, *w))
                .collect();
            for (number, webhook) in ready {
                due.insert(number, (now + Duration::from_secs(365 * 86_400), None));
                let Some(pull) = self
                    .fake
                    .pulls(OWNER, NAME)
                    .into_iter()
                    .find(|x| x.number == number)
                else {
                    continue;
                };
                if pull.state != "open" {
                    continue;
                }
                self.fake.merge_pull(OWNER, NAME, number);
                self.tally.lock().merged += 1;
                if let Some(replica) = webhook {
                    let payload = json!({
                        "action": "closed",
                        "number": number,
                        "pull_request": {
                            "number": number,
                            "state": "closed",
                            "merged": true,
                            "html_url": format!("https://github.com/{OWNER}/{NAME}/pull/{number}"),
                            "head": {"ref": pull.head},
                            "base": {"ref": pull.base},
                        },
                        "repository": self.repository,
                    });
                    match self.send_webhook("pull_request", &payload, replica) {
                        Ok(200) => self.tally.lock().merge_webhooks += 1,
                        Ok(status) => self.tally.lock().problems.push(format!(
                            "pull request #{number}: the merge webhook answered {status}"
                        )),
                        Err(e) => self.tally.lock().problems.push(e),
                    }
                }
            }
        }
    }

    /// The end: chaos over once its time is up and every issue was handed over, the faults
    /// off, then a wait until nothing is pending or the quiescence deadline passes.
    fn wait_for_quiescence(&self, issues: &[u64]) -> Result<(bool, Duration), String> {
        while self.chaos_start.elapsed() < self.p.chaos || !self.plan_done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.chaos_over.store(true, Ordering::SeqCst);
        self.fake.clear_faults();
        let kills = self.cluster.kills().len();
        say(
            self.start,
            &format!("chaos over after {kills} kills; faults off; waiting for quiescence"),
        );
        let world = check::World {
            fake: self.fake,
            api: self.api,
            repo: (OWNER, NAME),
            issues: issues.to_vec(),
        };
        let quiet_start = Instant::now();
        let deadline = quiet_start + self.p.quiesce;
        let mut last_report = Instant::now();
        loop {
            let snap = match world.snapshot() {
                Ok(snap) => snap,
                Err(e) => break Err(e),
            };
            let pending = world.pending(&snap);
            if pending.is_empty() {
                break Ok((true, quiet_start.elapsed()));
            }
            if Instant::now() >= deadline {
                say(
                    self.start,
                    &format!(
                        "not quiet after {:.0} s: {}",
                        self.p.quiesce.as_secs_f64(),
                        pending.join("; ")
                    ),
                );
                break Ok((false, quiet_start.elapsed()));
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                say(self.start, &format!("waiting: {}", pending.join("; ")));
                last_report = Instant::now();
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// Assigns an issue through the API: retried (on either replica) while the code host or a
/// replica fails, until created or found already linked.
fn assign(api: &Api, body: &Value, replica: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut i = replica;
    let mut last = String::new();
    while Instant::now() < deadline {
        let a = api.call("POST", "/api/issues/assign", Some(body), i, On5xx::Return)?;
        match a.status {
            200 | 201 => return Ok(()),
            // 503: the code host failed during the lookup; 404: the issue was not in the
            // synced copy and the sync that looked for it failed.
            404 | 503 => last = format!("{} {}", a.status, a.body),
            _ => return Err(format!("assign answered {} {}", a.status, a.body)),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!("assign did not succeed within 180 s: {last}"))
}

/// Polls `probe` every 100 ms until it gives a value or `within` passes.
fn wait_for<T>(within: Duration, probe: impl FnMut() -> Option<T>) -> Option<T> {
    agentry_testkit::wait::poll(within, Duration::from_millis(100), probe).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_documented_example() {
        // GitHub's documented example (docs: "Validating webhook deliveries").
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!").unwrap(),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }
}
