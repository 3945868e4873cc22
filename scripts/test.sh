#!/usr/bin/env bash
# The test suite, on a fresh machine too: services up, venv installed, ruff and mypy (config
# in pyproject.toml), then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
bash scripts/browser.sh
bash scripts/setup.sh
. .venv/bin/activate
# Lint and types first: mypy takes about a minute cold, seconds with its cache (.mypy_cache/).
ruff check .
ruff format --check .
mypy
exec python -m pytest "$@"
