#!/usr/bin/env bash
# The Kubernetes runner on a real cluster (docs/deploy.md#the-kubernetes-runner): what no fake
# Kubernetes API can prove. A manual script, for a throwaway kind or k3s cluster (or any
# cluster whose nodes pull from a registry you push to); CI has no cluster.
#
#   scripts/k8s-smoke.sh --kind [CLUSTER]   images loaded with `kind load image-archive`
#   scripts/k8s-smoke.sh --k3s              images imported with `k3s ctr images import`
#   scripts/k8s-smoke.sh --registry PREFIX  images pushed to PREFIX/agentry and
#                                           PREFIX/agentry-agent (skopeo, your credentials)
#
# What it does, against the cluster of kubectl's current context:
#  1. builds both images (scripts/build-image.sh, plain and --agent) and makes them
#     available to the nodes;
#  2. makes two namespaces, the release's and the Jobs' (SMOKE_NAMESPACE, default
#     agentry-smoke, and SMOKE_NAMESPACE-jobs), both labelled
#     pod-security.kubernetes.io/enforce=restricted, and in the release's a policy that
#     denies every ingress but the HTTP port 8080, so only the chart's pod-endpoint policy
#     lets agent pods in on 4812; then `helm install`s the chart with the Kubernetes runner
#     (runner.kubernetes.podEndpointPolicy on);
#  3. the NetworkPolicy is enforced, shown with two probe pods of the agent image in the
#     Jobs' namespace, one with the agent pods' labels and one without (the control, which
#     shows each probe can succeed, so no check passes by testing nothing): the agent-labelled
#     one reaches the agentry pod's port 4812, and reaches neither the Kubernetes API (its
#     Service address and its endpoints), nor DNS, nor the internet (SMOKE_INTERNET_ADDR,
#     default api.github.com's address resolved here, port 443), all of which the control
#     reaches; the control does not reach port 4812, which only agent pods may;
#  4. a real run end to end: stores the code-host token, connects SMOKE_REPO_URL, creates a
#     task asking the agent for one small file, waits for its Job's pod and checks that the
#     restricted namespace admitted it (no FailedCreate of the Job) with the pod security the
#     runner promises, that it was scheduled with its resources (requests equal to limits,
#     as runner.kubernetes.agentResources says, QoS Guaranteed), and that the run succeeds:
#     `agentry pod-run` did not refuse (it refuses where it can reach the Kubernetes API),
#     the model calls went through the replica's gateway, and a pull request was opened;
#  5. uninstalls and deletes both namespaces (SMOKE_KEEP=1 keeps them to look around).
#
# Needs: kubectl and helm on PATH, a cluster whose network plugin enforces NetworkPolicy
# (k3s's built-in controller, Calico, Cilium…), kind or k3s (for --kind / --k3s, k3s as
# root on its server) or skopeo (for --registry, and to make the archives), and what
# scripts/build-image.sh needs (root, buildah, debootstrap the first time, npm for the agent
# CLIs the first time). The binary: AGENTRY_BIN, else `cargo build --release --locked --bin
# agentry`. For step 4: SMOKE_REPO_URL (a throwaway repository on GitHub, or on GitHub
# Enterprise with SMOKE_CODEHOST_API_URL), SMOKE_CODEHOST_TOKEN (a token that may push
# there and open pull requests) and ANTHROPIC_API_KEY (the agent is Claude Code; a run costs
# a few cents). SMOKE_SKIP_RUN=1 skips step 4 (steps 1-3 need nothing outside the cluster).
#
# Prints each check as `ok` or `FAIL` and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/k8s-smoke.sh --kind [CLUSTER] | --k3s | --registry PREFIX" >&2; exit 2; }
mode='' kind_cluster=kind registry=''
case "${1:-}" in
    --kind) mode=kind; kind_cluster=${2:-kind}; [ $# -le 2 ] || usage ;;
    --k3s) mode=k3s; [ $# -eq 1 ] || usage ;;
    --registry) mode=registry; registry=${2:-}; if [ -z "$registry" ] || [ $# -ne 2 ]; then usage; fi ;;
    *) usage ;;
esac

start=$(date +%s)
step() { echo "== k8s-smoke: $* ($(( $(date +%s) - start ))s)"; }
die() { echo "k8s-smoke: $*" >&2; exit 1; }
failures=0 passed=0
check() {
    # check WHAT COMMAND...: runs COMMAND, records ok or FAIL.
    local what=$1
    shift
    if "$@"; then
        passed=$((passed + 1)); echo "ok    $what"
    else
        failures=$((failures + 1)); echo "FAIL  $what"
    fi
}

ns=${SMOKE_NAMESPACE:-agentry-smoke}
jobs_ns="$ns-jobs"
release=agentry
version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
timeout_secs=${SMOKE_TIMEOUT_SECS:-900}
agent_cpu=500m agent_memory=1Gi

for tool in kubectl helm python3 curl; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
case $mode in
    kind) command -v kind >/dev/null || die "kind is missing"; command -v skopeo >/dev/null || die "skopeo is missing: apt-get install skopeo" ;;
    k3s) command -v k3s >/dev/null || die "k3s is missing (run this on the k3s server, as root)"; command -v skopeo >/dev/null || die "skopeo is missing: apt-get install skopeo" ;;
    registry) command -v skopeo >/dev/null || die "skopeo is missing: apt-get install skopeo" ;;
esac
if [ "${SMOKE_SKIP_RUN:-0}" != 1 ]; then
    for v in SMOKE_REPO_URL SMOKE_CODEHOST_TOKEN ANTHROPIC_API_KEY; do
        [ -n "${!v:-}" ] || die "$v is not set (needed for the run; SMOKE_SKIP_RUN=1 skips it)"
    done
fi
kubectl version >/dev/null || die "kubectl cannot reach a cluster (kubectl's current context: $(kubectl config current-context 2>&1))"
echo "cluster: $(kubectl config current-context), release $release in $ns, Jobs in $jobs_ns"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentry-k8s-smoke.XXXXXX")
forward=
cleanup() {
    if [ -n "$forward" ]; then kill "$forward" 2>/dev/null || true; wait "$forward" 2>/dev/null || true; fi
    if [ "${SMOKE_KEEP:-0}" = 1 ]; then
        echo "k8s-smoke: kept the namespaces $ns and $jobs_ns (SMOKE_KEEP=1)"
    else
        helm uninstall "$release" -n "$ns" --wait >/dev/null 2>&1 || true
        kubectl delete namespace "$jobs_ns" "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# --- 1. images ------------------------------------------------------------------------------

step "images: build"
if [ -z "${AGENTRY_BIN:-}" ]; then
    cargo build --release --locked --bin agentry
    AGENTRY_BIN="${CARGO_TARGET_DIR:-target}/release/agentry"
fi
export AGENTRY_BIN
scripts/build-image.sh "$tmp/agentry.oci"
scripts/build-image.sh --agent "$tmp/agent.oci"

step "images: make them available to the nodes ($mode)"
case $mode in
    kind|k3s)
        image=agentry agent_image=agentry-agent pull=Never
        for pair in "agentry.oci:agentry" "agent.oci:agentry-agent"; do
            layout=${pair%%:*} name=${pair#*:}
            skopeo copy --quiet "oci:$tmp/$layout:$name" "docker-archive:$tmp/$name.tar:$name:$version"
            if [ "$mode" = kind ]; then
                kind load image-archive "$tmp/$name.tar" --name "$kind_cluster"
            else
                k3s ctr images import "$tmp/$name.tar"
            fi
        done
        ;;
    registry)
        image="$registry/agentry" agent_image="$registry/agentry-agent" pull=Always
        skopeo copy --quiet "oci:$tmp/agentry.oci:agentry" "docker://$image:$version"
        skopeo copy --quiet "oci:$tmp/agent.oci:agentry-agent" "docker://$agent_image:$version"
        ;;
esac

# --- 2. namespaces and the release ----------------------------------------------------------

step "install: namespaces (restricted) and the chart"
for n in "$ns" "$jobs_ns"; do
    kubectl create namespace "$n" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    kubectl label --overwrite namespace "$n" pod-security.kubernetes.io/enforce=restricted \
        pod-security.kubernetes.io/enforce-version=latest >/dev/null
done
# The operator's own restriction: no ingress to the release's pods but the HTTP port.
kubectl apply -n "$ns" -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: smoke-deny-ingress-but-http
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
    - ports:
        - protocol: TCP
          port: 8080
EOF
kubectl -n "$ns" create secret generic agentry-master-key \
    --from-literal=key="$(head -c 32 /dev/urandom | base64)" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$ns" create secret generic agentry-env \
    --from-literal=ANTHROPIC_API_KEY="${ANTHROPIC_API_KEY:-unset}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
codehost_line=
if [ -n "${SMOKE_CODEHOST_API_URL:-}" ]; then
    codehost_line="  AGENTRY_CODEHOST_API_URL: \"$SMOKE_CODEHOST_API_URL\""
fi
cat > "$tmp/values.yaml" <<EOF
image:
  repository: $image
  tag: "$version"
  pullPolicy: $pull
masterKey:
  existingSecret: agentry-master-key
extraEnvFrom:
  - secretRef:
      name: agentry-env
config:
  AGENTRY_LOG_FORMAT: json
  AGENTRY_MAX_CONCURRENT_RUNS: "1"
  AGENTRY_RUN_TIME_LIMIT_SECS: "600"
$codehost_line
runner:
  kind: kubernetes
  kubernetes:
    namespace: $jobs_ns
    agentImage:
      repository: $agent_image
      tag: "$version"
    agentResources:
      cpu: $agent_cpu
      memory: $agent_memory
    workSize: 2Gi
    podEndpointPolicy: true
EOF
helm upgrade --install "$release" deploy/helm/agentry -n "$ns" -f "$tmp/values.yaml" --wait --timeout 10m >/dev/null \
    || { kubectl -n "$ns" get pods -o wide; kubectl -n "$ns" logs "statefulset/$release" --tail 50 || true; die "helm install failed"; }
agentry_ip=$(kubectl -n "$ns" get pod "$release-0" -o jsonpath='{.status.podIP}')
[ -n "$agentry_ip" ] || die "the agentry pod has no IP"
echo "agentry pod $release-0 at $agentry_ip"

# --- 3. the NetworkPolicy, enforced ---------------------------------------------------------

step "network: probe pods in $jobs_ns (agent-labelled, and a control without the labels)"
probe_pod() {
    # probe_pod NAME LABELS(yaml flow map): a pod of the agent image as restricted as the
    # runner's, idle, for `kubectl exec`.
    kubectl apply -n "$jobs_ns" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: $2
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: probe
      image: $agent_image:$version
      imagePullPolicy: $pull
      command: ["/usr/bin/tini", "--", "sleep", "3600"]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {cpu: 50m, memory: 64Mi}
      volumeMounts:
        - {name: work, mountPath: /work}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - {name: work, emptyDir: {sizeLimit: 64Mi}}
    - {name: tmp, emptyDir: {sizeLimit: 64Mi}}
EOF
}
probe_pod smoke-agent "{app.kubernetes.io/name: agentry-agent, app.kubernetes.io/managed-by: agentry, app.kubernetes.io/instance: $release, agentry-smoke: probe}"
probe_pod smoke-control "{app.kubernetes.io/name: agentry-smoke-control, agentry-smoke: probe}"
kubectl -n "$jobs_ns" wait --for=condition=Ready pod/smoke-agent pod/smoke-control --timeout=180s >/dev/null \
    || { kubectl -n "$jobs_ns" describe pod smoke-agent smoke-control | tail -40; die "the probe pods did not start"; }
# reach POD HOST PORT: whether POD opens a TCP connection to HOST:PORT within 5 seconds.
reach() { kubectl -n "$jobs_ns" exec "$1" -- timeout 5 bash -c "exec 3<>/dev/tcp/$2/$3" >/dev/null 2>&1; }
unreach() { ! reach "$@"; }
resolves() { kubectl -n "$jobs_ns" exec "$1" -- timeout 5 getent hosts "$2" >/dev/null 2>&1; }
not_resolves() { ! resolves "$@"; }

api_host=$(kubectl get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')
api_port=$(kubectl get service kubernetes -n default -o jsonpath='{.spec.ports[0].port}')
mapfile -t api_endpoints < <(kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
    -o jsonpath='{range .items[*]}{range .endpoints[*]}{.addresses[0]}{"\n"}{end}{end}')
api_endpoint_port=$(kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
    -o jsonpath='{.items[0].ports[0].port}')
if [ -n "${SMOKE_INTERNET_ADDR:-}" ]; then
    internet_host=${SMOKE_INTERNET_ADDR%:*} internet_port=${SMOKE_INTERNET_ADDR##*:}
else
    internet_host=$(getent ahostsv4 api.github.com | awk 'NR == 1 { print $1 }') internet_port=443
fi
[ -n "$internet_host" ] || die "cannot resolve an internet address here; set SMOKE_INTERNET_ADDR=IP:PORT"

check "the control reaches the Kubernetes API at $api_host:$api_port" reach smoke-control "$api_host" "$api_port"
check "an agent pod does not reach the Kubernetes API at $api_host:$api_port" unreach smoke-agent "$api_host" "$api_port"
for ep in "${api_endpoints[@]}"; do
    check "the control reaches the API server's endpoint $ep:$api_endpoint_port" reach smoke-control "$ep" "$api_endpoint_port"
    check "an agent pod does not reach the API server's endpoint $ep:$api_endpoint_port" unreach smoke-agent "$ep" "$api_endpoint_port"
done
check "the control resolves kubernetes.default.svc (DNS)" resolves smoke-control kubernetes.default.svc
check "an agent pod resolves nothing (no DNS)" not_resolves smoke-agent kubernetes.default.svc
check "the control reaches the internet at $internet_host:$internet_port" reach smoke-control "$internet_host" "$internet_port"
check "an agent pod does not reach the internet at $internet_host:$internet_port" unreach smoke-agent "$internet_host" "$internet_port"
check "an agent pod reaches the agentry pod's endpoint $agentry_ip:4812" reach smoke-agent "$agentry_ip" 4812
check "a pod without the agent labels does not reach $agentry_ip:4812 (ingress restricted; only the chart's policy opens it)" \
    unreach smoke-control "$agentry_ip" 4812
kubectl -n "$jobs_ns" delete pod smoke-agent smoke-control --wait=false >/dev/null

# --- 4. a run end to end --------------------------------------------------------------------

if [ "${SMOKE_SKIP_RUN:-0}" = 1 ]; then
    step "run: skipped (SMOKE_SKIP_RUN=1)"
else
    step "run: API through kubectl port-forward"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    kubectl -n "$ns" port-forward "service/$release" "$port:8080" > "$tmp/forward.log" 2>&1 &
    forward=$!
    api="http://127.0.0.1:$port"
    deadline=$(( $(date +%s) + 60 ))
    until curl -fsS --max-time 2 "$api/readyz" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || { cat "$tmp/forward.log" >&2; die "the API did not answer through port-forward within 60 s"; }
        sleep 1
    done
    token=$(kubectl -n "$ns" exec "$release-0" -- cat /var/lib/agentry/admin-token 2>/dev/null | tr -d '\n') \
        || die "no first admin token in /var/lib/agentry/admin-token (a release installed before? SMOKE_NAMESPACE names a fresh one)"
    call() {
        # call METHOD PATH [JSON]: the API's answer body; fails on an HTTP error.
        curl -fsS --max-time 60 -X "$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
            ${3:+--data "$3"} "$api$2"
    }
    json() { python3 -c 'import json, sys; v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v if v is not None else "")' "$1"; }
    call PUT /api/secrets/CODEHOST_TOKEN "$(python3 -c 'import json, os; print(json.dumps({"value": os.environ["SMOKE_CODEHOST_TOKEN"]}))')" >/dev/null \
        || die "the code host refused SMOKE_CODEHOST_TOKEN"
    repo_id=$(call POST /api/repos "$(python3 -c 'import json, os; print(json.dumps({"repoUrl": os.environ["SMOKE_REPO_URL"]}))')" | json id) \
        || die "connecting $SMOKE_REPO_URL failed"
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    task_id=$(call POST /api/tasks "$(python3 -c 'import json, sys; print(json.dumps({"repoId": sys.argv[1],
        "title": f"Kubernetes smoke {sys.argv[2]}", "agentType": "claude-code",
        "prompt": f"Create the file smoke/{sys.argv[2]}.md containing the single line: agentry kubernetes smoke. Change nothing else."}))' \
        "$repo_id" "$stamp")" | json id)
    echo "task $task_id on $SMOKE_REPO_URL"

    step "run: the Job's pod"
    deadline=$(( $(date +%s) + timeout_secs ))
    selector="app.kubernetes.io/name=agentry-agent,app.kubernetes.io/instance=$release,!agentry-smoke"
    pod=
    until [ -n "$pod" ]; do
        pod=$(kubectl -n "$jobs_ns" get pods -l "$selector" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
        state=$(call GET "/api/tasks/$task_id" | json task.state)
        case $state in failed|cancelled) call GET "/api/tasks/$task_id" | python3 -m json.tool >&2; die "the task is $state before its pod was seen";; esac
        [ "$(date +%s)" -lt "$deadline" ] || { kubectl -n "$jobs_ns" get jobs,pods,events >&2; die "no agent pod in $jobs_ns within $timeout_secs s"; }
        [ -n "$pod" ] || sleep 2
    done
    echo "agent pod $pod"
    kubectl -n "$jobs_ns" get pod "$pod" -o json > "$tmp/pod.json"
    kubectl -n "$jobs_ns" get events -o json > "$tmp/events.json"
    check "admission: the restricted namespace admitted the agent pod (no FailedCreate for PodSecurity)" \
        python3 - "$tmp/events.json" <<'EOF'
import json, sys
bad = [e.get("message", "") for e in json.load(open(sys.argv[1]))["items"]
       if e.get("reason") == "FailedCreate" or "PodSecurity" in e.get("message", "")]
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
    check "admission: the pod is non-root, read-only root, no capabilities, RuntimeDefault, no service-account token" \
        python3 - "$tmp/pod.json" <<'EOF'
import json, sys
pod = json.load(open(sys.argv[1]))["spec"]
psc = pod.get("securityContext") or {}
bad = []
if pod.get("automountServiceAccountToken") is not False:
    bad.append("the service-account token is mounted")
if pod.get("enableServiceLinks") is not False:
    bad.append("service links on")
for c in pod["containers"] + pod.get("initContainers", []):
    sc = c.get("securityContext") or {}
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True: bad.append(f"{c['name']}: runAsNonRoot")
    if sc.get("readOnlyRootFilesystem") is not True: bad.append(f"{c['name']}: writable root")
    if sc.get("allowPrivilegeEscalation") is not False: bad.append(f"{c['name']}: privilege escalation")
    if "ALL" not in (sc.get("capabilities") or {}).get("drop", []): bad.append(f"{c['name']}: capabilities")
    if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault": bad.append(f"{c['name']}: seccomp")
for v in pod.get("volumes", []):
    if "emptyDir" in v and not v["emptyDir"].get("sizeLimit"): bad.append(f"volume {v['name']}: no sizeLimit")
print("; ".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
    until kubectl -n "$jobs_ns" get pod "$pod" -o jsonpath='{.spec.nodeName}' 2>/dev/null | grep -q .; do
        [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 2
    done
    kubectl -n "$jobs_ns" get pod "$pod" -o json > "$tmp/pod.json" 2>/dev/null || true
    check "scheduling: the pod was scheduled with requests = limits = $agent_cpu CPU, $agent_memory (QoS Guaranteed)" \
        python3 - "$tmp/pod.json" "$agent_cpu" "$agent_memory" <<'EOF'
import json, sys
pod = json.load(open(sys.argv[1]))
c = pod["spec"]["containers"][0]
want = {"cpu": sys.argv[2], "memory": sys.argv[3]}
res = c.get("resources") or {}
scheduled = any(x["type"] == "PodScheduled" and x["status"] == "True" for x in pod["status"].get("conditions", []))
ok = (res.get("requests") == want and res.get("limits") == want and scheduled
      and pod["spec"].get("nodeName") and pod["status"].get("qosClass") == "Guaranteed")
print(f"resources {res}, node {pod['spec'].get('nodeName')}, scheduled {scheduled}, qos {pod['status'].get('qosClass')}",
      file=sys.stderr)
sys.exit(0 if ok else 1)
EOF

    step "run: waiting for the task to finish"
    until state=$(call GET "/api/tasks/$task_id" | json task.state) && [[ $state =~ ^(pr_opened|completed|failed|cancelled)$ ]]; do
        [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 5
    done
    call GET "/api/tasks/$task_id" > "$tmp/task.json"
    kubectl -n "$jobs_ns" logs "$pod" > "$tmp/pod.log" 2>&1 || true
    check "the run: pod-run did not refuse, the agent ran and a pull request was opened (state $state)" \
        python3 - "$tmp/task.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
run = t["runs"][-1] if t["runs"] else {}
print(f"state {t['task']['state']}, pull request {t['task'].get('prUrl')}, run outcome {run.get('outcome')}, "
      f"model calls {run.get('modelCalls')}, metered {run.get('meteredCostUsd')}, error {run.get('errorMessage') or t['task'].get('errorMessage')}",
      file=sys.stderr)
ok = t["task"]["state"] in ("pr_opened", "completed") and run.get("outcome") == "succeeded" and (run.get("modelCalls") or 0) > 0
sys.exit(0 if ok else 1)
EOF
    if [ "$failures" -gt 0 ]; then
        echo "--- the agent pod's log (last 40 lines)"; tail -n 40 "$tmp/pod.log" || true
    fi
fi

step "done"
echo "k8s-smoke: $passed passed, $failures failed"
[ "$failures" = 0 ]
