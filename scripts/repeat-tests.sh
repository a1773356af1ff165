#!/usr/bin/env bash
# Runs the whole test suite N times to find flaky tests; reports each run's result and
# time, then the counts. With --load, a CPU hog (one busy loop per core) runs beside the
# suite, as on a loaded CI machine; it is stopped at the end whatever happens.
#
# Usage: scripts/repeat-tests.sh N [--load] [-- extra cargo test arguments]
# Example: scripts/repeat-tests.sh 10 --load
# Each failed run's output is kept in the log directory printed at the end. Exits non-zero
# if any run failed. Combine with scripts/with-postgres.sh to soak the PostgreSQL variants.
set -uo pipefail

usage() {
	echo "usage: $0 N [--load] [-- cargo test arguments]" >&2
	exit 2
}

[ $# -ge 1 ] || usage
runs=$1
shift
case $runs in '' | *[!0-9]* | 0) usage ;; esac
load=0
extra=()
while [ $# -gt 0 ]; do
	case $1 in
	--load) load=1 ;;
	--)
		shift
		extra=("$@")
		break
		;;
	*) usage ;;
	esac
	shift
done

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
logs=$(mktemp -d "${TMPDIR:-/tmp}/agentry-repeat-tests.XXXXXX")

hogs=()
stop_hogs() {
	for pid in "${hogs[@]}"; do
		kill "$pid" 2>/dev/null
	done
	for pid in "${hogs[@]}"; do
		wait "$pid" 2>/dev/null
	done
	hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

# Build everything once, so the runs time the tests, not the compiler.
echo "building the test binaries..." >&2
if ! cargo test --workspace --no-run "${extra[@]}" >"$logs/build.log" 2>&1; then
	cat "$logs/build.log" >&2
	echo "the build failed" >&2
	exit 1
fi

if [ "$load" = 1 ]; then
	cores=$(nproc 2>/dev/null || echo 2)
	for _ in $(seq "$cores"); do
		# A busy loop of the shell itself: no output, no files.
		(while :; do :; done) &
		hogs+=("$!")
	done
	echo "load: $cores busy loops (${hogs[*]})" >&2
fi

passed=0
failed=0
for i in $(seq "$runs"); do
	log="$logs/run-$i.log"
	start=$(date +%s.%N)
	cargo test --workspace "${extra[@]}" >"$log" 2>&1
	status=$?
	took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	if [ "$status" = 0 ]; then
		passed=$((passed + 1))
		echo "run $i/$runs: ok (${took} s)"
		rm -f "$log"
	else
		failed=$((failed + 1))
		echo "run $i/$runs: FAILED (${took} s), output in $log"
		# The failing tests, as libtest names them.
		grep -E '^test .* \.\.\. FAILED$|^    [a-z_:0-9]+$' "$log" | sed 's/^/    /' | sort -u
	fi
done

stop_hogs
echo "$passed passed, $failed failed of $runs runs$([ "$load" = 1 ] && echo ' (under load)'); logs: $logs"
[ "$failed" = 0 ]
