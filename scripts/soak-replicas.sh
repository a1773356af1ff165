#!/usr/bin/env bash
# The soak (docs/soak.md): two `agentry serve` replicas on one throwaway PostgreSQL, the fake
# code host failing a share of its calls, a replica killed with SIGKILL and restarted every
# 20-40 s; at the end, with faults off, it waits for quiescence and checks that nothing was
# lost, doubled or left stuck and that every cost adds up. Exits non-zero on any violation.
#
#   scripts/soak-replicas.sh [--ci] [harness options]
#
# Defaults (the full run): --issues 200 --minutes 10 --fault-rate 0.3 --kill-every 20-40
# --seed 1 --agent-secs 1-8. --ci is the short version CI runs: 40 issues, 2 minutes, the
# debug binary the workspace tests already built. Other options go to the harness
# (crates/soak, `--help`); later options win. SOAK_PG_PORT (default 31433) is the server's
# port; SOAK_KEEP=1 keeps the work directory (it is kept anyway when the soak fails).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/agentry-target}"

ci=0
args=()
for a in "$@"; do
	if [ "$a" = --ci ]; then ci=1; else args+=("$a"); fi
done

if [ "$ci" = 1 ]; then
	# Built alone, like scripts/test-browser.sh does: building the harness with it would
	# unify features across both and rebuild the binary's dependencies.
	cargo build --locked -p agentry --bin agentry
	agentry="$CARGO_TARGET_DIR/debug/agentry"
	defaults=(--issues 40 --minutes 2 --agent-secs 1-4 --quiesce-minutes 4)
else
	cargo build --locked --release -p agentry --bin agentry
	agentry="$CARGO_TARGET_DIR/release/agentry"
	defaults=()
fi
cargo build --locked -p agentry-soak
soak="$CARGO_TARGET_DIR/debug/soak"

work=$(mktemp -d "${TMPDIR:-/tmp}/agentry-soak.XXXXXX")
# The server's directory must be reachable by the postgres user: not inside $work (0700).
pg=$(mktemp -d "${TMPDIR:-/tmp}/agentry-soak-pg.XXXXXX")
status=1
cleanup() {
	scripts/pg-throwaway.sh stop "$pg" || true
	if [ "$status" = 0 ] && [ "${SOAK_KEEP:-0}" != 1 ]; then
		rm -rf "$work"
	else
		echo "soak: work directory kept: $work (replica logs a.log, b.log; the agents' ledger)" >&2
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

url=$(scripts/pg-throwaway.sh start "$pg" "${SOAK_PG_PORT:-31433}")
set +e
"$soak" --agentry "$agentry" --database-url "$url" --work "$work" \
	"${defaults[@]}" "${args[@]}"
status=$?
set -e
exit "$status"
