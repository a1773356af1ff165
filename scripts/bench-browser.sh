#!/usr/bin/env bash
# Measures the Costs dashboard in headless Chromium on 1,000,000 imported tasks
# (docs/benchmarks.md, "Costs dashboard in the browser"):
#   scripts/bench-browser.sh [COUNT] [RUNS] [--screenshot FILE]   (defaults: 1000000 tasks, 7 runs)
# Release build; the tasks come from crates/api/examples/gen_tasks.rs (90 days, 50
# repositories, 6 models), imported with `agentry import` into a fresh data directory; the
# service runs on a free loopback port with no agent runs. crates/web/bench/costs-bench.mjs
# does the measuring (cold load, bytes downloaded, filter changes) and prints the medians.
# Needs Node.js 20+ and Chromium (/usr/bin/chromium or $CHROMIUM), like scripts/test-browser.sh.
set -euo pipefail
count=${1:-1000000}
runs=${2:-7}
shift $(( $# > 2 ? 2 : $# )) || true
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet --locked --bin agentry -p agentry
cargo build --release --quiet --locked --example gen_tasks -p agentry-api
(cd crates/web && npm ci --no-audit --no-fund --loglevel=error)

work=$(mktemp -d /tmp/agentry-bench-browser.XXXXXX)
server_pid=
stop() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid"
        wait "$server_pid" || true
    fi
    rm -rf "$work"
}
trap stop EXIT
export AGENTRY_DATA_DIR="$work/data" RUST_LOG=warn
"$target/release/examples/gen_tasks" "$count" 90 > "$work/tasks.jsonl"
"$target/release/agentry" import "$work/tasks.jsonl" >/dev/null
rm "$work/tasks.jsonl"
token=$("$target/release/agentry" token create --role viewer --name bench 2>/dev/null | grep -o 'agt_[A-Za-z0-9_-]*' | head -1)
AGENTRY_BIND=127.0.0.1:0 AGENTRY_MAX_CONCURRENT_RUNS=0 RUST_LOG=info \
    "$target/release/agentry" serve >/dev/null 2>"$work/serve.log" &
server_pid=$!
base=
for _ in $(seq 1 400); do
    base=$(grep -o 'agentry listening on http://[0-9.:]*' "$work/serve.log" | head -1 | sed 's/.* on //') || true
    [ -n "$base" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.05
done
[ -n "$base" ] || { echo "bench-browser: agentry serve did not start" >&2; exit 1; }
echo "tasks: $count, runs: $runs, $(nproc) cores, $("${CHROMIUM:-/usr/bin/chromium}" --version 2>/dev/null | head -1)"
node crates/web/bench/costs-bench.mjs "$base" "$token" "$runs" "$@"
