//! What the runner's integration tests share: the fake agents, the real `git` with no user
//! configuration, and a bare "remote" repository with one commit on `main`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `PATH` the agents get in these tests.
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A fake agent executable from `tests/fake-agents`.
pub fn fake(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fake-agents")
        .join(name)
}

/// Runs git in `cwd` with no system or global configuration; panics with its stderr when it
/// fails; returns its trimmed stdout.
pub fn git(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `dir/source.git`: a bare repository with a README committed on `main` (through a working
/// clone at `dir/<work>`, which is kept for tests that add commits).
pub fn seeded_bare(dir: &Path, work: &str) -> (PathBuf, PathBuf) {
    let bare = dir.join("source.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&["init", "--bare", "-b", "main"], &bare);
    let work = dir.join(work);
    git(
        &["clone", bare.to_str().unwrap(), work.to_str().unwrap()],
        dir,
    );
    std::fs::write(work.join("README.md"), "# hello\n").unwrap();
    git(&["add", "README.md"], &work);
    git(&["commit", "-m", "initial"], &work);
    git(&["push", "origin", "HEAD:refs/heads/main"], &work);
    (bare, work)
}
