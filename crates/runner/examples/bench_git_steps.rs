//! What sandboxing the git steps after the agent costs per run (docs/benchmarks.md).
//!
//! A repository of `--files` files; each round checks out a task's worktree, changes a tenth
//! of the files as an agent would, and times `Worktree::commit_all` (the nested-repository
//! walk, `read-tree`, `add --all`, `write-tree`, `commit-tree`), once with the git steps as
//! plain processes and once in their bubblewrap sandbox. Prints the median of `--rounds`
//! rounds of each.
//!
//! `cargo run --release -p agentry-runner --example bench_git_steps -- --files 2000 --rounds 15`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark")]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentry_runner::workspace::{Checkout, GitAuth, GitSandbox, RepoSpec, Workspaces};
use agentry_runner::{Sandbox, SandboxMode};
use agentry_testkit::stats::quantile;
use clap::builder::RangedU64ValueParser;
use uuid::Uuid;

fn git(args: &[&str], cwd: &Path) {
    let status = Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@localhost")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@localhost")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Files in the repository (a tenth of them changed each round).
    #[arg(long, default_value_t = 2000, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    files: usize,
    /// Timed rounds of each way.
    #[arg(long, default_value_t = 15, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    rounds: usize,
}

async fn rounds(ws: &Workspaces, spec: &RepoSpec, files: usize, rounds: usize) -> Duration {
    let mut times = Vec::new();
    for round in 0..rounds {
        let worktree = ws
            .prepare(spec, Uuid::new_v4(), Checkout::NewBranch, &GitAuth::none())
            .await
            .unwrap();
        for i in (0..files).step_by(10) {
            std::fs::write(
                worktree.path().join(format!("src/file{i}.txt")),
                format!("changed in round {round}\n"),
            )
            .unwrap();
        }
        let started = Instant::now();
        let commit = worktree.commit_all("Bench").await.unwrap();
        times.push(started.elapsed());
        assert!(commit.is_some());
        worktree.remove().await.unwrap();
    }
    quantile(&mut times, 0.5).unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let Args {
        files,
        rounds: count,
    } = clap::Parser::parse();
    let dir = tempfile::TempDir::new().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("src")).unwrap();
    git(&["init", "-q", "-b", "main"], &source);
    for i in 0..files {
        std::fs::write(
            source.join(format!("src/file{i}.txt")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    git(&["add", "."], &source);
    git(&["commit", "-q", "-m", "files"], &source);
    let spec = RepoSpec {
        key: "bench".into(),
        clone_url: source.join(".git").to_str().unwrap().to_owned(),
        default_branch: "main".into(),
        host: "github.com".into(),
        allow_local: true,
    };
    let data = dir.path().join("data");
    let plain = Workspaces::new(data.join("workspaces"));
    let sandbox = Sandbox::new(SandboxMode::Auto);
    if let Err(why) = sandbox.check().await {
        eprintln!("{why}");
        std::process::exit(2);
    }
    let jailed = Workspaces::new(data.join("workspaces")).with_git_sandbox(GitSandbox {
        sandbox,
        data_dir: data.clone(),
        forwarder: None,
    });
    // One round of each first: the mirror's clone and the file cache.
    rounds(&plain, &spec, files, 1).await;
    rounds(&jailed, &spec, files, 1).await;
    let plain_median = rounds(&plain, &spec, files, count).await;
    let jailed_median = rounds(&jailed, &spec, files, count).await;
    println!(
        "{files} files, {} changed, median of {count}: commit as plain processes {:.1} ms, \
         in the sandbox {:.1} ms, extra {:.1} ms per run",
        files.div_ceil(10),
        plain_median.as_secs_f64() * 1e3,
        jailed_median.as_secs_f64() * 1e3,
        (jailed_median.as_secs_f64() - plain_median.as_secs_f64()) * 1e3
    );
}
