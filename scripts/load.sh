#!/usr/bin/env bash
# Load figures of `agentry serve` from a real load generator (oha), docs/benchmarks.md.
#
#   scripts/load.sh [--backend sqlite|postgres|both] [--tasks 1000000] [--issues 5000]
#                   [--duration 20s] [--clients 64] [--rate 500] [--agents off|on|both]
#                   [--deep-pages 250] [--results DIR]
#
# For each backend: imports TASKS generated task records (crates/api/examples/gen_tasks.rs,
# `agentry import`; PostgreSQL through scripts/pg-throwaway.sh), starts the fake GitHub with
# one repository of ISSUES open issues (crates/api/examples/seed_issues.rs), starts the
# release `agentry serve` on it, connects the repository through the API and syncs its
# issues, then measures with oha at CLIENTS concurrent connections for DURATION each:
#   GET /api/tasks?limit=50 (first page), the same with a deep cursor (DEEP_PAGES pages of 200
#   in), GET /api/tasks/{id} (ids of 1,000 tasks spread over the list), GET
#   /api/analytics/costs?days=30, GET /api/issues, and signed webhook deliveries at RATE per
#   second (`oha -q RATE`).
# Pass "idle": nothing else runs. Pass "agents": the fake agent
# (crates/runner/tests/fake-agents/claude, `[fake:sleep=3]` prompts) works on tasks created
# through the API, cloning, pushing and opening pull requests on the fake, while oha runs.
# RSS of the server: idle (after start, and after the set-up, before any load), the highest
# VmRSS sampled while each oha run went on (the table's last column) and over the pass, and
# VmHWM at the end.
#
# oha sends one fixed request, so every webhook delivery after the first repeats one
# X-GitHub-Delivery id: the figure measures the signature check, the JSON parse and the
# de-duplication transaction (docs/benchmarks.md says more).
#
# Prints one table per backend and pass; the raw oha JSON goes to DIR (default: a temporary
# directory, removed at the end). Needs curl, jq, openssl; installs oha with
# `cargo install oha --locked` into ~/.cargo/bin when missing.
set -euo pipefail

backend=both tasks=1000000 issues=5000 duration=20s clients=64 rate=500 agents=both
deep_pages=250 results=
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --backend) backend=$2 ;;
    --tasks) tasks=$2 ;;
    --issues) issues=$2 ;;
    --duration) duration=$2 ;;
    --clients) clients=$2 ;;
    --rate) rate=$2 ;;
    --agents) agents=$2 ;;
    --deep-pages) deep_pages=$2 ;;
    --results) results=$2 ;;
    *) usage ;;
  esac
  shift 2
done
case $backend in sqlite) backends=(sqlite) ;; postgres) backends=(postgres) ;;
  both) backends=(sqlite postgres) ;; *) usage ;; esac
case $agents in off) passes=(idle) ;; on) passes=(agents) ;; both) passes=(idle agents) ;;
  *) usage ;; esac
case $duration in
  *[0-9]s) dur_secs=${duration%s} ;; *[0-9]m) dur_secs=$(( ${duration%m} * 60 )) ;;
  *) echo "--duration: give seconds (20s) or minutes (1m)" >&2; exit 2 ;;
esac
for n in "$tasks" "$issues" "$clients" "$rate" "$deep_pages" "$dur_secs"; do
  case $n in ''|*[!0-9]*) echo "not a number: $n" >&2; exit 2 ;; esac
done
for tool in curl jq openssl; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$root/$target ;; esac

# ----- the load generator -----
oha=$(command -v oha || true)
[ -n "$oha" ] || oha=$HOME/.cargo/bin/oha
if [ ! -x "$oha" ]; then
  echo "installing oha (cargo install oha --locked)" >&2
  oha_build=$(mktemp -d /tmp/oha-build.XXXXXX)
  CARGO_TARGET_DIR=$oha_build cargo install oha --locked >&2
  rm -rf "$oha_build"
  oha=$HOME/.cargo/bin/oha
fi
# oha ≥ 1.9 takes --output-format json; older versions --json.
if "$oha" --help 2>/dev/null | grep -q -- '--output-format'; then
  oha_json=(--output-format json)
else
  oha_json=(--json)
fi

cargo build --release --quiet --bin agentry -p agentry
cargo build --release --quiet -p agentry-api --example gen_tasks --example seed_issues
bin=$target/release/agentry

work=$(mktemp -d /tmp/agentry-load.XXXXXX)
[ -n "$results" ] || results=$work/results
mkdir -p "$results"
server_pid= fake_pid= sampler_pid= pg_dir=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
stop_fake() {
  if [ -n "$fake_pid" ]; then
    exec 7>&- || true
    kill "$fake_pid" 2>/dev/null || true
    wait "$fake_pid" 2>/dev/null || true
    fake_pid=
  fi
}
stop_pg() {
  if [ -n "$pg_dir" ]; then scripts/pg-throwaway.sh stop "$pg_dir" || true; pg_dir=; fi
}
cleanup() {
  if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; fi
  stop_server
  stop_fake
  stop_pg
  case $results in "$work"/*) ;; *) rm -rf "$work/results" ;; esac
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$target/release/examples/gen_tasks" "$tasks" 90 > "$work/tasks.jsonl"
echo "tasks: $tasks generated ($(du -h "$work/tasks.jsonl" | cut -f1)), issues: $issues," \
  "clients: $clients, duration: $duration per endpoint, webhook rate: $rate/s" >&2

kb_to_mb() { awk -v kb="$1" 'BEGIN { printf "%.1f MB", kb / 1024 }'; }
rss_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# Waits (at most $2 seconds) until GET /readyz answers 200, or the server exits.
wait_ready() {
  local base=$1 deadline=$(( $(date +%s) + $2 ))
  until curl -fs "$base/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "agentry serve exited:" >&2; tail -n 30 "$results/$be-server.log" >&2; return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "not ready in $2 s" >&2; return 1; fi
    sleep 0.05
  done
}

# api METHOD PATH [JSON]: the answer's body; fails on a non-2xx status.
api() {
  local args=(-sS -X "$1" -H "Authorization: Bearer $token" -w '\n%{http_code}') out code
  [ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' --data "$3")
  out=$(curl "${args[@]}" "$base$2")
  code=${out##*$'\n'}
  case $code in
    2??) printf '%s\n' "${out%$'\n'*}" ;;
    *) echo "$1 $2 answered $code: ${out%$'\n'*}" >&2; return 1 ;;
  esac
}

# Samples the server's VmRSS every 0.2 s into $1 until killed (not a readiness wait).
sample_rss() {
  while kill -0 "$server_pid" 2>/dev/null; do
    rss_kb "$server_pid" VmRSS >> "$1" 2>/dev/null || true
    sleep 0.2
  done
}

# measure NAME URL [oha options…]: one oha run; prints a table row and keeps the JSON.
measure() {
  local name=$1 url=$2; shift 2
  local slug; slug=$(printf '%s' "${name%% (*}" | tr -cs 'a-zA-Z0-9' '-' | cut -c1-60)
  local out=$results/$label$slug.json samples=$work/rss-$label$slug
  : > "$samples"
  sample_rss "$samples" & sampler_pid=$!
  "$oha" --no-tui "${oha_json[@]}" -c "$clients" -z "$duration" -w \
    -H "Authorization: Bearer $token" "$@" "$url" > "$out"
  kill "$sampler_pid" 2>/dev/null || true; wait "$sampler_pid" 2>/dev/null || true
  sampler_pid=
  local peak; peak=$(sort -n "$samples" | tail -n 1)
  [ -z "$peak" ] || [ "$peak" -le "$pass_peak" ] || pass_peak=$peak
  jq -r --arg name "$name" --arg rss "$(kb_to_mb "${peak:-0}")" '
    def ms: if . == null then "–" else (. * 100000 | round / 100 | tostring) + " ms" end;
    (.statusCodeDistribution // {}) as $codes
    | ([$codes | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0)
      as $bad
    | ([(.errorDistribution // {}) | to_entries[] | .value] | add // 0) as $errs
    | ([$codes | to_entries[] | .value] | add // 0) as $total
    | "| \($name) | \(.summary.requestsPerSec | round) | \(.latencyPercentiles.p50 | ms) | "
      + "\(.latencyPercentiles.p99 | ms) | \(.latencyPercentiles["p99.9"] | ms) | "
      + "\($bad + $errs) of \($total + $errs) | \($rss) |"' "$out" | tee -a "$table"
}

# state_counts REPO_ID: "state count" of the repository's tasks (the agents' work).
state_counts() {
  local cursor= page q
  : > "$work/states"
  while :; do
    q="/api/tasks?repoId=$1&limit=200${cursor:+&cursor=$cursor}"
    page=$(api GET "$q")
    jq -r '.tasks[].state' <<<"$page" >> "$work/states"
    cursor=$(jq -r '.nextCursor // empty' <<<"$page")
    [ -n "$cursor" ] || break
  done
  sort "$work/states" | uniq -c | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1 }'
}

summary=$work/summary
printf 'load average at the start: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" > "$summary"
port=$(( 20000 + RANDOM % 20000 ))
for be in "${backends[@]}"; do
  data=$work/$be/data
  mkdir -p "$work/$be"
  db_env=()
  if [ "$be" = postgres ]; then
    # Outside $work (0700): the server runs as the postgres user when started by root.
    pg_dir=/tmp/agentry-load-pg.$$
    url=$(scripts/pg-throwaway.sh start "$pg_dir" $(( port + 1 )))
    db_env=(AGENTRY_DATABASE_URL="$url")
  fi
  env "${db_env[@]}" AGENTRY_DATA_DIR="$data" "$bin" migrate >/dev/null 2>&1
  start=$(date +%s)
  env "${db_env[@]}" AGENTRY_DATA_DIR="$data" RUST_LOG=warn "$bin" import "$work/tasks.jsonl" \
    >/dev/null
  echo "[$be] imported $tasks tasks in $(( $(date +%s) - start )) s" >&2
  token=$(env "${db_env[@]}" AGENTRY_DATA_DIR="$data" "$bin" token create --role admin \
    --name load 2>/dev/null)

  # The fake GitHub: one repository with $issues open issues; serves while fd 7 is open.
  mkfifo "$work/$be/fake-in"
  "$target/release/examples/seed_issues" "$work/$be/git" "$issues" \
    < "$work/$be/fake-in" > "$work/$be/fake.json" 2> "$work/$be/fake.log" &
  fake_pid=$!
  exec 7> "$work/$be/fake-in"
  deadline=$(( $(date +%s) + 60 ))
  until [ -s "$work/$be/fake.json" ]; do
    kill -0 "$fake_pid" 2>/dev/null || { cat "$work/$be/fake.log" >&2; exit 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { echo "the fake did not start" >&2; exit 1; }
    sleep 0.05
  done
  fake_url=$(jq -r .baseUrl "$work/$be/fake.json")
  gh_token=$(jq -r .token "$work/$be/fake.json")
  repo_path=$(jq -r .repo "$work/$be/fake.json")

  base=http://127.0.0.1:$port
  secret=load-webhook-secret-$(openssl rand -hex 16)
  env "${db_env[@]}" AGENTRY_DATA_DIR="$data" AGENTRY_BIND="127.0.0.1:$port" \
    AGENTRY_CODEHOST_API_URL="$fake_url" CODEHOST_WEBHOOK_SECRET="$secret" \
    AGENTRY_CLAUDE_BIN="$root/crates/runner/tests/fake-agents/claude" \
    "$bin" serve > "$work/server.out" 2> "$results/$be-server.log" &
  server_pid=$!
  wait_ready "$base" 60
  sleep 1 # let start-up settle before reading the idle RSS (not a readiness wait)
  rss_start=$(rss_kb "$server_pid" VmRSS)

  api PUT /api/secrets/CODEHOST_TOKEN "{\"value\":\"$gh_token\"}" >/dev/null
  repo_id=$(api POST /api/repos "{\"repoUrl\":\"https://github.com/$repo_path\"}" | jq -r .id)
  api POST /api/issues/sync '{}' >/dev/null
  seen=0 cursor=
  while :; do
    page=$(api GET "/api/issues?limit=200${cursor:+&cursor=$cursor}")
    seen=$(( seen + $(jq '.issues | length' <<<"$page") ))
    cursor=$(jq -r '.nextCursor // empty' <<<"$page")
    [ -n "$cursor" ] || break
  done
  [ "$seen" -eq "$issues" ] || { echo "[$be] the issues view holds $seen, not $issues" >&2; exit 1; }

  # A deep cursor, and 1,000 task ids spread over the list.
  cursor=
  : > "$work/ids"
  for i in $(seq 1 "$deep_pages"); do
    page=$(api GET "/api/tasks?limit=200${cursor:+&cursor=$cursor}")
    if [ $(( i % ((deep_pages + 99) / 100) )) -eq 0 ] || [ "$i" -le 10 ]; then
      jq -r '.tasks[0:10][].id' <<<"$page" >> "$work/ids"
    fi
    cursor=$(jq -r '.nextCursor // empty' <<<"$page")
    [ -n "$cursor" ] || { echo "[$be] fewer than $deep_pages pages of tasks" >&2; exit 1; }
  done
  deep=$cursor
  head -n 1000 "$work/ids" | sed "s|^|$base/api/tasks/|" > "$work/id-urls"

  # The webhook body: a merged pull request of the connected repository that no task owns
  # (GitHub's shape, ~12 KB with the text members GitHub sends); signed with the secret.
  pad=$(head -c 9000 /dev/zero | tr '\0' 'x')
  jq -cn --arg repo "$repo_path" --arg pad "$pad" '
    ($repo | split("/")) as [$o, $n]
    | {action: "closed", number: 99999,
       pull_request: {number: 99999, state: "closed", merged: true,
         merged_at: "2026-11-23T12:00:00Z", title: "Load test pull request", body: $pad,
         html_url: "https://github.com/\($repo)/pull/99999",
         head: {ref: "feature/load", sha: "0123456789abcdef0123456789abcdef01234567"},
         base: {ref: "main", sha: "89abcdef0123456789abcdef0123456789abcdef"},
         user: {login: "octo", id: 1}},
       repository: {id: 1, name: $n, full_name: $repo, owner: {login: $o, id: 2},
         html_url: "https://github.com/\($repo)", default_branch: "main"},
       sender: {login: "octo", id: 1}}' | tr -d '\n' > "$work/webhook.json"
  signature=sha256=$(openssl dgst -sha256 -hmac "$secret" -r < "$work/webhook.json" | cut -d' ' -f1)
  delivery=load-$(date +%s%N)

  rss_idle=$(rss_kb "$server_pid" VmRSS)
  printf '\n### %s: %s tasks, %s synced issues\n\nidle RSS: %s after start, %s after set-up\n' \
    "$be" "$tasks" "$issues" "$(kb_to_mb "$rss_start")" "$(kb_to_mb "$rss_idle")" \
    | tee -a "$summary"

  for pass in "${passes[@]}"; do
    label=$be-$pass table=$work/table-$label pass_peak=0
    if [ "$pass" = agents ]; then
      # Enough 3-second agent runs to keep the runner's slots busy for the whole pass.
      n=$(( (6 * dur_secs + 30) * 2 / 3 + 10 ))
      refused=0
      for i in $(seq 1 "$n"); do
        api POST /api/tasks "{\"repoId\":\"$repo_id\",\"title\":\"Load work $i\",\"prompt\":\"Load work $i [fake:sleep=3]\"}" \
          >/dev/null || refused=$(( refused + 1 ))
      done
      [ "$refused" -eq 0 ] || echo "[$be] $refused of $n task creations failed" | tee -a "$summary"
      deadline=$(( $(date +%s) + 60 ))
      until api GET "/api/tasks?repoId=$repo_id&state=running&limit=1" | jq -e '.tasks | length > 0' >/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "[$be] no agent started" >&2; tail -n 20 "$results/$be-server.log" >&2; exit 1; }
        sleep 0.1
      done
      echo "[$be] $n agent tasks created; the first one runs" >&2
    fi
    {
      printf '\n%s, pass "%s"\n\n' "$be" "$pass"
      echo '| endpoint | rps | p50 | p99 | p99.9 | errors | RSS peak |'
      echo '|---|---|---|---|---|---|---|'
    } | tee -a "$summary"
    : > "$table"
    measure 'GET /api/tasks?limit=50' "$base/api/tasks?limit=50"
    measure "GET /api/tasks?limit=50&cursor= ($(( deep_pages * 200 )) tasks in)" \
      "$base/api/tasks?limit=50&cursor=$deep"
    if "$oha" --help 2>/dev/null | grep -q -- '--urls-from-file'; then
      measure 'GET /api/tasks/{id} (1,000 ids)' "$work/id-urls" --urls-from-file
    else
      measure 'GET /api/tasks/{id}' "$(head -n 1 "$work/id-urls")"
    fi
    measure 'GET /api/analytics/costs?days=30' "$base/api/analytics/costs?days=30"
    measure 'GET /api/issues' "$base/api/issues"
    measure "POST /api/webhooks/codehost at $rate/s" "$base/api/webhooks/codehost" \
      -q "$rate" --latency-correction -m POST -T application/json -D "$work/webhook.json" \
      -H "X-GitHub-Event: pull_request" -H "X-GitHub-Delivery: $delivery" \
      -H "X-Hub-Signature-256: $signature"
    cat "$table" >> "$summary"
    printf '\nload average after the pass: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" \
      | tee -a "$summary"
    printf '\nRSS under load: highest sampled %s; VmHWM so far %s\n' \
      "$(kb_to_mb "$pass_peak")" "$(kb_to_mb "$(rss_kb "$server_pid" VmHWM)")" \
      | tee -a "$summary"
    if [ "$pass" = agents ]; then
      printf 'agent tasks by state at the end of the pass: %s\n' "$(state_counts "$repo_id")" \
        | tee -a "$summary"
    fi
  done
  stop_server
  stop_fake
  stop_pg
done

echo
echo "== summary (scripts/load.sh --backend $backend --tasks $tasks --issues $issues" \
  "--duration $duration --clients $clients --rate $rate --agents $agents), $(date -u +%F) =="
cat "$summary"
echo
echo "raw oha output: $results"
