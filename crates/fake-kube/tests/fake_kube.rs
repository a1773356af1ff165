//! fake-kube end to end: real kubectl, kube-rs, and raw HTTP against the fake, with pods run
//! under bubblewrap and slirp4netns.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use agentry_fake_kube::{FakeKube, Fault, Options, Rbac};
use agentry_testkit::wait::eventually;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const NS: &str = "agents";

fn fake_with(options: Options) -> FakeKube {
    FakeKube::start(options.image("host", "/").namespace(NS)).expect("fake-kube starts")
}

fn fake() -> FakeKube {
    fake_with(Options::default())
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn call(fake: &FakeKube, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}{path}", fake.base_url());
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = client()
        .request(method.clone(), url)
        .bearer_auth(fake.token());
    if let Some(body) = body {
        let kind = if method == reqwest::Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        request = request.header("content-type", kind).body(body.to_string());
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    let text = response.text().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn pod_json(name: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "test"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "host", "command": ["sh", "-c", script]}],
        },
    })
}

fn pods_path() -> String {
    format!("/api/v1/namespaces/{NS}/pods")
}

fn phase(fake: &FakeKube, name: &str) -> Option<String> {
    fake.object("pods", NS, name)
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
}

fn log_of(fake: &FakeKube, name: &str) -> String {
    let (code, body) = call(fake, "GET", &format!("{}/{name}/log", pods_path()), None);
    assert_eq!(code, 200, "{body}");
    body.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| body.to_string())
}

fn wait_phase(fake: &FakeKube, name: &str, want: &str) {
    eventually(WAIT, format!("pod {name} {want}"), || {
        let seen = phase(fake, name);
        if seen.as_deref() == Some(want) {
            Ok(())
        } else {
            Err(format!(
                "{seen:?}: {}",
                fake.object("pods", NS, name)
                    .map(|p| p["status"].to_string())
                    .unwrap_or_default()
            ))
        }
    });
}

fn bwrap_and_slirp() -> bool {
    let found = |p: &str| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if found("bwrap") && found("slirp4netns") {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must have bwrap and slirp4netns"
    );
    eprintln!("SKIPPED: bwrap or slirp4netns is missing");
    false
}

// ---- kubectl ----

fn kubectl() -> Option<&'static str> {
    const KUBECTL: &str = "/usr/bin/kubectl";
    if Path::new(KUBECTL).exists() {
        return Some(KUBECTL);
    }
    assert!(
        std::env::var("AGENTRY_TEST_REQUIRE_KUBECTL").as_deref() != Ok("1"),
        "AGENTRY_TEST_REQUIRE_KUBECTL=1 but {KUBECTL} is missing"
    );
    eprintln!("SKIPPED: {KUBECTL} is missing: the kubectl test did not run");
    None
}

fn run_kubectl(fake: &FakeKube, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new("/usr/bin/kubectl")
        .args(args)
        .env("KUBECONFIG", fake.kubeconfig())
        .output()
        .expect("kubectl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn kubectl_gets_creates_waits_logs_and_deletes_a_job() {
    if kubectl().is_none() || !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let (ok, out) = run_kubectl(&fake, &["get", "pods"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("No resources found in agents namespace"),
        "{out}"
    );
    let dir = tempfile::tempdir().expect("dir");
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: hello\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: host\n        command: [sh, -c, 'echo hello; exit 0']\n").expect("write");
    let (ok, out) = run_kubectl(&fake, &["create", "-f", job.to_str().expect("utf-8")]);
    assert!(ok, "{out}");
    assert!(out.contains("job.batch/hello created"), "{out}");
    let (ok, out) = run_kubectl(
        &fake,
        &[
            "wait",
            "--for=condition=complete",
            "job/hello",
            "--timeout=60s",
        ],
    );
    assert!(
        ok,
        "{out}\njob: {:?}\npods: {:?}\nrequests: {:?}",
        fake.object("jobs", NS, "hello"),
        fake.objects("pods", NS),
        fake.requests()
    );
    assert!(out.contains("condition met"), "{out}");
    let (ok, out) = run_kubectl(&fake, &["logs", "job/hello"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "hello");
    let (ok, out) = run_kubectl(&fake, &["get", "pods", "-l", "job-name=hello"]);
    assert!(ok && out.contains("hello-"), "{out}");
    let (ok, out) = run_kubectl(&fake, &["delete", "job", "hello", "--cascade=foreground"]);
    assert!(ok, "{out}");
    eventually(WAIT, "the job and its pod gone", || {
        fake.objects("jobs", NS).is_empty() && fake.objects("pods", NS).is_empty()
    });
    let (ok, out) = run_kubectl(&fake, &["get", "jobs,pods"]);
    assert!(ok && out.contains("No resources found"), "{out}");
    // The foreground deletion was seen as such: the Job carried the finalizer first.
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.method == "DELETE" && r.uri.contains("/jobs/hello"))
    );
}

/// Asserts an API answer's status code and its Status `reason`.
fn assert_status_reason(code: u16, body: &Value, status: u16, reason: &str) {
    assert_eq!(
        (code, body["reason"].as_str()),
        (status, Some(reason)),
        "{body}"
    );
}

/// How many of the test namespace's Secrets a list with this query finds (the list must
/// answer 200).
fn count_secrets(fake: &FakeKube, query: &str) -> usize {
    let (code, body) = call(
        fake,
        "GET",
        &format!("/api/v1/namespaces/{NS}/secrets?{query}"),
        None,
    );
    assert_eq!(code, 200, "{body}");
    body["items"].as_array().map_or(0, Vec::len)
}

/// An object's `metadata.resourceVersion`, as the number it is.
fn resource_version(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("number")
}

// ---- the API ----

#[test]
fn the_api_validates_names_namespaces_dry_runs_and_selectors() {
    let fake = fake();
    let secret = |name: &str| json!({"metadata": {"name": name, "labels": {"tier": name}}, "stringData": {"k": "v"}});
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    // Creates `body` at `path`: the status and the answer.
    let post = |path: &str, body: Value| call(&fake, "POST", path, Some(body));
    let (code, body) = post("/api/v1/namespaces/nowhere/secrets", secret("a"));
    assert_status_reason(code, &body, 404, "NotFound");
    assert_eq!(body["message"], "namespaces \"nowhere\" not found");
    let (code, body) = post(&secrets, secret("Bad_Name"));
    assert_status_reason(code, &body, 422, "Invalid");
    let (code, body) = post(
        &format!("/api/v1/namespaces/{NS}/secrets?dryRun=All"),
        secret("dry"),
    );
    assert_eq!(code, 201, "{body}");
    assert!(fake.object("secrets", NS, "dry").is_none());
    let (code, body) = post(&secrets, secret("a"));
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["data"]["k"], "dg==");
    let rv_a: u64 = resource_version(&body);
    let (code, body) = post(&secrets, secret("a"));
    assert_status_reason(code, &body, 409, "AlreadyExists");
    let (code, body) = post(&secrets, json!({"metadata": {"generateName": "gen-"}}));
    assert_eq!(code, 201, "{body}");
    let generated = body["metadata"]["name"].as_str().expect("name");
    assert!(
        generated.starts_with("gen-") && generated.len() == 9,
        "{generated}"
    );
    let rv_gen: u64 = resource_version(&body);
    assert!(rv_gen > rv_a);
    assert_eq!(count_secrets(&fake, "labelSelector=tier%20in%20(a,b)"), 1);
    assert_eq!(count_secrets(&fake, "labelSelector=!tier"), 1);
    assert_eq!(count_secrets(&fake, "fieldSelector=metadata.name%3Da"), 1);
    let (code, body) = call(
        &fake,
        "GET",
        &format!("/api/v1/namespaces/{NS}/secrets?labelSelector=a%20in%20b"),
        None,
    );
    assert_status_reason(code, &body, 400, "BadRequest");
    let (code, body) = call(
        &fake,
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/secrets/a"),
        Some(json!({"metadata": {"labels": {"extra": "yes"}}})),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["metadata"]["labels"],
        json!({"tier": "a", "extra": "yes"})
    );
    let (code, body) = post(
        &format!("/apis/batch/v1/namespaces/{NS}/jobs"),
        json!({"metadata": {"name": "wide"}, "spec": {"parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "host", "command": ["true"]}]}}}}),
    );
    assert_status_reason(code, &body, 422, "Invalid");
    let (code, body) = call(&fake, "GET", "/api/v1/namespaces/agents/pods/none", None);
    assert_eq!(
        (code, body["message"].as_str()),
        (404, Some("pods \"none\" not found")),
        "{body}"
    );
    let (code, _) = client()
        .get(format!("{}/api/v1/namespaces", fake.base_url()))
        .bearer_auth("wrong")
        .send()
        .map(|r| (r.status().as_u16(), ()))
        .expect("send");
    assert_eq!(code, 401);
}

/// `fail_next`: the next requests of a method on a resource fail as asked, rule after rule,
/// each recorded as faulted; a lost answer's request takes effect, a failed one does not;
/// other requests are answered as ever.
#[test]
fn injected_faults_fail_the_next_matching_requests() {
    let fake = fake();
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    let key = format!("{secrets}/key");
    let secret = json!({"metadata": {"name": "key"}, "stringData": {"k": "v"}});
    fake.fail_next(Some(("POST", "secrets")), 1, Fault::AnswerLost(504));
    fake.fail_next(Some(("delete", "secrets")), 2, Fault::Status(503));
    let (code, body) = call(&fake, "POST", &secrets, Some(secret.clone()));
    assert_status_reason(code, &body, 504, "Timeout");
    assert!(fake.object("secrets", NS, "key").is_some());
    let (code, body) = call(&fake, "POST", &secrets, Some(secret));
    assert_status_reason(code, &body, 409, "AlreadyExists");
    for _ in 0..2 {
        let (code, body) = call(&fake, "DELETE", &key, None);
        assert_status_reason(code, &body, 503, "ServiceUnavailable");
        assert!(fake.object("secrets", NS, "key").is_some());
    }
    let (code, body) = call(&fake, "GET", &key, None);
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(&fake, "DELETE", &key, None);
    assert_eq!(code, 200, "{body}");
    assert!(fake.object("secrets", NS, "key").is_none());
    let seen: Vec<(String, u16, bool)> = fake
        .requests()
        .into_iter()
        .map(|r| (r.method, r.status, r.faulted))
        .collect();
    let want = [
        ("POST", 504, true),
        ("POST", 409, false),
        ("DELETE", 503, true),
        ("DELETE", 503, true),
        ("GET", 200, false),
        ("DELETE", 200, false),
    ]
    .map(|(m, s, f)| (m.to_owned(), s, f));
    assert_eq!(seen, want);
}

#[test]
fn a_watch_streams_events_and_an_expired_version_gets_410() {
    let fake = fake_with(Options {
        watch_window: 5,
        ..Options::default()
    });
    let start = fake.resource_version();
    let path = format!(
        "{}/api/v1/namespaces/{NS}/secrets?watch=1&resourceVersion={start}&timeoutSeconds=30",
        fake.base_url()
    );
    let mut watch = client()
        .get(&path)
        .bearer_auth(fake.token())
        .send()
        .expect("watch");
    assert_eq!(watch.status().as_u16(), 200);
    let (code, _) = call(
        &fake,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(json!({"metadata": {"name": "first"}})),
    );
    assert_eq!(code, 201);
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        watch.read_exact(&mut byte).expect("an event");
        line.push(byte[0]);
    }
    let event: Value = serde_json::from_slice(&line).expect("json line");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "first");
    for i in 0..10 {
        let (code, _) = call(
            &fake,
            "POST",
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Some(json!({"metadata": {"name": format!("s{i}")}})),
        );
        assert_eq!(code, 201);
    }
    let old = format!(
        "{}/api/v1/namespaces/{NS}/secrets?watch=true&resourceVersion={start}",
        fake.base_url()
    );
    let text = client()
        .get(&old)
        .bearer_auth(fake.token())
        .send()
        .expect("watch")
        .text()
        .expect("body");
    let event: Value = serde_json::from_str(text.trim()).expect("one event");
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
}

// ---- the kubelet ----

#[test]
fn a_pod_gets_secrets_the_downward_api_its_user_and_a_network_to_the_host() {
    if !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("a connection from the pod");
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf);
        let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nfrom-host");
    });
    let (code, _) = call(
        &fake,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(json!({"metadata": {"name": "key"}, "stringData": {"k": "s3cret"}})),
    );
    assert_eq!(code, 201);
    let script = format!(
        "echo uid=$(id -u); echo secret=$SECRET; echo me=$ME/$MY_NS/$APP/$NODE/$IP; echo host=$(hostname); \
         test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token=yes; \
         (touch /made 2>/dev/null && echo root=rw || echo root=ro); \
         (touch /tmp/made 2>/dev/null && echo tmp=rw || echo tmp=ro); \
         (touch /work/made && echo work=rw); cd /work && echo cwd=$(pwd); \
         echo file=$(cat /etc/agent-key/k) $(stat -c %a /etc/agent-key/k); test -s /etc/passwd && echo etc=kept; \
         (touch /etc/agent-key/x 2>/dev/null && echo key=rw || echo key=ro); \
         echo net=$(curl -s --max-time 20 http://10.0.2.2:{port}/); \
         echo api=$(curl -s --max-time 20 -o /dev/null -w '%{{http_code}}' http://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version)"
    );
    let mut pod = pod_json("env", &script);
    pod["spec"]["securityContext"] =
        json!({"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": true});
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "key", "key": "k"}}},
        {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]);
    pod["spec"]["volumes"] = json!([
        {"name": "work", "emptyDir": {}},
        {"name": "key", "secret": {"secretName": "key", "defaultMode": 0o440}},
    ]);
    pod["spec"]["securityContext"]["fsGroup"] = json!(10001);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "work", "mountPath": "/work"},
        {"name": "key", "mountPath": "/etc/agent-key", "readOnly": true},
    ]);
    let (code, body) = call(&fake, "POST", &pods_path(), Some(pod));
    assert_eq!(code, 201, "{body}");
    wait_phase(&fake, "env", "Succeeded");
    let log = log_of(&fake, "env");
    for want in [
        "uid=10001",
        "secret=s3cret",
        "me=env/agents/test/fake-node/10.0.2.100",
        "host=env",
        "token=yes",
        "net=from-host",
        "api=200",
    ] {
        assert!(log.lines().any(|l| l == want), "{want:?} not in:\n{log}");
    }
    server.join().expect("the listener thread");
    // The log's parameters: timestamps, tailLines, sinceTime, container.
    let path = |query: &str| format!("{}/env/log?{query}", pods_path());
    let (code, body) = call(&fake, "GET", &path("timestamps=true&tailLines=2"), None);
    assert_eq!(code, 200);
    let text = body.as_str().expect("text").to_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[1].ends_with(" api=200"), "{text}");
    let stamp = lines[0].split(' ').next().expect("a timestamp");
    assert!(
        time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).is_ok(),
        "{stamp}"
    );
    let (code, body) = call(&fake, "GET", &path("sinceTime=2999-01-01T00:00:00Z"), None);
    assert_eq!((code, body.as_str()), (200, Some("")));
    let (code, body) = call(&fake, "GET", &path("container=other"), None);
    assert_status_reason(code, &body, 400, "BadRequest");
    let status = fake.object("pods", NS, "env").expect("pod")["status"].clone();
    assert_eq!(
        status["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed",
        "{status}"
    );
    assert_eq!(status["podIP"], "10.0.2.100");

    // Without the token, and refusals the kubelet reports as a real one does.
    let mut pod = pod_json(
        "notoken",
        "test -e /var/run/secrets/kubernetes.io/serviceaccount/token && echo token=yes || echo token=no",
    );
    pod["spec"]["automountServiceAccountToken"] = json!(false);
    assert_eq!(call(&fake, "POST", &pods_path(), Some(pod)).0, 201);
    wait_phase(&fake, "notoken", "Succeeded");
    assert_eq!(log_of(&fake, "notoken").trim(), "token=no");
    let mut pod = pod_json("rootless", "true");
    pod["spec"]["securityContext"] = json!({"runAsNonRoot": true});
    let mut missing = pod_json("nosecret", "true");
    missing["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]);
    let mut nocommand = pod_json("nocommand", "true");
    nocommand["spec"]["containers"][0]
        .as_object_mut()
        .expect("object")
        .remove("command");
    for (name, pod, message) in [
        ("rootless", pod, "runAsNonRoot and image will run as root"),
        ("nosecret", missing, "secret \"absent\" not found"),
        (
            "nocommand",
            nocommand,
            "fake-kube needs an explicit command",
        ),
    ] {
        assert_eq!(call(&fake, "POST", &pods_path(), Some(pod)).0, 201);
        eventually(WAIT, format!("{name} refused"), || {
            let waiting = fake.object("pods", NS, name).expect("pod")["status"]["containerStatuses"][0]["state"]["waiting"].clone();
            waiting["reason"] == "CreateContainerConfigError"
                && waiting["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(message))
        });
        assert_eq!(phase(&fake, name).as_deref(), Some("Pending"));
    }
}

#[test]
fn deleting_a_pod_sends_sigterm_to_pid_1_then_sigkill_after_the_grace_period() {
    if !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let trap = "trap 'echo term; exit 3' TERM; echo up; while :; do sleep 0.1; done";
    let ignore = "echo up; while :; do sleep 0.1; done";
    for (name, script) in [("trap", trap), ("ignore", ignore)] {
        assert_eq!(
            call(&fake, "POST", &pods_path(), Some(pod_json(name, script))).0,
            201
        );
    }
    for name in ["trap", "ignore"] {
        wait_phase(&fake, name, "Running");
        eventually(WAIT, format!("{name} up"), || {
            log_of(&fake, name).contains("up")
        });
    }
    let trap_uid = fake.object("pods", NS, "trap").expect("pod")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let (code, body) = call(&fake, "DELETE", &format!("{}/trap", pods_path()), None);
    assert_eq!(code, 200);
    assert!(body["metadata"]["deletionTimestamp"].is_string(), "{body}");
    eventually(WAIT, "the trapping pod gone", || {
        fake.object("pods", NS, "trap").is_none()
    });
    let log = std::fs::read_to_string(
        fake.state_dir()
            .join("pods")
            .join(&trap_uid)
            .join("main.log"),
    )
    .expect("log");
    assert!(log.lines().any(|l| l.ends_with(" term")), "{log}");

    let started = Instant::now();
    let (code, _) = call(
        &fake,
        "DELETE",
        &format!("{}/ignore", pods_path()),
        Some(json!({"gracePeriodSeconds": 2})),
    );
    assert_eq!(code, 200);
    eventually(WAIT, "the ignoring pod gone", || {
        fake.object("pods", NS, "ignore").is_none()
    });
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "SIGKILL came before the grace period: {took:?}"
    );
}

fn job_json(name: &str, script: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "host", "command": ["sh", "-c", script]}],
            }},
        },
    })
}

fn jobs_path() -> String {
    format!("/apis/batch/v1/namespaces/{NS}/jobs")
}

/// Waits for a Job's `Complete` condition; says what the Job and its pods look like if not.
fn wait_complete(fake: &FakeKube, name: &str) {
    eventually(WAIT, format!("job {name} complete"), || {
        let job = fake.object("jobs", NS, name);
        if job
            .as_ref()
            .and_then(|j| condition(j, "Complete"))
            .is_some()
        {
            return Ok(());
        }
        let pods: Vec<String> = fake
            .objects("pods", NS)
            .iter()
            .map(|p| p["status"].to_string())
            .collect();
        Err(format!("{job:?}; pods: {pods:?}"))
    });
}

fn condition(job: &Value, kind: &str) -> Option<Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[test]
fn a_job_past_its_deadline_fails_and_a_finished_one_goes_after_its_ttl() {
    if !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let mut job = job_json("slow", "while :; do sleep 0.1; done");
    job["spec"]["activeDeadlineSeconds"] = json!(2);
    assert_eq!(call(&fake, "POST", &jobs_path(), Some(job)).0, 201);
    let failed = eventually(WAIT, "the slow job failed", || {
        fake.object("jobs", NS, "slow")
            .and_then(|j| condition(&j, "Failed").map(|c| (j, c)))
    });
    assert_eq!(failed.1["reason"], "DeadlineExceeded", "{}", failed.0);
    let target = condition(&failed.0, "FailureTarget").expect("FailureTarget first");
    assert_eq!(target["reason"], "DeadlineExceeded");
    assert!(
        fake.objects("pods", NS)
            .iter()
            .all(|p| p["status"]["phase"] == "Failed")
    );

    let mut job = job_json("brief", "echo done");
    job["spec"]["ttlSecondsAfterFinished"] = json!(1);
    assert_eq!(call(&fake, "POST", &jobs_path(), Some(job)).0, 201);
    wait_complete(&fake, "brief");
    eventually(WAIT, "the brief job and its pod gone", || {
        fake.object("jobs", NS, "brief").is_none()
            && !fake
                .objects("pods", NS)
                .iter()
                .any(|p| p["metadata"]["labels"]["job-name"] == "brief")
    });

    let (code, _) = call(&fake, "POST", &jobs_path(), Some(job_json("bad", "exit 7")));
    assert_eq!(code, 201);
    let failed = eventually(WAIT, "the bad job failed", || {
        fake.object("jobs", NS, "bad")
            .and_then(|j| condition(&j, "Failed"))
    });
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    let pod = fake
        .objects("pods", NS)
        .into_iter()
        .find(|p| p["metadata"]["labels"]["job-name"] == "bad")
        .expect("pod");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        7
    );
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Error"
    );
    let labels = &pod["metadata"]["labels"];
    for key in [
        "batch.kubernetes.io/job-name",
        "job-name",
        "controller-uid",
        "batch.kubernetes.io/controller-uid",
    ] {
        assert!(labels[key].is_string(), "{key} missing: {labels}");
    }
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
        true
    );
}

#[test]
fn an_image_without_a_root_file_system_cannot_be_pulled() {
    let fake = fake();
    let mut pod = pod_json("nopull", "true");
    pod["spec"]["containers"][0]["image"] = json!("registry.example/agent:1");
    assert_eq!(call(&fake, "POST", &pods_path(), Some(pod)).0, 201);
    let waiting = |fake: &FakeKube| {
        fake.object("pods", NS, "nopull").expect("pod")["status"]["containerStatuses"][0]["state"]["waiting"].clone()
    };
    eventually(WAIT, "ErrImagePull", || {
        waiting(&fake)["reason"] == "ErrImagePull" || waiting(&fake)["reason"] == "ImagePullBackOff"
    });
    eventually(WAIT, "ImagePullBackOff", || {
        waiting(&fake)["reason"] == "ImagePullBackOff"
    });
    assert!(
        waiting(&fake)["message"]
            .as_str()
            .is_some_and(|m| m.contains("registry.example/agent:1"))
    );
    assert_eq!(phase(&fake, "nopull").as_deref(), Some("Pending"));
    assert_eq!(
        call(&fake, "DELETE", &format!("{}/nopull", pods_path()), None).0,
        200
    );
    eventually(WAIT, "the pod gone", || {
        fake.object("pods", NS, "nopull").is_none()
    });
}

#[test]
fn a_container_past_its_memory_limit_is_oom_killed() {
    if !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let mut pod = pod_json(
        "hog",
        "echo start; x=$(head -c 400000000 /dev/zero | tr '\\0' x); echo survived",
    );
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "48Mi"}});
    assert_eq!(call(&fake, "POST", &pods_path(), Some(pod)).0, 201);
    eventually(WAIT, "the hog ended", || {
        matches!(phase(&fake, "hog").as_deref(), Some("Failed" | "Succeeded"))
    });
    let log = log_of(&fake, "hog");
    if log.contains("no memory limit for this container") {
        eprintln!("SKIPPED: no cgroup can be made here, the OOM test did not run: {log}");
        return;
    }
    let terminated = fake.object("pods", NS, "hog").expect("pod")["status"]["containerStatuses"][0]
        ["state"]["terminated"]
        .clone();
    assert_eq!(terminated["reason"], "OOMKilled", "{terminated}\n{log}");
    assert_eq!(terminated["exitCode"], 137, "{terminated}");
}

// ---- RBAC ----

const ROLE: &str = "---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agentry, namespace: agents}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: agentry-runner, namespace: agents}
rules:
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, delete]
- apiGroups: ['']
  resources: [pods, pods/log]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agentry-runner, namespace: agents}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agentry-runner}
subjects:
- {kind: ServiceAccount, name: agentry, namespace: agents}
";

#[test]
fn the_role_decides_what_the_kubeconfig_user_may_do() {
    let role = Rbac::from_yaml(ROLE).expect("the role parses");
    let fake = fake_with(Options {
        role: Some(role),
        ..Options::default()
    });
    let (code, body) = call(
        &fake,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(json!({"metadata": {"name": "key"}})),
    );
    assert_status_reason(code, &body, 403, "Forbidden");
    assert_eq!(
        body["message"],
        "secrets is forbidden: User \"system:serviceaccount:agents:agentry\" cannot create resource \"secrets\" in API group \"\" in the namespace \"agents\""
    );
    assert!(fake.object("secrets", NS, "key").is_none());
    let (code, body) = call(
        &fake,
        "POST",
        "/apis/batch/v1/namespaces/default/jobs",
        Some(job_json("elsewhere", "true")),
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = call(
        &fake,
        "GET",
        &format!("{}?labelSelector=app", pods_path()),
        None,
    );
    assert_eq!(code, 200, "{body}");
    let (code, _) = call(&fake, "GET", "/api/v1/namespaces", None);
    assert_eq!(code, 403);
    let (code, _) = call(&fake, "GET", "/apis/batch/v1", None);
    assert_eq!(code, 200, "discovery is always allowed");
    let review = |resource: &str, verb: &str, group: &str| {
        let (code, body) = call(
            &fake,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            Some(json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": NS, "verb": verb, "group": group, "resource": resource}},
            })),
        );
        assert_eq!(code, 201, "{body}");
        body["status"]["allowed"].as_bool().expect("allowed")
    };
    assert!(review("jobs", "create", "batch"));
    assert!(!review("secrets", "create", ""));
    assert!(!review("jobs", "patch", "batch"));
    if bwrap_and_slirp() {
        let (code, body) = call(
            &fake,
            "POST",
            &jobs_path(),
            Some(job_json("allowed", "echo ok")),
        );
        assert_eq!(code, 201, "{body}");
        wait_complete(&fake, "allowed");
    }
}

#[test]
fn dropping_the_fake_kills_its_containers() {
    if !bwrap_and_slirp() {
        return;
    }
    let fake = fake();
    let marker = format!("FAKE_KUBE_DROP_{}", std::process::id());
    let mut pod = pod_json("forever", "echo up; while :; do sleep 0.1; done");
    pod["spec"]["containers"][0]["env"] = json!([{"name": marker, "value": "1"}]);
    assert_eq!(call(&fake, "POST", &pods_path(), Some(pod)).0, 201);
    wait_phase(&fake, "forever", "Running");
    eventually(WAIT, "the pod up", || {
        log_of(&fake, "forever").contains("up")
    });
    assert!(!agentry_testkit::process::processes_with_env(&format!("{marker}=1")).is_empty());
    drop(fake);
    eventually(WAIT, "no process of the pod left", || {
        agentry_testkit::process::processes_with_env(&format!("{marker}=1")).is_empty()
    });
}

// ---- kube-rs ----

mod kube_rs {
    use super::*;
    use futures_util::{AsyncBufReadExt as _, StreamExt as _, TryStreamExt as _};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::{Api, DeleteParams, LogParams, PostParams};
    use kube::runtime::wait::{await_condition, conditions};
    use kube::runtime::{WatchStreamExt as _, watcher};

    async fn client(fake: &FakeKube) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(fake.kubeconfig()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("config");
        assert_eq!(config.default_namespace, NS);
        kube::Client::try_from(config).expect("client")
    }

    fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).expect("typed")
    }

    fn is_failed() -> impl kube::runtime::wait::Condition<Job> {
        |job: Option<&Job>| {
            job.and_then(|j| j.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"))
        }
    }

    #[test]
    fn kube_rs_runs_a_job_owning_its_secret_and_collects_both() {
        if !bwrap_and_slirp() {
            return;
        }
        let fake = fake();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let client = client(&fake).await;
            let jobs: Api<Job> = Api::default_namespaced(client.clone());
            let secrets: Api<Secret> = Api::default_namespaced(client.clone());
            let pods: Api<Pod> = Api::default_namespaced(client.clone());

            // The pod watch starts before the job: it must see the job's pod appear.
            let watched_pods = pods.clone();
            let watched = tokio::spawn(async move {
                let mut stream = watcher(watched_pods, watcher::Config::default().labels("job-name=run-1"))
                    .applied_objects()
                    .boxed();
                while let Some(pod) = stream.try_next().await.expect("watch") {
                    // Running, or already done if the watch listed late on a busy machine.
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    if phase == "Running" || phase == "Succeeded" {
                        return pod;
                    }
                }
                panic!("the watch ended");
            });

            let mut job = job_json("run-1", "echo key=$KEY; for i in 1 2 3; do echo line$i; sleep 0.3; done");
            job["spec"]["template"]["spec"]["containers"][0]["env"] =
                json!([{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "run-1-key", "key": "key"}}}]);
            let job = jobs.create(&PostParams::default(), &typed(job)).await.expect("job created");
            let uid = job.metadata.uid.clone().expect("uid");
            let secret = json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "run-1-key", "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": "run-1", "uid": uid,
                }]},
                "stringData": {"key": "k-123"},
            });
            secrets.create(&PostParams::default(), &typed(secret)).await.expect("secret created");

            let pod = tokio::time::timeout(WAIT, watched).await.expect("in time").expect("a running pod");
            let pod_name = pod.metadata.name.clone().expect("name");
            assert!(pod_name.starts_with("run-1-"), "{pod_name}");

            let params = LogParams { follow: true, ..LogParams::default() };
            let lines: Vec<String> = tokio::time::timeout(WAIT, async {
                pods.log_stream(&pod_name, &params).await.expect("log stream").lines().try_collect().await
            })
            .await
            .expect("the log ends with the container")
            .expect("lines");
            assert_eq!(lines, ["key=k-123", "line1", "line2", "line3"]);

            let done = tokio::time::timeout(WAIT, await_condition(jobs.clone(), "run-1", conditions::is_job_completed()))
                .await
                .expect("in time")
                .expect("condition");
            assert_eq!(done.and_then(|j| j.status).and_then(|s| s.succeeded), Some(1));

            jobs.delete("run-1", &DeleteParams::background()).await.expect("deleted");
            let fake = &fake;
            tokio::task::block_in_place(|| {
                eventually(WAIT, "the secret and the pod collected", || {
                    fake.object("jobs", NS, "run-1").is_none()
                        && fake.object("secrets", NS, "run-1-key").is_none()
                        && fake.objects("pods", NS).is_empty()
                })
            });

            // A failing job: FailureTarget, then Failed once its pod has ended.
            jobs.create(&PostParams::default(), &typed(job_json("run-2", "exit 2"))).await.expect("job created");
            let failed = tokio::time::timeout(WAIT, await_condition(jobs.clone(), "run-2", is_failed()))
                .await
                .expect("in time")
                .expect("condition")
                .expect("a job");
            let conditions = failed.status.and_then(|s| s.conditions).unwrap_or_default();
            let kinds: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
            assert_eq!(kinds, ["FailureTarget", "Failed"]);
            assert_eq!(conditions[1].reason.as_deref(), Some("BackoffLimitExceeded"));

            // The default DeleteParams orphan the pod, as the real API does for a Job.
            jobs.delete("run-2", &DeleteParams::default()).await.expect("deleted");
            let left = pods.list(&Default::default()).await.expect("list");
            assert_eq!(left.items.len(), 1, "the orphaned pod stays");
            assert!(left.items[0].metadata.owner_references.as_ref().is_none_or(Vec::is_empty));
        });
        drop(runtime);
    }
}
