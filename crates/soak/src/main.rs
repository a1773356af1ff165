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
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
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

fn run(p: &Params) -> Result<bool, String> {
    let start = Instant::now();
    let mut rng = SplitMix64::new(p.seed);
    std::fs::create_dir_all(&p.work).map_err(|e| format!("{}: {e}", p.work.display()))?;
    let work = std::path::absolute(&p.work).map_err(|e| format!("{}: {e}", p.work.display()))?;

    // The fake agent and its ledger.
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

    // The code host: one repository whose clone URL is a real local repository.
    let source = agentry_testkit::git::source_repo(&work);
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

    // Two replicas on one database, one master key, one webhook secret.
    let master_key = STANDARD.encode(random_bytes(&mut rng, 32));
    let webhook_secret = hex::encode(random_bytes(&mut rng, 32));
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
    let cluster = Cluster::new(&p.agentry, &work, &["a", "b"], env)?;
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

    // The code-host token, the repository, its settings.
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

    // The plan: half the issues through the API (alternating replicas), half by label (half
    // of those also announced by webhook), at random times in the first 60 % of the chaos.
    let mut order = issues.clone();
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

    let chaos_over = AtomicBool::new(false);
    let all_over = AtomicBool::new(false);
    let plan_done = AtomicBool::new(false);
    let deliveries = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let crashes: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut chaos_rng = SplitMix64::new(rng.next_u64());
    let mut merge_rng = SplitMix64::new(rng.next_u64());
    let chaos_start = Instant::now();
    let secret = webhook_secret.as_bytes();
    let send_webhook = |event: &str, body: &Value, replica: usize| -> Result<u16, String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let n = deliveries.fetch_add(1, Ordering::SeqCst);
        let id = format!("soak-{}-{n}", p.seed);
        api.webhook(event, &id, &body, &sign(secret, &body)?, replica)
    };
    let repository = json!({
        "name": NAME,
        "full_name": format!("{OWNER}/{NAME}"),
        "owner": {"login": OWNER},
        "html_url": format!("https://github.com/{OWNER}/{NAME}"),
    });

    let outcome: Result<(bool, Duration), String> = std::thread::scope(|s| {
        // The hand-overs, in plan order.
        s.spawn(|| {
            for item in &plan {
                let due = chaos_start + item.at;
                while Instant::now() < due {
                    std::thread::sleep(Duration::from_millis(50));
                }
                match item.via {
                    Via::Api(replica) => {
                        let body = json!({
                            "issueNumber": item.issue,
                            "repoId": repo_id,
                            "title": format!("Soak issue {}", item.issue),
                        });
                        match assign(&api, &body, replica) {
                            Ok(()) => tally_of(&tally).assigned_api += 1,
                            Err(e) => tally_of(&tally)
                                .problems
                                .push(format!("issue #{}: {e}", item.issue)),
                        }
                    }
                    Via::Label(webhook) => {
                        fake.add_label(OWNER, NAME, item.issue, "agentry");
                        tally_of(&tally).labelled += 1;
                        if let Some(replica) = webhook {
                            let payload = json!({
                                "action": "labeled",
                                "issue": {"number": item.issue},
                                "label": {"name": "agentry"},
                                "repository": repository,
                            });
                            match send_webhook("issues", &payload, replica) {
                                Ok(200) => tally_of(&tally).label_webhooks += 1,
                                Ok(status) => tally_of(&tally).problems.push(format!(
                                    "issue #{}: the labeled webhook answered {status}",
                                    item.issue
                                )),
                                Err(e) => tally_of(&tally).problems.push(e),
                            }
                        }
                    }
                }
            }
            plan_done.store(true, Ordering::SeqCst);
        });

        // The chaos: kill -9 a random replica now and then, restart it at once; a replica
        // that exits by itself is a crash (reported) and is restarted too.
        s.spawn(|| {
            let pause = |rng: &mut SplitMix64| {
                Duration::from_secs(rng.range(p.kill_every.0 as i64, p.kill_every.1 as i64) as u64)
            };
            let mut next = Instant::now() + pause(&mut chaos_rng);
            while !all_over.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                for i in 0..cluster.len() {
                    if !cluster.alive(i) && !all_over.load(Ordering::SeqCst) {
                        crashes
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(format!(
                                "replica {} exited by itself at {:.1} s (see {}.log)",
                                cluster.name(i),
                                start.elapsed().as_secs_f64(),
                                cluster.name(i)
                            ));
                        if let Err(e) = cluster.start(i) {
                            say(
                                start,
                                &format!("could not restart {}: {e}", cluster.name(i)),
                            );
                        }
                    }
                }
                if chaos_over.load(Ordering::SeqCst) || Instant::now() < next {
                    continue;
                }
                let i = chaos_rng.below(cluster.len() as u64) as usize;
                match cluster.kill_and_restart(i) {
                    Ok(()) => say(
                        start,
                        &format!(
                            "kill -9 replica {} (kill {}), restarted",
                            cluster.name(i),
                            cluster.kills().len()
                        ),
                    ),
                    Err(e) => say(start, &format!("kill/restart {}: {e}", cluster.name(i))),
                }
                next = Instant::now() + pause(&mut chaos_rng);
            }
        });

        // The merges: a pull request is merged a few seconds after its review appears (or
        // 45 s after it opened); half are announced by a webhook to a random replica.
        s.spawn(|| {
            let mut seen: HashMap<u64, Instant> = HashMap::new();
            let mut due: BTreeMap<u64, (Instant, Option<usize>)> = BTreeMap::new();
            while !all_over.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(250));
                for pull in fake.pulls(OWNER, NAME) {
                    if pull.state != "open" || due.contains_key(&pull.number) {
                        continue;
                    }
                    let first = *seen.entry(pull.number).or_insert_with(Instant::now);
                    let reviewed = fake
                        .reviews(OWNER, NAME, pull.number)
                        .iter()
                        .any(|b| b.contains("<!-- agentry:review:"));
                    if reviewed || first.elapsed() > Duration::from_secs(45) {
                        let delay = Duration::from_millis(merge_rng.below(5000));
                        let webhook = merge_rng
                            .chance(50)
                            .then(|| merge_rng.below(cluster.len() as u64) as usize);
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
                    let Some(pull) = fake
                        .pulls(OWNER, NAME)
                        .into_iter()
                        .find(|x| x.number == number)
                    else {
                        continue;
                    };
                    if pull.state != "open" {
                        continue;
                    }
                    fake.merge_pull(OWNER, NAME, number);
                    tally_of(&tally).merged += 1;
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
                            "repository": repository,
                        });
                        match send_webhook("pull_request", &payload, replica) {
                            Ok(200) => tally_of(&tally).merge_webhooks += 1,
                            Ok(status) => tally_of(&tally).problems.push(format!(
                                "pull request #{number}: the merge webhook answered {status}"
                            )),
                            Err(e) => tally_of(&tally).problems.push(e),
                        }
                    }
                }
            }
        });

        // The end: chaos over once its time is up and every issue was handed over.
        while chaos_start.elapsed() < p.chaos || !plan_done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
        }
        chaos_over.store(true, Ordering::SeqCst);
        fake.clear_faults();
        let kills = cluster.kills().len();
        say(
            start,
            &format!("chaos over after {kills} kills; faults off; waiting for quiescence"),
        );
        let world = check::World {
            fake: &fake,
            api: &api,
            repo: (OWNER, NAME),
            issues: issues.clone(),
        };
        let quiet_start = Instant::now();
        let deadline = quiet_start + p.quiesce;
        let mut last_report = Instant::now();
        let result = loop {
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
                    start,
                    &format!(
                        "not quiet after {:.0} s: {}",
                        p.quiesce.as_secs_f64(),
                        pending.join("; ")
                    ),
                );
                break Ok((false, quiet_start.elapsed()));
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                say(start, &format!("waiting: {}", pending.join("; ")));
                last_report = Instant::now();
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        all_over.store(true, Ordering::SeqCst);
        result
    });
    let (quiet, to_quiet) = outcome?;
    if quiet {
        say(
            start,
            &format!("quiet after {:.1} s; checking", to_quiet.as_secs_f64()),
        );
    }

    // The checks.
    let world = check::World {
        fake: &fake,
        api: &api,
        repo: (OWNER, NAME),
        issues,
    };
    let snap = world.snapshot()?;
    let ledger_text =
        std::fs::read_to_string(&ledger).map_err(|e| format!("{}: {e}", ledger.display()))?;
    let entries = agent::read_ledger(&ledger_text)?;
    let kills = cluster.kills();
    let mut findings = check::verify(&world, &snap, &entries, &kills)?;
    let requests = fake.requests();
    cluster.stop_all();

    let tally = tally
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    findings.other.extend(tally.problems.iter().cloned());
    findings.other.extend(
        crashes
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
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

fn tally_of(t: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
fn wait_for<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
