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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentry_testkit::json::{elements_of, strings_of};
use serde_json::{Value, json};

use super::{
    Replicas, Server, World, connect_repo, create_task, error_of, fake_agent, get, patch_settings,
    task_when, wait_for_calls,
};

fn sandboxed() -> bool {
    let on = super::sandboxed();
    if !on {
        eprintln!(
            "note: bubblewrap does not work here; the gateway's end-to-end test does nothing"
        );
    }
    on
}

/// The world of the code-host token `gh` with no pull-request poll, where the sandbox works;
/// `None` (the test does nothing, having said why) where it does not.
fn world_here(gh: &str) -> Option<World> {
    sandboxed().then(|| World::new(gh, &[("AGENTRY_POLL_INTERVAL_SECS", "3600")]))
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

/// Waiting up to a minute for the task to end (at its pull request or failed).
fn ended() -> (Duration, &'static str) {
    (Duration::from_secs(60), "the task to end")
}

/// Waits (as long as [`ended`] says) until task `id` opened its pull request or failed,
/// asserts it ended `expected` (showing the service's log otherwise) and returns it.
fn ends_as(server: &Server, id: &str, admin: &str, expected: &str) -> Value {
    let last = task_when(&server.base, id, admin, ended(), |t| {
        t["state"] == "pr_opened" || t["state"] == "failed"
    });
    let log = server.stderr.so_far();
    assert_eq!(last["state"], expected, "{last:#}\n{log}");
    last
}

/// The text `base` serves at `path` to `token`.
fn text_of(base: &str, path: &str, token: &str) -> String {
    client()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
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
    const GH: &str = "ghp_GatewayTestToken0123456789abcdef";
    let Some(world) = world_here(GH) else {
        return;
    };
    let (github, models) = (&world.fake, &world.models);
    let (allowed, allowed_hits) = counting_server();
    let (refused, refused_hits) = counting_server();
    let (api, upstream, key) = (github.base_url(), models.base_url(), models.key());
    // The repository's egressAllow must be set before the task runs (the runner takes it at
    // once). A member without a port allows 443 only: the test server's port is listed.
    let egress = json!({ "egressAllow": [format!("localhost:{allowed}")] });
    let (server, admin, repo) = world.serve_with_settings(&egress);
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
    let id = create_task(&base, &admin, &repo, "Meter me", &prompt);
    let last = ends_as(&server, &id, &admin, "pr_opened");

    // The bill: two calls of 1,000 input and 100 output tokens of claude-sonnet-5
    // ($2 and $10 per million) = 2 × $0.003.
    let run = &last["runs"][0];
    assert_eq!(run["sandboxed"], true, "{run}");
    assert_eq!(run["modelCalls"], 2, "{run}");
    assert_eq!(run["costUsd"], "0.006", "{run}");
    assert_eq!(run["meteredCostUsd"], "0.006", "{run}");
    assert_eq!(run["reportedCostUsd"], "0.000001", "{run}");
    assert_eq!(last["costUsd"], "0.006", "{last}");
    let mismatch: Vec<&Value> = elements_of(&last, "events")
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
    let log = text_of(&base, &format!("/api/tasks/{id}/log"), &admin);
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
    let metrics = text_of(&base, "/metrics", &admin);
    assert!(
        metrics.contains("agentry_egress_blocked_total{repo=\"https://github.com/acme/web\"} 1"),
        "{metrics}"
    );
    assert_eq!(github.pulls("acme", "web").len(), 1);
}

/// A Codex run with a small allowance: the gateway lets a call through only while its
/// largest cost fits beside what the run has spent, refuses the next (429 in OpenAI's
/// shape), and the run fails with "budget reached", within its allowance.
#[test]
fn a_codex_run_is_stopped_by_the_gateway_at_its_allowance() {
    if !sandboxed() {
        return;
    }
    const GH: &str = "ghp_GatewayBudgetToken0123456789abcdef";
    // The fake Claude Code's environment is not used: the Codex one below replaces it.
    let world = World::new(GH, &[]);
    let (github, models) = (&world.fake, &world.models);
    let (api, upstream, key) = (github.base_url(), models.openai_base_url(), models.key());
    let codex = fake_agent("codex");
    let env = [
        ("AGENTRY_CODEHOST_API_URL", api.as_str()),
        ("AGENTRY_CODEX_BIN", codex.as_str()),
        ("AGENTRY_POLL_INTERVAL_SECS", "3600"),
        ("AGENTRY_OPENAI_UPSTREAM", upstream.as_str()),
        ("OPENAI_API_KEY", key.as_str()),
    ];
    let mut server = Server::start_with(&world.data_dir(), None, false, &env);
    let admin = server.read_token();
    let base = server.base.clone();
    let repo = connect_repo(&base, &admin, GH);
    let allowance = json!({ "agentType": "codex", "maxCostPerTaskUsd": "1.5" });
    patch_settings(&base, &admin, repo["id"].as_str().unwrap(), &allowance);
    // Each call: 1,000 input and 10,000 output tokens of gpt-6.1-sol ($2 and $10 per
    // million) = $0.102. Each reserves $1.28 for Codex's output limit (it sends none: the
    // model's 128,000 tokens at $10 per million) and $0.0000025 per byte of its body (under
    // 5 KB here), so a call goes out while the run has spent at most about $0.21 of $1.5.
    let prompt = "Spend [fake:turns=10] [fake:model-calls=1] [model:usage=1000,10000,0,0]";
    let id = create_task(&base, &admin, &repo, "Spend", prompt);
    let last = ends_as(&server, &id, &admin, "failed");
    let message = error_of(&last);
    assert!(message.starts_with("budget reached"), "{message}");
    let run = &last["runs"][0];
    // Three calls went out ($0.306, then $0.306 + $1.28 > $1.5); the fourth was refused.
    assert_eq!(run["modelCalls"], 4, "{run}");
    assert_eq!(run["costUsd"], "0.306", "{run}");
    assert_eq!(models.calls().len(), 3);
    let (_, calls) = get(&base, &format!("/api/tasks/{id}/calls"), &admin);
    let outcomes = strings_of(&calls, "calls", "outcome");
    assert_eq!(outcomes, ["completed", "completed", "completed", "refused"]);
    assert_eq!(calls["calls"][3]["status"], 429);
    assert!(github.pulls("acme", "web").is_empty());
}

/// Asserts that the probe agent's log shows each attack answered with its status.
fn assert_answered(log: &str, expected: &[(&str, u16)]) {
    for (attack, status) in expected {
        assert!(
            log.contains(&format!("FAKE attack {attack} {status}\n")),
            "{attack} was not answered {status}:\n{log}"
        );
    }
}

/// A hostile agent (the fake Claude Code's `[fake:attack]`: escapes, an unpriced model,
/// provider-side fetches, a cut stream, then a burst of costly calls at once) through
/// `agentry serve`, sandboxed, under a $5 per-task cap: every escape is refused and never
/// reaches the upstream; nothing the upstream billed is missing from the task's cost; the
/// burst stays within the cap (one call of it fits, the others are refused before they go
/// out), and the run stops at "budget reached".
#[test]
fn a_hostile_agent_cannot_spend_past_its_cap_or_reach_out_through_the_provider() {
    const GH: &str = "ghp_HostileAgentToken0123456789abcdef";
    const BURST: usize = 8;
    let Some(world) = world_here(GH) else {
        return;
    };
    let models = &world.models;
    let cap = json!({ "maxCostPerTaskUsd": "5" });
    let (server, admin, repo) = world.serve_with_settings(&cap);
    let base = server.base.clone();
    let prompt = format!("Attack [fake:attack={BURST}] [fake:cost=0.01]");
    let id = create_task(&base, &admin, &repo, "Attack", &prompt);
    let last = ends_as(&server, &id, &admin, "failed");
    let message = error_of(&last);
    assert!(message.starts_with("budget reached"), "{message}");

    // What the agent was answered.
    let log = text_of(&base, &format!("/api/tasks/{id}/log"), &admin);
    assert_answered(
        &log,
        &[
            ("files", 404),
            ("dotdot", 400),
            ("encoded", 400),
            ("double-slash", 400),
            ("batches", 404),
            ("chat", 404),
            ("unpriced", 400),
            ("duplicate", 400),
            ("mcp", 400),
            ("web-fetch", 400),
            ("beta", 400),
            ("cut", 200),
        ],
    );
    // The burst: one call fits the cap and goes out; the others are refused (429) as they
    // come, and the first refusal stops the run, so the agent may not see every answer.
    let refused = (1..=BURST)
        .filter(|i| log.contains(&format!("FAKE attack burst-{i} 429\n")))
        .count();
    assert!(refused >= 1, "{log}");
    let answered = (1..=BURST)
        .filter(|i| log.contains(&format!("FAKE attack burst-{i} 200\n")))
        .count();
    assert!(answered <= 1, "{log}");

    // What reached the upstream: two model calls (the cut one, one of the burst), each of
    // a priced model through the one endpoint, with no provider-side feature.
    let reached = models.calls();
    assert_eq!(reached.len(), 2, "{reached:#?}");
    for call in &reached {
        assert_eq!(
            (call.method.as_str(), call.path.as_str()),
            ("POST", "/v1/messages")
        );
        assert_eq!(call.model.as_deref(), Some("claude-sonnet-5"));
        let body = call.body.as_ref().unwrap();
        assert!(body.get("mcp_servers").is_none(), "{body}");
        assert!(!body.to_string().contains("web_fetch"), "{body}");
        assert!(call.header("anthropic-beta").is_none());
    }

    // The bill: what the upstream billed (the cut call's whole usage, the burst call's)
    // is all in the task's cost, which stays within the cap.
    let prices = agentry_runner::PriceTable::builtin();
    let price = prices.get("claude-sonnet-5").unwrap();
    let billed = reached
        .iter()
        .map(|c| {
            let u = c.usage.unwrap();
            let tokens = agentry_runner::Tokens::from_uncached(
                u.input_tokens as i64,
                u.cache_read_tokens as i64,
                u.cache_write_tokens as i64,
                u.output_tokens as i64,
            );
            price.cost(tokens).unwrap().as_decimal()
        })
        .sum::<rust_decimal::Decimal>();
    // 1,000 input and 50,000 output, then 1,000 input and 300,000 output tokens.
    assert_eq!(billed, rust_decimal::Decimal::new(3504, 3));
    let cost: rust_decimal::Decimal = last["costUsd"].as_str().unwrap().parse().unwrap();
    let (_, calls) = get(&base, &format!("/api/tasks/{id}/calls"), &admin);
    assert!(
        cost >= billed,
        "recorded {cost}, billed {billed}\n{calls:#}\n{}",
        server.stderr.so_far()
    );
    assert!(cost <= rust_decimal::Decimal::new(5, 0), "{last:#}");
    let run = &last["runs"][0];
    assert_eq!(run["sandboxed"], true, "{run}");
    assert_eq!(run["costUsd"], last["costUsd"], "{run}");
    let outcomes = strings_of(&calls, "calls", "outcome");
    let recorded_refusals = outcomes.iter().filter(|o| **o == "refused").count();
    assert!(
        (refused..BURST).contains(&recorded_refusals),
        "{refused} refusals seen by the agent\n{calls:#}"
    );
    assert!(
        elements_of(&calls, "calls")
            .iter()
            .all(|c| c["costUsd"].is_string()),
        "{calls:#}"
    );
}

/// A repository that allows provider tools (`allowProviderTools`): its agent's calls with
/// MCP servers, the provider's web fetch and its beta value go out; every other rule holds.
#[test]
fn provider_tools_pass_only_for_a_repository_that_allows_them() {
    const GH: &str = "ghp_ProviderToolsToken0123456789abcdef";
    let Some(world) = world_here(GH) else {
        return;
    };
    let models = &world.models;
    let allow = json!({ "allowProviderTools": true, "maxCostPerTaskUsd": "5" });
    let (server, admin, repo) = world.serve_with_settings(&allow);
    let base = server.base.clone();
    // One costly call fits the cap: the run goes on to its pull request.
    let id = create_task(&base, &admin, &repo, "Tools", "Tools [fake:attack=1]");
    ends_as(&server, &id, &admin, "pr_opened");
    let log = text_of(&base, &format!("/api/tasks/{id}/log"), &admin);
    assert_answered(
        &log,
        &[
            ("mcp", 200),
            ("web-fetch", 200),
            ("beta", 200),
            ("unpriced", 400),
            ("duplicate", 400),
            ("dotdot", 400),
            ("files", 404),
        ],
    );
    let reached = models.calls();
    assert!(
        reached.iter().any(|c| c
            .body
            .as_ref()
            .is_some_and(|b| b.get("mcp_servers").is_some())),
        "{reached:#?}"
    );
    assert!(reached.iter().all(|c| c.path == "/v1/messages"));
}

/// An agent floods the egress proxy with refused connects: each is counted (the task lists
/// the exact count for the destination), the service logs a few lines, not one per connect,
/// and the task detail stays small.
#[test]
fn an_agent_flooding_the_egress_proxy_is_counted_exactly_and_logged_sparingly() {
    const GH: &str = "ghp_EgressFloodToken0123456789abcdef";
    const FLOOD: usize = 2000;
    let Some(world) = world_here(GH) else {
        return;
    };
    let (server, admin, repo) = world.serve_connected();
    let base = server.base.clone();
    let prompt = format!("Flood [fake:egress-flood={FLOOD}]");
    let id = create_task(&base, &admin, &repo, "Flood", &prompt);
    let last = ends_as(&server, &id, &admin, "pr_opened");
    let log = text_of(&base, &format!("/api/tasks/{id}/log"), &admin);
    assert!(log.contains(&format!("FAKE flood {FLOOD} 403\n")), "{log}");
    let blocked = last["egressBlocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{last:#}");
    assert_eq!(
        (
            &blocked[0]["host"],
            &blocked[0]["port"],
            &blocked[0]["count"]
        ),
        (&json!("flood.example"), &json!(443), &json!(FLOOD))
    );
    let detail = text_of(&base, &format!("/api/tasks/{id}"), &admin);
    assert!(detail.len() < 20_000, "{} bytes", detail.len());
    let stderr = server.stderr.so_far();
    let lines = stderr
        .lines()
        .filter(|l| l.contains("egress refused"))
        .count();
    assert!((1..=3).contains(&lines), "{lines} lines:\n{stderr}");
}

/// Two replicas on one PostgreSQL: A's agent makes two metered calls, then A is killed
/// (the sandbox dies with it). B recovers the task once A's lease expired; A's run
/// directory is out of its reach, yet the lost run is recorded with both metered calls.
fn metered_replica_dies(replicas: &Replicas) {
    if !sandboxed() {
        return;
    }
    let prompt = "Work [fake:model-calls=2] [model:usage=1000,100,0,0] [fake:sleep=120]";
    let (a, admin, id) = replicas.start_first("a", "Metered then lost", prompt);
    wait_for_calls(&a.base, &id, &admin, "", 2, Duration::from_secs(30));
    a.signal("KILL");
    drop(a);

    let b = replicas.start("b");
    let wait = (Duration::from_secs(60), "the recovered task");
    let last = task_when(&b.base, &id, &admin, wait, |t| {
        t["runs"].as_array().is_some_and(|r| !r.is_empty())
    });
    let first = &last["runs"][0];
    assert_eq!(first["attempt"], 1, "{last:#}");
    assert_eq!(first["outcome"], "lost", "{last:#}");
    assert_eq!(first["modelCalls"], 2, "{last:#}");
    assert_eq!(first["costUsd"], "0.006", "{last:#}");
    let message = error_of(first);
    assert!(
        message.contains("its cost is that of its metered model calls"),
        "{first}"
    );
}

on_replicas!(metered_replica_dies =>
    a_metered_run_recovered_by_the_other_replica_keeps_every_call);
