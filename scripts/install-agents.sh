#!/usr/bin/env bash
# Installs the agent CLIs agentry is tested with (Claude Code and Codex, from the npm
# registry, at the versions crates/runner/src/version.rs names as tested) into a directory
# of their own, and prints the variables that point agentry's real-agent tests at them.
#
#   scripts/install-agents.sh [DIR]      (default: ~/.cache/agentry-agents)
#   eval "$(scripts/install-agents.sh)"  # then: cargo test --test binary real_agents
#
# The same versions are what an operator installs for the service's user (docs/runner.md).
# Nothing is installed again when DIR already holds these versions. Needs Node.js and npm.
set -euo pipefail
cd "$(dirname "$0")/.."

# The packages and versions, from the one place that names them (the `install` hints of
# crates/runner/src/version.rs: "npm install -g @scope/name@version").
mapfile -t packages < <(grep -o 'npm install -g @[^"]*' crates/runner/src/version.rs | awk '{print $4}')
if [ "${#packages[@]}" -ne 2 ]; then
    echo "install-agents: expected two packages in crates/runner/src/version.rs, found: ${packages[*]:-none}" >&2
    exit 1
fi

base="${1:-$HOME/.cache/agentry-agents}"
dir="$base/$(printf '%s\n' "${packages[@]}" | tr '/@' '__' | paste -sd+ -)"
if [ ! -x "$dir/bin/claude" ] || [ ! -x "$dir/bin/codex" ]; then
    command -v npm >/dev/null || { echo "install-agents: npm is needed" >&2; exit 1; }
    rm -rf "$dir.partial"
    npm install --global --prefix "$dir.partial" --no-audit --no-fund --loglevel=error \
        "${packages[@]}" >&2
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
fi
echo "export AGENTRY_TEST_CLAUDE_BIN=$dir/bin/claude"
echo "export AGENTRY_TEST_CODEX_BIN=$dir/bin/codex"
