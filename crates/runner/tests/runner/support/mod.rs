//! What the runner's integration tests share: the fake agents, the real `git` with no user
//! configuration, and a bare "remote" repository with one commit on `main`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use agentry_runner::process::Ended;

#[allow(unused_imports, reason = "not every test binary uses both")]
pub use agentry_testkit::git::{git, seeded_bare};

/// How a process that exited with status 0 ended.
pub const EXITED_0: Ended = Ended::Exited {
    code: Some(0),
    signal: None,
};

/// The `PATH` the agents get in these tests.
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The text of `tests/fixtures/NAME` (what the real CLIs printed, kept as fixtures).
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fake agent executable from `tests/fake-agents`.
pub fn fake(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fake-agents")
        .join(name)
}

/// Writes the program `text` to `path`, readable and executable by everyone.
pub fn write_program(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Asserts that no regular file under `dir` (symbolic links are not followed) contains any
/// of `secrets`, naming the first file that does.
#[track_caller]
pub fn assert_no_file_holds(dir: &Path, secrets: &[&str]) {
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let text = String::from_utf8_lossy(&bytes);
                assert!(
                    !secrets.iter().any(|secret| text.contains(secret)),
                    "{} holds a secret",
                    path.display()
                );
            }
        }
    }
}

/// Asserts that one of `report`'s warnings contains `text`, showing them all if none does.
#[track_caller]
pub fn assert_warned(report: &agentry_runner::RunReport, text: &str) {
    assert!(
        report.warnings.iter().any(|w| w.contains(text)),
        "no warning with {text:?}: {:?}",
        report.warnings
    );
}

/// The peak resident memory of this test process, in KiB.
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
