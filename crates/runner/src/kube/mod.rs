//! [`KubeRunner`]: executes jobs as Kubernetes Jobs (`AGENTRY_RUNNER=kubernetes`,
//! docs/kubernetes.md), through kube-rs.
//!
//! What stays in the service is what a local run does there too: the run's network (its
//! model gateway and egress proxy sockets, its key and its meter, [`crate::network`]), git (the
//! mirror, the worktree, the commit and the push, [`crate::workspace`]) and the run directory
//! with the live log. What moves to the cluster is the agent: one Job per run
//! ([`spec::job`]) whose pod runs `agentry pod-run` ([`crate::pod`]) in the agent image. The
//! pod dials this replica's pod endpoint ([`endpoint`]) with the run's key (from a Secret the
//! Job owns) for the run's launch and files, for its model gateway and egress proxy, and for
//! the control connection that carries the agent's output and result in and the stop out.
//! The agent's changes come back as a patch, applied to the service's worktree and committed
//! there with the same checks as a local agent's.
//!
//! No code-host token and no model key is in the Job, the Secret or the launch: the launch's
//! environment is the one a local sandboxed agent gets ([`network::agent_environment`]).

pub mod endpoint;
pub mod spec;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_domain::AgentType;
use agentry_domain::backoff::Backoff;
use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job as KubeJob;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, watch};
use tokio::time::Instant;
use uuid::Uuid;

use crate::agent::{self, AgentSpec, Launch, ServiceEnv};
use crate::job::{Control, Execution, ExecutionFuture, Job, JobKind, Runner, Salvaged, Verdict};
use crate::local::{self, AgentEnd};
use crate::network::{self, RunMeter};
use crate::pod::{self, FromPod, PodEnded, PodResult, ToPod};
use crate::process::{self, Ended, STDERR_TAIL_BYTES, cancelled};
use crate::workspace::{GitSandbox, Workspaces, Worktree};
use crate::{PriceTable, RunReport};

use endpoint::Endpoint;
use spec::RunObjects;

/// The most characters kept of the sentence a pod sends when pod-run failed (pod-run's own
/// are a line or two).
const MAX_FAILURE_CHARS: usize = 2000;

/// The most bytes of patch a pod may send back.
const MAX_PATCH_BYTES: usize = 256 * 1024 * 1024;

/// How long a pod gets, after agentry asked it to stop, to send what its agent spent, beyond
/// the two steps of the stop ladder.
const STOP_SLACK: Duration = Duration::from_secs(15);

/// How long agentry waits for a pod whose control connection closed to show why.
const DEATH_WAIT: Duration = Duration::from_secs(20);

/// The waits between the tries of a request that cleans up after a run (a deletion, the
/// listing of a dead run's Jobs) and failed in a way that may pass ([`transient`]): 0.25 s,
/// 0.5 s, 1 s, 2 s.
const RETRY_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(250),
    max: Duration::from_secs(2),
};

/// The most tries of one such request.
const RETRY_TRIES: i32 = 5;

/// The longest one such request takes, its tries and waits together: a run is recorded after
/// its Job's deletion. (kube-rs itself retries a 429, 503 or 504 answer, for minutes.)
const RETRY_WITHIN: Duration = Duration::from_secs(15);

/// The Kubernetes runner's settings as the operator gives them (the service reads them from
/// its environment; docs/kubernetes.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// `AGENTRY_KUBE_NAMESPACE`: the Jobs' namespace (default `default`).
    pub namespace: String,
    /// `AGENTRY_AGENT_IMAGE`: the agent image (required).
    pub image: String,
    /// `AGENTRY_KUBE_POD_COMMAND`: the pod's command, words separated by blanks, instead of the
    /// image's entry point.
    pub pod_command: Option<Vec<String>>,
    /// `AGENTRY_KUBE_LISTEN`: where this replica listens for its agents' pods (default
    /// `0.0.0.0:4812`).
    pub listen: SocketAddr,
    /// `AGENTRY_KUBE_ENDPOINT`: the host:port pods dial to reach this replica, or a host alone
    /// for the port of `AGENTRY_KUBE_LISTEN` (required; the chart sets the pod's IP).
    pub endpoint: String,
    /// `AGENTRY_KUBE_AGENT_CPU`: each agent pod's CPU, requests = limits (default `2`).
    pub cpu: Option<String>,
    /// `AGENTRY_KUBE_AGENT_MEMORY`: each agent pod's memory, requests = limits (default `4Gi`).
    pub memory: Option<String>,
    /// `AGENTRY_KUBE_WORK_SIZE`: the size limit of a pod's work volume (default `10Gi`).
    pub work_size: String,
    /// `AGENTRY_KUBE_START_TIMEOUT`: seconds a pod may take to start (default 300).
    pub start_timeout: Duration,
    /// `AGENTRY_KUBE_ALLOW_API_REACH`: `1` runs agents whose pods reach the Kubernetes API
    /// (NetworkPolicy not enforced); default `0`.
    pub allow_api_reach: bool,
    /// `AGENTRY_KUBE_INSTANCE`: the installation's name on its agent pods (default
    /// `agentry`).
    pub instance: String,
}

/// What a [`KubeRunner`] needs: its [`KubeSettings`] and what the service adds.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// The data directory: workspaces and run directories, as for a local runner.
    pub root: PathBuf,
    /// What the operator configured (`AGENTRY_KUBE_*`, `AGENTRY_AGENT_IMAGE`).
    pub settings: KubeSettings,
    /// The size limit of the pod's `/tmp`.
    pub tmp_size: String,
    /// This replica's name, a label of the Jobs it starts.
    pub replica: String,
    /// The Claude Code executable in the agent image.
    pub claude_bin: PathBuf,
    /// The Codex executable in the agent image.
    pub codex_bin: PathBuf,
    /// Prices for agents that report tokens only.
    pub prices: PriceTable,
    /// What of the service's environment reaches agents; only `AGENTRY_AGENT_ENV`'s
    /// variables do here, never the service's `PATH` or credentials.
    pub env: ServiceEnv,
    /// Each step of the stop ladder.
    pub stop_grace: Duration,
    /// The runs' network: the model gateway and egress proxy.
    pub network: Arc<dyn network::Network>,
    /// The sandbox of the git steps that read what the agent changed (its patch applied), as
    /// a local runner's; `None`: they run unsandboxed.
    pub git_sandbox: Option<GitSandbox>,
}

impl KubeConfig {
    #[cfg(test)]
    fn for_tests() -> KubeConfig {
        #[derive(Debug)]
        struct NoNetwork;
        impl network::Network for NoNetwork {
            fn open<'a>(&'a self, _: &'a network::RunInfo, _: &'a Path) -> network::OpenFuture<'a> {
                Box::pin(async { Err("no network in this test".to_owned()) })
            }
        }
        KubeConfig {
            root: PathBuf::from("/nonexistent"),
            settings: KubeSettings {
                namespace: "agents".to_owned(),
                image: "agentry-agent:test".to_owned(),
                pod_command: None,
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                endpoint: "10.0.0.1:4812".to_owned(),
                cpu: Some("1".to_owned()),
                memory: Some("1Gi".to_owned()),
                work_size: "10Gi".to_owned(),
                start_timeout: Duration::from_secs(300),
                allow_api_reach: false,
                instance: "agentry".to_owned(),
            },
            tmp_size: "1Gi".to_owned(),
            replica: "agentry-r1".to_owned(),
            claude_bin: "claude".into(),
            codex_bin: "codex".into(),
            prices: PriceTable::builtin(),
            env: ServiceEnv::default(),
            stop_grace: Duration::from_secs(5),
            network: Arc::new(NoNetwork),
            git_sandbox: None,
        }
    }
}

/// Runs jobs as Kubernetes Jobs (see the module docs).
pub struct KubeRunner {
    config: KubeConfig,
    workspaces: Workspaces,
    endpoint: Arc<Endpoint>,
    /// The bound listener, until the endpoint serves it (in the first run's runtime).
    listener: parking_lot::Mutex<Option<std::net::TcpListener>>,
    client: OnceCell<kube::Client>,
}

impl std::fmt::Debug for KubeRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRunner")
            .field("namespace", &self.config.settings.namespace)
            .field("image", &self.config.settings.image)
            .finish_non_exhaustive()
    }
}

impl KubeRunner {
    /// A runner with `config`, its pod endpoint bound (served from the first run on).
    ///
    /// # Errors
    ///
    /// A sentence when the endpoint's address cannot be bound.
    pub fn new(mut config: KubeConfig) -> Result<KubeRunner, String> {
        let listener = std::net::TcpListener::bind(config.settings.listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                format!(
                    "cannot listen for agent pods on {} (AGENTRY_KUBE_LISTEN): {e}",
                    config.settings.listen
                )
            })?;
        if !config.settings.endpoint.contains(':') {
            let port = listener
                .local_addr()
                .map_err(|e| format!("cannot read the pod endpoint's address: {e}"))?
                .port();
            config.settings.endpoint = format!("{}:{port}", config.settings.endpoint);
        }
        let mut workspaces = Workspaces::new(config.root.join("workspaces"));
        if let Some(git_sandbox) = config.git_sandbox.clone() {
            workspaces = workspaces.with_git_sandbox(git_sandbox);
        }
        Ok(KubeRunner {
            config,
            workspaces,
            endpoint: Arc::new(Endpoint::default()),
            listener: parking_lot::Mutex::new(Some(listener)),
            client: OnceCell::new(),
        })
    }

    /// The address the pod endpoint listens on.
    pub fn listen_address(&self) -> Option<SocketAddr> {
        self.listener
            .lock()
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The Kubernetes client: from `KUBECONFIG` (or `~/.kube/config`) or the pod's service
    /// account, made once.
    ///
    /// # Errors
    ///
    /// A sentence when no configuration is found or it is not valid.
    pub async fn client(&self) -> Result<kube::Client, String> {
        self.client
            .get_or_try_init(|| async {
                kube::Client::try_default().await.map_err(|e| {
                    format!(
                        "no Kubernetes API configuration (KUBECONFIG, or the pod's service \
                         account): {e}"
                    )
                })
            })
            .await
            .cloned()
    }

    /// Starts serving the pod endpoint, once.
    fn serve_endpoint(&self) -> Result<(), String> {
        let Some(listener) = self.listener.lock().take() else {
            return Ok(());
        };
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("cannot serve the pod endpoint: {e}"))?;
        tokio::spawn(Arc::clone(&self.endpoint).serve(listener));
        Ok(())
    }

    /// The directory of one run (its live log), as for a local runner.
    pub fn run_dir(&self, task_id: Uuid, attempt: i32) -> PathBuf {
        local::run_dir_under(&self.config.root, task_id, attempt)
    }

    fn program(&self, agent_type: AgentType) -> &Path {
        match agent_type {
            AgentType::ClaudeCode => &self.config.claude_bin,
            AgentType::Codex => &self.config.codex_bin,
        }
    }

    /// The Jobs, Secrets and Pods of the runs' namespace.
    fn apis(&self, client: &kube::Client) -> (Api<KubeJob>, Api<Secret>, Api<Pod>) {
        let ns = &self.config.settings.namespace;
        (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        )
    }

    /// Runs `job` to its end, in the local runner's steps where they are the same: check
    /// that its allowance can be enforced and the cluster reached, open the run's network in
    /// its run directory, materialise the worktree ([`local::materialise_worktree`]), run
    /// the agent in its pod and conclude ([`KubeRunner::run_in_pod`]).
    async fn run(&self, job: Job, control: Control) -> Execution {
        let mut start = local::RunStart::new(job.agent.agent_type, true, local::now());
        if let Err(message) = agent::budget_enforceable(&job.agent, &self.config.prices) {
            return start.failed(message);
        }
        let client = match self.client().await {
            Ok(client) => client,
            Err(message) => return start.failed(message),
        };
        if let Err(message) = self.serve_endpoint() {
            return start.failed(message);
        }
        let run_dir = self.run_dir(job.task_id, job.attempt);
        let net_dir = run_dir.join("net");
        if let Err(e) = local::fresh_dir(&net_dir).await {
            return start.failed(format!(
                "could not create the run directory {}: {e}",
                net_dir.display()
            ));
        }
        let network = match self
            .config
            .network
            .open(&local::run_info(&job), &net_dir)
            .await
        {
            Ok(network) => network,
            Err(message) => {
                return start.failed(format!("could not open the agent's network: {message}"));
            }
        };
        start.metered = true;
        let worktree = match local::materialise_worktree(&self.workspaces, &job).await {
            Ok(worktree) => worktree,
            Err(message) => return start.failed(message),
        };
        let execution = self
            .run_in_pod(&job, control, &client, &network, &net_dir, &worktree)
            .await;
        drop(network);
        local::remove_worktree(worktree).await;
        match execution {
            Ok((verdict, report, ended, output)) => start.finished(verdict, report, ended, output),
            Err(message) => start.failed(message),
        }
    }

    /// Runs `job`'s agent in its pod and concludes: the verdict, the report, how the agent
    /// ended and its output, or a sentence when it could not run.
    async fn run_in_pod(
        &self,
        job: &Job,
        mut control: Control,
        client: &kube::Client,
        network: &network::RunNetwork,
        net_dir: &Path,
        worktree: &Worktree,
    ) -> Result<(Verdict, Option<RunReport>, Option<Ended>, String), String> {
        let mut launch = self.launch(job, worktree, &network.key).await;
        let history = self.history(job, worktree, net_dir).await;
        launch.history = history.as_ref().map(|_| worktree.base_commit().to_owned());
        let (registration, control_rx) = self.endpoint.register(
            &network.key,
            net_dir.to_owned(),
            launch,
            worktree.path().to_owned(),
            history,
        );
        if *control.cancel.borrow() {
            return Ok((Verdict::Cancelled, None, None, String::new()));
        }
        let objects = RunObjects {
            task: job.task_id,
            attempt: job.attempt,
            replica: &self.config.replica,
            wall_time: job.wall_time,
            stop_grace: self.config.stop_grace,
        };
        let (jobs, secrets, pods) = self.apis(client);
        let name = spec::job_name(job.task_id, job.attempt);
        // One bound on the pod's start, from here: the objects made, then the pod connected.
        let start_deadline = Instant::now() + self.config.settings.start_timeout;
        let created = self
            .create_within_start(
                &jobs,
                &secrets,
                &objects,
                &network.key,
                (start_deadline, &control),
            )
            .await;
        let result = match created {
            Ok(false) => Ok((PodEnd::before_start(Ended::Cancelled), self.parser(job))),
            Ok(true) => {
                let pod_state = PodState::follow(pods, &name);
                let ran = self
                    .attend(
                        job,
                        (&mut control, start_deadline),
                        control_rx,
                        &pod_state,
                        network,
                    )
                    .await;
                pod_state.stop();
                ran
            }
            Err(message) => Err(message),
        };
        drop(registration);
        delete_job(&jobs, &name).await;
        let (end, parser) = result?;
        let mut end = end;
        let published = matches!(end.end.ended, Ended::Exited { code: Some(0), .. })
            && !matches!(job.kind, JobKind::Review { .. });
        if published
            && end.end.unpublishable.is_none()
            && let Some(patch) = end.patch.take()
        {
            end.end.unpublishable = Self::apply(worktree, patch).await.err();
        }
        let ended = end.end.ended.clone();
        let (verdict, report, output) = local::conclude(
            job,
            end.end,
            parser,
            Some(&network.meter),
            worktree,
            &control.cancel,
        )
        .await;
        Ok((verdict, Some(report), Some(ended), output))
    }

    /// The launch of `job`'s agent in its pod: the command line and environment a local
    /// sandboxed agent would get, with the pod's paths.
    async fn launch(&self, job: &Job, worktree: &Worktree, key: &str) -> pod::Launch {
        let agent_type = job.agent.agent_type;
        let launch = Launch {
            sandboxed: true,
            review: matches!(job.kind, JobKind::Review { .. }),
        };
        let service_env = ServiceEnv {
            path: None,
            credentials: Vec::new(),
            passed: self.config.env.passed.clone(),
        };
        let env = agent::environment(agent_type, launch, Path::new(spec::POD_HOME), &service_env);
        let env = network::agent_environment(agent_type, env, key);
        let prompt = local::prompt_for(job, worktree).await;
        let command = agent::command(
            &job.agent,
            launch,
            self.program(agent_type),
            &prompt,
            Path::new(spec::POD_WORKTREE),
            env,
        );
        let mut argv = vec![command.program.to_string_lossy().into_owned()];
        argv.extend(command.args);
        pod::Launch {
            argv,
            env: command.env,
            stdin: command.stdin,
            workdir: spec::POD_WORKTREE.to_owned(),
            home: spec::POD_HOME.to_owned(),
            patch: !launch.review,
            stop_grace_ms: u64::try_from(self.config.stop_grace.as_millis()).unwrap_or(u64::MAX),
            allow_api_reach: self.config.settings.allow_api_reach,
            history: None,
        }
    }

    /// A git bundle (beside the run's network directory) of the history the pod needs: the
    /// default branch, and the pull request's branch for a review or a revision. `None`
    /// (with a warning) when it cannot be made: the pod then gets a repository of one
    /// commit.
    async fn history(&self, job: &Job, worktree: &Worktree, net_dir: &Path) -> Option<PathBuf> {
        let out = net_dir.with_file_name("history.bundle");
        let mut branches = vec![job.repo.default_branch.as_str()];
        match &job.kind {
            JobKind::Review { branch } | JobKind::Revision { branch, .. } => {
                branches.push(branch.as_str());
            }
            JobKind::Coding { .. } => {}
        }
        match worktree.history_bundle(&out, &branches).await {
            Ok(()) => Some(out),
            Err(e) => {
                tracing::warn!(task = %job.task_id, error = %e, "the agent's pod gets no history");
                None
            }
        }
    }

    /// Creates the run's Secret, then its Job, then makes the Job the Secret's owner (so the
    /// cluster deletes the Secret with the Job; [`create_objects`]), ended at `deadline` (the
    /// pod's start) or by a cancel: the API
    /// server may stall, or keep answering 429 with long waits, and kube-rs's own retries
    /// then last minutes. `Ok(false)` when cancelled. A start cut off may still land (a
    /// request already sent): it is left to finish in the background, then its Secret and
    /// Job are deleted.
    async fn create_within_start(
        &self,
        jobs: &Api<KubeJob>,
        secrets: &Api<Secret>,
        objects: &RunObjects<'_>,
        key: &str,
        (deadline, control): (Instant, &Control),
    ) -> Result<bool, String> {
        let secret = spec::secret(&self.config, objects, key)?;
        let job = spec::job(&self.config, objects)?;
        let mut creating = tokio::spawn(create_objects(jobs.clone(), secrets.clone(), secret, job));
        let mut cancel = control.cancel.clone();
        let cut_off = tokio::select! {
            created = &mut creating => {
                return created.map_err(|e| format!("the agent's start failed: {e}"))?.map(|()| true);
            }
            () = tokio::time::sleep_until(deadline) => Err(format!(
                "the cluster did not take the agent's Job within the start timeout ({} s)",
                self.config.settings.start_timeout.as_secs()
            )),
            () = cancelled(&mut cancel) => Ok(false),
        };
        let (jobs, secrets) = (jobs.clone(), secrets.clone());
        let name = spec::job_name(objects.task, objects.attempt);
        tokio::spawn(async move {
            // kube-rs's own retries end (15 of them, each under its timeouts); a request that
            // never answers is given up at last.
            if tokio::time::timeout(ABANDONED_START_WAIT, &mut creating)
                .await
                .is_err()
            {
                creating.abort();
            }
            delete_secret(&secrets, &name).await;
            delete_job(&jobs, &name).await;
        });
        cut_off
    }

    /// Waits for the pod to connect, then follows the run to its end: its output into the
    /// live log and the parser, the stop on cancel, time limit or budget, the result.
    async fn attend(
        &self,
        job: &Job,
        (control, start_deadline): (&mut Control, Instant),
        control_rx: tokio::sync::oneshot::Receiver<TcpStream>,
        pod_state: &PodState,
        network: &network::RunNetwork,
    ) -> Result<(PodEnd, agent::OutputParser), String> {
        let mut cancel = control.cancel.clone();
        let mut pods = pod_state.receiver();
        let mut control_rx = control_rx;
        let stream = loop {
            tokio::select! {
                stream = &mut control_rx => match stream {
                    Ok(stream) => break stream,
                    Err(_) => return Err("the pod endpoint stopped".to_owned()),
                },
                () = cancelled(&mut cancel) => {
                    return Ok((PodEnd::before_start(Ended::Cancelled), self.parser(job)));
                }
                () = tokio::time::sleep_until(start_deadline) => {
                    let last = pods.borrow().as_ref().and_then(start_problem);
                    return Err(match last {
                        Some(why) => format!(
                            "the agent's pod did not start within {} s \
                             (AGENTRY_KUBE_START_TIMEOUT): {why}",
                            self.config.settings.start_timeout.as_secs()
                        ),
                        None => format!(
                            "the agent's pod did not start within {} s \
                             (AGENTRY_KUBE_START_TIMEOUT)",
                            self.config.settings.start_timeout.as_secs()
                        ),
                    });
                }
                changed = pods.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    let ended = pods.borrow().as_ref().and_then(|pod| {
                        Some((pod_ended(pod, &self.config)?, pod.metadata.name.clone()?))
                    });
                    if let Some((why, name)) = ended {
                        let said = pod_state.log_tail(&name).await;
                        return Err(format!(
                            "the agent's pod ended before its agent started: {why}{said}"
                        ));
                    }
                    // Deleted while pending (by an operator, a preemption): the Job, which
                    // never retries, makes no other, so waiting for the start is vain.
                    if pods.borrow().as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_some()) {
                        return Err("the agent's pod was deleted before its agent started".to_owned());
                    }
                }
            }
        };
        if let Some(started) = control.started.take() {
            let _ = started.send(());
        }
        self.follow(job, stream, &mut cancel, pod_state, &network.meter)
            .await
    }

    fn parser(&self, job: &Job) -> agent::OutputParser {
        agent::OutputParser::new(&job.agent, &self.config.prices)
    }

    /// Follows a connected run to its end: its frames read ([`read_frames`]), its output
    /// streamed and metered until it ends or is stopped ([`KubeRunner::stream_pod`]), and
    /// how it ended made of its result ([`KubeRunner::pod_end`]).
    async fn follow(
        &self,
        job: &Job,
        stream: TcpStream,
        cancel: &mut watch::Receiver<bool>,
        pod_state: &PodState,
        meter: &Arc<RunMeter>,
    ) -> Result<(PodEnd, agent::OutputParser), String> {
        let (from_pod, mut to_pod) = stream.into_split();
        let (reader, mut frames) = read_frames(from_pod);
        let mut parser = self.parser(job);
        let mut pod = pod_state.receiver();
        let streamed = self
            .stream_pod(
                job,
                &mut frames,
                &mut to_pod,
                &mut parser,
                cancel,
                meter,
                &mut pod,
            )
            .await;
        reader.abort();
        let end = self.pod_end(streamed?, pod_state).await?;
        Ok((end, parser))
    }

    /// Streams the pod's output to the run's live log and `parser` and collects its patch
    /// until its result comes or the connection ends; asks the pod to stop at the wall
    /// time, on `cancel`, or once the run's allowance or budget is reached (`meter`), and
    /// gives up on it after the stop's grace. Once the cluster says the pod is gone or over
    /// (`pod`, [`pod_gone`]) it waits for the connection's last frames at most as long as for
    /// a stop: a pod on a lost node never closes its connection.
    #[allow(
        clippy::too_many_arguments,
        reason = "the run's channels, each used once"
    )]
    async fn stream_pod(
        &self,
        job: &Job,
        frames: &mut tokio::sync::mpsc::Receiver<std::io::Result<Option<FromPod>>>,
        to_pod: &mut tokio::net::tcp::OwnedWriteHalf,
        parser: &mut agent::OutputParser,
        cancel: &mut watch::Receiver<bool>,
        meter: &Arc<RunMeter>,
        pod: &mut watch::Receiver<Option<Pod>>,
    ) -> Result<Streamed, String> {
        let log_path = self.run_dir(job.task_id, job.attempt).join("output.log");
        let mut log = process::LogFile::create(&log_path)
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Output::default();
        let deadline = Instant::now() + job.wall_time;
        let mut polls = tokio::time::interval(process::POLL_INTERVAL);
        let mut stopping: Option<(Ended, Instant)> = None;
        let patch_path = self.run_dir(job.task_id, job.attempt).join("agent.patch");
        let mut patch = PatchFile::new(patch_path, MAX_PATCH_BYTES);
        let mut gone: Option<Instant> = None;
        let result = loop {
            let stop_now = tokio::select! {
                frame = frames.recv() => match frame.unwrap_or(Ok(None)) {
                    Ok(Some(FromPod::Stdout(chunk))) => {
                        parser.feed(&chunk);
                        if let Err(e) = log.append(&chunk).await {
                            tracing::warn!(task = %job.task_id, error = %e, "cannot write the live log");
                        }
                        out.push(&chunk);
                        None
                    }
                    Ok(Some(FromPod::Patch(chunk))) => {
                        patch.push(&chunk).await;
                        None
                    }
                    Ok(Some(FromPod::Result(result))) => break Some(result),
                    Ok(None) | Err(_) => break None,
                },
                () = cancelled(cancel), if stopping.is_none() => Some(Ended::Cancelled),
                () = tokio::time::sleep_until(deadline), if stopping.is_none() => Some(Ended::TimedOut),
                _ = polls.tick() => None,
                () = sleep_until_opt(stopping.as_ref().map(|(_, at)| *at)) => break None,
                () = sleep_until_opt(gone), if stopping.is_none() => break None,
            };
            if gone.is_none()
                && pod
                    .borrow_and_update()
                    .as_ref()
                    .is_some_and(|p| pod_gone(p, &self.config))
            {
                tracing::info!(task = %job.task_id, "the cluster says the agent's pod is over; waiting for its last frames");
                // As long as a stop it asked for: the pod's own stop ladder may be running.
                gone = Some(Instant::now() + self.config.stop_grace * 2 + STOP_SLACK);
            }
            let wanted = stop_now.or_else(|| {
                (stopping.is_none() && (parser.allowance_reached() || meter.is_exhausted()))
                    .then_some(Ended::Stopped)
            });
            if let Some(why) = wanted
                && stopping.is_none()
            {
                // A pod that cannot be told is stopped by deleting its Job below.
                let _ = pod::write_to_pod(to_pod, &ToPod::Stop).await;
                let give = self.config.stop_grace * 2 + STOP_SLACK;
                stopping = Some((why, Instant::now() + give));
            }
        };
        Ok(Streamed {
            result,
            stopping,
            out,
            patch,
        })
    }

    /// How the pod's agent ended, as [`local::conclude`] reads it, from what
    /// [`KubeRunner::stream_pod`] collected, or what the cluster says of a pod that ended
    /// without a result (`pod_state`); a failure the pod reported fails the run.
    async fn pod_end(&self, streamed: Streamed, pod_state: &PodState) -> Result<PodEnd, String> {
        let Streamed {
            result,
            stopping,
            out,
            patch,
        } = streamed;
        let (stdout, dropped) = out.finish();
        let mut patch_unusable = false;
        let mut end = AgentEnd {
            ended: Ended::Exited {
                code: None,
                signal: None,
            },
            stdout,
            stdout_dropped: dropped,
            stderr_tail: String::new(),
            killed: None,
            unpublishable: None,
        };
        match result {
            Some(PodResult {
                ended,
                stderr_tail,
                failure,
                oom_kills,
            }) => {
                // The pod is the agent's: what it sends is held to what pod-run sends.
                end.stderr_tail =
                    agentry_domain::quote::tail(&stderr_tail, STDERR_TAIL_BYTES).to_owned();
                if oom_kills > 0 {
                    end.killed = Some(self.out_of_memory());
                }
                if let Some(failure) = failure {
                    let failure = agentry_domain::quote::excerpt(&failure, MAX_FAILURE_CHARS);
                    if ended == PodEnded::NotStarted {
                        return Err(failure);
                    }
                    // pod-run failed after its agent ran (collecting the agent's changes):
                    // the run keeps the agent's output and report, and fails with that
                    // failure instead of publishing; the patch frames are not used.
                    end.unpublishable = Some(failure);
                    patch_unusable = true;
                }
                end.ended = match (stopping, ended) {
                    (Some((why, _)), _) => why,
                    (None, PodEnded::Exited { code, signal }) => Ended::Exited { code, signal },
                    (None, PodEnded::Stopped) => {
                        end.killed = Some(
                            "the agent's pod was stopped by the cluster (deleted, evicted or \
                             past its deadline)"
                                .to_owned(),
                        );
                        Ended::Exited {
                            code: None,
                            signal: Some(libc::SIGTERM),
                        }
                    }
                    (None, PodEnded::NotStarted) => {
                        return Err("the agent's pod did not start its agent".to_owned());
                    }
                };
            }
            None => {
                // The pod died, or did not answer its stop: what the cluster says of it.
                let why = pod_state.why_ended(&self.config, DEATH_WAIT).await;
                end.ended = match stopping {
                    Some((why, _)) => why,
                    None => Ended::Exited {
                        code: None,
                        signal: Some(libc::SIGKILL),
                    },
                };
                if matches!(end.ended, Ended::Exited { .. }) {
                    end.killed = Some(why.unwrap_or_else(|| {
                        "the agent's pod ended without a result (its connection to agentry \
                         closed)"
                            .to_owned()
                    }));
                }
            }
        }
        let patch = match patch.finish().await {
            Ok(patch) => patch.filter(|_| !patch_unusable),
            Err(problem) => {
                end.unpublishable.get_or_insert(problem);
                None
            }
        };
        Ok(PodEnd { end, patch })
    }

    fn out_of_memory(&self) -> String {
        out_of_memory(&self.config)
    }

    /// Applies the agent's `patch` to `worktree` ([`Worktree::apply_patch`]).
    async fn apply(worktree: &Worktree, patch: PathBuf) -> Result<(), String> {
        worktree
            .apply_patch_file(&patch)
            .await
            .map_err(|e| format!("could not apply the agent's changes: {e}"))
    }
}

/// Checks what a Kubernetes runner needs of its cluster, with the client of `KUBECONFIG` (or
/// the pod's service account): the API answers, the `namespace` exists and every
/// permission the runner uses is granted there. One sentence per problem; none when all is
/// well.
pub async fn check_cluster(namespace: &str) -> Vec<String> {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            return vec![format!(
                "no Kubernetes API configuration (KUBECONFIG, or the pod's service account): {e}"
            )];
        }
    };
    if let Err(e) = client.apiserver_version().await {
        return vec![format!("the Kubernetes API does not answer: {e}")];
    }
    let mut problems = Vec::new();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    match namespaces.get_opt(namespace).await {
        Ok(Some(_)) => {}
        Ok(None) => problems.push(format!(
            "the namespace {namespace} (AGENTRY_KUBE_NAMESPACE) does not exist"
        )),
        // Reading namespaces is not a permission the runner needs.
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        Err(e) => problems.push(format!("cannot look up the namespace {namespace}: {e}")),
    }
    for (group, resource, verbs) in NEEDED {
        for verb in *verbs {
            match can_i(&client, namespace, group, resource, verb).await {
                Ok(true) => {}
                Ok(false) => problems.push(format!(
                    "agentry may not {verb} {resource} in the namespace {namespace} (the \
                     chart's Role grants it)"
                )),
                Err(e) => {
                    problems.push(format!("cannot check the permissions: {e}"));
                    return problems;
                }
            }
        }
    }
    problems
}

/// The permissions the runner uses in its namespace: the chart's Role grants exactly these.
const NEEDED: &[(&str, &str, &[&str])] = &[
    (
        "batch",
        "jobs",
        &["create", "get", "list", "watch", "delete"],
    ),
    ("", "pods", &["get", "list", "watch"]),
    ("", "pods/log", &["get"]),
    ("", "secrets", &["create", "get", "patch", "delete"]),
];

/// Whether this client may `verb` `resource` (with a subresource after `/`) of `group` in
/// `namespace`, by a SelfSubjectAccessReview.
async fn can_i(
    client: &kube::Client,
    namespace: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                verb: Some(verb.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// How a pod's run ended, and its patch.
struct PodEnd {
    end: AgentEnd,
    /// The file the agent's patch was written to, if it sent one that can be used.
    patch: Option<PathBuf>,
}

impl PodEnd {
    fn before_start(ended: Ended) -> PodEnd {
        PodEnd {
            end: AgentEnd {
                ended,
                stdout: String::new(),
                stdout_dropped: 0,
                stderr_tail: String::new(),
                killed: None,
                unpublishable: None,
            },
            patch: None,
        }
    }
}

/// The end of the agent's stdout kept in memory, as a local run keeps it.
#[derive(Default)]
struct Output {
    kept: Vec<u8>,
    total: u64,
}

impl Output {
    fn push(&mut self, chunk: &[u8]) {
        let keep = process::STDOUT_MEMORY_CAP;
        self.total = self.total.saturating_add(chunk.len() as u64);
        self.kept.extend_from_slice(chunk);
        if self.kept.len() > keep + keep / 4 {
            let excess = self.kept.len() - keep;
            self.kept.drain(..excess);
        }
    }

    fn finish(mut self) -> (String, u64) {
        let keep = process::STDOUT_MEMORY_CAP;
        if self.kept.len() > keep {
            let excess = self.kept.len() - keep;
            self.kept.drain(..excess);
        }
        let dropped = self.total.saturating_sub(self.kept.len() as u64);
        let bytes = if dropped > 0 {
            process::skip_partial_char(self.kept)
        } else {
            self.kept
        };
        (process::lossy(bytes), dropped)
    }
}

/// The latest state of a run's pod, kept by a watch of the Job's pods.
struct PodState {
    pods: Api<Pod>,
    state: watch::Receiver<Option<Pod>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodState {
    /// Watches the pods of the Job `job_name` (by the Job controller's label).
    fn follow(pods: Api<Pod>, job_name: &str) -> PodState {
        let (tx, state) = watch::channel(None);
        let config =
            watcher::Config::default().labels(&format!("{}={job_name}", spec::JOB_NAME_LABEL));
        let watched = pods.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(watched, config));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        let _ = tx.send(Some(pod));
                    }
                    // Gone from the API (deleted at once, or its node's pods removed): kept
                    // as a pod being deleted, so the run stops waiting for it.
                    Ok(watcher::Event::Delete(mut pod)) => {
                        if pod.metadata.deletion_timestamp.is_none() {
                            pod.metadata.deletion_timestamp =
                                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                    k8s_openapi::jiff::Timestamp::now(),
                                ));
                        }
                        let _ = tx.send(Some(pod));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "watching an agent pod failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        PodState { pods, state, task }
    }

    /// `; it said: <the last lines of its log>`, or nothing when it said nothing or the
    /// log cannot be read.
    async fn log_tail(&self, pod: &str) -> String {
        let params = kube::api::LogParams {
            tail_lines: Some(5),
            ..kube::api::LogParams::default()
        };
        match self.pods.logs(pod, &params).await {
            Ok(text) if !text.trim().is_empty() => {
                format!("; it said: {}", text.trim().replace('\n', " / "))
            }
            _ => String::new(),
        }
    }

    fn receiver(&self) -> watch::Receiver<Option<Pod>> {
        self.state.clone()
    }

    /// Why the pod ended, waiting up to `wait` for the cluster to say.
    async fn why_ended(&self, config: &KubeConfig, wait: Duration) -> Option<String> {
        let mut state = self.state.clone();
        let found = tokio::time::timeout(wait, async {
            loop {
                if let Some(why) = state
                    .borrow()
                    .as_ref()
                    .and_then(|pod| pod_ended(pod, config))
                {
                    return why;
                }
                if state.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
        .await;
        found.ok()
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Why `pod` cannot start yet, as its status says (an image that cannot be pulled, a
/// configuration error, no node to run it), if it says.
fn start_problem(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    for container in status.container_statuses.iter().flatten() {
        if let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref())
            && let Some(reason) = &waiting.reason
            && reason != "ContainerCreating"
        {
            return Some(match &waiting.message {
                Some(message) => format!("{reason}: {message}"),
                None => reason.clone(),
            });
        }
    }
    status.conditions.iter().flatten().find_map(|c| {
        (c.type_ == "PodScheduled" && c.status == "False").then(|| {
            format!(
                "it cannot be scheduled ({}): {}",
                c.reason.as_deref().unwrap_or("Unschedulable"),
                c.message.as_deref().unwrap_or("no node fits it")
            )
        })
    })
}

/// Whether the cluster says `pod` is over: being deleted (by an operator, a drain, or the
/// node controller for a lost node), in a final phase, or its container ended.
fn pod_gone(pod: &Pod, config: &KubeConfig) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some("Succeeded" | "Failed"))
        || pod_ended(pod, config).is_some()
}

/// Why `pod` ended, if it did: killed for memory, evicted, or its container's end.
fn pod_ended(pod: &Pod, config: &KubeConfig) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        return Some(format!(
            "the agent's pod was evicted: {}",
            status.message.as_deref().unwrap_or("no message")
        ));
    }
    for container in status.container_statuses.iter().flatten() {
        if let Some(done) = container.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            return Some(match done.reason.as_deref() {
                Some("OOMKilled") => out_of_memory(config),
                reason => format!(
                    "the agent's pod ended ({}, exit code {})",
                    reason.unwrap_or("no reason given"),
                    done.exit_code
                ),
            });
        }
    }
    match status.phase.as_deref() {
        Some("Failed") => Some(format!(
            "the agent's pod failed: {}",
            status
                .message
                .as_deref()
                .or(status.reason.as_deref())
                .unwrap_or("no reason given")
        )),
        _ => None,
    }
}

/// The failure of a pod whose agent the kernel stopped for memory.
fn out_of_memory(config: &KubeConfig) -> String {
    format!(
        "the agent's pod ran out of memory (AGENTRY_KUBE_AGENT_MEMORY, {}) and the kernel \
         stopped the agent",
        config.settings.memory.as_deref().unwrap_or("no limit set")
    )
}

/// What [`KubeRunner::stream_pod`] collected of a run: the pod's result (`None`: the
/// connection ended without one), the stop asked for and until when it was waited for,
/// the output and the patch.
struct Streamed {
    result: Option<PodResult>,
    stopping: Option<(Ended, Instant)>,
    out: Output,
    patch: PatchFile,
}

/// The agent's patch as its frames arrive, written to a private file of the run's directory
/// as it comes (never held in memory: an agent's changes may weigh hundreds of megabytes),
/// at most `max` bytes ([`MAX_PATCH_BYTES`]).
struct PatchFile {
    path: PathBuf,
    max: usize,
    file: Option<tokio::fs::File>,
    len: usize,
    /// Why the patch cannot be used (too large, or not written), once it cannot.
    problem: Option<String>,
}

impl PatchFile {
    fn new(path: PathBuf, max: usize) -> PatchFile {
        PatchFile {
            path,
            max,
            file: None,
            len: 0,
            problem: None,
        }
    }

    /// Appends `chunk`, unless the patch can no longer be used.
    async fn push(&mut self, chunk: &[u8]) {
        use tokio::io::AsyncWriteExt;
        if self.problem.is_some() {
            return;
        }
        if self.len + chunk.len() > self.max {
            self.problem = Some(format!(
                "the agent's changes are larger than {} bytes",
                self.max
            ));
            self.file = None;
            return;
        }
        let written = match &mut self.file {
            Some(file) => file.write_all(chunk).await,
            None => match crate::user::private_file(&self.path) {
                Ok(file) => {
                    let mut file = tokio::fs::File::from_std(file);
                    let written = file.write_all(chunk).await;
                    self.file = Some(file);
                    written
                }
                Err(e) => Err(e),
            },
        };
        match written {
            Ok(()) => self.len += chunk.len(),
            Err(e) => {
                self.problem = Some(format!("could not keep the agent's changes: {e}"));
                self.file = None;
            }
        }
    }

    /// The patch's file, written whole and flushed, if the agent sent one (`Ok(None)`: it
    /// sent none); why it cannot be used otherwise.
    async fn finish(mut self) -> Result<Option<PathBuf>, String> {
        use tokio::io::AsyncWriteExt;
        if let Some(problem) = self.problem {
            return Err(problem);
        }
        match self.file.take() {
            Some(mut file) => match file.flush().await {
                Ok(()) => Ok(Some(self.path)),
                Err(e) => Err(format!("could not keep the agent's changes: {e}")),
            },
            None => Ok(None),
        }
    }
}

/// Starts reading the pod's frames from `from_pod` into a channel, until its result or the
/// end of the connection.
fn read_frames(
    from_pod: tokio::net::tcp::OwnedReadHalf,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::Receiver<std::io::Result<Option<FromPod>>>,
) {
    // Frames are read by a task of their own: a read cut off by another branch of the
    // select in `stream_pod` would lose the half of a frame it had.
    let (frames_tx, frames) = tokio::sync::mpsc::channel(16);
    let reader = tokio::spawn(async move {
        let mut from_pod = from_pod;
        loop {
            let frame = pod::read_from_pod(&mut from_pod).await;
            let end = !matches!(frame, Ok(Some(FromPod::Stdout(_) | FromPod::Patch(_))));
            if frames_tx.send(frame).await.is_err() || end {
                break;
            }
        }
    });
    (reader, frames)
}

/// How long a run's start cut off at its start timeout or by a cancel is left to finish
/// before what it made is deleted ([`KubeRunner::create_within_start`]).
const ABANDONED_START_WAIT: Duration = Duration::from_secs(600);

/// Creates `secret`, then `job` (both of the run's name), then makes the Job the Secret's
/// owner: in this order the pod never starts before its key exists (a kubelet that finds no
/// Secret retries only after a back-off). Deletes the Secret when the start stops short of that
/// and the server may have made it: no Job owns it, so nothing else would ever delete it.
async fn create_objects(
    jobs: Api<KubeJob>,
    secrets: Api<Secret>,
    secret: Secret,
    job: KubeJob,
) -> Result<(), String> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    if let Err(e) = secrets.create(&PostParams::default(), &secret).await {
        // Unless it was refused, the server may have made it (its answer lost, or a 409 to
        // kube-rs's retry of such a request).
        if !refused(&e) {
            delete_secret(&secrets, &name).await;
        }
        return Err(format!("could not create the run's Secret: {e}"));
    }
    let created = match jobs.create(&PostParams::default(), &job).await {
        Ok(created) => created,
        Err(e) => {
            delete_secret(&secrets, &name).await;
            return Err(format!("could not create the agent's Job: {e}"));
        }
    };
    let uid = created.metadata.uid.unwrap_or_default();
    let owned = spec::owned_by_job(&name, &uid);
    if let Err(e) = secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(owned))
        .await
    {
        // Without its owner the cluster never collects it; the caller deletes the Job.
        delete_secret(&secrets, &name).await;
        return Err(format!(
            "could not make the Job the owner of the run's Secret: {e}"
        ));
    }
    Ok(())
}

/// Deletes a run's Job with its pods and Secret (in the background: `kubectl` sees them go),
/// trying again after a failure that may pass ([`delete_retrying`]).
async fn delete_job(jobs: &Api<KubeJob>, name: &str) {
    if let Err(e) = delete_retrying(jobs, name, &DeleteParams::background()).await {
        tracing::warn!(job = name, error = %e, "could not delete an agent's Job");
    }
}

/// Deletes a run's Secret (when it or its Job could not be made, or its replica died before
/// the Job owned it), trying again after a failure that may pass ([`delete_retrying`]).
async fn delete_secret(secrets: &Api<Secret>, name: &str) {
    if let Err(e) = delete_retrying(secrets, name, &DeleteParams::default()).await {
        tracing::warn!(secret = name, error = %e, "could not delete a run's Secret");
    }
}

/// Deletes the object `name` of `api` ([`retrying`]): done once deleted or not found (404).
async fn delete_retrying<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> Result<(), String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    retrying(|| async {
        match api.delete(name, params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    })
    .await
}

/// Makes the request of `request`, and again after a failure that may pass ([`transient`])
/// and [`RETRY_BACKOFF`]'s wait: at most [`RETRY_TRIES`] tries, all within [`RETRY_WITHIN`].
/// Its answer, or its last failure.
async fn retrying<T, F, Fut>(mut request: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + RETRY_WITHIN;
    let mut failures = 0;
    loop {
        let failure = match tokio::time::timeout_at(deadline, request()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) if !transient(&e) => return Err(e.to_string()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                return Err(format!("no answer within {} s", RETRY_WITHIN.as_secs()));
            }
        };
        let wait = RETRY_BACKOFF.delay(failures);
        failures += 1;
        if failures >= RETRY_TRIES || Instant::now() + wait >= deadline {
            return Err(format!("{failure} (tried {failures} times)"));
        }
        tracing::debug!(error = %failure, "a request to the Kubernetes API failed; trying again");
        tokio::time::sleep(wait).await;
    }
}

/// Whether the API server refused a request: an answer of a 4xx other than 409 and 429. It
/// was not applied, and would be refused again.
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if refusal(status.code))
}

/// Whether a failed request may succeed when tried again: no answer (the connection failed
/// or timed out), or an answer of a 5xx, a 409 (a conflict with another write) or a 429
/// (throttled).
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => !refusal(status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Whether `code` says the API server refused a request ([`refused`]).
fn refusal(code: u16) -> bool {
    (400..500).contains(&code) && !matches!(code, 409 | 429)
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Runner for KubeRunner {
    fn execute(&self, job: Job, control: Control) -> ExecutionFuture<'_> {
        Box::pin(self.run(job, control))
    }

    fn live_output(&self, task_id: Uuid, attempt: i32) -> Option<String> {
        let path = self.run_dir(task_id, attempt).join("output.log");
        let (text, dropped) = local::read_tail(&path, process::STDOUT_MEMORY_CAP).ok()?;
        Some(local::note_dropped(text, dropped))
    }

    /// Deletes the run's Job (its pod and Secret go with it).
    fn reap(&self, task_id: Uuid, attempt: i32) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.get().cloned();
            let namespace = self.config.settings.namespace.clone();
            runtime.spawn(async move {
                let client = match client {
                    Some(client) => client,
                    None => match kube::Client::try_default().await {
                        Ok(client) => client,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot delete a dead run's Job");
                            return;
                        }
                    },
                };
                let jobs: Api<KubeJob> = Api::namespaced(client.clone(), &namespace);
                let secrets: Api<Secret> = Api::namespaced(client, &namespace);
                // The Secret goes with its Job, unless the replica died before the Job owned it.
                delete_secret(&secrets, &spec::job_name(task_id, attempt)).await;
                let selector = ListParams::default().labels(&spec::run_selector(task_id, attempt));
                match retrying(|| jobs.list(&selector)).await {
                    Ok(list) => {
                        for job in list {
                            if let Some(name) = job.metadata.name {
                                tracing::info!(job = %name, "deleting the Job of a run whose replica stopped");
                                delete_job(&jobs, &name).await;
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot list a dead run's Jobs"),
                }
            });
        }
    }

    /// What the run's live log here shows, if this replica has it. The run's metered calls
    /// are in the database whichever replica reads them. Its Job is left alone: its replica
    /// may only be late renewing the lease ([`Runner::reap`] deletes it).
    fn salvage(&self, task_id: Uuid, attempt: i32, agent: &AgentSpec) -> Option<Salvaged> {
        let dir = self.run_dir(task_id, attempt);
        let (output, _) = local::read_tail(&dir.join("output.log"), local::SALVAGE_BYTES).ok()?;
        let mut parser = agent::OutputParser::new(agent, &self.config.prices);
        parser.feed(output.as_bytes());
        Some(Salvaged {
            report: parser.finish(),
            output,
            // Every pod's agent reaches models through the gateway only: no network, no pod.
            metered: true,
        })
    }

    fn discard(&self, task_id: Uuid, attempt: i32) {
        local::discard_run_dir(&self.run_dir(task_id, attempt));
    }

    fn leftovers(&self) -> Vec<(Uuid, i32)> {
        local::run_dirs(&self.config.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_fake_kube::{FakeKube, Fault, Options};
    use agentry_testkit::wait::eventually_async;

    /// The longest a test waits for the fake to show something.
    const WITHIN: Duration = Duration::from_secs(30);

    impl KubeRunner {
        /// The run's objects made as a run's start makes them, without its bound.
        async fn create(
            &self,
            jobs: &Api<KubeJob>,
            secrets: &Api<Secret>,
            objects: &RunObjects<'_>,
            key: &str,
        ) -> Result<(), String> {
            let secret = spec::secret(&self.config, objects, key)?;
            let job = spec::job(&self.config, objects)?;
            create_objects(jobs.clone(), secrets.clone(), secret, job).await
        }
    }

    /// fake-kube with the runner's namespace and no image: a Job's pod never runs.
    fn cluster() -> FakeKube {
        let namespace = KubeConfig::for_tests().settings.namespace;
        FakeKube::start(Options::default().namespace(&namespace)).unwrap()
    }

    /// The runtime of a test (the fake, which stops with a runtime of its own, is dropped out
    /// of it).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A runner, and the Jobs and Secrets of its namespace on `kube` through a client made as
    /// the runner's own is (kube-rs's retries of 429, 503 and 504 answers included).
    async fn runner_on(kube: &FakeKube) -> (KubeRunner, Api<KubeJob>, Api<Secret>) {
        let kubeconfig = kube::config::Kubeconfig::read_from(kube.kubeconfig()).unwrap();
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let runner = KubeRunner::new(KubeConfig::for_tests()).unwrap();
        let (jobs, secrets, _) = runner.apis(&client);
        (runner, jobs, secrets)
    }

    /// The objects of `task`'s first attempt.
    fn objects(task: Uuid) -> RunObjects<'static> {
        RunObjects {
            task,
            attempt: 1,
            replica: "agentry-r1",
            wall_time: Duration::from_secs(60),
            stop_grace: Duration::from_secs(5),
        }
    }

    /// Waits until no object of `resources` is left in the runner's namespace on `kube`.
    async fn none_left(kube: &FakeKube, resources: &[&str]) {
        let namespace = KubeConfig::for_tests().settings.namespace;
        eventually_async(WITHIN, format!("no {resources:?} left"), async || {
            let left: Vec<String> = resources
                .iter()
                .flat_map(|r| {
                    let objects = kube.objects(r, &namespace);
                    objects
                        .into_iter()
                        .map(move |o| format!("{r}/{}", o["metadata"]["name"]))
                })
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(left.join(", "))
            }
        })
        .await;
    }

    /// The status code of each request of `method` on `kube` whose path has `part`, and
    /// whether it was an injected fault.
    fn answers(kube: &FakeKube, method: &str, part: &str) -> Vec<(u16, bool)> {
        kube.requests()
            .into_iter()
            .filter(|r| r.method == method && r.uri.contains(part))
            .map(|r| (r.status, r.faulted))
            .collect()
    }

    /// The Secret's create is applied but its answer lost (504; kube-rs's retry then gets
    /// 409): the run fails naming it, and once its Job is deleted as every run's is, no
    /// Secret of it is left, though no Job ever owned it.
    #[test]
    fn a_secret_whose_create_lost_its_answer_is_deleted() {
        let kube = cluster();
        kube.fail_next(Some(("POST", "secrets")), 1, Fault::AnswerLost(504));
        runtime().block_on(async {
            let (runner, jobs, secrets) = runner_on(&kube).await;
            let task = Uuid::new_v4();
            let error = runner
                .create(&jobs, &secrets, &objects(task), "agr_key")
                .await
                .unwrap_err();
            assert!(
                error.starts_with("could not create the run's Secret"),
                "{error}"
            );
            delete_job(&jobs, &spec::job_name(task, 1)).await;
            none_left(&kube, &["secrets", "jobs"]).await;
        });
        let posts = answers(&kube, "POST", "/secrets");
        assert_eq!(posts.first(), Some(&(504, true)), "{posts:?}");
    }

    /// A Job whose first two deletions fail (a 500, which kube-rs does not retry, or a 503,
    /// which it does) is deleted in the end, its pod and Secret with it.
    #[test]
    fn a_job_whose_first_deletions_fail_is_deleted() {
        for code in [500, 503] {
            let kube = cluster();
            runtime().block_on(async {
                let (runner, jobs, secrets) = runner_on(&kube).await;
                let task = Uuid::new_v4();
                runner
                    .create(&jobs, &secrets, &objects(task), "agr_key")
                    .await
                    .unwrap();
                kube.fail_next(Some(("DELETE", "jobs")), 2, Fault::Status(code));
                delete_job(&jobs, &spec::job_name(task, 1)).await;
                none_left(&kube, &["jobs", "pods", "secrets"]).await;
            });
            let deletes = answers(&kube, "DELETE", "/jobs/");
            assert_eq!(deletes, [(code, true), (code, true), (200, false)]);
        }
    }

    /// A cluster that keeps answering the Job's create with 429 (kube-rs waits and asks
    /// again, for seconds) holds the run no longer than its start timeout, and a cancel
    /// meanwhile stops it at once; either way what the start made is deleted once it ended.
    #[test]
    fn a_stalled_create_ends_at_the_start_timeout_or_a_cancel() {
        let kube = cluster();
        // kube-rs asks again after 5 ms, 10 ms, 20 ms… (about 5 s for ten answers): the
        // start is cut off meanwhile, and what it made is deleted once it has ended.
        kube.fail_next(Some(("POST", "jobs")), 10, Fault::Status(429));
        runtime().block_on(async {
            let (_, jobs, secrets) = runner_on(&kube).await;
            let mut config = KubeConfig::for_tests();
            config.settings.start_timeout = Duration::from_secs(2);
            let runner = KubeRunner::new(config).unwrap();
            let (_stop, cancel) = tokio::sync::watch::channel(false);
            let control = Control {
                cancel,
                started: None,
            };
            let task = Uuid::new_v4();
            let error = runner
                .create_within_start(
                    &jobs,
                    &secrets,
                    &objects(task),
                    "agr_key",
                    (
                        Instant::now() + runner.config.settings.start_timeout,
                        &control,
                    ),
                )
                .await
                .unwrap_err();
            assert!(error.contains("within the start timeout"), "{error}");
            none_left(&kube, &["secrets", "jobs"]).await;

            let runner = KubeRunner::new(KubeConfig::for_tests()).unwrap();
            let (stop, cancel) = tokio::sync::watch::channel(false);
            let control = Control {
                cancel,
                started: None,
            };
            kube.fail_next(Some(("POST", "jobs")), 10, Fault::Status(429));
            let asked_before = answers(&kube, "POST", "/jobs").len();
            let task = Uuid::new_v4();
            let objects = objects(task);
            let deadline = Instant::now() + runner.config.settings.start_timeout;
            let create = runner.create_within_start(
                &jobs,
                &secrets,
                &objects,
                "agr_key",
                (deadline, &control),
            );
            let cancel_once_asked = async {
                eventually_async(WITHIN, "the Job's create answered 429", async || {
                    answers(&kube, "POST", "/jobs").len() > asked_before
                })
                .await;
                stop.send(true).unwrap();
            };
            let (created, ()) = tokio::join!(create, cancel_once_asked);
            assert_eq!(created, Ok(false));
            none_left(&kube, &["secrets", "jobs"]).await;
        });
    }

    /// A request the API server refused (a 4xx other than 404, 409 and 429) is not tried
    /// again: a Secret's create refused leaves no Secret to delete; a Job's deletion refused
    /// is tried once.
    #[test]
    fn a_refused_request_is_not_tried_again() {
        let kube = cluster();
        kube.fail_next(Some(("POST", "secrets")), 1, Fault::Status(403));
        runtime().block_on(async {
            let (runner, jobs, secrets) = runner_on(&kube).await;
            let refused = Uuid::new_v4();
            let error = runner
                .create(&jobs, &secrets, &objects(refused), "agr_key")
                .await
                .unwrap_err();
            assert!(error.contains("Forbidden"), "{error}");
            assert_eq!(answers(&kube, "DELETE", "/secrets/"), []);

            let task = Uuid::new_v4();
            runner
                .create(&jobs, &secrets, &objects(task), "agr_key")
                .await
                .unwrap();
            kube.fail_next(Some(("DELETE", "jobs")), 1, Fault::Status(403));
            let name = spec::job_name(task, 1);
            delete_job(&jobs, &name).await;
            assert_eq!(answers(&kube, "DELETE", "/jobs/"), [(403, true)]);
            let namespace = &runner.config.settings.namespace;
            assert!(kube.object("jobs", namespace, &name).is_some());
        });
    }

    fn pod(phase: &str, deleting: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agentry-x-1-abcde"},
            "status": {"phase": phase},
        }))
        .unwrap();
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        pod
    }

    /// The agent's patch goes to a private file as its frames come, never whole into
    /// memory; past its limit it cannot be used, and says why.
    #[tokio::test]
    async fn the_patch_is_written_to_a_private_file_as_it_comes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.patch");
        let mut patch = PatchFile::new(path.clone(), 10);
        patch.push(b"diff ").await;
        patch.push(b"--git").await;
        assert_eq!(patch.finish().await.unwrap(), Some(path.clone()));
        assert_eq!(std::fs::read(&path).unwrap(), b"diff --git");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut big = PatchFile::new(dir.path().join("big.patch"), 10);
        big.push(b"0123456").await;
        big.push(b"789ab").await;
        big.push(b"c").await;
        let refused = big.finish().await.unwrap_err();
        assert_eq!(refused, "the agent's changes are larger than 10 bytes");

        let none = PatchFile::new(dir.path().join("none.patch"), 10);
        assert_eq!(none.finish().await.unwrap(), None);
    }

    /// A run stops waiting for a pod the cluster says is over: being deleted (a lost node's
    /// pods are, by the node controller), or in a final phase; a running pod is waited for.
    #[test]
    fn a_pod_being_deleted_or_in_a_final_phase_is_gone() {
        let config = KubeConfig::for_tests();
        assert!(!pod_gone(&pod("Running", false), &config));
        assert!(!pod_gone(&pod("Pending", false), &config));
        assert!(pod_gone(&pod("Running", true), &config));
        assert!(pod_gone(&pod("Failed", false), &config));
        assert!(pod_gone(&pod("Succeeded", false), &config));
    }
}
