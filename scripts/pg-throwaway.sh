#!/usr/bin/env bash
# Starts or stops a throwaway PostgreSQL server for the test suite.
#   scripts/pg-throwaway.sh start DIR [PORT]   prints the server URL
#   scripts/pg-throwaway.sh stop DIR
# Installs Debian's postgresql package when no server binaries are present (root only).
# The server listens on 127.0.0.1 only, with fsync off: test data is disposable.
set -euo pipefail
cmd=${1:?usage: pg-throwaway.sh start|stop DIR [PORT]}
dir=${2:?give a scratch directory}
port=${3:-31432}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }  # initdb refuses root

case $cmd in
start)
  bin=$(pg_bin || true)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "installing postgresql from Debian's packages" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    bin=$(pg_bin)
  fi
  rm -rf "$dir"; mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; fi
  as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
        --no-sync --no-instructions >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        start >/dev/null \
    || { cat "$dir/server.log" >&2; exit 1; }
  echo "postgres://postgres@127.0.0.1:$port/postgres"
  ;;
stop)
  bin=$(pg_bin)
  as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  ;;
*) echo "usage: pg-throwaway.sh start|stop DIR [PORT]" >&2; exit 2 ;;
esac
