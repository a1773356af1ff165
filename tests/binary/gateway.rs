//! The model gateway and the sandbox's network through `agentry serve`, with the fake agent
//! CLIs (which make their model calls with curl through whatever the runner gives them) and
//! the fake model API as the upstream: the bill is what the gateway metered, not what the
//! agent printed; the agent holds a run key, never the real one; from inside the sandbox
//! nothing but the gateway and the egress proxy is reachable, and the proxy lets through
//! only `egressAllow`. Every address used is on this machine: the sandbox's lack of a route
//! off it is read from `/proc/net/route`, never tried.
//!
//! These tests need the sandbox (CI requires it); where bubblewrap does not work they say so
//! and pass.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentry_fake_models::FakeModels;
use agentry_persistence::test_support::TestDb;
use serde_json::{Value, json};

use super::{Server, connect_and_create_task, eventually, fake_with_repo, get};

const MASTER_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

fn sandboxed() -> bool {
    let on = super::sandboxed();
    if !on {
        eprintln!(
            "note: bubblewrap does not work here; the gateway's end-to-end test does nothing"
        );
    }
    on
}

fn fake_agent(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/runner/tests/fake-agents")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

/// An HTTP server on 127.0.0.1 that answers `ok` to every request; counts connections.
fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0_u8; 4096];
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream.read(&mut buf);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (port, count)
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::new()
}

/// Through `base`: stores the code-host token `gh` and connects `acme/web`; returns the
/// repository.
fn connect_repo(base: &str, admin: &str, gh: &str) -> Value {
    let put = client()
        .put(format!("{base}/api/secrets/CODEHOST_TOKEN"))
        .bearer_auth(admin)
        .json(&json!({ "value": gh }))
        .send()
        .unwrap();
    assert_eq!(put.status(), 200);
    client()
        .post(format!("{base}/api/repos"))
        .bearer_auth(admin)
        .json(&json!({ "repoUrl": "https://github.com/acme/web" }))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn patch_settings(base: &str, admin: &str, patch: Value) {
    let repos: Value = client()
        .get(format!("{base}/api/repos"))
        .bearer_auth(admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = repos["repos"][0]["id"].as_str().unwrap().to_owned();
    let res = client()
        .patch(format!("{base}/api/repos/{id}/settings"))
        .bearer_auth(admin)
        .json(&patch)
        .send()
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().unwrap_or_default());
}

fn log_of(base: &str, admin: &str, id: &str) -> String {
    client()
        .get(format!("{base}/api/tasks/{id}/log"))
        .bearer_auth(admin)
        .send()
        .unwrap()
        .text()
        .unwrap()
}

/// A Claude run through the gateway: two metered calls are the bill (the agent's forged
/// figure is kept beside it, with a cost_mismatch note); the agent saw a run key and the
/// gateway's address; from inside, agentry's API, the code host, the model API and a local
/// server are unreachable and no route leads anywhere; through the proxy, the host listed
/// in egressAllow is reached (plain and tunnelled) and an unlisted one is refused and
/// listed in egressBlocked and the metric.
#[test]
fn a_sandboxed_agent_is_billed_by_the_gateway_and_reaches_only_what_is_allowed() {
    if !sandboxed() {
        return;
    }
    const GH: &str = "ghp_GatewayTestToken0123456789abcdef";
    let models = FakeModels::start();
    let (github, dir, _source) = fake_with_repo(GH);
    let (allowed, allowed_hits) = counting_server();
    let (refused, refused_hits) = counting_server();
    let api = github.base_url();
    let upstream = models.base_url();
    let key = models.key();
    let claude = fake_agent("claude");
    let env = [
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CLAUDE_BIN", claude.as_str()),
        ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
        ("AGENTRY_ANTHROPIC_UPSTREAM", upstream.as_str()),
        ("ANTHROPIC_API_KEY", key.as_str()),
    ];
    let mut server = Server::start_with(&dir.path().join("data"), None, false, &env);
    let admin = server.read_token();
    let base = server.base.clone();
    let api_port = port_of(&base);
    let gh_port = port_of(&api);
    let models_port = port_of(&upstream);
    let mut probes = vec![
        format!("127.0.0.1:{api_port}"),
        format!("127.0.0.1:{gh_port}"),
        format!("127.0.0.1:{models_port}"),
        format!("127.0.0.1:{allowed}"),
        format!("localhost:{allowed}"),
    ];
    if let Ok(port) = std::env::var("AGENTRY_TEST_PG_PORT") {
        probes.push(format!("127.0.0.1:{port}"));
    }
    let prompt = format!(
        "Meter me [fake:model-calls=2] [fake:cost=0.000001] [model:usage=1000,100,0,0] \
         [fake:net-probe={}] [fake:via-proxy=http://localhost:{allowed}/ok,\
         tunnel:http://localhost:{allowed}/ok,http://127.0.0.1:{refused}/no]",
        probes.join(",")
    );
    // The repository's egressAllow must be set before the task runs: connect, set, then
    // create the task (the runner takes it at once).
    let repo = connect_repo(&base, &admin, GH);
    patch_settings(&base, &admin, json!({ "egressAllow": ["localhost"] }));
    let task: Value = client()
        .post(format!("{base}/api/tasks"))
        .bearer_auth(&admin)
        .json(&json!({ "repoId": repo["id"], "title": "Meter me", "prompt": prompt }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = task["id"].as_str().unwrap().to_owned();
    let mut last = Value::Null;
    eventually(Duration::from_secs(60), "the pull request", || {
        last = get(&base, &format!("/api/tasks/{id}"), &admin).1;
        last["state"] == "pr_opened" || last["state"] == "failed"
    });
    assert_eq!(
        last["state"],
        "pr_opened",
        "{last:#}\n{}",
        server.stderr.so_far()
    );

    // The bill: two calls of 1,000 input and 100 output tokens of claude-sonnet-5
    // ($2 and $10 per million) = 2 × $0.003.
    let run = &last["runs"][0];
    assert_eq!(run["sandboxed"], true, "{run}");
    assert_eq!(run["modelCalls"], 2, "{run}");
    assert_eq!(run["costUsd"], "0.006", "{run}");
    assert_eq!(run["meteredCostUsd"], "0.006", "{run}");
    assert_eq!(run["reportedCostUsd"], "0.000001", "{run}");
    assert_eq!(last["costUsd"], "0.006", "{last}");
    let mismatch: Vec<&Value> = last["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "cost_mismatch")
        .collect();
    assert_eq!(mismatch.len(), 1, "{last:#}");
    assert!(
        mismatch[0]["reason"]
            .as_str()
            .unwrap()
            .contains("metered 0.006 USD over 2 model calls")
    );
    let (status, calls) = get(&base, &format!("/api/tasks/{id}/calls"), &admin);
    assert_eq!(status, 200);
    let calls = calls["calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    for call in &calls {
        assert_eq!(
            (
                &call["status"],
                &call["outcome"],
                &call["costUsd"],
                &call["model"]
            ),
            (
                &json!(200),
                &json!("completed"),
                &json!("0.003"),
                &json!("claude-sonnet-5")
            ),
            "{call}"
        );
        assert_eq!(
            (&call["inputTokens"], &call["outputTokens"]),
            (&json!(1000), &json!(100))
        );
    }
    // The upstream answered both with the real key (it refuses any other with 401).
    assert_eq!(models.calls().len(), 2);

    // What the agent saw, as it printed it.
    let log = log_of(&base, &admin, &id);
    assert!(
        !log.contains(&key),
        "the real key reached the agent:\n{log}"
    );
    assert!(log.contains("FAKE key agentry-run-"), "{log}");
    assert!(log.contains("FAKE base http://127.0.0.1:4810"), "{log}");
    assert!(log.contains("FAKE proxy http://127.0.0.1:4811"), "{log}");
    for probe in &probes {
        assert!(
            log.contains(&format!("FAKE probe {probe} 000")),
            "{probe} was reachable from inside the sandbox:\n{log}"
        );
    }
    assert!(log.contains("FAKE routes 0"), "{log}");
    assert!(log.contains("FAKE ifaces lo \n"), "{log}");
    assert!(
        log.contains(&format!("FAKE via http://localhost:{allowed}/ok 200")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "FAKE via tunnel:http://localhost:{allowed}/ok 200"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("FAKE via http://127.0.0.1:{refused}/no 403")),
        "{log}"
    );
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 2);
    assert_eq!(refused_hits.load(Ordering::SeqCst), 0);

    let blocked = last["egressBlocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{last:#}");
    assert_eq!(
        (
            &blocked[0]["attempt"],
            &blocked[0]["host"],
            &blocked[0]["port"],
            &blocked[0]["count"]
        ),
        (&json!(1), &json!("127.0.0.1"), &json!(refused), &json!(1))
    );
    let metrics = client()
        .get(format!("{base}/metrics"))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("agentry_egress_blocked_total{repo=\"https://github.com/acme/web\"} 1"),
        "{metrics}"
    );
    assert_eq!(github.pulls("acme", "web").len(), 1);
}

/// A Codex run with a small allowance: the gateway lets calls through until the run's
/// metered calls have spent it, refuses the next (429 in OpenAI's shape), and the run fails
/// with "budget reached", over its allowance by less than one call.
#[test]
fn a_codex_run_is_stopped_by_the_gateway_at_its_allowance() {
    if !sandboxed() {
        return;
    }
    const GH: &str = "ghp_GatewayBudgetToken0123456789abcdef";
    let models = FakeModels::start();
    let (github, dir, _source) = fake_with_repo(GH);
    let api = github.base_url();
    let upstream = models.openai_base_url();
    let key = models.key();
    let codex = fake_agent("codex");
    let env = [
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CODEX_BIN", codex.as_str()),
        ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
        ("AGENTRY_OPENAI_UPSTREAM", upstream.as_str()),
        ("OPENAI_API_KEY", key.as_str()),
    ];
    let mut server = Server::start_with(&dir.path().join("data"), None, false, &env);
    let admin = server.read_token();
    let base = server.base.clone();
    let repo = connect_repo(&base, &admin, GH);
    patch_settings(
        &base,
        &admin,
        json!({ "agentType": "codex", "maxCostPerTaskUsd": "0.01" }),
    );
    // Each call: 3,000 input (1,000 cached) and 100 output tokens of gpt-6.1-sol
    // ($2, $0.1 cached, $10 per million) = $0.0051.
    let task: Value = client()
        .post(format!("{base}/api/tasks"))
        .bearer_auth(&admin)
        .json(&json!({
            "repoId": repo["id"], "title": "Spend",
            "prompt": "Spend [fake:turns=10] [fake:model-calls=1] [model:usage=3000,100,1000,0]"
        }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = task["id"].as_str().unwrap().to_owned();
    let mut last = Value::Null;
    eventually(Duration::from_secs(60), "the task failing", || {
        last = get(&base, &format!("/api/tasks/{id}"), &admin).1;
        last["state"] == "failed" || last["state"] == "pr_opened"
    });
    assert_eq!(
        last["state"],
        "failed",
        "{last:#}\n{}",
        server.stderr.so_far()
    );
    let message = last["errorMessage"].as_str().unwrap();
    assert!(message.starts_with("budget reached"), "{message}");
    let run = &last["runs"][0];
    // Two calls went out ($0.0102 ≥ $0.01 after the second); the third was refused.
    assert_eq!(run["modelCalls"], 3, "{run}");
    assert_eq!(run["costUsd"], "0.0102", "{run}");
    assert_eq!(models.calls().len(), 2);
    let (_, calls) = get(&base, &format!("/api/tasks/{id}/calls"), &admin);
    let outcomes: Vec<&str> = calls["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["completed", "completed", "refused"]);
    assert_eq!(calls["calls"][2]["status"], 429);
    assert!(github.pulls("acme", "web").is_empty());
}

/// Two replicas on one PostgreSQL: A's agent makes two metered calls, then A is killed
/// (the sandbox dies with it). B recovers the task once A's lease expired; A's run
/// directory is out of its reach, yet the lost run is recorded with both metered calls.
#[test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
fn a_metered_run_recovered_by_the_other_replica_keeps_every_call() {
    if !sandboxed() {
        return;
    }
    const GH: &str = "ghp_GatewayReplicaToken0123456789abcdef";
    let Some(db) = TestDb::postgres() else { return };
    let models = FakeModels::start();
    let (github, dir, _source) = fake_with_repo(GH);
    let api = github.base_url();
    let upstream = models.base_url();
    let key = models.key();
    let claude = fake_agent("claude");
    let env = [
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CLAUDE_BIN", claude.as_str()),
        ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
        ("AGENTRY_RUN_LEASE_SECS", "3"),
        ("AGENTRY_MASTER_KEY", MASTER_KEY),
        ("AGENTRY_ANTHROPIC_UPSTREAM", upstream.as_str()),
        ("ANTHROPIC_API_KEY", key.as_str()),
    ];
    let mut a = Server::start_with(&dir.path().join("a"), Some(&db.url), true, &env);
    let admin = a.read_token();
    let id = connect_and_create_task(
        &a.base,
        &admin,
        GH,
        "Metered then lost",
        "Work [fake:model-calls=2] [model:usage=1000,100,0,0] [fake:sleep=120]",
    );
    eventually(Duration::from_secs(30), "two metered calls", || {
        let (_, calls) = get(&a.base, &format!("/api/tasks/{id}/calls"), &admin);
        calls["calls"].as_array().is_some_and(|c| c.len() == 2)
    });
    a.signal("KILL");
    drop(a);

    let b = Server::start_with(&dir.path().join("b"), Some(&db.url), true, &env);
    let mut last = Value::Null;
    eventually(Duration::from_secs(60), "the recovered task", || {
        last = get(&b.base, &format!("/api/tasks/{id}"), &admin).1;
        last["runs"].as_array().is_some_and(|r| !r.is_empty())
    });
    let first = &last["runs"][0];
    assert_eq!(first["attempt"], 1, "{last:#}");
    assert_eq!(first["outcome"], "lost", "{last:#}");
    assert_eq!(first["modelCalls"], 2, "{last:#}");
    assert_eq!(first["costUsd"], "0.006", "{last:#}");
    assert!(
        first["errorMessage"]
            .as_str()
            .unwrap()
            .contains("its cost is that of its metered model calls"),
        "{first}"
    );
}
