//! Git workspaces for agent runs (docs/contract.md#61-runner), with the real `git` executable.
//!
//! Layout under the root directory:
//!
//! ```text
//! mirrors/<repo key>.git   one bare clone per repository, fetched before each run
//! worktrees/<task id>      the worktree of a task's run, removed afterwards
//! indexes/<task id>/index  the index of a task's commit, made after the agent
//! git-home/                HOME of every git process (empty; git reads no user config)
//! ```
//!
//! A coding task's worktree is on a new branch `agentry/task-<task id as 32 hex digits>`
//! made from the remote default branch; a review task's is a detached checkout of the pull
//! request's branch. The mirror fetches `+refs/heads/*:refs/remotes/origin/*` from the clone
//! URL (not a mirror refspec, which would prune the task branches of concurrent runs), and
//! every operation on one mirror is serialised by an in-process lock.
//!
//! **The token never touches the disk or a command line.** It reaches git only through the
//! environment of the git processes that talk to the remote, as
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0=http.<clone URL>.extraHeader`/`GIT_CONFIG_VALUE_0`,
//! so git sends it only to URLs under the clone URL. The mirror's configuration names no
//! remote, and the agent's environment has none of it. Git runs with `env_clear()`, no
//! system or global configuration, and no prompts.
//!
//! **Nothing the agent can write is trusted.** The agent works in the worktree, whose `.git`
//! file leads to the mirror, so an agent can rewrite the `.git` file, the worktree's metadata
//! (`<mirror>/worktrees/<name>/`: `HEAD`, `index`, `commondir`, `config.worktree`) and, when
//! it is not sandboxed, the mirror itself (`config`, `hooks/`). Therefore:
//!
//! - The clone URL the code host reports is checked before any git command
//!   ([`validate_clone_url`]): `https://<the repository's host>/…` only; local paths only
//!   when the code host is on loopback (tests).
//! - Every git command names the mirror with `--git-dir` and runs from the workspace root
//!   or the worktree, so no `.git` is ever discovered. After the agent, nothing of the
//!   worktree's metadata is used: the commit is built with a fresh index of our own
//!   (`read-tree` of the base commit, `add --all`, `write-tree`, `commit-tree` with the base
//!   commit as parent), so a forged `HEAD`, `index` or `commondir` has no effect, and no
//!   porcelain command that runs hooks is involved.
//! - Before anything reads a file of the worktree after the agent, the worktree is walked
//!   (`lstat`, no symbolic link followed, bounded) and the run fails with
//!   [`GitError::NestedRepository`] if any entry below its root is named `.git` or a name
//!   git or a case-insensitive file system takes for it ([`is_git_name`]): git would run
//!   commands (e.g. `git status` in a submodule's directory during `add`) with that
//!   agent-written repository's configuration, filters included.
//! - The commit's index never holds a gitlink while `add --all` runs: the base's gitlinks
//!   are taken out before and put back as they were after, so submodules stay the base's.
//! - With sandboxed agents ([`Workspaces::with_git_sandbox`]), the steps that read what the
//!   agent wrote (`read-tree`, `update-index`, `add`, `write-tree`, `commit-tree`) run in a
//!   bubblewrap sandbox of their own, as confined as the agent was and without any network,
//!   as the agents' user: the worktree and the mirror read-only, only the task's own index
//!   directory writable (its `objects/` receives the new objects, which the service copies
//!   into the mirror; docs/security.md#git-after-the-agent). The steps that carry the token
//!   (`fetch`, `ls-remote`, `push`) never read the worktree: they work on the mirror alone.
//! - Before the commit and before the push, the worktree's `.git` must be exactly what
//!   `git worktree add` wrote, and the mirror's `config` exactly the fixed text agentry
//!   writes; otherwise the run fails with [`GitError::Tampered`] and nothing is committed
//!   or pushed. (The configuration is rewritten before every run, so a tampered mirror is
//!   repaired for the next one.) `config.worktree` is never read: the mirror's fixed
//!   configuration does not enable `extensions.worktreeConfig`.
//! - Every git process runs with `core.hooksPath=/dev/null`, `core.fsmonitor=false`,
//!   `credential.helper=` (none), `core.sshCommand=false`, `core.pager=cat`,
//!   `http.sslVerify=true` and `http.proxy=` (none) on its command line, which override
//!   the same keys of any repository configuration, and with
//!   `GIT_ALLOW_PROTOCOL` set to the one protocol of the validated clone URL, which
//!   overrides every `protocol.*` setting.
//! - The push goes from the mirror, by commit id, to the clone URL itself, never to a remote
//!   name: `git push --force-with-lease=refs/heads/<b>:<seen> <clone URL> <commit>:refs/heads/<b>`.
//!   The branch may only be replaced when it is absent or its head carries this task's
//!   `Agentry-Task: <id>` trailer (a retry of the same task); anything else is refused with
//!   [`GitError::BranchTaken`] and left as it is.
//!
//! What this cannot stop: an *unsandboxed* agent runs as the service's user and could
//! rewrite the mirror's configuration between the check and git reading it (or touch the
//! service's own files); the sandbox (docs/contract.md#65-agent-sandbox) closes that: it shows the agent the
//! mirror read-only, so what git files it can still write (the worktree's `.git` and its
//! own metadata entry) are never used after the agent.
//!
//! Objects are content: an agent that rewrites the mirror's refs or objects can change what
//! is pushed to its own task branch (which it can do anyway by editing files), but not where
//! it goes, with which credentials, or make git run a program.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use base64::Engine;
use command_fds::CommandFdExt;
use tokio::process::Command;
use uuid::Uuid;

use crate::process::PassedFd;
use crate::sandbox::Sandbox;
use crate::sandbox::git_jail::{GitJail, GitJailLayout, JailedCommand};

/// Time limit of git commands that talk to the remote (clone, fetch, push).
const REMOTE_TIMEOUT: Duration = Duration::from_secs(600);
/// Time limit of local git commands.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// The most characters of git's stderr quoted in an error.
const MAX_STDERR_CHARS: usize = 2000;
/// The most bytes of git's stdout kept; more is refused, not buffered. The longest the
/// runner reads is the base commit's whole tree listing (`ls-tree -r`, for its gitlinks):
/// some 100 bytes an entry, so about 200 MB for the largest worktree it accepts
/// ([`MAX_WORKTREE_ENTRIES`]).
const MAX_STDOUT_BYTES: usize = 512 * 1024 * 1024;
/// The bytes of git's stderr kept: its last ones, where the error is. The rest is read and
/// dropped, since the agent's files decide how much git prints (a warning per line of a
/// `.gitattributes`, per file of an `eol` rule…).
const STDERR_TAIL_BYTES: usize = 64 * 1024;
/// The whole configuration of every mirror. It names no remote: fetch and push name the
/// clone URL on their command line.
const MIRROR_CONFIG: &str =
    "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n";
/// The most bytes of the worktree's `.git` file read: `git worktree add` writes
/// `gitdir: <path>\n`, a few hundred bytes; anything longer is tampering.
const MAX_DOT_GIT_BYTES: u64 = 4096;
/// The most entries of a worktree walked for nested repositories before the run is refused.
const MAX_WORKTREE_ENTRIES: u64 = 2_000_000;
/// The deepest directory level of a worktree walked before the run is refused (one open
/// directory handle per level).
const MAX_WORKTREE_DEPTH: usize = 256;
/// The directory (in the workspace root) of the copies of worktrees' git metadata that
/// sandboxed agents write in ([`Worktree::agent_git_dir`]).
const AGENT_GIT_DIR: &str = "agent-git";
/// The gitlink mode of a tree entry (a submodule's commit).
const GITLINK_MODE: &str = "160000";
/// The trailer that marks a commit as made by a task.
const TASK_TRAILER: &str = "Agentry-Task";
/// Configuration given to every git process on its command line; it overrides the
/// repository's configuration (see the module docs).
const SAFE_CONFIG: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "credential.helper=",
    "core.sshCommand=false",
    "core.pager=cat",
    "http.sslVerify=true",
    "http.proxy=",
];

/// The branch of a coding task: `agentry/task-<the task id as 32 lower-case hex digits>`.
pub fn branch_name(task_id: Uuid) -> String {
    format!("agentry/task-{}", task_id.simple())
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

    /// The environment that hands the header to one git process, for requests to URLs
    /// under `url` only.
    fn env(&self, url: &str) -> Vec<(&'static str, String)> {
        match &self.header {
            None => Vec::new(),
            Some(header) => vec![
                ("GIT_CONFIG_COUNT", "1".to_owned()),
                ("GIT_CONFIG_KEY_0", format!("http.{url}.extraHeader")),
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
    /// Where to clone from, as the code host reports it; checked with
    /// [`validate_clone_url`] before any git command.
    pub clone_url: String,
    /// The branch new task branches start from.
    pub default_branch: String,
    /// The host (with a non-default port, if any) of the repository's normalised URL, e.g.
    /// `github.com`: the only host the clone URL may name.
    pub host: String,
    /// Whether a local clone URL (absolute path or `file://`, or `http://` on loopback) is
    /// accepted: only when the code host itself is on loopback (a local fake in tests).
    pub allow_local: bool,
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
    /// The branch to start from is not on the remote.
    #[error("the branch {0:?} does not exist on the remote")]
    MissingBranch(String),
    /// The clone URL the code host reported is not one agentry clones from.
    #[error("the clone URL {url:?} is refused: {reason}")]
    CloneUrlRefused {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The agent changed git metadata it must not touch; nothing was committed or pushed.
    #[error("the agent modified {0}; nothing was committed or pushed")]
    Tampered(String),
    /// The agent planted a git repository (a `.git`, or a name git or a case-insensitive
    /// file system treats as one) below the worktree's root; nothing was committed or
    /// pushed, and no git command ran on the worktree.
    #[error("the agent created a nested git repository at {0}; nothing was committed or pushed")]
    NestedRepository(String),
    /// The worktree could not be checked for nested repositories (too large, too deep or
    /// unreadable); nothing was committed or pushed.
    #[error("the worktree could not be checked ({0}); nothing was committed or pushed")]
    Unchecked(String),
    /// The remote branch exists and its head is not a commit of this task.
    #[error(
        "the branch {branch} already exists on the remote with a commit that is not this \
         task's ({commit}); it was left as it is and nothing was pushed"
    )]
    BranchTaken {
        /// The branch.
        branch: String,
        /// Its head on the remote.
        commit: String,
    },
    /// A patch of the agent's changes copies a file, which git would do without checking
    /// where the copy comes from; nothing was applied.
    #[error("the agent's patch copies a file ({0}); copies are refused and nothing was applied")]
    PatchCopies(String),
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

/// Refuses the patch in `file` if it has a copy in it: a `copy from` or `copy to` line, the only way a patch
/// sets git's copy flag, under which `git apply` reads the source path unchecked (`copy from
/// ../../../master.key` reads the service's key, outside the worktree). Every line is looked
/// at, not only headers: git reads a header line wherever a `diff --git` line precedes it,
/// and no line of a hunk (` `, `+`, `-`, `\`) or of a binary patch (base 85, no blank)
/// can start so, so nothing that is not a copy is refused.
fn refuse_copies_in(file: &Path) -> Result<(), GitError> {
    use std::io::BufRead;
    let io =
        |e: std::io::Error| GitError::Io(format!("cannot read the patch {}: {e}", file.display()));
    let mut reader = std::io::BufReader::new(std::fs::File::open(file).map_err(io)?);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(io)? == 0 {
            return Ok(());
        }
        if line.starts_with(b"copy from ") || line.starts_with(b"copy to ") {
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            return Err(GitError::PatchCopies(agentry_domain::quote::one_line(
                &agentry_domain::quote::excerpt(&String::from_utf8_lossy(line), 120),
            )));
        }
    }
}

/// Checks a clone URL reported by the code host before git ever sees it.
///
/// Accepted: `https://<repo_host>/<path>` with only letters, digits and `.`, `_`, `~`,
/// `-`, `/` in the path (no credentials, query, fragment, `.`/`..` segments or `%`), where
/// `repo_host` is the host of the repository's normalised URL (compared without case).
/// With `allow_local` (the code host is on loopback: tests against a local fake) also an
/// absolute local path, a `file:///…` URL, and `http://` to a loopback host. Never a
/// leading `-`, whitespace or control characters.
pub fn validate_clone_url(url: &str, repo_host: &str, allow_local: bool) -> Result<(), GitError> {
    clone_protocol(url, repo_host, allow_local).map(drop)
}

/// Whether `url` (e.g. the code host's API URL) is `http(s)://` to `localhost` or a
/// loopback address.
pub fn is_loopback_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    rest.is_some_and(|rest| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !authority.contains('@') && is_loopback_host(authority)
    })
}

/// Whether an authority (`host[:port]`) names `localhost` or a loopback address.
fn is_loopback_host(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The protocol git may use for a clone URL ([`validate_clone_url`]).
fn clone_protocol(url: &str, repo_host: &str, allow_local: bool) -> Result<&'static str, GitError> {
    let refuse = |reason: &str| GitError::CloneUrlRefused {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    if url.is_empty() {
        return Err(refuse("it is empty"));
    }
    if url.starts_with('-') {
        return Err(refuse("it starts with '-'"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refuse("it contains whitespace or control characters"));
    }
    let local_path = url.strip_prefix("file://").unwrap_or(url);
    if local_path.starts_with('/') {
        if !allow_local {
            return Err(refuse(
                "local repositories are only accepted when the code host is on loopback",
            ));
        }
        if local_path.split('/').any(|s| s == "..") {
            return Err(refuse("it has a '..' segment"));
        }
        return Ok("file");
    }
    let (protocol, rest) = if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest)
    } else {
        return Err(refuse("only https:// URLs are accepted"));
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err(refuse("it contains credentials"));
    }
    if protocol == "http" && !(allow_local && is_loopback_host(authority)) {
        return Err(refuse("only https:// URLs are accepted"));
    }
    if protocol == "https" && !authority.eq_ignore_ascii_case(repo_host) {
        return Err(refuse(&format!(
            "it is not on the repository's host {repo_host}"
        )));
    }
    let path_ok = path.len() > 1
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-' | b'/'))
        && !path.split('/').any(|s| s == "." || s == "..");
    if !path_ok {
        return Err(refuse(
            "its path must be letters, digits, '.', '_', '~', '-' and '/' without '.' or '..' \
             segments",
        ));
    }
    Ok(protocol)
}

/// One directory holding a bare mirror per repository and a worktree per task.
#[derive(Debug)]
pub struct Workspaces {
    root: PathBuf,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    /// Where the git steps after the agent run ([`Workspaces::with_git_sandbox`]).
    git_sandbox: Option<Arc<GitSandbox>>,
}

/// The sandbox of the git steps that read what the agent wrote (`read-tree`, `add`,
/// `write-tree`, `commit-tree`; docs/security.md#git-after-the-agent): the agents' own
/// settings. In [`crate::sandbox::SandboxMode::Off`] those steps run as plain processes.
#[derive(Debug, Clone)]
pub struct GitSandbox {
    /// The agents' sandbox (mode, `bwrap`, limits, extra read-only paths, seccomp).
    pub sandbox: Sandbox,
    /// The data directory, hidden in the sandbox but for the run's own paths.
    pub data_dir: PathBuf,
    /// The forwarder that sets the agents' rlimits (`agentry sandbox-net`), if any.
    pub forwarder: Option<Vec<String>>,
}

/// A task's checked-out worktree.
#[derive(Debug)]
pub struct Worktree {
    git: Git,
    /// The workspace root.
    root: PathBuf,
    task_id: Uuid,
    clone_url: String,
    mirror: PathBuf,
    path: PathBuf,
    /// The worktree's metadata directory in the mirror, as `git worktree add` made it.
    meta: PathBuf,
    /// The content of `<path>/.git` as `git worktree add` wrote it.
    dot_git: Vec<u8>,
    /// The directory of the task's own index (`indexes/<task id>`).
    index_dir: PathBuf,
    /// The index file in it.
    index: PathBuf,
    branch: Option<String>,
    base_commit: String,
    committed: Mutex<Option<String>>,
    lock: Arc<tokio::sync::Mutex<()>>,
    /// A revision's worktree: its push is a fast-forward of the branch, never a force.
    fast_forward: bool,
    git_sandbox: Option<Arc<GitSandbox>>,
}

/// What a task's worktree checks out ([`Workspaces::prepare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout<'a> {
    /// A coding task's fresh `agentry/task-…` branch ([`branch_name`]) from the remote
    /// default branch (reset if a previous attempt left the branch).
    NewBranch,
    /// A revision's: the pull request's branch, at its head on the remote; the agent's
    /// commit goes on top and [`Worktree::push`] pushes it as a fast-forward only.
    Branch(&'a str),
    /// A review's: the pull request's branch at its head on the remote, detached.
    Detached(&'a str),
}

impl Workspaces {
    /// Workspaces under `root` (created on first use).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Workspaces {
            root: root.into(),
            locks: Mutex::new(HashMap::new()),
            git_sandbox: None,
        }
    }

    /// These workspaces with the git steps after the agent run in a sandbox like the
    /// agent's ([`GitSandbox`]), when its mode sandboxes agents.
    pub fn with_git_sandbox(self, git_sandbox: GitSandbox) -> Self {
        Workspaces {
            git_sandbox: Some(Arc::new(git_sandbox)),
            ..self
        }
    }

    fn lock_of(&self, mirror: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock();
        locks.entry(mirror.to_owned()).or_default().clone()
    }

    /// A task's worktree of `repo`, checked out as `checkout` says.
    pub async fn prepare(
        &self,
        repo: &RepoSpec,
        task_id: Uuid,
        checkout: Checkout<'_>,
        auth: &GitAuth,
    ) -> Result<Worktree, GitError> {
        // The local branch, if any, and the remote branch it starts from.
        let (branch, from) = match checkout {
            Checkout::NewBranch => (Some(branch_name(task_id)), repo.default_branch.as_str()),
            Checkout::Branch(branch) => (Some(branch.to_owned()), branch),
            Checkout::Detached(branch) => (None, branch),
        };
        let start = format!("refs/remotes/origin/{}", valid_branch(from)?);
        if repo.key.is_empty()
            || !repo
                .key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(GitError::InvalidKey(repo.key.clone()));
        }
        let protocol = clone_protocol(&repo.clone_url, &repo.host, repo.allow_local)?;
        let git = Git {
            home: self.root.join("git-home"),
            protocol,
        };
        // Passages for the agents' user to its worktree, its mirror and its index; git's
        // HOME the service's alone (docs/security.md#the-agents-user).
        let (root, home) = (self.root.clone(), git.home.clone());
        tokio::task::spawn_blocking(move || {
            let parent = root.parent().unwrap_or(Path::new("/"));
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            for dir in ["mirrors", "worktrees", "indexes", AGENT_GIT_DIR] {
                crate::user::passage(parent, &root.join(dir))?;
            }
            std::fs::create_dir_all(&home)
                .map_err(|e| format!("cannot create {}: {e}", home.display()))?;
            crate::user::private(&home)
        })
        .await
        .map_err(|e| GitError::Io(e.to_string()))?
        .map_err(GitError::Io)?;
        let mirror = self.root.join("mirrors").join(format!("{}.git", repo.key));
        let path = self.root.join("worktrees").join(task_id.to_string());
        let index_dir = self.root.join("indexes").join(task_id.to_string());
        let index = index_dir.join("index");
        let lock = self.lock_of(&mirror);
        let _held = lock.lock().await;
        if !mirror.join("HEAD").exists() {
            // A half-made clone of a crashed run is started over.
            let _ = tokio::fs::remove_dir_all(&mirror).await;
            git.run(
                &self.root,
                &["init", "--bare", "--quiet", path_str(&mirror)?],
                &[],
                LOCAL_TIMEOUT,
            )
            .await?;
        }
        // Whatever an earlier agent may have written there is replaced.
        write_mirror_config(&mirror).await?;
        // What a crashed earlier attempt of this task left behind, before git lists the
        // mirror's worktrees.
        remove_path(&path).await?;
        remove_path(&index_dir).await?;
        remove_path(&mirror.join("worktrees").join(task_id.to_string())).await?;
        remove_path(&agent_git_path(&self.root, task_id)).await?;
        let url = repo.clone_url.as_str();
        git.run(
            &self.root,
            &[
                &git_dir_arg(&mirror)?,
                "fetch",
                "--prune",
                "--quiet",
                "--no-write-fetch-head",
                url,
                "+refs/heads/*:refs/remotes/origin/*",
            ],
            &auth.env(url),
            REMOTE_TIMEOUT,
        )
        .await?;
        let git_dir = git_dir_arg(&mirror)?;
        git.run(
            &self.root,
            &[&git_dir, "worktree", "prune"],
            &[],
            LOCAL_TIMEOUT,
        )
        .await?;
        let base_commit = git
            .run(
                &self.root,
                &[
                    &git_dir,
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("{start}^{{commit}}"),
                ],
                &[],
                LOCAL_TIMEOUT,
            )
            .await
            .map_err(|_| {
                GitError::MissingBranch(start.trim_start_matches("refs/remotes/origin/").to_owned())
            })?
            .trim()
            .to_owned();
        let mut add: Vec<&str> = vec![&git_dir, "worktree", "add", "--quiet"];
        match &branch {
            Some(b) => {
                add.push("-B");
                add.push(b);
            }
            None => add.push("--detach"),
        }
        add.push(path_str(&path)?);
        add.push(&base_commit);
        git.run(&self.root, &add, &[], LOCAL_TIMEOUT).await?;
        // Every run's git metadata lies there: passed through to the run's own, not listed.
        crate::user::passage(&mirror, &mirror.join("worktrees")).map_err(GitError::Io)?;
        let dot_git = read_small_async(&path.join(".git"), MAX_DOT_GIT_BYTES)
            .await
            .ok_or_else(|| {
                GitError::Io("cannot read the worktree's .git (a small regular file)".into())
            })?;
        let meta = worktree_meta(&mirror, &dot_git)?;
        drop(_held);
        Ok(Worktree {
            git,
            root: self.root.clone(),
            task_id,
            clone_url: repo.clone_url.clone(),
            mirror,
            path,
            meta,
            dot_git,
            index_dir,
            index,
            branch,
            base_commit,
            committed: Mutex::new(None),
            lock,
            fast_forward: matches!(checkout, Checkout::Branch(_)),
            git_sandbox: self.git_sandbox.clone(),
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

    /// Gives the worktree and its git metadata entry (and the agent's copy of it, if made:
    /// [`Worktree::agent_git_dir`]) to the user `uid`:`gid` the agent runs as (see
    /// [`crate::user`]), so it can write there and git trusts the repository.
    ///
    /// # Errors
    ///
    /// An entry that cannot be changed.
    pub async fn give_to(&self, uid: u32, gid: u32) -> Result<(), GitError> {
        self.chown(uid, gid).await
    }

    /// A fresh copy of the worktree's git metadata (`HEAD`, `index`, `commondir`…) for a
    /// sandboxed coding agent to write in, outside the mirror (`agent-git/<task>`): the
    /// sandbox shows it at the metadata's own path, so git works in the worktree as before,
    /// while the mirror's `worktrees/` keeps what `git worktree add` wrote. Every git
    /// command on the mirror, this task's and those of concurrent tasks on the repository,
    /// reads the entries there (`gitdir`, `HEAD`): an agent that could replace them with a
    /// FIFO or a link to `/dev/zero` made those commands wait for good or fill memory.
    /// Nothing reads the copy after the agent; [`Worktree::drop_agent_git_dir`] removes it.
    ///
    /// # Errors
    ///
    /// The copy cannot be made.
    pub async fn agent_git_dir(&self) -> Result<PathBuf, GitError> {
        let to = self.agent_git_path();
        remove_path(&to).await?;
        let (root, from, copy) = (self.root.clone(), self.meta.clone(), to.clone());
        tokio::task::spawn_blocking(move || {
            crate::user::passage(&root, &root.join(AGENT_GIT_DIR))?;
            copy_tree(&from, &copy)
        })
        .await
        .map_err(|e| GitError::Io(format!("the copy of the git metadata failed: {e}")))?
        .map_err(GitError::Io)?;
        Ok(to)
    }

    /// Removes the agent's copy of the worktree's git metadata, if any, once the agent has
    /// ended (it is never read).
    ///
    /// # Errors
    ///
    /// It cannot be removed.
    pub async fn drop_agent_git_dir(&self) -> Result<(), GitError> {
        remove_path(&self.agent_git_path()).await
    }

    fn agent_git_path(&self) -> PathBuf {
        agent_git_path(&self.root, self.task_id)
    }

    /// Takes the worktree and its metadata entry back for the service's own user once the
    /// agent has ended, before anything of it is read for the commit (a file the agent
    /// made readable to itself alone is then readable to the git steps).
    ///
    /// # Errors
    ///
    /// An entry that cannot be changed.
    pub async fn take_back(&self) -> Result<(), GitError> {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let Some(jailed) = self.jail_user() else {
            return self.chown(uid, gid).await;
        };
        // The git steps run as the agents' user: the worktree is the service's, readable by
        // that user's group (nothing of it writable but by the service).
        let (path, meta, group) = (self.path.clone(), self.meta.clone(), jailed.gid);
        tokio::task::spawn_blocking(move || {
            crate::user::chown_tree(&meta, uid, gid)?;
            crate::user::share_tree(&path, uid, group)
        })
        .await
        .map_err(|e| GitError::Io(format!("the change of owner failed: {e}")))?
        .map_err(GitError::Io)
    }

    /// The user the git steps after the agent run as, if not the service's: the agents'
    /// user of a root service, when those steps are sandboxed.
    fn jail_user(&self) -> Option<&crate::user::UserIds> {
        let settings = self.git_sandbox.as_ref()?;
        if settings.sandbox.mode() != crate::sandbox::SandboxMode::Auto {
            return None;
        }
        settings.sandbox.agent_user().ids()
    }

    async fn chown(&self, uid: u32, gid: u32) -> Result<(), GitError> {
        let paths = [self.path.clone(), self.meta.clone(), self.agent_git_path()];
        tokio::task::spawn_blocking(move || {
            paths
                .iter()
                .filter(|path| path.symlink_metadata().is_ok())
                .try_for_each(|path| crate::user::chown_tree(path, uid, gid))
        })
        .await
        .map_err(|e| GitError::Io(format!("the change of owner failed: {e}")))?
        .map_err(GitError::Io)
    }

    /// What the base commit changes against the remote branch `base` (a revision's pull
    /// request so far): `git diff --stat` of `origin/<base>...<base commit>`, read from the
    /// mirror's objects only (nothing the agent can write), at most `max_chars` long.
    pub async fn diff_summary(&self, base: &str, max_chars: usize) -> Result<String, GitError> {
        let range = format!(
            "refs/remotes/origin/{}...{}",
            valid_branch(base)?,
            self.base_commit
        );
        let stat = self
            .mirror_git(&["diff", "--no-ext-diff", "--no-color", "--stat=100", &range])
            .await?;
        let mut stat = stat.trim_end().to_owned();
        if stat.chars().count() > max_chars {
            stat = stat.chars().take(max_chars).collect::<String>() + "\n…";
        }
        Ok(stat)
    }

    /// Writes to `out` a git bundle of the mirror's `refs/remotes/origin/<branch>` for each
    /// of `branches` (the default branch, and the pull request's): the history a repository
    /// elsewhere (a Kubernetes pod) needs for this worktree's base commit and `git diff
    /// origin/<base>...HEAD`.
    pub async fn history_bundle(&self, out: &Path, branches: &[&str]) -> Result<(), GitError> {
        let git_dir = git_dir_arg(&self.mirror)?;
        let refs: Vec<String> = branches
            .iter()
            .map(|b| format!("refs/remotes/origin/{b}"))
            .collect();
        let mut args = vec![
            git_dir.as_str(),
            "bundle",
            "create",
            "--quiet",
            path_str(out)?,
        ];
        args.extend(refs.iter().map(String::as_str));
        self.git
            .run(&self.mirror, &args, &[], LOCAL_TIMEOUT)
            .await
            .map(drop)
    }

    /// Applies `patch` (a `git diff --binary` of the agent's changes made elsewhere, such as
    /// in a Kubernetes pod) to the worktree's files, with git's own checks: no path outside
    /// the worktree, none under `.git`, nothing written through a symbolic link. A patch that
    /// copies a file is refused before git sees it: git checks every path a patch writes,
    /// deletes or renames, but not the source of a copy (`copy from`), which could name any
    /// file the service can read, outside the worktree too (docs/security.md). The patch is
    /// kept in a file of the service's alone next to the worktree while git reads it. The
    /// index is left alone; [`Worktree::commit_all`] then commits the result as it does the
    /// changes of a local agent, with the same checks.
    pub async fn apply_patch(&self, patch: Vec<u8>) -> Result<(), GitError> {
        let name = self.path.file_name().map_or_else(
            || self.task_id.to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let dir = self.path.parent().unwrap_or(&self.root);
        let file = dir.join(format!(".{name}.patch"));
        // Removed on every way out, an error or a cancel included.
        let _kept = RemovedOnDrop(file.clone());
        let written = file.clone();
        tokio::task::spawn_blocking(move || {
            crate::user::private_file(&written)
                .and_then(|mut f| std::io::Write::write_all(&mut f, &patch))
                .map_err(|e| {
                    GitError::Io(format!("cannot keep the patch {}: {e}", written.display()))
                })
        })
        .await
        .map_err(|e| GitError::Io(format!("the patch check stopped: {e}")))??;
        self.apply_patch_file(&file).await
    }

    /// [`Worktree::apply_patch`] of the patch in `file`, a file of the service's alone (never
    /// one the agent can write), read as it is applied rather than held in memory.
    pub async fn apply_patch_file(&self, file: &Path) -> Result<(), GitError> {
        let git_dir = git_dir_arg(&self.mirror)?;
        let work_tree = format!("--work-tree={}", path_str(&self.path)?);
        let patch_file = path_str(file)?.to_owned();
        let checked = file.to_owned();
        tokio::task::spawn_blocking(move || refuse_copies_in(&checked))
            .await
            .map_err(|e| GitError::Io(format!("the patch check stopped: {e}")))??;
        let args = [
            git_dir.as_str(),
            work_tree.as_str(),
            "apply",
            "--binary",
            "--whitespace=nowarn",
            "--",
            patch_file.as_str(),
        ];
        self.git
            .run(&self.path, &args, &[], LOCAL_TIMEOUT)
            .await
            .map(drop)
    }

    /// Commits the whole worktree as one commit on top of the base commit, as
    /// `agentry <agentry@localhost>`, with `message` and an `Agentry-Task: <task id>`
    /// trailer. Commits the agent made itself are folded into it. `None` when the tree is
    /// the base commit's (nothing to publish); otherwise the new commit.
    ///
    /// Fails with [`GitError::Tampered`] when the worktree's `.git` or the mirror's
    /// configuration changed since the worktree was made.
    pub async fn commit_all(&self, message: &str) -> Result<Option<String>, GitError> {
        // First of all, before anything (git included) reads a file the agent wrote.
        self.check_no_nested_repository().await?;
        self.check_untampered().await?;
        remove_path(&self.index_dir).await?;
        tokio::fs::create_dir_all(&self.index_dir)
            .await
            .map_err(|e| {
                GitError::Io(format!("cannot create {}: {e}", self.index_dir.display()))
            })?;
        crate::user::private(&self.index_dir).map_err(GitError::Io)?;
        let jail = self.git_jail().await?;
        let jail = jail.as_ref();
        if jail.is_some() {
            // The jail writes its objects here, as the user it runs as; the mirror is
            // read-only to it.
            let objects = self.index_dir.join("objects");
            tokio::fs::create_dir(&objects)
                .await
                .map_err(|e| GitError::Io(format!("cannot create {}: {e}", objects.display())))?;
            if let Some(user) = self.jail_user() {
                crate::user::chown_tree(&self.index_dir, user.uid, user.gid)
                    .map_err(GitError::Io)?;
            }
        }
        let result = async {
            self.with_index(jail, &["read-tree", &self.base_commit], &self.mirror)
                .await?;
            // Submodules are the base's, whatever the agent did: `add` never sees a gitlink
            // (so it never runs git inside a submodule's directory), and the base's are put
            // back afterwards, replacing whatever was added under their paths.
            let gitlinks = self.base_gitlinks().await?;
            for (_, path) in &gitlinks {
                self.with_index(
                    jail,
                    &["update-index", "--force-remove", "--", path],
                    &self.mirror,
                )
                .await?;
            }
            self.with_index(jail, &["add", "--all"], &self.path).await?;
            for (sha, path) in &gitlinks {
                let entry = format!("{GITLINK_MODE},{sha},{path}");
                self.with_index(
                    jail,
                    &["update-index", "--add", "--replace", "--cacheinfo", &entry],
                    &self.mirror,
                )
                .await?;
            }
            let tree = self.with_index(jail, &["write-tree"], &self.mirror).await?;
            let tree = tree.trim();
            let base_tree = format!("{}^{{tree}}", self.base_commit);
            let base_tree = self
                .with_index(jail, &["rev-parse", "--verify", &base_tree], &self.mirror)
                .await?;
            if tree == base_tree.trim() {
                return Ok(None);
            }
            let message = format!(
                "{}\n\n{TASK_TRAILER}: {}\n",
                message.trim_end(),
                self.task_id.hyphenated()
            );
            let commit = self
                .with_index(
                    jail,
                    &["commit-tree", tree, "-p", &self.base_commit, "-m", &message],
                    &self.mirror,
                )
                .await?;
            let commit = commit.trim().to_owned();
            if jail.is_some() {
                self.import_objects(&commit).await?;
            }
            Ok(Some(commit))
        }
        .await;
        let _ = remove_path(&self.index_dir).await;
        let commit = result?;
        *self.committed.lock() = commit.clone();
        Ok(commit)
    }

    /// Copies the objects the jail wrote (into the index directory's `objects/`, as the
    /// agents' user) into the mirror, as files of the service (a copy, never a move: a file
    /// of that user stays out of the shared mirror), then checks that the mirror holds
    /// `commit` whole. Only regular files named as git names them are taken.
    async fn import_objects(&self, commit: &str) -> Result<(), GitError> {
        let from = self.index_dir.join("objects");
        let to = self.mirror.join("objects");
        tokio::task::spawn_blocking(move || copy_objects(&from, &to))
            .await
            .map_err(|e| GitError::Io(format!("the copy of the new objects failed: {e}")))?
            .map_err(GitError::Io)?;
        self.mirror_git(&[
            "rev-list",
            "--objects",
            "--quiet",
            commit,
            "--not",
            &self.base_commit,
        ])
        .await
        .map(drop)
    }

    /// The gitlinks (submodule commits) of the base commit: `(commit id, path)`, read from
    /// the mirror's objects only.
    async fn base_gitlinks(&self) -> Result<Vec<(String, String)>, GitError> {
        let listed = self
            .mirror_git(&["ls-tree", "-r", "-z", "--full-tree", &self.base_commit])
            .await?;
        let mut gitlinks = Vec::new();
        for entry in listed.split('\0').filter(|e| !e.is_empty()) {
            // `<mode> SP <type> SP <object> TAB <path>`
            let Some((meta, path)) = entry.split_once('\t') else {
                return Err(GitError::Io(format!("unexpected ls-tree entry {entry:?}")));
            };
            let mut fields = meta.split(' ');
            if fields.next() != Some(GITLINK_MODE) {
                continue;
            }
            let sha = fields.nth(1).unwrap_or_default();
            if sha.is_empty() || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(GitError::Io(format!("unexpected ls-tree entry {entry:?}")));
            }
            if path.contains('\u{FFFD}') {
                return Err(GitError::Io(format!(
                    "the base commit has a submodule whose path is not UTF-8: {path:?}"
                )));
            }
            gitlinks.push((sha.to_owned(), path.to_owned()));
        }
        Ok(gitlinks)
    }

    /// Fails with [`GitError::NestedRepository`] when anything below the worktree's root
    /// is named `.git` or a name git or a case-insensitive file system takes for it
    /// ([`is_git_name`]), without following a symbolic link or reading a file.
    async fn check_no_nested_repository(&self) -> Result<(), GitError> {
        let root = self.path.clone();
        let found =
            tokio::task::spawn_blocking(move || find_nested_git(&root, MAX_WORKTREE_ENTRIES))
                .await
                .map_err(|e| GitError::Io(format!("the worktree check failed: {e}")))??;
        match found {
            None => Ok(()),
            Some(relative) => Err(GitError::NestedRepository(
                relative.to_string_lossy().into_owned(),
            )),
        }
    }

    /// Runs a local git command on the mirror and the worktree's files, with the task's own
    /// index file (never the worktree's), from `cwd`: in `jail` when there is one.
    async fn with_index(
        &self,
        jail: Option<&GitJail>,
        args: &[&str],
        cwd: &Path,
    ) -> Result<String, GitError> {
        let git_dir = git_dir_arg(&self.mirror)?;
        let work_tree = format!("--work-tree={}", path_str(&self.path)?);
        let mut full = vec![git_dir.as_str(), work_tree.as_str()];
        let mut env = vec![("GIT_INDEX_FILE", path_str(&self.index)?.to_owned())];
        if jail.is_some() {
            // New objects go to the task's own directory, the mirror's are read through it;
            // the mirror and the worktree belong to the service, not to the jail's user.
            full.extend(["-c", "safe.directory=*"]);
            let objects = self.index_dir.join("objects");
            env.push(("GIT_OBJECT_DIRECTORY", path_str(&objects)?.to_owned()));
            let mirror_objects = self.mirror.join("objects");
            env.push((
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                path_str(&mirror_objects)?.to_owned(),
            ));
        }
        full.extend_from_slice(args);
        match jail {
            None => self.git.run(cwd, &full, &env, LOCAL_TIMEOUT).await,
            Some(jail) => {
                let jailed = jail
                    .command(cwd)
                    .map_err(|e| GitError::Io(format!("cannot sandbox git: {e}")))?;
                self.git
                    .run_jailed(jailed, &self.root, &full, &env, LOCAL_TIMEOUT)
                    .await
            }
        }
    }

    /// The sandbox of the git steps after the agent, `None` when agents run unsandboxed.
    async fn git_jail(&self) -> Result<Option<GitJail>, GitError> {
        let Some(settings) = &self.git_sandbox else {
            return Ok(None);
        };
        let unavailable = |e: String| GitError::Io(format!("cannot sandbox git: {e}"));
        let Some((bwrap, features)) = settings.sandbox.probed().await.map_err(unavailable)? else {
            return Ok(None);
        };
        // The agents' seccomp filter, when they get one.
        let seccomp = if settings.sandbox.seccomp() {
            crate::sandbox::seccomp::program().ok()
        } else {
            None
        };
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        GitJail::new(
            &bwrap,
            features,
            settings.sandbox.limits(),
            settings.sandbox.extra_ro(),
            settings.forwarder.as_deref(),
            seccomp,
            &path,
            GitJailLayout {
                root: &settings.data_dir,
                mirror: &self.mirror,
                worktree: &self.path,
                index_dir: &self.index_dir,
                user: self.jail_user(),
            },
        )
        .map(Some)
        .map_err(unavailable)
    }

    /// Pushes the commit of [`Worktree::commit_all`] from the mirror to the task's branch at
    /// the clone URL. The branch is replaced only when it is absent or its head is a commit
    /// of this task (a retry); otherwise [`GitError::BranchTaken`]. A lease on the head seen
    /// makes a concurrent change of the branch fail the push instead of being overwritten.
    pub async fn push(&self, auth: &GitAuth) -> Result<(), GitError> {
        let branch = self
            .branch
            .as_deref()
            .ok_or_else(|| GitError::InvalidBranch("(detached review checkout)".into()))?;
        let commit = self
            .committed
            .lock()
            .clone()
            .ok_or_else(|| GitError::Io("there is no commit to push".into()))?;
        self.check_untampered().await?;
        let url = self.clone_url.as_str();
        let remote_ref = format!("refs/heads/{branch}");
        let refspec = format!("{commit}:{remote_ref}");
        if self.fast_forward {
            // A revision: the commit's parent is the branch's head when the run started, so
            // this is a fast-forward; without `+` or a lease the remote refuses anything
            // else (someone pushed meanwhile), and nothing of the pull request is lost.
            return self
                .remote_git(
                    auth,
                    &["push", "--quiet", "--no-recurse-submodules", url, &refspec],
                )
                .await
                .map(drop);
        }
        let listed = self
            .remote_git(auth, &["ls-remote", url, &remote_ref])
            .await?;
        let seen = listed
            .lines()
            .find_map(|line| line.split_once('\t').filter(|(_, r)| *r == remote_ref))
            .map(|(sha, _)| sha.to_owned());
        let expected = match seen {
            None => String::new(),
            Some(_) => {
                let tracking = format!("refs/remotes/origin/{branch}");
                let fetched = format!("+{remote_ref}:{tracking}");
                self.remote_git(
                    auth,
                    &["fetch", "--quiet", "--no-write-fetch-head", url, &fetched],
                )
                .await?;
                let head = self
                    .mirror_git(&["rev-parse", "--verify", &format!("{tracking}^{{commit}}")])
                    .await?
                    .trim()
                    .to_owned();
                let format = format!("--format=%(trailers:key={TASK_TRAILER},valueonly)");
                let owners = self.mirror_git(&["show", "-s", &format, &head]).await?;
                let ours = self.task_id.hyphenated().to_string();
                if !owners.lines().any(|owner| owner.trim() == ours) {
                    return Err(GitError::BranchTaken {
                        branch: branch.to_owned(),
                        commit: head,
                    });
                }
                head
            }
        };
        let lease = format!("--force-with-lease={remote_ref}:{expected}");
        self.remote_git(
            auth,
            &[
                "push",
                "--quiet",
                "--no-recurse-submodules",
                &lease,
                url,
                &refspec,
            ],
        )
        .await
        .map(drop)
    }

    /// Removes the worktree, its metadata and its local branch. Idempotent.
    pub async fn remove(self) -> Result<(), GitError> {
        let _held = self.lock.lock().await;
        remove_path(&self.path).await?;
        remove_path(&self.meta).await?;
        remove_path(&self.index_dir).await?;
        remove_path(&self.agent_git_path()).await?;
        self.mirror_git(&["worktree", "prune"]).await?;
        if let Some(branch) = &self.branch {
            let exists = self.mirror_git(&["branch", "--list", branch]).await?;
            if !exists.trim().is_empty() {
                self.mirror_git(&["branch", "-D", branch]).await?;
            }
        }
        Ok(())
    }

    /// The workspace root: the working directory of git commands that need no worktree.
    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    /// `git --git-dir=<mirror> args` in the workspace root, on the mirror's own objects and
    /// configuration only (no worktree), within [`LOCAL_TIMEOUT`].
    async fn mirror_git(&self, args: &[&str]) -> Result<String, GitError> {
        self.mirror_git_with(args, &[], LOCAL_TIMEOUT).await
    }

    /// [`Self::mirror_git`] for a command reaching the remote: with `auth` for the clone
    /// URL, within [`REMOTE_TIMEOUT`].
    async fn remote_git(&self, auth: &GitAuth, args: &[&str]) -> Result<String, GitError> {
        self.mirror_git_with(args, &auth.env(&self.clone_url), REMOTE_TIMEOUT)
            .await
    }

    /// [`Self::mirror_git`] with `env`, within `limit`.
    async fn mirror_git_with(
        &self,
        args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Result<String, GitError> {
        let git_dir = git_dir_arg(&self.mirror)?;
        let mut full = vec![git_dir.as_str()];
        full.extend_from_slice(args);
        self.git.run(&self.root(), &full, env, limit).await
    }

    /// Fails with [`GitError::Tampered`] unless the worktree is still a directory whose
    /// `.git` is what `git worktree add` wrote and the mirror's configuration is agentry's.
    async fn check_untampered(&self) -> Result<(), GitError> {
        let is_dir = tokio::fs::symlink_metadata(&self.path)
            .await
            .is_ok_and(|m| m.is_dir());
        if !is_dir {
            return Err(GitError::Tampered("the worktree directory".into()));
        }
        let dot_git = self.path.join(".git");
        if read_small_async(&dot_git, MAX_DOT_GIT_BYTES).await.as_ref() != Some(&self.dot_git) {
            return Err(GitError::Tampered("the worktree's .git".into()));
        }
        let config = self.mirror.join("config");
        if read_small_async(&config, MIRROR_CONFIG.len() as u64)
            .await
            .as_deref()
            != Some(MIRROR_CONFIG.as_bytes())
        {
            return Err(GitError::Tampered(
                "the git configuration of the repository's mirror".into(),
            ));
        }
        Ok(())
    }
}

/// Copies the object files under `from` (`xx/<38 hex>` loose objects, `pack/pack-<hex>.pack`
/// and `.idx`) that `to` does not have into `to`, as new files of this process (0444), reading
/// regular files only ([`crate::files::open_regular`]); anything else under `from` is ignored.
fn copy_objects(from: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let hex =
        |name: &str, len: usize| name.len() == len && name.bytes().all(|b| b.is_ascii_hexdigit());
    let listed = |dir: &Path| -> Result<Vec<(String, std::fs::FileType)>, String> {
        let mut found = Vec::new();
        for entry in
            std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
            if let Ok(name) = entry.file_name().into_string() {
                found.push((name, kind));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    };
    let copy = |source: &Path, target: &Path| -> Result<(), String> {
        if std::fs::symlink_metadata(target).is_ok() {
            return Ok(());
        }
        let mut input = crate::files::open_regular(source)
            .map_err(|e| format!("cannot read {}: {e}", source.display()))?;
        let mut partial = target.as_os_str().to_owned();
        partial.push(".agentry-tmp");
        let partial = PathBuf::from(partial);
        let mut output = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o444)
            .open(&partial)
            .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
        std::io::copy(&mut input, &mut output)
            .and_then(|_| output.sync_all())
            .and_then(|()| output.set_permissions(std::fs::Permissions::from_mode(0o444)))
            .and_then(|()| std::fs::rename(&partial, target))
            .map_err(|e| {
                format!(
                    "cannot copy {} to {}: {e}",
                    source.display(),
                    target.display()
                )
            })
    };
    for (name, kind) in listed(from)? {
        if kind.is_dir() && hex(&name, 2) {
            let dir = to.join(&name);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            for (object, kind) in listed(&from.join(&name))? {
                if kind.is_file() && hex(&object, 38) {
                    copy(&from.join(&name).join(&object), &dir.join(&object))?;
                }
            }
        } else if kind.is_dir() && name == "pack" {
            let dir = to.join("pack");
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            // Each pack before its index, so the mirror never has an index without its pack.
            let mut files: Vec<(String, std::fs::FileType)> = listed(&from.join("pack"))?;
            files.sort_by_key(|(n, _)| !n.ends_with(".pack"));
            for (file, kind) in files {
                let stem = file
                    .strip_suffix(".pack")
                    .or_else(|| file.strip_suffix(".idx"));
                let named = stem
                    .and_then(|s| s.strip_prefix("pack-"))
                    .is_some_and(|h| hex(h, 40) || hex(h, 64));
                if kind.is_file() && named {
                    copy(&from.join("pack").join(&file), &dir.join(&file))?;
                }
            }
        }
    }
    Ok(())
}

/// Writes the mirror's fixed configuration (atomically, and only when it differs).
async fn write_mirror_config(mirror: &Path) -> Result<(), GitError> {
    let config = mirror.join("config");
    if read_small_async(&config, MIRROR_CONFIG.len() as u64)
        .await
        .as_deref()
        == Some(MIRROR_CONFIG.as_bytes())
    {
        return Ok(());
    }
    let io = |e: std::io::Error| GitError::Io(format!("cannot write {}: {e}", config.display()));
    let temporary = mirror.join("config.agentry-new");
    remove_path(&temporary).await?;
    tokio::fs::write(&temporary, MIRROR_CONFIG)
        .await
        .map_err(io)?;
    tokio::fs::rename(&temporary, &config).await.map_err(io)
}

/// The worktree's metadata directory named by the `.git` file `git worktree add` wrote: it
/// must be `<mirror>/worktrees/<one name>`.
fn worktree_meta(mirror: &Path, dot_git: &[u8]) -> Result<PathBuf, GitError> {
    let text = std::str::from_utf8(dot_git).unwrap_or_default();
    let meta = text
        .strip_prefix("gitdir: ")
        .map(|p| PathBuf::from(p.trim_end_matches(['\n', '\r'])));
    match meta {
        Some(meta)
            if meta.parent() == Some(mirror.join("worktrees").as_path())
                && meta.file_name().is_some() =>
        {
            Ok(meta)
        }
        _ => Err(GitError::Io(format!(
            "unexpected .git file of a new worktree: {text:?}"
        ))),
    }
}

/// [`crate::files::read_small`] on a blocking thread.
async fn read_small_async(path: &Path, max: u64) -> Option<Vec<u8>> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || crate::files::read_small(&path, max))
        .await
        .ok()?
}

/// Whether git, or a file system it may be checked out on (case-insensitive, NTFS, HFS+),
/// takes a file name for `.git`: `.git` in any case, with trailing dots or spaces, an NTFS
/// stream suffix (`.git::$INDEX_ALLOCATION`), the NTFS short name `git~1`, or with code
/// points HFS+ ignores (zero-width and directional marks, U+FEFF) anywhere in it.
pub fn is_git_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    let visible: String = name
        .chars()
        .filter(|c| !is_hfs_ignorable(*c))
        .collect::<String>()
        .to_ascii_lowercase();
    let before_stream = visible.split(':').next().unwrap_or_default();
    let trimmed = before_stream.trim_end_matches(['.', ' ']);
    trimmed == ".git" || trimmed == "git~1"
}

/// The code points HFS+ ignores in file names (as git's `is_hfs_dotgit` lists them).
fn is_hfs_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{200C}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{206A}'..='\u{206F}' | '\u{FEFF}'
    )
}

/// Walks the directory `root` with `lstat` semantics (never following a symbolic link)
/// and returns the path, relative to `root`, of the first entry below it that
/// [`is_git_name`] (the root's own `.git` excepted: it is the worktree's, checked apart).
/// Streams the walk: it holds one open directory per level, at most
/// [`MAX_WORKTREE_DEPTH`] levels, and fails after `max_entries` entries.
fn find_nested_git(root: &Path, max_entries: u64) -> Result<Option<PathBuf>, GitError> {
    let unchecked = |why: String| GitError::Unchecked(why);
    let meta = std::fs::symlink_metadata(root)
        .map_err(|e| unchecked(format!("cannot read {}: {e}", root.display())))?;
    if !meta.is_dir() {
        return Err(GitError::Tampered("the worktree directory".into()));
    }
    let open = |dir: &Path| {
        std::fs::read_dir(dir).map_err(|e| unchecked(format!("cannot list {}: {e}", dir.display())))
    };
    // One (directory relative to the root, its open listing) per level.
    let mut stack = vec![(PathBuf::new(), open(root)?)];
    let mut seen: u64 = 0;
    while let Some((dir, listing)) = stack.last_mut() {
        let Some(entry) = listing.next() else {
            stack.pop();
            continue;
        };
        let entry = entry.map_err(|e| unchecked(format!("cannot list {}: {e}", dir.display())))?;
        seen += 1;
        if seen > max_entries {
            return Err(unchecked(format!("it has more than {max_entries} entries")));
        }
        let name = entry.file_name();
        let relative = dir.join(&name);
        let at_root = dir.as_os_str().is_empty();
        if is_git_name(&name) && !(at_root && name == ".git") {
            return Ok(Some(relative));
        }
        // `DirEntry::file_type` does not follow symbolic links.
        let kind = entry
            .file_type()
            .map_err(|e| unchecked(format!("cannot read {}: {e}", relative.display())))?;
        if kind.is_dir() {
            if stack.len() >= MAX_WORKTREE_DEPTH {
                return Err(unchecked(format!(
                    "it is deeper than {MAX_WORKTREE_DEPTH} directories"
                )));
            }
            let listing = open(&root.join(&relative))?;
            stack.push((relative, listing));
        }
    }
    Ok(None)
}

/// Removes a file, a directory tree or a symbolic link (never what it points to); absent
/// is fine.
async fn remove_path(path: &Path) -> Result<(), GitError> {
    let removed = match tokio::fs::symlink_metadata(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => tokio::fs::remove_dir_all(path).await,
        Ok(_) => tokio::fs::remove_file(path).await,
    };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GitError::Io(format!(
            "cannot remove {}: {e}",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// A file of the service's removed when this is dropped (absent is fine).
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Where the copy of task `task_id`'s worktree metadata for its agent lies.
fn agent_git_path(root: &Path, task_id: Uuid) -> PathBuf {
    root.join(AGENT_GIT_DIR).join(task_id.to_string())
}

/// Copies the directory `from` (git metadata agentry made: directories and regular files)
/// to `to`, which must not exist; anything else in it (a link) is left out.
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("cannot list {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", from.display()))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        // `DirEntry::file_type` does not follow symbolic links.
        let kind = entry
            .file_type()
            .map_err(|e| format!("cannot read {}: {e}", source.display()))?;
        if kind.is_dir() {
            copy_tree(&source, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)
                .map_err(|e| format!("cannot copy {}: {e}", source.display()))?;
        }
    }
    Ok(())
}

/// Runs git with a clean environment.
#[derive(Debug, Clone)]
struct Git {
    home: PathBuf,
    /// The only protocol git may use (`GIT_ALLOW_PROTOCOL`).
    protocol: &'static str,
}

impl Git {
    /// Runs git with `args` from `cwd`, with `env` on top of the clean environment, within
    /// `limit`; its stdout.
    async fn run(
        &self,
        cwd: &Path,
        args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Result<String, GitError> {
        let mut command = Command::new("git");
        command.current_dir(cwd);
        self.finish(command, args, env, limit).await
    }

    /// [`Git::run`] inside the sandbox `jailed` (it names its working directory), started
    /// from `outside` (any directory of the service).
    async fn run_jailed(
        &self,
        jailed: JailedCommand,
        outside: &Path,
        args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Result<String, GitError> {
        let mut command = Command::new(&jailed.program);
        command.args(&jailed.args).current_dir(outside);
        if let Some(user) = &jailed.user {
            // As root, std drops the supplementary groups with the switch.
            command.uid(user.uid).gid(user.gid);
        }
        if let Some(passed) = &jailed.pass_fd {
            // As for an agent (crate::process): a duplicate at the original's number, in
            // the child only.
            let mappings = PassedFd::mappings(std::slice::from_ref(passed))
                .map_err(|e| GitError::Io(format!("cannot pass the seccomp filter: {e}")))?;
            command
                .fd_mappings(mappings)
                .map_err(|e| GitError::Io(format!("cannot pass the seccomp filter: {e}")))?;
        }
        self.finish(command, args, env, limit).await
    }

    /// Adds git's safe configuration, `args` and the clean environment to `command` (git
    /// itself, or a sandbox whose command line ends with git), runs it and returns its
    /// stdout.
    async fn finish(
        &self,
        mut command: Command,
        args: &[&str],
        env: &[(&str, String)],
        limit: Duration,
    ) -> Result<String, GitError> {
        let shown = args.join(" ");
        for config in SAFE_CONFIG {
            command.args(["-c", config]);
        }
        command
            .args(args)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", &self.home)
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ALLOW_PROTOCOL", self.protocol)
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
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .spawn()
            .map_err(|e| GitError::Io(format!("cannot run git: {e}")))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(GitError::Io(format!("`git {shown}` has no output pipes")));
        };
        let ran = async {
            tokio::join!(
                read_head(stdout, MAX_STDOUT_BYTES),
                read_tail(stderr, STDERR_TAIL_BYTES),
                child.wait()
            )
        };
        // On a timeout the child is dropped, which kills it (`kill_on_drop`).
        let (stdout, stderr, status) = match tokio::time::timeout(limit, ran).await {
            Ok((Ok(stdout), Ok(stderr), Ok(status))) => (stdout, stderr, status),
            Ok((Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e))) => {
                return Err(GitError::Io(format!("`git {shown}`: {e}")));
            }
            Err(_) => {
                return Err(GitError::Timeout {
                    command: shown,
                    secs: limit.as_secs(),
                });
            }
        };
        if !status.success() {
            let stderr = String::from_utf8_lossy(&stderr);
            let stderr = stderr.trim();
            let mut shortened = agentry_domain::quote::excerpt(stderr, MAX_STDERR_CHARS);
            if shortened.is_empty() {
                shortened = format!("exit status {status}");
            }
            return Err(GitError::Command {
                command: shown,
                stderr: shortened,
            });
        }
        let Some(stdout) = stdout else {
            return Err(GitError::Io(format!(
                "`git {shown}` printed more than {} MiB",
                MAX_STDOUT_BYTES / (1024 * 1024)
            )));
        };
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }
}

/// The first `max` bytes `from` gives, or `None` when it gives more (the rest is read and
/// dropped, so the writer never blocks on a full pipe).
async fn read_head(
    mut from: impl tokio::io::AsyncRead + Unpin,
    max: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    (&mut from)
        .take(max as u64 + 1)
        .read_to_end(&mut kept)
        .await?;
    if kept.len() <= max {
        return Ok(Some(kept));
    }
    tokio::io::copy(&mut from, &mut tokio::io::sink()).await?;
    Ok(None)
}

/// The last `keep` bytes of all `from` gives, holding at most twice `keep` (and a read) in
/// memory.
async fn read_tail(
    mut from: impl tokio::io::AsyncRead + Unpin,
    keep: usize,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut tail = Vec::with_capacity(keep.min(64 * 1024));
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 2 * keep {
            tail.drain(..tail.len() - keep);
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    Ok(tail)
}

fn path_str(path: &Path) -> Result<&str, GitError> {
    path.to_str()
        .ok_or_else(|| GitError::Io(format!("path is not UTF-8: {}", path.display())))
}

/// `--git-dir=<mirror>`: every command names its repository; none is discovered.
fn git_dir_arg(mirror: &Path) -> Result<String, GitError> {
    Ok(format!("--git-dir={}", path_str(mirror)?))
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
    use super::*;

    /// git's stdout is kept whole up to its limit and refused past it; of its stderr, the
    /// last bytes are kept.
    #[tokio::test]
    async fn what_git_prints_is_read_within_bounds() {
        let text: Vec<u8> = (0..100u8).collect();
        assert_eq!(read_head(&text[..], 100).await.unwrap(), Some(text.clone()));
        assert_eq!(read_head(&text[..], 99).await.unwrap(), None);
        assert_eq!(read_tail(&text[..], 1000).await.unwrap(), text);
        assert_eq!(read_tail(&text[..], 10).await.unwrap(), &text[90..]);
        let long = vec![7u8; 100_000];
        let tail = read_tail(&long[..], 1000).await.unwrap();
        assert_eq!(tail, vec![7u8; 1000]);
    }

    /// The jail's objects reach the mirror as new read-only files: loose objects and packs
    /// (a pack before its index), never what the mirror has, a link or a stray name.
    #[test]
    fn the_jails_objects_are_copied_into_the_mirror_and_nothing_else() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        let loose = "0123456789abcdef0123456789abcdef012345";
        let pack = format!("pack-{}", "ab".repeat(20));
        for d in [
            from.join("ab"),
            from.join("pack"),
            from.join("info"),
            to.join("ab"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(from.join("ab").join(loose), "new object").unwrap();
        std::fs::write(from.join("ab/not-an-object"), "stray").unwrap();
        std::fs::write(from.join("pack").join(format!("{pack}.pack")), "pack").unwrap();
        std::fs::write(from.join("pack").join(format!("{pack}.idx")), "idx").unwrap();
        std::fs::write(from.join("pack/other.keep"), "stray").unwrap();
        std::fs::write(from.join("info/alternates"), "/elsewhere").unwrap();
        let kept = "fedcba9876543210fedcba9876543210fedcba";
        std::fs::write(from.join("ab").join(kept), "the jail's version").unwrap();
        std::fs::write(to.join("ab").join(kept), "the mirror's").unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "not an object").unwrap();
        let linked = "1111111111111111111111111111111111111a";
        std::os::unix::fs::symlink(&secret, from.join("ab").join(linked)).unwrap();

        copy_objects(&from, &to).unwrap();

        let copied = to.join("ab").join(loose);
        assert_eq!(std::fs::read_to_string(&copied).unwrap(), "new object");
        let meta = std::fs::symlink_metadata(&copied).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o444);
        assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
        for file in [format!("{pack}.pack"), format!("{pack}.idx")] {
            assert!(to.join("pack").join(file).is_file());
        }
        assert_eq!(
            std::fs::read_to_string(to.join("ab").join(kept)).unwrap(),
            "the mirror's"
        );
        for absent in [
            to.join("ab/not-an-object"),
            to.join("pack/other.keep"),
            to.join("info"),
            to.join("ab").join(linked),
        ] {
            assert!(
                std::fs::symlink_metadata(&absent).is_err(),
                "{}",
                absent.display()
            );
        }
        let left: Vec<_> = std::fs::read_dir(to.join("ab"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".agentry-tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn branch_names_and_auth_debug() {
        let id = Uuid::parse_str("3F2504E0-4F89-11D3-9A0C-0305E82C3301").unwrap();
        assert_eq!(
            branch_name(id),
            "agentry/task-3f2504e04f8911d39a0c0305e82c3301"
        );
        let auth = GitAuth::token("s3cret");
        assert!(!format!("{auth:?}").contains("s3cret"));
        assert!(GitAuth::none().env("https://github.com/o/r.git").is_empty());
    }

    /// The header is scoped to the clone URL: git sends it only to URLs under it.
    #[test]
    fn the_token_header_is_scoped_to_the_clone_url() {
        let env = GitAuth::token("s3cret").env("https://github.com/o/r.git");
        let expected = format!(
            "Authorization: Basic {}",
            base64::engine::general_purpose::STANDARD.encode("x-access-token:s3cret")
        );
        assert_eq!(
            env,
            vec![
                ("GIT_CONFIG_COUNT", "1".to_owned()),
                (
                    "GIT_CONFIG_KEY_0",
                    "http.https://github.com/o/r.git.extraHeader".to_owned()
                ),
                ("GIT_CONFIG_VALUE_0", expected),
            ]
        );
    }

    #[test]
    fn dangerous_branch_names_are_refused() {
        for bad in ["", "-x", "a..b", "a b", "a:b", "/a", "a\nb"] {
            assert!(valid_branch(bad).is_err(), "{bad:?}");
        }
        assert!(valid_branch("agentry/task-12345678").is_ok());
    }

    #[test]
    fn clone_urls_are_validated() {
        let ok = |url: &str, local: bool| clone_protocol(url, "github.com", local);
        assert_eq!(ok("https://github.com/o/r.git", false).unwrap(), "https");
        assert_eq!(ok("https://GitHub.com/O/r", false).unwrap(), "https");
        assert_eq!(
            clone_protocol("https://ghe.local:8443/o/r.git", "ghe.local:8443", false).unwrap(),
            "https"
        );
        for bad in [
            "https://evil.example/o/r.git",
            "https://github.com.evil.example/o/r.git",
            "https://github.com:444/o/r.git",
            "http://github.com/o/r.git",
            "-uhttps://github.com/o/r.git",
            "--upload-pack=touch /tmp/x",
            "https://x-access-token:t@github.com/o/r.git",
            "https://user@github.com/o/r.git",
            "https://evil.example@github.com/o/r.git",
            "ext::sh -c touch% /tmp/pwned",
            "ext::sh",
            "ssh://git@github.com/o/r.git",
            "git@github.com:o/r.git",
            "git://github.com/o/r.git",
            "fd::17",
            "https://github.com",
            "https://github.com/",
            "https://github.com/o/../r.git",
            "https://github.com/o/r.git?x=1",
            "https://github.com/o/r.git#x",
            "https://github.com/o/r%2e.git",
            "https://github.com/o/r .git",
            "https://github.com/o/r\n.git",
            "",
        ] {
            for local in [false, true] {
                assert!(
                    matches!(ok(bad, local), Err(GitError::CloneUrlRefused { .. })),
                    "{bad:?} local={local}"
                );
            }
        }
        // Local repositories only when the code host is on loopback.
        for local in ["/tmp/x/repo.git", "file:///tmp/x/repo.git"] {
            assert!(ok(local, false).is_err(), "{local}");
            assert_eq!(ok(local, true).unwrap(), "file", "{local}");
        }
        assert!(ok("file://host/tmp/x.git", true).is_err());
        assert!(ok("file:///tmp/../etc", true).is_err());
        assert!(ok("./relative.git", true).is_err());
        // Plain http only to loopback, and only in local mode.
        assert_eq!(ok("http://127.0.0.1:8080/o/r.git", true).unwrap(), "http");
        assert!(ok("http://127.0.0.1:8080/o/r.git", false).is_err());
        assert!(ok("http://10.0.0.1/o/r.git", true).is_err());
        assert!(validate_clone_url("https://github.com/o/r.git", "github.com", false).is_ok());
        let err = validate_clone_url("https://evil.example/o/r.git", "github.com", false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is not on the repository's host github.com"),
            "{err}"
        );
    }

    #[test]
    fn loopback_urls() {
        for yes in [
            "http://127.0.0.1:1234",
            "http://127.0.0.1:1234/api/v3",
            "https://localhost",
            "http://[::1]:80/",
            "http://127.1.2.3",
        ] {
            assert!(is_loopback_url(yes), "{yes}");
        }
        for no in [
            "https://api.github.com",
            "http://127.0.0.1.evil.example/",
            "http://user@evil.example",
            "http://evil.example/127.0.0.1",
            "ftp://127.0.0.1",
            "127.0.0.1",
        ] {
            assert!(!is_loopback_url(no), "{no}");
        }
    }

    #[test]
    fn names_git_takes_for_dot_git() {
        use std::ffi::OsStr;
        for yes in [
            ".git",
            ".GIT",
            ".Git",
            ".git.",
            ".git ",
            ".git. .",
            ".git::$INDEX_ALLOCATION",
            "git~1",
            "GIT~1",
            ".g\u{200C}it",
            "\u{200D}.git",
            ".git\u{200E}",
            ".g\u{200F}i\u{202A}t",
            ".gi\u{202E}t",
            ".\u{206A}git\u{206F}",
            "\u{FEFF}.git",
        ] {
            assert!(is_git_name(OsStr::new(yes)), "{yes:?}");
        }
        for no in [
            "git",
            ".gitignore",
            ".gitmodules",
            ".gitattributes",
            "x.git",
            ".git2",
            "git~2",
            ".g.it",
            "",
            ".",
        ] {
            assert!(!is_git_name(OsStr::new(no)), "{no:?}");
        }
    }

    #[test]
    fn the_walk_finds_nested_git_names_without_following_links() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().join("tree");
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join(".git"), "gitdir: x\n").unwrap();
        std::fs::write(root.join("a/b/c/file"), "x").unwrap();
        // The root's own `.git` is not nested.
        assert_eq!(find_nested_git(&root, 100).unwrap(), None);
        // A symbolic link to a directory holding a `.git` is not followed.
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(outside.join(".git")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/link")).unwrap();
        assert_eq!(find_nested_git(&root, 100).unwrap(), None);
        // A symbolic link named `.git` is refused, wherever it points.
        std::os::unix::fs::symlink("/nonexistent", root.join("a/b/.git")).unwrap();
        assert_eq!(
            find_nested_git(&root, 100).unwrap(),
            Some(PathBuf::from("a/b/.git"))
        );
        std::fs::remove_file(root.join("a/b/.git")).unwrap();
        std::fs::write(root.join("a/b/c/.GIT."), "").unwrap();
        assert_eq!(
            find_nested_git(&root, 100).unwrap(),
            Some(PathBuf::from("a/b/c/.GIT."))
        );
        std::fs::remove_file(root.join("a/b/c/.GIT.")).unwrap();
        // At the root, only the exact `.git` is the worktree's.
        std::fs::create_dir(root.join(".GIT")).unwrap();
        assert_eq!(
            find_nested_git(&root, 100).unwrap(),
            Some(PathBuf::from(".GIT"))
        );
        std::fs::remove_dir(root.join(".GIT")).unwrap();
        // Bounded: too many entries, or too deep, is refused.
        assert!(matches!(
            find_nested_git(&root, 3),
            Err(GitError::Unchecked(_))
        ));
        let mut deep = root.clone();
        for _ in 0..=MAX_WORKTREE_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        assert!(matches!(
            find_nested_git(&root, 100_000),
            Err(GitError::Unchecked(why)) if why.contains("deeper")
        ));
        // The root itself must be a directory.
        assert!(matches!(
            find_nested_git(&root.join("a/b/c/file"), 100),
            Err(GitError::Tampered(_))
        ));
    }

    #[tokio::test]
    async fn small_reads_are_bounded() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "gitdir: x\n").unwrap();
        assert_eq!(read_small_async(&file, 64).await.unwrap(), b"gitdir: x\n");
        assert_eq!(read_small_async(&file, 4).await, None);
    }

    #[test]
    fn the_worktree_metadata_must_be_in_the_mirror() {
        let mirror = Path::new("/data/mirrors/r.git");
        assert_eq!(
            worktree_meta(mirror, b"gitdir: /data/mirrors/r.git/worktrees/abc\n").unwrap(),
            PathBuf::from("/data/mirrors/r.git/worktrees/abc")
        );
        assert!(worktree_meta(mirror, b"gitdir: /elsewhere/worktrees/abc\n").is_err());
        assert!(worktree_meta(mirror, b"gitdir: /data/mirrors/r.git/worktrees/a/b\n").is_err());
        assert!(worktree_meta(mirror, b"nonsense").is_err());
    }
}
