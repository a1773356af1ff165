//! [`LocalRunner`]: executes jobs as processes on this machine.
//!
//! Layout under its root directory (the service's data directory):
//!
//! ```text
//! workspaces/mirrors/<repo>.git     bare mirror per repository (see crate::workspace)
//! workspaces/worktrees/<task>       worktree of the running task, removed afterwards
//! runs/<task>/<attempt>/output.log  the agent's stdout as it arrives (the live log)
//! runs/<task>/<attempt>/agent.pid   the agent's process (group) id
//! runs/<task>/<attempt>/home/       the agent's HOME
//! ```
//!
//! Each agent runs in the sandbox of [`LocalConfig::sandbox`] (see [`crate::sandbox`]): of
//! all this it sees only its worktree and its `HOME`.
//!
//! The run directory outlives the job: the service reads the output from it after a crash
//! ([`Runner::salvage`]) and removes it once the run is recorded ([`Runner::discard`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_domain::AgentType;
use uuid::Uuid;

use crate::agent;
use crate::job::{Control, Execution, ExecutionFuture, Job, JobKind, Runner, Verdict};
use crate::process::{self, Ended, Limits};
use crate::sandbox::{self, Sandbox, SandboxMode};
use crate::workspace::{Workspaces, Worktree};
use crate::{AgentOutcome, PriceTable, RunReport};

/// The most characters of the agent's stderr kept in a failure message.
const STDERR_IN_MESSAGE: usize = 500;

/// What a [`LocalRunner`] needs.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The directory holding workspaces and run directories.
    pub root: PathBuf,
    /// The Claude Code executable (`AGENTRY_CLAUDE_BIN`).
    pub claude_bin: PathBuf,
    /// The Codex executable (`AGENTRY_CODEX_BIN`).
    pub codex_bin: PathBuf,
    /// Prices for agents that report tokens only.
    pub prices: PriceTable,
    /// The service's own values of `PATH` and of the agents' API-key variables; nothing
    /// else of the service's environment reaches an agent.
    pub inherited_env: Vec<(String, String)>,
    /// How long a stopped agent gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// The sandbox agents run in (`AGENTRY_AGENT_SANDBOX`); see [`crate::sandbox`].
    pub sandbox: Sandbox,
}

impl LocalConfig {
    /// The variables of the service environment `lookup` that agents may inherit: `PATH`
    /// and every agent's API-key variables that are set.
    pub fn inherit(lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let names = std::iter::once("PATH")
            .chain(agent::api_key_vars(AgentType::ClaudeCode).iter().copied())
            .chain(agent::api_key_vars(AgentType::Codex).iter().copied());
        names
            .filter_map(|name| Some((name.to_owned(), lookup(name)?)))
            .collect()
    }
}

/// Runs jobs as local processes (see the module docs).
pub struct LocalRunner {
    config: LocalConfig,
    workspaces: Workspaces,
}

impl std::fmt::Debug for LocalRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRunner")
            .field("root", &self.config.root)
            .finish_non_exhaustive()
    }
}

impl LocalRunner {
    /// A runner working under `config.root`.
    pub fn new(config: LocalConfig) -> Self {
        if config.sandbox.mode() == SandboxMode::Off {
            tracing::warn!("agents run unsandboxed: AGENTRY_AGENT_SANDBOX=off");
        }
        let workspaces = Workspaces::new(config.root.join("workspaces"));
        LocalRunner { config, workspaces }
    }

    /// The directory of one run.
    pub fn run_dir(&self, task_id: Uuid, attempt: i32) -> PathBuf {
        self.config
            .root
            .join("runs")
            .join(task_id.to_string())
            .join(attempt.to_string())
    }

    fn program(&self, agent_type: AgentType) -> &Path {
        match agent_type {
            AgentType::ClaudeCode => &self.config.claude_bin,
            AgentType::Codex => &self.config.codex_bin,
        }
    }

    async fn run(&self, job: Job, mut control: Control) -> Execution {
        let started_at = now();
        let agent_type = job.agent.agent_type;
        // Checked before anything is prepared: without its sandbox, no agent starts.
        let launcher = self.config.sandbox.launcher().await;
        let sandboxed = matches!(launcher, Ok(Some(_)));
        let fail = |message: String| Execution {
            verdict: Verdict::Failed(message),
            agent_type,
            report: None,
            ended: None,
            output: String::new(),
            sandboxed,
            started_at,
            finished_at: now(),
        };
        let bwrap = match launcher {
            Ok(bwrap) => bwrap,
            Err(message) => return fail(message),
        };
        let run_dir = self.run_dir(job.task_id, job.attempt);
        let home = run_dir.join("home");
        if let Err(e) = fresh_dir(&home).await {
            return fail(format!(
                "could not create the run directory {}: {e}",
                home.display()
            ));
        }
        let prepared = match &job.kind {
            JobKind::Coding { .. } => {
                self.workspaces
                    .prepare_coding(&job.repo, job.task_id, &job.auth)
                    .await
            }
            JobKind::Review { branch } => {
                self.workspaces
                    .prepare_review(&job.repo, job.task_id, branch, &job.auth)
                    .await
            }
        };
        let worktree = match prepared {
            Ok(w) => w,
            Err(e) => return fail(format!("could not prepare the workspace: {e}")),
        };
        if *control.cancel.borrow() {
            remove_worktree(worktree).await;
            return Execution {
                verdict: Verdict::Cancelled,
                ..fail(String::new())
            };
        }
        let env = process::agent_env(&home, agent::api_key_vars(agent_type), |name| {
            self.config
                .inherited_env
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        });
        let command = agent::command(
            &job.agent,
            self.program(agent_type),
            &job.prompt,
            worktree.path(),
            env,
        );
        let command = match &bwrap {
            None => command,
            Some(bwrap) => {
                let layout = sandbox::Layout {
                    root: &self.config.root,
                    worktree: worktree.path(),
                    home: &home,
                    mirror: &self
                        .config
                        .root
                        .join("workspaces")
                        .join("mirrors")
                        .join(format!("{}.git", job.repo.key)),
                };
                match sandbox::wrap(bwrap, command, layout) {
                    Ok(command) => command,
                    Err(e) => {
                        remove_worktree(worktree).await;
                        return fail(format!("could not set up the agent's sandbox: {e}"));
                    }
                }
            }
        };
        let limits = Limits {
            wall_time: job.wall_time,
            kill_grace: self.config.kill_grace,
        };
        let pid_file = run_dir.join("agent.pid");
        let started = control.started.take();
        let outcome = process::run_process(
            command,
            &run_dir.join("output.log"),
            limits,
            control.cancel.clone(),
            move |pid| {
                // Best effort: only used to stop an orphaned agent after a crash.
                let _ = std::fs::write(&pid_file, pid.to_string());
                if let Some(started) = started {
                    let _ = started.send(());
                }
            },
        )
        .await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                remove_worktree(worktree).await;
                return fail(format!("could not start the agent: {e}"));
            }
        };
        let report = agent::parse_output(&job.agent, &outcome.stdout, &self.config.prices);
        let mut output = outcome.stdout;
        let verdict = match &outcome.ended {
            Ended::Cancelled => Verdict::Cancelled,
            Ended::TimedOut => Verdict::TimedOut(format!(
                "the agent ran longer than the limit of {} and was stopped",
                human(job.wall_time)
            )),
            Ended::Exited { code, signal } => {
                match agent_failure(&report, *code, *signal, &outcome.stderr_tail) {
                    Some(message) => Verdict::Failed(message),
                    None => publish(&job, &worktree, &report).await,
                }
            }
        };
        if !outcome.stderr_tail.trim().is_empty() && !matches!(verdict, Verdict::Pushed { .. }) {
            output.push_str("\n--- agent stderr (end) ---\n");
            output.push_str(&outcome.stderr_tail);
        }
        remove_worktree(worktree).await;
        Execution {
            verdict,
            agent_type,
            report: Some(report),
            ended: Some(outcome.ended),
            output,
            sandboxed,
            started_at,
            finished_at: now(),
        }
    }
}

impl Runner for LocalRunner {
    fn execute(&self, job: Job, control: Control) -> ExecutionFuture<'_> {
        Box::pin(self.run(job, control))
    }

    fn live_output(&self, task_id: Uuid, attempt: i32) -> Option<String> {
        let path = self.run_dir(task_id, attempt).join("output.log");
        read_tail(&path, process::STDOUT_MEMORY_CAP).ok()
    }

    fn salvage(&self, task_id: Uuid, attempt: i32) -> Option<String> {
        let dir = self.run_dir(task_id, attempt);
        stop_orphan(&dir);
        self.live_output(task_id, attempt)
    }

    fn discard(&self, task_id: Uuid, attempt: i32) {
        let dir = self.run_dir(task_id, attempt);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove a run directory");
        }
        // The task's directory, once it holds no run any more.
        if let Some(parent) = dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// The last `max` bytes of a file (all of it when shorter) as lossy UTF-8, starting on a
/// character when cut.
fn read_tail(path: &Path, max: usize) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    let cut = len > max;
    if cut {
        file.seek(SeekFrom::Start(len - max))?;
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(process::lossy(if cut {
        process::skip_partial_char(bytes)
    } else {
        bytes
    }))
}

/// Why a finished agent run counts as failed, or `None` when it succeeded.
fn agent_failure(
    report: &RunReport,
    code: Option<i32>,
    signal: Option<i32>,
    stderr: &str,
) -> Option<String> {
    let message = match &report.outcome {
        AgentOutcome::Success if code == Some(0) => return None,
        AgentOutcome::Success => match (code, signal) {
            (Some(code), _) => format!("the agent reported success but exited with code {code}"),
            (None, Some(signal)) => format!("the agent was killed by signal {signal}"),
            (None, None) => "the agent ended abnormally".to_owned(),
        },
        AgentOutcome::MaxTurns => "the agent reached its turn limit (maxTurns)".to_owned(),
        AgentOutcome::MaxBudget => {
            "the agent reached its spending limit (maxCostPerTaskUsd)".to_owned()
        }
        AgentOutcome::Error(e) => format!("the agent failed: {e}"),
        AgentOutcome::Unparseable(why) => {
            let exit = match (code, signal) {
                (Some(code), _) => format!("exit code {code}"),
                (None, Some(signal)) => format!("signal {signal}"),
                (None, None) => "no exit status".to_owned(),
            };
            format!("the agent's output could not be read ({why}; {exit})")
        }
    };
    let stderr = stderr.trim();
    if stderr.is_empty() || report.outcome.is_success() {
        return Some(message);
    }
    let tail: String = {
        let chars: Vec<char> = stderr.chars().collect();
        chars[chars.len().saturating_sub(STDERR_IN_MESSAGE)..]
            .iter()
            .collect()
    };
    Some(format!("{message}; stderr: {tail}"))
}

/// After a successful agent: commit and push (coding), or take the review text (review).
async fn publish(job: &Job, worktree: &Worktree, report: &RunReport) -> Verdict {
    match &job.kind {
        JobKind::Review { .. } => match report.final_text.as_deref().map(str::trim) {
            Some(text) if !text.is_empty() => Verdict::Reviewed {
                text: text.to_owned(),
            },
            _ => Verdict::Failed("the review agent produced no review text".to_owned()),
        },
        JobKind::Coding { commit_message } => {
            let commit = match worktree.commit_all(commit_message).await {
                Ok(Some(commit)) => commit,
                Ok(None) => return Verdict::NoChanges,
                Err(e) => return Verdict::Failed(format!("could not commit the changes: {e}")),
            };
            if let Err(e) = worktree.push(&job.auth).await {
                return Verdict::Failed(format!("the push was refused: {e}"));
            }
            Verdict::Pushed {
                branch: worktree.branch().unwrap_or_default().to_owned(),
                commit,
            }
        }
    }
}

async fn remove_worktree(worktree: Worktree) {
    let path = worktree.path().to_owned();
    if let Err(e) = worktree.remove().await {
        tracing::warn!(worktree = %path.display(), error = %e, "could not remove a worktree");
    }
}

/// An empty directory at `path` (removing what a previous attempt left there).
async fn fresh_dir(path: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir_all(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    tokio::fs::create_dir_all(path).await
}

/// Kills the process group of an agent a dead service left running in `run_dir`, if its
/// recorded process still runs with this run's `HOME` (so a recycled process id is never
/// hit). Linux only; elsewhere nothing happens. A sandboxed agent's recorded process is its
/// `bwrap`, which has the agent's environment: killing its group ends the whole sandbox.
fn stop_orphan(run_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(run_dir.join("agent.pid")) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return;
    };
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return;
    };
    let home = format!("HOME={}", run_dir.join("home").display());
    if environ.split(|b| *b == 0).any(|var| var == home.as_bytes()) {
        tracing::warn!(pid, "stopping the agent of a run whose service died");
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn read_tail_keeps_the_end_and_starts_on_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, "head\n{\"type\":\"result\"}\n").unwrap();
        assert_eq!(
            read_tail(&path, 1000).unwrap(),
            "head\n{\"type\":\"result\"}\n"
        );
        assert_eq!(read_tail(&path, 18).unwrap(), "{\"type\":\"result\"}\n");
        // "é" is two bytes; a cut inside it starts after it.
        std::fs::write(&path, "aé{}").unwrap();
        assert_eq!(read_tail(&path, 3).unwrap(), "{}");
        assert_eq!(read_tail(&path, 4).unwrap(), "é{}");
        assert!(read_tail(&dir.path().join("missing"), 10).is_err());
    }
}
