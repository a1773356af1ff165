//! [`LocalRunner`]: executes jobs as processes on this machine.
//!
//! Layout under its root directory (the service's data directory):
//!
//! ```text
//! workspaces/mirrors/<repo>.git     bare mirror per repository (see crate::workspace)
//! workspaces/worktrees/<task>       worktree of the running task, removed afterwards
//! runs/<task>/<attempt>/output.log  the agent's stdout as it arrives (the live log)
//! runs/<task>/<attempt>/output.log.1  the part before it once the log was rotated (full)
//! runs/<task>/<attempt>/agent.pid   the agent's process (group) id
//! runs/<task>/<attempt>/home/       the agent's HOME
//! runs/<task>/<attempt>/net/        the run's network sockets (a sandboxed run with a network)
//! ```
//!
//! Each agent runs in the sandbox of [`LocalConfig::sandbox`] (see [`crate::sandbox`]): of
//! all this it sees only its worktree and its `HOME`.
//!
//! With a [`LocalConfig::network`], a sandboxed run gets a network of its own
//! (docs/security.md#network, [`crate::network`]): before anything is prepared the runner
//! opens the run's sockets in a fresh `net/` directory ([`Network::open`]; a failure fails
//! the run), the agent runs in its own network namespace behind the forwarder, with the
//! run's key instead of the service's credentials and the gateway and proxy as its model
//! API and proxy ([`network::agent_environment`]), and the run is stopped as at its
//! allowance once the gateway marks its [`RunMeter`] exhausted. The network is closed once
//! the agent has ended; [`Execution::metered`] says the run had one. An unsandboxed run
//! (`AGENTRY_AGENT_SANDBOX=off`) never has one: it uses the network and credentials of the
//! service, as it does without a configured network.
//!
//! The run directory outlives the job: the service reads the output from it after a crash
//! ([`Runner::salvage`]) and removes it once the run is recorded ([`Runner::discard`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use uuid::Uuid;

use crate::agent::{self, AgentSpec, Launch, ServiceEnv};
use crate::cgroup::RunCgroup;
use crate::job::{Control, Execution, ExecutionFuture, Job, JobKind, Runner, Salvaged, Verdict};
use crate::network::{self, Network, RunInfo, RunMeter};
use crate::process::{self, Ended, Limits, OutputSink};
use crate::sandbox::{self, Sandbox, SandboxMode};
use crate::user::{self, UserIds};
use crate::version;
use crate::workspace::{Checkout, GitSandbox, Workspaces, Worktree};
use crate::{AgentOutcome, PriceTable, RunReport};

/// The longest diff summary a revision's prompt gets.
const MAX_DIFF_SUMMARY_CHARS: usize = 8_000;

/// The most characters of the agent's stderr kept in a failure message.
const STDERR_IN_MESSAGE: usize = 500;

/// The most of a dead run's output read back by [`Runner::salvage`] (its end): the cost
/// is in the last event, and Codex's token counts are summed over all of it that is read.
pub(crate) const SALVAGE_BYTES: usize = 64 * 1024 * 1024;

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
    /// What of the service's environment reaches agents (see [`agent::environment`]).
    pub env: ServiceEnv,
    /// How long a stopped agent gets at each step of the stop ladder (`SIGINT`, then
    /// `SIGTERM`, then `SIGKILL`; see [`crate::process`]).
    pub stop_grace: Duration,
    /// The sandbox agents run in (`AGENTRY_AGENT_SANDBOX`); see [`crate::sandbox`].
    pub sandbox: Sandbox,
    /// The network of sandboxed runs (see the module docs); `None`: a sandboxed agent
    /// shares the service's network and gets the service's credentials.
    pub network: Option<NetworkConfig>,
}

/// The network sandboxed runs get ([`LocalConfig::network`]).
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// What opens each run's sockets (the service's model gateway and egress proxy).
    pub provider: Arc<dyn Network>,
    /// The forwarder run inside the sandbox in front of the agent: its program (an
    /// absolute path, or a name found on the agent's `PATH`) and leading arguments, e.g.
    /// `["/usr/local/bin/agentry", "sandbox-net"]` ([`network::forwarder_main`]).
    pub forwarder: Vec<String>,
}

/// Runs jobs as local processes (see the module docs).
pub struct LocalRunner {
    config: LocalConfig,
    workspaces: Workspaces,
    /// The last check of each agent CLI, kept while its executable is unchanged.
    checked: parking_lot::Mutex<Vec<CliCheck>>,
    /// Whether the log already said that no cgroup can be made here.
    cgroup_refused: std::sync::atomic::AtomicBool,
}

/// One agent CLI's check ([`version::check`]) and the executable it was made of.
#[derive(Debug, Clone)]
struct CliCheck {
    agent_type: AgentType,
    /// The executable as found, its size and modification time: a different one (an
    /// upgrade, a fix) is checked again.
    stamp: Option<(PathBuf, u64, std::time::SystemTime)>,
    result: Result<version::Found, version::CliProblem>,
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
            if config.network.is_some() {
                tracing::warn!(
                    "unsandboxed agents get no network of their own: they use the service's \
                     network and credentials, not the model gateway"
                );
            }
        }
        let runner_forwarder = config
            .network
            .as_ref()
            .map(|n| n.forwarder.as_slice())
            .or(config.sandbox.forwarder());
        if config.sandbox.mode() == SandboxMode::Auto {
            if !config.sandbox.seccomp() {
                tracing::warn!(
                    "sandboxed agents run without the seccomp filter: AGENTRY_SANDBOX_SECCOMP=off"
                );
            } else if let Err(why) = sandbox::seccomp::program() {
                tracing::warn!("sandboxed agents run without a seccomp filter: {why}");
            }
        }
        if config.sandbox.mode() == SandboxMode::Auto && runner_forwarder.is_none() {
            tracing::warn!(
                "no forwarder is configured: sandboxed agents run without their rlimits \
                 (processes, open files, file size, memory)"
            );
        }
        // The git steps that read what the agent wrote run in a sandbox like the agent's.
        let git_sandbox = GitSandbox {
            sandbox: config.sandbox.clone(),
            data_dir: config.root.clone(),
            forwarder: runner_forwarder.map(<[String]>::to_vec),
        };
        let workspaces =
            Workspaces::new(config.root.join("workspaces")).with_git_sandbox(git_sandbox);
        LocalRunner {
            config,
            workspaces,
            checked: parking_lot::Mutex::new(Vec::new()),
            cgroup_refused: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The forwarder started as the first process of every sandbox (it sets the agent's
    /// rlimits): the network's, else the sandbox's ([`Sandbox::with_forwarder`]).
    fn forwarder(&self) -> Option<&[String]> {
        match &self.config.network {
            Some(network) => Some(&network.forwarder),
            None => self.config.sandbox.forwarder(),
        }
    }

    /// Opens the data directory to the agents' user `ids` (group traversal only) and checks
    /// that it reaches the agent program, the forwarder and the data directory.
    fn reachable_by(&self, ids: &UserIds, agent_type: AgentType) -> Result<(), String> {
        user::open_data_dir(&self.config.root, ids)?;
        let env = [(
            "PATH".to_owned(),
            self.config.env.path.clone().unwrap_or_default(),
        )];
        let mut needed = vec![(self.config.root.clone(), false)];
        let programs = std::iter::once(self.program(agent_type).to_owned())
            .chain(self.forwarder().and_then(|f| f.first()).map(PathBuf::from));
        for program in programs {
            let resolved = sandbox::resolve_program(&program, &env)?;
            needed.push((std::fs::canonicalize(&resolved).unwrap_or(resolved), true));
        }
        for (path, run) in needed {
            if let Some(blocked) = user::unreachable(&path, ids, run) {
                return Err(format!(
                    "agents run as {} (the service runs as root), who cannot reach {}{}: make                      it readable by that user (for example, install the agent CLI and agentry                      under /usr/local or /opt, and keep the data directory out of root's                      HOME), or set AGENTRY_ALLOW_ROOT=1 to run agents as root",
                    ids.name,
                    blocked.display(),
                    if blocked == path {
                        String::new()
                    } else {
                        format!(" (on the way to {})", path.display())
                    }
                ));
            }
        }
        Ok(())
    }

    /// The control group of `job`'s run, `None` where none can be made here (said once in
    /// the log).
    fn run_cgroup(&self, job: &Job) -> Option<Arc<RunCgroup>> {
        let limits = self.config.sandbox.limits();
        let name = format!("{}-{}", job.task_id.simple(), job.attempt);
        match RunCgroup::create(&name, limits.total_memory_bytes, limits.max_processes) {
            Ok(group) => Some(Arc::new(group)),
            Err(why) => {
                if !self
                    .cgroup_refused
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(
                        "sandboxes run without a cgroup (their rlimits still apply): {why}"
                    );
                }
                None
            }
        }
    }

    /// The directory of one run.
    pub fn run_dir(&self, task_id: Uuid, attempt: i32) -> PathBuf {
        run_dir_under(&self.config.root, task_id, attempt)
    }

    fn program(&self, agent_type: AgentType) -> &Path {
        match agent_type {
            AgentType::ClaudeCode => &self.config.claude_bin,
            AgentType::Codex => &self.config.codex_bin,
        }
    }

    /// Whether `agent_type`'s CLI is there and a supported version ([`version::check`]),
    /// asked again only when its executable changed since the last time.
    pub async fn check_cli(
        &self,
        agent_type: AgentType,
    ) -> Result<version::Found, version::CliProblem> {
        let home = self.config.root.join("cli-home");
        let made = match tokio::fs::create_dir_all(&home).await {
            Ok(()) => user::private(&home),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = made {
            tracing::warn!(dir = %home.display(), error = %e, "cannot create the CLI check's HOME");
        }
        let env = agent::environment(
            agent_type,
            Launch::default(),
            &home,
            &ServiceEnv {
                path: self.config.env.path.clone(),
                ..ServiceEnv::default()
            },
        );
        let program = self.program(agent_type);
        let stamp = sandbox::resolve_program(program, &env)
            .ok()
            .and_then(|path| {
                let meta = std::fs::metadata(&path).ok()?;
                Some((path, meta.len(), meta.modified().ok()?))
            });
        let cached = self
            .checked
            .lock()
            .iter()
            .find(|c| c.agent_type == agent_type && c.stamp == stamp && stamp.is_some())
            .map(|c| c.result.clone());
        if let Some(result) = cached {
            return result;
        }
        let result = version::check(agent_type, program, &env).await;
        match &result {
            Ok(found) => tracing::info!(
                agent = %agent_type,
                version = %found.version,
                path = %found.path.display(),
                "agent CLI checked"
            ),
            Err(problem) => tracing::error!(agent = %agent_type, "{problem}"),
        }
        let mut checked = self.checked.lock();
        checked.retain(|c| c.agent_type != agent_type);
        checked.push(CliCheck {
            agent_type,
            stamp,
            result: result.clone(),
        });
        result
    }

    /// Runs `job` to its end, step by step: check that its agent can be launched
    /// ([`LocalRunner::check_launch`]), prepare the run directory
    /// ([`LocalRunner::prepare_run_dir`]), start the run's network
    /// ([`LocalRunner::start_network`]), materialise the worktree ([`materialise_worktree`]),
    /// run the agent ([`LocalRunner::launch_agent`]), then collect how it ended
    /// ([`LocalRunner::agent_end`]) and conclude ([`conclude`]). Whatever fails on the way
    /// fails the run with a sentence saying what, and the worktree is removed.
    async fn run(&self, job: Job, mut control: Control) -> Execution {
        let started_at = now();
        // Checked before anything is prepared: without its sandbox, no agent starts.
        let launcher = self.config.sandbox.probed().await;
        let sandboxed = matches!(launcher, Ok(Some(_)));
        let mut start = RunStart::new(job.agent.agent_type, sandboxed, started_at);
        let bwrap = match self.check_launch(&job, launcher).await {
            Ok(bwrap) => bwrap,
            Err(message) => return start.failed(message),
        };
        let paths = match self.prepare_run_dir(&job).await {
            Ok(paths) => paths,
            Err(message) => return start.failed(message),
        };
        // A sandboxed run's network, open until its agent has ended.
        let network = match self
            .start_network(&job, bwrap.is_some(), &paths.run_dir)
            .await
        {
            Ok(network) => network,
            Err(message) => return start.failed(message),
        };
        start.metered = network.is_some();
        let worktree = match materialise_worktree(&self.workspaces, &job).await {
            Ok(worktree) => worktree,
            Err(message) => return start.failed(message),
        };
        if *control.cancel.borrow() {
            remove_worktree(worktree).await;
            return start.cancelled();
        }
        let ran = self
            .launch_agent(
                &job,
                &mut control,
                bwrap.as_ref(),
                &paths,
                &worktree,
                network,
            )
            .await;
        let ran = match ran {
            Ok(ran) => ran,
            Err(message) => {
                remove_worktree(worktree).await;
                return start.failed(message);
            }
        };
        let ended = ran.outcome.ended.clone();
        let end = self.agent_end(ran.outcome, ran.oom_kills);
        let (verdict, report, output) = conclude(
            &job,
            end,
            ran.parser,
            ran.meter.as_ref(),
            &worktree,
            &control.cancel,
        )
        .await;
        remove_worktree(worktree).await;
        start.finished(verdict, Some(report), Some(ended), output)
    }

    /// The sandbox `job`'s agent runs in, once the checks that must pass before anything is
    /// prepared have: the sandbox could be probed (`launcher`), the agent CLI is there and
    /// supported, an agent of another user reaches its program, the forwarder and its
    /// paths, and the run's allowance can be enforced. `None`: the agent runs unsandboxed.
    async fn check_launch(
        &self,
        job: &Job,
        launcher: Result<Option<(PathBuf, sandbox::BwrapFeatures)>, String>,
    ) -> Result<Option<Bwrap>, String> {
        let agent_type = job.agent.agent_type;
        let bwrap = launcher?.map(|(program, features)| Bwrap { program, features });
        // Without a supported CLI the agent could not run (or would misread its options).
        self.check_cli(agent_type)
            .await
            .map_err(|problem| problem.to_string())?;
        // An agent of another user must reach its program, the forwarder and its paths.
        if let Some(ids) = self.config.sandbox.agent_user().ids() {
            self.reachable_by(ids, agent_type)?;
        }
        // A run whose allowance cannot be enforced does not start.
        agent::budget_enforceable(&job.agent, &self.config.prices)?;
        Ok(bwrap)
    }

    /// Makes `job`'s run directory afresh, with the agent's `HOME` in it. The run's
    /// directory is a passage for the agents' user (to its HOME and network), its HOME the
    /// agent's alone; the log and the pid file beside them are the service's.
    async fn prepare_run_dir(&self, job: &Job) -> Result<RunPaths, String> {
        let run_dir = self.run_dir(job.task_id, job.attempt);
        let home = run_dir.join("home");
        let made = match fresh_dir(&home).await {
            Ok(()) => {
                let (root, run_dir, home) =
                    (self.config.root.clone(), run_dir.clone(), home.clone());
                tokio::task::spawn_blocking(move || {
                    user::passage(&root, &run_dir).and_then(|()| user::private(&home))
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        match made {
            Ok(()) => Ok(RunPaths { run_dir, home }),
            Err(e) => Err(format!(
                "could not create the run directory {}: {e}",
                home.display()
            )),
        }
    }

    /// Opens the network of a `sandboxed` run when one is configured (see the module docs);
    /// `None` for a run without one.
    async fn start_network(
        &self,
        job: &Job,
        sandboxed: bool,
        run_dir: &Path,
    ) -> Result<Option<OpenNetwork>, String> {
        match (sandboxed, &self.config.network) {
            (true, Some(config)) => match self.open_network(job, run_dir, config).await {
                Ok(opened) => Ok(Some(opened)),
                Err(message) => Err(format!("could not open the agent's network: {message}")),
            },
            _ => Ok(None),
        }
    }

    /// Runs `job`'s agent in `worktree` to its end: gives the run's files to the agent's
    /// user ([`LocalRunner::give_to_agent_user`]), builds its command
    /// ([`LocalRunner::agent_command`]) and its sandbox ([`LocalRunner::build_sandbox`],
    /// [`LocalRunner::hold_for_cgroup`]), spawns it and streams and meters its output
    /// ([`LocalRunner::spawn_agent`], which applies the stop ladder), closes its `network`
    /// and takes the worktree back from the agent's user.
    async fn launch_agent(
        &self,
        job: &Job,
        control: &mut Control,
        bwrap: Option<&Bwrap>,
        paths: &RunPaths,
        worktree: &Worktree,
        network: Option<OpenNetwork>,
    ) -> Result<AgentRun, String> {
        let launch = Launch {
            sandboxed: bwrap.is_some(),
            review: matches!(job.kind, JobKind::Review { .. }),
        };
        let net_dir = network.as_ref().map(|(_, dir)| dir.as_path());
        // A sandboxed coding agent writes git metadata in a copy of its own, outside the
        // mirror (Worktree::agent_git_dir).
        let agent_git = if bwrap.is_some() && !launch.review {
            Some(
                worktree
                    .agent_git_dir()
                    .await
                    .map_err(|e| format!("could not prepare the agent's git metadata: {e}"))?,
            )
        } else {
            None
        };
        let user = self.config.sandbox.agent_user().ids().cloned();
        if let Some(ids) = &user {
            self.give_to_agent_user(ids, bwrap.is_some(), worktree, &paths.home, net_dir)
                .await?;
        }
        let key = network.as_ref().map(|(opened, _)| opened.key.as_str());
        let command = self
            .agent_command(job, launch, &paths.home, key, worktree)
            .await;
        let mut command = match bwrap {
            None => command,
            Some(bwrap) => {
                let files = SandboxFiles {
                    paths,
                    worktree,
                    agent_git: agent_git.as_deref(),
                    net_dir,
                    user: user.as_ref(),
                };
                self.build_sandbox(job, bwrap, launch, command, &files)?
            }
        };
        let (cgroup, unblock) = self.hold_for_cgroup(job, bwrap.is_some(), &mut command)?;
        let meter = network
            .as_ref()
            .map(|(opened, _)| Arc::clone(&opened.meter));
        let sink = RunSink {
            parser: agent::OutputParser::new(&job.agent, &self.config.prices)
                .with_codex_home(&paths.home, &self.config.prices),
            meter: meter.clone(),
        };
        let hold = CgroupHold {
            group: cgroup.clone(),
            unblock,
        };
        let outcome = self
            .spawn_agent(job, command, control, &paths.run_dir, sink, hold)
            .await;
        let oom_kills = cgroup.as_ref().map_or(0, |group| group.oom_kills());
        if let Some(group) = cgroup {
            // Removing the group may wait a moment for the kernel to let go of it.
            tokio::task::spawn_blocking(move || drop(group));
        }
        // The agent has ended: its network closes.
        drop(network);
        if agent_git.is_some()
            && let Err(e) = worktree.drop_agent_git_dir().await
        {
            tracing::warn!(task = %job.task_id, error = %e, "the agent's git metadata stays");
        }
        let (outcome, RunSink { parser, .. }) =
            outcome.map_err(|e| format!("could not start the agent: {e}"))?;
        // What the agent's user wrote is the service's again before anything reads it.
        if user.is_some()
            && let Err(e) = worktree.take_back().await
        {
            return Err(format!(
                "could not take the worktree back from the agent: {e}"
            ));
        }
        Ok(AgentRun {
            outcome,
            parser,
            meter,
            oom_kills,
        })
    }

    /// Gives an agent of another user `ids` (the service runs as root) its worktree, its
    /// git metadata, its `home` and its network directory `net_dir`; only a `sandboxed`
    /// agent runs as another user.
    async fn give_to_agent_user(
        &self,
        ids: &UserIds,
        sandboxed: bool,
        worktree: &Worktree,
        home: &Path,
        net_dir: Option<&Path>,
    ) -> Result<(), String> {
        let given = async {
            if !sandboxed {
                return Err("agents run as another user only in the sandbox".to_owned());
            }
            worktree
                .give_to(ids.uid, ids.gid)
                .await
                .map_err(|e| e.to_string())?;
            let mut dirs = vec![home.to_owned()];
            dirs.extend(net_dir.map(Path::to_owned));
            let (uid, gid) = (ids.uid, ids.gid);
            tokio::task::spawn_blocking(move || {
                dirs.iter()
                    .try_for_each(|dir| crate::user::chown_tree(dir, uid, gid))
            })
            .await
            .map_err(|e| e.to_string())?
        }
        .await;
        given.map_err(|e| {
            format!(
                "could not give the run's files to the agent's user {}: {e}",
                ids.name
            )
        })
    }

    /// The command of `job`'s agent as it would run outside any sandbox: its environment
    /// (with the run's network `key` instead of the service's credentials when it has one)
    /// and its prompt ([`prompt_for`]).
    async fn agent_command(
        &self,
        job: &Job,
        launch: Launch,
        home: &Path,
        key: Option<&str>,
        worktree: &Worktree,
    ) -> process::AgentCommand {
        let agent_type = job.agent.agent_type;
        let mut env = agent::environment(agent_type, launch, home, &self.config.env);
        if let Some(key) = key {
            env = network::agent_environment(agent_type, env, key);
        }
        let prompt = prompt_for(job, worktree).await;
        agent::command(
            &job.agent,
            launch,
            self.program(agent_type),
            &prompt,
            worktree.path(),
            env,
        )
    }

    /// `command` wrapped in `bwrap`'s sandbox ([`sandbox::wrap`]) over the run's `files`,
    /// with the seccomp filter unless it is turned off or unknown on this architecture (the
    /// run goes on without it, which the log says).
    fn build_sandbox(
        &self,
        job: &Job,
        bwrap: &Bwrap,
        launch: Launch,
        command: process::AgentCommand,
        files: &SandboxFiles<'_>,
    ) -> Result<process::AgentCommand, String> {
        let seccomp = if self.config.sandbox.seccomp() {
            match sandbox::seccomp::program() {
                Ok(program) => Some(program),
                Err(why) => {
                    tracing::warn!(task = %job.task_id, "the agent runs without a seccomp filter: {why}");
                    None
                }
            }
        } else {
            None
        };
        // Files named by the variables passed to agents (a CA bundle…).
        let readable: Vec<PathBuf> = self
            .config
            .env
            .passed
            .iter()
            .map(|(_, value)| PathBuf::from(value))
            .filter(|path| path.is_absolute())
            .collect();
        let layout = sandbox::Layout {
            root: &self.config.root,
            worktree: files.worktree.path(),
            home: &files.paths.home,
            mirror: &self
                .config
                .root
                .join("workspaces")
                .join("mirrors")
                .join(format!("{}.git", job.repo.key)),
            review: launch.review,
            agent_git: files.agent_git,
            readable: &readable,
            extra_ro: self.config.sandbox.extra_ro(),
            network: files.net_dir.map(|dir| sandbox::NetLayout { dir }),
            forwarder: self.forwarder(),
            limits: self.config.sandbox.limits(),
            features: bwrap.features,
            seccomp: seccomp.as_deref(),
            user: files.user,
        };
        sandbox::wrap(&bwrap.program, command, layout)
            .map_err(|e| format!("could not set up the agent's sandbox: {e}"))
    }

    /// A `sandboxed` run's control group, where one can be made, and the pipe that releases
    /// its first process: `bwrap` holds it (`--block-fd`, added to `command`) until both
    /// are in the group.
    fn hold_for_cgroup(
        &self,
        job: &Job,
        sandboxed: bool,
        command: &mut process::AgentCommand,
    ) -> Result<(Option<Arc<RunCgroup>>, Option<std::io::PipeWriter>), String> {
        let cgroup = if sandboxed {
            self.run_cgroup(job)
        } else {
            None
        };
        if cgroup.is_none() {
            return Ok((None, None));
        }
        match std::io::pipe() {
            Ok((reader, writer)) => {
                let passed = process::PassedFd(Arc::new(reader.into()));
                command
                    .args
                    .splice(0..0, ["--block-fd".to_owned(), passed.number().to_string()]);
                command.pass_fds.push(passed);
                Ok((cgroup, Some(writer)))
            }
            Err(e) => Err(format!("could not hold the sandbox for its cgroup: {e}")),
        }
    }

    /// Spawns the agent's `command`, streams its output to the run's log and to `sink`
    /// (which meters it and may stop it) and waits for its end under `job`'s wall time and
    /// `control`'s cancel ([`process::run_process_with`], which applies the stop ladder).
    /// Once it is spawned, its pid is recorded in `agent.pid`, it is moved into its
    /// cgroup (`hold`) and `control` is told it started.
    async fn spawn_agent(
        &self,
        job: &Job,
        command: process::AgentCommand,
        control: &mut Control,
        run_dir: &Path,
        sink: RunSink,
        hold: CgroupHold,
    ) -> Result<(process::ProcessOutcome, RunSink), process::ProcessError> {
        let limits = Limits {
            wall_time: job.wall_time,
            stop_grace: self.config.stop_grace,
        };
        let pid_file = run_dir.join("agent.pid");
        let started = control.started.take();
        process::run_process_with(
            command,
            &run_dir.join("output.log"),
            limits,
            control.cancel.clone(),
            sink,
            move |pid| {
                // Best effort: only used to stop an orphaned agent after a crash.
                let _ = user::private_file(&pid_file).and_then(|mut file| {
                    std::io::Write::write_all(&mut file, pid.to_string().as_bytes())
                });
                if let CgroupHold {
                    group: Some(group),
                    unblock: Some(mut writer),
                } = hold
                {
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = group.attach_tree(pid) {
                            tracing::warn!("the sandbox runs outside its cgroup: {e}");
                        }
                        // Whatever happened, the sandbox goes on (a closed pipe would too).
                        let _ = std::io::Write::write_all(&mut writer, b"x");
                    });
                }
                if let Some(started) = started {
                    let _ = started.send(());
                }
            },
        )
        .await
    }

    /// How the agent ended as [`conclude`] reads it: its process's `outcome`, and the
    /// kernel's stop for memory when its cgroup saw `oom_kills`.
    fn agent_end(&self, outcome: process::ProcessOutcome, oom_kills: u64) -> AgentEnd {
        let dropped = if outcome.stdout_truncated {
            outcome
                .stdout_bytes
                .saturating_sub(outcome.stdout.len() as u64)
                .max(1)
        } else {
            0
        };
        let memory = (oom_kills > 0).then(|| {
            format!(
                "the sandbox ran out of memory (AGENTRY_AGENT_TOTAL_MEMORY_BYTES, {} bytes) \
                 and the kernel stopped the agent",
                self.config.sandbox.limits().total_memory_bytes
            )
        });
        AgentEnd {
            ended: outcome.ended,
            stdout: outcome.stdout,
            stdout_dropped: dropped,
            stderr_tail: outcome.stderr_tail,
            killed: memory,
            unpublishable: None,
        }
    }

    /// Opens `job`'s network with `config`'s provider in a fresh `net` directory (mode 0700)
    /// of `run_dir`: the network and its directory, or why it could not be opened.
    async fn open_network(
        &self,
        job: &Job,
        run_dir: &Path,
        config: &NetworkConfig,
    ) -> Result<(network::RunNetwork, PathBuf), String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = run_dir.join("net");
        fresh_dir(&dir)
            .await
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        tokio::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .await
            .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
        let opened = config.provider.open(&run_info(job), &dir).await?;
        Ok((opened, dir))
    }
}

/// What every ending of a run says besides its verdict: the agent, whether it was
/// sandboxed and metered, and when the run started. Both runners end their runs through it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunStart {
    /// The agent of the run.
    pub agent_type: AgentType,
    /// Whether the agent runs (or would have run) in the sandbox ([`Execution::sandboxed`]).
    pub sandboxed: bool,
    /// Whether the run's network was opened (see [`Execution::metered`]).
    pub metered: bool,
    /// When the run started.
    pub started_at: time::OffsetDateTime,
}

impl RunStart {
    /// A run of `agent_type`'s agent that started at `started_at`, not yet metered.
    pub(crate) fn new(
        agent_type: AgentType,
        sandboxed: bool,
        started_at: time::OffsetDateTime,
    ) -> Self {
        RunStart {
            agent_type,
            sandboxed,
            metered: false,
            started_at,
        }
    }

    /// The run failed before its agent ended, for `message`.
    pub(crate) fn failed(&self, message: String) -> Execution {
        self.finished(Verdict::Failed(message), None, None, String::new())
    }

    /// The run was cancelled before its agent started.
    fn cancelled(&self) -> Execution {
        self.finished(Verdict::Cancelled, None, None, String::new())
    }

    /// The run ended now with `verdict`.
    pub(crate) fn finished(
        &self,
        verdict: Verdict,
        report: Option<RunReport>,
        ended: Option<Ended>,
        output: String,
    ) -> Execution {
        Execution {
            verdict,
            agent_type: self.agent_type,
            report,
            ended,
            output,
            sandboxed: self.sandboxed,
            metered: self.metered,
            started_at: self.started_at,
            finished_at: now(),
        }
    }
}

/// The sandbox of a run: `bwrap` and what it supports.
struct Bwrap {
    program: PathBuf,
    features: sandbox::BwrapFeatures,
}

/// A run's directory and the agent's `HOME` in it.
struct RunPaths {
    run_dir: PathBuf,
    home: PathBuf,
}

/// A run's open network and its directory of sockets.
type OpenNetwork = (network::RunNetwork, PathBuf);

/// What of a run the sandbox is built over ([`LocalRunner::build_sandbox`]).
struct SandboxFiles<'a> {
    paths: &'a RunPaths,
    worktree: &'a Worktree,
    /// A coding run's copy of the worktree's git metadata ([`Worktree::agent_git_dir`]).
    agent_git: Option<&'a Path>,
    net_dir: Option<&'a Path>,
    user: Option<&'a UserIds>,
}

/// A run's control group and the pipe that releases the sandbox once it is in it.
struct CgroupHold {
    group: Option<Arc<RunCgroup>>,
    unblock: Option<std::io::PipeWriter>,
}

/// What [`LocalRunner::launch_agent`] hands to the conclusion: how the agent's process
/// ended, the parser that read its output, the run's meter and the cgroup's OOM kills.
struct AgentRun {
    outcome: process::ProcessOutcome,
    parser: agent::OutputParser,
    meter: Option<Arc<RunMeter>>,
    oom_kills: u64,
}

/// `job`'s worktree, checked out as its kind needs (a new branch for coding, the branch
/// for a revision, detached at the branch for a review); both runners prepare it so.
pub(crate) async fn materialise_worktree(
    workspaces: &Workspaces,
    job: &Job,
) -> Result<Worktree, String> {
    let checkout = match &job.kind {
        JobKind::Coding { .. } => Checkout::NewBranch,
        JobKind::Review { branch } => Checkout::Detached(branch),
        JobKind::Revision { branch, .. } => Checkout::Branch(branch),
    };
    workspaces
        .prepare(&job.repo, job.task_id, checkout, &job.auth)
        .await
        .map_err(|e| format!("could not prepare the workspace: {e}"))
}

/// What the network of `job`'s run is opened for.
pub(crate) fn run_info(job: &Job) -> RunInfo {
    RunInfo {
        task_id: job.task_id,
        attempt: job.attempt,
        repo_key: job.repo.key.clone(),
        agent: job.agent.clone(),
    }
}

/// What reads a run's output: the agent's parser, stopping the run at its allowance, and
/// for a run with a network its meter, stopping the run once the gateway refused a call for
/// its budget ([`RunMeter::is_exhausted`]).
struct RunSink {
    parser: agent::OutputParser,
    meter: Option<Arc<RunMeter>>,
}

impl OutputSink for RunSink {
    fn feed(&mut self, chunk: &[u8]) {
        self.parser.feed(chunk);
    }

    fn stop_requested(&self) -> bool {
        self.parser.allowance_reached() || self.meter.as_ref().is_some_and(|m| m.is_exhausted())
    }

    fn poll(&mut self) {
        self.parser.poll();
    }
}

impl Runner for LocalRunner {
    fn execute(&self, job: Job, control: Control) -> ExecutionFuture<'_> {
        Box::pin(self.run(job, control))
    }

    fn live_output(&self, task_id: Uuid, attempt: i32) -> Option<String> {
        let path = self.run_dir(task_id, attempt).join("output.log");
        let (text, dropped) = read_tail(&path, process::STDOUT_MEMORY_CAP).ok()?;
        Some(note_dropped(text, dropped))
    }

    fn salvage(&self, task_id: Uuid, attempt: i32, agent: &AgentSpec) -> Option<Salvaged> {
        let dir = self.run_dir(task_id, attempt);
        stop_orphan(&dir);
        let (output, _) = read_tail(&dir.join("output.log"), SALVAGE_BYTES).ok()?;
        let mut parser = agent::OutputParser::new(agent, &self.config.prices)
            .with_codex_home(&dir.join("home"), &self.config.prices);
        parser.feed(output.as_bytes());
        Some(Salvaged {
            report: parser.finish(),
            output,
            metered: dir.join("net").is_dir(),
        })
    }

    fn discard(&self, task_id: Uuid, attempt: i32) {
        discard_run_dir(&self.run_dir(task_id, attempt));
    }

    fn leftovers(&self) -> Vec<(Uuid, i32)> {
        run_dirs(&self.config.root)
    }
}

/// The directory of one run under the data directory `root`: `runs/<task>/<attempt>`.
pub(crate) fn run_dir_under(root: &Path, task_id: Uuid, attempt: i32) -> PathBuf {
    root.join("runs")
        .join(task_id.to_string())
        .join(attempt.to_string())
}

/// Removes a recorded run's directory, and its task's once it holds no run any more.
pub(crate) fn discard_run_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove a run directory");
    }
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// The runs (task, attempt) that have a directory under `root`'s `runs`.
pub(crate) fn run_dirs(root: &Path) -> Vec<(Uuid, i32)> {
    let entries = |dir: &Path| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_owned()))
            .collect::<Vec<_>>()
    };
    let runs = root.join("runs");
    let mut found = Vec::new();
    for task in entries(&runs) {
        let Ok(task_id) = task.parse::<Uuid>() else {
            continue;
        };
        for attempt in entries(&runs.join(&task)) {
            if let Ok(attempt) = attempt.parse::<i32>() {
                found.push((task_id, attempt));
            }
        }
    }
    found.sort_unstable();
    found
}

/// The last `max` bytes of an agent log, across its rotated part ([`process::rotated_log_path`])
/// and the log itself (all of it when shorter), as lossy UTF-8 starting on a character when
/// cut, and the number of earlier bytes left out.
///
/// While the agent still writes, a rotation between opening the two files may leave a gap in
/// the middle of the text; the order is always right (the rotated part is opened first).
pub(crate) fn read_tail(path: &Path, max: usize) -> std::io::Result<(String, u64)> {
    use std::io::{ErrorKind, Read, Seek, SeekFrom};
    let open = |path: &Path| match std::fs::File::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    };
    let rotated = open(&process::rotated_log_path(path))?;
    let current = match (open(path)?, &rotated) {
        (Some(file), _) => Some(file),
        // Between the rename of a full log and the creation of the next one.
        (None, Some(_)) => None,
        (None, None) => return Err(ErrorKind::NotFound.into()),
    };
    let len = |file: &Option<std::fs::File>| -> std::io::Result<u64> {
        file.as_ref().map_or(Ok(0), |f| Ok(f.metadata()?.len()))
    };
    let (rotated_len, current_len) = (len(&rotated)?, len(&current)?);
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    let from_current = current_len.min(max);
    let from_rotated = rotated_len.min(max - from_current);
    let mut bytes = Vec::new();
    for (file, file_len, take) in [
        (rotated, rotated_len, from_rotated),
        (current, current_len, from_current),
    ] {
        if let Some(mut file) = file.filter(|_| take > 0) {
            file.seek(SeekFrom::Start(file_len - take))?;
            file.take(take).read_to_end(&mut bytes)?;
        }
    }
    let dropped = (rotated_len + current_len) - (from_rotated + from_current);
    let text = process::lossy(if dropped > 0 {
        process::skip_partial_char(bytes)
    } else {
        bytes
    });
    Ok((text, dropped))
}

/// `text`, the end of an output whose first `dropped` bytes were left out, with a first
/// line saying so. `text` is already as long as the service stores (see
/// [`process::STDOUT_MEMORY_CAP`]): with this line it is longer, so the stored log drops
/// the head (this line first) and is marked as truncated, as an output that was cut should.
pub(crate) fn note_dropped(text: String, dropped: u64) -> String {
    if dropped == 0 {
        return text;
    }
    let mut noted = format!("[… the first {dropped} bytes of the agent's output are not kept …]\n");
    noted.push_str(&text);
    noted
}

/// The instructions `job`'s agent gets: the job's prompt, and for a revision what its pull
/// request changes so far (`git diff --stat` of `worktree` against the default branch).
pub(crate) async fn prompt_for(job: &Job, worktree: &Worktree) -> String {
    let JobKind::Revision { .. } = &job.kind else {
        return job.prompt.clone();
    };
    match worktree
        .diff_summary(&job.repo.default_branch, MAX_DIFF_SUMMARY_CHARS)
        .await
    {
        Ok(stat) if !stat.is_empty() => format!(
            "{}\n\n## What the pull request changes so far (`git diff --stat`)\n\n```\n{stat}\n```\n",
            job.prompt.trim_end()
        ),
        Ok(_) => job.prompt.clone(),
        Err(e) => {
            tracing::warn!(task = %job.task_id, error = %e, "no diff summary for the revision");
            job.prompt.clone()
        }
    }
}

/// How an agent ended, wherever it ran: what [`conclude`] turns into a verdict.
#[derive(Debug)]
pub(crate) struct AgentEnd {
    /// How its process ended.
    pub ended: Ended,
    /// The end of its stdout that is kept.
    pub stdout: String,
    /// How many bytes of stdout before [`AgentEnd::stdout`] are not kept.
    pub stdout_dropped: u64,
    /// The end of its stderr.
    pub stderr_tail: String,
    /// Set when something outside the agent killed it (the kernel for memory, the
    /// cluster): a sentence saying what, which starts the failure's message.
    pub killed: Option<String>,
    /// Set when its changes cannot be published even if it succeeded: why.
    pub unpublishable: Option<String>,
}

/// The verdict, report and output of `job`'s agent that ended as `end`, with `parser` having
/// read all its stdout and `meter` the run's meter when the gateway metered it: the agent's
/// stop at its allowance or budget, its failure, or its success published from `worktree`
/// (committed and pushed, or its review taken).
pub(crate) async fn conclude(
    job: &Job,
    end: AgentEnd,
    parser: agent::OutputParser,
    meter: Option<&Arc<RunMeter>>,
    worktree: &Worktree,
    cancel: &tokio::sync::watch::Receiver<bool>,
) -> (Verdict, RunReport, String) {
    // Stopped because the gateway refused a call for the run's budget, the run spent what
    // the gateway metered.
    let cost_so_far = match meter {
        Some(meter) if meter.is_exhausted() => Some(meter.spent()),
        _ => parser.cost_so_far(),
    };
    let mut report = parser.finish();
    if end.ended == Ended::Stopped {
        // Stopped by agentry at its allowance: whatever the output says, that is how the
        // run ended. Its cost is everything the agent reported before it was gone.
        report.outcome = AgentOutcome::MaxBudget;
    }
    let mut output = note_dropped(end.stdout, end.stdout_dropped);
    let budget_stop = || {
        budget_stop_message(
            cost_so_far,
            job.agent.max_budget_usd,
            meter.and_then(|m| m.reason()),
        )
    };
    let verdict = match &end.ended {
        Ended::Cancelled => Verdict::Cancelled,
        Ended::TimedOut => Verdict::TimedOut(format!(
            "the agent ran longer than the limit of {} and was stopped",
            human(job.wall_time)
        )),
        Ended::Stopped => Verdict::Failed(budget_stop()),
        // The gateway refused a call for the budget and the agent ended by itself before
        // it was stopped: the run ended at its allowance all the same.
        Ended::Exited { .. } if meter.is_some_and(|m| m.is_exhausted()) => {
            report.outcome = AgentOutcome::MaxBudget;
            Verdict::Failed(budget_stop())
        }
        Ended::Exited { code, signal } => {
            match agent_failure(&report, *code, *signal, &end.stderr_tail) {
                Some(message) => Verdict::Failed(message),
                None => match end.unpublishable {
                    Some(why) => Verdict::Failed(why),
                    // Cancelled after the agent ended by itself: its work is not committed
                    // nor pushed (a revision round leaves the pull request as it was).
                    None if *cancel.borrow() => Verdict::Cancelled,
                    None => publish(job, worktree, &report).await,
                },
            }
        }
    };
    let verdict = match (verdict, end.killed) {
        (Verdict::Failed(message), Some(memory)) => Verdict::Failed(format!("{memory}: {message}")),
        (other, _) => other,
    };
    if !end.stderr_tail.trim().is_empty() && !matches!(verdict, Verdict::Pushed { .. }) {
        output.push_str("\n--- agent stderr (end) ---\n");
        output.push_str(&end.stderr_tail);
    }
    (verdict, report, output)
}

/// The failure of a run agentry stopped when its priced usage (`cost`, as of the stop)
/// reached its `allowance`, or when the gateway refused a call for the `reason` it gave
/// (which budget the call did not fit).
fn budget_stop_message(
    cost: Option<Usd>,
    allowance: Option<Usd>,
    reason: Option<String>,
) -> String {
    if let Some(reason) = reason {
        let spent = cost.map_or_else(String::new, |c| format!(" after its calls cost {c} USD"));
        return format!("budget reached: {reason}; the agent was stopped{spent}");
    }
    let figures = match (cost, allowance) {
        (Some(cost), Some(allowance)) => {
            format!(" (its priced usage reached {cost} USD; this run's limit was {allowance} USD)")
        }
        _ => String::new(),
    };
    format!(
        "budget reached: the agent was stopped at this run's spending limit{figures} (the \
         least of what is left of maxCostPerTaskUsd and of the monthly budgets)"
    )
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
        AgentOutcome::MaxBudget => "budget reached: the agent stopped at this run's spending \
                                    limit (the least of what is left of maxCostPerTaskUsd and of \
                                    the monthly budgets)"
            .to_owned(),
        AgentOutcome::ApiError { .. } => report.outcome.describe(),
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
        JobKind::Coding { commit_message } | JobKind::Revision { commit_message, .. } => {
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

pub(crate) async fn remove_worktree(worktree: Worktree) {
    let path = worktree.path().to_owned();
    if let Err(e) = worktree.remove().await {
        tracing::warn!(worktree = %path.display(), error = %e, "could not remove a worktree");
    }
}

/// An empty directory at `path` (removing what a previous attempt left there).
pub(crate) async fn fresh_dir(path: &Path) -> std::io::Result<()> {
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
    // Read at most a few bytes: an unsandboxed agent could have made the file huge.
    let Some(text) = crate::files::read_small_text(&run_dir.join("agent.pid"), 64) else {
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

pub(crate) fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_tail_keeps_the_end_and_starts_on_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, "head\n{\"type\":\"result\"}\n").unwrap();
        let text = |max| read_tail(&path, max).unwrap().0;
        assert_eq!(text(1000), "head\n{\"type\":\"result\"}\n");
        assert_eq!(
            read_tail(&path, 18).unwrap(),
            ("{\"type\":\"result\"}\n".into(), 5)
        );
        // "é" is two bytes; a cut inside it starts after it.
        std::fs::write(&path, "aé{}").unwrap();
        assert_eq!(text(3), "{}");
        assert_eq!(text(4), "é{}");
        assert!(read_tail(&dir.path().join("missing"), 10).is_err());
    }

    #[test]
    fn the_tail_spans_the_rotated_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let rotated = process::rotated_log_path(&path);
        std::fs::write(&rotated, "old head\nmiddle\n").unwrap();
        std::fs::write(&path, "end\n").unwrap();
        assert_eq!(
            read_tail(&path, 100).unwrap(),
            ("old head\nmiddle\nend\n".into(), 0)
        );
        assert_eq!(read_tail(&path, 11).unwrap(), ("middle\nend\n".into(), 9));
        assert_eq!(read_tail(&path, 3).unwrap(), ("nd\n".into(), 17));
        // Just after a rotation, before the new log exists.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read_tail(&path, 7).unwrap(), ("middle\n".into(), 9));
        // A live tail that was cut is marked so the stored log says it was truncated.
        assert_eq!(note_dropped("end".into(), 0), "end");
        assert!(note_dropped("end".into(), 9).ends_with("not kept …]\nend"));
    }

    /// A runner under `root` that never starts an agent in these tests.
    fn test_runner(root: &Path) -> LocalRunner {
        LocalRunner::new(LocalConfig {
            root: root.to_owned(),
            claude_bin: "claude".into(),
            codex_bin: "codex".into(),
            prices: PriceTable::builtin(),
            env: ServiceEnv::default(),
            stop_grace: Duration::from_millis(100),
            sandbox: Sandbox::default(),
            network: None,
        })
    }

    /// A runner under a fresh directory (removed with the guard returned), a new task, and
    /// the run directory of its attempt `attempt`, made.
    fn dead_run(attempt: i32) -> (tempfile::TempDir, LocalRunner, Uuid, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let runner = test_runner(root.path());
        let task = Uuid::new_v4();
        let dir = runner.run_dir(task, attempt);
        std::fs::create_dir_all(&dir).unwrap();
        (root, runner, task, dir)
    }

    /// A dead run's cost is found even when its log was rotated in the middle of the final
    /// result event: salvage reads across both files.
    #[test]
    fn salvage_reads_a_rotated_log() {
        let attempt = 2;
        let (root, runner, task, dir) = dead_run(attempt);
        let result = r#"{"type":"result","subtype":"success","num_turns":2,"result":"Done.","total_cost_usd":0.987654321,"modelUsage":{"m":{"inputTokens":5,"outputTokens":7,"costUSD":0.987654321}}}"#;
        let (head, tail) = result.split_at(40);
        let init = r#"{"type":"system","subtype":"init","model":"m"}"#;
        std::fs::write(dir.join("output.log.1"), format!("{init}\n{head}")).unwrap();
        std::fs::write(dir.join("output.log"), format!("{tail}\n")).unwrap();

        let spec = agent::AgentSpec::unlimited(AgentType::ClaudeCode, "m");
        let Salvaged {
            output,
            report,
            metered,
        } = runner.salvage(task, attempt, &spec).unwrap();
        assert!(!metered, "a run without a network is not metered");
        assert!(output.ends_with(&format!("{result}\n")), "{output}");
        assert_eq!(
            report.outcome,
            AgentOutcome::Success,
            "{:?}",
            report.warnings
        );
        assert_eq!(report.cost_usd.unwrap().to_string(), "0.987654321");
        assert_eq!((report.tokens.input, report.tokens.output), (5, 7));
        assert_eq!(runner.live_output(task, attempt), Some(output));
        assert!(runner.salvage(Uuid::new_v4(), 1, &spec).is_none());

        // What is left behind: run directories only (other names are ignored); a discarded
        // run is no longer listed.
        let other = Uuid::new_v4();
        std::fs::create_dir_all(runner.run_dir(other, 1)).unwrap();
        std::fs::create_dir_all(root.path().join("runs").join(other.to_string()).join("x"))
            .unwrap();
        std::fs::create_dir_all(root.path().join("runs/not-a-task/1")).unwrap();
        let mut expected = vec![(task, 2), (other, 1)];
        expected.sort_unstable();
        assert_eq!(runner.leftovers(), expected);
        runner.discard(task, attempt);
        assert_eq!(runner.leftovers(), vec![(other, 1)]);
    }

    /// A Codex run stopped before its final event still has a cost: the calls Codex
    /// recorded in its session file, read back from the dead run's `HOME`.
    #[test]
    fn a_dead_codex_run_is_priced_from_its_session_file() {
        let attempt = 1;
        let (_root, runner, task, dir) = dead_run(attempt);
        let sessions = dir.join("home/.codex/sessions/2026/11/25");
        std::fs::create_dir_all(&sessions).unwrap();
        std::fs::write(
            dir.join("output.log"),
            "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"turn.started\"}\n",
        )
        .unwrap();
        std::fs::write(
            sessions.join("rollout-2026-11-25T21-27-44-t.jsonl"),
            r#"{"type":"token_usage_record","payload":{"response_id":"resp_1","usage":{"input_tokens":3000,"cached_input_tokens":1000,"cache_write_input_tokens":0,"output_tokens":100,"reasoning_output_tokens":20,"total_tokens":3100}}}
"#,
        )
        .unwrap();
        // The run had its network (the runner made its `net` directory): it was metered.
        std::fs::create_dir(dir.join("net")).unwrap();
        let spec = agent::AgentSpec::unlimited(AgentType::Codex, "gpt-5.5");
        let Salvaged {
            report, metered, ..
        } = runner.salvage(task, attempt, &spec).unwrap();
        assert!(metered);
        // 2000·5 + 1000·0.5 + 100·30 = 13 500 µ$.
        assert_eq!(report.cost_usd.unwrap().to_string(), "0.0135");
        assert_eq!((report.tokens.input, report.tokens.output), (3000, 100));
        assert!(matches!(report.outcome, AgentOutcome::Unparseable(_)));
    }
}
