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
