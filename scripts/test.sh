#!/usr/bin/env bash
# The test suite, on a fresh machine too: services up, venv installed, ruff and mypy (config
# in pyproject.toml), then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
# `bash scripts/test.sh --repeat N MODULE...`: the flake ledger: runs the modules N times, each
# time in another random order (pytest-randomly's seed), and prints each one's pass rate.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=0
if [ "${1:-}" = "--repeat" ]; then
  repeat=$2
  shift 2
fi
bash scripts/services.sh
# A one-node Slurm cluster for the Slurm pool's tests (tests/integration/workers/test_slurm.py).
if [ "$(id -u)" = 0 ]; then bash scripts/slurm.sh; fi
bash scripts/browser.sh
bash scripts/setup.sh
. .venv/bin/activate
# What the selected tests need of this host (root, bwrap, cgroups, namespaces, Slurm, ...), said
# now rather than as skips at the end; and a test that skips anyway fails the run (issue 44).
python -m tests.support.capabilities "$@"
export TORCHYARD_TEST_NO_SKIPS=1
# The fault tests' latency figures (tests/support/figures.py), printed in the summary.
export TORCHYARD_TEST_FIGURES="$PWD/.test-figures.jsonl"
rm -f "$TORCHYARD_TEST_FIGURES"
if [ "$repeat" -gt 0 ]; then
  exec python -m tests.support.flakes --repeat "$repeat" "$@"
fi
# Lint and types first: mypy takes about a minute cold, seconds with its cache (.mypy_cache/).
ruff check .
ruff format --check .
mypy
# Several pytest-xdist workers: most tests wait on subprocesses (torchrun, Celery workers,
# uvicorn, Chromium), so more workers than cores pay off; `--dist loadfile` keeps each module on
# one worker, so its module-scoped servers and reference runs are built once. Each worker has its
# own Postgres database, Redis database, ports and temp dirs (tests/conftest.py).
# Each run writes its modules' seconds to .test-module-seconds.json (tests/module_seconds.json's
# source). TORCHYARD_TEST_LONGEST_FIRST=1 hands modules out longest first (conftest sorts them,
# xdist's own reorder by test count is turned off); not the default yet: its first two runs each
# met a cross-worker test bug that the old order rarely lines up (both fixed), and others may wait.
# TORCHYARD_TEST_WORKERS=0 runs in this process; `-m "not long"` skips the long fault scenarios.
export TORCHYARD_TEST_MODULE_SECONDS="$PWD/.test-module-seconds.json"
order=()
if [ "${TORCHYARD_TEST_LONGEST_FIRST:-0}" = 1 ]; then order=(--no-loadscope-reorder); fi
exec python -m pytest -n "${TORCHYARD_TEST_WORKERS:-4}" --dist loadfile "${order[@]}" "$@"
