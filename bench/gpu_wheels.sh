#!/usr/bin/env bash
# Wheels for a lent GPU machine: its image has Python 3.12 and torch, but neither a package
# registry nor our server and trainer extras. This fills .whl/ here (where PyPI is reachable)
# with the cp312 manylinux wheels that the image lacks; bench/cuda_check.sh installs them
# there into /tmp/site. The set is what `pip install --dry-run --report` resolves for the
# server, the SDK and the trainer's extras at this checkout's versions, minus what the image
# holds (torch, numpy, peft, transformers, ... stay the image's). bitsandbytes ships a
# library per CUDA and ROCm version (43 MB): only the CUDA 13 ones (the image's torch is
# cu130) and the CPU one are kept, so .whl/ stays near 32 MB of the 64 MiB a call carries.
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
  fastapi==0.165.0 uvicorn==0.54.0 pydantic-settings==2.16.3 SQLAlchemy==2.1.9 alembic==1.20.1
  psycopg==3.3.9 psycopg-binary==3.3.9 celery==5.7.0 python-multipart==0.0.34
  fastapi_offline==1.7.7 orjson==3.13.0 zstandard==0.25.0 PyJWT==2.15.1 cryptography==50.0.2
  standardwebhooks==1.1.0 limits==5.8.0 pydantic==2.14.4 httpx-sse==0.4.3 pydantic_core==2.50.5
  vine==5.1.0 annotated-types==0.8.0 billiard==4.3.2 cffi==2.1.1 click-didyoumean==0.3.1
  click-plugins==1.1.1.2 click-repl==0.4.1 Deprecated==3.0.1 kombu==5.7.0 amqp==5.4.2
  opentelemetry-api==1.45.2 prompt_toolkit==3.0.53 python-dotenv==1.2.4 starlette==1.10.0
  typing-inspection==0.4.5 wcwidth==0.9.4 Mako==1.4.3 pycparser==3.12 tzlocal==5.4.5
  torchao==0.18.0 bitsandbytes==0.50.2
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${wheels[@]}"
python3 - <<'PY'
import pathlib, re, zipfile
for wheel in pathlib.Path(".whl").glob("bitsandbytes-*.whl"):
    keep = re.compile(r"libbitsandbytes_(cuda13\d+|cpu)\.so$")
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if not item.filename.endswith(".so") or keep.search(item.filename):
                dst.writestr(item, src.read(item))
    slim.replace(wheel)
PY
du -sh .whl
