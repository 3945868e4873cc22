"""Seconds per step, tokens/s and peak memory of each parallelism method on one model.

    python bench/trainer_methods.py [--device cpu|cuda] [--steps 20] [--d-model 128] ...

Each method trains the same GPT (same seed, same global batch) under real `torchrun` (or one
process for `single`); the timings are the median `step_time_s` of the steps after a warm-up,
tokens/s = global tokens per step / that median; peak memory is the largest per-rank peak the
trainer logs (`torch.cuda.max_memory_allocated` on CUDA, peak RSS on CPU). The `lora_*` and
`qlora_*` rows train rank-8 adapters on every block linear of the same GPT (QLoRA: NF4 base,
compute in `--precision`), fine-tuning its seeded weights saved as a checkpoint
(`model.init_from`, `--init-from`: LoRA adapts pretrained weights), and report
`trainable_params`; `qat_single` fake-quantizes (torchao)
and `compile_single` compiles each block. On CUDA of known peak, `mfu` is the median of the
trainer's own `mfu`. Prints one JSON object:
{"config": {...}, "methods": {name: {...}}}. Not a test: numbers vary run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke  # noqa: E402
from jobspec.job import JobSpec  # noqa: E402
from workers.launcher import free_port  # noqa: E402

# name: (processes, parallelism, extra train options); global batch is always --batch.
METHODS: dict[str, tuple[int, dict[str, Any], dict[str, Any]]] = {
    "single": (1, {"strategy": "single"}, {}),
    "ddp": (2, {"strategy": "ddp"}, {}),
    "fsdp": (2, {"strategy": "fsdp"}, {}),
    "fsdp_bf16": (2, {"strategy": "fsdp", "fsdp": {"param_dtype": "bf16"}}, {}),
    "fsdp_ac": (2, {"strategy": "fsdp"}, {"activation_checkpointing": True}),
    "tensor": (2, {"strategy": "tensor"}, {}),
    "pipeline_gpipe": (2, {"strategy": "pipeline", "pipeline": {"schedule": "gpipe"}}, {}),
    "pipeline_1f1b": (2, {"strategy": "pipeline", "pipeline": {"schedule": "1f1b"}}, {}),
    "pipeline_interleaved_1f1b": (
        2,
        {
            "strategy": "pipeline",
            "pipeline": {"schedule": "interleaved_1f1b", "stages_per_rank": 2},
        },
        {},
    ),
    "fsdp_tp_2d": (4, {"strategy": "fsdp", "tensor_parallel_size": 2}, {}),
    "lora_single": (1, {"strategy": "single"}, {}),
    "lora_ddp": (2, {"strategy": "ddp"}, {}),
    "lora_fsdp": (2, {"strategy": "fsdp"}, {}),
    "qlora_single": (1, {"strategy": "single"}, {}),
    "qlora_ddp": (2, {"strategy": "ddp"}, {}),
    "qat_single": (1, {"strategy": "single"}, {}),
    "compile_single": (1, {"strategy": "single"}, {"compile": True}),
    # One GPU's ceiling (issue 31): FSDP2 over every process of --gpus (1 is fine), bf16
    # parameters in compute, fp32 master weights and reductions, each block compiled.
    "fsdp_compile": (
        0,
        {"strategy": "fsdp", "fsdp": {"param_dtype": "bf16", "reduce_dtype": "fp32"}},
        {"compile": True},
    ),
    "lora_compile_single": (1, {"strategy": "single"}, {"compile": True}),
    "qlora_compile_single": (1, {"strategy": "single"}, {"compile": True}),
}
# Fine-tuning methods: top-level spec blocks on top of their strategy (same model, same batch).
LORA = {"r": 8, "alpha": 16.0}
FINETUNE: dict[str, dict[str, Any]] = {
    name: {"lora": LORA} | ({"qlora": {}} if name.startswith("qlora") else {})
    for name in METHODS
    if "lora" in name
} | {"qat_single": {"qat": {}}}
# The LoRA rows' `model.init_from` (the trainer gets its checkpoint as `--init-from`).
FROM_START = {"init_from": {"job": 1}}
_PEAK = re.compile(r"peak memory (\d+) bytes")


def method_spec(args: argparse.Namespace, corpus: Path, name: str) -> tuple[int, JobSpec]:
    """(processes, the job spec) of method `name` on `corpus` with the model and batch of
    `args` (`add_model_arguments`; `args.profile_steps` more steps under the profiler)."""
    nproc, parallelism, train = METHODS[name]
    nproc = nproc or args.gpus
    dp = 1 if parallelism["strategy"] in ("tensor", "pipeline") else nproc
    dp //= parallelism.get("tensor_parallel_size", 1)
    finetune = FINETUNE.get(name, {})
    # Profiled steps come after the timed ones (the profiler slows the steps it records).
    profile = (
        {"profile": {"start_step": args.steps + 1, "num_steps": args.profile_steps}}
        if args.profile_steps
        else {}
    )
    if "qlora" in finetune:  # 4-bit weights dequantized to the run's precision
        finetune = finetune | {"qlora": {"compute_dtype": args.precision}}
    # (fp8 is refused with LoRA, QLoRA and QAT at train.precision: not a row of these)
    spec = JobSpec.model_validate(
        {
            "name": f"bench-{name}",
            "seed": 0,
            "data": {"uri": str(corpus)},
            "model": {"n_layers": args.n_layers, "n_heads": args.n_heads,
                      "d_model": args.d_model, "seq_len": args.seq_len,
                      **(FROM_START if "lora" in finetune else {})},
            "parallelism": parallelism,
            "resources": {"procs_per_node": nproc, "device": args.device},
            "optim": {"warmup_steps": 1, "schedule": "constant"},
            "train": {"micro_batch_size": args.batch // dp,
                      "max_steps": args.steps + args.profile_steps,
                      "log_interval_steps": 1, "precision": args.precision,
                      "fp8_recipe": args.fp8_recipe,
                      "tf32": args.tf32 == "on", **train, **profile},
            "eval": {"interval_steps": args.steps + args.profile_steps, "num_batches": 1},
            "checkpoint": {"interval_steps": args.steps + args.profile_steps, "keep_last": 1},
            "sample": {"max_new_tokens": 0},
            **finetune,
        }
    )  # fmt: skip
    return nproc, spec


def median_timed(values_by_step: dict[int, float], args: argparse.Namespace) -> float | None:
    """Median of a metric over the timed steps: after `--warmup`, up to `--steps` (profiled
    steps come after them); None when it has no value there. The bench and the service path
    (bench/service_path.py) both time a run so."""
    kept = [v for step, v in values_by_step.items() if args.warmup < step <= args.steps]
    return statistics.median(kept) if kept else None


def starting_checkpoint(args: argparse.Namespace, corpus: Path, out: Path) -> str:
    """The LoRA rows' `--init-from`: the bench GPT's seeded weights saved as a full checkpoint
    (as the trainer saves one: DCP, `model_optim.model.<name>`). Their values do not move the
    timings; the spec must name weights to adapt all the same."""
    import torch
    import torch.distributed.checkpoint as dcp

    from trainer.models.gpt import GPTConfig, build_model

    spec = method_spec(args, corpus, "single")[1]
    model = build_model(GPTConfig.from_spec(spec.model), device=torch.device("cpu"), seed=0)
    dcp.save({"model_optim": {"model": model.state_dict()}}, checkpoint_id=str(out), no_dist=True)
    return str(out)


def run_method(
    args: argparse.Namespace, corpus: Path, name: str, workdir: Path, init_from: str | None = None
) -> dict:
    """Train `name` for `args.steps` steps (from the checkpoint `init_from`, given for a LoRA
    row); its timings and peak memory."""
    nproc, spec = method_spec(args, corpus, name)
    return run_spec(args, spec, nproc, workdir, init_from)


def run_spec(
    args: argparse.Namespace,
    spec: JobSpec,
    nproc: int,
    workdir: Path,
    init_from: str | None = None,
) -> dict:
    """Train `spec` (its `train.max_steps` steps, timed over `args.warmup` < step <=
    `args.steps`, `args.batch` x `args.seq_len` tokens a step) on `nproc` processes; its
    timings, peak memory and losses, or `{"error": stderr's tail}`."""
    workdir.mkdir(parents=True)
    spec.dump(workdir / "spec.json")
    trainer = ["-m", "trainer", "--spec", str(workdir / "spec.json")]
    trainer += ["--run-dir", str(workdir / "run"), "--checkpoint-dir", str(workdir / "ckpt")]
    if spec.model.init_from is not None:
        assert init_from is not None, f"{spec.name} fine-tunes a checkpoint: give init_from"
        trainer += ["--init-from", init_from]
    if nproc == 1 and spec.parallelism.strategy == "single":
        cmd = [sys.executable, *trainer]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
        cmd += ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", *trainer]
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": path}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:] or proc.stdout[-2000:]}
    events = [json.loads(line) for line in (workdir / "run" / "events.jsonl").open()]
    series: dict[str, dict[int, float]] = {}
    for e in events:
        if e["type"] == "metric":
            for name, value in e["values"].items():
                series.setdefault(name, {})[e["step"]] = value
    step_s = median_timed(series.get("step_time_s", {}), args)
    assert step_s is not None, "no timed step: --steps must exceed --warmup"
    tokens_per_step = args.batch * args.seq_len
    peaks = [int(m) for m in _PEAK.findall(proc.stdout)]
    running = next(e["data"] for e in events if e["type"] == "status")
    mfu = median_timed(series.get("mfu", {}), args)  # CUDA of known peak only
    profile_file = workdir / "ckpt" / "profile" / "rank0.summary.json"
    profile = json.loads(profile_file.read_text()) if profile_file.exists() else None
    shutil.rmtree(workdir / "ckpt", ignore_errors=True)  # a 1B model's is ~12 GB
    return {
        "processes": nproc,
        "trainable_params": running["trainable_params"],
        "seconds_per_step": round(step_s, 5),
        "tokens_per_second": round(tokens_per_step / step_s, 1),
        "peak_memory_bytes_per_rank": max(peaks) if peaks else None,
        "final_loss": round(series["loss"][args.steps], 6),
        "losses": [series["loss"][step] for step in sorted(series["loss"])],
        "mfu": round(mfu, 4) if mfu is not None else None,
        "profile": profile,
    }


def build_corpus(root: Path, size: int) -> Path:
    """A few hundred KB of the Python standard library's source (no downloads)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out, total = root / "corpus", 0
    out.mkdir()
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        (out / path.name).write_bytes(data)
        total += len(data)
        if total >= size:
            break
    return out


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model, batch, device and step arguments `method_spec` reads."""
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp8"], default="fp32")
    p.add_argument("--fp8-recipe", choices=["tensorwise", "rowwise"], default="tensorwise")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    p.add_argument("--gpus", type=int, default=1, help="processes of `fsdp_compile`")
    p.add_argument("--tf32", choices=["on", "off"], default="on", help="train.tf32")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(p)
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after the timed steps, profile this many more (train.profile); the summary "
        "lands in each method's `profile`",
    )
    args = smoke.parse(
        p, steps=3, warmup=1, batch=4, n_layers=1, d_model=32, seq_len=32,
        methods="single,fsdp", profile_steps=2,
    )  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = build_corpus(Path(tmp), 2_000_000)
        names = args.methods.split(",")
        start = None
        if any("lora" in name for name in names):
            start = starting_checkpoint(args, corpus, Path(tmp) / "start")
        for name in names:
            results[name] = run_method(args, corpus, name, Path(tmp) / name, start)
    config = {k: v for k, v in vars(args).items() if k != "methods"}
    print(json.dumps({"config": config, "methods": results}, indent=2))


if __name__ == "__main__":
    main()
