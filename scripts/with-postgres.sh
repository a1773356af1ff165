#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL server, exporting AGENTRY_TEST_PG_URL and
# AGENTRY_TEST_REQUIRE_PG=1 so the PostgreSQL variant of every backend test runs (and fails
# loudly if the server is unusable). Example: scripts/with-postgres.sh cargo test --workspace
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/agentry-pg.XXXXXX)
port=${AGENTRY_TEST_PG_PORT:-$((20000 + RANDOM % 12000))}  # below the ephemeral range
url=$("$here/pg-throwaway.sh" start "$dir" "$port")
trap '"$here/pg-throwaway.sh" stop "$dir"' EXIT
echo "PostgreSQL test server: $url" >&2
AGENTRY_TEST_PG_URL=$url AGENTRY_TEST_REQUIRE_PG=1 "$@"
