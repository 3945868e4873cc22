#!/usr/bin/env bash
# Issue 50 on one lent GPU (never in tests or CI, which have no GPU), in two stages so that a
# failure in the first costs little of the device time:
#   bash bench/gpu_round2.sh check   # ~3 min: the cuda tests (pytest -m cuda), float8 on a
#                                    # small GPT (bf16 vs fp8 tensorwise and rowwise)
#   bash bench/gpu_round2.sh big     # ~5 min: the ~1B GPT (20 x d2048, 2048 tokens, 8 rows a
#                                    # step), FSDP2 + compile, 200 steps of bf16 then fp8
#                                    # tensorwise: MFU, the speedup, the loss curves' distance
#   bash bench/gpu_round2.sh llama   # Llama-3-8B's shape from its config, LoRA and QLoRA SFT
#                                    # at 4096 tokens with activation checkpointing
#                                    # (bench.llama8b; not yet run on a GPU)
# Wheels: bench/gpu_wheels.sh fills .whl/ here (carry it); OUT=<dir> keeps the logs and JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-check}
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
shm=$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)
if [ -z "${TMPDIR:-}" ] && [ "${shm:-0}" -gt 40000000 ]; then export TMPDIR=/dev/shm; fi
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, torchao, transformers, peft, bitsandbytes
print("torch", torch.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0),
      "torchao", torchao.__version__, "transformers", transformers.__version__,
      "peft", peft.__version__, "bitsandbytes", bitsandbytes.__version__)' 2>&1 | grep -v "^W"
small=(--device cuda --n-layers 8 --n-heads 8 --d-model 1024 --seq-len 1024 --batch 16
       --threads 4)
big=(--device cuda --method fsdp_compile --gpus 1 --n-layers 20 --n-heads 16 --d-model 2048
     --seq-len 2048 --batch 8 --threads 4)
if [ "$stage" = check ]; then
  timeout 200 python3 -m pytest -q -m cuda --confcutdir=tests/cuda -p no:cacheprovider \
    tests/cuda 2>&1 | tee "$OUT/cuda_tests.log" | tail -30
  timeout 150 python3 -m bench.float8 "${small[@]}" --method compile_single --steps 60 \
    --warmup 10 --recipes tensorwise,rowwise > "$OUT/float8_small.json"
elif [ "$stage" = big ]; then
  timeout 400 python3 -m bench.float8 "${big[@]}" --steps 200 --warmup 20 \
    --recipes tensorwise > "$OUT/float8_1b.json"
else
  timeout 500 python3 -m bench.llama8b --device cuda --seq-len 4096 --steps 12 --warmup 4 \
    > "$OUT/llama8b.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
for m, r in d["runs"].items():
    print(m, {k: r.get(k) for k in ("tokens_per_second", "peak_memory_bytes_per_rank",
          "trainable_params", "final_loss")}, (r.get("error") or "")[-800:])' "$OUT/llama8b.json"
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("float8_*.json")):
    try:
        doc = json.loads(f.read_text())
    except ValueError:
        print(f.name, "unreadable"); continue
    for name, r in doc["runs"].items():
        print(f.name, name, {k: r.get(k) for k in ("tokens_per_second", "mfu", "speedup",
              "curve", "peak_memory_bytes_per_rank", "final_loss")}, (r.get("error") or "")[-800:])
PY
