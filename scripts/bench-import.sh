#!/usr/bin/env bash
# Measures `agentry import` of generated task records on the embedded SQLite database.
#   scripts/bench-import.sh [COUNT] [RUNS]     (defaults: 1000000 records, 3 runs)
# Each run imports into a fresh data directory; prints every run's wall time and the median.
# Release build; the generator is crates/api/examples/gen_tasks.rs (deterministic data:
# 90 days, 50 repositories, 6 models).
set -euo pipefail
count=${1:-1000000}
runs=${2:-3}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin agentry -p agentry
cargo build --release --quiet --example gen_tasks -p agentry-api
target=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d /tmp/agentry-bench-import.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$target/release/examples/gen_tasks" "$count" 90 > "$work/tasks.jsonl"
echo "records: $count ($(du -h "$work/tasks.jsonl" | cut -f1)), runs: $runs"
times=()
for i in $(seq 1 "$runs"); do
  rm -rf "$work/data"
  AGENTRY_DATA_DIR="$work/data" "$target/release/agentry" migrate >/dev/null 2>&1
  start=$(date +%s%N)
  AGENTRY_DATA_DIR="$work/data" RUST_LOG=warn "$target/release/agentry" import "$work/tasks.jsonl" >/dev/null
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  times+=("$ms")
  printf 'run %d: %d.%01d s\n' "$i" $((ms / 1000)) $((ms % 1000 / 100))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
median=${sorted[$(( (runs - 1) / 2 ))]}
printf 'median: %d.%01d s\n' $((median / 1000)) $((median % 1000 / 100))
