//! The Kubernetes runner through `agentry serve` (docs/kubernetes.md), against fake-kube (a
//! Kubernetes API whose kubelet runs pods under bubblewrap on this machine's own root, each in
//! its own network namespace that reaches the host's loopback at 10.0.2.2), the fake GitHub
//! and the fake model API. The chart's rendered Role (tests/fixtures/kube-role.yaml) is
//! enforced, so a permission the runner uses and the chart does not grant fails here.
//!
//! The pods run as uid 10001, who cannot read the build's target directory: the agentry
//! binary and the fake agents are copied once into a directory of /var/tmp it can read.
//!
//! These tests need bubblewrap and slirp4netns (CI installs both and sets
//! `AGENTRY_TEST_REQUIRE_KUBE=1`); elsewhere they say why and pass.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use agentry_fake_kube::{FakeKube, Options, Rbac};
use agentry_testkit::stats::quantile;
use agentry_testkit::wait::eventually;
use base64::Engine;
use serde_json::Value;

use super::{BIN, Replicas, Server, World, connect_repo, create_task, error_of, get, task_when};

/// The namespace of the runs' Jobs.
const NAMESPACE: &str = "agents";

/// Whether pods can run here (bubblewrap and slirp4netns); says why not when they cannot.
fn pods_run_here() -> bool {
    let missing: Vec<&str> = ["bwrap", "slirp4netns"]
        .into_iter()
        .filter(|tool| {
            std::process::Command::new(tool)
                .arg("--version")
                .output()
                .map_or(true, |out| !out.status.success())
        })
        .collect();
    let works = missing.is_empty() && super::sandboxed();
    if !works {
        assert!(
            std::env::var("AGENTRY_TEST_REQUIRE_KUBE").as_deref() != Ok("1"),
            "AGENTRY_TEST_REQUIRE_KUBE=1 but fake-kube's pods cannot run here (missing: \
             {missing:?}, or bubblewrap does not work)"
        );
        eprintln!(
            "note: fake-kube's pods cannot run here (missing: {missing:?}, or bubblewrap does \
             not work); the Kubernetes runner's end-to-end tests do nothing"
        );
    }
    works
}

/// A directory uid 10001 can read, holding copies of the agentry binary and the fake agents
/// (made once per test process; a file already there of the same size and time is kept).
fn pod_programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = PathBuf::from("/var/tmp/agentry-kube-tests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let agents = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/runner/tests/fake-agents");
        for (from, name) in [
            (PathBuf::from(BIN), "agentry"),
            (agents.join("claude"), "claude"),
            (agents.join("codex"), "codex"),
        ] {
            let to = dir.join(name);
            let same = |a: &Path, b: &Path| {
                let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
                    return false;
                };
                a.len() == b.len() && a.modified().ok() <= b.modified().ok()
            };
            if !same(&from, &to) {
                let tmp = dir.join(format!(".{name}.{}", std::process::id()));
                std::fs::copy(&from, &tmp).unwrap();
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
                std::fs::rename(&tmp, &to).unwrap();
            }
        }
        dir
    })
}

/// fake-kube with the `host` image (this machine's root), the namespace [`NAMESPACE`] and
/// the chart's Role enforced.
fn cluster() -> FakeKube {
    cluster_with_image("host", Path::new("/"))
}

/// [`cluster`] with the image `name` of the root file system `rootfs`.
pub(super) fn cluster_with_image(name: &str, rootfs: &Path) -> FakeKube {
    cluster_with(name, rootfs, &chart_role())
}

/// The chart's Role and RoleBinding for the Kubernetes runner, as YAML.
fn chart_role() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube-role.yaml"),
    )
    .unwrap()
}

/// A cluster with the image `name` of `rootfs` whose service account has the Role `role`.
fn cluster_with(name: &str, rootfs: &Path, role: &str) -> FakeKube {
    let options = Options {
        role: Some(Rbac::from_yaml(role).unwrap()),
        ..Options::default().image(name, rootfs).namespace(NAMESPACE)
    };
    FakeKube::start(options).unwrap()
}

/// The environment of `agentry serve` with the Kubernetes runner on `kube`, plus `extra`.
pub(super) fn kube_env(kube: &FakeKube, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let programs = pod_programs();
    let mut env: Vec<(String, String)> = [
        ("KUBECONFIG", kube.kubeconfig().display().to_string()),
        ("AGENTRY_RUNNER", "kubernetes".to_owned()),
        ("AGENTRY_KUBE_NAMESPACE", NAMESPACE.to_owned()),
        ("AGENTRY_AGENT_IMAGE", "host".to_owned()),
        ("AGENTRY_KUBE_LISTEN", "127.0.0.1:0".to_owned()),
        // The pods reach the host's loopback there (slirp4netns).
        ("AGENTRY_KUBE_ENDPOINT", "10.0.2.2".to_owned()),
        (
            "AGENTRY_KUBE_POD_COMMAND",
            format!("{} pod-run", programs.join("agentry").display()),
        ),
        (
            "AGENTRY_CLAUDE_BIN",
            programs.join("claude").display().to_string(),
        ),
        ("AGENTRY_KUBE_AGENT_CPU", "1".to_owned()),
        ("AGENTRY_KUBE_AGENT_MEMORY", "1Gi".to_owned()),
        ("AGENTRY_KUBE_START_TIMEOUT", "60".to_owned()),
        // fake-kube enforces no NetworkPolicy: its pods reach its API (one test checks that
        // pod-run then refuses to run).
        ("AGENTRY_KUBE_ALLOW_API_REACH", "1".to_owned()),
        ("AGENTRY_POLL_INTERVAL_SECS", "3600".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

/// The world of one test: fake GitHub, fake model API, fake-kube, and `serve`'s environment
/// with the Kubernetes runner.
struct KubeWorld {
    kube: FakeKube,
    world: World,
}

impl KubeWorld {
    /// [`KubeWorld::new`] where pods can run here; `None` (the test does nothing, having said
    /// why) where they cannot.
    fn here(gh: &str, extra: &[(&str, &str)]) -> Option<KubeWorld> {
        pods_run_here().then(|| KubeWorld::new(gh, extra))
    }

    /// The world of the code-host token `gh`, `extra` added to `serve`'s environment.
    fn new(gh: &str, extra: &[(&str, &str)]) -> KubeWorld {
        KubeWorld::on(cluster(), gh, extra)
    }

    /// [`KubeWorld::new`] on the cluster `kube`.
    fn on(kube: FakeKube, gh: &str, extra: &[(&str, &str)]) -> KubeWorld {
        let env = kube_env(&kube, extra);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let world = World::new(gh, &env);
        KubeWorld { kube, world }
    }

    /// `serve` on SQLite with `acme/web` connected ([`World::serve_connected`]).
    fn serve(&self) -> Served {
        Served::from(self.world.serve_connected())
    }

    /// Waits until the fake model API saw the agent's first call.
    fn first_call(&self, server: &Server) {
        eventually(Duration::from_secs(120), "the agent's model call", || {
            if self.world.models.calls().is_empty() {
                Err(server.stderr.so_far())
            } else {
                Ok(())
            }
        });
    }

    /// Waits until no Job, pod or Secret of any run is left.
    fn all_gone(&self) {
        all_gone(&self.kube);
    }
}

/// `serve` on a [`KubeWorld`]: the server, its admin token and `acme/web`.
struct Served {
    server: Server,
    admin: String,
    repo: Value,
}

impl From<(Server, String, Value)> for Served {
    fn from((server, admin, repo): (Server, String, Value)) -> Served {
        Served {
            server,
            admin,
            repo,
        }
    }
}

impl Served {
    /// Creates the task `title` with `prompt` in `acme/web`; returns its id.
    fn create(&self, title: &str, prompt: &str) -> String {
        create_task(&self.server.base, &self.admin, &self.repo, title, prompt)
    }

    /// Creates the task `title` with `prompt` and waits until it ended ([`ended`]), which
    /// must be failed (the service's log is shown otherwise); returns the task.
    fn run_failing(&self, title: &str, prompt: &str) -> Value {
        let id = self.create(title, prompt);
        self.failed(&id)
    }

    /// Waits until task `id` ended ([`ended`]) and asserts it failed, showing the service's
    /// log otherwise; returns the task.
    fn failed(&self, id: &str) -> Value {
        let task = ended(&self.server, id, &self.admin);
        assert_eq!(
            task["state"],
            "failed",
            "{task:#}\n{}",
            self.server.stderr.so_far()
        );
        task
    }

    /// Task `id`'s output as the API serves it.
    fn output(&self, id: &str) -> String {
        output_of(&self.server.base, id, &self.admin)
    }
}

/// fake-kube ([`cluster`]) and replicas of `serve` on one PostgreSQL running their agents
/// there; `None` where the suite has no PostgreSQL.
fn kube_replicas() -> Option<(FakeKube, Replicas)> {
    let kube = cluster();
    let env = kube_env(&kube, &[]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let replicas = Replicas::with(&env)?;
    Some((kube, replicas))
}

/// Deletes the pod `name` through fake-kube's API, as an operator would.
fn delete_pod(kube: &FakeKube, name: &str) {
    let deleted = reqwest::blocking::Client::new()
        .delete(format!(
            "{}/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            kube.base_url()
        ))
        .bearer_auth(kube.token())
        .send()
        .unwrap();
    assert!(deleted.status().is_success(), "{:?}", deleted.text());
}

/// Waits until no Job, pod or Secret of any run is left in `kube`.
fn all_gone(kube: &FakeKube) {
    eventually(
        Duration::from_secs(60),
        "the runs' Jobs, pods and Secrets to go",
        || {
            let left: Vec<Value> = ["jobs", "pods", "secrets"]
                .iter()
                .flat_map(|r| kube.objects(r, NAMESPACE))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(Value::Array(left))
            }
        },
    );
}

/// Waits up to three minutes for task `id` to end; returns it.
fn ended(server: &Server, id: &str, admin: &str) -> Value {
    task_when(
        &server.base,
        id,
        admin,
        (Duration::from_secs(180), "the task to end"),
        |t| {
            matches!(
                t["state"].as_str(),
                Some("pr_opened" | "failed" | "cancelled")
            )
        },
    )
}

/// The run's output as the API serves it.
fn output_of(base: &str, id: &str, admin: &str) -> String {
    reqwest::blocking::Client::new()
        .get(format!("{base}/api/tasks/{id}/log"))
        .bearer_auth(admin)
        .send()
        .unwrap()
        .text()
        .unwrap()
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// An issue becomes a pull request through a Job: the agent ran in its pod (as uid 10001,
/// reaching the gateway through pod-run), its change came back as a patch that the service
/// committed and pushed, the run costs exactly what the fake model API saw, neither the
/// code-host token nor the model key is anywhere the agent can read, and nothing of the run
/// is left in the cluster.
fn an_issue_becomes_a_pull_request(kube: &FakeKube, world: &World, server: &mut Server, gh: &str) {
    let admin = server.read_token();
    let repo = connect_repo(&server.base, &admin, gh);
    let prompt = format!(
        "Kube run [fake:model-calls=2] [model:usage=1000,100,0,0] [fake:git-heads] \
         [fake:scan={},{}]",
        b64(gh),
        b64(&world.models.key())
    );
    let id = create_task(&server.base, &admin, &repo, "Kube run", &prompt);
    let task = ended(server, &id, &admin);
    let log = server.stderr.so_far();
    assert_eq!(task["state"], "pr_opened", "{task:#}\n{log}");
    // Two calls of 1,000 input and 100 output tokens of claude-sonnet-5: 2 × $0.003.
    let run = &task["runs"][0];
    assert_eq!(run["modelCalls"], 2, "{run}");
    assert_eq!(run["costUsd"], "0.006", "{run}");
    assert_eq!(run["sandboxed"], true, "{run}");
    assert_eq!(world.models.calls().len(), 2);
    let output = output_of(&server.base, &id, &admin);
    assert!(output.contains("FAKE model-call 200"), "{output}");
    assert!(output.contains("FAKE scan 1 absent"), "{output}");
    assert!(output.contains("FAKE scan 2 absent"), "{output}");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&world.source)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // The pod's repository had the history: HEAD at the default branch's commit, which is
    // also its origin/main.
    let main = git(&["rev-parse", "main"]);
    assert!(output.contains(&format!("FAKE head {main}")), "{output}");
    assert!(
        output.contains(&format!("FAKE origin-main {main}")),
        "{output}"
    );
    // The commit the service built, on the pushed branch of the source repository.
    let branch = agentry_runner::workspace::branch_name(id.parse().expect("the task id is a UUID"));
    assert_eq!(git(&["log", "-1", "--format=%an", &branch]), "agentry");
    let changes = git(&["show", &format!("{branch}:AGENT_CHANGES.md")]);
    assert!(changes.contains("Kube run"), "{changes}");
    all_gone(kube);
}

#[test]
fn an_issue_becomes_a_pull_request_through_a_job_on_sqlite() {
    const GH: &str = "ghp_KubeRunnerToken0123456789abcdefgh";
    let Some(world) = KubeWorld::here(GH, &[]) else {
        return;
    };
    let mut server = world.world.serve(false);
    an_issue_becomes_a_pull_request(&world.kube, &world.world, &mut server, GH);
}

#[test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
fn an_issue_becomes_a_pull_request_through_a_job_on_postgresql() {
    if !pods_run_here() {
        return;
    }
    let Some((kube, replicas)) = kube_replicas() else {
        return;
    };
    let mut server = replicas.start("a");
    an_issue_becomes_a_pull_request(&kube, &replicas, &mut server, &replicas.gh);
}

/// Cancelled mid-run (its live log showing its output until then): the agent gets SIGINT first (the fake Claude Code then reports what
/// it spent, as the real one does), the task is cancelled with the metered cost, and the
/// Job is gone.
#[test]
fn a_cancelled_run_stops_its_pod_with_sigint_first() {
    const GH: &str = "ghp_KubeCancelToken0123456789abcdefgh";
    let Some(world) = KubeWorld::here(GH, &[]) else {
        return;
    };
    let served = world.serve();
    let (server, admin) = (&served.server, &served.admin);
    let prompt = "Cancel me [fake:model-calls=1] [model:usage=1000,100,0,0] [fake:sleep=120]";
    let id = served.create("Cancel me", prompt);
    world.first_call(server);
    // The live log, while the agent runs in its pod.
    eventually(
        Duration::from_secs(60),
        "the live log to show the call",
        || {
            let live = served.output(&id);
            if live.contains("FAKE model-call 200") {
                Ok(())
            } else {
                Err(live)
            }
        },
    );
    let cancel = reqwest::blocking::Client::new()
        .post(format!("{}/api/tasks/{id}/cancel", server.base))
        .bearer_auth(admin)
        .send()
        .unwrap();
    assert_eq!(cancel.status(), 200);
    let task = eventually(
        Duration::from_secs(120),
        "the cancelled run on record",
        || {
            let (_, task) = get(&server.base, &format!("/api/tasks/{id}"), admin);
            if task["state"] == "cancelled"
                && task["runs"].as_array().is_some_and(|r| !r.is_empty())
            {
                Ok(task)
            } else {
                Err(task)
            }
        },
    );
    let run = &task["runs"][0];
    assert_eq!(run["costUsd"], "0.003", "{task:#}");
    let output = served.output(&id);
    assert!(
        output.contains("Request interrupted by user"),
        "the agent did not get SIGINT first:\n{output}\n{}",
        server.stderr.so_far()
    );
    world.all_gone();
}

/// The agent ran and spent, but its pod could not collect its changes (an empty repository
/// of the agent's own makes `git add` fail): the run fails with that failure and keeps the
/// agent's output and its metered cost (before, both were dropped with the failure).
#[test]
fn a_pod_that_cannot_collect_the_changes_keeps_the_agents_output() {
    const GH: &str = "ghp_KubeCollectToken0123456789abcdefgh";
    let Some(world) = KubeWorld::here(GH, &[]) else {
        return;
    };
    let served = world.serve();
    let prompt = "Collect [fake:model-calls=1] [model:usage=1000,100,0,0] [fake:empty-repo=sub]";
    let task = served.run_failing("Collect", prompt);
    // pod-run's own sentence; what git says after it depends on git's version.
    assert!(error_of(&task).contains("git add -A failed"), "{task:#}");
    let run = &task["runs"][0];
    assert_eq!(run["costUsd"], "0.003", "{task:#}");
    let id = task["id"].as_str().unwrap();
    let output = served.output(id);
    assert!(output.contains("FAKE model-call 200"), "{output}");
    world.all_gone();
}

/// Past its time limit the run is stopped and fails naming the limit; nothing is left.
#[test]
fn a_run_past_its_time_limit_is_stopped() {
    const GH: &str = "ghp_KubeTimeLimitToken0123456789abcdef";
    let Some(world) = KubeWorld::here(GH, &[("AGENTRY_RUN_TIME_LIMIT_SECS", "8")]) else {
        return;
    };
    let served = world.serve();
    let task = served.run_failing("Slow", "Slow [fake:sleep=120]");
    assert!(
        error_of(&task).contains("longer than the limit of 8 s"),
        "{task:#}"
    );
    world.all_gone();
}

/// A run whose calls pass its task's cap is stopped at the gateway's refusal, and fails
/// saying so with what it spent.
#[test]
fn a_run_over_its_budget_is_stopped() {
    const GH: &str = "ghp_KubeBudgetToken0123456789abcdefgh";
    let Some(world) = KubeWorld::here(GH, &[]) else {
        return;
    };
    let cap = serde_json::json!({ "maxCostPerTaskUsd": "0.02" });
    let served = Served::from(world.world.serve_with_settings(&cap));
    let prompt = "Spend [fake:model-calls=10] [model:usage=1000,1000,0,0]";
    let task = served.run_failing("Spend", prompt);
    assert!(error_of(&task).starts_with("budget reached"), "{task:#}");
    let cost: rust_decimal::Decimal = task["costUsd"].as_str().unwrap().parse().unwrap();
    assert!(cost <= "0.02".parse().unwrap(), "{task:#}");
    world.all_gone();
}

/// An agent image the cluster cannot pull: the run fails within the start timeout naming
/// the reason, without cost, and nothing is left.
#[test]
fn an_image_that_cannot_be_pulled_fails_within_the_start_timeout() {
    const GH: &str = "ghp_KubeImageToken0123456789abcdefghi";
    let unpullable = [
        ("AGENTRY_AGENT_IMAGE", "registry.invalid/agentry-agent:none"),
        ("AGENTRY_KUBE_START_TIMEOUT", "6"),
    ];
    let Some(world) = KubeWorld::here(GH, &unpullable) else {
        return;
    };
    let served = world.serve();
    let task = served.run_failing("Pull", "Pull");
    let error = error_of(&task);
    assert!(
        error.starts_with("the agent's pod did not start within 6 s (AGENTRY_KUBE_START_TIMEOUT)")
            && (error.contains("ErrImagePull") || error.contains("ImagePullBackOff")),
        "{task:#}"
    );
    assert!(world.world.models.calls().is_empty());
    world.all_gone();
}

/// A pod deleted while it cannot start (its image cannot be pulled) fails its run at once,
/// not at the start timeout: the Job never makes another pod.
#[test]
fn a_pod_deleted_before_its_agent_starts_fails_at_once() {
    if !pods_run_here() {
        return;
    }
    const GH: &str = "ghp_KubePendingToken0123456789abcdefg";
    let kube = FakeKube::start(Options::default().image("host", "/").namespace(NAMESPACE)).unwrap();
    let unpullable = [
        ("AGENTRY_AGENT_IMAGE", "registry.invalid/agentry-agent:none"),
        ("AGENTRY_KUBE_START_TIMEOUT", "600"),
    ];
    let world = KubeWorld::on(kube, GH, &unpullable);
    let served = world.serve();
    let id = served.create("Pending", "Pending");
    // The pod, once the runner watches it (so its deletion reaches the runner as an event).
    let name = eventually(Duration::from_secs(60), "the run's pod, watched", || {
        let watched = world
            .kube
            .requests()
            .iter()
            .any(|r| r.uri.contains("/pods?") && r.uri.contains("watch=true"));
        if !watched {
            return Err("no watch of the pods yet".to_owned());
        }
        let pods = world.kube.objects("pods", NAMESPACE);
        match pods.first().and_then(|p| p["metadata"]["name"].as_str()) {
            Some(name) => Ok(name.to_owned()),
            None => Err(format!("{pods:?}")),
        }
    });
    delete_pod(&world.kube, &name);
    let task = served.failed(&id);
    assert!(
        error_of(&task).contains("the agent's pod was deleted before its agent started"),
        "{task:#}"
    );
    world.all_gone();
}

/// A run whose Job cannot be made the owner of its Secret (here the Role lacks `patch` on
/// Secrets) fails naming it, and its Secret is deleted with its Job: the cluster would never
/// collect a Secret without an owner.
#[test]
fn a_secret_that_cannot_be_given_its_job_is_deleted() {
    const GH: &str = "ghp_KubeOwnerToken0123456789abcdefghij";
    if !pods_run_here() {
        return;
    }
    let role = chart_role();
    let cut = role.replace("  - patch\n", "");
    assert_eq!(role.len() - cut.len(), "  - patch\n".len());
    let world = KubeWorld::on(cluster_with("host", Path::new("/"), &cut), GH, &[]);
    let served = world.serve();
    let task = served.run_failing("Owner", "Owner");
    assert!(
        error_of(&task).contains("could not make the Job the owner of the run's Secret"),
        "{task:#}"
    );
    world.all_gone();
}

/// Where the pod can reach the Kubernetes API (no NetworkPolicy enforced, as on fake-kube),
/// pod-run refuses to run the agent unless the operator allowed it.
#[test]
fn a_pod_that_reaches_the_kubernetes_api_refuses_to_run() {
    const GH: &str = "ghp_KubeReachToken0123456789abcdefghi";
    let Some(world) = KubeWorld::here(GH, &[("AGENTRY_KUBE_ALLOW_API_REACH", "0")]) else {
        return;
    };
    let served = world.serve();
    let task = served.run_failing("Reach", "Reach [fake:model-calls=1]");
    assert!(
        error_of(&task).contains("the NetworkPolicy for agent pods is not enforced"),
        "{task:#}"
    );
    assert!(world.world.models.calls().is_empty());
    world.all_gone();
}

/// Two replicas on one PostgreSQL, one fake-kube: replica A is killed (`kill -9`) while its
/// agent's second model call is in flight. Its agent can spend no more (A's gateway and
/// endpoint are gone, and pod-run stops it when its control connection closes); once A's
/// lease expires, B deletes A's Job, records the run `lost` with its one metered call, and
/// runs the task again to its pull request.
fn a_killed_replica_leaves_nothing_running(replicas: &Replicas, kube: &FakeKube) {
    let (a, admin, id) = replicas.start_first(
        "a",
        "Orphan",
        "Orphan [fake:model-calls=3] [model:usage=1000,100,0,0] [model:hold=3]",
    );
    let models = &replicas.models;
    assert!(
        models.wait_for(Duration::from_secs(120), |calls| calls.len() >= 2),
        "the agent's second call never arrived:\n{}",
        a.stderr.so_far()
    );
    a.signal("KILL");
    let a_log = a.stderr.so_far();
    drop(a);
    let b = replicas.start("b");
    let task = task_when(
        &b.base,
        &id,
        &admin,
        (Duration::from_secs(180), "the task to end on B"),
        |t| matches!(t["state"].as_str(), Some("pr_opened" | "failed")),
    );
    let log = format!("{a_log}\n{}", b.stderr.so_far());
    assert_eq!(task["state"], "pr_opened", "{task:#}\n{log}");
    let runs = task["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{task:#}");
    assert_eq!(runs[0]["outcome"], "lost", "{task:#}");
    // The first call was metered; the second was cut with A.
    assert_eq!(runs[0]["costUsd"], "0.003", "{task:#}");
    assert_eq!(runs[1]["costUsd"], "0.009", "{task:#}");
    // Nothing more from the orphaned pod: two calls of attempt 1 (the second cut), three
    // of attempt 2.
    assert_eq!(models.calls().len(), 5, "{:#?}", models.calls());
    all_gone(kube);
}

#[test]
#[cfg_attr(
    agentry_pg_skipped,
    ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
)]
fn a_killed_replica_s_job_is_deleted_and_its_run_recorded_lost() {
    if !pods_run_here() {
        return;
    }
    let Some((kube, replicas)) = kube_replicas() else {
        return;
    };
    a_killed_replica_leaves_nothing_running(&replicas, &kube);
}

/// A pod past its memory limit is killed by the kernel: the run fails saying so, with the
/// cost of its metered call, and nothing is left.
#[test]
fn a_pod_out_of_memory_fails_with_its_metered_cost() {
    const GH: &str = "ghp_KubeMemoryToken0123456789abcdefgh";
    let Some(world) = KubeWorld::here(GH, &[("AGENTRY_KUBE_AGENT_MEMORY", "96Mi")]) else {
        return;
    };
    let served = world.serve();
    let prompt = "Hog [fake:model-calls=1] [model:usage=1000,100,0,0] [fake:eat-memory=400]";
    let id = served.create("Hog", prompt);
    ended(&served.server, &id, &served.admin);
    if served.output(&id).contains("FAKE ate") {
        // No memory limit could be made here (fake-kube says so in its pod's log).
        assert!(
            std::env::var("AGENTRY_TEST_REQUIRE_KUBE").as_deref() != Ok("1"),
            "AGENTRY_TEST_REQUIRE_KUBE=1 but fake-kube could not limit the pod's memory"
        );
        eprintln!("note: fake-kube could not limit the pod's memory here; nothing to check");
        return;
    }
    let task = served.failed(&id);
    assert!(
        error_of(&task)
            .starts_with("the agent's pod ran out of memory (AGENTRY_KUBE_AGENT_MEMORY, 96Mi)"),
        "{task:#}"
    );
    assert_eq!(task["runs"][0]["costUsd"], "0.003", "{task:#}");
    world.all_gone();
}

/// `agentry doctor` with the Kubernetes runner checks the cluster in place of the local
/// sandbox and CLIs: the API, the namespace and every permission the runner uses, each
/// asked of fake-kube (which enforces the chart's Role) with a SelfSubjectAccessReview.
#[test]
fn doctor_checks_the_cluster_the_namespace_and_the_permissions() {
    if !pods_run_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doctor = |kube: &FakeKube, extra: &[(&str, &str)]| -> String {
        let env = kube_env(kube, extra);
        let out = super::run(
            super::agentry(&data, None)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .arg("doctor"),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let kube = cluster();
    let report = doctor(&kube, &[]);
    let line = super::doctor_line(&report, "kubernetes");
    assert!(
        line.starts_with("ok ") && line.contains("may run Jobs in the namespace agents"),
        "{report}"
    );
    // The local sandbox and CLIs are not this runner's business.
    assert!(
        !report
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("sandbox")),
        "{report}"
    );

    // A namespace that does not exist, where the Role grants nothing.
    let report = doctor(&kube, &[("AGENTRY_KUBE_NAMESPACE", "elsewhere")]);
    let line = super::doctor_line(&report, "kubernetes");
    assert!(line.starts_with("FAIL "), "{report}");
    assert!(
        line.contains("may not create jobs in the namespace elsewhere"),
        "{line}"
    );

    // A Role without Secrets: the runner could not give a pod its key.
    let role = chart_role();
    let cut = role.replace("  - secrets\n", "  - configmaps\n");
    assert_ne!(cut, role);
    let narrow = cluster_with("host", Path::new("/"), &cut);
    let report = doctor(&narrow, &[]);
    let line = super::doctor_line(&report, "kubernetes");
    assert!(line.starts_with("FAIL "), "{report}");
    for verb in ["create", "get", "delete"] {
        assert!(
            line.contains(&format!("may not {verb} secrets in the namespace agents")),
            "{line}"
        );
    }
    assert!(!line.contains("jobs"), "{line}");
}

/// The median of `values` ([`quantile`]; sorted in place).
fn median(values: &mut [f64]) -> f64 {
    quantile(values, 0.5).unwrap_or(f64::NAN)
}

fn seconds_between(from: &Value, to: &Value) -> f64 {
    let at = |v: &Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    (at(to) - at(from)).as_seconds_f64()
}

/// Figures for docs/benchmarks.md, not a check (run by hand:
/// `cargo test --release --test binary kube::figures -- --ignored --nocapture`):
/// - one task at a time, five times, with the Kubernetes runner on fake-kube and with the
///   local runner: assign → the agent's first model call (its pod started and reached the
///   gateway) → the pull request opened, medians;
/// - twenty tasks at once on one replica with twenty run slots: the Jobs it created per
///   second (from the first Job seen to the twentieth).
#[test]
#[ignore = "figures, run by hand"]
fn figures_of_the_kubernetes_runner() {
    if !pods_run_here() {
        return;
    }
    const GH: &str = "ghp_KubeFiguresToken0123456789abcdefg";
    const ROUNDS: usize = 5;
    let prompt = "Figure [fake:model-calls=1] [model:usage=1000,100,0,0]";
    let timings = |world: &World, server: &mut Server| -> (f64, f64, f64) {
        let admin = server.read_token();
        let repo = connect_repo(&server.base, &admin, GH);
        let (mut to_call, mut to_pr, mut total) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let id = create_task(
                &server.base,
                &admin,
                &repo,
                &format!("Figure {round}"),
                prompt,
            );
            let task = ended(server, &id, &admin);
            assert_eq!(task["state"], "pr_opened", "{task:#}");
            let call = world.models.calls().last().unwrap().received_at;
            let created = time::OffsetDateTime::parse(
                task["createdAt"].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap();
            let call = time::OffsetDateTime::from(call);
            to_call.push((call - created).as_seconds_f64());
            total.push(seconds_between(&task["createdAt"], &task["updatedAt"]));
            to_pr.push(total.last().unwrap() - to_call.last().unwrap());
        }
        (median(&mut to_call), median(&mut to_pr), median(&mut total))
    };
    let kube_world = KubeWorld::new(GH, &[]);
    let mut server = kube_world.world.serve(false);
    let (k_call, k_pr, k_total) = timings(&kube_world.world, &mut server);
    drop(server);
    let local = World::new(GH, &[("AGENTRY_POLL_INTERVAL_SECS", "3600")]);
    let mut server = local.serve(false);
    let (l_call, l_pr, l_total) = timings(&local, &mut server);
    drop(server);
    eprintln!(
        "FIGURES one run at a time, medians of {ROUNDS} (s): kubernetes assign→first call \
         {k_call:.3}, →pull request {k_pr:.3}, total {k_total:.3}; local {l_call:.3}, \
         {l_pr:.3}, {l_total:.3}; per-run overhead {:.3}",
        k_total - l_total
    );

    // Twenty at once: the pace at which one replica creates Jobs.
    const AT_ONCE: usize = 20;
    let world = KubeWorld::new(GH, &[("AGENTRY_MAX_CONCURRENT_RUNS", "20")]);
    let served = world.serve();
    let ids: Vec<String> = (0..AT_ONCE)
        .map(|i| served.create(&format!("Many {i}"), "Many"))
        .collect();
    let mut seen: std::collections::BTreeMap<String, std::time::Instant> = Default::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while seen.len() < AT_ONCE && std::time::Instant::now() < deadline {
        for job in world.kube.objects("jobs", NAMESPACE) {
            let name = job["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            seen.entry(name).or_insert_with(std::time::Instant::now);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen.len(), AT_ONCE, "not every Job appeared");
    let first = seen.values().min().unwrap();
    let last = seen.values().max().unwrap();
    let span = last.duration_since(*first).as_secs_f64();
    for id in &ids {
        ended(&served.server, id, &served.admin);
    }
    eprintln!(
        "FIGURES {AT_ONCE} tasks at once: Jobs created in {span:.3} s, {:.1} Jobs/s",
        (AT_ONCE - 1) as f64 / span
    );
}

/// A pod deleted by someone else mid-run (`kubectl delete pod`): the kubelet's SIGTERM to
/// pod-run starts the stop ladder, the agent reports what it spent, and the run fails saying
/// the cluster stopped it, with its metered cost.
#[test]
fn a_pod_deleted_mid_run_fails_its_run_naming_the_cluster() {
    if !pods_run_here() {
        return;
    }
    const GH: &str = "ghp_KubeDeletedToken0123456789abcdefg";
    // The kubeconfig's user is the only one fake-kube knows: without the chart's Role here,
    // the test may delete the pod as that user (the runner's own calls are the same as in
    // every other test, which enforce the Role).
    let kube = FakeKube::start(Options::default().image("host", "/").namespace(NAMESPACE)).unwrap();
    let world = KubeWorld::on(kube, GH, &[]);
    let served = world.serve();
    let prompt = "Evict me [fake:model-calls=1] [model:usage=1000,100,0,0] [fake:sleep=120]";
    let id = served.create("Evict me", prompt);
    world.first_call(&served.server);
    let pods = world.kube.objects("pods", NAMESPACE);
    assert_eq!(pods.len(), 1, "{pods:#?}");
    let name = pods[0]["metadata"]["name"].as_str().unwrap();
    delete_pod(&world.kube, name);
    let task = served.failed(&id);
    assert!(
        error_of(&task).starts_with("the agent's pod was stopped by the cluster"),
        "{task:#}"
    );
    assert_eq!(task["runs"][0]["costUsd"], "0.003", "{task:#}");
    let output = served.output(&id);
    assert!(output.contains("Request interrupted by user"), "{output}");
    world.all_gone();
}
