#!/usr/bin/env bash
# CI's check of the container image (docs/deploy.md#container-image): builds it with
# scripts/build-image.sh to a temporary OCI layout, unpacks it with umoci, checks its
# configuration (non-root user, version label, volume, command, listen address,
# health check) and its size (under 300 MiB unpacked), then runs it under bubblewrap as the
# image's user (uid 10001, no capabilities) on a read-only root with only the data volume
# writable, and checks that it serves /healthz and /readyz on 0.0.0.0:8080, that the image's
# HEALTHCHECK passes, that `agentry doctor` finds a working agent sandbox inside it, that it
# wrote its SQLite database into the volume, and that SIGTERM stops it cleanly.
#
#   scripts/check-image.sh
#
# Needs root. Installs what is missing (buildah, umoci, debootstrap, bubblewrap, curl) with
# apt-get. The binary: AGENTRY_BIN when set; otherwise the release binary is built here
# (`cargo build --release --locked --bin agentry`, CARGO_TARGET_DIR default
# $HOME/.cache/agentry-target). The Debian base is cached under $HOME/.cache/agentry-image
# (scripts/build-image.sh), so only the first run on a machine downloads it.
#
# Prints the figures: image build time (cold: the base made; warm: the base cached), the
# image's size unpacked and compressed, time to healthy. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=check-image
# shellcheck source=scripts/lib/image-check.sh
. scripts/lib/image-check.sh

require_root

install_missing buildah:buildah umoci:umoci debootstrap:debootstrap bwrap:bubblewrap curl:curl \
    setpriv:util-linux nsenter:util-linux python3:python3
buildah --version; umoci --version; bwrap --version

release_binary

tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentry-check-image.XXXXXX")
server=
cleanup() {
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
        kill -KILL "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

step "build (scripts/build-image.sh)"
cache=${AGENTRY_IMAGE_CACHE:-$HOME/.cache/agentry-image}
if compgen -G "$cache/base-*.tar" >/dev/null; then kind=warm; else kind=cold; fi
t0=$(date +%s)
scripts/build-image.sh "$tmp/oci"
build_secs=$(( $(date +%s) - t0 ))

step "unpack (umoci)"
t0=$(date +%s)
umoci unpack --image "$tmp/oci:agentry" "$tmp/bundle" >/dev/null
unpack_secs=$(( $(date +%s) - t0 ))
rootfs="$tmp/bundle/rootfs"

step "configuration"
version=$(workspace_version)
# The image's configuration, read from the layout's own blobs, and the figures of its size.
python3 - "$tmp/oci" "$version" > "$tmp/image.env" <<'EOF'
import json, shlex, sys

from oci_image import Expectations, load

layout, version = sys.argv[1], sys.argv[2]
manifest, config = load(layout, "agentry")
c = config.get("config", {})
env = dict(e.split("=", 1) for e in c.get("Env", []))
labels = c.get("Labels") or {}
image = Expectations()
want = image.want
want("the user", c.get("User"), "10001:10001")
want("the version label", labels.get("org.opencontainers.image.version"), version)
want("the volumes", sorted(c.get("Volumes") or {}), ["/var/lib/agentry"])
want("the exposed ports", sorted(c.get("ExposedPorts") or {}), ["8080/tcp"])
want("AGENTRY_BIND", env.get("AGENTRY_BIND"), "0.0.0.0:8080")
want("AGENTRY_DATA_DIR", env.get("AGENTRY_DATA_DIR"), "/var/lib/agentry")
want("the command", (c.get("Entrypoint") or []) + (c.get("Cmd") or []),
     ["/usr/bin/tini", "--", "/usr/local/bin/agentry", "serve"])
# An OCI image configuration has no health-check field; build-image.sh writes the
# HEALTHCHECK back as Docker's `config.Healthcheck`.
health = c.get("Healthcheck") or {}
test = health.get("Test") or []
if test[:1] != ["CMD"] or len(test) < 2:
    image.errors.append(f"the image has no HEALTHCHECK command (Healthcheck: {health!r})")
image.exit_if_any()
layers = sum(l["size"] for l in manifest["layers"])
print(f"compressed_bytes={layers}")
print(f"health_cmd={shlex.quote(json.dumps(test[1:]))}")
print(f"image_env={shlex.quote(json.dumps(c.get('Env', [])))}")
print(f"image_args={shlex.quote(json.dumps((c.get('Entrypoint') or []) + (c.get('Cmd') or [])))}")
EOF
compressed_bytes='' health_cmd='' image_env='' image_args=''
# shellcheck disable=SC1091
. "$tmp/image.env"
echo "user 10001:10001, version $version, volume /var/lib/agentry, serve on 0.0.0.0:8080, HEALTHCHECK set"

step "size"
unpacked_bytes=$(du -sb "$rootfs" | cut -f1)
unpacked_mib=$(( unpacked_bytes / 1048576 ))
compressed_mib=$(( compressed_bytes / 1048576 ))
[ "$unpacked_mib" -lt 300 ] || fail "the image is $unpacked_mib MiB unpacked, not under 300 MiB"
echo "unpacked $unpacked_mib MiB, compressed layers $compressed_mib MiB"

# Runs a command of the image as its user, the way a container engine would run it with
# `--read-only --user 10001:10001 --cap-drop ALL` and a volume on /var/lib/agentry: an
# unprivileged bubblewrap (started as uid 10001 on the host, so its user namespace maps only
# that uid), the unpacked root read-only, the data directory the one writable place, its own
# PID (the image's entrypoint is PID 1, as in a container), IPC, UTS and network namespaces
# (loopback only: nothing on this machine can collide with port 8080), the image's
# environment and working directory.
data="$tmp/data"
install -d -o 10001 -g 10001 -m 0700 "$data"
# bubblewrap runs as uid 10001: it must reach the unpacked root and the data directory.
chmod 0755 "$tmp" "$tmp/bundle"
as_image_user() {
    local env_args=()
    while IFS= read -r kv; do env_args+=(--setenv "${kv%%=*}" "${kv#*=}"); done \
        < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$image_env")
    setpriv --reuid 10001 --regid 10001 --clear-groups --inh-caps=-all --bounding-set=-all -- \
        bwrap --unshare-user --uid 10001 --gid 10001 --unshare-pid --as-pid-1 --unshare-ipc \
        --unshare-uts --unshare-net --die-with-parent --new-session \
        --ro-bind "$rootfs" / --bind "$data" /var/lib/agentry --proc /proc --dev /dev \
        --chdir /var/lib/agentry --clearenv "${env_args[@]}" "$@"
}

step "run: agentry doctor inside the image (the agents' sandbox nested in the container's)"
mapfile -t args < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$image_args")
# doctor exits 1 here (the image has no agent CLI and no model key); what matters here is
# its sandbox line: bubblewrap's trial run with the sandbox's own namespaces and mounts.
as_image_user "${args[@]:0:3}" doctor > "$tmp/doctor.out" 2>&1 || true
grep -E '^ok +sandbox ' "$tmp/doctor.out" \
    || { cat "$tmp/doctor.out" >&2; fail "agentry doctor inside the image found no working sandbox"; }
find "$data" -mindepth 1 -delete

step "run: ${args[*]} as uid 10001 on a read-only root"
exec 3> "$tmp/info.json"
as_image_user --info-fd 3 "${args[@]}" > "$tmp/serve.log" 2>&1 &
server=$!
exec 3>&-
t0=$(date +%s%N)
deadline=$(( $(date +%s) + 60 ))
# The image's PID 1 (tini), from bubblewrap's info.
child=
until [ -n "$child" ]; do
    child=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["child-pid"])' "$tmp/info.json" 2>/dev/null || true)
    kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.log" >&2; fail "bubblewrap exited before starting the image"; }
    [ "$(date +%s)" -lt "$deadline" ] || fail "no child pid from bubblewrap within 60 s"
    [ -n "$child" ] || sleep 0.2
done
in_net() { nsenter --target "$child" --net -- "$@"; }
until in_net curl -fsS --max-time 2 http://127.0.0.1:8080/healthz > "$tmp/healthz" 2>/dev/null; do
    kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.log" >&2; fail "the image exited before serving /healthz"; }
    [ "$(date +%s)" -lt "$deadline" ] || { cat "$tmp/serve.log" >&2; fail "/healthz did not answer within 60 s"; }
    sleep 0.2
done
healthy_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "/healthz: $(cat "$tmp/healthz")"
in_net curl -fsS --max-time 5 http://127.0.0.1:8080/readyz > "$tmp/readyz" \
    || { cat "$tmp/serve.log" >&2; fail "/readyz did not answer 200"; }
echo "/readyz: $(cat "$tmp/readyz")"
# Listening on every address of the container, not only its loopback.
in_net cat /proc/net/tcp | awk 'NR > 1 && $4 == "0A" { print $2 }' | grep -qx '00000000:1F90' \
    || fail "nothing listens on 0.0.0.0:8080 inside the container"

# Every process of the container runs as uid 10001 with no capability, on the host too.
python3 - "$child" > "$tmp/pids.env" <<'EOF'
import os, sys
root = int(sys.argv[1])
children = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(pid))
todo, seen = [root], []
while todo:
    pid = todo.pop()
    seen.append(pid)
    todo += children.get(pid, [])
bad = []
for pid in seen:
    status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
    uids, gids = status["Uid"].split(), status["Gid"].split()
    if set(uids) != {"10001"} or set(gids) != {"10001"} or int(status["CapEff"], 16):
        bad.append(f"{pid} {status['Name'].strip()}: uid {uids} gid {gids} CapEff {status['CapEff'].strip()}")
names = sorted(open(f"/proc/{p}/comm").read().strip() for p in seen)
if "agentry" not in names or "tini" not in names:
    sys.exit(f"no tini and agentry processes in the container: {names}")
if bad:
    sys.exit("processes not running as 10001 without capabilities:\n" + "\n".join(bad))
print(f"processes {names}: uid/gid 10001, no capabilities", file=sys.stderr)
def pid_of(name):
    return next(p for p in seen if open(f"/proc/{p}/comm").read().strip() == name)
print(f"tini_pid={pid_of('tini')}")
print(f"agentry_pid={pid_of('agentry')}")
EOF
tini_pid='' agentry_pid=''
# shellcheck disable=SC1091
. "$tmp/pids.env"

step "run: the image's HEALTHCHECK"
mapfile -t health < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$health_cmd")
in_container() {
    nsenter --target "$agentry_pid" --user --mount --net --pid --root --wd \
        --setuid 10001 --setgid 10001 -- env -i "${env_list[@]}" "$@"
}
mapfile -t env_list < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$image_env")
in_container "${health[@]}" || fail "the HEALTHCHECK command (${health[*]}) failed against the running image"
echo "HEALTHCHECK passes"
# Inside, / is mounted read-only and /var/lib/agentry read-write (mountinfo's mount point
# and per-mount options), and the image's user can write there.
in_container cat /proc/self/mountinfo > "$tmp/mountinfo" || fail "cannot read the container's mounts"
awk '$5 == "/" { split($6, o, ","); print o[1] }' "$tmp/mountinfo" | tail -n1 | grep -qx ro \
    || { cat "$tmp/mountinfo" >&2; fail "the image's root is not mounted read-only"; }
awk '$5 == "/var/lib/agentry" { split($6, o, ","); print o[1] }' "$tmp/mountinfo" | tail -n1 | grep -qx rw \
    || { cat "$tmp/mountinfo" >&2; fail "/var/lib/agentry is not mounted read-write"; }
in_container /bin/sh -c 'touch /var/lib/agentry/.w && rm /var/lib/agentry/.w' || fail "the data volume is not writable"
echo "root read-only, /var/lib/agentry writable"

step "run: the database in the volume"
[ -s "$data/agentry.db" ] || fail "no SQLite database at /var/lib/agentry/agentry.db"
python3 - "$data/agentry.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
tables = [r[0] for r in db.execute("select name from sqlite_master where type = 'table'")]
if "tasks" not in tables:
    sys.exit(f"the database has no tasks table: {tables}")
print(f"agentry.db: {len(tables)} tables, migrations applied")
EOF
owner=$(stat -c '%u:%g %a' "$data/agentry.db" "$data/master.key")
echo "$owner" | grep -qv '^10001:10001 ' && fail "files of the volume not owned by 10001:10001: $owner"
[ "$(stat -c %a "$data/master.key")" = 600 ] || fail "master.key is not mode 0600"
ls -l "$data"

step "stop: SIGTERM to the image's PID 1 (tini), as a container engine stops it"
[ "$tini_pid" = "$child" ] || fail "tini ($tini_pid) is not the container's PID 1 ($child)"
kill -TERM "$tini_pid"
deadline=$(( $(date +%s) + 30 ))
while kill -0 "$server" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || { cat "$tmp/serve.log" >&2; fail "still running 30 s after SIGTERM"; }
    sleep 0.2
done
code=0; wait "$server" || code=$?
server=
[ "$code" = 0 ] || { cat "$tmp/serve.log" >&2; fail "the image exited with $code after SIGTERM"; }
echo "stopped cleanly"

step "done"
echo "image build ($kind): $build_secs s; unpack: $unpack_secs s; healthy after $healthy_ms ms"
echo "image size: $unpacked_mib MiB unpacked (limit 300), $compressed_mib MiB compressed"
