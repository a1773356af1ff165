//! The agent-run orchestrator (docs/contract.md#22-states-and-transitions, #6-agent-runs): claims queued tasks, hands each to the
//! [`Runner`], keeps its lease alive, and settles the outcome: the pull request opened (or
//! the review posted) and the run recorded with the state change in one transaction.
//!
//! - `runner_step` (the runner loop of [`crate::background`]) fills up to `AGENTRY_MAX_CONCURRENT_RUNS` slots with claimed tasks,
//!   oldest queued first; it is woken when tasks are queued and looks again every few
//!   seconds for tasks queued by other replicas.
//! - While a run goes on, its lease is renewed every third of the lease. A renewal that
//!   fails (the task was cancelled, possibly on another replica, or recovered by someone
//!   else) stops the agent: its process group is killed.
//! - `recovery_step` (the recovery loop) recovers tasks whose lease expired: the dead runner's output is
//!   salvaged if reachable (its cost is recorded as a `lost` run) and the task goes back to
//!   `queued` with the attempt + 1, or `failed` after the third attempt. On SQLite (one
//!   process by design) every lease found at start belongs to a dead process and is
//!   recovered at once. At start, the runs a stopped process left unrecorded in this
//!   runner's directory are recorded with the cost their output shows, whoever recovers
//!   their tasks.
//! - Recording: when the agent ends, its run (cost, tokens, outcome, log) is recorded at
//!   once, while the task is still `running` and before anything is published, so a cost
//!   never depends on this process surviving the publishing, nor on which replica recovers
//!   the task. One run per attempt: a recoverer that salvages the output of an attempt
//!   already recorded records nothing, and a run that ends after its task was recovered
//!   elsewhere is still recorded (its cost was spent) but publishes nothing.
//! - Publishing: a pushed coding run opens the pull request (title = task title with closing
//!   keywords neutralised by [`crate::closing_refs`], body with
//!   `Closes #N`, the task id and the run's cost); an uncertain creation (timeout, 5xx, rate
//!   limit, or a 422) is resolved by looking up the branch's open pull request, so none is
//!   ever opened twice. A review run posts its text as a review carrying a marker, looked
//!   for before every try, so a review is never posted twice either. Failures whose outcome
//!   is unknown are tried again with a doubling wait (the lease is renewed meanwhile) for up
//!   to [`RunSettings::publish_patience`]; only a definite refusal (401, 403, 404, a 422
//!   with no pull request for the branch) or that much failure fails the task.
//!
//! The parts: `claim` (claiming, running a claimed task, renewing its lease), `prepare`
//! (the job and the agent's instructions), `costing` (the run's ledger row and metered
//! cost), `publish` (the pull request or review, exactly once), `settle` (record, publish,
//! transition) and `recovery` (the tasks of runners that died).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

use agentry_agent_network::AgentNetwork;
use agentry_agent_network::gateway::Gateway;
use agentry_codehost::CodeHostError;
use agentry_domain::money::Usd;
use agentry_domain::{PullRequestRef, Task, TaskState, TaskType, Trigger};
use agentry_persistence::metering;
use agentry_persistence::outbox::{self, Action, NewEffect};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::runner::{self as claims, ExpiredLease, RunLog, RunRecorded};
use agentry_persistence::tasks::{self, EventKind, NewTask, Run, RunOutcome, TransitionDetails};
use agentry_persistence::{AnyConnection, Backend, DbError, secrets, write_tx};
use agentry_runner::workspace::{GitAuth, RepoSpec, branch_name, is_loopback_url};
use agentry_runner::{
    AgentSpec, Control, Execution, Job, JobKind, PriceTable, RunReport, Runner, Salvaged, Verdict,
};
use time::OffsetDateTime;
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use uuid::Uuid;

use crate::background::{Pass, StepResult};
use crate::codehost::TOKEN_SECRET;
use crate::wake::Loops;

mod claim;
mod costing;
mod prepare;
mod publish;
mod recovery;
mod settle;

use crate::{Service, ServiceError, now};
use claim::{claim, money_freed, run_task};
use costing::{
    apply_metering, log_warnings, record_run, run_from_report, run_record, with_cost_note,
};
use prepare::{Prepared, Refusal, prepare};
use publish::{Patience, Published, open_pull_request, post_review};
pub(crate) use recovery::{recovery_every, recovery_step};
use settle::{record, settle, settle_without_run};

/// How long a stopped agent has at each step of the stop ladder: after SIGINT (when Claude
/// Code prints what it spent) before SIGTERM, and after SIGTERM before SIGKILL. Two of them
/// fit in the shutdown's wait ([`crate::start::SHUTDOWN_WAIT`]).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long recording a metered run waits for its last calls to be written.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// How the orchestrator behaves: the eight settings read from the environment into
/// [`Config::runs`](crate::config::Config::runs), and the others, which keep their defaults
/// outside tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettings {
    /// `AGENTRY_MAX_CONCURRENT_RUNS`: agent runs at once in this process (default 2, 0–64;
    /// 0 runs no agents, e.g. for an API-only replica).
    pub max_concurrent: usize,
    /// `AGENTRY_RUN_LEASE_SECS`: how long a claimed task stays this process's without a
    /// renewal (default 60 s); a dead process's tasks are recovered after it.
    pub lease: Duration,
    /// `AGENTRY_RUN_TIME_LIMIT_SECS`: wall-time limit of one agent run (default 3600 s).
    pub wall_time: Duration,
    /// How often an idle runner looks for queued tasks it was not woken for.
    pub idle: Duration,
    /// Keep run directories after the run is recorded (for tests that inspect them).
    pub keep_run_dirs: bool,
    /// `AGENTRY_AGENT_SANDBOX`: `auto` (default: agents run in a bubblewrap sandbox and are
    /// refused without one) or `off` (explicit: agents run unsandboxed).
    pub sandbox: agentry_runner::SandboxMode,
    /// `AGENTRY_AGENT_TMP_BYTES`, `AGENTRY_AGENT_MAX_PROCESSES`,
    /// `AGENTRY_AGENT_MAX_OPEN_FILES`, `AGENTRY_AGENT_MAX_FILE_BYTES`,
    /// `AGENTRY_AGENT_MAX_MEMORY_BYTES`, `AGENTRY_AGENT_TOTAL_MEMORY_BYTES`: the resource
    /// limits of sandboxed agents (docs/security.md#resource-limits).
    pub agent_limits: agentry_runner::AgentLimits,
    /// `AGENTRY_SANDBOX_SECCOMP`: `on` (default: sandboxed agents get the seccomp filter
    /// refusing the system calls they never need, docs/security.md#the-seccomp-filter) or
    /// `off` (for tools that need a refused call).
    pub sandbox_seccomp: bool,
    /// `AGENTRY_SANDBOX_EXTRA_RO`: colon-separated absolute paths sandboxed agents also see,
    /// read-only, besides the system's allow-list (a toolchain outside `/usr`, such as
    /// `/opt/toolchain`; docs/security.md#agent-sandbox,
    /// [`agentry_runner::Sandbox::with_extra_ro`]). Never the data directory, one in it or
    /// one holding it. Empty by default.
    pub sandbox_extra_ro: Vec<std::path::PathBuf>,
    /// The user agents run as (docs/security.md#the-agents-user): the service's own, unless
    /// the service runs as root; then `AGENTRY_AGENT_USER` (default `nobody`), or root itself
    /// with `AGENTRY_ALLOW_ROOT=1`. A user that cannot be used refuses agents with its reason.
    pub agent_user: agentry_runner::user::AgentUser,
    /// The first wait before publishing is tried again after a code-host failure whose
    /// outcome is unknown (5xx, timeout, rate limit); it doubles up to 30 s.
    pub publish_backoff: Duration,
    /// How long publishing keeps trying through such failures before the task fails.
    pub publish_patience: Duration,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            max_concurrent: 2,
            lease: Duration::from_secs(60),
            wall_time: Duration::from_secs(3600),
            idle: Duration::from_secs(2),
            keep_run_dirs: false,
            sandbox: agentry_runner::SandboxMode::Auto,
            agent_limits: agentry_runner::AgentLimits::default(),
            sandbox_seccomp: true,
            sandbox_extra_ro: Vec::new(),
            agent_user: agentry_runner::user::AgentUser::Service,
            publish_backoff: Duration::from_secs(1),
            publish_patience: Duration::from_secs(3600),
        }
    }
}

impl RunSettings {
    /// The sandbox these settings describe: its mode, the agents' limits, the extra
    /// read-only paths, seccomp and the agents' user.
    fn sandbox(&self) -> agentry_runner::Sandbox {
        agentry_runner::Sandbox::new(self.sandbox)
            .with_limits(self.agent_limits)
            .with_extra_ro(self.sandbox_extra_ro.clone())
            .with_seccomp(self.sandbox_seccomp)
            .with_agent_user(self.agent_user.clone())
    }
}

/// The orchestrator's state (one per process, in [`Service`]).
pub struct Runs {
    runner: Arc<dyn Runner>,
    settings: RunSettings,
    /// This process's lease owner id.
    owner: String,
    pub(crate) wake: Notify,
    slots: Arc<Semaphore>,
    /// Cancel switches of the runs in progress here.
    active: Mutex<HashMap<Uuid, watch::Sender<bool>>>,
    /// One run of a task at a time in this process.
    turns: TaskTurns,
    stopping: AtomicBool,
    /// The model gateway of sandboxed runs, when agents run sandboxed.
    gateway: Option<Gateway>,
}

/// The network given to sandboxed agents: the service's gateway and egress proxy, and the
/// forwarder the runner starts inside each sandbox (the agentry binary's `sandbox-net`).
#[derive(Debug, Clone)]
pub struct SandboxNetwork {
    /// The gateway and proxy.
    pub network: AgentNetwork,
    /// The forwarder's program and leading arguments.
    pub forwarder: Vec<String>,
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("owner", &self.owner)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Runs {
    /// The orchestrator over `runner`.
    pub fn new(runner: Arc<dyn Runner>, settings: RunSettings) -> Self {
        Runs {
            runner,
            slots: Arc::new(Semaphore::new(settings.max_concurrent)),
            settings,
            owner: format!("agentry-{}", Uuid::new_v4()),
            wake: Notify::new(),
            active: Mutex::new(HashMap::new()),
            turns: TaskTurns::default(),
            stopping: AtomicBool::new(false),
            gateway: None,
        }
    }

    /// The orchestrator over a [`LocalRunner`](agentry_runner::LocalRunner) working under
    /// `root`, launching the agents `claude_bin` and `codex_bin` with this process's `PATH`,
    /// the agents' credential variables and the variables named in `agent_env`
    /// (`AGENTRY_AGENT_ENV`), and pricing token-only output with `prices`. Sandboxed agents
    /// get `network` (the model gateway and egress proxy) when given; without it they share
    /// the service's network and are not metered.
    pub fn local(
        root: std::path::PathBuf,
        claude_bin: std::path::PathBuf,
        codex_bin: std::path::PathBuf,
        prices: PriceTable,
        agent_env: &[String],
        settings: RunSettings,
        network: Option<SandboxNetwork>,
    ) -> Self {
        let gateway = network.as_ref().map(|n| n.network.gateway().clone());
        let runner = agentry_runner::LocalRunner::new(agentry_runner::LocalConfig {
            root,
            claude_bin,
            codex_bin,
            prices,
            env: service_env(agent_env),
            stop_grace: STOP_GRACE,
            sandbox: settings.sandbox(),
            network: network.map(|n| agentry_runner::local::NetworkConfig {
                provider: Arc::new(n.network),
                forwarder: n.forwarder,
            }),
        });
        Runs {
            gateway,
            ..Runs::new(Arc::new(runner), settings)
        }
    }

    /// The orchestrator over a [`KubeRunner`](agentry_runner::kube::KubeRunner): every run a
    /// Kubernetes Job with `settings`, its agent `claude_bin` or `codex_bin` in the agent
    /// image, reaching `network` (the model gateway and egress proxy, which meter every run)
    /// through this replica's pod endpoint; git and the run logs under `root`, the git steps
    /// that read the agent's changes sandboxed as after a local run (with `forwarder`).
    ///
    /// # Errors
    ///
    /// A sentence when the pod endpoint cannot listen.
    #[allow(clippy::too_many_arguments)]
    pub fn kube(
        root: std::path::PathBuf,
        settings: &agentry_runner::kube::KubeSettings,
        claude_bin: std::path::PathBuf,
        codex_bin: std::path::PathBuf,
        prices: PriceTable,
        agent_env: &[String],
        run_settings: RunSettings,
        network: AgentNetwork,
        forwarder: Vec<String>,
    ) -> Result<Self, String> {
        let owner = format!("agentry-{}", Uuid::new_v4());
        let gateway = network.gateway().clone();
        let root_for_git = root.clone();
        let runner = agentry_runner::kube::KubeRunner::new(agentry_runner::kube::KubeConfig {
            root,
            settings: settings.clone(),
            tmp_size: "1Gi".to_owned(),
            replica: owner.clone(),
            claude_bin,
            codex_bin,
            prices,
            env: service_env(agent_env),
            stop_grace: STOP_GRACE,
            network: Arc::new(network),
            // The git steps after the agent run in the service's sandbox, as after a local run.
            git_sandbox: Some(agentry_runner::workspace::GitSandbox {
                sandbox: run_settings.sandbox(),
                data_dir: root_for_git,
                forwarder: Some(forwarder),
            }),
        })?;
        Ok(Runs {
            gateway: Some(gateway),
            owner,
            ..Runs::new(Arc::new(runner), run_settings)
        })
    }

    /// An orchestrator that runs nothing (`max_concurrent` 0), for processes and tests that
    /// serve the API only; the runner under `root` can still read logs and salvage runs.
    pub fn disabled(root: std::path::PathBuf) -> Self {
        Runs::local(
            root,
            "claude".into(),
            "codex".into(),
            PriceTable::builtin(),
            &[],
            RunSettings {
                max_concurrent: 0,
                // Nothing runs, so nothing is sandboxed (and nothing warns about sandboxes).
                sandbox: agentry_runner::SandboxMode::Off,
                ..RunSettings::default()
            },
            None,
        )
    }

    /// The settings.
    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    /// The runner.
    pub fn runner(&self) -> &dyn Runner {
        self.runner.as_ref()
    }

    /// Stops the agent of `task_id` if it runs in this process (after the task was moved to
    /// `cancelled`). Other replicas notice at their next lease renewal.
    pub(crate) fn stop_local(&self, task_id: Uuid) {
        if let Some(cancel) = self.active.lock().get(&task_id) {
            let _ = cancel.send(true);
        }
    }

    /// How many runs are in progress in this process.
    pub fn active(&self) -> usize {
        self.active.lock().len()
    }

    /// Stops every agent of this process without settling its task: the tasks stay leased
    /// and are recovered after the restart (with the cost their output shows). Waits up to
    /// `wait` for the runs to end.
    pub async fn shut_down(&self, wait: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        for cancel in self.active.lock().values() {
            let _ = cancel.send(true);
        }
        let deadline = tokio::time::Instant::now() + wait;
        while self.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What of this process's environment the agents get: the variables named in `agent_env`
/// (`AGENTRY_AGENT_ENV`) besides the runner's own.
fn service_env(agent_env: &[String]) -> agentry_runner::agent::ServiceEnv {
    agentry_runner::agent::ServiceEnv::read(agent_env, |name| std::env::var(name).ok())
}

/// Moves attempt `attempt` of task `id` by `trigger` in a transaction of its own (a step of
/// the run that nothing else is written with): `false`, and nothing changes, when the task
/// is at another attempt by then (cancelled, retried and claimed again meanwhile).
async fn transition(
    service: &Service,
    (id, attempt): (Uuid, i32),
    trigger: Trigger,
    details: TransitionDetails,
) -> Result<bool, ServiceError> {
    service
        .db(move |conn| {
            let moved = tasks::transition_task_at(conn, id, attempt, trigger, &details, now())?;
            Ok(moved.is_some())
        })
        .await
}

/// The waits before a database step of a run is tried again after the database was busy or
/// unreachable ([`ServiceError::Unavailable`]: nothing was written): from half a second,
/// doubling, [`DB_TRIES`] tries in all (about 7.5 s of waits besides the tries' own).
const DB_RETRY: agentry_domain::backoff::Backoff = agentry_domain::backoff::Backoff {
    base: Duration::from_millis(500),
    max: Duration::from_secs(8),
};

/// How many times a database step of a run is tried ([`DB_RETRY`]).
const DB_TRIES: i32 = 5;

/// Runs `step`, a database step of task `task`'s run that writes nothing when it fails, again
/// while it fails because the database is busy or unreachable, at most [`DB_TRIES`] times:
/// a moment's contention (an import holding SQLite's write lock, a PostgreSQL failover)
/// must not stop a running agent, nor leave a finished run to recovery, which would run
/// the agent again.
async fn retrying<T, F, Fut>(task: Uuid, what: &str, mut step: F) -> Result<T, ServiceError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ServiceError>>,
{
    let mut failed = 0;
    loop {
        match step().await {
            Err(ServiceError::Unavailable(why)) if failed + 1 < DB_TRIES => {
                let delay = DB_RETRY.delay(failed);
                tracing::warn!(
                    task = %task, step = what, error = %why,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "the database is unavailable; trying the run's step again"
                );
                tokio::time::sleep(delay).await;
                failed += 1;
            }
            other => return other,
        }
    }
}

fn lease_of(settings: &RunSettings) -> time::Duration {
    time::Duration::try_from(settings.lease).unwrap_or(time::Duration::MINUTE)
}

/// The runs of this process, one at a time per task ([`TaskTurns::turn`]).
#[derive(Debug, Default)]
struct TaskTurns(Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>);

impl TaskTurns {
    /// Waits until no other run of task `id` goes on in this process, and keeps it so
    /// until the returned turn is dropped. A cancelled attempt still stopping (or recording)
    /// here when its task is retried and claimed again by this process shares the task's
    /// worktree, branch and cancel switch with the new attempt: the new one waits for it to
    /// end. (Across replicas each has its own workspaces, and a lost lease stops the old.)
    async fn turn(&self, id: Uuid) -> Turn<'_> {
        let lock = self.0.lock().entry(id).or_default().clone();
        Turn {
            turns: self,
            id,
            guard: Some(lock.lock_owned().await),
        }
    }

    /// How many tasks have a run here, or one waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// A run's turn on its task ([`TaskTurns::turn`]); the task's entry goes when no other run
/// waits for it.
struct Turn<'a> {
    turns: &'a TaskTurns,
    id: Uuid,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.turns.0.lock();
        // Under the map's lock every waiter holds a clone: one count left is the map's own.
        if turns
            .get(&self.id)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            turns.remove(&self.id);
        }
    }
}

/// The runner loop's step (see the module docs): takes a free slot and claims a task into
/// it. Stops when runs are disabled or the service stops.
pub(crate) async fn runner_step(service: &Service) -> StepResult {
    let runs = &service.parts.runs;
    if runs.settings.max_concurrent == 0 {
        return Ok(Pass::Stop);
    }
    let Ok(slot) = runs.slots.clone().acquire_owned().await else {
        return Ok(Pass::Stop);
    };
    if runs.stopping.load(Ordering::SeqCst) {
        return Ok(Pass::Stop);
    }
    let Some(task) = claim(service).await? else {
        return Ok(Pass::Idle);
    };
    let service = service.clone();
    tokio::spawn(async move {
        run_task(&service, task).await;
        money_freed(&service).await;
        drop(slot);
        service.wake(Loops::RUNNER);
    });
    Ok(Pass::Again)
}

/// Whether `state` is one a run could still leave (for the log endpoint's live view).
pub(crate) fn is_running(state: TaskState) -> bool {
    matches!(state, TaskState::Provisioning | TaskState::Running)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs of one task take turns, runs of other tasks do not wait, and the task's
    /// entry goes with its last run.
    #[tokio::test]
    async fn runs_of_one_task_take_turns() {
        let turns = TaskTurns::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let first = turns.turn(a).await;
        let other = turns.turn(b).await;
        let mut second = Box::pin(turns.turn(a));
        assert!(
            futures_util::poll!(second.as_mut()).is_pending(),
            "the second run of a task waits for the first"
        );
        drop(first);
        let second = second.await;
        assert_eq!(turns.len(), 2);
        drop(other);
        drop(second);
        assert_eq!(turns.len(), 0);
    }
}
