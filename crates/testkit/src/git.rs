//! The real `git`, run with no user or system configuration, and a seeded source repository.
//!
//! These helpers are for tests: they panic (with git's stderr) when git fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs git in `cwd` with no system or global configuration (and a fixed author); panics
/// with its stderr when it fails; returns its trimmed stdout.
pub fn git(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `dir/source.git`: a bare repository with a README committed on `main`, through a working
/// clone at `dir/<work>` that is kept for tests that add commits. Returns (bare, work).
pub fn seeded_bare(dir: &Path, work: &str) -> (PathBuf, PathBuf) {
    let bare = dir.join("source.git");
    std::fs::create_dir_all(&bare).expect("create the bare repository's directory");
    git(&["init", "--bare", "-b", "main"], &bare);
    let work = dir.join(work);
    git(
        &[
            "clone",
            bare.to_str().expect("a UTF-8 path"),
            work.to_str().expect("a UTF-8 path"),
        ],
        dir,
    );
    std::fs::write(work.join("README.md"), "# hello\n").expect("write the README");
    git(&["add", "README.md"], &work);
    git(&["commit", "-m", "initial"], &work);
    git(&["push", "origin", "HEAD:refs/heads/main"], &work);
    (bare, work)
}

/// `dir/source.git` of [`seeded_bare`] (seeded through `dir/seed`), for runs against a local
/// clone URL that need only the bare repository.
pub fn source_repo(dir: &Path) -> PathBuf {
    seeded_bare(dir, "seed").0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bare_repository_has_the_readme_on_main() {
        let dir = tempfile::tempdir().unwrap();
        let bare = source_repo(dir.path());
        assert_eq!(bare, dir.path().join("source.git"));
        assert_eq!(git(&["show", "main:README.md"], &bare), "# hello");
        assert_eq!(git(&["rev-list", "--count", "main"], &bare), "1");
        assert!(dir.path().join("seed/README.md").is_file());
    }
}
