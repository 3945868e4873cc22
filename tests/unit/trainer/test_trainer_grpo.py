"""GRPO through the trainer (`python -m trainer` and torchrun, real processes): a `prompt`
dataset, graders from the spec (a team's `python` grader in its child process, a
`string_check` logged at weight 0), the reward rising, held-out rewards, metrics per grader,
DDP on 2 ranks, and a run killed after a checkpoint that resumes with the rewards of the run
that was never interrupted (generation is seeded by step and rank); FSDP on 2 ranks sampling
and learning as DDP does; two iterations per generation batch, clipping on the second and
resumed inside a cycle on the same completions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import pytest

from jobspec.job import JobSpec
from tests.support.grpo import GRADERS, write_prompts
from tests.support.tolerances import FP32_EPS
from tests.support.training import (
    FINE_TUNE,
    Scenario,
    crash_and_resume,
    read_events,
    run_plans,
    tiny_spec,
)
from trainer.data.prompts import load_prompts

# The module's `runs` fixture trains ten 2-rank scenarios in the first test's setup (~200 s on
# a quiet 2-core host, past 300 s under the suite's load at 2x): each run is bounded by
# RUN_TIMEOUT_S, the whole by this.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def prompt_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """72 `prompt` records (`{"prompt", "answer"}`) in one JSONL file."""
    data = tmp_path_factory.mktemp("prompts")
    write_prompts(data / "prompts.jsonl", repeat=9)
    return data


def _spec(
    data: Path, steps: int, sections: dict[str, dict[str, Any]] | None = None, **grpo: Any
) -> JobSpec:
    """The tiny GPT's GRPO job on `data`; `grpo` updates `method.grpo`, `sections` the spec's
    sections (each merged: `model.init_from`, `lora`, `qlora`, `eval.interval_steps`)."""
    base: dict[str, dict[str, Any]] = {
        "model": {"seq_len": 48},
        "method": {
            "kind": "grpo",
            "grpo": {"group_size": 8, "max_new_tokens": 8, "graders": GRADERS, **grpo},
        },
        "train": {"micro_batch_size": 4, "max_steps": steps, "log_interval_steps": 5},
        "eval": {"interval_steps": 10, "num_batches": 2},
        "optim": {"lr": 1e-2, "warmup_steps": 0},
        "checkpoint": {"interval_steps": 10},
    }
    for name, values in (sections or {}).items():
        base[name] = {**base.get(name, {}), **values}
    return tiny_spec(data, **base)


def _two_ranks(spec: JobSpec, strategy: Literal["ddp", "fsdp"]) -> JobSpec:
    """`spec` on 2 ranks of `strategy`, holding out enough prompts for 2 full eval batches per
    rank: an FSDP rank evaluates full batches only (its forwards are collective), so DDP and
    FSDP then evaluate the same 16 prompts."""
    spec = spec.model_copy(deep=True)
    spec.parallelism.strategy = strategy
    spec.resources.procs_per_node = 2
    spec.data.eval_fraction = 0.3
    return spec


def _metrics(workdir: Path, name: str) -> dict[tuple[int, int], float]:
    """{(attempt, step): value} of metric `name` in the run's events."""
    return {
        (e["attempt"], e["step"]): e["values"][name]
        for e in read_events(workdir / "run")
        if e["type"] == "metric" and name in e["values"]
    }


@pytest.fixture(scope="module")
def runs(prompt_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grpo_runs")
    # KL to the starting weights on 2 ranks: a plain frozen copy under DDP, one sharded like
    # the policy under FSDP.
    ddp = _two_ranks(_spec(prompt_data, 20, beta=0.04), "ddp")
    fsdp = _two_ranks(_spec(prompt_data, 20, beta=0.04), "fsdp")
    # Two steps per generation batch; checkpoints every 5 steps, so the one the crash resumes
    # from (step 5) lies inside a cycle (steps 5 and 6 train on the batch sampled before 5).
    iterations = _two_ranks(_spec(prompt_data, 20, num_iterations=2), "fsdp")
    iterations.checkpoint.interval_steps = 5
    # Adapters on the weights of a 1-step run (a model that has not learnt the reward yet), the
    # KL reference the same model with its adapters off: under DDP, under FSDP (its layers
    # sharded, LoRA's too) and on QLoRA's NF4 base
    pre = _spec(
        prompt_data, 1, {"eval": {"interval_steps": 1}, "checkpoint": {"interval_steps": 1}}
    )
    init = ("--init-from", str(root / "pre" / "ckpt" / "step_00000001"))
    adapters: dict[str, dict[str, Any]] = {"model": FINE_TUNE, "lora": {"r": 4, "alpha": 8.0}}
    lora_ddp = _two_ranks(_spec(prompt_data, 20, adapters, beta=0.04), "ddp")
    lora_fsdp = _two_ranks(_spec(prompt_data, 20, adapters, beta=0.04), "fsdp")
    qlora = {**adapters, "qlora": {"compute_dtype": "fp32"}}
    qlora_ddp = _two_ranks(_spec(prompt_data, 20, qlora, beta=0.04), "ddp")
    plans: list[tuple[int | None, list[Scenario]]] = [
        (
            None,
            [
                Scenario("single", _spec(prompt_data, 30), root / "single"),
                Scenario("pre", pre, root / "pre"),
            ],
        ),
        (
            2,
            [
                Scenario("ddp", ddp, root / "ddp"),
                *crash_and_resume("resumed", ddp, root / "resumed", fail_at=10),
                Scenario("fsdp", fsdp, root / "fsdp"),
                Scenario("iterations", iterations, root / "iterations"),
                *crash_and_resume("iterations_resumed", iterations, root / "it_resumed", 5),
                Scenario("lora_ddp", lora_ddp, root / "lora_ddp", init),
                Scenario("lora_fsdp", lora_fsdp, root / "lora_fsdp", init),
                Scenario("qlora_ddp", qlora_ddp, root / "qlora_ddp", init),
            ],
        ),
    ]
    return run_plans(plans, root / "plans")


def test_the_reward_of_what_the_grader_wants_rises_and_is_reported_per_grader(
    runs: dict[str, Path],
) -> None:
    workdir = runs["single"]
    reward = _metrics(workdir, "reward")
    lower = _metrics(workdir, "reward/lower")
    exact = _metrics(workdir, "reward/exact")
    steps = sorted(step for _, step in reward)
    assert steps == [5, 10, 15, 20, 25, 30]
    first, last = reward[(0, 5)], reward[(0, 30)]
    assert first < 0.5 and last > 0.9, f"reward {first:.2f} -> {last:.2f}"
    assert lower == reward, "the weight-0 grader adds nothing to the reward"
    assert set(exact.values()) == {0.0}, "no completion is the record's answer"
    held = _metrics(workdir, "eval_reward")
    assert held[(0, 30)] > 0.9 and held[(0, 30)] > held[(0, 10)] - 0.05
    # The run says what it read: prompts per side, none too long for 48 - 8 tokens.
    report = next(e for e in read_events(workdir / "run") if e["type"] == "data")
    assert report["method"] == "grpo" and report["format"] == "prompt"
    assert report["train_prompts"] + report["eval_prompts"] == 72 and report["too_long"] == 0


def test_ddp_learns_and_a_killed_run_resumes_with_the_uninterrupted_runs_rewards(
    runs: dict[str, Path],
) -> None:
    whole = _metrics(runs["ddp"], "reward")
    assert whole[(0, 20)] > whole[(0, 5)] + 0.3, whole
    resumed = _metrics(runs["resumed"], "reward")
    assert {step for attempt, step in resumed if attempt == 1} == {15, 20}
    for step in (5, 10):
        assert resumed[(0, step)] == pytest.approx(whole[(0, step)], rel=1e-6)
    for step in (15, 20):
        assert resumed[(1, step)] == pytest.approx(whole[(0, step)], rel=1e-6), step


def test_fsdp_samples_and_learns_as_ddp_does(runs: dict[str, Path]) -> None:
    """Tolerances. With 2 ranks each gradient entry's average is one fp32 addition, which
    commutes, so DDP's all-reduce and FSDP's reduce-scatter leave the same weights, bit for
    bit; FSDP's forward runs on the all-gathered weights with the same kernels, so both
    layouts compute the same logits and sample the same tokens (rewards, eval rewards and the
    loss to 1e-6 relative, which any token sampled otherwise would exceed: a reward moves by
    at least 1/64 per completion; the loss is ~1e-8, centred advantages at ratio 1, hence its
    1e-9 absolute floor). Only the gradient norm is summed in another order (per shard, then
    combined): a pairwise sum of n squares, off by ceil(log2 n) eps each way (Higham 4.2)."""
    params = 119_552  # the tiny GPT's (the run's `num_params`)
    grad_norm_rel = 2 * math.ceil(math.log2(params)) * FP32_EPS
    tolerances = {
        "reward": (1e-6, 0.0),
        "eval_reward": (1e-6, 0.0),
        "loss": (1e-6, 1e-9),
        "kl": (1e-6, 0.0),
        "grad_norm": (grad_norm_rel, 0.0),
    }
    for name, (rel, floor) in tolerances.items():
        ddp, fsdp = _metrics(runs["ddp"], name), _metrics(runs["fsdp"], name)
        assert sorted(fsdp) == sorted(ddp), name
        for key, value in ddp.items():
            assert fsdp[key] == pytest.approx(value, rel=rel, abs=floor), (name, key)
    reward = _metrics(runs["fsdp"], "reward")
    assert reward[(0, 20)] > reward[(0, 5)] + 0.3, reward
    assert _metrics(runs["fsdp"], "kl")[(0, 20)] > 0.0, "the policy left its reference"
    running = next(e for e in read_events(runs["fsdp"] / "run") if e["type"] == "status")
    assert running["data"]["num_params"] == params


def test_lora_under_fsdp_samples_and_learns_as_under_ddp_and_qlora_learns(
    runs: dict[str, Path],
) -> None:
    """Adapters on a barely trained model with KL to the same model with its adapters off:
    FSDP (adapters sharded with their layers) gives DDP's rewards, held-out rewards and KL
    (the tolerances of `test_fsdp_samples_and_learns_as_ddp_does`); the reference is the
    starting model, so the KL starts at 0 and grows; QLoRA's NF4 base learns too."""
    for name in ("reward", "eval_reward", "kl"):
        ddp, fsdp = _metrics(runs["lora_ddp"], name), _metrics(runs["lora_fsdp"], name)
        assert sorted(fsdp) == sorted(ddp), name
        for key, value in ddp.items():
            assert fsdp[key] == pytest.approx(value, rel=1e-6), (name, key)
    for run in ("lora_fsdp", "qlora_ddp"):
        reward, kl = _metrics(runs[run], "reward"), _metrics(runs[run], "kl")
        assert reward[(0, 20)] > reward[(0, 5)], (run, reward)
        assert kl[(0, 5)] > 0.0 and all(math.isfinite(v) for v in kl.values()), (run, kl)
        running = next(e for e in read_events(runs[run] / "run") if e["type"] == "status")
        assert 0 < running["data"]["trainable_params"] < running["data"]["num_params"], run


def test_two_iterations_per_batch_clip_learn_and_resume_inside_a_cycle(
    runs: dict[str, Path],
) -> None:
    """Steps 5 and 15 each start a cycle (ratio 1 to the policy that just sampled: nothing
    clips); steps 10 and 20 are second iterations, whose ratio is to the policy of a step ago."""
    region = _metrics(runs["iterations"], "clip_ratio/region")
    assert region[(0, 5)] == 0.0 and region[(0, 15)] == 0.0, region
    assert region[(0, 10)] > 0.0 and region[(0, 20)] > 0.0, region
    whole = _metrics(runs["iterations"], "reward")
    assert whole[(0, 20)] > whole[(0, 5)] + 0.3, whole
    resumed = _metrics(runs["iterations_resumed"], "reward")
    assert {step for attempt, step in resumed if attempt == 1} == {10, 15, 20}
    for name in ("reward", "loss", "clip_ratio/region"):
        whole, resumed = (
            _metrics(runs["iterations"], name),
            _metrics(runs["iterations_resumed"], name),
        )
        for step in (10, 15, 20):
            assert resumed[(1, step)] == pytest.approx(whole[(0, step)], rel=1e-6), (name, step)


def test_prompts_of_conversations_end_with_the_templates_generation_prompt(tmp_path: Path) -> None:
    rft = {"messages": [{"role": "user", "content": "2 + 3 ="}], "reference_answer": "5"}
    chat = {
        "messages": [
            {"role": "system", "content": "Add."},
            {"role": "user", "content": "1 + 1 ="},
            {"role": "assistant", "content": "2"},
        ]
    }
    (tmp_path / "rft.jsonl").write_text(json.dumps(rft) + "\n" + json.dumps(rft) + "\n")
    spec = _spec(tmp_path, 10)
    spec.model.seq_len = 128
    train, held, report = load_prompts(spec, str(tmp_path), None)
    assert report["format"] == "prompt" and len(train) + len(held) == 2
    text = bytes(train.ids[0].tolist()).decode()
    assert text == "<|im_start|>user\n2 + 3 =<|im_end|>\n<|im_start|>assistant\n"
    assert train.records[0]["reference_answer"] == "5", "graders see the whole record"

    (tmp_path / "rft.jsonl").unlink()
    (tmp_path / "chat.jsonl").write_text((json.dumps(chat) + "\n") * 2)
    train, _, report = load_prompts(spec, str(tmp_path), None)
    assert report["format"] == "messages"
    text = bytes(train.ids[0].tolist()).decode()
    assert text.endswith("1 + 1 =<|im_end|>\n<|im_start|>assistant\n"), text
    assert train.records[0]["messages"][-1]["content"] == "2", "the answer stays in the record"


def test_held_out_prompts_may_be_a_directory_read_with_the_specs_include(tmp_path: Path) -> None:
    train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
    train_dir.mkdir()
    eval_dir.mkdir()
    write_prompts(train_dir / "prompts.jsonl", repeat=2)
    write_prompts(eval_dir / "held.jsonl", repeat=1)
    (eval_dir / "notes.txt").write_text("not a prompt\n")
    spec = _spec(train_dir, 10)
    spec.data.include = ["*.jsonl"]
    train, held, report = load_prompts(spec, str(train_dir), None, eval_location=str(eval_dir))
    assert (len(train), len(held)) == (16, 8), report
