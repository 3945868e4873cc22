"""float8 training against bf16 on one model (issue 50): speed, memory and the loss curve.

    python -m bench.float8 [--device cuda] [--method fsdp_compile] [--steps 200] [--warmup 20]
                           [--n-layers 20 --d-model 2048 --n-heads 16 --seq-len 2048 --batch 8]

The same GPT, seed and batches train `--steps` steps with `train.precision` bf16, then fp8 with
each of `--recipes` (torchao's `Float8Linear`, `trainer.methods.float8`), through
`bench/trainer_methods.py`'s runner (the real trainer under torchrun, `--method` of its table;
on a GPU `fsdp_compile`: FSDP2 with bf16 parameters in compute, every block compiled). Per run:
tokens/s (median step after `--warmup`), `mfu` (against the bf16 peak, so fp8's is "bf16
equivalent" as torchtitan reports it), peak memory, and against bf16: `speedup` and the loss
curve's distance, `curve.mean_rel` (mean over steps of |fp8 - bf16| / bf16),
`curve.max_rel_smoothed` (the largest relative gap of the two curves' 10-step moving averages,
which removes the batch-to-batch noise both share) and `curve.final_rel` (of those averages at
the last step). Goals on an H100/H200: fp8 >= 1.3x bf16's tokens/s on the ~1B model, curve
within 1% over 200 steps.

Prints one JSON document. Smoke: a tiny model on the CPU, whose torch kernels run float8 too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke  # noqa: E402
from bench.trainer_methods import (  # noqa: E402
    METHODS,
    add_model_arguments,
    build_corpus,
    run_method,
)

SMOOTH = 10  # steps of the moving average the curves are compared on


def moving_average(values: list[float], width: int) -> list[float]:
    """Trailing means over up to `width` values: out[i] = mean(values[max(0, i-width+1):i+1])."""
    return [statistics.fmean(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def curve_distance(fp8: list[float], bf16: list[float]) -> dict[str, float]:
    """How far the fp8 loss curve lies from bf16's (both per step, same steps)."""
    rel = [abs(a - b) / abs(b) for a, b in zip(fp8, bf16, strict=True)]
    smooth = [
        abs(a - b) / abs(b)
        for a, b in zip(moving_average(fp8, SMOOTH), moving_average(bf16, SMOOTH), strict=True)
    ]
    return {
        "mean_rel": round(statistics.fmean(rel), 5),
        "max_rel_smoothed": round(max(smooth), 5),
        "final_rel": round(smooth[-1], 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--method", default="single", choices=sorted(METHODS))
    parser.add_argument("--recipes", default="tensorwise,rowwise", help="comma-separated")
    args = smoke.parse(
        parser, steps=4, warmup=1, batch=4, n_layers=1, d_model=32, seq_len=32,
        recipes="tensorwise", device="cpu", method="single",
    )  # fmt: skip
    args.profile_steps = 0
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = build_corpus(Path(tmp), 2_000_000)
        for name, precision, recipe in [
            ("bf16", "bf16", "tensorwise"),
            *((f"fp8_{r}", "fp8", r) for r in args.recipes.split(",")),
        ]:
            run_args = argparse.Namespace(**{**vars(args), "precision": precision,
                                             "fp8_recipe": recipe})  # fmt: skip
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            runs[name] = run_method(run_args, corpus, args.method, Path(tmp) / name)
    base = runs["bf16"]
    for name, run in runs.items():
        run.pop("profile", None)
        if name == "bf16" or "error" in run or "error" in base:
            continue
        run["speedup"] = round(run["tokens_per_second"] / base["tokens_per_second"], 3)
        run["curve"] = curve_distance(run["losses"], base["losses"])
    config = {k: v for k, v in vars(args).items() if k not in ("smoke", "profile_steps")}
    print(json.dumps({"bench": "float8", "config": config, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
