//! The agent-run orchestrator (docs/contract.md#22-states-and-transitions, #6-agent-runs): claims queued tasks, hands each to the
//! [`Runner`], keeps its lease alive, and settles the outcome: the pull request opened (or
//! the review posted) and the run recorded with the state change in one transaction.
//!
//! - [`runner_loop`] fills up to `AGENTRY_MAX_CONCURRENT_RUNS` slots with claimed tasks,
//!   oldest queued first; it is woken when tasks are queued and looks again every few
//!   seconds for tasks queued by other replicas.
//! - While a run goes on, its lease is renewed every third of the lease. A renewal that
//!   fails (the task was cancelled, possibly on another replica, or recovered by someone
//!   else) stops the agent: its process group is killed.
//! - [`recovery_loop`] recovers tasks whose lease expired: the dead runner's output is
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

use crate::agent_network::AgentNetwork;
use crate::codehost::TOKEN_SECRET;
use crate::gateway::Gateway;
use crate::wake::Loops;

mod recovery;

use crate::{Service, ServiceError};
pub use recovery::recovery_loop;

/// How long a stopped agent has at each step of the stop ladder: after SIGINT (when Claude
/// Code prints what it spent) before SIGTERM, and after SIGTERM before SIGKILL. Two of them
/// fit in the shutdown's wait ([`crate::start::SHUTDOWN_WAIT`]).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long recording a metered run waits for its last calls to be written.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// How the orchestrator behaves.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Agent runs at once in this process (`AGENTRY_MAX_CONCURRENT_RUNS`); 0 runs none.
    pub max_concurrent: usize,
    /// How long a claim lasts without renewal (`AGENTRY_RUN_LEASE_SECS`).
    pub lease: Duration,
    /// Wall-time limit of one run (`AGENTRY_RUN_TIME_LIMIT_SECS`).
    pub wall_time: Duration,
    /// How often an idle runner looks for queued tasks it was not woken for.
    pub idle: Duration,
    /// Keep run directories after the run is recorded (for tests that inspect them).
    pub keep_run_dirs: bool,
    /// Whether agents run sandboxed (`AGENTRY_AGENT_SANDBOX`).
    pub sandbox: agentry_runner::SandboxMode,
    /// The resource limits of sandboxed agents (`AGENTRY_AGENT_TMP_BYTES`,
    /// `AGENTRY_AGENT_MAX_*`).
    pub agent_limits: agentry_runner::AgentLimits,
    /// Whether sandboxed agents get the seccomp filter (`AGENTRY_SANDBOX_SECCOMP`).
    pub sandbox_seccomp: bool,
    /// The user agents run as (`AGENTRY_AGENT_USER`, `AGENTRY_ALLOW_ROOT`).
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
            agent_user: agentry_runner::user::AgentUser::Service,
            publish_backoff: Duration::from_secs(1),
            publish_patience: Duration::from_secs(3600),
        }
    }
}

/// The orchestrator's state (one per process, in [`Service`]).
pub struct Runs {
    runner: Arc<dyn Runner>,
    settings: RunSettings,
    /// This process's lease owner id.
    owner: String,
    wake: Notify,
    slots: Arc<Semaphore>,
    /// Cancel switches of the runs in progress here.
    active: Mutex<HashMap<Uuid, watch::Sender<bool>>>,
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
        Runs::local_with_extra_ro(
            root,
            claude_bin,
            codex_bin,
            prices,
            agent_env,
            settings,
            Vec::new(),
            network,
        )
    }

    /// [`Runs::local`], sandboxed agents also seeing `extra_ro` read-only
    /// (`AGENTRY_SANDBOX_EXTRA_RO`, [`agentry_runner::Sandbox::with_extra_ro`]).
    #[allow(clippy::too_many_arguments, reason = "Runs::local's, plus one")]
    pub fn local_with_extra_ro(
        root: std::path::PathBuf,
        claude_bin: std::path::PathBuf,
        codex_bin: std::path::PathBuf,
        prices: PriceTable,
        agent_env: &[String],
        settings: RunSettings,
        extra_ro: Vec<std::path::PathBuf>,
        network: Option<SandboxNetwork>,
    ) -> Self {
        let gateway = network.as_ref().map(|n| n.network.gateway().clone());
        let runner = agentry_runner::LocalRunner::new(agentry_runner::LocalConfig {
            root,
            claude_bin,
            codex_bin,
            prices,
            env: agentry_runner::agent::ServiceEnv::read(agent_env, |name| {
                std::env::var(name).ok()
            }),
            stop_grace: STOP_GRACE,
            sandbox: agentry_runner::Sandbox::new(settings.sandbox)
                .with_limits(settings.agent_limits)
                .with_extra_ro(extra_ro)
                .with_seccomp(settings.sandbox_seccomp)
                .with_agent_user(settings.agent_user.clone()),
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

    /// Tells the runner loop that tasks were queued.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Stops the agent of `task_id` if it runs in this process (after the task was moved to
    /// `cancelled`). Other replicas notice at their next lease renewal.
    pub fn stop_local(&self, task_id: Uuid) {
        if let Some(cancel) = lock(&self.active).get(&task_id) {
            let _ = cancel.send(true);
        }
    }

    /// How many runs are in progress in this process.
    pub fn active(&self) -> usize {
        lock(&self.active).len()
    }

    /// Stops every agent of this process without settling its task: the tasks stay leased
    /// and are recovered after the restart (with the cost their output shows). Waits up to
    /// `wait` for the runs to end.
    pub async fn shut_down(&self, wait: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        for cancel in lock(&self.active).values() {
            let _ = cancel.send(true);
        }
        let deadline = tokio::time::Instant::now() + wait;
        while self.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now() -> OffsetDateTime {
    agentry_persistence::now()
}

fn lease_of(settings: &RunSettings) -> time::Duration {
    time::Duration::try_from(settings.lease).unwrap_or(time::Duration::MINUTE)
}

/// The runner loop (see the module docs). Returns at once when runs are disabled.
pub async fn runner_loop(service: Service) {
    let runs = &service.parts.runs;
    if runs.settings.max_concurrent == 0 {
        return;
    }
    loop {
        let Ok(slot) = runs.slots.clone().acquire_owned().await else {
            return;
        };
        if runs.stopping.load(Ordering::SeqCst) {
            return;
        }
        match claim(&service).await {
            Ok(Some(task)) => {
                let service = service.clone();
                tokio::spawn(async move {
                    run_task(&service, task).await;
                    money_freed(&service).await;
                    drop(slot);
                    service.wake(Loops::RUNNER);
                });
                continue;
            }
            Ok(None) => drop(slot),
            Err(e) => {
                drop(slot);
                tracing::warn!(error = %e, "could not claim a task");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(runs.settings.idle) => {}
            () = runs.wake.notified() => {}
        }
    }
}

async fn claim(service: &Service) -> Result<Option<Task>, ServiceError> {
    let owner = service.parts.runs.owner.clone();
    let lease = lease_of(&service.parts.runs.settings);
    service
        .db(move |conn| Ok(claims::claim_next(conn, &owner, now(), lease)?))
        .await
}

impl Service {
    /// Claims the oldest queued task and runs it to its end; returns its id, or `None` when
    /// nothing was queued. (The loop does the same with several slots; tests use this.)
    pub async fn run_next(&self) -> Result<Option<Uuid>, ServiceError> {
        let Some(task) = claim(self).await? else {
            return Ok(None);
        };
        let id = task.id;
        run_task(self, task).await;
        money_freed(self).await;
        Ok(Some(id))
    }
}

/// After a run's reserve went back (the run ended, was recovered or cancelled): the tasks a
/// budget blocked are candidates again, and the next claim decides anew with what is left.
async fn money_freed(service: &Service) {
    let unblocked = service
        .db(|conn| Ok(agentry_persistence::budgets::unblock(conn, None)?))
        .await;
    match unblocked {
        Ok(0) => {}
        Ok(n) => tracing::debug!(tasks = n, "blocked tasks are candidates again"),
        Err(e) => tracing::warn!(error = %e, "could not unblock tasks after a run"),
    }
    // The run's cost is recorded: a budget may have reached an alert threshold.
    service.check_budget_alerts_logged().await;
}

/// What a run needs besides the job.
struct Prepared {
    job: Job,
    repo: Repository,
    /// A review task's coding task (with its pull request).
    parent: Option<Task>,
    token: secrets::SecretValue,
}

/// Runs one claimed task to its end. Never fails: problems become the task's failure.
async fn run_task(service: &Service, task: Task) {
    let id = task.id;
    let attempt = task.attempt;
    tracing::info!(task = %id, attempt, kind = task.task_type.as_str(), "run started");
    let prepared = {
        let key = service.parts.codehost.master_key().clone();
        let task = task.clone();
        let settings = service.parts.runs.settings.clone();
        // Local clone URLs only when the code host is a local fake (tests).
        let allow_local = is_loopback_url(service.parts.codehost.api_url());
        service
            .db(move |conn| prepare(conn, &key, &task, &settings, allow_local))
            .await
    };
    let prepared = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(refusal)) => {
            settle_without_run(service, &task, &refusal).await;
            return;
        }
        Err(e) => {
            // The database is unreachable: leave the lease to expire; recovery requeues.
            tracing::error!(task = %id, error = %e, "could not prepare a run");
            return;
        }
    };
    let (cancel, cancelled) = watch::channel(false);
    lock(&service.parts.runs.active).insert(id, cancel.clone());
    let (started, on_start) = oneshot::channel();
    let renewer = tokio::spawn(renew_lease(service.clone(), id, cancel.clone()));
    let running = {
        let service = service.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if on_start.await.is_err() {
                return;
            }
            let moved = service
                .db(move |conn| {
                    Ok(tasks::transition_task(
                        conn,
                        id,
                        Trigger::AgentStarted,
                        &TransitionDetails::default(),
                        now(),
                    )?)
                })
                .await;
            if let Err(e) = moved {
                tracing::info!(task = %id, error = %e, "the task left provisioning; stopping the agent");
                let _ = cancel.send(true);
            }
        })
    };
    let control = Control {
        cancel: cancelled,
        started: Some(started),
    };
    let execution = service
        .parts
        .runs
        .runner
        .execute(prepared.job.clone(), control)
        .await;
    let _ = running.await;
    if service.parts.runs.stopping.load(Ordering::SeqCst) {
        // Shutting down: the task stays leased and is recovered after the restart, with
        // the cost its output shows.
        renewer.abort();
        lock(&service.parts.runs.active).remove(&id);
        return;
    }
    // The lease is still renewed while the outcome is published (which may wait out a
    // failing code host); a refused renewal (cancelled, or recovered elsewhere) stops that.
    let settled = settle(service, &task, &prepared, execution, cancel.subscribe()).await;
    renewer.abort();
    lock(&service.parts.runs.active).remove(&id);
    match settled {
        Ok(()) => {
            if !service.parts.runs.settings.keep_run_dirs {
                service.parts.runs.runner.discard(id, attempt);
            }
        }
        Err(e) => {
            tracing::error!(task = %id, error = %e, "could not record a run; it is recovered when its lease expires");
        }
    }
}

/// Reads what the job needs; `Err` is why the task cannot run at all.
fn prepare(
    conn: &mut AnyConnection,
    key: &secrets::MasterKey,
    task: &Task,
    settings: &RunSettings,
    allow_local: bool,
) -> Result<Result<Prepared, String>, ServiceError> {
    let Some(repo_id) = task.repo_id else {
        return Ok(Err("the task's repository is not connected".into()));
    };
    let repo = repos::get_repository(conn, repo_id)?;
    if repo.disconnected_at.is_some() {
        return Ok(Err(format!("the repository {} was disconnected", repo.url)));
    }
    let Some(token) = secrets::get(conn, key, TOKEN_SECRET).map_err(ServiceError::from)? else {
        return Ok(Err(format!(
            "no code-host token is stored (PUT /api/secrets/{TOKEN_SECRET})"
        )));
    };
    let s = &repo.settings;
    let budget = match s.max_cost_per_task_usd {
        None => None,
        Some(cap) => {
            let spent = task.cost_usd.map_or(0, Usd::to_nanos);
            let left = cap.to_nanos().saturating_sub(spent);
            if left <= 0 {
                return Ok(Err(format!(
                    "the task has spent its cost limit of {cap} USD (maxCostPerTaskUsd)"
                )));
            }
            Usd::from_nanos(left).ok()
        }
    };
    // The monthly budgets' share, reserved when the task was claimed: the run may spend the
    // least of the two.
    let budget = match (
        budget,
        agentry_persistence::budgets::reserve_of(conn, task.id)?,
    ) {
        (Some(cap), Some(reserve)) => Some(cap.min(reserve)),
        (cap, reserve) => cap.or(reserve),
    };
    let (kind, agent, prompt, parent) = match task.task_type {
        TaskType::Coding if task.revision().is_some() => {
            let Some(number) = task.pr_number else {
                return Ok(Err("a revision of a task without a pull request".into()));
            };
            let feedback = crate::revisions::round_feedback(conn, task)?;
            (
                JobKind::Revision {
                    branch: branch_name(task.id),
                    commit_message: format!(
                        "Revise: {}\n\nagentry task {} (revision {})",
                        crate::closing_refs::neutralise(&task.title),
                        task.id,
                        task.revisions
                    ),
                },
                AgentSpec {
                    agent_type: task.agent_type,
                    model: s.model_for(task.agent_type, false).to_owned(),
                    max_turns: s.max_turns_coding,
                    max_budget_usd: budget,
                },
                revision_prompt(&repo, task, number, &feedback),
                None,
            )
        }
        TaskType::Coding => (
            JobKind::Coding {
                // The title cannot close other issues (crate::closing_refs).
                commit_message: format!(
                    "{}\n\nagentry task {}",
                    crate::closing_refs::neutralise(&task.title),
                    task.id
                ),
            },
            AgentSpec {
                agent_type: task.agent_type,
                model: s.model_for(task.agent_type, false).to_owned(),
                max_turns: s.max_turns_coding,
                max_budget_usd: budget,
            },
            coding_prompt(task),
            None,
        ),
        TaskType::Review => {
            let Some(parent_id) = task.parent_task_id else {
                return Ok(Err("a review task without its coding task".into()));
            };
            let parent = tasks::get_task(conn, parent_id)?;
            let Some(number) = parent.pr_number else {
                return Ok(Err("the reviewed task has no pull request".into()));
            };
            (
                JobKind::Review {
                    branch: branch_name(parent.id),
                },
                AgentSpec {
                    agent_type: task.agent_type,
                    model: s.model_for(task.agent_type, true).to_owned(),
                    max_turns: Some(s.max_turns_review),
                    max_budget_usd: budget,
                },
                review_prompt(&repo, &parent, number),
                Some(parent),
            )
        }
    };
    let job = Job {
        task_id: task.id,
        attempt: task.attempt,
        kind,
        repo: RepoSpec {
            key: repo.id.to_string(),
            clone_url: repo.clone_url.clone(),
            default_branch: repo.default_branch.clone(),
            host: repo.url.host().to_owned(),
            allow_local,
        },
        agent,
        prompt,
        auth: GitAuth::token(token.expose()),
        wall_time: settings.wall_time,
    };
    Ok(Ok(Prepared {
        job,
        repo,
        parent,
        token,
    }))
}

/// The coding agent's instructions: the task's title, then its prompt (the issue body).
fn coding_prompt(task: &Task) -> String {
    if task.prompt.trim().is_empty() {
        task.title.clone()
    } else {
        format!("{}\n\n{}", task.title, task.prompt)
    }
}

/// A revision's instructions: the task, then every review and comment that asked for
/// changes in this round (the runner adds what the pull request changes so far).
fn revision_prompt(
    repo: &Repository,
    task: &Task,
    number: i64,
    feedback: &[agentry_persistence::revisions::Feedback],
) -> String {
    use agentry_persistence::revisions::FeedbackSource;
    let mut prompt = format!(
        "You opened pull request #{number} of {url} for the task below, and reviewers asked          for changes. Its branch is checked out here with the work so far; make the changes          they ask for on top of it (do not start over). Your changes are committed and pushed          to the same pull request.\n\n## The task\n\n{task}\n\n## What the reviewers asked for\n",
        url = repo.url,
        task = coding_prompt(task),
    );
    for f in feedback {
        let what = match (f.source, &f.path, f.line) {
            (FeedbackSource::Review, _, _) => "Review".to_owned(),
            (FeedbackSource::AgentReview, _, _) => "Automated review".to_owned(),
            (FeedbackSource::ReviewComment, Some(path), Some(line)) => {
                format!("Comment on `{path}` line {line}")
            }
            (FeedbackSource::ReviewComment, Some(path), None) => format!("Comment on `{path}`"),
            _ => "Comment".to_owned(),
        };
        prompt.push_str(&format!(
            "\n### {what} by @{author} ({url})\n\n{body}\n",
            author = f.author,
            url = f.url,
            body = f.body.trim(),
        ));
    }
    prompt
}

/// The review agent's instructions.
fn review_prompt(repo: &Repository, parent: &Task, number: i64) -> String {
    format!(
        "Review pull request #{number} of {url}: \"{title}\".\n\
         The pull request's branch is checked out here; see its changes with \
         `git diff origin/{base}...HEAD`.\n\n\
         The task it implements:\n{prompt}\n\n\
         Write a concise code review: correctness problems first, then risks and missing \
         tests. Do not change any file. Your final message is posted on the pull request as \
         the review.",
        url = repo.url,
        title = parent.title,
        base = repo.default_branch,
        prompt = coding_prompt(parent),
    )
}

/// Renews the lease every third of its length; a refused renewal stops the agent.
async fn renew_lease(service: Service, id: Uuid, cancel: watch::Sender<bool>) {
    let every = service.parts.runs.settings.lease / 3;
    let lease = lease_of(&service.parts.runs.settings);
    loop {
        tokio::time::sleep(every).await;
        let owner = service.parts.runs.owner.clone();
        let renewed = service
            .db(move |conn| Ok(claims::renew_lease(conn, id, &owner, now() + lease)?))
            .await;
        match renewed {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(task = %id, "the task is no longer this runner's (cancelled or recovered); stopping the agent");
                let _ = cancel.send(true);
                return;
            }
            Err(e) => tracing::warn!(task = %id, error = %e, "could not renew a lease"),
        }
    }
}

/// Fails a task that could not run at all (no agent ran, so no run is recorded).
async fn settle_without_run(service: &Service, task: &Task, message: &str) {
    let id = task.id;
    let details = TransitionDetails {
        reason: Some(message.to_owned()),
        error_message: Some(message.to_owned()),
        pull_request: None,
    };
    let failed = service
        .db(move |conn| {
            Ok(tasks::transition_task(
                conn,
                id,
                Trigger::Fail,
                &details,
                now(),
            )?)
        })
        .await;
    match failed {
        Ok(_) => tracing::warn!(task = %id, reason = message, "task failed before its agent ran"),
        Err(e) => tracing::info!(task = %id, error = %e, "could not fail a task"),
    }
}

/// The ledger row of an execution. A metered run's cost comes from its metered calls
/// ([`apply_metering`]), so its message carries no note about the agent's own figure.
fn run_record(task: &Task, job: &Job, execution: &Execution, outcome: RunOutcome) -> Run {
    let report = execution.report.as_ref();
    let note = |message: String| {
        if execution.metered {
            message
        } else {
            with_cost_note(message, report)
        }
    };
    let error_message = match &execution.verdict {
        Verdict::Failed(m) | Verdict::TimedOut(m) => Some(note(m.clone())),
        Verdict::NoChanges => Some(note("the agent made no changes".to_owned())),
        Verdict::Cancelled => Some(note("the run was cancelled".to_owned())),
        Verdict::Pushed { .. } | Verdict::Reviewed { .. } => None,
    };
    run_from_report(
        task,
        job.agent.model.clone(),
        execution,
        report,
        outcome,
        error_message,
    )
}

fn run_from_report(
    task: &Task,
    launched_model: String,
    execution: &Execution,
    report: Option<&RunReport>,
    outcome: RunOutcome,
    error_message: Option<String>,
) -> Run {
    let cache_read = report.map_or(0, |r| r.cache_read_tokens);
    let cache_write = report.map_or(0, |r| r.cache_write_tokens);
    let all_input = report.map_or(0, |r| r.input_tokens);
    Run {
        id: Uuid::new_v4(),
        task_id: task.id,
        attempt: task.attempt,
        agent_type: execution.agent_type,
        model: report
            .and_then(|r| r.model.clone())
            .or(Some(launched_model)),
        cost_usd: report.and_then(|r| r.cost_usd),
        // The ledger keeps uncached input apart; the task's input total adds the cache.
        input_tokens: all_input
            .saturating_sub(cache_read)
            .saturating_sub(cache_write)
            .max(0),
        cache_read_tokens: cache_read,
        cache_write_tokens: cache_write,
        output_tokens: report.map_or(0, |r| r.output_tokens),
        turns: report.and_then(|r| r.turns),
        outcome,
        exit_code: execution.exit_code(),
        error_message,
        started_at: execution.started_at,
        finished_at: Some(execution.finished_at),
        sandboxed: Some(execution.sandboxed),
        model_calls: None,
        reported_cost_usd: report.and_then(|r| r.cost_usd),
    }
}

/// The least difference between a metered cost and the agent's own figure that is more than
/// rounding: 0.5 % of the larger, and at least one micro-dollar.
fn mismatch_tolerance(a: Usd, b: Usd) -> rust_decimal::Decimal {
    let larger = a.as_decimal().max(b.as_decimal());
    (larger * rust_decimal::Decimal::new(5, 3)).max(rust_decimal::Decimal::new(1, 6))
}

/// Makes `run` a metered run: its cost and tokens are those of its metered calls
/// (`totals`), what the agent printed is kept as `reported_cost_usd`. Returns the text of a
/// `cost_mismatch` event when the two differ beyond rounding.
fn apply_metering(run: &mut Run, totals: &metering::RunTotals) -> Option<String> {
    let reported = run.cost_usd;
    run.reported_cost_usd = reported;
    run.model_calls = Some(totals.calls);
    run.cost_usd = totals.cost_usd;
    run.input_tokens = totals.input_tokens;
    run.cache_read_tokens = totals.cache_read_tokens;
    run.cache_write_tokens = totals.cache_write_tokens;
    run.output_tokens = totals.output_tokens;
    if totals.cost_usd.is_none() {
        let why = format!(
            "its cost is unknown: model {} has no price (add it to AGENTRY_PRICES_FILE)",
            totals.unpriced.join(", ")
        );
        run.error_message = Some(match run.error_message.take() {
            Some(message) => format!("{message}; {why}"),
            None => why,
        });
    }
    match (totals.cost_usd, reported) {
        (Some(metered), Some(reported))
            if (metered.as_decimal() - reported.as_decimal()).abs()
                > mismatch_tolerance(metered, reported) =>
        {
            Some(format!(
                "cost_mismatch: attempt {} metered {metered} USD over {} model calls, but the \
                 agent reported {reported} USD; the metered cost is recorded",
                run.attempt, totals.calls
            ))
        }
        _ => None,
    }
}

/// Records `run` (see [`claims::record_finished_run`]); a metered run's cost is first made
/// that of its metered calls, and a `cost_mismatch` event noted when the agent's own figure
/// differs. Returns how it was recorded and the cost recorded.
fn record_run(
    conn: &mut AnyConnection,
    mut run: Run,
    metered: bool,
    log: &RunLog,
) -> Result<(RunRecorded, Option<Usd>), ServiceError> {
    let mismatch = if metered {
        let totals = metering::run_totals(conn, run.task_id, run.attempt)?;
        apply_metering(&mut run, &totals)
    } else {
        None
    };
    let recorded = claims::record_finished_run(conn, &run, log, now())?;
    if let Some(text) = mismatch
        && recorded != RunRecorded::AlreadyRecorded
    {
        tracing::warn!(task = %run.task_id, attempt = run.attempt, "{text}");
        tasks::record_note(conn, run.task_id, EventKind::CostMismatch, &text, now())?;
    }
    Ok((recorded, run.cost_usd))
}

/// `message`, and when the run's cost is unknown, why (so the task says why its cost is
/// null, never a silent $0).
fn with_cost_note(message: String, report: Option<&RunReport>) -> String {
    match report {
        Some(report) if report.cost_usd.is_none() => {
            let why = report
                .cost_unknown
                .as_deref()
                .unwrap_or("the agent reported none");
            format!("{message}; its cost is unknown: {why}")
        }
        _ => message,
    }
}

/// Logs what the output parser could not make sense of (an unpriced model, lines that are
/// not JSON, a missing result), so an operator sees why a run's cost is null.
fn log_warnings(task: &Task, report: Option<&RunReport>) {
    for warning in report.map(|r| r.warnings.as_slice()).unwrap_or_default() {
        tracing::warn!(task = %task.id, attempt = task.attempt, %warning, "agent output");
    }
}

/// What the settling transaction does besides recording the run.
struct Settlement {
    trigger: Option<(Trigger, TransitionDetails)>,
    review: Option<NewTask>,
    /// What agentry says on the pull request (a revision that changed nothing or failed).
    reply: Option<Action>,
}

/// The coding task's work is on its pull request (opened, or a revision pushed to it):
/// `pr_opened`, and the review task when the repository reviews automatically.
fn published(
    prepared: &Prepared,
    task: &Task,
    pull_request: PullRequestRef,
    reason: String,
) -> Settlement {
    Settlement {
        trigger: Some((
            Trigger::PullRequestOpened,
            TransitionDetails {
                reason: Some(reason),
                error_message: None,
                pull_request: Some(pull_request),
            },
        )),
        review: prepared
            .repo
            .settings
            .auto_review
            .then(|| review_task(task, &prepared.repo)),
        reply: None,
    }
}

fn fail_with(message: String) -> Settlement {
    Settlement {
        trigger: Some((
            Trigger::Fail,
            TransitionDetails {
                reason: Some(message.clone()),
                error_message: Some(message),
                pull_request: None,
            },
        )),
        review: None,
        reply: None,
    }
}

/// Records the run, publishes what it produced, then makes the state change.
///
/// The run (its cost) is recorded first, as soon as the agent's result is known, so that no
/// cost depends on this process surviving the publishing or on which replica recovers the
/// task. Publishing then waits out code-host failures whose outcome is unknown; only a
/// definite refusal fails the task.
async fn settle(
    service: &Service,
    task: &Task,
    prepared: &Prepared,
    execution: Execution,
    cancel: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    let outcome = match &execution.verdict {
        Verdict::Pushed { .. } | Verdict::Reviewed { .. } | Verdict::NoChanges => {
            RunOutcome::Succeeded
        }
        Verdict::Failed(_) => RunOutcome::Failed,
        Verdict::Cancelled => RunOutcome::Cancelled,
        Verdict::TimedOut(_) => RunOutcome::TimedOut,
    };
    let run = run_record(task, &prepared.job, &execution, outcome);
    log_warnings(task, execution.report.as_ref());
    let log = RunLog::of(&execution.output);
    let id = task.id;
    let attempt = task.attempt;
    let metered = execution.metered;
    if metered
        && let Some(gateway) = &service.parts.runs.gateway
        && !gateway.drain(id, attempt, DRAIN_WAIT).await
    {
        tracing::warn!(task = %id, attempt, "metered calls of the run are still being written; recording what is there");
    }
    let (recorded, cost) = service
        .db(move |conn| record_run(conn, run, metered, &log))
        .await?;
    match recorded {
        RunRecorded::Current => {}
        RunRecorded::Late => {
            tracing::warn!(task = %id, attempt, "the task was recovered elsewhere during the run; its cost is recorded, its outcome not published");
            return Ok(());
        }
        RunRecorded::AlreadyRecorded => {
            tracing::info!(task = %id, attempt, "the run was already recorded by a recoverer; nothing is published");
            return Ok(());
        }
    }
    // The reserve went back with the recording: blocked tasks may run now.
    money_freed(service).await;
    let mut patience = Patience::new(&service.parts.runs.settings, cancel);
    let revision = matches!(prepared.job.kind, JobKind::Revision { .. });
    let settlement = match &execution.verdict {
        Verdict::Pushed { .. } if revision => {
            let pull_request = PullRequestRef {
                url: task.pr_url.clone().unwrap_or_default(),
                number: task.pr_number.unwrap_or_default(),
            };
            let reason = format!("revision pushed to pull request #{}", pull_request.number);
            published(prepared, task, pull_request, reason)
        }
        Verdict::Pushed { branch, .. } => {
            match open_pull_request(service, prepared, task, branch, cost, &mut patience).await {
                Published::Done(pull_request) => {
                    let reason = format!("pull request #{} opened", pull_request.number);
                    published(prepared, task, pull_request, reason)
                }
                Published::Refused(message) => fail_with(message),
                Published::Stopped => return Ok(()),
            }
        }
        Verdict::Reviewed { text } => {
            match post_review(service, prepared, task, text, cost, &mut patience).await {
                Published::Done(pull_request) => Settlement {
                    trigger: Some((
                        Trigger::ReviewPosted,
                        TransitionDetails {
                            reason: Some(format!(
                                "review posted on pull request #{}",
                                pull_request.number
                            )),
                            error_message: None,
                            pull_request: Some(pull_request),
                        },
                    )),
                    review: None,
                    reply: None,
                },
                Published::Refused(message) => fail_with(message),
                Published::Stopped => return Ok(()),
            }
        }
        // A metered run's cost is known from its calls: no note about the agent's own figure.
        Verdict::NoChanges if execution.metered => fail_with("the agent made no changes".into()),
        Verdict::NoChanges => fail_with(with_cost_note(
            "the agent made no changes".into(),
            execution.report.as_ref(),
        )),
        Verdict::Failed(m) | Verdict::TimedOut(m) if execution.metered => fail_with(m.clone()),
        Verdict::Failed(m) | Verdict::TimedOut(m) => {
            fail_with(with_cost_note(m.clone(), execution.report.as_ref()))
        }
        Verdict::Cancelled => Settlement {
            trigger: None,
            review: None,
            reply: None,
        },
    };
    // A revision that pushed nothing leaves the pull request as it was: say so there.
    let settlement = match (&settlement.trigger, revision) {
        (Some((Trigger::Fail, details)), true) => {
            let why = details.reason.clone().unwrap_or_default();
            Settlement {
                reply: Some(revision_end_reply(task, &why)),
                ..settlement
            }
        }
        _ => settlement,
    };
    let reply = settlement.reply.clone();
    let repo_id = prepared.repo.id;
    let queued_review = settlement.review.is_some();
    let settlement_replied = settlement.reply.is_some();
    let moved = service
        .commit(
            move |conn| {
                Ok(write_tx::<_, DbError, _>(conn, |conn| {
                    let current = tasks::get_task(conn, id)?;
                    if current.attempt != attempt {
                        // Recovered by someone else meanwhile: that attempt is theirs now.
                        return Ok(false);
                    }
                    if let Some((trigger, details)) = &settlement.trigger {
                        match tasks::transition_task(conn, id, *trigger, details, now()) {
                            Ok(_) => {
                                if let Some(review) = &settlement.review {
                                    tasks::create_task(conn, review, "review launched")?;
                                }
                                if let Some(action) = &reply {
                                    let effect = NewEffect {
                                        task_id: None,
                                        repo_id,
                                        action: action.clone(),
                                    };
                                    outbox::enqueue(conn, &effect, now())?;
                                }
                            }
                            // Cancelled meanwhile: the run is recorded all the same.
                            Err(DbError::InvalidTransition(_)) => return Ok(false),
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(true)
                })?)
            },
            |moved| {
                (Loops::RUNNER.when(queued_review))
                    .and(Loops::OUTBOX.when(settlement_replied))
                    .when(*moved)
            },
        )
        .await?;
    if moved
        && let (Verdict::Reviewed { text }, Some(parent)) = (&execution.verdict, &prepared.parent)
        && prepared.repo.settings.revise_on_agent_review
    {
        service
            .agent_review_feedback(&prepared.repo, task.id, parent, text)
            .await;
    }
    Ok(())
}

/// The reply on a pull request whose revision round pushed nothing: why.
fn revision_end_reply(task: &Task, why: &str) -> Action {
    let marker = crate::revisions::round_end_marker(task.id, task.attempt);
    let said = if why.starts_with("the agent made no changes") {
        "The agent made no change in this revision round, so the pull request is as it was."
            .to_owned()
    } else {
        format!("The revision round ended without a change to the pull request: {why}")
    };
    Action::Reply {
        issue_number: task.pr_number.unwrap_or_default(),
        body: format!("{said} Task `{}`.\n\n{marker}", task.id),
        marker,
    }
}

/// How publishing ended.
enum Published {
    /// Done (or found done by an earlier try): the pull request it concerns.
    Done(PullRequestRef),
    /// A definite refusal, or failures past the patience: why, for the task's error.
    Refused(String),
    /// The task is no longer this runner's to settle (cancelled, recovered elsewhere) or the
    /// process is shutting down: nothing more is done; the run is recorded.
    Stopped,
}

/// Whether a failed call may have taken effect, or may succeed later: the outcome of a
/// write is unknown after a 5xx, a timeout or an unreadable answer, and a rate limit only
/// delays. Anything else (401, 403, 404, 422, …) is a definite answer.
fn uncertain(e: &CodeHostError) -> bool {
    e.is_transient() || matches!(e, CodeHostError::InvalidResponse(_))
}

/// The longest wait between publishing tries.
const MAX_PUBLISH_BACKOFF: Duration = Duration::from_secs(30);

/// The waits between publishing tries: a doubling backoff, bounded by the patience, cut
/// short when the run is stopped.
struct Patience {
    started: tokio::time::Instant,
    delay: Duration,
    limit: Duration,
    cancel: watch::Receiver<bool>,
    tries: u32,
}

impl Patience {
    fn new(settings: &RunSettings, cancel: watch::Receiver<bool>) -> Self {
        Patience {
            started: tokio::time::Instant::now(),
            delay: settings.publish_backoff,
            limit: settings.publish_patience,
            cancel,
            tries: 1,
        }
    }

    fn stopped(&self, service: &Service) -> bool {
        service.parts.runs.stopping.load(Ordering::SeqCst) || *self.cancel.borrow()
    }

    /// After an uncertain failure `why`: waits for the next try (`None`), or says how
    /// publishing ends instead.
    async fn wait(&mut self, service: &Service, task: &Task, why: &str) -> Option<Published> {
        if self.stopped(service) {
            return Some(Published::Stopped);
        }
        let elapsed = self.started.elapsed();
        if elapsed + self.delay > self.limit {
            return Some(Published::Refused(format!(
                "{why} (still failing after {} tries in {} s)",
                self.tries,
                elapsed.as_secs()
            )));
        }
        tracing::warn!(
            task = %task.id, attempt = task.attempt, tries = self.tries,
            retry_in_ms = self.delay.as_millis() as u64, error = why,
            "publishing failed with an unknown outcome; trying again"
        );
        tokio::select! {
            () = tokio::time::sleep(self.delay) => {}
            _ = self.cancel.changed() => {}
        }
        if self.stopped(service) {
            return Some(Published::Stopped);
        }
        self.delay = (self.delay * 2).min(MAX_PUBLISH_BACKOFF);
        self.tries += 1;
        None
    }
}

/// The review task of a coding task that opened its pull request.
fn review_task(task: &Task, repo: &Repository) -> NewTask {
    NewTask {
        id: Uuid::new_v4(),
        title: format!("Review: {}", task.title),
        prompt: String::new(),
        repo_id: Some(repo.id),
        repo_url: repo.url.clone(),
        task_type: TaskType::Review,
        agent_type: repo.settings.agent_type,
        issue_number: None,
        parent_task_id: Some(task.id),
        created_at: now(),
    }
}

fn cost_text(cost: Option<Usd>) -> String {
    cost.map_or_else(|| "not reported".to_owned(), |c| format!("${c}"))
}

/// Opens the pull request of a pushed branch, or finds the one an earlier try opened.
///
/// After a failure whose outcome is unknown, or a 422 (GitHub's answer when the branch
/// already has one), the branch's open pull request is looked up before anything is sent
/// again, so none is ever opened twice; only a definite refusal ends it.
async fn open_pull_request(
    service: &Service,
    prepared: &Prepared,
    task: &Task,
    branch: &str,
    cost: Option<Usd>,
    patience: &mut Patience,
) -> Published {
    const FAILED: &str = "the pull request could not be opened";
    let github = match service.parts.codehost.client(&prepared.token) {
        Ok(github) => github,
        Err(e) => return Published::Refused(format!("no code-host client: {e}")),
    };
    let repo = &prepared.repo;
    let (owner, name) = (repo.url.owner(), repo.url.name());
    // The title cannot close other issues (crate::closing_refs); the body closes the task's
    // own issue only.
    let title = crate::closing_refs::neutralise(&task.title);
    let mut body = String::new();
    if let Some(n) = task.issue_number {
        body.push_str(&format!("Closes #{n}\n\n"));
    }
    body.push_str(&format!(
        "Opened by agentry for task `{}` (attempt {}). Run cost: {}.",
        task.id,
        task.attempt,
        cost_text(cost)
    ));
    loop {
        let created = github
            .create_pull(owner, name, &title, branch, &repo.default_branch, &body)
            .await;
        let failure = match created {
            Ok(pull) => return pull_request_ref(pull.number, pull.html_url),
            Err(e) if uncertain(&e) || e.status() == Some(422) => e,
            Err(e) => return Published::Refused(format!("{FAILED}: {e}")),
        };
        // Already there (an earlier creation whose answer was lost, or a retry)?
        let why = match github.open_pull_for_branch(owner, name, branch).await {
            Ok(Some(pull)) => return pull_request_ref(pull.number, pull.html_url),
            Ok(None) if !uncertain(&failure) => {
                return Published::Refused(format!("{FAILED}: {failure}"));
            }
            Ok(None) => format!("{FAILED}: {failure}"),
            Err(e) if uncertain(&e) => format!("{FAILED}: {failure}; then looking it up: {e}"),
            Err(e) => return Published::Refused(format!("{FAILED}: {failure}; {e}")),
        };
        if let Some(end) = patience.wait(service, task, &why).await {
            return end;
        }
    }
}

fn pull_request_ref(number: u64, url: String) -> Published {
    match i64::try_from(number) {
        Ok(number) => Published::Done(PullRequestRef { url, number }),
        Err(_) => Published::Refused(
            "the code host answered an impossible pull request number".to_owned(),
        ),
    }
}

/// The marker a posted review ends with.
pub fn review_marker(task_id: Uuid) -> String {
    format!("<!-- agentry:review:{task_id} -->")
}

/// Posts the review text on the coding task's pull request unless its marker is already
/// there. Before every try the pull request's reviews are searched for the marker, so a
/// post whose answer was lost is never repeated; only a definite refusal ends it.
async fn post_review(
    service: &Service,
    prepared: &Prepared,
    task: &Task,
    text: &str,
    cost: Option<Usd>,
    patience: &mut Patience,
) -> Published {
    const FAILED: &str = "the review could not be posted";
    let Some(parent) = prepared.parent.as_ref() else {
        return Published::Refused("a review task without its coding task".to_owned());
    };
    let (Some(number), Some(url)) = (parent.pr_number, parent.pr_url.clone()) else {
        return Published::Refused("the reviewed task has no pull request".into());
    };
    let github = match service.parts.codehost.client(&prepared.token) {
        Ok(github) => github,
        Err(e) => return Published::Refused(format!("no code-host client: {e}")),
    };
    let repo = &prepared.repo;
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let Ok(unsigned) = u64::try_from(number) else {
        return Published::Refused("invalid pull request number".to_owned());
    };
    let marker = review_marker(task.id);
    let body = format!(
        "{text}\n\n---\nReview by agentry (task `{}`, cost {}).\n{marker}",
        task.id,
        cost_text(cost)
    );
    loop {
        let failure = match github.review_bodies(owner, name, unsigned).await {
            Ok(posted) if posted.iter().any(|b| b.contains(&marker)) => {
                return Published::Done(PullRequestRef { url, number });
            }
            Ok(_) => match github.create_review(owner, name, unsigned, &body).await {
                Ok(_) => return Published::Done(PullRequestRef { url, number }),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if !uncertain(&failure) {
            return Published::Refused(format!("{FAILED}: {failure}"));
        }
        let why = format!("{FAILED}: {failure}");
        if let Some(end) = patience.wait(service, task, &why).await {
            return end;
        }
    }
}

/// Whether `state` is one a run could still leave (for the log endpoint's live view).
pub fn is_running(state: TaskState) -> bool {
    matches!(state, TaskState::Provisioning | TaskState::Running)
}
