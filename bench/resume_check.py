"""Resume from a checkpoint under real `torchrun`, on CPU (gloo) or one GPU (NCCL).

    python bench/resume_check.py [--device cpu|cuda] [--strategy fsdp|ddp|single] [--nproc 1]
                                 [--model gpt|hf_llama] [--lora]

Trains the same GPT three ways from the same seed: `straight` for 2N steps; `first` for N
steps with a checkpoint at step N (DCP, sharded under FSDP2); `resumed` for 2N steps from that
checkpoint directory, which loads step N and trains N+1..2N. Prints one JSON document with the
largest |loss difference| between `resumed` and `straight` over steps N+1..2N: 0.0 is exact
resume (expected on CPU); on CUDA, kernels with atomics (embedding backward) may differ in
the last bits, so a difference of the order of bf16's epsilon (7.8e-3) x loss is the bound.
Not a test: the suite proves exact resume on CPU; this runs the CUDA path where there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke  # noqa: E402
from bench.trainer_methods import build_corpus  # noqa: E402
from jobspec.job import JobSpec  # noqa: E402
from workers.launcher import free_port  # noqa: E402

# The built-in GPT, or a Llama built by transformers from a config (byte vocabulary, no
# download), which also exercises the Hugging Face and (with --lora) peft paths.
LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "hidden_size": 512, "intermediate_size": 1024,
         "vocab_size": 256, "max_position_embeddings": 512}  # fmt: skip
MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"n_layers": 4, "n_heads": 8, "d_model": 512, "seq_len": 512},
    "hf_llama": {"kind": "hf", "hf": {"from_config": LLAMA}, "seq_len": 512},
    "tiny": {"n_layers": 1, "n_heads": 2, "d_model": 32, "seq_len": 32},  # --smoke
}


def _spec(args: argparse.Namespace, corpus: Path, steps: int, lora: bool) -> JobSpec:
    """`steps` steps of `args.model`; `lora`: adapters on an earlier run's checkpoint."""
    return JobSpec.model_validate(
        {
            "name": "bench-resume",
            "seed": 0,
            "data": {"uri": str(corpus)},
            "model": MODELS[args.model] | ({"init_from": {"job": 1}} if lora else {}),
            "parallelism": {"strategy": args.strategy},
            "resources": {"procs_per_node": args.nproc, "device": args.device},
            "optim": {"warmup_steps": 1, "schedule": "constant"},
            "train": {"micro_batch_size": 8, "max_steps": steps, "log_interval_steps": 1,
                      "precision": args.precision},
            "eval": {"interval_steps": steps, "num_batches": 1},
            "checkpoint": {"interval_steps": args.steps, "keep_last": 2},
            "sample": {"max_new_tokens": 0},
            **({"lora": {"r": 8, "alpha": 16.0}} if lora else {}),
        }
    )  # fmt: skip


def _train(
    args: argparse.Namespace, spec: JobSpec, work: Path, ckpt: Path, start: tuple[str, ...] = ()
) -> dict[int, float]:
    """Run the trainer (`start`: its `--init-from URI`, if any); {step: loss} of its metric
    events."""
    work.mkdir(parents=True)
    spec.dump(work / "spec.json")
    trainer = ["-m", "trainer", "--spec", str(work / "spec.json"), "--run-dir", str(work / "run")]
    trainer += ["--checkpoint-dir", str(ckpt), *start]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(args.nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
           f"127.0.0.1:{free_port()}", *trainer]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": path}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"trainer failed:\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in (work / "run" / "events.jsonl").open()]
    return {e["step"]: e["values"]["loss"] for e in events
            if e["type"] == "metric" and "loss" in e["values"]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--strategy", choices=["single", "ddp", "fsdp"], default="fsdp")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--model", choices=sorted(MODELS), default="gpt")
    p.add_argument("--lora", action="store_true", help="train rank-8 LoRA adapters (peft)")
    p.add_argument("--steps", type=int, default=10, help="N: checkpoint at N, resume to 2N")
    args = smoke.parse(p, steps=2, model="tiny")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = build_corpus(root, 2_000_000)
        n, lora = args.steps, args.lora
        start: tuple[str, ...] = ()
        if lora:  # LoRA adapts trained weights: those of a full run of n steps
            _train(args, _spec(args, corpus, n, lora=False), root / "pre", root / "c0")
            start = ("--init-from", str(root / "c0" / f"step_{n:08d}"))
        spec, half = _spec(args, corpus, 2 * n, lora), _spec(args, corpus, n, lora)
        straight = _train(args, spec, root / "straight", root / "c1", start)
        first = _train(args, half, root / "first", root / "c2", start)
        resumed = _train(args, spec, root / "resumed", root / "c2", start)
    later = range(n + 1, 2 * n + 1)
    out: dict[str, Any] = {
        "config": vars(args),
        "resumed_steps": sorted(resumed),
        "first_matches_straight": all(first[s] == straight[s] for s in range(1, n + 1)),
        "max_abs_loss_diff_after_resume": max(abs(resumed[s] - straight[s]) for s in later),
        "loss_at_2n": {"straight": straight[2 * n], "resumed": resumed[2 * n]},
    }
    out["resumed_only_later_steps"] = out["resumed_steps"] == list(later)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
