#!/usr/bin/env bash
# Figures of the real agent CLIs against the fake model API (docs/benchmarks.md): the time
# from assigning an issue to its pull request, and from a cancel to the stopped run's cost
# on record (the SIGINT stop), for Claude Code and Codex, the median of N runs of the
# real-agent tests (tests/binary/real_agents.rs; default N = 5).
#
#   scripts/bench-agents.sh [N]
#
# Installs the tested CLIs when missing (scripts/install-agents.sh; needs npm) and builds
# the test binary first. The figures include agentry's own work (claiming, the worktree,
# the sandbox, commit and push, the pull request); the fake model answers at once.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
eval "$(scripts/install-agents.sh)"
export AGENTRY_TEST_REQUIRE_REAL_AGENTS=1
cargo test --test binary --no-run --locked >/dev/null 2>&1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for i in $(seq "$runs"); do
    echo "run $i of $runs" >&2
    cargo test --test binary --locked -- --nocapture \
        takes_an_issue runs_stopped_midway 2>&1 | grep '^figure:' >>"$log"
done
# "figure: <what> <seconds> s" -> the median per <what>.
python3 - "$log" <<'EOF'
import collections, statistics, sys
values = collections.defaultdict(list)
for line in open(sys.argv[1]):
    words = line.split()
    values[" ".join(words[1:-2])].append(float(words[-2]))
for what, xs in sorted(values.items()):
    print(f"{what}: median {statistics.median(xs):.2f} s over {len(xs)} runs "
          f"(min {min(xs):.2f}, max {max(xs):.2f})")
EOF
