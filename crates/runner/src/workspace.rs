//! Git workspaces for agent runs (SPEC §6.1), with the real `git` executable.
//!
//! Layout under the root directory:
//!
//! ```text
//! mirrors/<repo key>.git   one bare clone per repository, fetched before each run
//! worktrees/<task id>      the worktree of a task's run, removed afterwards
//! git-home/                HOME of every git process (empty; git reads no user config)
//! ```
//!
//! A coding task's worktree is on a new branch `agentry/task-<first 8 hex of the task id>`
//! made from the remote default branch; a review task's is a detached checkout of the pull
//! request's branch. The mirror fetches `+refs/heads/*:refs/remotes/origin/*` (not a mirror
//! refspec, which would prune the task branches of concurrent runs), and every operation on
//! one mirror is serialised by an in-process lock.
//!
//! **The token never touches the disk or a command line.** It reaches git only through the
//! environment of the git processes that talk to the remote, as
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0=http.extraHeader`/`GIT_CONFIG_VALUE_0`; the remote
//! URL stored in the mirror is the plain clone URL, and the agent's environment has none of
//! it. Git runs with `env_clear()`, no system or global configuration, and no prompts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::process::Command;
use uuid::Uuid;

/// Time limit of git commands that talk to the remote (clone, fetch, push).
const REMOTE_TIMEOUT: Duration = Duration::from_secs(600);
/// Time limit of local git commands.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// The most characters of git's stderr quoted in an error.
const MAX_STDERR_CHARS: usize = 2000;

/// The branch of a coding task: `agentry/task-<first 8 hex of the task id>`.
pub fn branch_name(task_id: Uuid) -> String {
    let simple = task_id.simple().to_string();
    format!("agentry/task-{}", &simple[..8])
}

/// How git authenticates to the remote. Its `Debug` never shows the token.
#[derive(Clone, Default)]
pub struct GitAuth {
    header: Option<String>,
}

impl std::fmt::Debug for GitAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuth")
            .field("token", &self.header.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl GitAuth {
    /// No authentication (public or local repositories).
    pub fn none() -> Self {
        GitAuth { header: None }
    }

    /// GitHub over https: `Authorization: Basic base64("x-access-token:" + token)`.
    pub fn token(token: &str) -> Self {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
        GitAuth {
            header: Some(format!("Authorization: Basic {basic}")),
        }
    }

    /// The environment that hands the header to one git process.
    fn env(&self) -> Vec<(&'static str, String)> {
        match &self.header {
            None => Vec::new(),
            Some(header) => vec![
                ("GIT_CONFIG_COUNT", "1".to_owned()),
                ("GIT_CONFIG_KEY_0", "http.extraHeader".to_owned()),
                ("GIT_CONFIG_VALUE_0", header.clone()),
            ],
        }
    }
}

/// The repository a run works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoSpec {
    /// A stable key naming the mirror directory (a repository id): letters, digits, `-`
    /// and `_` only.
    pub key: String,
    /// Where to clone from: an https URL, or a local path or `file://` URL.
    pub clone_url: String,
    /// The branch new task branches start from.
    pub default_branch: String,
}

/// Why a git operation failed. Never contains the token.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The repository key cannot name a directory.
    #[error("invalid repository key {0:?}: only letters, digits, '-' and '_' are allowed")]
    InvalidKey(String),
    /// A branch name git would refuse or misread.
    #[error("invalid branch name {0:?}")]
    InvalidBranch(String),
    /// A git command failed.
    #[error("`git {command}` failed: {stderr}")]
    Command {
        /// The command (subcommand and arguments).
        command: String,
        /// Git's stderr (trimmed and shortened).
        stderr: String,
    },
    /// A git command ran past its time limit and was killed.
    #[error("`git {command}` did not finish within {secs} s")]
    Timeout {
        /// The command.
        command: String,
        /// The limit.
        secs: u64,
    },
    /// Git could not be started, or a file operation failed.
    #[error("{0}")]
    Io(String),
}

/// One directory holding a bare mirror per repository and a worktree per task.
#[derive(Debug)]
pub struct Workspaces {
    root: PathBuf,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

/// A task's checked-out worktree.
#[derive(Debug)]
pub struct Worktree {
    git: Git,
    mirror: PathBuf,
    path: PathBuf,
    branch: Option<String>,
    base_commit: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Workspaces {
    /// Workspaces under `root` (created on first use).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Workspaces {
            root: root.into(),
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn lock_of(&self, mirror: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(mirror.to_owned()).or_default().clone()
    }

    fn git(&self) -> Git {
        Git {
            home: self.root.join("git-home"),
        }
    }

    /// A coding task's worktree on a fresh `agentry/task-…` branch from the remote default
    /// branch (reset if a previous attempt left the branch).
    pub async fn prepare_coding(
        &self,
        repo: &RepoSpec,
        task_id: Uuid,
        auth: &GitAuth,
    ) -> Result<Worktree, GitError> {
        let branch = branch_name(task_id);
        let start = format!(
            "refs/remotes/origin/{}",
            valid_branch(&repo.default_branch)?
        );
        self.prepare(repo, task_id, auth, Some(branch), &start)
            .await
    }

    /// A review task's detached worktree at the pull request's branch `branch`.
    pub async fn prepare_review(
        &self,
        repo: &RepoSpec,
        task_id: Uuid,
        branch: &str,
        auth: &GitAuth,
    ) -> Result<Worktree, GitError> {
        let start = format!("refs/remotes/origin/{}", valid_branch(branch)?);
        self.prepare(repo, task_id, auth, None, &start).await
    }

    async fn prepare(
        &self,
        repo: &RepoSpec,
        task_id: Uuid,
        auth: &GitAuth,
        branch: Option<String>,
        start: &str,
    ) -> Result<Worktree, GitError> {
        if repo.key.is_empty()
            || !repo
                .key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(GitError::InvalidKey(repo.key.clone()));
        }
        let git = self.git();
        for dir in [
            &git.home,
            &self.root.join("mirrors"),
            &self.root.join("worktrees"),
        ] {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| GitError::Io(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mirror = self.root.join("mirrors").join(format!("{}.git", repo.key));
        let path = self.root.join("worktrees").join(task_id.to_string());
        let lock = self.lock_of(&mirror);
        let _held = lock.lock().await;
        if !mirror.join("HEAD").exists() {
            // A half-made clone of a crashed run is started over.
            let _ = tokio::fs::remove_dir_all(&mirror).await;
            git.run(
                &self.root,
                &["init", "--bare", "--quiet", path_str(&mirror)?],
                &GitAuth::none(),
                LOCAL_TIMEOUT,
            )
            .await?;
            git.run(
                &mirror,
                &["remote", "add", "origin", &repo.clone_url],
                &GitAuth::none(),
                LOCAL_TIMEOUT,
            )
            .await?;
        } else {
            git.run(
                &mirror,
                &["remote", "set-url", "origin", &repo.clone_url],
                &GitAuth::none(),
                LOCAL_TIMEOUT,
            )
            .await?;
        }
        git.run(
            &mirror,
            &[
                "fetch",
                "--prune",
                "--quiet",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
            ],
            auth,
            REMOTE_TIMEOUT,
        )
        .await?;
        // What a crashed earlier attempt of this task left behind.
        if path.exists() {
            let _ = git
                .run(
                    &mirror,
                    &["worktree", "remove", "--force", path_str(&path)?],
                    &GitAuth::none(),
                    LOCAL_TIMEOUT,
                )
                .await;
            let _ = tokio::fs::remove_dir_all(&path).await;
        }
        git.run(
            &mirror,
            &["worktree", "prune"],
            &GitAuth::none(),
            LOCAL_TIMEOUT,
        )
        .await?;
        let mut add: Vec<&str> = vec!["worktree", "add", "--quiet"];
        match &branch {
            Some(b) => {
                add.push("-B");
                add.push(b);
            }
            None => add.push("--detach"),
        }
        add.push(path_str(&path)?);
        add.push(start);
        git.run(&mirror, &add, &GitAuth::none(), LOCAL_TIMEOUT)
            .await?;
        let base_commit = git
            .run(
                &path,
                &["rev-parse", "HEAD"],
                &GitAuth::none(),
                LOCAL_TIMEOUT,
            )
            .await?
            .trim()
            .to_owned();
        drop(_held);
        Ok(Worktree {
            git,
            mirror,
            path,
            branch,
            base_commit,
            lock,
        })
    }
}

impl Worktree {
    /// The worktree's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its branch; `None` for a review's detached checkout.
    pub fn branch(&self) -> Option<&str> {
        self.branch.as_deref()
    }

    /// The commit it started at.
    pub fn base_commit(&self) -> &str {
        &self.base_commit
    }

    /// Stages everything and commits it as `agentry <agentry@localhost>` with `message`.
    /// `None` when there is nothing to publish (no change and no commit of the agent's own);
    /// otherwise the head commit.
    pub async fn commit_all(&self, message: &str) -> Result<Option<String>, GitError> {
        let none = GitAuth::none();
        self.git
            .run(&self.path, &["add", "--all"], &none, LOCAL_TIMEOUT)
            .await?;
        let staged = self
            .git
            .run(
                &self.path,
                &["diff", "--cached", "--name-only"],
                &none,
                LOCAL_TIMEOUT,
            )
            .await?;
        if !staged.trim().is_empty() {
            self.git
                .run(
                    &self.path,
                    &["commit", "--quiet", "--no-verify", "-m", message],
                    &none,
                    LOCAL_TIMEOUT,
                )
                .await?;
        }
        let head = self
            .git
            .run(&self.path, &["rev-parse", "HEAD"], &none, LOCAL_TIMEOUT)
            .await?
            .trim()
            .to_owned();
        Ok((head != self.base_commit).then_some(head))
    }

    /// Pushes the worktree's head to its branch on the remote (forced: a retry of the same
    /// task reuses its branch).
    pub async fn push(&self, auth: &GitAuth) -> Result<(), GitError> {
        let branch = self
            .branch
            .as_deref()
            .ok_or_else(|| GitError::InvalidBranch("(detached review checkout)".into()))?;
        let refspec = format!("+HEAD:refs/heads/{branch}");
        self.git
            .run(
                &self.path,
                &["push", "--quiet", "origin", &refspec],
                auth,
                REMOTE_TIMEOUT,
            )
            .await
            .map(drop)
    }

    /// Removes the worktree and its local branch. Idempotent.
    pub async fn remove(self) -> Result<(), GitError> {
        let _held = self.lock.lock().await;
        let none = GitAuth::none();
        let removed = self
            .git
            .run(
                &self.mirror,
                &["worktree", "remove", "--force", path_str(&self.path)?],
                &none,
                LOCAL_TIMEOUT,
            )
            .await;
        if removed.is_err() {
            let _ = tokio::fs::remove_dir_all(&self.path).await;
        }
        self.git
            .run(&self.mirror, &["worktree", "prune"], &none, LOCAL_TIMEOUT)
            .await?;
        if let Some(branch) = &self.branch {
            let exists = self
                .git
                .run(
                    &self.mirror,
                    &["branch", "--list", branch],
                    &none,
                    LOCAL_TIMEOUT,
                )
                .await?;
            if !exists.trim().is_empty() {
                self.git
                    .run(
                        &self.mirror,
                        &["branch", "-D", branch],
                        &none,
                        LOCAL_TIMEOUT,
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

/// Runs git with a clean environment.
#[derive(Debug, Clone)]
struct Git {
    home: PathBuf,
}

impl Git {
    async fn run(
        &self,
        cwd: &Path,
        args: &[&str],
        auth: &GitAuth,
        limit: Duration,
    ) -> Result<String, GitError> {
        let shown = args.join(" ");
        let mut command = Command::new("git");
        command
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", &self.home)
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GCM_INTERACTIVE", "never")
            .env("GIT_AUTHOR_NAME", "agentry")
            .env("GIT_AUTHOR_EMAIL", "agentry@localhost")
            .env("GIT_COMMITTER_NAME", "agentry")
            .env("GIT_COMMITTER_EMAIL", "agentry@localhost")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in auth.env() {
            command.env(name, value);
        }
        let child = command
            .spawn()
            .map_err(|e| GitError::Io(format!("cannot run git: {e}")))?;
        let output = match tokio::time::timeout(limit, child.wait_with_output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(GitError::Io(format!("`git {shown}`: {e}"))),
            Err(_) => {
                return Err(GitError::Timeout {
                    command: shown,
                    secs: limit.as_secs(),
                });
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stderr = stderr.trim();
            let mut shortened: String = stderr.chars().take(MAX_STDERR_CHARS).collect();
            if shortened.len() < stderr.len() {
                shortened.push('…');
            }
            if shortened.is_empty() {
                shortened = format!("exit status {}", output.status);
            }
            return Err(GitError::Command {
                command: shown,
                stderr: shortened,
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

fn path_str(path: &Path) -> Result<&str, GitError> {
    path.to_str()
        .ok_or_else(|| GitError::Io(format!("path is not UTF-8: {}", path.display())))
}

/// A branch name safe to put after `refs/remotes/origin/` on a git command line.
fn valid_branch(branch: &str) -> Result<&str, GitError> {
    let ok = !branch.is_empty()
        && !branch.starts_with('-')
        && !branch.starts_with('/')
        && !branch.contains("..")
        && !branch
            .chars()
            .any(|c| c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\'));
    if ok {
        Ok(branch)
    } else {
        Err(GitError::InvalidBranch(branch.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn branch_names_and_auth_debug() {
        let id = Uuid::parse_str("3F2504E0-4F89-11D3-9A0C-0305E82C3301").unwrap();
        assert_eq!(branch_name(id), "agentry/task-3f2504e0");
        let auth = GitAuth::token("s3cret");
        assert!(!format!("{auth:?}").contains("s3cret"));
        let header = &auth.env()[2].1;
        assert_eq!(
            header,
            &format!(
                "Authorization: Basic {}",
                base64::engine::general_purpose::STANDARD.encode("x-access-token:s3cret")
            )
        );
        assert!(GitAuth::none().env().is_empty());
    }

    #[test]
    fn dangerous_branch_names_are_refused() {
        for bad in ["", "-x", "a..b", "a b", "a:b", "/a", "a\nb"] {
            assert!(valid_branch(bad).is_err(), "{bad:?}");
        }
        assert!(valid_branch("agentry/task-12345678").is_ok());
    }
}
