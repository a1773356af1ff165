//! The kubelet: runs each pod's container under bubblewrap, reports its status, serves its
//! log, and stops it on deletion (SIGTERM to its PID 1, SIGKILL after the grace period).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::web::Bytes;
use base64::Engine as _;
use command_fds::{CommandFdExt, FdMapping};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::Shared;
use crate::controller::rfc3339;
use crate::store::{self, ApiError, now_rfc3339};

/// The node every pod is scheduled to.
pub const NODE_NAME: &str = "fake-node";
/// The IP a pod reports (slirp4netns's guest address).
pub const POD_IP: &str = "10.0.2.100";
/// The host's loopback as a pod sees it.
pub const HOST_FROM_POD: &str = "10.0.2.2";
/// Where the service-account token is mounted.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn pods() -> &'static store::Resource {
    store::RESOURCES
        .iter()
        .find(|r| r.name == "pods")
        .unwrap_or(&store::RESOURCES[0])
}

/// Picks up new pods until the runtime stops.
pub async fn run(shared: Arc<Shared>) {
    let mut receiver = shared.lock().changed.subscribe();
    loop {
        let new: Vec<(String, String, String)> = {
            let mut store = shared.lock();
            let found: Vec<(String, String, String)> = store
                .list("pods", None)
                .into_iter()
                .filter(|p| {
                    p["status"]["phase"] == "Pending"
                        && p["metadata"]["deletionTimestamp"].is_null()
                })
                .map(|p| {
                    let m = &p["metadata"];
                    let text = |f: &str| m[f].as_str().unwrap_or_default().to_owned();
                    (text("namespace"), text("name"), text("uid"))
                })
                .filter(|(_, _, uid)| !store.kubelet_pods.contains(uid))
                .collect();
            for (_, _, uid) in &found {
                store.kubelet_pods.insert(uid.clone());
            }
            found
        };
        for (ns, name, uid) in new {
            tokio::spawn(run_pod(shared.clone(), ns, name, uid));
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), receiver.changed()).await;
    }
}

/// One pod: its identity.
#[derive(Debug, Clone)]
struct PodRef {
    shared: Arc<Shared>,
    ns: String,
    name: String,
    uid: String,
}

impl PodRef {
    fn current(&self) -> Option<Value> {
        let store = self.shared.lock();
        store
            .get("pods", &self.ns, &self.name)
            .filter(|p| p["metadata"]["uid"].as_str() == Some(self.uid.as_str()))
            .cloned()
    }

    fn set_status(&self, change: impl FnOnce(&mut Value)) {
        let mut store = self.shared.lock();
        let ours = store
            .get("pods", &self.ns, &self.name)
            .is_some_and(|p| p["metadata"]["uid"].as_str() == Some(self.uid.as_str()));
        if ours {
            store.modify(pods(), &self.ns, &self.name, |p| change(&mut p["status"]));
        }
    }

    /// The grace period, once the pod is being deleted (or is gone: 0).
    fn deletion(&self) -> Option<i64> {
        match self.current() {
            None => Some(0),
            Some(p) if p["metadata"]["deletionTimestamp"].is_string() => Some(
                p["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(30),
            ),
            Some(_) => None,
        }
    }

    /// Waits up to `limit` for the pod's deletion; its grace period if it came.
    async fn wait_deletion(&self, limit: Duration) -> Option<i64> {
        let mut receiver = self.shared.lock().changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(grace) = self.deletion() {
                return Some(grace);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            let step = deadline.min(tokio::time::Instant::now() + Duration::from_millis(250));
            let _ = tokio::time::timeout_at(step, receiver.changed()).await;
        }
    }

    fn dir(&self) -> PathBuf {
        self.shared.state_dir.join("pods").join(&self.uid)
    }
}

async fn run_pod(shared: Arc<Shared>, ns: String, name: String, uid: String) {
    let pod = PodRef {
        shared: shared.clone(),
        ns,
        name,
        uid,
    };
    run_pod_inner(&pod).await;
    let mut store = shared.lock();
    store.kubelet_pods.remove(&pod.uid);
    let deleting = store.get("pods", &pod.ns, &pod.name).is_some_and(|p| {
        p["metadata"]["uid"].as_str() == Some(pod.uid.as_str())
            && p["metadata"]["deletionTimestamp"].is_string()
    });
    if deleting {
        store.remove(pods(), &pod.ns, &pod.name);
    }
}

fn waiting(container: &Value, reason: &str, message: &str) -> Value {
    let mut state = json!({"waiting": {"reason": reason}});
    if !message.is_empty() {
        state["waiting"]["message"] = json!(message);
    }
    json!({
        "name": container["name"], "image": container["image"], "imageID": "",
        "ready": false, "restartCount": 0, "started": false, "state": state,
    })
}

fn pod_condition(kind: &str, ok: bool, reason: Option<&str>) -> Value {
    let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" },
        "lastProbeTime": null, "lastTransitionTime": now_rfc3339()});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    c
}

async fn run_pod_inner(pod: &PodRef) {
    let Some(object) = pod.current() else { return };
    let spec = object["spec"].clone();
    let container = spec["containers"][0].clone();
    pod.set_status(|s| {
        s["phase"] = json!("Pending");
        s["hostIP"] = json!("127.0.0.1");
        s["conditions"] = json!([
            pod_condition("PodScheduled", true, None),
            pod_condition("Initialized", true, None),
            pod_condition("ContainersReady", false, Some("ContainersNotReady")),
            pod_condition("Ready", false, Some("ContainersNotReady")),
        ]);
        s["containerStatuses"] = json!([waiting(&container, "ContainerCreating", "")]);
    });
    let image = container["image"].as_str().unwrap_or_default().to_owned();
    let Some(rootfs) = pod.shared.images.get(&image).cloned() else {
        let message = format!(
            "failed to pull and unpack image \"{image}\": fake-kube has no root file system for this image (map one with --image {image}=ROOTFS)"
        );
        pod.set_status(|s| {
            s["containerStatuses"] = json!([waiting(&container, "ErrImagePull", &message)])
        });
        if pod.wait_deletion(Duration::from_secs(2)).await.is_some() {
            return;
        }
        let backoff = format!("Back-off pulling image \"{image}\": ErrImagePull: {message}");
        pod.set_status(|s| {
            s["containerStatuses"] = json!([waiting(&container, "ImagePullBackOff", &backoff)])
        });
        pod.wait_deletion(Duration::MAX / 4).await;
        return;
    };
    let config = loop {
        let Some(current) = pod.current() else { return };
        match prepare(pod, &current, &rootfs) {
            Ok(config) => break config,
            Err((reason, message)) => {
                pod.set_status(|s| {
                    s["containerStatuses"] = json!([waiting(&container, reason, &message)])
                });
                if pod.wait_deletion(Duration::from_secs(2)).await.is_some() {
                    return;
                }
            }
        }
    };
    if pod.deletion().is_some() {
        return;
    }
    let started = now_rfc3339();
    let mut attempts = 0;
    let launched = loop {
        let mut running = match launch(pod, &config).await {
            Ok(running) => running,
            Err(e) => break Err(e),
        };
        if attempts == 0 {
            pod.set_status(|s| {
                s["phase"] = json!("Running");
                s["podIP"] = json!(POD_IP);
                s["podIPs"] = json!([{"ip": POD_IP}]);
                s["startTime"] = json!(started);
                s["conditions"] = json!([
                    pod_condition("PodScheduled", true, None),
                    pod_condition("Initialized", true, None),
                    pod_condition("ContainersReady", true, None),
                    pod_condition("Ready", true, None),
                ]);
                s["containerStatuses"] = json!([{
                    "name": container["name"], "image": image, "imageID": "",
                    "containerID": format!("fake://{}", pod.uid),
                    "ready": true, "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": started}},
                }]);
            });
        }
        let code = running.wait(pod).await;
        // Should bwrap's loopback set-up still meet slirp4netns's configuration and fail
        // ("loopback: Failed RTM_NEWADDR") before the command ran, the start is retried.
        if code == 1 && attempts < 5 && pod.deletion().is_none() && loopback_race(&config.log) {
            attempts += 1;
            drop(running);
            let _ = std::fs::write(&config.log, "");
            continue;
        }
        break Ok((running, code));
    };
    match launched {
        Ok((running, code)) => {
            let oom = running.cgroup.as_ref().is_some_and(|c| c.oom_kills() > 0);
            drop(running);
            let reason = if oom {
                "OOMKilled"
            } else if code == 0 {
                "Completed"
            } else {
                "Error"
            };
            let mut terminated = json!({
                "exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now_rfc3339(),
                "containerID": format!("fake://{}", pod.uid),
            });
            if code > 128 {
                terminated["signal"] = json!(code - 128);
            }
            pod.set_status(|s| {
                s["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
                s["conditions"] = json!([
                    pod_condition("PodScheduled", true, None),
                    pod_condition("Initialized", true, None),
                    pod_condition("ContainersReady", false, Some("PodCompleted")),
                    pod_condition("Ready", false, Some("PodCompleted")),
                ]);
                s["containerStatuses"] = json!([{
                    "name": container["name"], "image": image, "imageID": "",
                    "containerID": format!("fake://{}", pod.uid),
                    "ready": false, "restartCount": 0, "started": false,
                    "state": {"terminated": terminated},
                }]);
            });
        }
        Err(message) => {
            // What bwrap said on its way out (its stderr went to the log).
            let said = std::fs::read_to_string(&config.log).unwrap_or_default();
            let said: Vec<&str> = said.lines().map(|l| split_line(l).1).collect();
            let message = if said.is_empty() {
                message
            } else {
                format!("{message}: {}", said.join(" "))
            };
            append_log(
                &config.log,
                &format!("fake-kube: cannot start the container: {message}\n"),
            );
            pod.set_status(|s| {
                s["phase"] = json!("Failed");
                s["containerStatuses"] = json!([{
                    "name": container["name"], "image": image, "imageID": "", "ready": false,
                    "restartCount": 0, "started": false,
                    "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                        "startedAt": started, "finishedAt": now_rfc3339()}},
                }]);
            });
        }
    }
}

/// Whether the log holds only bwrap's failure to set up the loopback interface.
fn loopback_race(log: &Path) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().map(|l| split_line(l).1).collect();
    !lines.is_empty() && lines.iter().all(|l| l.starts_with("bwrap: loopback:"))
}

/// A container ready to start.
#[derive(Debug)]
struct Config {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    uid: u32,
    gid: u32,
    workdir: Option<String>,
    rootfs: PathBuf,
    /// (host path, path in the container, read only)
    mounts: Vec<(PathBuf, String, bool)>,
    memory: Option<u64>,
    log: PathBuf,
    hostname: String,
}

type Refusal = (&'static str, String);

fn config_error(message: String) -> Refusal {
    ("CreateContainerConfigError", message)
}

fn secret_data(pod: &PodRef, name: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let store = pod.shared.lock();
    let secret = store
        .get("secrets", &pod.ns, name)
        .ok_or_else(|| format!("secret \"{name}\" not found"))?;
    let mut out = BTreeMap::new();
    for (k, v) in secret["data"].as_object().into_iter().flatten() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap_or_default();
        out.insert(k.clone(), bytes);
    }
    Ok(out)
}

fn config_map_data(pod: &PodRef, name: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let store = pod.shared.lock();
    let map = store
        .get("configmaps", &pod.ns, name)
        .ok_or_else(|| format!("configmap \"{name}\" not found"))?;
    Ok(map["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().unwrap_or_default().as_bytes().to_vec(),
            )
        })
        .collect())
}

/// Bytes of a memory quantity (`64Mi`, `1G`, `1000`).
pub fn quantity_bytes(text: &str) -> Option<u64> {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    text.parse().ok()
}

fn field_ref(pod: &Value, path: &str) -> Result<String, String> {
    let meta = &pod["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match path {
        "metadata.name" => Ok(text(&meta["name"])),
        "metadata.namespace" => Ok(text(&meta["namespace"])),
        "metadata.uid" => Ok(text(&meta["uid"])),
        "spec.nodeName" => Ok(NODE_NAME.to_owned()),
        "spec.serviceAccountName" => Ok(text(&pod["spec"]["serviceAccountName"])),
        "status.podIP" => Ok(POD_IP.to_owned()),
        "status.hostIP" => Ok("127.0.0.1".to_owned()),
        other => {
            for (prefix, map) in [
                ("metadata.labels['", "labels"),
                ("metadata.annotations['", "annotations"),
            ] {
                if let Some(key) = other
                    .strip_prefix(prefix)
                    .and_then(|k| k.strip_suffix("']"))
                {
                    return Ok(text(&meta[map][key]));
                }
            }
            Err(format!("unsupported fieldPath {other:?}"))
        }
    }
}

/// The pod's one container made into what the sandbox runs: its command, user, environment,
/// volumes and mounts, memory limit and log file; a refusal says why the pod cannot start.
fn prepare(pod: &PodRef, object: &Value, rootfs: &Path) -> Result<Config, Refusal> {
    let spec = &object["spec"];
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.len() != 1
        || spec["initContainers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    {
        return Err(config_error(
            "fake-kube runs pods of exactly one container and no init containers".into(),
        ));
    }
    let c = &containers[0];
    let argv = container_command(c)?;
    let (uid, gid) = container_user(pod, spec, c)?;
    let mut env = service_env(pod, spec);
    add_env_from(pod, c, &mut env)?;
    add_env_vars(pod, object, c, &mut env)?;
    let dir = pod.dir();
    make_dir(&dir)?;
    let volumes = pod_volumes(pod, spec, &dir, uid, gid)?;
    let mut mounts = volume_mounts(c, &volumes)?;
    mount_service_account(pod, spec, &dir, &mut mounts)?;
    let memory = memory_limit(c)?;
    let log = dir.join(format!("{}.log", c["name"].as_str().unwrap_or("container")));
    Ok(Config {
        argv,
        env,
        uid,
        gid,
        workdir: c["workingDir"].as_str().map(str::to_owned),
        rootfs: rootfs.to_path_buf(),
        mounts,
        memory,
        log,
        hostname: pod.name.clone(),
    })
}

/// Creates a directory of the pod's, or refuses the pod.
fn make_dir(path: &Path) -> Result<(), Refusal> {
    std::fs::create_dir_all(path)
        .map_err(|e| config_error(format!("cannot create {}: {e}", path.display())))
}

/// The container's `command` followed by its `args` (an explicit command is required).
fn container_command(c: &Value) -> Result<Vec<String>, Refusal> {
    let mut argv: Vec<String> = c["command"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    if argv.is_empty() {
        return Err(config_error("fake-kube needs an explicit command".into()));
    }
    argv.extend(
        c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned)),
    );
    Ok(argv)
}

/// The user and group the container runs as (its own security context over the pod's),
/// refused when `runAsNonRoot` asks for a user other than root and none is given.
fn container_user(pod: &PodRef, spec: &Value, c: &Value) -> Result<(u32, u32), Refusal> {
    let security = |field: &str| {
        let v = &c["securityContext"][field];
        if v.is_null() {
            spec["securityContext"][field].clone()
        } else {
            v.clone()
        }
    };
    let uid = security("runAsUser").as_u64().unwrap_or(0);
    let gid = security("runAsGroup").as_u64().unwrap_or(0);
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(config_error(
            "runAsUser and runAsGroup must be 32-bit ids".into(),
        ));
    };
    if security("runAsNonRoot") == json!(true) && uid == 0 {
        return Err(config_error(format!(
            "container has runAsNonRoot and image will run as root (pod: \"{}_{}({})\", container: {})",
            pod.name,
            pod.ns,
            pod.uid,
            c["name"].as_str().unwrap_or_default()
        )));
    }
    Ok((uid, gid))
}

/// The environment every container gets: `PATH`, `HOSTNAME` and the `kubernetes` service's
/// variables (its links too unless `enableServiceLinks` is false).
fn service_env(pod: &PodRef, spec: &Value) -> BTreeMap<String, String> {
    let port = pod.shared.addr.port();
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_owned(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
    );
    env.insert("HOSTNAME".to_owned(), pod.name.clone());
    env.insert(
        "KUBERNETES_SERVICE_HOST".to_owned(),
        HOST_FROM_POD.to_owned(),
    );
    env.insert("KUBERNETES_SERVICE_PORT".to_owned(), port.to_string());
    if spec["enableServiceLinks"] != json!(false) {
        // The links of the one service there is, `kubernetes` (as in the default namespace).
        env.insert("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.to_string());
        env.insert(
            "KUBERNETES_PORT".to_owned(),
            format!("tcp://{HOST_FROM_POD}:{port}"),
        );
        env.insert(
            format!("KUBERNETES_PORT_{port}_TCP"),
            format!("tcp://{HOST_FROM_POD}:{port}"),
        );
        env.insert(
            format!("KUBERNETES_PORT_{port}_TCP_PROTO"),
            "tcp".to_owned(),
        );
        env.insert(format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string());
        env.insert(
            format!("KUBERNETES_PORT_{port}_TCP_ADDR"),
            HOST_FROM_POD.to_owned(),
        );
    }
    env
}

/// The container's `envFrom`: every key of the named Secrets and ConfigMaps, prefixed.
fn add_env_from(
    pod: &PodRef,
    c: &Value,
    env: &mut BTreeMap<String, String>,
) -> Result<(), Refusal> {
    for source in c["envFrom"].as_array().into_iter().flatten() {
        let prefix = source["prefix"].as_str().unwrap_or_default();
        let (reference, read): (&Value, fn(&PodRef, &str) -> _) = if source["secretRef"].is_object()
        {
            (&source["secretRef"], secret_data)
        } else {
            (&source["configMapRef"], config_map_data)
        };
        let data = match read(pod, reference["name"].as_str().unwrap_or_default()) {
            Err(_) if reference["optional"] == json!(true) => BTreeMap::new(),
            read => read.map_err(config_error)?,
        };
        for (k, v) in data {
            env.insert(
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into_owned(),
            );
        }
    }
    Ok(())
}

/// The container's `env`: literal values, Secret and ConfigMap keys, and field references.
fn add_env_vars(
    pod: &PodRef,
    object: &Value,
    c: &Value,
    env: &mut BTreeMap<String, String>,
) -> Result<(), Refusal> {
    for var in c["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default().to_owned();
        let from = &var["valueFrom"];
        let value = if let Some(v) = var["value"].as_str() {
            v.to_owned()
        } else if from["secretKeyRef"].is_object() || from["configMapKeyRef"].is_object() {
            let (r, secret) = if from["secretKeyRef"].is_object() {
                (&from["secretKeyRef"], true)
            } else {
                (&from["configMapKeyRef"], false)
            };
            let source = r["name"].as_str().unwrap_or_default();
            let key = r["key"].as_str().unwrap_or_default();
            let data = if secret {
                secret_data(pod, source)
            } else {
                config_map_data(pod, source)
            };
            match data.map(|d| d.get(key).cloned()) {
                Ok(Some(v)) => String::from_utf8_lossy(&v).into_owned(),
                Ok(None) if r["optional"] == json!(true) => continue,
                Ok(None) => {
                    let kind = if secret { "Secret" } else { "ConfigMap" };
                    return Err(config_error(format!(
                        "couldn't find key {key} in {kind} {}/{source}",
                        pod.ns
                    )));
                }
                Err(_) if r["optional"] == json!(true) => continue,
                Err(e) => return Err(config_error(e)),
            }
        } else if from["fieldRef"].is_object() {
            field_ref(
                object,
                from["fieldRef"]["fieldPath"].as_str().unwrap_or_default(),
            )
            .map_err(config_error)?
        } else {
            String::new()
        };
        env.insert(name, value);
    }
    Ok(())
}

/// The pod's volumes under its directory: emptyDirs owned by the container's user (or the
/// pod's `fsGroup`), Secrets and ConfigMaps written out as files; by name.
fn pod_volumes(
    pod: &PodRef,
    spec: &Value,
    dir: &Path,
    uid: u32,
    gid: u32,
) -> Result<BTreeMap<String, PathBuf>, Refusal> {
    let fs_group = spec["securityContext"]["fsGroup"]
        .as_u64()
        .and_then(|g| u32::try_from(g).ok());
    let mut volumes: BTreeMap<String, PathBuf> = BTreeMap::new();
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default().to_owned();
        let path = dir.join("volumes").join(&name);
        if volume["emptyDir"].is_object() {
            make_dir(&path)?;
            let group = fs_group.unwrap_or(gid);
            let mode = if fs_group.is_some() { 0o2775 } else { 0o755 };
            nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(group)),
            )
            .map_err(|e| config_error(format!("cannot give {} to {uid}: {e}", path.display())))?;
            crate::set_mode(&path, mode).map_err(|e| {
                config_error(format!("cannot set the mode of {}: {e}", path.display()))
            })?;
        } else if volume["secret"].is_object() || volume["configMap"].is_object() {
            let (source, secret) = if volume["secret"].is_object() {
                (&volume["secret"], true)
            } else {
                (&volume["configMap"], false)
            };
            let source_name = source[if secret { "secretName" } else { "name" }]
                .as_str()
                .unwrap_or_default();
            let data = if secret {
                secret_data(pod, source_name)
            } else {
                config_map_data(pod, source_name)
            }
            .map_err(|e| {
                (
                    "ContainerCreating",
                    format!("MountVolume.SetUp failed for volume \"{name}\" : {e}"),
                )
            })?;
            make_dir(&path)?;
            let default_mode = source["defaultMode"]
                .as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .unwrap_or(0o644);
            let items: Vec<(String, String, u32)> = match source["items"].as_array() {
                Some(items) => items
                    .iter()
                    .map(|i| {
                        (
                            i["key"].as_str().unwrap_or_default().to_owned(),
                            i["path"].as_str().unwrap_or_default().to_owned(),
                            i["mode"]
                                .as_u64()
                                .and_then(|m| u32::try_from(m).ok())
                                .unwrap_or(default_mode),
                        )
                    })
                    .collect(),
                None => data
                    .keys()
                    .map(|k| (k.clone(), k.clone(), default_mode))
                    .collect(),
            };
            for (key, file, mode) in items {
                if file.split('/').any(|part| part == ".." || part.is_empty()) {
                    return Err(config_error(format!(
                        "volume \"{name}\": invalid item path {file:?}"
                    )));
                }
                let bytes = data.get(&key).ok_or_else(|| {
                    config_error(format!(
                        "volume \"{name}\": no key {key:?} in {source_name:?}"
                    ))
                })?;
                let target = path.join(&file);
                if let Some(parent) = target.parent() {
                    make_dir(parent)?;
                }
                std::fs::write(&target, bytes)
                    .map_err(|e| config_error(format!("cannot write {}: {e}", target.display())))?;
                crate::set_mode(&target, mode).map_err(|e| {
                    config_error(format!("cannot set the mode of {}: {e}", target.display()))
                })?;
                if let Some(group) = fs_group {
                    let _ =
                        nix::unistd::chown(&target, None, Some(nix::unistd::Gid::from_raw(group)));
                }
            }
        } else {
            return Err(config_error(format!(
                "volume \"{name}\": fake-kube supports emptyDir, secret and configMap volumes only"
            )));
        }
        volumes.insert(name, path);
    }
    Ok(volumes)
}

/// The container's `volumeMounts`: (the volume's directory, where it is mounted, read-only).
fn volume_mounts(
    c: &Value,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Vec<(PathBuf, String, bool)>, Refusal> {
    let mut mounts = Vec::new();
    for mount in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = mount["name"].as_str().unwrap_or_default();
        let at = mount["mountPath"].as_str().unwrap_or_default();
        if !at.starts_with('/') || at.split('/').any(|p| p == "..") {
            return Err(config_error(format!(
                "volumeMount \"{name}\": mountPath {at:?} must be an absolute path"
            )));
        }
        let source = volumes
            .get(name)
            .ok_or_else(|| config_error(format!("volumeMount \"{name}\": no such volume")))?;
        mounts.push((
            source.clone(),
            at.to_owned(),
            mount["readOnly"] == json!(true),
        ));
    }
    Ok(mounts)
}

/// The service account's token, namespace and CA mounted at their usual place, unless the pod
/// opts out or mounts something there itself.
fn mount_service_account(
    pod: &PodRef,
    spec: &Value,
    dir: &Path,
    mounts: &mut Vec<(PathBuf, String, bool)>,
) -> Result<(), Refusal> {
    let automount = spec["automountServiceAccountToken"] != json!(false);
    if automount && !mounts.iter().any(|(_, at, _)| at == TOKEN_DIR) {
        let sa = dir.join("serviceaccount");
        make_dir(&sa)?;
        for (file, content) in [
            ("token", pod.shared.token.as_str()),
            ("namespace", pod.ns.as_str()),
            ("ca.crt", ""),
        ] {
            std::fs::write(sa.join(file), content)
                .map_err(|e| config_error(format!("cannot write the token: {e}")))?;
            crate::set_mode(&sa.join(file), 0o644)
                .map_err(|e| config_error(format!("cannot write the token: {e}")))?;
        }
        mounts.push((sa, TOKEN_DIR.to_owned(), true));
    }
    Ok(())
}

/// The container's memory limit in bytes, if it has one.
fn memory_limit(c: &Value) -> Result<Option<u64>, Refusal> {
    c["resources"]["limits"]["memory"]
        .as_str()
        .map(|m| {
            quantity_bytes(m).ok_or_else(|| {
                config_error(format!(
                    "memory limit {m:?} is not a quantity fake-kube reads"
                ))
            })
        })
        .transpose()
}

fn append_log(path: &Path, text: &str) {
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        for line in text.lines() {
            let _ = writeln!(file, "{} {line}", timestamp_nanos());
        }
    }
}

fn timestamp_nanos() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{}.{:09}Z",
        rfc3339(now).trim_end_matches('Z'),
        now.nanosecond()
    )
}

/// The bwrap arguments that build the container's file system: the image's top-level
/// entries bound read-only over bwrap's own tmpfs root (so mount points that the image
/// lacks can be made), `/proc`, `/dev`, and the volumes.
fn filesystem_args(config: &Config) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let entries = std::fs::read_dir(&config.rootfs).map_err(|e| {
        format!(
            "cannot read the image root {}: {e}",
            config.rootfs.display()
        )
    })?;
    let mut names: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    names.sort();
    for (name, path) in names {
        if matches!(name.as_str(), "proc" | "dev" | "tmp") {
            continue;
        }
        let at = format!("/{name}");
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                args.extend([
                    "--symlink".into(),
                    target.to_string_lossy().into_owned(),
                    at,
                ]);
            }
            Ok(meta) if meta.is_dir() => {
                args.extend(["--ro-bind".into(), path.to_string_lossy().into_owned(), at]);
            }
            _ => {}
        }
    }
    args.extend([
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
    ]);
    if !config.mounts.iter().any(|(_, at, _)| at == "/tmp") {
        args.extend(["--dir".into(), "/tmp".into()]);
    }
    // A mount point missing from a read-only directory of the image: a tmpfs over its
    // nearest existing parent below the root (holding that directory's entries), and the
    // mount made at the path with the image's symlinks resolved (bwrap does not follow
    // them when it makes mount points).
    let mut tmpfs: Vec<String> = Vec::new();
    let mut resolved_mounts = Vec::new();
    let root = config
        .rootfs
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", config.rootfs.display()))?;
    for (source, at, read_only) in &config.mounts {
        let inside = config.rootfs.join(at.trim_start_matches('/'));
        let mut existing = Some(inside.as_path());
        while let Some(p) = existing {
            if p.exists() {
                break;
            }
            existing = p.parent();
        }
        let Some(existing) = existing else { continue };
        let real = existing
            .canonicalize()
            .map_err(|e| format!("cannot resolve {}: {e}", existing.display()))?;
        let relative = real
            .strip_prefix(&root)
            .map_err(|_| format!("mount path {at} leaves the image"))?
            .to_path_buf();
        let rest = inside
            .strip_prefix(existing)
            .unwrap_or(Path::new(""))
            .to_path_buf();
        let target = Path::new("/").join(&relative).join(&rest);
        if !rest.as_os_str().is_empty() && !relative.as_os_str().is_empty() {
            let top = format!("/{}", relative.to_string_lossy());
            if !tmpfs.contains(&top) {
                tmpfs.push(top);
            }
        }
        resolved_mounts.push((
            source.clone(),
            target.to_string_lossy().into_owned(),
            *read_only,
        ));
    }
    // The tmpfs keeps the directory's content: each entry bound (or linked) into it.
    for at in &tmpfs {
        args.extend(["--tmpfs".into(), at.clone()]);
        let dir = root.join(at.trim_start_matches('/'));
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for path in entries {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let inside = format!("{at}/{name}");
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&path) {
                        args.extend([
                            "--symlink".into(),
                            target.to_string_lossy().into_owned(),
                            inside,
                        ]);
                    }
                }
                Ok(meta) if meta.is_dir() || meta.is_file() => {
                    args.extend([
                        "--ro-bind".into(),
                        path.to_string_lossy().into_owned(),
                        inside,
                    ]);
                }
                _ => {}
            }
        }
    }
    let mut mounts = resolved_mounts;
    mounts.sort_by_key(|(_, at, _)| at.matches('/').count());
    for (source, at, read_only) in mounts {
        let flag = if read_only { "--ro-bind" } else { "--bind" };
        args.extend([flag.into(), source.to_string_lossy().into_owned(), at]);
    }
    // The root (bwrap's tmpfs holding the mount points) is read-only too: a container
    // writes to its volumes only (readOnlyRootFilesystem false gets no writable overlay).
    args.extend(["--remount-ro".into(), "/".into()]);
    for at in tmpfs {
        args.extend(["--remount-ro".into(), at]);
    }
    Ok(args)
}

/// A started container.
struct Running {
    child: tokio::process::Child,
    pid: i32,
    _slirp: tokio::process::Child,
    cgroup: Option<crate::kubelet::Cgroup>,
    output: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Waits for the container to end, stopping it if the pod is deleted; its exit code.
    async fn wait(&mut self, pod: &PodRef) -> i32 {
        let mut receiver = pod.shared.lock().changed.subscribe();
        let status = loop {
            tokio::select! {
                status = self.child.wait() => break status,
                _ = tokio::time::timeout(Duration::from_millis(250), receiver.changed()) => {
                    if let Some(grace) = pod.deletion() {
                        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
                        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                        match tokio::time::timeout(limit, self.child.wait()).await {
                            Ok(status) => break status,
                            Err(_) => {
                                let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                                break self.child.wait().await;
                            }
                        }
                    }
                }
            }
        };
        for task in self.output.drain(..) {
            let _ = task.await;
        }
        match status {
            Ok(s) => s.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(9)
            }),
            Err(_) => 128,
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let (r, w) = std::io::pipe().map_err(|e| format!("cannot create a pipe: {e}"))?;
    Ok((r.into(), w.into()))
}

/// Reads bwrap's `--info-fd` until the child's pid is there.
fn read_child_pid(fd: OwnedFd) -> Result<i32, String> {
    let mut file = std::fs::File::from(fd);
    let mut text = String::new();
    let mut buf = [0u8; 512];
    loop {
        // The whole document: as an unprivileged user bwrap writes the namespaces after
        // it has mapped the user namespace, which slirp4netns must join set up.
        if let Some(start) = text.find("\"child-pid\":")
            && text.contains('}')
        {
            let rest = text[start + 12..].trim_start();
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() && rest.len() > digits.len() {
                // bwrap writes the rest (the namespaces) later: read it to its end, or bwrap
                // would die of SIGPIPE.
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut file, &mut std::io::sink());
                });
                return digits.parse().map_err(|e| format!("bad child pid: {e}"));
            }
        }
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("cannot read bwrap's info: {e}"))?;
        if n == 0 {
            return Err(format!("bwrap ended before it named its child: {text}"));
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

async fn launch(pod: &PodRef, config: &Config) -> Result<Running, String> {
    let mut args: Vec<String> = vec![
        "--die-with-parent".into(),
        "--unshare-pid".into(),
        "--unshare-ipc".into(),
        "--unshare-uts".into(),
        "--unshare-net".into(),
        "--as-pid-1".into(),
        "--hostname".into(),
        config.hostname.clone(),
    ];
    let non_root = config.uid != 0;
    if non_root {
        args.extend([
            "--unshare-user".into(),
            "--uid".into(),
            config.uid.to_string(),
            "--gid".into(),
            config.gid.to_string(),
            "--cap-drop".into(),
            "ALL".into(),
        ]);
    }
    args.extend(filesystem_args(config)?);
    if let Some(dir) = &config.workdir {
        args.extend(["--chdir".into(), dir.clone()]);
    }
    args.extend([
        "--info-fd".into(),
        "3".into(),
        "--block-fd".into(),
        "4".into(),
        "--".into(),
    ]);
    args.extend(config.argv.iter().cloned());
    // The log exists (empty) from the start: a running container's log can be read.
    std::fs::File::create(&config.log)
        .map_err(|e| format!("cannot create {}: {e}", config.log.display()))?;
    let (info_r, info_w) = pipe()?;
    let (block_r, block_w) = pipe()?;
    let mut command = tokio::process::Command::new("bwrap");
    command
        .args(&args)
        .env_clear()
        .envs(&config.env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if non_root {
        command.uid(config.uid).gid(config.gid);
    }
    command
        .fd_mappings(vec![
            FdMapping {
                parent_fd: info_w,
                child_fd: 3,
            },
            FdMapping {
                parent_fd: block_r,
                child_fd: 4,
            },
        ])
        .map_err(|e| format!("cannot pass descriptors to bwrap: {e}"))?;
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start bwrap: {e}"))?;
    drop(command);
    let bwrap_pid = child.id().unwrap_or(0);
    let mut output = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let log = config.log.clone();
        output.push(tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stream);
            let mut line = Vec::new();
            while let Ok(n) = reader.read_until(b'\n', &mut line).await {
                if n == 0 {
                    break;
                }
                append_log(&log, &String::from_utf8_lossy(&line));
                line.clear();
            }
        }));
    }
    let pid = match tokio::task::spawn_blocking(move || read_child_pid(info_r))
        .await
        .map_err(|e| e.to_string())
    {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) | Err(e) => {
            let _ = child.kill().await;
            return Err(e);
        }
    };
    let result = finish_launch(pod, config, child, pid, bwrap_pid, block_w, output).await;
    if result.is_err() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    result
}

async fn finish_launch(
    pod: &PodRef,
    config: &Config,
    mut child: tokio::process::Child,
    pid: i32,
    bwrap_pid: u32,
    block_w: OwnedFd,
    output: Vec<tokio::task::JoinHandle<()>>,
) -> Result<Running, String> {
    // bwrap brings the sandbox's loopback up (over netlink) before it blocks; slirp4netns
    // configuring tap0 at the same time makes that request fail now and then. Wait for
    // 127.0.0.1 to be there first.
    let fib = format!("/proc/{pid}/net/fib_trie");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&fib).is_ok_and(|t| t.contains("127.0.0.1"))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let cgroup = match config.memory {
        Some(bytes) => match Cgroup::create(&pod.uid, bytes) {
            Ok(group) => match group.attach(&[bwrap_pid, u32::try_from(pid).unwrap_or(0)]) {
                Ok(()) => Some(group),
                Err(e) => {
                    append_log(
                        &config.log,
                        &format!("fake-kube: no memory limit for this container: {e}"),
                    );
                    None
                }
            },
            Err(e) => {
                append_log(
                    &config.log,
                    &format!("fake-kube: no memory limit for this container: {e}"),
                );
                None
            }
        },
        None => None,
    };
    let (ready_r, ready_w) = pipe()?;
    let slirp_log_path = pod.dir().join("slirp4netns.log");
    let slirp_log = std::fs::File::create(&slirp_log_path)
        .map_err(|e| format!("cannot create {}: {e}", slirp_log_path.display()))?;
    let mut slirp = tokio::process::Command::new("slirp4netns");
    slirp.args(["--configure", "--mtu=65520", "--ready-fd", "3"]);
    // The network namespace by its path: by pid, slirp4netns would join the pid's user
    // namespace, which for a non-root pod is bwrap's nested one (no power over the netns).
    slirp
        .args([
            "--netns-type=path".to_owned(),
            format!("/proc/{pid}/ns/net"),
            "tap0".to_owned(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(
            slirp_log
                .try_clone()
                .map_err(|e| format!("cannot open the network log: {e}"))?,
        )
        .stderr(slirp_log)
        .kill_on_drop(true)
        .fd_mappings(vec![FdMapping {
            parent_fd: ready_w,
            child_fd: 3,
        }])
        .map_err(|e| format!("cannot pass descriptors to slirp4netns: {e}"))?;
    let slirp_child = slirp
        .spawn()
        .map_err(|e| format!("cannot start slirp4netns: {e}"))?;
    drop(slirp);
    let ready = tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::from(ready_r);
        let mut byte = [0u8; 1];
        file.read(&mut byte).map(|n| n == 1 && byte[0] == b'1')
    });
    match tokio::time::timeout(Duration::from_secs(30), ready).await {
        Ok(Ok(Ok(true))) => {}
        _ => {
            let _ = child.kill().await;
            let said = std::fs::read_to_string(&slirp_log_path).unwrap_or_default();
            return Err(format!(
                "slirp4netns did not set up the pod's network: {}",
                said.trim()
            ));
        }
    }
    let mut block = std::fs::File::from(block_w);
    if let Err(e) = block.write_all(b"1") {
        let _ = child.kill().await;
        return Err(format!("cannot release the container: {e}"));
    }
    drop(block);
    Ok(Running {
        child,
        pid,
        _slirp: slirp_child,
        cgroup,
        output,
    })
}

/// A memory control group for one container, as agentry's runner makes them (cgroup v1
/// `memory` controller, or v2 with `memory.oom.group`).
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn create(name: &str, bytes: u64) -> Result<Self, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let v1 = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        });
        let (dir, v2) = match v1 {
            Some(path) => (
                Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                false,
            ),
            None => match own.lines().find_map(|l| l.strip_prefix("0::")) {
                Some(path) => (
                    Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
                    true,
                ),
                None => return Err("no cgroup hierarchy holds this process".into()),
            },
        };
        let dir = dir.join(format!("fake-kube-{name}"));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let group = Self { dir, v2 };
        let writes: Vec<(&str, String)> = if v2 {
            vec![
                ("memory.max", bytes.to_string()),
                ("memory.swap.max", "0".into()),
                ("memory.oom.group", "1".into()),
            ]
        } else {
            vec![
                ("memory.limit_in_bytes", bytes.to_string()),
                ("memory.memsw.limit_in_bytes", bytes.to_string()),
            ]
        };
        for (file, value) in writes {
            let path = group.dir.join(file);
            if file.contains("swap") || file.contains("memsw") {
                if path.exists() {
                    let _ = std::fs::write(&path, &value);
                }
                continue;
            }
            std::fs::write(&path, &value)
                .map_err(|e| format!("cannot write {value} to {}: {e}", path.display()))?;
        }
        Ok(group)
    }

    fn attach(&self, pids: &[u32]) -> Result<(), String> {
        for pid in pids {
            std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
                .map_err(|e| format!("cannot move {pid} into {}: {e}", self.dir.display()))?;
        }
        Ok(())
    }

    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One log line: its timestamp and its text (with its newline).
fn split_line(line: &str) -> (&str, &str) {
    line.split_once(' ').unwrap_or((line, ""))
}

fn container_done(shared: &Shared, ns: &str, name: &str, uid: &str) -> bool {
    let store = shared.lock();
    match store.get("pods", ns, name) {
        Some(p) if p["metadata"]["uid"].as_str() == Some(uid) => {
            !store.kubelet_pods.contains(uid)
                || p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
        }
        _ => true,
    }
}

/// `GET …/pods/NAME/log`: the container's output, with `follow`, `sinceTime`,
/// `sinceSeconds`, `timestamps`, `tailLines` and `container`.
pub async fn log_response(
    shared: Arc<Shared>,
    ns: &str,
    name: &str,
    query: &std::collections::HashMap<String, String>,
) -> HttpResponse {
    let error = |e: ApiError| {
        HttpResponse::build(
            actix_web::http::StatusCode::from_u16(e.code)
                .unwrap_or(actix_web::http::StatusCode::BAD_REQUEST),
        )
        .content_type("application/json")
        .body(e.status().to_string())
    };
    let Some(pod) = shared.lock().get("pods", ns, name).cloned() else {
        return error(ApiError::not_found(pods(), name));
    };
    let container = pod["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(asked) = query.get("container")
        && *asked != container
    {
        return error(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        )));
    }
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let path = shared
        .state_dir
        .join("pods")
        .join(&uid)
        .join(format!("{container}.log"));
    if !path.exists() {
        let reason = pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        return error(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
        )));
    }
    let flag = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");
    let timestamps = flag("timestamps");
    let follow = flag("follow");
    let since = if let Some(t) = query.get("sinceTime") {
        match store::parse_time(t) {
            Some(t) => Some(t),
            None => {
                return error(ApiError::bad_request(format!(
                    "sinceTime {t:?} is not an RFC 3339 time"
                )));
            }
        }
    } else if let Some(s) = query.get("sinceSeconds") {
        match s.parse::<i64>() {
            Ok(s) if s > 0 => Some(time::OffsetDateTime::now_utc() - time::Duration::seconds(s)),
            _ => {
                return error(ApiError::bad_request(format!(
                    "sinceSeconds {s:?} must be a positive number"
                )));
            }
        }
    } else {
        None
    };
    let tail = match query.get("tailLines").map(|t| t.parse::<usize>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => return error(ApiError::bad_request("tailLines must be a number")),
    };
    let render = move |line: &str| -> Option<String> {
        let (stamp, text) = split_line(line);
        if let Some(since) = since
            && store::parse_time(stamp).is_some_and(|t| t < since)
        {
            return None;
        }
        Some(if timestamps {
            line.to_owned()
        } else {
            text.to_owned()
        })
    };
    let content = std::fs::read_to_string(&path).unwrap_or_default();
    let complete = content.rfind('\n').map_or(0, |i| i + 1);
    let mut lines: Vec<String> = content[..complete]
        .split_inclusive('\n')
        .filter_map(&render)
        .collect();
    if let Some(n) = tail {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let first = Bytes::from(lines.concat());
    if !follow {
        return HttpResponse::Ok().content_type("text/plain").body(first);
    }
    let ns = ns.to_owned();
    let name = name.to_owned();
    let start = (Some(first), complete, false);
    let stream = futures_util::stream::unfold(start, move |(first, offset, finished)| {
        let (shared, path, ns, name, uid, render) = (
            shared.clone(),
            path.clone(),
            ns.clone(),
            name.clone(),
            uid.clone(),
            render,
        );
        async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, std::convert::Infallible>(first),
                    (None, offset, false),
                ));
            }
            if finished {
                return None;
            }
            loop {
                let done = container_done(&shared, &ns, &name, &uid);
                let content = std::fs::read(&path).unwrap_or_default();
                let fresh = content.get(offset..).unwrap_or_default();
                let complete = fresh.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                if complete > 0 {
                    let text = String::from_utf8_lossy(&fresh[..complete]).into_owned();
                    let out: String = text.split_inclusive('\n').filter_map(&render).collect();
                    return Some((Ok(Bytes::from(out)), (None, offset + complete, false)));
                }
                if done {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    HttpResponse::Ok()
        .content_type("text/plain")
        .streaming(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_bytes() {
        assert_eq!(quantity_bytes("64Mi"), Some(64 << 20));
        assert_eq!(quantity_bytes("1G"), Some(1_000_000_000));
        assert_eq!(quantity_bytes("123"), Some(123));
        assert_eq!(quantity_bytes("lots"), None);
    }
}
