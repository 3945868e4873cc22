#!/usr/bin/env bash
# The test suite, on a fresh machine too: services up, venv installed, then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
bash scripts/browser.sh
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest "$@"
