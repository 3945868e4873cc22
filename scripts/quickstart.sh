#!/usr/bin/env bash
# The README's first command on a fresh machine: .venv, torch==2.13.0 first, then Torchyard
# (scripts/setup.sh, skipped when nothing changed), then `torchyard quickstart`, which trains a
# small GPT end to end on the embedded default. Arguments go to `torchyard quickstart`
# (e.g. `bash scripts/quickstart.sh --steps 200 --procs 1`; `--help` lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "Torchyard needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
    exit 1
  }
  echo "creating .venv and installing torch==2.13.0 and Torchyard (first run only) ..." >&2
fi
bash scripts/setup.sh
exec .venv/bin/torchyard quickstart "$@"
