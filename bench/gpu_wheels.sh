#!/usr/bin/env bash
# Wheels for a lent GPU machine: its image has Python 3.12 and torch, but neither a package
# registry nor our server and trainer extras. This fills .whl/ here (where PyPI is reachable)
# with the cp312 manylinux wheels that the image lacks; bench/cuda_check.sh installs them
# there into /tmp/site. The set is what `pip install --dry-run --report` resolves for the
# base dependencies and the server and trainer extras at this checkout's versions (the
# .venv's `pip freeze`), minus what the image holds: torch, numpy, pyarrow, transformers,
# peft, accelerate, ... stay the image's (a --target install shadows them). It leaves out
# what the embedded default never imports: redis (Redis broker/limits storage), uv
# (entrypoint.requirements venvs, which need an index anyway), py-spy (the watchdog falls
# back to faulthandler) and uvicorn[standard]'s httptools/watchfiles/websockets.
# bitsandbytes ships a library per CUDA, ROCm and XPU version (43 MB): only the CUDA 13
# ones (the image's torch is cu130) and the CPU one are kept, so .whl/ stays near 36 MB of
# the 64 MiB a call carries.
#
#   bash bench/gpu_wheels.sh            # then run bench/cuda_check.sh with .whl carried
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
  manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
wheels=(
  # the SDK and the service (API, Celery worker, SQLite via SQLAlchemy and alembic)
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  httpx-sse==0.4.3 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2
  fastapi_offline==1.7.7 uvicorn==0.54.0 python-multipart==0.0.34 pydantic-settings==2.16.3
  python-dotenv==1.2.4 SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3
  celery==5.7.0 kombu==5.7.0 amqp==5.4.2 vine==5.1.0 billiard==4.3.2 tzlocal==5.4.5
  click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 prompt_toolkit==3.0.53
  wcwidth==0.9.4 orjson==3.13.0 zstandard==0.25.0 limits==5.8.0 Deprecated==1.3.1
  standardwebhooks==1.1.0 PyJWT==2.15.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  # imported at module level by core/ and workers/ even on SQLite (no libpq on the image)
  psycopg==3.3.9 psycopg-binary==3.3.9
  # the trainer's QAT and QLoRA
  torchao==0.18.0 bitsandbytes==0.50.2
)
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${wheels[@]}"
python3 - <<'PY'
import pathlib, re, zipfile
for wheel in pathlib.Path(".whl").glob("bitsandbytes-*.whl"):
    keep = re.compile(r"libbitsandbytes_(cuda13\d+|cpu)\.so$")
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [i.filename for i in src.infolist()]
        dropped = {n for n in names if n.endswith(".so") and not keep.search(n)}
        for item in src.infolist():
            if item.filename in dropped:
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):  # no rows for the dropped files
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if r.split(",", 1)[0] not in dropped).encode()
            dst.writestr(item, data)
    slim.replace(wheel)
PY
ls .whl | sed 's/-[0-9].*//' | sort | uniq -d | grep . && { echo "two versions of one package" >&2; exit 1; }
du -sh .whl
