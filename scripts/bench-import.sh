#!/usr/bin/env bash
# Measures `agentry import` of generated task records.
#   scripts/bench-import.sh [--random-ids] [--pg] [COUNT] [RUNS]   (defaults: 1000000 records, 3 runs)
#     --random-ids  every record carries its own random UUIDv4 `id`, as exported history does
#     --pg          import into a throwaway PostgreSQL server (scripts/pg-throwaway.sh) instead
#                   of the embedded SQLite database
# Each run imports into a fresh database (a fresh data directory; on PostgreSQL a fresh
# database on the one server), migrations applied beforehand so only the import is timed.
# Prints every run's wall time and peak RSS, and the median time.
# Release build; the generator is crates/api/examples/gen_tasks.rs (deterministic data:
# 90 days, 50 repositories, 6 models).
set -euo pipefail
random_ids=
pg=
positional=()
for arg in "$@"; do
  case $arg in
  --random-ids) random_ids=--random-ids ;;
  --pg) pg=1 ;;
  -*) echo "unknown option: $arg" >&2; exit 2 ;;
  *) positional+=("$arg") ;;
  esac
done
count=${positional[0]:-1000000}
runs=${positional[1]:-3}
cd "$(dirname "$0")/.."
here=$(pwd)
cargo build --release --quiet --bin agentry -p agentry
cargo build --release --quiet --example gen_tasks -p agentry-api
target=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d /tmp/agentry-bench-import.XXXXXX)
pg_dir=
cleanup() {
  if [ -n "$pg_dir" ]; then "$here/scripts/pg-throwaway.sh" stop "$pg_dir"; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$target/release/examples/gen_tasks" "$count" 90 $random_ids > "$work/tasks.jsonl"
server=
if [ -n "$pg" ]; then
  pg_dir=$(mktemp -d /tmp/agentry-bench-pg.XXXXXX)
  server=$("$here/scripts/pg-throwaway.sh" start "$pg_dir" "${AGENTRY_BENCH_PG_PORT:-$((20000 + RANDOM % 12000))}")
  psql_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)/psql
fi
backend=sqlite
if [ -n "$pg" ]; then backend=postgresql; fi
echo "records: $count ($(du -h "$work/tasks.jsonl" | cut -f1))${random_ids:+, random ids}, backend: $backend, runs: $runs"
times=()
for i in $(seq 1 "$runs"); do
  rm -rf "$work/data"
  db_env=()
  if [ -n "$pg" ]; then
    PGOPTIONS=--client-min-messages=warning "$psql_bin" -q -d "$server" \
      -c "DROP DATABASE IF EXISTS bench_import" -c "CREATE DATABASE bench_import"
    db_env=(AGENTRY_DATABASE_URL="${server%/*}/bench_import")
  fi
  env "${db_env[@]}" AGENTRY_DATA_DIR="$work/data" "$target/release/agentry" migrate >/dev/null 2>&1
  start=$(date +%s%N)
  env "${db_env[@]}" AGENTRY_DATA_DIR="$work/data" RUST_LOG=warn \
    /usr/bin/time -f '%M' -o "$work/rss" "$target/release/agentry" import "$work/tasks.jsonl" >/dev/null
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  times+=("$ms")
  printf 'run %d: %d.%01d s, peak RSS %d MB\n' "$i" $((ms / 1000)) $((ms % 1000 / 100)) $(( $(tail -n 1 "$work/rss") / 1024 ))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
median=${sorted[$(( (runs - 1) / 2 ))]}
printf 'median: %d.%01d s\n' $((median / 1000)) $((median % 1000 / 100))
