#!/usr/bin/env bash
# Create .venv and install Torchyard into it: torch==2.13.0 FIRST (the CPU wheel on a CPU host,
# the CUDA build on a GPU host), then the project with its server, trainer and test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
stamp=.venv/.torchyard-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip >/dev/null
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[all,test]"
  touch "$stamp"
fi
# openapi-python-client for tests/integration/api/contract/test_sdk_generation.py, in a venv of its own:
# it pins typer<0.28, older than the one the CLI runs on.
SDKGEN=.venv/sdkgen
SDKGEN_VERSION=0.29.1
if ! "$SDKGEN/bin/openapi-python-client" --version 2>/dev/null | grep -q "$SDKGEN_VERSION"; then
  python -m venv "$SDKGEN"
  "$SDKGEN/bin/python" -m pip install -q "openapi-python-client==$SDKGEN_VERSION"
fi
