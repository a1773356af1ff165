//! Directories for tests that must not depend on where the build or the checkout lies.
//!
//! A test's data placed in `CARGO_TARGET_TMPDIR` lies wherever the target directory does:
//! under `/tmp` when `CARGO_TARGET_DIR` is there. Some data must not be in a temporary
//! directory (Codex will not create its helper binaries with a `HOME` under one, and the
//! agents' sandbox replaces `/tmp` with its own); [`outside_tmp`] finds a place that is not.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The temporary directories of this machine: `/tmp`, `/var/tmp` and `$TMPDIR` (the
/// latter two resolved where they exist).
fn temporary_dirs() -> Vec<PathBuf> {
    ["/tmp".into(), "/var/tmp".into(), std::env::temp_dir()]
        .into_iter()
        .flat_map(|dir: PathBuf| {
            let resolved = std::fs::canonicalize(&dir).ok();
            std::iter::once(dir).chain(resolved)
        })
        .collect()
}

/// A fresh directory named `prefix…` (removed when dropped) that lies in no temporary
/// directory (`/tmp`, `/var/tmp`, `$TMPDIR`) and not in `/run`: in `preferred` (a test's
/// `CARGO_TARGET_TMPDIR`) when it lies outside them, else in the first of `$HOME/.cache`,
/// `/var/lib`, `/srv` and `/opt` where this user may create one. `None` where there is no
/// such place.
pub fn outside_tmp(preferred: &Path, prefix: &str) -> Option<TempDir> {
    let avoided: Vec<PathBuf> = temporary_dirs()
        .into_iter()
        .chain(std::iter::once(PathBuf::from("/run")))
        .collect();
    let home_cache = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"));
    let candidates = std::iter::once(preferred.to_owned())
        .chain(home_cache)
        .chain(["/var/lib", "/srv", "/opt"].map(PathBuf::from));
    for candidate in candidates {
        if !candidate.is_absolute() {
            continue;
        }
        // `$HOME/.cache` may not exist yet.
        let _ = std::fs::create_dir_all(&candidate);
        let Ok(resolved) = std::fs::canonicalize(&candidate) else {
            continue;
        };
        if avoided.iter().any(|dir| resolved.starts_with(dir)) {
            continue;
        }
        if let Ok(dir) = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&resolved)
        {
            return Some(dir);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory found lies outside every temporary directory, even when the preferred
    /// one is `/tmp` itself.
    #[test]
    fn the_directory_is_never_a_temporary_one() {
        let dir = outside_tmp(Path::new("/tmp"), "agentry-dirs-test-")
            .expect("a writable directory outside /tmp");
        let path = std::fs::canonicalize(dir.path()).unwrap();
        for temporary in temporary_dirs() {
            assert!(!path.starts_with(&temporary), "{}", path.display());
        }
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("agentry-dirs-test-")
        );
    }
}
