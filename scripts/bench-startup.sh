#!/usr/bin/env bash
# Measures `agentry serve` start-up and idle memory (docs/contract.md#9-performance-targets: start to ready under 1 s, idle
# RSS under 50 MB) on the embedded SQLite database, with the runner and every background
# loop on (AGENTRY_MAX_CONCURRENT_RUNS at its default).
#   scripts/bench-startup.sh [RUNS]     (default: 5)
# Run 1 starts on a fresh data directory (creates the database, applies the migrations,
# issues the admin token); the others restart on it. Start to ready: from launching the
# process until `GET /readyz` answers 200. RSS: VmRSS from /proc two seconds later.
# Prints every run and the medians. Release build. Needs curl.
set -euo pipefail
runs=${1:-5}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin agentry -p agentry
bin=${CARGO_TARGET_DIR:-target}/release/agentry
work=$(mktemp -d /tmp/agentry-bench-startup.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
port=$(( 20000 + RANDOM % 20000 ))
starts=() rss=()
for i in $(seq 1 "$runs"); do
  start=$(date +%s%N)
  AGENTRY_DATA_DIR="$work/data" AGENTRY_BIND="127.0.0.1:$port" RUST_LOG=warn \
    "$bin" serve >/dev/null 2>"$work/stderr" &
  pid=$!
  until curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then cat "$work/stderr" >&2; exit 1; fi
    sleep 0.002
  done
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  sleep 2
  kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  starts+=("$ms") rss+=("$kb")
  printf 'run %d: start to ready %d ms, idle RSS %d.%01d MB\n' "$i" "$ms" \
    $((kb / 1024)) $((kb % 1024 * 10 / 1024))
done
median() { local s=($(printf '%s\n' "$@" | sort -n)); echo "${s[$(( ($# - 1) / 2 ))]}"; }
m=$(median "${starts[@]}") r=$(median "${rss[@]}")
printf 'median: start to ready %d ms, idle RSS %d.%01d MB\n' "$m" $((r / 1024)) \
  $((r % 1024 * 10 / 1024))
