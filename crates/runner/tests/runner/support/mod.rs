//! What the runner's integration tests share: the fake agents, the real `git` with no user
//! configuration, and a bare "remote" repository with one commit on `main`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

#[allow(unused_imports, reason = "not every test binary uses both")]
pub use agentry_testkit::git::{git, seeded_bare};

/// The `PATH` the agents get in these tests.
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A fake agent executable from `tests/fake-agents`.
pub fn fake(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fake-agents")
        .join(name)
}
