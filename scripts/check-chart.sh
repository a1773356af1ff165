#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/agentry (docs/deploy.md#kubernetes-helm) offline, with
# Helm's own library and no cluster:
#   - Chart.yaml's version and appVersion are the crate version (Cargo.toml);
#   - `helm lint --strict` with each values file of deploy/helm/agentry/ci, for Kubernetes
#     1.33 and 1.37;
#   - each values file renders, and every rendered object validates against the Kubernetes
#     1.33 and 1.37 schemas in strict mode (unknown fields refused; a kind without a schema
#     is a failure too);
#   - every pod template meets the restricted Pod Security Standard, with a read-only root,
#     probes on /readyz and /healthz and resources; the checker is first shown failing on
#     broken copies of a rendered pod template, so it cannot pass by checking nothing;
#   - what each values file is for (one SQLite replica with its volume; three PostgreSQL
#     replicas with their Secrets; the Kubernetes runner's variables and RBAC);
#   - values the chart must refuse are refused with the reason (replicaCount 2 on SQLite,
#     values that break values.schema.json, …);
# and prints the objects each values file renders. Exits non-zero on any failure.
#
#   scripts/check-chart.sh                    the checks above
#   scripts/check-chart.sh --render-role OUT  writes the Role and RoleBinding the chart
#       renders for the Kubernetes runner (ci/kubernetes-runner.yaml, release `agentry` in
#       the namespace `agentry`, its Jobs in the namespace `agents`) to OUT as YAML, for the
#       tests whose fake Kubernetes API enforces exactly the chart's Role; checks nothing.
#
# Needs python3 (3.11 or later, with venv). Helm's library (PyPI `helm-python-sdk`, which
# bundles Helm's Go SDK; no helm binary) and `kubernetes-validate` (the Kubernetes JSON
# schemas) are installed at the pinned versions below into a virtual environment under
# $HOME/.cache/agentry-chart (AGENTRY_CHART_CACHE), once per machine.
set -euo pipefail
render_role=
if [ $# -gt 0 ]; then
    if [ $# -ne 2 ] || [ "$1" != --render-role ] || [ -z "$2" ]; then
        echo "usage: scripts/check-chart.sh [--render-role OUT]" >&2
        exit 2
    fi
    # OUT as given, relative to where the script was started.
    render_role=$(realpath -m -- "$2")
fi
cd "$(dirname "$0")/.."
start=$(date +%s%N)

cache="${AGENTRY_CHART_CACHE:-$HOME/.cache/agentry-chart}"
# Every package the two need, pinned, so a run here and on a fresh machine use the same code.
pins=(
    helm-python-sdk==0.2.2
    kubernetes-validate==1.37.0
    PyYAML==6.0.4
    jsonschema==4.26.0
    jsonschema-specifications==2025.9.1
    referencing==0.37.0
    rpds-py==2026.9.1
    attrs==26.1.0
    importlib_resources==7.1.0
    typing_extensions==4.16.0
    packaging==26.4
)
venv="$cache/venv-$(printf '%s\n' "${pins[@]}" | sha256sum | cut -c1-12)"

if ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
    if ! python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
    fi
    echo "== installing ${pins[*]} into $venv"
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/venv-new.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    python3 -m venv "$tmp"
    # Wheels only: helm-python-sdk's source package would need Go to build.
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --only-binary :all: "${pins[@]}"
    rm -rf "$venv"
    mv "$tmp" "$venv"
    trap - EXIT
fi

export CHECK_CHART_START="$start" CHECK_CHART_RENDER_ROLE="$render_role"
exec "$venv/bin/python" - <<'PY'
"""The chart's checks; see the top of scripts/check-chart.sh."""

import copy
import json
import os
import sys
import time
import tomllib

import helm_python as helm
import kubernetes_validate.utils as kv
import yaml

CHART = "deploy/helm/agentry"
RELEASE, NAMESPACE = "agentry", "agentry"
KUBE_VERSIONS = ["1.33.0", "1.37.0"]
VALUES_FILES = ["defaults.yaml", "postgres-3-replicas.yaml", "kubernetes-runner.yaml"]

passed = 0
failures = []


def check(ok, what, detail=""):
    """Records one check and prints it."""
    global passed
    if ok:
        passed += 1
        print(f"ok    {what}")
    else:
        failures.append(what)
        print(f"FAIL  {what}" + (f": {detail}" if detail else ""))
    return ok


def values_of(text):
    """A values file as `helm -f` reads it (Helm's own YAML parser)."""
    return helm.values_from_yaml(text)


def render(values):
    """The chart's objects for `values`, as `helm template` renders them (NOTES.txt left out)."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for name, text in sorted(manifests.items()):
        if name.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


# --- The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards),
# --- baseline controls included, plus this chart's own rules for the agentry container.

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def pod_templates(obj):
    """(where, pod spec, volume claim templates) of every pod an object makes."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    where = f"{kind}/{obj['metadata']['name']}"
    if kind == "Pod":
        return [(where, spec, [])]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"):
        return [(where, spec["template"]["spec"], spec.get("volumeClaimTemplates", []))]
    if kind == "CronJob":
        return [(where, spec["jobTemplate"]["spec"]["template"]["spec"], [])]
    return []


def pss_violations(pod, claims):
    """What keeps `pod` from the restricted profile or from this chart's rules; empty if nothing."""
    bad = []
    psc = pod.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            bad.append(f"{host} is set")
    for v in pod.get("volumes") or []:
        types = set(v) - {"name"}
        if not types <= ALLOWED_VOLUMES:
            bad.append(f"volume {v['name']} is of a type the profile refuses: {sorted(types)}")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            bad.append(f"unsafe sysctl {s.get('name')}")
    if psc.get("runAsUser") == 0:
        bad.append("the pod runs as uid 0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault"):
        bad.append(f"pod seccompProfile {pod_seccomp}")
    if (psc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        bad.append("pod AppArmor profile is not RuntimeDefault or Localhost")
    if not pod.get("containers"):
        bad.append("no containers")
    containers = [(c, True) for c in pod.get("containers") or []]
    containers += [(c, False) for c in (pod.get("initContainers") or []) + (pod.get("ephemeralContainers") or [])]
    for c, app in containers:
        n = c.get("name")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            bad.append(f"{n}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{n}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            bad.append(f"{n}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            bad.append(f"{n}: runs as uid 0")
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) != "RuntimeDefault":
            bad.append(f"{n}: seccompProfile is not RuntimeDefault")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{n}: capabilities do not drop ALL")
        if not set(caps.get("add") or []) <= {"NET_BIND_SERVICE"}:
            bad.append(f"{n}: adds capabilities {caps.get('add')}")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{n}: procMount {sc.get('procMount')}")
        if sc.get("readOnlyRootFilesystem") is not True:
            bad.append(f"{n}: the root filesystem is not read-only")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{n}: uses a hostPort")
        if not app:
            continue
        ready = ((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
        alive = ((c.get("livenessProbe") or {}).get("httpGet") or {}).get("path")
        if ready != "/readyz":
            bad.append(f"{n}: readiness probe is {ready!r}, not /readyz")
        if alive != "/healthz":
            bad.append(f"{n}: liveness probe is {alive!r}, not /healthz")
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if not (res.get(part) or {}).get(r):
                    bad.append(f"{n}: no {part}.{r}")
        # With a read-only root, what agentry writes: its data directory and /tmp.
        vols = {v["name"]: v for v in pod.get("volumes") or []}
        vols.update({t["metadata"]["name"]: {"persistentVolumeClaim": {}} for t in claims})
        mounts = {m["mountPath"]: vols.get(m["name"], {}) for m in c.get("volumeMounts") or []}
        for path, kinds in (("/var/lib/agentry", ("persistentVolumeClaim", "emptyDir")), ("/tmp", ("emptyDir",))):
            if not any(k in mounts.get(path, {}) for k in kinds):
                bad.append(f"{n}: {path} is not a writable {' or '.join(kinds)} volume")
    return bad


def env_of(obj):
    """The agentry container's environment as {name: value or ("secret", name, key)}."""
    c = obj["spec"]["template"]["spec"]["containers"][0]
    out = {}
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        out[e["name"]] = ("secret", ref["name"], ref["key"]) if ref else e.get("value")
    return out


def one(objects, kind):
    found = [o for o in objects if o["kind"] == kind]
    return found[0] if len(found) == 1 else None


# --- --render-role OUT: the Kubernetes runner's Role and RoleBinding, nothing checked ---------

def role_text():
    values = values_of(open(f"{CHART}/ci/kubernetes-runner.yaml").read())
    values["runner"]["kubernetes"]["namespace"] = "agents"
    objects = [o for o in render(values) if o["kind"] in ("Role", "RoleBinding")]
    if sorted(o["kind"] for o in objects) != ["Role", "RoleBinding"]:
        sys.exit(f"check-chart: the Kubernetes runner's values rendered {[o['kind'] for o in objects]}, "
                 "not one Role and one RoleBinding")
    header = (f"# The Role and RoleBinding of {CHART} for the Kubernetes runner ({CHART}/ci/kubernetes-runner.yaml),\n"
              f"# release {RELEASE} in the namespace {NAMESPACE}, Jobs in the namespace agents.\n"
              "# Written by scripts/check-chart.sh --render-role; do not edit.\n")
    return header + "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects), objects


if os.environ.get("CHECK_CHART_RENDER_ROLE"):
    out = os.environ["CHECK_CHART_RENDER_ROLE"]
    text, objects = role_text()
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    print(f"check-chart: wrote the Role and RoleBinding ({len(objects[0]['rules'])} rules, namespace agents) to {out}")
    sys.exit(0)

# --- 0. the Role the Kubernetes runner's tests enforce is the chart's --------------------------

ROLE_FIXTURE = "tests/fixtures/kube-role.yaml"
check(os.path.exists(ROLE_FIXTURE) and open(ROLE_FIXTURE).read() == role_text()[0],
      f"{ROLE_FIXTURE} (the Role fake-kube enforces in the runner's tests) is the chart's",
      f"it differs: scripts/check-chart.sh --render-role {ROLE_FIXTURE}")

# --- 1. versions -------------------------------------------------------------------------------

with open("Cargo.toml", "rb") as f:
    crate_version = tomllib.load(f)["workspace"]["package"]["version"]
with helm.Chart.load(CHART) as chart:
    meta = chart.metadata
check(meta.get("version") == crate_version and meta.get("appVersion") == crate_version,
      f"Chart.yaml version and appVersion are the crate version {crate_version}",
      f"version {meta.get('version')}, appVersion {meta.get('appVersion')}")

# --- 2. the PSS checker fails on broken pod templates -----------------------------------------

default_objects = render(values_of(open(f"{CHART}/ci/defaults.yaml").read()))
sts = one(default_objects, "StatefulSet")
if not check(sts is not None, "the defaults render one StatefulSet"):
    sys.exit(1)
where, pod, claims = pod_templates(sts)[0]
breakages = {
    "root filesystem writable": lambda p: p["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False),
    "privilege escalation": lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
    "capabilities kept": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
    "capability added": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "seccomp unconfined": lambda p: p["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "root user": lambda p: p["securityContext"].update(runAsUser=0),
    "runAsNonRoot off": lambda p: [p["securityContext"].pop("runAsNonRoot"), p["containers"][0]["securityContext"].pop("runAsNonRoot")],
    "hostPath volume": lambda p: p["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
    "hostNetwork": lambda p: p.update(hostNetwork=True),
    "readiness on /healthz": lambda p: p["containers"][0]["readinessProbe"]["httpGet"].update(path="/healthz"),
    "no liveness probe": lambda p: p["containers"][0].pop("livenessProbe"),
    "no memory limit": lambda p: p["containers"][0]["resources"]["limits"].pop("memory"),
    "/tmp not mounted": lambda p: p["containers"][0].update(volumeMounts=[m for m in p["containers"][0]["volumeMounts"] if m["mountPath"] != "/tmp"]),
    "privileged init container": lambda p: p.update(initContainers=[{"name": "init", "image": "x", "securityContext": {"privileged": True}}]),
}
check(pss_violations(pod, claims) == [], f"{where} of the defaults meets the restricted profile",
      "; ".join(pss_violations(pod, claims)))
caught = []
for name, breakage in breakages.items():
    broken = copy.deepcopy(pod)
    breakage(broken)
    if pss_violations(broken, claims):
        caught.append(name)
check(len(caught) == len(breakages), f"the profile check refuses each of {len(breakages)} broken copies",
      f"missed: {sorted(set(breakages) - set(caught))}")

# --- 3. lint, render, validate, profile, per values file --------------------------------------

counts = {}
rendered = {}
for values_file in VALUES_FILES:
    path = f"{CHART}/ci/{values_file}"
    values = values_of(open(path).read())
    for kube in KUBE_VERSIONS:
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v" + kube)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        check(not problems, f"helm lint --strict, {values_file}, Kubernetes {kube[:4]}", str(problems))
    try:
        objects = render(values)
    except helm.HelmError as e:
        check(False, f"{values_file} renders", str(e))
        continue
    rendered[values_file] = objects
    check(bool(objects), f"{values_file} renders", "no objects")
    for kube in KUBE_VERSIONS:
        errors = []
        for obj in objects:
            name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
            try:
                got = kv.validate(obj, kube, strict=True)
                if got != kv.major_minor(kube):
                    errors.append(f"{name}: validated against {got}, not {kube}")
            except kv.ValidationError as e:
                errors.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError as e:
                errors.append(f"{name}: {e.message}")
        check(not errors, f"{values_file}: {len(objects)} objects valid against Kubernetes {kube[:4]} (strict)",
              "; ".join(errors))
    pods = [p for obj in objects for p in pod_templates(obj)]
    check(bool(pods), f"{values_file}: renders a pod template")
    for where, pod, claims in pods:
        bad = pss_violations(pod, claims)
        check(not bad, f"{values_file}: {where} meets the restricted profile, read-only root, probes, resources",
              "; ".join(bad))
    kinds = {}
    for obj in objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    counts[values_file] = kinds

# --- 4. what each values file is for -----------------------------------------------------------

defaults = rendered.get("defaults.yaml", [])
if defaults:
    sts, svc = one(defaults, "StatefulSet"), one(defaults, "Service")
    env = env_of(sts)
    c = sts["spec"]["template"]["spec"]["containers"][0]
    check(sts["spec"]["replicas"] == 1
          and [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])] == ["data"]
          and "AGENTRY_DATABASE_URL" not in env and "AGENTRY_MASTER_KEY" not in env
          and env.get("AGENTRY_DATA_DIR") == "/var/lib/agentry",
          "defaults: one replica, SQLite in its own PersistentVolumeClaim at /var/lib/agentry")
    check(env.get("AGENTRY_BIND") == "0.0.0.0:8080"
          and c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
          and svc["spec"]["ports"][0]["port"] == 8080 and svc["spec"]["ports"][0]["targetPort"] == "http",
          "defaults: listens on 0.0.0.0:8080, the Service on 8080")
    check(c["image"] == f"agentry:{crate_version}", f"defaults: the image is agentry:{crate_version}", c["image"])
    check(sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
          and one(defaults, "ServiceAccount") is not None and one(defaults, "Role") is None,
          "defaults: a ServiceAccount, no API token in the pod, no RBAC")
    check(sts["spec"].get("persistentVolumeClaimRetentionPolicy") == {"whenDeleted": "Retain", "whenScaled": "Retain"},
          "defaults: the data volume outlives an uninstall")

pg = rendered.get("postgres-3-replicas.yaml", [])
if pg:
    sts = one(pg, "StatefulSet")
    env = env_of(sts)
    check(sts["spec"]["replicas"] == 3
          and env.get("AGENTRY_DATABASE_URL") == ("secret", "agentry-database", "url")
          and env.get("AGENTRY_MASTER_KEY") == ("secret", "agentry-master-key", "key"),
          "postgres-3-replicas: 3 replicas, the URL from the Secret's key url, the master key from key")
    ing = one(pg, "Ingress")
    check(ing is not None and ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"]["number"] == 8080,
          "postgres-3-replicas: the Ingress reaches the Service's port")

AGENT_LABELS = {"app.kubernetes.io/name": "agentry-agent", "app.kubernetes.io/managed-by": "agentry",
                "app.kubernetes.io/instance": RELEASE}
AGENTRY_LABELS = {"app.kubernetes.io/name": "agentry", "app.kubernetes.io/instance": RELEASE}
ROLE_RULES = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
              {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
              {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
              {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get", "patch", "delete"]}]


def policies(objects):
    """{name suffix: NetworkPolicy} of the rendered objects."""
    return {o["metadata"]["name"].removeprefix(RELEASE + "-"): o for o in objects if o["kind"] == "NetworkPolicy"}


kr = rendered.get("kubernetes-runner.yaml", [])
if kr:
    sts, role, binding = one(kr, "StatefulSet"), one(kr, "Role"), one(kr, "RoleBinding")
    env = env_of(sts)
    c = sts["spec"]["template"]["spec"]["containers"][0]
    check(env.get("AGENTRY_RUNNER") == "kubernetes" and env.get("AGENTRY_KUBE_NAMESPACE") == "agentry-jobs"
          and sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is True,
          "kubernetes-runner: AGENTRY_RUNNER and AGENTRY_KUBE_NAMESPACE set, the service account's token mounted")
    want_env = {
        "AGENTRY_AGENT_IMAGE": f"registry.example.com/agentry-agent:{crate_version}",
        "AGENTRY_KUBE_INSTANCE": RELEASE,
        "AGENTRY_KUBE_LISTEN": "0.0.0.0:4812",
        "AGENTRY_KUBE_ENDPOINT": "$(AGENTRY_POD_IP):4812",
        "AGENTRY_KUBE_AGENT_CPU": "1500m",
        "AGENTRY_KUBE_AGENT_MEMORY": "3Gi",
        "AGENTRY_KUBE_WORK_SIZE": "5Gi",
        "AGENTRY_KUBE_START_TIMEOUT": "600",
    }
    got_env = {k: env.get(k) for k in want_env}
    names = [e["name"] for e in c["env"]]
    pod_ip = next((e for e in c["env"] if e["name"] == "AGENTRY_POD_IP"), {})
    check(got_env == want_env and "AGENTRY_KUBE_ALLOW_API_REACH" not in env
          and pod_ip.get("valueFrom") == {"fieldRef": {"fieldPath": "status.podIP"}}
          and names.index("AGENTRY_POD_IP") < names.index("AGENTRY_KUBE_ENDPOINT"),
          "kubernetes-runner: the agent image (tag: the appVersion), the pod endpoint on the pod's IP "
          "(AGENTRY_POD_IP from the downward API, defined before it), the agents' resources, work size, "
          "start timeout; no AGENTRY_KUBE_ALLOW_API_REACH",
          f"{got_env}, order {names}")
    check(c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                         {"name": "pods", "containerPort": 4812, "protocol": "TCP"}],
          "kubernetes-runner: container ports http 8080 and pods 4812", str(c["ports"]))
    check(role is not None and role["metadata"]["namespace"] == "agentry-jobs" and role["rules"] == ROLE_RULES
          and one(kr, "ClusterRole") is None and one(kr, "ClusterRoleBinding") is None
          and binding is not None and binding["metadata"]["namespace"] == "agentry-jobs"
          and binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
          and binding["subjects"] == [{"kind": "ServiceAccount", "name": sts["spec"]["template"]["spec"]["serviceAccountName"], "namespace": NAMESPACE}],
          "kubernetes-runner: a Role (no ClusterRole) on exactly jobs, pods, pods/log and secrets in the Jobs' "
          "namespace, bound to the service account")
    nps = policies(kr)
    agents, endpoint = nps.get("agents"), nps.get("pod-endpoint")
    check(agents is not None and agents["metadata"]["namespace"] == "agentry-jobs"
          and agents["spec"] == {
              "podSelector": {"matchLabels": AGENT_LABELS},
              "policyTypes": ["Ingress", "Egress"],
              "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                                  "podSelector": {"matchLabels": AGENTRY_LABELS}}],
                          "ports": [{"protocol": "TCP", "port": 4812}]}]},
          "kubernetes-runner: the agent pods' NetworkPolicy in the Jobs' namespace: no ingress, egress only to "
          "the release's agentry pods on TCP 4812 (no DNS)", json.dumps(agents and agents["spec"]))
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    check(all(pod_labels.get(k) == v for k, v in AGENTRY_LABELS.items())
          and env.get("AGENTRY_KUBE_INSTANCE") == AGENT_LABELS["app.kubernetes.io/instance"],
          "kubernetes-runner: the policy's peers are the labels the agentry pods carry and the instance the runner "
          "gives its agent pods")
    check(endpoint is not None and endpoint["metadata"]["namespace"] == NAMESPACE
          and endpoint["spec"] == {
              "podSelector": {"matchLabels": AGENTRY_LABELS},
              "policyTypes": ["Ingress"],
              "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agentry-jobs"}},
                                     "podSelector": {"matchLabels": AGENT_LABELS}}],
                           "ports": [{"protocol": "TCP", "port": "pods"}]}]},
          "kubernetes-runner (podEndpointPolicy): the agentry pods let in only the release's agent pods, on "
          "the port named pods", json.dumps(endpoint and endpoint["spec"]))

# --- variants beyond the three files: rendered, validated and profile-checked like them --------

def pod_spec(objects):
    return one(objects, "StatefulSet")["spec"]["template"]["spec"]


variants = [
    ("replicaCount: 2\ndatabase: {existingSecret: db}\nmasterKey: {existingSecret: mk}\npersistence: {enabled: false}\n",
     "PostgreSQL without persistence: the data directory in an emptyDir, no claim",
     lambda objs: "emptyDir" in {v["name"]: v for v in pod_spec(objs)["volumes"]}.get("data", {})
     and not one(objs, "StatefulSet")["spec"].get("volumeClaimTemplates")),
    ("securityContext: {runAsUser: null, runAsGroup: null, fsGroup: null}\nconfig: null\n",
     "ids left to the platform (runAsUser null): none set, still runAsNonRoot",
     lambda objs: pod_spec(objs)["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}),
    ("serviceAccount: {create: false, name: agentry-sa}\nimage: {tag: 9.9.9}\n"
     "runner: {kind: kubernetes, kubernetes: {agentImage: {repository: agent, tag: '2.0'}}}\n",
     "Kubernetes runner with defaults: an existing service account bound in the release's namespace, the "
     "agents' policy there too, no pod-endpoint policy; image.tag and agentImage.tag win",
     lambda objs: one(objs, "ServiceAccount") is None
     and one(objs, "RoleBinding")["subjects"][0]["name"] == "agentry-sa"
     and one(objs, "Role")["metadata"]["namespace"] == NAMESPACE
     and list(policies(objs)) == ["agents"] and policies(objs)["agents"]["metadata"]["namespace"] == NAMESPACE
     and pod_spec(objs)["containers"][0]["image"] == "agentry:9.9.9"
     and {k: env_of(one(objs, "StatefulSet")).get(k) for k in
          ("AGENTRY_AGENT_IMAGE", "AGENTRY_KUBE_AGENT_CPU", "AGENTRY_KUBE_AGENT_MEMORY", "AGENTRY_KUBE_WORK_SIZE",
           "AGENTRY_KUBE_START_TIMEOUT", "AGENTRY_KUBE_ALLOW_API_REACH")}
     == {"AGENTRY_AGENT_IMAGE": "agent:2.0", "AGENTRY_KUBE_AGENT_CPU": "2", "AGENTRY_KUBE_AGENT_MEMORY": "4Gi",
         "AGENTRY_KUBE_WORK_SIZE": "10Gi", "AGENTRY_KUBE_START_TIMEOUT": "300", "AGENTRY_KUBE_ALLOW_API_REACH": None}),
    ("runner: {kind: kubernetes, kubernetes: {agentImage: {repository: r.example/agent, tag: x, digest: "
     "'sha256:" + "ab" * 32 + "'}, allowApiReach: true}}\nmasterKey: {existingSecret: mk}\n",
     "the agent image by digest; allowApiReach sets AGENTRY_KUBE_ALLOW_API_REACH=1",
     lambda objs: env_of(one(objs, "StatefulSet")).get("AGENTRY_AGENT_IMAGE") == "r.example/agent@sha256:" + "ab" * 32
     and env_of(one(objs, "StatefulSet")).get("AGENTRY_KUBE_ALLOW_API_REACH") == "1"),
    ("{}\n", "the local runner: no pod endpoint, no NetworkPolicy, no AGENTRY_KUBE_* variable",
     lambda objs: not policies(objs) and len(pod_spec(objs)["containers"][0]["ports"]) == 1
     and not [k for k in env_of(one(objs, "StatefulSet")) if k.startswith("AGENTRY_KUBE") or k == "AGENTRY_AGENT_IMAGE"]),
]
for text, what, predicate in variants:
    try:
        objects = render(values_of(text))
    except helm.HelmError as e:
        check(False, f"variant renders: {what}", str(e))
        continue
    problems = []
    for obj in objects:
        for kube in KUBE_VERSIONS:
            try:
                kv.validate(obj, kube, strict=True)
            except (kv.ValidationError, kv.SchemaNotFoundError) as e:
                problems.append(f"{obj['kind']} against {kube}: {getattr(e, 'message', e)}")
        for where, pod, claims in pod_templates(obj):
            problems += pss_violations(pod, claims)
    check(not problems and predicate(objects), f"variant: {what}", "; ".join(problems) or "not as expected")

# --- 5. refusals -------------------------------------------------------------------------------

refusals = [
    ("replicaCount: 2\n", "HelmRenderError",
     ["replicaCount is 2, but the embedded SQLite database (database.existingSecret is empty) "
      "serves one agentry process only: several replicas need PostgreSQL"]),
    ('replicaCount: "x"\n', "HelmValuesError", ["/replicaCount", "want integer"]),
    ("runner:\n  kind: docker\n", "HelmValuesError", ["/runner/kind", "'local', 'kubernetes'"]),
    ("replicaCount: 3\ndatabase:\n  existingSecret: db\n", "HelmRenderError",
     ["masterKey.existingSecret is empty: every replica must use the same master key"]),
    ("persistence:\n  enabled: false\n", "HelmRenderError",
     ["the database would live in an emptyDir"]),
    ("config:\n  AGENTRY_BIND: 0.0.0.0:9000\n", "HelmRenderError",
     ["config.AGENTRY_BIND: the chart sets AGENTRY_BIND itself"]),
    ("config:\n  AGENTRY_MAX_CONCURRENT_RUNS: 4\n", "HelmValuesError", ["/config/AGENTRY_MAX_CONCURRENT_RUNS", "want string"]),
    ("replicas: 2\n", "HelmValuesError", ["additional properties 'replicas' not allowed"]),
    ("runner:\n  kind: kubernetes\n", "HelmRenderError",
     ["runner.kind is kubernetes but runner.kubernetes.agentImage.repository is empty"]),
    ("runner:\n  kind: kubernetes\n  kubernetes:\n    agentImage:\n      repository: a\n"
     "serviceAccount:\n  create: false\n", "HelmRenderError",
     ["agentry would run as the namespace's default service account"]),
    ("runner:\n  kind: kubernetes\n  kubernetes:\n    agentImage:\n      repository: a\n"
     "serviceAccount:\n  name: default\n", "HelmRenderError",
     ["agentry would run as the namespace's default service account"]),
    ("config:\n  AGENTRY_KUBE_ENDPOINT: 10.0.0.1:4812\n", "HelmRenderError",
     ["config.AGENTRY_KUBE_ENDPOINT: the chart sets AGENTRY_KUBE_ENDPOINT itself"]),
    ("runner:\n  kind: kubernetes\n  kubernetes:\n    agentImage:\n      repository: a\n      digest: latest\n",
     "HelmValuesError", ["/runner/kubernetes/agentImage/digest"]),
    ("runner:\n  kind: kubernetes\n  kubernetes:\n    agentResources:\n      cpu: lots\n",
     "HelmValuesError", ["/runner/kubernetes/agentResources/cpu"]),
]
for text, error, phrases in refusals:
    shown = json.dumps(values_of(text))
    try:
        render(values_of(text))
        check(False, f"refused: {shown}", "it rendered")
    except helm.HelmError as e:
        message = str(e)
        check(type(e).__name__ == error and all(p in message for p in phrases),
              f"refused: {shown} ({error}: {message.strip().splitlines()[-1].strip()})",
              f"{type(e).__name__}: {message}")
# helm lint refuses a values file that breaks the schema too (a template's `fail` it only
# logs, by Helm's design: the render above is what refuses those)
report = helm.lint(CHART, values_of('replicaCount: "x"\n'), strict=True, namespace=NAMESPACE)
check(any("/replicaCount" in e for e in report["errors"]), 'helm lint refuses replicaCount: "x"', str(report))

# --- figures -----------------------------------------------------------------------------------

print()
print("objects per values file:")
for values_file in VALUES_FILES:
    kinds = counts.get(values_file)
    if kinds:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        print(f"  {values_file:<28} {sum(kinds.values())}: {parts}")
elapsed = (time.time_ns() - int(os.environ["CHECK_CHART_START"])) / 1e9
print(f"check-chart: {elapsed:.1f} s")
if failures:
    print("failed:\n  " + "\n  ".join(failures))
print(f"chart: {passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
PY
