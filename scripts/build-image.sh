#!/usr/bin/env bash
# Builds agentry's container image from deploy/Dockerfile, offline once its Debian base is
# cached, and writes it as an OCI image layout to OUT, tagged `agentry`
# (docs/deploy.md#container-image). With --agent, the Kubernetes runner's agent image from
# deploy/Dockerfile.agent instead, tagged `agentry-agent` (docs/deploy.md#the-kubernetes-runner).
#
#   scripts/build-image.sh OUT
#   scripts/build-image.sh --agent OUT
#
# Needs root, buildah and (the first time, to make the base) debootstrap and the network:
# `apt-get install buildah debootstrap`. No container engine runs: buildah builds with
# `--isolation chroot --pull=never`.
#
# - The binary: AGENTRY_BIN (default target/release/agentry), built with
#   `cargo build --release --locked --bin agentry` on Debian bookworm (the image's glibc).
# - The base: `debootstrap --variant=minbase` of the suite of the Dockerfile's BASE with the
#   Dockerfile's PACKAGES, slimmed like Debian's slim images (no manuals, no docs but the
#   copyright files, no locales), imported as the base image. Cached as a tarball under
#   AGENTRY_IMAGE_CACHE (default $HOME/.cache/agentry-image), keyed by the suite, the
#   architecture, the package list and this recipe, so later builds download nothing.
#   AGENTRY_DEBIAN_MIRROR (default http://deb.debian.org/debian) is where debootstrap reads.
# - The image carries the crate version (Cargo.toml's workspace version) as the label
#   org.opencontainers.image.version; the Dockerfile checks the binary says the same.
# - Reproducible: files and the creation time take SOURCE_DATE_EPOCH, by default the time of
#   the checkout's last commit.
# - --agent: the agent CLIs are the packages and versions crates/runner/src/version.rs names
#   (its `npm install -g NAME@VERSION` hints, as scripts/install-agents.sh reads them), each
#   with the native package its package.json names for linux and this architecture. Their
#   npm tarballs are fetched once with `npm pack` (needs npm and the registry) into
#   AGENTRY_IMAGE_CACHE/npm, named by package and version, with the registry's sha512
#   integrity beside each; a later build checks each cached tarball against it and
#   downloads nothing. The image's Dockerfile checks that each CLI says its version.
#
# Prints the time each stage took. Exits non-zero on any failure, leaving OUT as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

die() { echo "build-image: $*" >&2; exit 1; }
agent=
if [ "${1:-}" = --agent ]; then
    agent=1
    shift
fi
if [ $# -ne 1 ] || [ -z "$1" ]; then
    die "usage: scripts/build-image.sh [--agent] OUT (the OCI image layout to write; replaced)"
fi
out=$1
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and buildah's chroot isolation)"
command -v buildah >/dev/null || die "buildah is missing: apt-get install buildah"
command -v python3 >/dev/null || die "python3 is missing (reads Cargo.toml)"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/oci-layout" ]; then
    die "$out exists and is not an OCI image layout; give a new or empty directory"
fi

bin=${AGENTRY_BIN:-target/release/agentry}
if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
    die "no executable agentry binary at $bin (set AGENTRY_BIN, or build it: cargo build --release --locked --bin agentry)"
fi

if [ -n "$agent" ]; then
    dockerfile=deploy/Dockerfile.agent
    name=agentry-agent
else
    dockerfile=deploy/Dockerfile
    name=agentry
fi
version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
# The package list and the suite, from the Dockerfile itself, so the two cannot drift.
packages=$(sed -n 's/^ARG PACKAGES="\(.*\)"$/\1/p' "$dockerfile")
suite=$(sed -n 's/^ARG BASE=.*debian:\([a-z]*\)-slim$/\1/p' "$dockerfile")
read -ra pkgs <<< "$packages"
[ ${#pkgs[@]} -gt 0 ] || die "$dockerfile has no ARG PACKAGES=\"...\" line"
[ -n "$suite" ] || die "$dockerfile has no ARG BASE=...debian:SUITE-slim line"
arch=$(dpkg --print-architecture)
mirror=${AGENTRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}

start=$(date +%s)
stage() { echo "build-image: $* ($(( $(date +%s) - start ))s)"; }
# A file's subresource integrity (sha512-BASE64), as the npm registry gives it.
sri() { python3 -c 'import base64, hashlib, sys; print("sha512-" + base64.b64encode(hashlib.file_digest(open(sys.argv[1], "rb"), "sha512").digest()).decode())' "$1"; }

cache=${AGENTRY_IMAGE_CACHE:-$HOME/.cache/agentry-image}
mkdir -p "$cache"
# The recipe's own version: bump it when the slimming below changes.
recipe=1
key=$( { printf '%s\n' "recipe=$recipe" "suite=$suite" "arch=$arch"; printf '%s\n' "${pkgs[@]}" | sort; } \
    | sha256sum | cut -c1-16)
base_tar="$cache/base-$suite-$arch-$key.tar"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentry-image.XXXXXX")
storage="$tmp/storage"
b() { buildah --root "$storage" --runroot "$tmp/run" --storage-driver vfs "$@"; }
new=
cleanup() {
    # vfs layers are plain directories: removing the temporary storage removes them all.
    rm -rf "$tmp"
    # A layout not swapped in for OUT.
    if [ -n "$new" ]; then rm -rf "$new"; fi
}
trap cleanup EXIT

if [ -f "$base_tar" ]; then
    stage "base: cached $base_tar"
else
    command -v debootstrap >/dev/null || die "debootstrap is missing (needed once, to make the base): apt-get install debootstrap"
    stage "base: debootstrap $suite ($arch) with $packages from $mirror"
    root="$tmp/rootfs"
    debootstrap --variant=minbase --arch="$arch" --include="$(IFS=,; echo "${pkgs[*]}")" \
        "$suite" "$root" "$mirror" > "$tmp/debootstrap.log" 2>&1 \
        || { tail -n 30 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
    # What Debian's slim images leave out, also for packages installed later in the image.
    cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$root"/usr/share/{man,info,locale,lintian,linda}/* \
        "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
        "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
        "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/*
    # The container's engine provides /dev, the host name and the resolver.
    rm -rf "${root:?}"/dev/*
    rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
    : > "$root/etc/machine-id"
    tar --create --file "$base_tar.part" --directory "$root" --numeric-owner --xattrs \
        --sort=name --mtime="@$epoch" --clamp-mtime .
    mv "$base_tar.part" "$base_tar"
    rm -rf "$root"
    stage "base: cached as $base_tar ($(du -m "$base_tar" | cut -f1) MiB)"
fi

base_ref="localhost/agentry-base:$suite-$key"
ctr=$(b from --pull=never scratch)
b add --quiet "$ctr" "$base_tar" / >/dev/null
b config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
b commit --quiet --timestamp "$epoch" "$ctr" "$base_ref" >/dev/null
b rm "$ctr" >/dev/null
stage "base: imported as $base_ref"

# The build context holds the binary (and, for the agent image, the CLIs' npm tarballs).
mkdir "$tmp/context"
cp "$bin" "$tmp/context/agentry"
extra_args=()
if [ -n "$agent" ]; then
    case "$arch" in
        amd64) node_arch=x64 ;;
        arm64) node_arch=arm64 ;;
        *) die "no agent CLI packages for the architecture $arch" ;;
    esac
    # "npm install -g @scope/name@version", one per CLI, Claude Code first.
    mapfile -t clis < <(grep -o 'npm install -g @[^"]*' crates/runner/src/version.rs | awk '{print $4}')
    if [ "${#clis[@]}" -ne 2 ] || [[ ${clis[0]} != @anthropic-ai/claude-code@* ]] || [[ ${clis[1]} != @openai/codex@* ]]; then
        die "expected @anthropic-ai/claude-code and @openai/codex in crates/runner/src/version.rs, found: ${clis[*]:-none}"
    fi
    npm_cache="$cache/npm"
    mkdir -p "$npm_cache" "$tmp/context/npm"
    # fetch SPEC DEST: the npm tarball of SPEC (name@version) copied to DEST, from the cache
    # when there and intact, else from the registry with `npm pack`; $fetched: the cached
    # file.
    fetch() {
        local spec=$1 dest=$2 file
        file="$npm_cache/$(printf '%s' "$spec" | sed 's/^@//; s/[/@]/-/g').tgz"
        if [ ! -f "$file" ] || [ ! -f "$file.integrity" ] \
            || [ "$(sri "$file")" != "$(cat "$file.integrity")" ]; then
            command -v npm >/dev/null || die "npm is missing (needed once, to fetch $spec): apt-get install npm"
            rm -rf "$tmp/pack" && mkdir "$tmp/pack"
            (cd "$tmp/pack" && npm pack --json --silent "$spec" > pack.json) \
                || die "npm pack $spec failed"
            python3 - "$tmp/pack" <<'PY' || die "npm pack $spec: unexpected answer"
import json, os, sys
d = sys.argv[1]
[p] = json.load(open(os.path.join(d, "pack.json")))
os.rename(os.path.join(d, p["filename"]), os.path.join(d, "package.tgz"))
open(os.path.join(d, "integrity"), "w").write(p["integrity"])
PY
            [ "$(sri "$tmp/pack/package.tgz")" = "$(cat "$tmp/pack/integrity")" ] \
                || die "npm pack $spec: the tarball does not match the registry's integrity"
            mv "$tmp/pack/integrity" "$file.integrity"
            mv "$tmp/pack/package.tgz" "$file"
            stage "agent: fetched $spec ($(du -m "$file" | cut -f1) MiB)"
        fi
        cp "$file" "$dest"
        fetched=$file
    }
    # The package the wrapper in tarball $1 names for linux-$node_arch (glibc, not musl):
    # NAME@VERSION, or the aliased spec of an `npm:` entry.
    native_of() {
        tar -xzOf "$1" package/package.json | python3 -c '
import json, sys
deps = json.load(sys.stdin).get("optionalDependencies") or {}
want = [k for k in deps if k.endswith("-linux-" + sys.argv[1])]
if len(want) != 1:
    sys.exit(f"no single linux-{sys.argv[1]} package among {sorted(deps)}")
k, v = want[0], deps[want[0]]
print(v[4:] if v.startswith("npm:") else f"{k}@{v}")' "$node_arch"
    }
    names=(claude-code codex)
    for i in 0 1; do
        fetch "${clis[$i]}" "$tmp/context/npm/${names[$i]}.tgz"
        native=$(native_of "$fetched") || die "${clis[$i]}: no native package for linux-$node_arch"
        fetch "$native" "$tmp/context/npm/${names[$i]}-native.tgz"
        stage "agent: ${clis[$i]} with $native"
    done
    extra_args=(--build-arg "CLAUDE_CODE_VERSION=${clis[0]##*@}" --build-arg "CODEX_VERSION=${clis[1]##*@}"
        --build-arg "NODE_ARCH=$node_arch")
fi
# The docker format keeps the HEALTHCHECK in the image's configuration (the OCI format has
# no field for it); the push below writes an OCI layout either way.
b bud --quiet --isolation chroot --pull=never --format docker --timestamp "$epoch" \
    --file "$repo/$dockerfile" --build-arg "BASE=$base_ref" --build-arg "VERSION=$version" \
    --build-arg "SOURCE_DATE_EPOCH=$epoch" "${extra_args[@]}" \
    --tag "localhost/$name:$version" "$tmp/context" >/dev/null
stage "image: built localhost/$name:$version from $dockerfile"

# Write the new layout beside OUT, then swap it in, so a failure leaves OUT as it was.
mkdir -p "$(dirname "$out")"
new="$out.new.$$"
rm -rf "$new"
b push --quiet --format oci "localhost/$name:$version" "oci:$new:$name" >/dev/null \
    || die "writing the OCI layout failed"
if [ -n "$agent" ]; then
    # No HEALTHCHECK to restore: an agent pod is a run, not a service.
    rm -rf "$out"
    mv "$new" "$out"
    new=
    stage "image: OCI layout $out, tag $name, version $version"
    exit 0
fi
# The OCI image configuration has no field for the HEALTHCHECK, so the push above leaves it
# out; put it back as `config.Healthcheck`, the docker configuration's field, which Docker's
# own OCI images carry too and which Docker reads when it loads the layout. The config blob
# changes, so do the manifest's digest and the index entry's.
b inspect --type image "localhost/agentry:$version" > "$tmp/inspect.json"
python3 - "$new" "$tmp/inspect.json" <<'EOF' || die "adding the HEALTHCHECK to the layout failed"
import hashlib, json, os, sys

layout = sys.argv[1]
health = json.load(open(sys.argv[2]))["Docker"]["config"].get("Healthcheck")
if not health or not health.get("Test"):
    sys.exit("the built image has no HEALTHCHECK")
def path(digest):
    algo, hexd = digest.split(":", 1)
    return os.path.join(layout, "blobs", algo, hexd)
def put(obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(path(digest), "wb") as f:
        f.write(data)
    return digest, len(data)
index_path = os.path.join(layout, "index.json")
index = json.load(open(index_path))
[entry] = index["manifests"]
manifest = json.load(open(path(entry["digest"])))
config = json.load(open(path(manifest["config"]["digest"])))
config["config"]["Healthcheck"] = health
old = [entry["digest"], manifest["config"]["digest"]]
manifest["config"]["digest"], manifest["config"]["size"] = put(config)
entry["digest"], entry["size"] = put(manifest)
for digest in old:
    os.remove(path(digest))
with open(index_path, "w") as f:
    json.dump(index, f, separators=(",", ":"))
EOF
rm -rf "$out"
mv "$new" "$out"
new=
stage "image: OCI layout $out, tag agentry, version $version"
