#!/usr/bin/env bash
# CI's check of the Kubernetes runner's agent image (docs/deploy.md#the-kubernetes-runner):
# builds it with `scripts/build-image.sh --agent` to a temporary OCI layout, unpacks it with
# umoci, checks its configuration (user 10001:10001, working directory /work, tini as PID 1
# before `agentry pod-run`, no volume, the version label), then runs it under bubblewrap as
# uid 10001 with no capabilities, the way the Job runs it: a read-only root with only /work
# and /tmp writable, no network. There `claude --version` and `codex --version` must print
# the versions crates/runner/src/version.rs supports, `agentry --version` the crate's,
# git must work (a repository made and committed to in /work), and the entry point, started
# without the environment the runner gives it, must exit 125 with `agentry pod-run: ...` on
# stderr. Prints the image's size.
#
#   scripts/check-agent-image.sh
#
# With AGENTRY_AGENT_ROOTFS_OUT=DIR the unpacked root file system is kept there (replaced),
# for the test that runs the real Claude Code of the image on fake-kube
# (tests/binary/real_agents.rs, AGENTRY_TEST_AGENT_ROOTFS).
#
# Needs root. Installs what is missing (buildah, umoci, debootstrap, bubblewrap, npm) with
# apt-get. The binary: AGENTRY_BIN when set; otherwise the release binary is built here
# (`cargo build --release --locked --bin agentry`, CARGO_TARGET_DIR default
# $HOME/.cache/agentry-target). The Debian base and the CLIs' npm tarballs are cached under
# $HOME/.cache/agentry-image (scripts/build-image.sh), so only the first run on a machine
# downloads them.
#
# Prints the figures: build time (cold or warm), the image's size unpacked and compressed.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=check-agent-image
# shellcheck source=scripts/lib/image-check.sh
. scripts/lib/image-check.sh

require_root

install_missing buildah:buildah umoci:umoci debootstrap:debootstrap bwrap:bubblewrap \
    setpriv:util-linux python3:python3 npm:npm

release_binary

tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentry-check-agent-image.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step "build (scripts/build-image.sh --agent)"
cache=${AGENTRY_IMAGE_CACHE:-$HOME/.cache/agentry-image}
base_key=$(sed -n 's/^ARG PACKAGES="\(.*\)"$/\1/p' deploy/Dockerfile.agent)
if compgen -G "$cache/npm/*.tgz" >/dev/null && [ -n "$base_key" ]; then kind=warm; else kind=cold; fi
t0=$(date +%s)
scripts/build-image.sh --agent "$tmp/oci"
build_secs=$(( $(date +%s) - t0 ))

step "unpack (umoci)"
umoci unpack --image "$tmp/oci:agentry-agent" "$tmp/bundle" >/dev/null
rootfs="$tmp/bundle/rootfs"

step "configuration"
version=$(workspace_version)
# The supported versions, from the one place that names them.
claude_version=$(grep -o 'npm install -g @anthropic-ai/claude-code@[0-9.]*' crates/runner/src/version.rs | sed 's/.*@//')
codex_version=$(grep -o 'npm install -g @openai/codex@[0-9.]*' crates/runner/src/version.rs | sed 's/.*@//')
if [ -z "$claude_version" ] || [ -z "$codex_version" ]; then
    fail "no CLI versions in crates/runner/src/version.rs"
fi
python3 - "$tmp/oci" "$version" > "$tmp/image.env" <<'EOF'
import json, shlex, sys

from oci_image import Expectations, load

layout, version = sys.argv[1], sys.argv[2]
manifest, config = load(layout, "agentry-agent")
c = config.get("config", {})
labels = c.get("Labels") or {}
image = Expectations()
want = image.want
want("the user", c.get("User"), "10001:10001")
want("the working directory", c.get("WorkingDir"), "/work")
want("the entry point", c.get("Entrypoint"), ["/usr/bin/tini", "--", "/usr/local/bin/agentry", "pod-run"])
want("the command", c.get("Cmd") or [], [])
want("the volumes", sorted(c.get("Volumes") or {}), [])
want("the title label", labels.get("org.opencontainers.image.title"), "agentry-agent")
want("the version label", labels.get("org.opencontainers.image.version"), version)
want("the licenses label", labels.get("org.opencontainers.image.licenses"), "MIT OR Apache-2.0")
image.exit_if_any()
print(f"compressed_bytes={sum(l['size'] for l in manifest['layers'])}")
print(f"image_env={shlex.quote(json.dumps(c.get('Env', [])))}")
EOF
compressed_bytes='' image_env=''
# shellcheck disable=SC1091
. "$tmp/image.env"
echo "user 10001:10001, workdir /work, entry point tini -- agentry pod-run, no volume, version $version"

step "size"
unpacked_mib=$(( $(du -sb "$rootfs" | cut -f1) / 1048576 ))
compressed_mib=$(( compressed_bytes / 1048576 ))
# Claude Code's postinstall links its native binary into place: one copy in the image, not two.
claude_exe="$rootfs/usr/local/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
[ "$(stat -c %h "$claude_exe")" -ge 2 ] || fail "claude.exe is a copy of the native binary, not a link to it"
echo "unpacked $unpacked_mib MiB, compressed layers $compressed_mib MiB"

# Runs a command in the image the way the Job runs it: as uid 10001 with no capability (an
# unprivileged bubblewrap started as that uid), the unpacked root read-only, writable /work
# and /tmp (the Job's emptyDirs), its own PID namespace with the command as PID 1, no
# network, the image's environment and working directory; HOME=/tmp as the account says.
work="$tmp/work" scratch="$tmp/scratch"
install -d -o 10001 -g 10001 -m 0755 "$work"
install -d -o 10001 -g 10001 -m 1777 "$scratch"
chmod 0755 "$tmp" "$tmp/bundle"
mapfile -t env_list < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$image_env")
env_args=()
for kv in "${env_list[@]}"; do env_args+=(--setenv "${kv%%=*}" "${kv#*=}"); done
in_image() {
    setpriv --reuid 10001 --regid 10001 --clear-groups --inh-caps=-all --bounding-set=-all -- \
        bwrap --unshare-user --uid 10001 --gid 10001 --unshare-pid --as-pid-1 --unshare-ipc \
        --unshare-uts --unshare-net --die-with-parent --new-session \
        --ro-bind "$rootfs" / --bind "$work" /work --bind "$scratch" /tmp --proc /proc --dev /dev \
        --chdir /work --clearenv "${env_args[@]}" --setenv HOME /tmp "$@"
}
expect() {
    local what=$1 want=$2 got
    shift 2
    got=$(in_image "$@" 2> "$tmp/stderr") || { cat "$tmp/stderr" >&2; fail "$what: \`$*\` failed"; }
    [ "$got" = "$want" ] || { cat "$tmp/stderr" >&2; fail "$what: \`$*\` printed '$got', not '$want'"; }
    echo "ok    $*: $got"
}

step "run: the programs, as uid 10001 on a read-only root"
expect "Claude Code" "$claude_version (Claude Code)" claude --version
expect "Codex" "codex-cli $codex_version" codex --version
expect "agentry" "agentry $version" agentry --version
expect "the user" "uid=10001(agentry) gid=10001(agentry) groups=10001(agentry)" id
node=$(in_image node --version) || fail "node --version failed"
node_major=$(echo "$node" | sed -n 's/^v\([0-9]*\)\..*/\1/p')
if [ -z "$node_major" ] || [ "$node_major" -lt 18 ]; then
    fail "node --version says $node: both CLIs need Node.js 18 or later"
fi
echo "ok    node --version: $node"
git_version=$(in_image git --version) || fail "git --version failed"
echo "ok    git --version: $git_version"
expect "git in /work" "committed" sh -c 'git init -q r && cd r && echo x > f && git add f \
    && git -c user.name=a -c user.email=a@example.com commit -qm x && git log --format=%s | grep -qx x && echo committed'
expect "the root filesystem" "read-only" sh -c 'touch /usr/x 2>/dev/null && echo writable || echo read-only'
expect "/work and /tmp" "writable" sh -c 'touch /work/.w /tmp/.w && rm /work/.w /tmp/.w && echo writable'

step "run: the entry point without the runner's environment"
mapfile -t entry < <(python3 - "$tmp/oci" <<'EOF'
import json, os, sys
layout = sys.argv[1]
def blob(d):
    return json.load(open(os.path.join(layout, "blobs", *d.split(":", 1))))
m = blob(json.load(open(os.path.join(layout, "index.json")))["manifests"][0]["digest"])
print("\n".join(blob(m["config"]["digest"])["config"]["Entrypoint"]))
EOF
)
code=0
in_image "${entry[@]}" > "$tmp/entry.out" 2> "$tmp/entry.err" || code=$?
[ "$code" = 125 ] || { cat "$tmp/entry.err" >&2; fail "the entry point exited $code, not 125"; }
grep -q '^agentry pod-run: ' "$tmp/entry.err" \
    || { cat "$tmp/entry.err" >&2; fail "the entry point's stderr has no line starting 'agentry pod-run: '"; }
echo "ok    ${entry[*]}: exit 125, $(grep -m1 '^agentry pod-run: ' "$tmp/entry.err")"

if [ -n "${AGENTRY_AGENT_ROOTFS_OUT:-}" ]; then
    step "keep the root file system: $AGENTRY_AGENT_ROOTFS_OUT"
    rm -rf "$AGENTRY_AGENT_ROOTFS_OUT"
    mkdir -p "$(dirname "$AGENTRY_AGENT_ROOTFS_OUT")"
    mv "$rootfs" "$AGENTRY_AGENT_ROOTFS_OUT"
fi

step "done"
echo "agent image build ($kind): $build_secs s"
echo "agent image size: $unpacked_mib MiB unpacked, $compressed_mib MiB compressed"
echo "Claude Code $claude_version, Codex $codex_version, $node, $git_version, agentry $version"
