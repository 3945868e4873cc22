"""`jobspec.stored`: a stored spec is upgraded version by version, then read leniently,
each repair recorded; a valid current spec is read exactly as submitted."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.job import JobSpec, ScriptJobSpec, parse_job_spec
from jobspec.stored import read_stored_spec, stored_problems, upgrade

VALID: dict[str, Any] = {
    "name": "run",
    "data": {"dataset": "ds_1"},
    "train": {"max_steps": 50},
    "eval": {"interval_steps": 10},
}


def test_a_valid_current_spec_is_read_as_submitted_with_no_problems() -> None:
    stored = parse_job_spec(VALID).model_dump(mode="json")
    spec = read_stored_spec(stored)
    assert spec == parse_job_spec(VALID)
    assert stored_problems(spec) == []


def test_upgrade_applies_each_step_from_the_stored_version_to_the_current_one() -> None:
    def v1_to_v2(spec: dict[str, Any]) -> dict[str, Any]:
        return {**spec, "warm_start": None, "init_from": spec.get("warm_start")}

    def v2_to_v3(spec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in spec.items() if k != "warm_start"}

    old = {"spec_version": 1, "name": "x", "warm_start": {"job_id": 3}}
    upgraded, problems = upgrade(old, upgrades={1: v1_to_v2, 2: v2_to_v3}, current=3)
    assert upgraded == {"spec_version": 3, "name": "x", "init_from": {"job_id": 3}}
    assert problems == []
    assert old["warm_start"] == {"job_id": 3}  # the stored value is left alone


def test_a_version_without_an_upgrade_step_or_from_a_newer_release_is_a_problem() -> None:
    _, gap = upgrade({"spec_version": 1}, upgrades={}, current=2)
    _, newer = upgrade({"spec_version": 5}, upgrades={}, current=2)
    assert "no upgrade to 2" in gap[0]
    assert "newer release" in newer[0]


def test_unknown_fields_are_dropped_and_invalid_values_fall_back_to_their_default() -> None:
    stored = {
        **VALID,
        "optim": {"learning_rate": 0.1, "lr": 0.01},
        "train": {"max_steps": -5},
    }
    spec = read_stored_spec(stored)
    assert isinstance(spec, JobSpec)
    assert spec.optim.lr == 0.01
    assert spec.train.max_steps == JobSpec.model_fields["train"].default_factory().max_steps  # type: ignore[misc]
    problems = stored_problems(spec)
    assert any(p.startswith("optim.learning_rate: not a field") for p in problems), problems
    assert any(p.startswith("train.max_steps:") and "default" in p for p in problems), problems


def test_missing_required_fields_get_placeholders_of_the_stored_kind() -> None:
    trainer = read_stored_spec({"spec_version": 1})
    script = read_stored_spec({"name": "s", "entrypoint": {"command": ["python", "a.py"]}})
    assert isinstance(trainer, JobSpec) and trainer.data.dataset == "unknown"
    assert {p.split(":")[0] for p in stored_problems(trainer)} == {"name", "data"}
    assert isinstance(script, ScriptJobSpec) and script.entrypoint.command == ["python", "a.py"]
    assert [p.split(":")[0] for p in stored_problems(script)] == ["entrypoint.code"]


def test_anything_else_reads_as_a_placeholder_that_says_so() -> None:
    for junk in (None, [], "text", 3, {"name": {"nested": True}, "data": 7}):
        spec = read_stored_spec(junk)
        assert stored_problems(spec), junk


def test_a_stored_spec_is_read_without_the_rules_added_since_it_was_accepted() -> None:
    """LoRA on a random init and warmup past max_steps were accepted before issue 45: such a
    row (its checkpoints, its exports) still reads as written, with no problem, while a
    submission of the same spec is refused."""
    raw = {
        "name": "old",
        "data": {"dataset": "ds_1"},
        "lora": {"r": 8},
        "optim": {"warmup_steps": 50},
        "train": {"max_steps": 20},
    }
    spec = read_stored_spec(raw)
    assert isinstance(spec, JobSpec) and stored_problems(spec) == []
    assert spec.lora is not None and spec.optim.warmup_steps == 50
    with pytest.raises(ValidationError) as exc:
        parse_job_spec(raw)
    assert {tuple(e["loc"]) for e in exc.value.errors()} == {("lora",), ("optim", "warmup_steps")}
