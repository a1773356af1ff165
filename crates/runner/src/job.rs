//! The seam between the service and whatever executes agent runs: a [`Job`] goes in, an
//! [`Execution`] comes out.
//!
//! The service claims the task, turns it into a [`Job`] and hands it to a [`Runner`]; the
//! runner prepares the workspace, runs the agent and, for a coding task, commits and pushes
//! the branch; the service then opens the pull request (or posts the review) and records the
//! run and the state change in one transaction. Claiming and the code-host API calls stay in
//! the service because they are the same whatever executes the job; what a runner does is
//! what a Kubernetes Job would do in its pod. [`crate::local::LocalRunner`] runs jobs as
//! local processes.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agentry_domain::AgentType;
use time::OffsetDateTime;
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use crate::RunReport;
use crate::agent::AgentSpec;
use crate::process::Ended;
use crate::workspace::{GitAuth, RepoSpec};

/// What a job works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobKind {
    /// A coding task: a new branch from the default branch, pushed when the agent changed
    /// something.
    Coding {
        /// The commit message of the agent's changes.
        commit_message: String,
    },
    /// A review task: the pull request's head branch, checked out read-only; the agent's
    /// final text is the review.
    Review {
        /// The pull request's head branch.
        branch: String,
    },
    /// A revision of a coding task's open pull request: its head branch checked out, the
    /// agent's changes committed on top and pushed as a fast-forward (never a force push),
    /// so the pull request keeps its number and its history.
    Revision {
        /// The pull request's head branch.
        branch: String,
        /// The commit message of the agent's changes.
        commit_message: String,
    },
}

/// One agent run to execute.
#[derive(Debug, Clone)]
pub struct Job {
    /// The task.
    pub task_id: Uuid,
    /// The task's attempt this run belongs to.
    pub attempt: i32,
    /// Coding or review, with what each needs.
    pub kind: JobKind,
    /// The repository.
    pub repo: RepoSpec,
    /// The agent and its limits.
    pub agent: AgentSpec,
    /// The instructions given to the agent.
    pub prompt: String,
    /// How git authenticates to the repository.
    pub auth: GitAuth,
    /// The run's wall-time limit.
    pub wall_time: Duration,
}

/// How the service steers a job while it runs.
#[derive(Debug)]
pub struct Control {
    /// Becomes `true` when the job must stop (the task was cancelled, or this process lost
    /// the task's lease): the agent's process group is killed.
    pub cancel: watch::Receiver<bool>,
    /// Fired once the workspace is ready and the agent process started.
    pub started: Option<oneshot::Sender<()>>,
}

/// How a job ended, as far as the runner can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Coding: the agent succeeded and its changes were committed and pushed.
    Pushed {
        /// The branch pushed.
        branch: String,
        /// The commit at its head.
        commit: String,
    },
    /// Coding: the agent succeeded but changed nothing.
    NoChanges,
    /// Review: the agent succeeded; its final text is the review.
    Reviewed {
        /// The review's text.
        text: String,
    },
    /// The job failed; the sentence says why (for `errorMessage`).
    Failed(String),
    /// The job was stopped through [`Control::cancel`].
    Cancelled,
    /// The agent ran past the wall-time limit and was killed.
    TimedOut(String),
}

/// The result of a job.
#[derive(Debug, Clone)]
pub struct Execution {
    /// How it ended.
    pub verdict: Verdict,
    /// The agent that ran.
    pub agent_type: AgentType,
    /// What the agent's output reported (cost, tokens, model…); `None` when no agent ran.
    pub report: Option<RunReport>,
    /// How the agent process ended; `None` when it never started.
    pub ended: Option<Ended>,
    /// The agent's output (its stdout; stderr's tail appended after a marker line when the
    /// agent failed).
    pub output: String,
    /// Whether the agent ran (or would have run) inside the sandbox
    /// ([`crate::sandbox`]); `false` when agents run unsandboxed
    /// (`AGENTRY_AGENT_SANDBOX=off`) or the sandbox was unavailable and nothing ran.
    pub sandboxed: bool,
    /// Whether the run had a network of its own ([`crate::network`]): it was opened, so
    /// the agent's model calls (if it got to make any) went through the service's model
    /// gateway, which metered them. `false` for a run without one (unsandboxed, no network
    /// configured) or whose network could not be opened.
    pub metered: bool,
    /// When the job started.
    pub started_at: OffsetDateTime,
    /// When it ended.
    pub finished_at: OffsetDateTime,
}

impl Execution {
    /// The process exit code, when the agent exited by itself.
    pub fn exit_code(&self) -> Option<i32> {
        match &self.ended {
            Some(Ended::Exited { code, .. }) => *code,
            _ => None,
        }
    }
}

/// What a dead run left: its output and the report read from it (and from whatever else
/// the agent recorded, such as Codex's session files).
#[derive(Debug, Clone)]
pub struct Salvaged {
    /// The end of the agent's output.
    pub output: String,
    /// What it reported.
    pub report: RunReport,
    /// Whether the run's network was opened (its run directory has its `net` directory,
    /// made by the runner before the agent started): its model calls went through the
    /// gateway, so its cost is that of its metered calls, never the figure it printed.
    pub metered: bool,
}

/// A boxed future of an [`Execution`].
pub type ExecutionFuture<'a> = Pin<Box<dyn Future<Output = Execution> + Send + 'a>>;

/// Something that executes agent runs: prepares the workspace, runs the agent, pushes.
///
/// Implementations must always return an [`Execution`] (failures are a
/// [`Verdict::Failed`], never a panic) and must leave nothing running when they return.
pub trait Runner: Send + Sync {
    /// Executes `job` under `control`.
    fn execute(&self, job: Job, control: Control) -> ExecutionFuture<'_>;

    /// The output so far of a run in progress (the live log), if this runner has it.
    fn live_output(&self, task_id: Uuid, attempt: i32) -> Option<String> {
        let _ = (task_id, attempt);
        None
    }

    /// What a run of `agent` whose service died left behind: stops its leftover processes
    /// on this machine and returns its output and what it shows (cost, tokens), if this
    /// runner can reach them, so the run's cost is not lost. It stops nothing another
    /// process may still own (a Kubernetes Job): that is [`Runner::reap`]'s, once the run's
    /// lease is taken.
    fn salvage(&self, task_id: Uuid, attempt: i32, agent: &AgentSpec) -> Option<Salvaged> {
        let _ = (task_id, attempt, agent);
        None
    }

    /// Stops what is left of a run whose lease this process has just taken from a process
    /// that stopped renewing it (the recovery's compare-and-set won): the run is nobody's any
    /// more. Never called while the run's owner may still renew its lease.
    fn reap(&self, task_id: Uuid, attempt: i32) {
        let _ = (task_id, attempt);
    }

    /// Forgets a run once the service recorded it (its output is in the database).
    fn discard(&self, task_id: Uuid, attempt: i32) {
        let _ = (task_id, attempt);
    }

    /// The runs (task, attempt) this runner still holds something of: at start, before any
    /// run, what a previous process left behind.
    fn leftovers(&self) -> Vec<(Uuid, i32)> {
        Vec::new()
    }
}
