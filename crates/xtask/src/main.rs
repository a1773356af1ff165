//! agentry's project tasks, run as `cargo xtask <task>` (the alias is in `.cargo/config.toml`):
//!
//! - `check-arch`: the rules of docs/architecture.md that a build does not enforce by itself,
//!   read from `cargo metadata`: which workspace crate may depend on which (dependencies
//!   point down only), that the test-only crates are never a normal dependency of a product
//!   crate, that `agentry-service` and everything under it (the agent network's servers
//!   are hyper, checked on their own too) have no actix, and that the compiler is the
//!   workspace's `rust-version` (`toolchain.rs`). Prints each broken rule and exits 1.
//! - `libs`: the library crates CI checks alone (`cargo check -p`), one per line: every
//!   member with a library target except the test-only ones (those used by other members
//!   only as dev-dependencies, or only by test-only ones).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, ExitCode};

use serde_json::Value;

mod toolchain;

/// Each product crate and the workspace crates it may depend on (normal dependencies),
/// as the map in docs/architecture.md draws them.
const ALLOWED: &[(&str, &[&str])] = &[
    ("agentry", &["agentry-api"]),
    (
        "agentry-api",
        &[
            "agentry-web",
            "agentry-service",
            "agentry-doctor",
            "agentry-persistence",
            "agentry-analytics",
            "agentry-runner",
            "agentry-codehost",
            "agentry-domain",
        ],
    ),
    ("agentry-web", &[]),
    (
        "agentry-doctor",
        &[
            "agentry-service",
            "agentry-agent-network",
            "agentry-persistence",
            "agentry-runner",
            "agentry-codehost",
            "agentry-domain",
        ],
    ),
    (
        "agentry-service",
        &[
            "agentry-persistence",
            "agentry-agent-network",
            "agentry-analytics",
            "agentry-runner",
            "agentry-codehost",
            "agentry-domain",
        ],
    ),
    (
        "agentry-agent-network",
        &["agentry-persistence", "agentry-runner", "agentry-domain"],
    ),
    ("agentry-persistence", &["agentry-domain"]),
    ("agentry-analytics", &["agentry-domain"]),
    ("agentry-runner", &["agentry-domain"]),
    ("agentry-codehost", &[]),
    ("agentry-domain", &[]),
];

/// The crates for tests only, and the test-only crates each may depend on.
const TEST_ONLY: &[(&str, &[&str])] = &[
    ("agentry-testkit", &[]),
    ("agentry-fake-github", &["agentry-testkit"]),
    ("agentry-fake-models", &["agentry-testkit"]),
    ("agentry-fake-kube", &[]),
    (
        "agentry-test-rigs",
        &[
            "agentry-testkit",
            "agentry-fake-github",
            "agentry-service",
            "agentry-persistence",
            "agentry-codehost",
            "agentry-domain",
        ],
    ),
    ("agentry-soak", &["agentry-fake-github", "agentry-testkit"]),
    ("xtask", &[]),
];

/// The crates below which no actix may be found, however deep: the service, and the agent
/// network's own servers (hyper), checked on their own so that the rule holds whoever
/// depends on them.
const NO_HTTP_SERVER_BELOW: &[&str] = &["agentry-service", "agentry-agent-network"];

/// `cargo xtask <task>`.
#[derive(clap::Parser)]
#[command(bin_name = "cargo xtask")]
enum Task {
    /// Check the rules of docs/architecture.md that a build does not enforce.
    CheckArch,
    /// Print the library crates CI checks alone, one per line.
    Libs,
}

fn main() -> ExitCode {
    let result = match clap::Parser::parse() {
        Task::CheckArch => check_arch(),
        Task::Libs => libs(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo metadata` of the workspace (with the resolved graph unless `no_deps`).
fn metadata(no_deps: bool) -> Result<Value, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args(["metadata", "--format-version", "1", "--locked"]);
    if no_deps {
        command.arg("--no-deps");
    }
    let out = command
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata's output: {e}"))
}

/// The workspace's members: name → (normal workspace dependencies, dev workspace
/// dependencies, whether it has a library target).
type Members = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>, bool)>;

fn members(meta: &Value) -> Members {
    let ids: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let packages: Vec<&Value> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["id"].as_str().is_some_and(|id| ids.contains(id)))
        .collect();
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut out = Members::new();
    for package in packages {
        let Some(name) = package["name"].as_str() else {
            continue;
        };
        let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let Some(dep_name) = dep["name"].as_str() else {
                continue;
            };
            if !names.contains(dep_name) || dep_name == name {
                continue;
            }
            // Build dependencies count as normal ones: they are built for the product too.
            if dep["kind"].as_str() == Some("dev") {
                dev.insert(dep_name.to_owned());
            } else {
                normal.insert(dep_name.to_owned());
            }
        }
        let lib = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t["kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k.as_str() == Some("lib"))
            });
        out.insert(name.to_owned(), (normal, dev, lib));
    }
    out
}

fn check_arch() -> Result<(), String> {
    let meta = metadata(false)?;
    let members = members(&meta);
    let mut broken = Vec::new();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().chain(TEST_ONLY).copied().collect();
    for (name, (normal, _, _)) in &members {
        let Some(may) = allowed.get(name.as_str()) else {
            broken.push(format!(
                "{name} is not in crates/xtask's map of the architecture: add it there and to \
                 docs/architecture.md"
            ));
            continue;
        };
        for dep in normal {
            if !may.contains(&dep.as_str()) {
                let why = if TEST_ONLY.iter().any(|(t, _)| t == dep) {
                    "a crate for tests only is never a normal dependency of a product crate"
                } else {
                    "dependencies point down only (docs/architecture.md)"
                };
                broken.push(format!("{name} depends on {dep}: {why}"));
            }
        }
    }
    for root in NO_HTTP_SERVER_BELOW {
        broken.extend(actix_below(&meta, root));
    }
    broken.extend(toolchain::check(&meta));
    if broken.is_empty() {
        println!(
            "check-arch: {} crates, every dependency as docs/architecture.md draws it; no actix \
             under {}; the compiler is the workspace's rust-version",
            members.len(),
            NO_HTTP_SERVER_BELOW.join(" or ")
        );
        Ok(())
    } else {
        Err(format!(
            "{} rule(s) broken:\n  {}",
            broken.len(),
            broken.join("\n  ")
        ))
    }
}

/// The actix packages among the normal dependencies of `root`, however deep, each as a
/// sentence.
fn actix_below(meta: &Value, root: &str) -> Vec<String> {
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let Some(start) = name_of
        .iter()
        .find(|(_, name)| **name == root)
        .map(|(id, _)| *id)
    else {
        return vec![format!("{root} is not in the workspace")];
    };
    let mut seen = BTreeSet::from([start]);
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        let Some(node) = nodes.get(id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if let Some(dep_id) = dep["pkg"].as_str()
                && normal
                && seen.insert(dep_id)
            {
                todo.push(dep_id);
            }
        }
    }
    seen.iter()
        .filter_map(|id| name_of.get(id))
        .filter(|name| name.starts_with("actix"))
        .map(|name| {
            format!("{root} depends on {name} (through its dependencies): no HTTP below it")
        })
        .collect()
}

fn libs() -> Result<(), String> {
    let members = members(&metadata(true)?);
    let mut users: BTreeMap<&str, (BTreeSet<&str>, BTreeSet<&str>)> = BTreeMap::new();
    for (name, (normal, dev, _)) in &members {
        for dep in normal {
            users.entry(dep.as_str()).or_default().0.insert(name);
        }
        for dep in dev {
            users.entry(dep.as_str()).or_default().1.insert(name);
        }
    }
    // Test-only: used by other members, and normally only by test-only ones.
    let mut test_only: BTreeSet<&str> = BTreeSet::new();
    loop {
        let before = test_only.len();
        for (name, (normal_users, dev_users)) in &users {
            let used = !normal_users.is_empty() || !dev_users.is_empty();
            if used && normal_users.iter().all(|u| test_only.contains(u)) {
                test_only.insert(name);
            }
        }
        if test_only.len() == before {
            break;
        }
    }
    for (name, (_, _, lib)) in &members {
        if *lib && !test_only.contains(name.as_str()) {
            println!("{name}");
        }
    }
    Ok(())
}
