//! The agent CLIs agentry supports, and finding out whether the installed one is one of them
//! (docs/runner.md#supported-agent-versions).
//!
//! Both CLIs change their flags and output between releases (Codex 0.169 removed
//! `--full-auto`; Claude Code 2.1 reports model API errors as `subtype: success`), so
//! agentry runs only versions inside a [`Supported`] range, whose lower end is the version
//! CI runs for real ([`Supported::tested`]). Newer releases of the same major version are
//! run (and `agentry doctor` says they are newer than tested); anything else is refused
//! with a sentence naming the installed version, the range and how to install a supported
//! one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentry_domain::AgentType;

use crate::process::{HelperFailure, HelperOutput, helper_output};
use crate::sandbox::resolve_program;

/// How long `--version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a CLI's `--version` output quoted in a message.
const QUOTED_OUTPUT_CHARS: usize = 200;

/// A version `MAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch.
    pub patch: u64,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// The first `N.N.N` in `text` (`2.1.197 (Claude Code)`, `codex-cli 0.169.0`); a
    /// pre-release or build suffix after it is ignored.
    pub fn find(text: &str) -> Option<Version> {
        text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .find_map(|word| {
                let mut parts = word.split('.');
                let major = parts.next()?.parse().ok()?;
                let minor = parts.next()?.parse().ok()?;
                let patch = parts.next()?.parse().ok()?;
                Some(Version::new(major, minor, patch))
            })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The versions of one agent CLI that agentry runs: from [`Supported::tested`] up to (not
/// including) [`Supported::below`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supported {
    /// The CLI's name as a person knows it.
    pub name: &'static str,
    /// The version CI runs for real, and the lowest supported.
    pub tested: Version,
    /// The first version not supported (the next major release).
    pub below: Version,
    /// How to install the tested version for the service's user.
    pub install: &'static str,
    /// The configuration variable naming the executable.
    pub variable: &'static str,
}

impl Supported {
    /// Whether `version` is supported.
    pub fn contains(&self, version: Version) -> bool {
        self.tested <= version && version < self.below
    }

    /// The range as a person reads it: `>= 2.1.197, < 3.0.0`.
    pub fn range(&self) -> String {
        format!(">= {}, < {}", self.tested, self.below)
    }
}

/// The supported versions of `agent`'s CLI.
pub fn supported(agent: AgentType) -> Supported {
    match agent {
        AgentType::ClaudeCode => Supported {
            name: "Claude Code",
            tested: Version::new(2, 1, 197),
            below: Version::new(3, 0, 0),
            install: "npm install -g @anthropic-ai/claude-code@2.1.197",
            variable: "AGENTRY_CLAUDE_BIN",
        },
        AgentType::Codex => Supported {
            name: "Codex",
            tested: Version::new(0, 169, 0),
            below: Version::new(1, 0, 0),
            install: "npm install -g @openai/codex@0.169.0",
            variable: "AGENTRY_CODEX_BIN",
        },
    }
}

/// An agent CLI found and asked its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The executable, as found on `PATH` (or as configured).
    pub path: PathBuf,
    /// Its version.
    pub version: Version,
}

/// Why an agent CLI cannot run tasks; its `Display` is a sentence that names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliProblem {
    /// The executable is not there.
    #[error(
        "the {name} CLI was not found ({detail}): install it ({install}) or set {variable} \
         to its path"
    )]
    NotFound {
        /// The CLI's name.
        name: &'static str,
        /// What was looked for, and where.
        detail: String,
        /// How to install it.
        install: &'static str,
        /// Its configuration variable.
        variable: &'static str,
    },
    /// `--version` did not run or did not print a version.
    #[error(
        "the {name} CLI at {path} did not report its version ({detail}); reinstall it \
         ({install})"
    )]
    Broken {
        /// The CLI's name.
        name: &'static str,
        /// The executable.
        path: String,
        /// What happened.
        detail: String,
        /// How to install it.
        install: &'static str,
    },
    /// The version is outside the supported range.
    #[error(
        "the {name} CLI at {path} is version {version}, which agentry does not support \
         (supported: {range}): install a supported version ({install})"
    )]
    Unsupported {
        /// The CLI's name.
        name: &'static str,
        /// The executable.
        path: String,
        /// Its version.
        version: Version,
        /// The supported range.
        range: String,
        /// How to install it.
        install: &'static str,
    },
}

/// Finds `program` (a path, or a name on the `PATH` of `env`), runs `program --version` with
/// exactly `env` (in the directory `home`, which is also its `HOME`), and checks the version
/// against [`supported`]`(agent)`.
///
/// # Errors
///
/// A [`CliProblem`] saying what is wrong and how to fix it.
pub async fn check(
    agent: AgentType,
    program: &Path,
    env: &[(String, String)],
) -> Result<Found, CliProblem> {
    let supported = supported(agent);
    let path = resolve_program(program, env).map_err(|detail| CliProblem::NotFound {
        name: supported.name,
        detail,
        install: supported.install,
        variable: supported.variable,
    })?;
    if !path.is_file() {
        return Err(CliProblem::NotFound {
            name: supported.name,
            detail: format!("{} does not exist", path.display()),
            install: supported.install,
            variable: supported.variable,
        });
    }
    let broken = |detail: String| CliProblem::Broken {
        name: supported.name,
        path: path.display().to_string(),
        detail,
        install: supported.install,
    };
    let output = version_output(&path, env).await.map_err(broken)?;
    let version = Version::find(&output).ok_or_else(|| {
        let quoted = agentry_domain::quote::excerpt(output.trim(), QUOTED_OUTPUT_CHARS);
        broken(format!("it printed {quoted:?}"))
    })?;
    if !supported.contains(version) {
        return Err(CliProblem::Unsupported {
            name: supported.name,
            path: path.display().to_string(),
            version,
            range: supported.range(),
            install: supported.install,
        });
    }
    Ok(Found { path, version })
}

/// What `path --version` prints (stdout, then stderr), run with exactly `env`.
async fn version_output(path: &Path, env: &[(String, String)]) -> Result<String, String> {
    let mut command = tokio::process::Command::new(path);
    command
        .arg("--version")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let HelperOutput {
        status,
        stdout: out,
        stderr: err,
    } = helper_output(&mut command, VERSION_TIMEOUT)
        .await
        .map_err(|failure| match failure {
            HelperFailure::TimedOut(limit) => {
                format!("`--version` did not finish within {} s", limit.as_secs())
            }
            HelperFailure::Start(_) => failure.to_string(),
        })?;
    let status = status.map_err(|e| format!("waiting for it: {e}"))?;
    if !status.success() && Version::find(&out).is_none() {
        let quoted: String = format!("{out}{err}")
            .trim()
            .chars()
            .take(QUOTED_OUTPUT_CHARS)
            .collect();
        return Err(format!("`--version` failed ({status}): {quoted:?}"));
    }
    Ok(format!("{out}\n{err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_in_what_the_clis_print() {
        for (printed, version) in [
            ("2.1.197 (Claude Code)", (2, 1, 197)),
            ("codex-cli 0.169.0", (0, 169, 0)),
            ("codex-cli 0.170.0-alpha.3", (0, 170, 0)),
            ("v1.2 then 3.4.5", (3, 4, 5)),
        ] {
            let (major, minor, patch) = version;
            let expected = Version::new(major, minor, patch);
            assert_eq!(Version::find(printed), Some(expected), "{printed}");
        }
        assert_eq!(Version::find("no version"), None);
        assert_eq!(Version::new(0, 169, 0).to_string(), "0.169.0");
    }

    #[test]
    fn ranges_start_at_the_tested_version() {
        let claude = supported(AgentType::ClaudeCode);
        assert!(claude.contains(Version::new(2, 1, 197)));
        assert!(claude.contains(Version::new(2, 1, 332)));
        assert!(claude.contains(Version::new(2, 9, 0)));
        assert!(!claude.contains(Version::new(2, 1, 196)));
        assert!(!claude.contains(Version::new(2, 0, 37)));
        assert!(!claude.contains(Version::new(3, 0, 0)));
        assert_eq!(claude.range(), ">= 2.1.197, < 3.0.0");
        let codex = supported(AgentType::Codex);
        assert!(codex.contains(Version::new(0, 169, 0)));
        assert!(!codex.contains(Version::new(0, 46, 0)));
        assert!(!codex.contains(Version::new(1, 0, 0)));
    }
}
