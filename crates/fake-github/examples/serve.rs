//! Serves the fake GitHub on `127.0.0.1` for tests that run outside Rust (the browser tests
//! of `crates/web`): `cargo run -p agentry-fake-github --example serve`.
//!
//! It seeds one scenario, prints one JSON line on stdout (`{"baseUrl", "token", "repos"}`),
//! and serves until its standard input closes (the test that started it exits or closes it).
//!
//! The scenario: the code-host token `ghp_browsertests0000000000000000000000000` of the user
//! `octo`, who sees every repository; the repositories `acme/web` and `acme/api` (default
//! branch `main`), each with open issues carrying coloured labels.

use std::io::Read;

use agentry_fake_github::FakeGitHub;

/// The token the fake accepts.
const TOKEN: &str = "ghp_browsertests0000000000000000000000000";

fn main() -> std::io::Result<()> {
    let fake = FakeGitHub::try_start()?;
    fake.add_token(TOKEN, "octo");
    fake.add_repo("acme", "web", "main");
    fake.add_repo("acme", "api", "main");
    fake.add_repo_label("acme", "web", "bug", "d73a4a");
    fake.add_repo_label("acme", "web", "good first issue", "7057ff");
    fake.add_repo_label("acme", "api", "enhancement", "a2eeef");
    fake.add_issue(
        "acme",
        "web",
        "Dark mode for the dashboard",
        Some("The dashboard should follow the system's colour scheme."),
        &["good first issue"],
    );
    fake.add_issue(
        "acme",
        "web",
        "Login page crashes on empty password",
        Some("Steps: leave the password empty and press Enter."),
        &["bug"],
    );
    fake.add_issue(
        "acme",
        "api",
        "Paginate the /users endpoint",
        None,
        &["enhancement"],
    );
    println!(
        "{{\"baseUrl\":\"{}\",\"token\":\"{TOKEN}\",\"repos\":[\"acme/web\",\"acme/api\"]}}",
        fake.base_url()
    );
    // Serve until the parent closes our standard input.
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    Ok(())
}
