//! The toolchain rule: the compiler that builds the workspace is the one its `rust-version`
//! names (major and minor).
//!
//! A `rust-toolchain.toml` naming an exact release would make rustup download that release
//! on a machine whose one toolchain is `stable`, and fail where nothing can be downloaded;
//! the README's two commands must work with the machine's toolchain alone. So the pin is
//! `rust-version` in the workspace's Cargo.toml (cargo refuses an older compiler with a
//! clear message) and this rule, which CI runs: a newer compiler fails it until someone has
//! run the checks with it and moved `rust-version` forward in the same commit.

use std::process::Command;

use serde_json::Value;

/// The broken rule, if the compiler is not the `rust-version` of the workspace's crates.
pub fn check(meta: &Value) -> Option<String> {
    let pinned = pinned(meta)?;
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = match Command::new(&rustc).arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            return Some(format!(
                "{rustc} --version failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Err(e) => return Some(format!("cannot run {rustc} --version: {e}")),
    };
    let found = release(&version)?;
    (found != pinned).then(|| {
        format!(
            "the compiler is {found} ({}) but the workspace's rust-version is {pinned}: run the \
             checks with {found} and move rust-version in Cargo.toml, or build with {pinned}",
            version.trim()
        )
    })
}

/// The `rust-version` (major.minor) every workspace crate declares; the first one found.
fn pinned(meta: &Value) -> Option<String> {
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    meta["packages"]
        .as_array()?
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .find_map(|p| p["rust_version"].as_str())
        .and_then(release)
}

/// `major.minor` of a version (`1.95`, `1.95.0`) or of `rustc --version`'s line
/// (`rustc 1.95.0 (59807616e 2026-04-14)`).
fn release(text: &str) -> Option<String> {
    let word = text
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut parts = word.split(['.', '-']);
    let (major, minor) = (parts.next()?, parts.next()?);
    Some(format!("{major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::release;

    #[test]
    fn releases_are_major_and_minor() {
        assert_eq!(release("1.95").as_deref(), Some("1.95"));
        assert_eq!(release("1.95.0").as_deref(), Some("1.95"));
        assert_eq!(
            release("rustc 1.96.0-beta.3 (abc 2026-05-01)").as_deref(),
            Some("1.96")
        );
        assert_eq!(release("rustc"), None);
    }
}
