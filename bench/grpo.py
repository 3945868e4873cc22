"""Seconds per GRPO step of the built-in trainer against TRL's `GRPOTrainer` on the same model.

    python -m bench.grpo [--hidden-size 128] [--layers 4] [--group-size 8] [--prompts 4]
                         [--max-new-tokens 64] [--steps 8] [--warmup 2]

One small Llama (from a config, with the locally trained ChatML BPE of
`demos.offline_llama`) and one set of prompts; each step samples `--group-size` completions
of `--prompts` prompts (temperature 1, at most `--max-new-tokens`), grades them by the share of
lower-case letters and takes one update (beta 0, one iteration). Ours is `python -m trainer`
(one process, fp32, its `step_time_s`; Hugging Face models decode with transformers' KV
cache); TRL's is `GRPOTrainer.train()` in this process (trl
1.16, CPU, fp32: sampling with `transformers`' `generate` and its KV cache), timed per step by
a callback. Both medians leave out `--warmup` steps. Prints one JSON object: {"config",
"ours": {...}, "trl": {...}, "ours_vs_trl"}, where `ours_vs_trl` is TRL's median step time over
ours (above 1: ours is faster). Completions per second count completions sampled and trained
on per step. Not a test: numbers vary run to run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke  # noqa: E402
from bench._common import emit, note  # noqa: E402

LOWER = """
def grade(sample, item):
    text = sample["output_text"]
    return sum(c.islower() for c in text) / max(len(text), 1)
"""
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa")


def lower_share(completions: list[Any], **_: Any) -> list[float]:
    """TRL's reward function: `LOWER`'s score of each (plain-text) completion."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.islower() for ch in t) / max(len(t), 1) for t in texts]


def write_prompts(path: Path, count: int) -> list[str]:
    """`count` short plain prompts, as `prompt` records in the JSONL `path`; returns them."""
    prompts = [f"{WORDS[i % len(WORDS)]} {i}: " for i in range(count)]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return prompts


def build_model(out: Path, args: argparse.Namespace) -> Path:
    from demos.offline_llama import ModelShape, build_model_dir

    shape = ModelShape(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden_size // 32),
        intermediate_size=2 * args.hidden_size,
        max_position_embeddings=256,
    )
    return build_model_dir(out, shape=shape)


def run_ours(args: argparse.Namespace, model_dir: Path, data: Path, work: Path) -> dict[str, Any]:
    steps = args.steps
    spec = {
        "name": "bench-grpo",
        "seed": 0,
        "model": {"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": 128},
        "data": {"uri": str(data), "format": "prompt", "eval_fraction": 0.2},
        "method": {
            "kind": "grpo",
            "grpo": {
                "group_size": args.group_size,
                "max_new_tokens": args.max_new_tokens,
                "temperature": 1.0,
                "graders": [{"type": "python", "name": "lower", "source": LOWER}],
            },
        },
        "parallelism": {"strategy": "single"},
        "resources": {"procs_per_node": 1, "device": "cpu"},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"},
        "train": {
            "micro_batch_size": args.prompts,
            "max_steps": steps,
            "log_interval_steps": 1,
            "precision": "fp32",
        },
        "eval": {"interval_steps": steps, "num_batches": 1},
        "checkpoint": {"interval_steps": steps, "keep_last": 1},
        "sample": {"max_new_tokens": 0},
    }
    spec_path = work / "ours.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "trainer", "--spec", str(spec_path), "--run-dir",
           str(work / "run"), "--checkpoint-dir", str(work / "ckpt")]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the trainer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    wall = time.perf_counter() - started
    events = [json.loads(line) for line in (work / "run" / "events.jsonl").open()]
    metrics = [e for e in events if e["type"] == "metric" and "step_time_s" in e["values"]]
    times = [e["values"]["step_time_s"] for e in metrics if e["step"] > args.warmup]
    lengths = [
        e["values"]["completion_length"] for e in metrics if "completion_length" in e["values"]
    ]
    step_s = statistics.median(times)
    return {
        "step_s": step_s,
        "completions_per_s": args.prompts * args.group_size / step_s,
        "mean_completion_length": statistics.mean(lengths) if lengths else None,
        "wall_s": wall,
    }


def run_trl(
    args: argparse.Namespace, model_dir: Path, prompts: list[str], work: Path
) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    marks: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            marks.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=lower_share,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
        callbacks=[Timer()],
    )
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout is JSON
        trainer.train()
    wall = time.perf_counter() - started
    times = [end - begin for begin, end in zip(marks[::2], marks[1::2], strict=False)]
    timed = times[args.warmup :] or times
    lengths = [
        h["completions/mean_length"]
        for h in trainer.state.log_history
        if "completions/mean_length" in h
    ]
    step_s = statistics.median(timed)
    return {
        "step_s": step_s,
        "completions_per_s": args.prompts * args.group_size / step_s,
        "mean_completion_length": statistics.mean(lengths) if lengths else None,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out")
    args = smoke.parse(
        parser, hidden_size=32, layers=1, group_size=2, prompts=2, max_new_tokens=4, steps=3,
        warmup=1,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        work = Path(tmp)
        note("building the model ...")
        model_dir = build_model(work / "model", args)
        (work / "data").mkdir()
        prompts = write_prompts(work / "data" / "prompts.jsonl", 5 * args.prompts * args.steps)
        note("our GRPO steps ...")
        ours = run_ours(args, model_dir, work / "data", work)
        note("TRL's GRPOTrainer steps ...")
        trl = run_trl(args, model_dir, prompts, work)
    emit(
        {
            "config": vars(args),
            "ours": ours,
            "trl": trl,
            "ours_vs_trl": trl["step_s"] / ours["step_s"],
        }
    )


if __name__ == "__main__":
    main()
