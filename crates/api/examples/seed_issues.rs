//! Serves the fake GitHub on `127.0.0.1` with one repository holding many open issues, for
//! the load benchmark (`scripts/load.sh`, docs/benchmarks.md):
//!
//! ```text
//! cargo run --release -p agentry-api --example seed_issues -- DIR [ISSUES]
//! ```
//!
//! It creates `DIR/source.git` (a bare git repository with a README on `main`, the clone URL
//! of the repository, so that agents can run on it), seeds the code-host token
//! [`TOKEN`] of the user `agentry-bot` and the repository `acme/load` with `ISSUES` open
//! issues (default 5,000; no `agentry` label, so none is assigned by label sync), prints one
//! JSON line on stdout (`{"baseUrl", "token", "repo", "issues"}`) and serves until its
//! standard input closes.

use std::io::{Read, Write};
use std::path::PathBuf;

use agentry_fake_github::FakeGitHub;

/// The code-host token the fake accepts.
const TOKEN: &str = "ghp_loadBenchmarkToken0123456789abcdef";
const OWNER: &str = "acme";
const NAME: &str = "load";

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// A scratch directory (the source repository).
    dir: PathBuf,
    /// Open issues to create.
    #[arg(default_value_t = 5000)]
    issues: u64,
}

fn main() -> Result<(), Error> {
    let Args { dir, issues } = clap::Parser::parse();
    std::fs::create_dir_all(&dir)?;
    let source = agentry_testkit::git::source_repo(&dir);
    let clone_url = source
        .to_str()
        .ok_or("the scratch directory's path is not UTF-8")?;

    let fake = FakeGitHub::try_start()?;
    fake.add_token(TOKEN, "agentry-bot");
    fake.add_repo(OWNER, NAME, "main");
    fake.set_clone_url(OWNER, NAME, clone_url);
    fake.add_repo_label(OWNER, NAME, "bug", "d73a4a");
    for n in 1..=issues {
        let labels: &[&str] = if n % 7 == 0 { &["bug"] } else { &[] };
        fake.add_issue(
            OWNER,
            NAME,
            &format!("Load issue {n}: something to fix in module {}", n % 97),
            Some("Steps to reproduce, expected and actual behaviour, in a few lines of text."),
            labels,
        );
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{{\"baseUrl\":\"{}\",\"token\":\"{TOKEN}\",\"repo\":\"{OWNER}/{NAME}\",\"issues\":{issues}}}",
        fake.base_url()
    )?;
    out.flush()?;
    drop(out);
    // Serve until the parent closes our standard input.
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    Ok(())
}
