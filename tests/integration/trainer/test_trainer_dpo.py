"""DPO through the trainer (`python -m trainer`, `method.kind: dpo`) under `single`, `ddp` and
`fsdp` (2 gloo processes under real `torchrun`), with the built-in GPT trained in full and with
a Hugging Face Llama (from a config) under LoRA, on a preference file from the standard library
(prompt: a function's signature; chosen: its docstring's first line; rejected: another
function's), read by the data pipeline as `data.format: preference`.

Each run takes 8 pairs per step (single: 1 micro-batch of 8; ddp/fsdp: 2 ranks x 2 micro-batches
of 2) and evaluates all 16 pairs at the start and the end. It proves:
- at the start the policy is its reference: eval loss log 2, rewards 0, and so is step 1's loss;
- training raises the reward accuracy above 0.5 and the margin above 0 on the pairs;
- ddp and fsdp follow the single-process loss curve: the loss is normalised by the pairs of
  the global batch, whatever their split. Tolerance 1e-5 relative: the same fp32 mathematics
  summed in another order (DDP's all-reduce, FSDP's reduce-scatter, per-micro-batch sums),
  as in test_trainer_parallel.py, moves the last bits of a loss of ~0.7.
The runs of one world size share one process group (`tests.support.rank_driver`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from jobspec.job import JobSpec
from tests.support.dpo import stdlib_pairs
from tests.support.training import (
    Scenario,
    read_events,
    run_plans,
    statuses,
    tiny_llama_dir,
    tiny_spec,
)
from tests.support.training import train_losses as losses_of

# Every run of the module is one fixture (one process group per world size): its setup may
# take several minutes on a loaded 2-core host, more than the suite's 5-minute default.
pytestmark = pytest.mark.timeout(900)

SEQ_LEN = 112
NUM_PAIRS = 16
STEPS = 6
REL_TOLERANCE = 1e-5
LOG_2 = math.log(2)
MODELS: dict[str, dict[str, Any]] = {
    "gpt_full": {"model": {"seq_len": SEQ_LEN}, "optim": {"lr": 3e-3}},
    "llama_lora": {
        # LoRA adapts weights from files (`path_or_id`, filled in by `_spec`)
        "model": {"seq_len": SEQ_LEN, "kind": "hf", "hf": {"path_or_id": None}},
        "lora": {"r": 8},
        "optim": {"lr": 1e-2},
    },
}
LAYOUTS = {"single": (1, 8, 1), "ddp": (2, 2, 2), "fsdp": (2, 2, 2)}  # procs, mbs, accum


def _spec(pairs: Path, model: str, strategy: str, llama: Path) -> JobSpec:
    """The run of `model` under `strategy`; `llama`: the saved Llama `llama_lora` adapts."""
    procs, mbs, accum = LAYOUTS[strategy]
    sections = dict(MODELS[model])
    if sections["model"].get("kind") == "hf":
        sections["model"] = {**sections["model"], "hf": {"path_or_id": str(llama)}}
    optim = sections.pop("optim")
    dp = 1 if strategy == "single" else procs
    spec = tiny_spec(
        pairs,
        **sections,
        method={"kind": "dpo", "dpo": {"beta": 0.1}},
        parallelism={"strategy": strategy},
        resources={"procs_per_node": procs},
        train={"micro_batch_size": mbs, "grad_accum_steps": accum, "max_steps": STEPS},
        optim={**optim, "warmup_steps": 0, "weight_decay": 0.0},
        eval={"interval_steps": STEPS, "at_start": True, "num_batches": NUM_PAIRS // (mbs * dp)},
        checkpoint={"interval_steps": 1000},
        sample={"max_new_tokens": 4},
    )
    raw = spec.model_dump(mode="json")
    raw["data"] |= {"format": "preference", "eval_uri": str(pairs)}
    return JobSpec.model_validate(raw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every (model, strategy) run, one process group per world size; {"model/strategy"
    without the slash: workdir}."""
    root = tmp_path_factory.mktemp("dpo")
    pairs = root / "pairs.jsonl"
    room = 15  # 97 bytes at most, with room for the pipeline's end-of-answer tokens
    lines = [
        json.dumps({"prompt": p, "chosen": c, "rejected": r})
        for p, c, r in stdlib_pairs(NUM_PAIRS, SEQ_LEN - room)
    ]
    pairs.write_text("\n".join(lines) + "\n")
    llama = tiny_llama_dir(root / "llama")
    plans: dict[int, list[Scenario]] = {1: [], 2: []}
    for model in MODELS:
        for strategy, (procs, _, _) in LAYOUTS.items():
            name = f"{model}_{strategy}"
            plans[procs].append(Scenario(name, _spec(pairs, model, strategy, llama), root / name))
    return run_plans([(None, plans[1]), (2, plans[2])], root)


def _eval_at(events: list[dict[str, Any]], step: int) -> dict[str, float]:
    (values,) = [
        e["values"]
        for e in events
        if e["type"] == "metric" and e["step"] == step and "eval_loss" in e["values"]
    ]
    return values


@pytest.mark.parametrize("strategy", list(LAYOUTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_dpo_raises_reward_accuracy_and_margin_and_matches_single_process(
    model: str, strategy: str, runs: dict[str, Path]
) -> None:
    events = read_events(runs[f"{model}_{strategy}"] / "run")
    assert statuses(events)[-1]["state"] == "completed"
    start, end = _eval_at(events, 0), _eval_at(events, STEPS)
    assert start["eval_loss"] == pytest.approx(LOG_2, rel=1e-6)
    assert start["eval_rewards/margin"] == 0.0 and start["eval_rewards/accuracy"] == 0.0
    assert end["eval_rewards/accuracy"] > 0.5, end
    assert end["eval_rewards/margin"] > 0.0 and end["eval_loss"] < LOG_2, end
    losses = losses_of(events)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[1] == pytest.approx(LOG_2, rel=1e-6)  # step 1 scores the initial policy
    single = losses_of(read_events(runs[f"{model}_single"] / "run"))
    assert [losses[s] for s in sorted(losses)] == pytest.approx(
        [single[s] for s in sorted(single)], rel=REL_TOLERANCE
    )
