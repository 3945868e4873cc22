#!/usr/bin/env bash
# The trainer at one lent GPU's limit (never in tests or CI, which have no GPU), issue 31:
#  1. a ~1B GPT (20 layers, d2048, 16 heads of 128, 2048 tokens, 8 sequences per step), bf16,
#     FSDP2 over --gpus processes, every block compiled: tokens/s and MFU (6N + 12 L d T),
#     then 10 more steps under torch.profiler (train.profile; summary in the JSON);
#  2. LoRA r8 and QLoRA (NF4) on the same model, compiled, vs full fine-tuning;
#  3. fp32 with and without TF32 (train.tf32) on a 12-layer d1024 GPT;
#  4. the service path: one job through the embedded-default API and worker against the same
#     spec run by the bench directly (bench/service_path.py), with the sys/gpu_* series.
#
#   bash bench/cuda_check.sh            # OUT=<dir> keeps the JSON; .whl/ wheels are installed
#
# The GPU image has torch but not our server and trainer extras: bench/gpu_wheels.sh fills
# `.whl/` here with cp312 manylinux wheels, which this installs into /tmp/site first.
# Checkpoints and compiler caches go to /dev/shm when it has 40 GB free (a 1B model's
# checkpoint is ~12 GB, and each method's is deleted after it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
shm=$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)
if [ -z "${TMPDIR:-}" ] && [ "${shm:-0}" -gt 40000000 ]; then export TMPDIR=/dev/shm; fi
df -h "${TMPDIR:-/tmp}" | tail -1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit \
  --format=csv,noheader
python3 -c 'import torch, torchao, bitsandbytes, peft, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0),
      "torchao", torchao.__version__, "bitsandbytes", bitsandbytes.__version__,
      "peft", peft.__version__, "transformers", transformers.__version__)'
python3 - <<'PY'
import torch  # the card's bf16 matrix-product ceiling as found (random data, median of 20)
a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(5):
    a @ b
times = []
for _ in range(20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); a @ b; end.record(); torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
print("bf16 8192^3 product: %.0f TFLOP/s" % (2 * 8192**3 / sorted(times)[10] / 1e12))
PY
big=(--device cuda --precision bf16 --n-layers 20 --n-heads 16 --d-model 2048 --seq-len 2048
     --batch 8 --threads 4 --steps 25 --warmup 10)
small=(--device cuda --n-layers 12 --n-heads 16 --d-model 1024 --seq-len 1024 --batch 16
       --threads 4)
timeout 200 python3 bench/trainer_methods.py "${big[@]}" --profile-steps 10 \
  --methods fsdp_compile | tee "$OUT/big_fsdp.json"
timeout 130 python3 bench/trainer_methods.py "${big[@]}" --methods lora_compile_single \
  | tee "$OUT/big_lora.json"
if [ -f bench/service_path.py ]; then
  timeout 150 python3 bench/service_path.py "${small[@]}" --precision bf16 --method single \
    --steps 300 --warmup 20 | tee "$OUT/service.json"
fi
for tf32 in off on; do
  timeout 60 python3 bench/trainer_methods.py "${small[@]}" --precision fp32 --steps 20 \
    --warmup 8 --methods single --tf32 $tf32 | tee "$OUT/fp32_tf32_$tf32.json"
done
timeout 150 python3 bench/trainer_methods.py "${big[@]}" --methods qlora_compile_single \
  | tee "$OUT/big_qlora.json"
python3 - "$OUT" <<'EOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        doc = json.loads(f.read_text())
    except ValueError:
        print(f.name, "unreadable"); continue
    for name, r in doc.get("methods", {}).items():
        print(f.name, name, {k: r.get(k) for k in ("tokens_per_second", "mfu",
              "peak_memory_bytes_per_rank")}, (r.get("error") or "")[-600:])
    if "service" in doc:
        print(f.name, "service_vs_bench", doc.get("service_vs_bench"))
EOF
