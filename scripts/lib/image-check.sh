# shellcheck shell=bash
# What scripts/check-image.sh and scripts/check-agent-image.sh share, sourced by both after
# they set CHECK_NAME (their name in the progress and failure lines) and cd to the checkout:
# the progress and failure lines, the root check, the tools installed when missing, the
# release binary, the workspace's version, and the OCI layout's reader (oci_image, for the
# Python that checks an image's configuration).

start=$(date +%s)
step() { echo "== $CHECK_NAME: $* ($(( $(date +%s) - start ))s)"; }
fail() { echo "$CHECK_NAME: FAILED: $*" >&2; exit 1; }

# Fails unless run as root (buildah, umoci, and running the image as uid 10001 need it).
require_root() {
    [ "$(id -u)" = 0 ] || fail "needs root (buildah, umoci, and running the image as uid 10001)"
}

# Installs with apt-get the Debian package of each COMMAND:PACKAGE whose command is missing.
install_missing() {
    step "tools"
    local tool missing=()
    for tool in "$@"; do
        command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# Sets AGENTRY_BIN: as given, or the release binary built here (CARGO_TARGET_DIR default
# $HOME/.cache/agentry-target).
release_binary() {
    if [ -n "${AGENTRY_BIN:-}" ]; then
        step "binary: AGENTRY_BIN=$AGENTRY_BIN"
    else
        step "binary: cargo build --release"
        export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/agentry-target}"
        local t0
        t0=$(date +%s)
        cargo build --release --locked --bin agentry
        echo "release build: $(( $(date +%s) - t0 )) s"
        export AGENTRY_BIN="$CARGO_TARGET_DIR/release/agentry"
    fi
}

# The workspace's version (Cargo.toml's workspace.package.version).
workspace_version() {
    python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])'
}

# For the image checks' Python: `import oci_image` finds scripts/lib/oci_image.py.
export PYTHONPATH="$PWD/scripts/lib${PYTHONPATH:+:$PYTHONPATH}"
