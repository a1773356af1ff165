//! The Kubernetes objects of one agent run: its Job (one pod running `agentry pod-run`) and
//! the Secret holding its run key, owned by the Job.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job as KubeJob;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;
use uuid::Uuid;

use super::KubeConfig;

/// The label every agent pod and Job carries with this value (the chart's NetworkPolicy
/// selects agent pods by it).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The value of [`NAME_LABEL`] on agent pods and Jobs.
pub const AGENT_NAME: &str = "agentry-agent";
/// The label naming the agentry installation (`AGENTRY_KUBE_INSTANCE`).
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The label naming the task of a run.
pub const TASK_LABEL: &str = "agentry.dev/task";
/// The label naming the attempt of a run.
pub const ATTEMPT_LABEL: &str = "agentry.dev/attempt";
/// The label naming the replica that claimed the run.
pub const REPLICA_LABEL: &str = "agentry.dev/replica";
/// The label the Job controller puts on a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// The key of the run key in the run's Secret.
pub const SECRET_KEY: &str = "key";

/// Where the pod's work volume is mounted; the worktree and the agent's `HOME` are in it.
pub const WORK_DIR: &str = "/work";
/// The agent's worktree inside the pod.
pub const POD_WORKTREE: &str = "/work/repo";
/// The agent's `HOME` inside the pod.
pub const POD_HOME: &str = "/work/home";

/// The uid and gid agents run as in their pods (the agent image's user).
pub const AGENT_UID: i64 = 10001;

/// How long a finished Job is kept for `kubectl` before the cluster deletes it (agentry
/// deletes it itself as soon as the run is over; this is for a replica that died).
const TTL_AFTER_FINISHED: i32 = 600;

/// The name of the Job (and its Secret) of attempt `attempt` of `task`.
pub fn job_name(task: Uuid, attempt: i32) -> String {
    format!("agentry-{}-{attempt}", task.simple())
}

/// The label selector of the Jobs of `task`'s attempt `attempt`.
pub fn run_selector(task: Uuid, attempt: i32) -> String {
    format!("{NAME_LABEL}={AGENT_NAME},{TASK_LABEL}={task},{ATTEMPT_LABEL}={attempt}")
}

/// What one run's Job is made of.
#[derive(Debug)]
pub struct RunObjects<'a> {
    /// The task.
    pub task: Uuid,
    /// The attempt.
    pub attempt: i32,
    /// The replica that claimed it.
    pub replica: &'a str,
    /// The run's wall-time limit.
    pub wall_time: Duration,
    /// Each step of the stop ladder.
    pub stop_grace: Duration,
}

fn labels(config: &KubeConfig, run: &RunObjects<'_>) -> BTreeMap<String, String> {
    [
        (NAME_LABEL, AGENT_NAME.to_owned()),
        ("app.kubernetes.io/managed-by", "agentry".to_owned()),
        (INSTANCE_LABEL, config.settings.instance.clone()),
        (TASK_LABEL, run.task.to_string()),
        (ATTEMPT_LABEL, run.attempt.to_string()),
        (REPLICA_LABEL, run.replica.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The run's Job: one pod, never retried, stopped by the cluster past the run's time limit
/// (agentry stops it first), deleted by the cluster a while after it finished; the pod
/// non-root on a read-only root, without capabilities, service-account token or service
/// links, its work and `/tmp` on emptyDirs with size limits.
///
/// # Errors
///
/// A sentence when the configured resources do not make a valid Job.
pub fn job(config: &KubeConfig, run: &RunObjects<'_>) -> Result<KubeJob, String> {
    let name = job_name(run.task, run.attempt);
    let labels = labels(config, run);
    // The ladder takes two grace steps; the kubelet's own SIGTERM starts it too.
    let grace = run
        .stop_grace
        .as_secs()
        .saturating_mul(3)
        .saturating_add(10);
    // Counted by the cluster from the Job's start, while agentry's time limit starts when the
    // pod connects: the pod's start (scheduling, image pull, the workspace's transfer, up to
    // the start timeout) comes first, so agentry's limit always ends the run before this.
    let deadline = config
        .settings
        .start_timeout
        .as_secs()
        .saturating_add(run.wall_time.as_secs())
        .saturating_add(grace)
        .saturating_add(60);
    let mut resources = serde_json::Map::new();
    for (name, value) in [
        ("cpu", &config.settings.cpu),
        ("memory", &config.settings.memory),
    ] {
        if let Some(value) = value {
            resources.insert(name.to_owned(), json!(value));
        }
    }
    let mut container = json!({
        "name": "agent",
        "image": config.settings.image,
        "env": [
            {"name": "AGENTRY_POD_ENDPOINT", "value": config.settings.endpoint},
            {"name": "AGENTRY_POD_KEY", "valueFrom": {"secretKeyRef": {"name": name, "key": SECRET_KEY}}},
        ],
        "resources": {"requests": resources, "limits": resources},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "runAsUser": AGENT_UID,
            "runAsGroup": AGENT_UID,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "work", "mountPath": WORK_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "workingDir": WORK_DIR,
    });
    if let Some(command) = &config.settings.pod_command {
        container["command"] = json!(command);
    }
    let value = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": grace,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": AGENT_UID,
                        "runAsGroup": AGENT_UID,
                        "fsGroup": AGENT_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "work", "emptyDir": {"sizeLimit": config.settings.work_size}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": config.tmp_size}},
                    ],
                },
            },
        },
    });
    serde_json::from_value(value).map_err(|e| format!("the agent's Job is not valid: {e}"))
}

/// The run's Secret: its run key, labelled as its Job; [`owned_by_job`] then makes the Job
/// its owner, so that the cluster deletes it with the Job.
pub fn secret(config: &KubeConfig, run: &RunObjects<'_>, key: &str) -> Result<Secret, String> {
    let name = job_name(run.task, run.attempt);
    let value = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels(config, run)},
        "type": "Opaque",
        "stringData": {SECRET_KEY: key},
    });
    serde_json::from_value(value).map_err(|e| format!("the run's Secret is not valid: {e}"))
}

/// The merge patch that makes the Job `name` (of `uid`) the owner of its Secret.
pub fn owned_by_job(name: &str, uid: &str) -> serde_json::Value {
    let owner = OwnerReference {
        api_version: "batch/v1".to_owned(),
        kind: "Job".to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(false),
        block_owner_deletion: None,
    };
    json!({"metadata": {"ownerReferences": [owner]}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_locked_down_and_carries_no_key() {
        let config = KubeConfig::for_tests();
        let task = Uuid::nil();
        let run = RunObjects {
            task,
            attempt: 2,
            replica: "agentry-r1",
            wall_time: Duration::from_secs(600),
            stop_grace: Duration::from_secs(5),
        };
        let job = job(&config, &run).unwrap();
        let text = serde_json::to_value(&job).unwrap();
        let spec = &text["spec"];
        assert_eq!(spec["backoffLimit"], 0);
        // Past the start timeout, the time limit and the stop ladder: agentry stops it first.
        let start = config.settings.start_timeout.as_secs();
        assert_eq!(spec["activeDeadlineSeconds"], start + 600 + 25 + 60);
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["enableServiceLinks"], false);
        let container = &pod["containers"][0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"],
            json!(["ALL"])
        );
        assert_eq!(
            spec["template"]["metadata"]["labels"][TASK_LABEL],
            task.to_string()
        );
        assert_eq!(
            container["env"][1]["valueFrom"]["secretKeyRef"]["name"],
            job_name(task, 2)
        );
        let secret = secret(&config, &run, "the-run-key").unwrap();
        let secret = serde_json::to_value(&secret).unwrap();
        assert_eq!(secret["stringData"][SECRET_KEY], "the-run-key");
        let owned = owned_by_job(&job_name(task, 2), "uid-1");
        assert_eq!(owned["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert!(!text.to_string().contains("the-run-key"));
    }
}
