"""`jobspec.sweep.SweepSpec`: what a sweep refuses before any trial, each problem at its path,
and how drawn values become a trial's spec."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.job import STORED, JobSpec, ScriptJobSpec
from jobspec.sweep import SweepSpec, grid_points, with_values

BASE: dict[str, Any] = {
    "name": "b",
    "data": {"uri": "/data/corpus"},
    "train": {"max_steps": 100},
    "eval": {"interval_steps": 10},
}
# LoRA adapts trained weights: an earlier job's checkpoint.
TUNED: dict[str, Any] = {**BASE, "model": {"init_from": {"job": 1}}}
SCRIPT: dict[str, Any] = {
    "name": "s",
    "entrypoint": {"code": "code_0123456789abcdef", "command": ["python", "train.py"]},
}


def _errors(spec: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as caught:
        SweepSpec.model_validate(spec)
    return {tuple(e["loc"]): e["msg"] for e in caught.value.errors()}


def _sweep(space: dict[str, Any], base: dict[str, Any] = BASE, **more: Any) -> dict[str, Any]:
    return {"name": "s", "base": base, "space": space, **more}


def test_a_valid_space_over_trainer_fields_parses() -> None:
    sweep = SweepSpec.model_validate(
        _sweep(
            {
                "optim.lr": {"log_uniform": [1e-5, 1e-2]},
                "lora.r": {"choice": [8, 16, 32]},
                "train.micro_batch_size": {"int": [4, 16, 4]},
                "optim.schedule": {"choice": ["cosine", "linear"]},
            },
            TUNED,
        )
    )
    assert sweep.space["train.micro_batch_size"].grid_values() == [4, 8, 12, 16]
    assert sweep.space["optim.lr"].grid_values() is None


@pytest.mark.parametrize(
    ("path", "dimension", "words"),
    [
        ("optim.lrr", {"uniform": [0.1, 0.2]}, "'lrr' is not a field of optim"),
        ("nope", {"choice": [1]}, "'nope' is not a field of the spec"),
        ("optim", {"choice": [1]}, "optim is a section; name one of its fields"),
        ("lora.r", {"uniform": [4, 32]}, "lora.r takes int, not a float range"),
        ("optim.schedule", {"int": [1, 3]}, "takes str, not integers"),
        ("optim.schedule", {"choice": ["cosine", "zig"]}, "'zig' at optim.schedule"),
        ("optim.lr", {"uniform": [0.5, 20.0]}, "20.0 at optim.lr"),  # past the field's bound
    ],
)
def test_a_dimension_the_base_cannot_take_is_refused_at_its_path(
    path: str, dimension: dict[str, Any], words: str
) -> None:
    errors = _errors(_sweep({path: dimension}))
    assert words in errors[("space", path)], errors


@pytest.mark.parametrize(
    ("dimension", "words"),
    [
        ({"uniform": [0.2, 0.1]}, "must be below high"),
        ({"log_uniform": [0.0, 0.1]}, "0 < low"),
        ({"int": [1, 9, 0]}, "step of int"),
        ({"choice": [1, 1]}, "choices repeat"),
        ({"choice": [1], "int": [1, 2]}, "exactly one of"),
        ({}, "exactly one of"),
    ],
)
def test_a_malformed_dimension_is_refused(dimension: dict[str, Any], words: str) -> None:
    errors = _errors(_sweep({"optim.warmup_steps": dimension}))
    assert any(words in msg for msg in errors.values()), errors


def test_every_problem_is_reported_at_once() -> None:
    errors = _errors(
        _sweep(
            {"optim.lrr": {"uniform": [0.1, 0.2]}, "lora.r": {"uniform": [1.0, 2.0]}},
            metric="accuracy",
        )
    )
    assert set(errors) == {("space", "optim.lrr"), ("space", "lora.r"), ("metric",)}
    assert "never reports 'accuracy'" in errors[("metric",)]


def test_metrics_follow_the_method() -> None:
    dpo = {**BASE, "method": {"kind": "dpo"}}
    space = {"optim.lr": {"choice": [1e-4]}}
    SweepSpec.model_validate(
        _sweep(space, dpo, metric="eval_rewards/accuracy", direction="maximize")
    )
    errors = _errors(_sweep({"optim.lr": {"choice": [1e-4]}}, metric="eval_rewards/accuracy"))
    assert ("metric",) in errors


def test_a_grpo_sweep_is_judged_by_held_out_or_per_grader_reward_over_beta() -> None:
    exact = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
             "reference": "{{ item.answer }}", "operation": "eq"}  # fmt: skip
    grpo = {**BASE, "method": {"kind": "grpo", "grpo": {"graders": [exact]}}}
    space = {"method.grpo.beta": {"choice": [0.0, 0.04]}, "optim.lr": {"choice": [1e-4]}}
    for metric in ("eval_reward", "reward/exact"):
        sweep = SweepSpec.model_validate(_sweep(space, grpo, metric=metric, direction="maximize"))
        trial = with_values(sweep.base, {"method.grpo.beta": 0.04, "optim.lr": 1e-4})
        assert trial.method.grpo is not None and trial.method.grpo.beta == 0.04
    errors = _errors(_sweep(space, grpo, metric="reward/similar", direction="maximize"))
    assert "never reports 'reward/similar'" in errors[("metric",)]


def test_the_grid_searcher_needs_discrete_dimensions_and_room_in_max_trials() -> None:
    errors = _errors(_sweep({"optim.lr": {"log_uniform": [1e-5, 1e-2]}}, searcher="grid"))
    assert "needs discrete values" in errors[("space", "optim.lr")]
    space = {"optim.lr": {"choice": [1e-4, 1e-3, 1e-2]}, "optim.warmup_steps": {"int": [0, 10, 5]}}
    errors = _errors(_sweep(space, searcher="grid", max_trials=8))
    assert "the grid has 9 points" in errors[("max_trials",)]
    sweep = SweepSpec.model_validate(_sweep(space, searcher="grid", max_trials=9))
    points = grid_points(sweep)
    assert len(points) == 9 and {"optim.lr": 1e-3, "optim.warmup_steps": 5} in points


def test_an_entrypoint_sweep_sets_its_programs_params_and_refuses_trainer_paths() -> None:
    sweep = SweepSpec.model_validate(
        _sweep({"entrypoint.params.lr": {"log_uniform": [1e-5, 1e-2]}}, SCRIPT, metric="acc")
    )
    trial = with_values(sweep.base, {"entrypoint.params.lr": 3e-4})
    assert isinstance(trial, ScriptJobSpec) and trial.entrypoint.params == {"lr": 3e-4}
    errors = _errors(_sweep({"optim.lr": {"choice": [1e-3]}}, SCRIPT, metric="acc"))
    assert "entrypoint.params.<name>" in errors[("space", "optim.lr")]
    errors = _errors(
        _sweep({"entrypoint.params.lr": {"choice": [1]}}, SCRIPT, pruner={"axis": "tokens"})
    )
    assert ("pruner", "axis") in errors


def test_with_values_revalidates_the_whole_spec() -> None:
    base = JobSpec.model_validate(
        {**TUNED, "model": {**TUNED["model"], "n_heads": 4, "d_model": 96}}
    )
    trial = with_values(base, {"lora.r": 16, "optim.lr": 0.002})
    assert isinstance(trial, JobSpec)
    assert trial.lora is not None and trial.lora.r == 16 and trial.optim.lr == 0.002
    with pytest.raises(ValidationError, match="n_heads"):
        with_values(base, {"model.n_heads": 3, "model.d_model": 64})


def test_lora_r_in_the_space_of_a_base_without_pretrained_weights_is_refused() -> None:
    errors = _errors(_sweep({"lora.r": {"choice": [8, 16]}}))
    assert list(errors) == [("space", "lora.r")]
    assert "LoRA adapts pretrained weights" in errors[("space", "lora.r")]


def test_warmup_in_the_space_longer_than_the_base_run_is_refused_naming_both() -> None:
    errors = _errors(_sweep({"optim.warmup_steps": {"int": [0, 150, 50]}}))
    assert list(errors) == [("space", "optim.warmup_steps")]
    assert (
        "warmup_steps (150) exceeds train.max_steps (100)"
        in errors[("space", "optim.warmup_steps")]
    )


def test_a_space_whose_warmup_can_outlast_its_max_steps_is_refused_up_front() -> None:
    space = {
        "optim.warmup_steps": {"int": [0, 60, 20]},
        "train.max_steps": {"choice": [40, 100]},
    }
    errors = _errors(_sweep(space))
    message = errors[("space", "optim.warmup_steps")]
    assert "goes up to 60" in message and "down to 40" in message
    space["train.max_steps"] = {"choice": [60, 100]}
    SweepSpec.model_validate(_sweep(space))  # every combination warms up within its run


def test_a_trial_whose_values_warm_up_longer_than_it_runs_is_refused() -> None:
    base = JobSpec.model_validate(BASE)
    with pytest.raises(ValidationError, match=r"warmup_steps \(120\) exceeds train.max_steps"):
        with_values(base, {"optim.warmup_steps": 120})


def test_a_stored_sweep_is_read_without_the_rules_added_since() -> None:
    """A sweep accepted before LoRA needed pretrained weights still reads (its next trials are
    refused, each with the reason, when they are made)."""
    old = _sweep({"lora.r": {"choice": [8, 16]}}, {**BASE, "lora": {"r": 8}})
    sweep = SweepSpec.model_validate(old, context=STORED)
    assert isinstance(sweep.base, JobSpec) and sweep.base.lora is not None
    with pytest.raises(ValidationError, match="LoRA adapts pretrained weights"):
        with_values(sweep.base, {"lora.r": 16})
