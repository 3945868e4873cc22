#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser tests (tests/e2e), which
# drive it with Playwright's `executable_path`: Playwright never downloads a browser of its own.
# Installs it with apt when absent (needs root then); exits non-zero when that fails, so the
# browser tests fail loudly rather than skip. Also Node, which runs the pages' formatters
# (api/static/js/util.js) for tests/unit/torchyard/test_client_units.py.
set -euo pipefail
CHROMIUM=${TORCHYARD_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "browser: installing Debian's chromium" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
[ -x "$CHROMIUM" ] || { echo "browser: $CHROMIUM is still missing" >&2; exit 1; }
echo "browser: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")" >&2
if ! command -v node >/dev/null; then
  echo "browser: installing Debian's nodejs" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null
fi
command -v node >/dev/null || { echo "browser: node is still missing" >&2; exit 1; }
