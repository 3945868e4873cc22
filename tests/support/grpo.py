"""A GRPO job the service tests run (tests/integration/trainer/test_grpo_job.py, the job page's
e2e test): prompts whose records carry an answer, a team's `python` grader whose reward a random
tiny model raises within 20 steps (the share of lower-case letters in the completion: about one
in ten at first, with spread in every group), and a `string_check` logged at weight 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOWER = """
def grade(sample, item):
    text = sample["output_text"]
    return sum(c.islower() for c in text) / max(len(text), 1)
"""
GRADERS: list[dict[str, Any]] = [
    {"type": "python", "name": "lower", "source": LOWER},
    {
        "type": "string_check",
        "name": "exact",
        "input": "{{ sample.output_text | trim }}",
        "reference": "{{ item.answer }}",
        "operation": "eq",
        "weight": 0,
    },
]
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa")


def write_prompts(path: Path, repeat: int = 8) -> Path:
    """`len(WORDS) x repeat` `prompt` records (`{"prompt", "answer"}`) in the JSONL `path`."""
    words = list(WORDS) * repeat
    lines = [json.dumps({"prompt": f"{w} {i}: ", "answer": w}) for i, w in enumerate(words)]
    path.write_text("\n".join(lines) + "\n")
    return path


def grpo_job(*, dataset: str, pool: str, max_steps: int = 20) -> dict[str, Any]:
    """A 2-rank DDP GRPO job of a tiny byte GPT on `dataset`, served by `pool`: rewards logged
    every 5 steps, held-out rewards at steps 0, 10 and 20."""
    return {
        "name": "grpo-lower",
        "seed": 7,
        "data": {"dataset": dataset},
        "model": {"n_layers": 2, "n_heads": 4, "d_model": 64, "seq_len": 48},
        "method": {
            "kind": "grpo",
            "grpo": {"group_size": 8, "max_new_tokens": 8, "graders": [dict(g) for g in GRADERS]},
        },
        "parallelism": {"strategy": "ddp"},
        "resources": {"procs_per_node": 2, "device": "cpu", "pool": pool},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "schedule": "constant"},
        "train": {"micro_batch_size": 2, "max_steps": max_steps, "log_interval_steps": 5},
        "eval": {"interval_steps": 10, "num_batches": 2, "at_start": True},
        "checkpoint": {"interval_steps": 10},
    }
