#!/usr/bin/env bash
# Issue 50 on one lent GPU (never in tests or CI, which have no GPU). Stages, run in the order
# given (a comma-separated list), each bounded by its own timeout and by DEADLINE (seconds
# from the start, default 570) so that one call's output always comes back:
#   tests    pytest -m cuda (tests/cuda: FSDP2 on one GPU, resume, float8, QLoRA's 4-bit layers)
#   small    float8 on a small GPT (bf16 vs fp8 tensorwise and rowwise)
#   big      the ~1B GPT (20 x d2048, 2048 tokens, 8 rows a step), FSDP2 + compile, 200 steps
#            of bf16 then fp8 tensorwise: MFU, the speedup, the loss curves' distance
#   profile  the same 1B GPT in bf16, 25 timed steps then 10 under torch.profiler (where the
#            time between its MFU and 0.60 goes: kernels, idle, optimizer, casts)
#   llama    Llama-3-8B's shape from its config, LoRA and QLoRA SFT at 4096 tokens with
#            activation checkpointing (bench.llama8b)
#   check = tests,small (the first call's two)
#     bash bench/gpu_round2.sh tests,llama,profile
# Wheels: bench/gpu_wheels.sh fills .whl/ here (carry it); OUT=<dir> keeps the logs and JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=${1:-check}
stages=${stages/check/tests,small}
DEADLINE=${DEADLINE:-570}
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
# a stage's timeout: its own bound or what is left before DEADLINE, whichever is less
bound() { local left=$((DEADLINE - SECONDS - 15)); echo $(( $1 < left ? $1 : left )); }
for stage in ${stages//,/ }; do
  t0=$SECONDS
  if [ "$(bound 60)" -lt 60 ]; then echo "[gpu] $stage: skipped, too little time left"; continue; fi
  case $stage in
  tests)
    timeout "$(bound 170)" python3 -m pytest -q -m cuda --confcutdir=tests/cuda \
      -p no:cacheprovider --durations=0 tests/cuda 2>&1 | tee "$OUT/cuda_tests.log" | tail -30 ;;
  small)
    timeout "$(bound 150)" python3 -m bench.float8 "${small[@]}" --method compile_single \
      --steps 60 --warmup 10 --recipes tensorwise,rowwise > "$OUT/float8_small.json" ;;
  big)
    timeout "$(bound 400)" python3 -m bench.float8 "${big[@]}" --steps 200 --warmup 20 \
      --recipes tensorwise > "$OUT/float8_1b.json" ;;
  profile)
    timeout "$(bound 140)" python3 -m bench.trainer_methods "${big[@]}" --precision bf16 \
      --methods fsdp_compile --steps 25 --warmup 10 --profile-steps 10 > "$OUT/profile_1b.json"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
for m, r in d["methods"].items():
    print(m, {k: r.get(k) for k in ("tokens_per_second", "mfu", "peak_memory_bytes_per_rank")},
          (r.get("error") or "")[-800:])
    print(json.dumps(r.get("profile"), indent=1)[:6000])' "$OUT/profile_1b.json" ;;
  llama)
    timeout "$(bound 240)" python3 -m bench.llama8b --device cuda --seq-len 4096 --steps 12 \
      --warmup 4 > "$OUT/llama8b.json"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
for m, r in d["runs"].items():
    print(m, {k: r.get(k) for k in ("tokens_per_second", "peak_memory_bytes_per_rank",
          "trainable_params", "final_loss", "losses")}, (r.get("error") or "")[-800:])' \
      "$OUT/llama8b.json" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "[gpu] $stage: $((SECONDS - t0)) s"
done
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
