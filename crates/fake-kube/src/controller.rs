//! Deletion with propagation, the garbage collector, and the Job controller.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Shared;
use crate::store::{self, ApiError, Resource, Store, now_rfc3339, parse_time};

fn res(name: &str) -> &'static Resource {
    store::RESOURCES
        .iter()
        .find(|r| r.name == name)
        .unwrap_or(&store::RESOURCES[0])
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn owned_by(object: &Value, owner: &str) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(owner)))
}

/// The resource, namespace and name of every object in `store` owned by the uid `owner`.
fn dependents(store: &Store, owner: &str) -> Vec<store::Key> {
    store
        .objects
        .iter()
        .filter(|(_, o)| owned_by(o, owner))
        .map(|((r, n, name), _)| (*r, n.clone(), name.clone()))
        .collect()
}

/// Fills in what the API server adds to a new Job: its selector and its pods' labels.
pub fn default_job(job: &mut Value) {
    // The uid is given at insert; the labels use a uid chosen here and kept as the uid.
    let uid = uuid::Uuid::new_v4().to_string();
    let name = job["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    job["metadata"]["uid"] = json!(uid);
    job["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    job["spec"]["manualSelector"] = json!(false);
    let labels = &mut job["spec"]["template"]["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        labels[k] = json!(v);
    }
    let job_labels = &mut job["metadata"]["labels"];
    if !job_labels.is_object() {
        *job_labels = json!({});
    }
    job_labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    job_labels["batch.kubernetes.io/job-name"] = json!(name);
    job_labels["controller-uid"] = json!(uid);
    job_labels["job-name"] = json!(name);
}

/// Deletes an object as the API server does: a pod the kubelet holds is marked and stopped
/// (its object goes once its containers are gone), a Job without a policy orphans its pods,
/// `Foreground` waits for the dependents, `Background` leaves them to the collector.
pub fn delete(
    store: &mut Store,
    r: &'static Resource,
    ns: &str,
    name: &str,
    policy: Option<&str>,
    grace: Option<i64>,
) -> Result<(u16, Value, Option<String>), ApiError> {
    let object = store
        .get(r.name, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(r, name))?;
    let owner = uid(&object);
    if r.name == "namespaces" {
        if store.objects.keys().any(|(_, n, _)| n == name) {
            return Err(ApiError::other(
                409,
                "Conflict",
                format!("fake-kube deletes empty namespaces only; {name:?} still holds objects"),
            ));
        }
        let removed = store.remove(r, "", name).unwrap_or(object);
        return Ok((200, removed, None));
    }
    if r.name == "pods" {
        if store.kubelet_pods.contains(&owner) {
            let grace = grace
                .or_else(|| object["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30);
            let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(grace);
            let marked = match object["metadata"]["deletionGracePeriodSeconds"].as_i64() {
                Some(old) if old <= grace => object,
                _ => store
                    .modify(r, ns, name, |p| {
                        p["metadata"]["deletionTimestamp"] = json!(rfc3339(at));
                        p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                    })
                    .unwrap_or_default(),
            };
            return Ok((200, marked, None));
        }
        let removed = store.remove(r, ns, name).unwrap_or(object);
        return Ok((200, removed, None));
    }
    let (policy, warning) = match (policy, r.name) {
        (Some(p), _) => (p, None),
        (None, "jobs") => ("Orphan", Some("child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning".to_owned())),
        (None, _) => ("Background", None),
    };
    if object["metadata"]["deletionTimestamp"].is_string() {
        return Ok((200, object, warning));
    }
    let dependents = dependents(store, &owner);
    match policy {
        "Orphan" => {
            for (dr, dns, dname) in &dependents {
                store.modify(res(dr), dns, dname, |o| {
                    if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                        refs.retain(|x| x["uid"].as_str() != Some(owner.as_str()));
                    }
                });
            }
        }
        "Foreground" if !dependents.is_empty() => {
            let marked = store
                .modify(r, ns, name, |o| {
                    o["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                    o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                    let finalizers = &mut o["metadata"]["finalizers"];
                    if !finalizers.is_array() {
                        *finalizers = json!([]);
                    }
                    if let Some(list) = finalizers.as_array_mut() {
                        list.push(json!("foregroundDeletion"));
                    }
                })
                .unwrap_or_default();
            for (dr, dns, dname) in &dependents {
                let _ = delete(store, res(dr), dns, dname, Some("Background"), None);
            }
            return Ok((200, marked, warning));
        }
        _ => {}
    }
    let removed = store.remove(r, ns, name).unwrap_or(object);
    if matches!(r.name, "jobs") {
        Ok((200, removed, warning))
    } else {
        Ok((
            200,
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": r.group, "kind": r.name, "uid": owner},
            }),
            warning,
        ))
    }
}

/// An RFC 3339 timestamp in whole seconds.
pub fn rfc3339(at: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// Runs the garbage collector and the Job controller until the runtime stops.
pub async fn run(shared: Arc<Shared>) {
    let mut receiver = shared.lock().changed.subscribe();
    let mut pods = JobPods::default();
    loop {
        {
            let mut store = shared.lock();
            collect_garbage(&mut store);
            reconcile_jobs(&mut store, &mut pods);
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), receiver.changed()).await;
    }
}

fn collect_garbage(store: &mut Store) {
    let uids: HashSet<String> = store.objects.values().map(uid).collect();
    let mut orphans = Vec::new();
    let mut finished_owners = Vec::new();
    for ((r, ns, name), o) in &store.objects {
        if let Some(refs) = o["metadata"]["ownerReferences"].as_array()
            && !refs.is_empty()
            && refs
                .iter()
                .all(|x| !uids.contains(x["uid"].as_str().unwrap_or_default()))
            && o["metadata"]["deletionTimestamp"].is_null()
        {
            orphans.push((*r, ns.clone(), name.clone()));
        }
        let foreground = o["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "foregroundDeletion"));
        if foreground {
            let remaining = dependents(store, &uid(o));
            finished_owners.push(((*r, ns.clone(), name.clone()), remaining));
        }
    }
    for (r, ns, name) in orphans {
        let _ = delete(store, res(r), &ns, &name, Some("Background"), None);
    }
    for ((r, ns, name), remaining) in finished_owners {
        if remaining.is_empty() {
            store.remove(res(r), &ns, &name);
        } else {
            for (dr, dns, dname) in remaining {
                let deleting = store
                    .get(dr, &dns, &dname)
                    .is_some_and(|d| d["metadata"]["deletionTimestamp"].is_string());
                if !deleting {
                    let _ = delete(store, res(dr), &dns, &dname, Some("Background"), None);
                }
            }
        }
    }
}

fn condition(kind: &str, reason: &str, message: &str) -> Value {
    let now = now_rfc3339();
    json!({
        "type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
        "reason": reason, "message": message,
    })
}

fn has_condition(job: &Value, kind: &str) -> Option<Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
        .cloned()
}

/// What the Job controller remembers of the Jobs' pods between passes.
#[derive(Default)]
struct JobPods {
    /// The pods counted in their Job's `succeeded` or `failed`, by uid.
    counted: HashSet<String>,
    /// Every pod seen of each Job (by the Job's uid), by uid.
    seen: std::collections::HashMap<String, HashSet<String>>,
}

/// One pass of the Job controller: each finished Job expired after its TTL, each other Job
/// reconciled with its pods.
fn reconcile_jobs(store: &mut Store, pods: &mut JobPods) {
    let now = time::OffsetDateTime::now_utc();
    let jobs = store.list("jobs", None);
    let live: HashSet<String> = jobs.iter().map(uid).collect();
    pods.seen.retain(|job, _| live.contains(job));
    for job in jobs {
        let ns = job["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = job["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let finished = has_condition(&job, "Complete").or_else(|| has_condition(&job, "Failed"));
        if let Some(done) = finished {
            expire_finished_job(store, &job, &done, &ns, &name, now);
            continue;
        }
        reconcile_active_job(store, pods, &job, &ns, &name, now);
    }
}

/// A finished Job past its `ttlSecondsAfterFinished` is deleted (in the background, as the
/// TTL controller does).
fn expire_finished_job(
    store: &mut Store,
    job: &Value,
    done: &Value,
    ns: &str,
    name: &str,
    now: time::OffsetDateTime,
) {
    if let (Some(ttl), Some(at)) = (
        job["spec"]["ttlSecondsAfterFinished"].as_i64(),
        done["lastTransitionTime"].as_str().and_then(parse_time),
    ) && now >= at + time::Duration::seconds(ttl)
        && job["metadata"]["deletionTimestamp"].is_null()
    {
        let _ = delete(store, res("jobs"), ns, name, Some("Background"), None);
    }
}

/// One pass of the Job controller over an unfinished Job: its pods counted, the success or
/// failure target decided, running pods stopped once a target is met, the final condition
/// written when they have ended, or a new pod started when none runs.
fn reconcile_active_job(
    store: &mut Store,
    tracked: &mut JobPods,
    job: &Value,
    ns: &str,
    name: &str,
    now: time::OffsetDateTime,
) {
    let job_uid = uid(job);
    let pods: Vec<Value> = store
        .list("pods", Some(ns))
        .into_iter()
        .filter(|p| {
            p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"].as_str()
                == Some(job_uid.as_str())
        })
        .collect();
    let mut status = job["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    count_ended_pods(&mut status, &pods, &mut tracked.counted);
    count_deleted_pods(&mut status, &pods, tracked, &job_uid);
    let running: Vec<&Value> = pods
        .iter()
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .collect();
    let terminating = running
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
        .count();
    let active = running.len() - terminating;
    let ready = running
        .iter()
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count();
    let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    add_target_condition(&mut conditions, job, &status, now);
    let target = conditions
        .iter()
        .find(|c| c["type"] == "FailureTarget" || c["type"] == "SuccessCriteriaMet")
        .cloned();
    if let Some(target) = &target {
        finish_job(store, ns, &running, target, &mut conditions, &mut status);
    } else if running.is_empty() && job["metadata"]["deletionTimestamp"].is_null() {
        if status["startTime"].is_null() {
            status["startTime"] = json!(now_rfc3339());
        }
        create_pod(store, job, ns, name, &job_uid);
    }
    status["active"] = json!(if target.is_some() { 0 } else { active });
    status["ready"] = json!(ready);
    status["terminating"] = json!(terminating);
    if !conditions.is_empty() {
        status["conditions"] = json!(conditions);
    }
    for field in ["succeeded", "failed"] {
        if status[field].is_null() {
            status[field] = json!(0);
        }
    }
    if status != job["status"] {
        store.modify(res("jobs"), ns, name, |j| j["status"] = status);
    }
}

/// Each pod of the Job gone from the API before it ended adds one to the Job's `failed`, as
/// the real Job controller counts it (its tracking finalizer keeps the pod until it has): so
/// a Job that never retries (`backoffLimit: 0`) makes no other pod for a deleted one.
fn count_deleted_pods(status: &mut Value, pods: &[Value], tracked: &mut JobPods, job_uid: &str) {
    let seen = tracked.seen.entry(job_uid.to_owned()).or_default();
    let present: HashSet<String> = pods.iter().map(uid).collect();
    seen.extend(present.iter().cloned());
    for gone in seen.iter().filter(|u| !present.contains(*u)) {
        if tracked.counted.insert(gone.clone()) {
            status["failed"] = json!(status["failed"].as_i64().unwrap_or(0) + 1);
        }
    }
}

/// Each pod that has ended since the last pass adds one to the Job's `succeeded` or `failed`.
fn count_ended_pods(status: &mut Value, pods: &[Value], counted: &mut HashSet<String>) {
    for pod in pods {
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        let pod_uid = uid(pod);
        if matches!(phase, "Succeeded" | "Failed") && counted.insert(pod_uid) {
            let field = if phase == "Succeeded" {
                "succeeded"
            } else {
                "failed"
            };
            status[field] = json!(status[field].as_i64().unwrap_or(0) + 1);
        }
    }
}

/// The Job's target condition, once: `SuccessCriteriaMet` after a succeeded pod,
/// `FailureTarget` past the backoff limit or the active deadline.
fn add_target_condition(
    conditions: &mut Vec<Value>,
    job: &Value,
    status: &Value,
    now: time::OffsetDateTime,
) {
    let has = |conditions: &[Value], kind: &str| conditions.iter().any(|c| c["type"] == kind);
    if has(conditions, "FailureTarget") || has(conditions, "SuccessCriteriaMet") {
        return;
    }
    let deadline_passed = match (
        job["spec"]["activeDeadlineSeconds"].as_i64(),
        status["startTime"].as_str().and_then(parse_time),
    ) {
        (Some(limit), Some(start)) => now >= start + time::Duration::seconds(limit),
        _ => false,
    };
    if status["succeeded"].as_i64().unwrap_or(0) >= 1 {
        conditions.push(condition(
            "SuccessCriteriaMet",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        ));
    } else if status["failed"].as_i64().unwrap_or(0)
        > job["spec"]["backoffLimit"].as_i64().unwrap_or(6)
    {
        conditions.push(condition(
            "FailureTarget",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ));
    } else if deadline_passed {
        conditions.push(condition(
            "FailureTarget",
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        ));
    }
}

/// A Job whose target is met: pods still running are stopped, and once none runs the final
/// `Complete` or `Failed` condition is written.
fn finish_job(
    store: &mut Store,
    ns: &str,
    running: &[&Value],
    target: &Value,
    conditions: &mut Vec<Value>,
    status: &mut Value,
) {
    for pod in running {
        if pod["metadata"]["deletionTimestamp"].is_null() {
            let pod_name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let _ = delete(store, res("pods"), ns, &pod_name, Some("Background"), None);
        }
    }
    if !running.is_empty() {
        return;
    }
    let success = target["type"] == "SuccessCriteriaMet";
    let (kind, reason, message) = if success {
        (
            "Complete",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        )
    } else {
        (
            "Failed",
            target["reason"].as_str().unwrap_or("BackoffLimitExceeded"),
            target["message"].as_str().unwrap_or_default(),
        )
    };
    conditions.push(condition(kind, reason, message));
    if success {
        status["completionTime"] = json!(now_rfc3339());
    }
}

fn create_pod(store: &mut Store, job: &Value, ns: &str, name: &str, job_uid: &str) {
    let template = &job["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["name"] = json!(format!("{name}-{}", crate::api::random_suffix()));
    metadata["generateName"] = json!(format!("{name}-"));
    metadata["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let pod = json!({"metadata": metadata, "spec": template["spec"].clone()});
    if let Err(e) = crate::api::create_object(store, res("pods"), ns, pod, false) {
        // A template the API accepted makes a valid pod; say so if not.
        eprintln!(
            "fake-kube: job {ns}/{name}: cannot create its pod: {}",
            e.message
        );
    }
}
