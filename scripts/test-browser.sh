#!/usr/bin/env bash
# The web frontend's checks in a real browser (docs/frontend.md):
#   1. the API types of the pages (crates/web/types/api.d.ts) regenerated from the binary's own
#      OpenAPI document must equal the committed file, so an API change comes with its types;
#   2. tsc --checkJs over the pages' JavaScript against those types;
#   3. the browser tests (crates/web/browser-tests, Node's test runner + playwright-core) in
#      headless Chromium against the real `agentry` binary on data imported with
#      `agentry import`, the fake GitHub, and a second origin for CORS. Screenshots of every
#      page go to artifacts/screenshots/.
#
# Needs Node.js 20+ with npm, and Chromium at /usr/bin/chromium (or $CHROMIUM); Playwright
# never downloads a browser. `cargo build` and `cargo test` need none of this.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target="${CARGO_TARGET_DIR:-$root/target}"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "test-browser: no Chromium at $CHROMIUM (apt-get install chromium, or set CHROMIUM)" >&2
    exit 2
fi

cargo build --quiet --locked --bin agentry
cargo build --quiet --locked -p agentry-fake-github --example serve
export AGENTRY_BIN="$target/debug/agentry"
export FAKE_GITHUB_BIN="$target/debug/examples/serve"

cd crates/web
npm ci --no-audit --no-fund --loglevel=error

echo "== API types"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$AGENTRY_BIN" openapi > "$work/openapi.json"
node tools/gen-api-types.mjs "$work/openapi.json" --check

echo "== tsc --checkJs"
npx --no-install tsc -p jsconfig.json

echo "== browser tests ($("$CHROMIUM" --version 2>/dev/null | head -1))"
SCREENSHOT_DIR="$root/artifacts/screenshots" node --test --test-concurrency=1 --test-reporter=spec browser-tests/
echo "screenshots: $root/artifacts/screenshots"
