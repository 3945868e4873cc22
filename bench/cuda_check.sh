#!/usr/bin/env bash
# The trainer's CUDA paths on one lent GPU (never in tests or CI, which have no GPU):
# bf16 and fp32 single-GPU training, LoRA, QLoRA (bitsandbytes NF4), QAT (torchao) and
# torch.compile, each through bench/trainer_methods.py, with tokens/s, MFU and peak memory.
#
#   bash bench/cuda_check.sh            # OUT=<dir> keeps the JSON; .whl/ wheels are installed
#
# The GPU image has torch but not pydantic, orjson, zstandard, torchao or bitsandbytes: a
# `.whl/` folder of cp312 manylinux wheels, if present, is installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, torchao, bitsandbytes, peft, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0),
      "torchao", torchao.__version__, "bitsandbytes", bitsandbytes.__version__,
      "peft", peft.__version__, "transformers", transformers.__version__)'
# A 12-layer d=1024 GPT (~150M parameters + embeddings), 16 x 1024 tokens per step.
model=(--n-layers 12 --n-heads 16 --d-model 1024 --seq-len 1024 --batch 16 --threads 4)
python3 bench/trainer_methods.py --device cuda --precision bf16 "${model[@]}" --steps 40 \
  --warmup 10 --methods single,lora_single,qlora_single,qat_single,compile_single \
  | tee "$OUT/methods_bf16.json"
python3 bench/trainer_methods.py --device cuda --precision fp32 "${model[@]}" --steps 30 \
  --warmup 10 --methods single | tee "$OUT/methods_fp32.json"
