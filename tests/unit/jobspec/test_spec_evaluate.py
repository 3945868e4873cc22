"""JobSpec validation of evaluations (`jobspec.evaluate`): the messages name what they refuse."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.evaluate import EvalAfterSpec, EvaluateSpec, RewardEval
from jobspec.job import STORED, JobSpec
from tests.support.spec_errors import raw_spec


def test_two_evaluations_of_one_name_are_named_in_the_error() -> None:
    """The message's template held `{name!r}`, which pydantic does not format (it substitutes
    plain names only): users read the literal text instead of the name."""
    twice = [{"kind": "perplexity", "name": "held"}, {"kind": "perplexity", "name": "held"}]
    with pytest.raises(ValidationError) as info:
        EvalAfterSpec.model_validate({"evaluations": twice})
    message = info.value.errors()[0]["msg"]
    assert "evaluations[1].name: 'held' names two evaluations" in message, message


LOWER = "def grade(sample, item):\n    return 1.0\n"
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text | trim }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}


def _grpo_source(**grpo: Any) -> JobSpec:
    """A stored GRPO job (as stored: a `file` grader without `method.grpo.code` is refused at
    submission only, so a job stored before the rule still reads)."""
    method = {"kind": "grpo", "grpo": {"graders": [EXACT], **grpo}}
    raw = raw_spec(method=method, model={"seq_len": 128})
    return JobSpec.model_validate(raw, context=STORED)


def _resolved(evaluation: RewardEval, source: JobSpec) -> tuple[list[Any], int]:
    return evaluation.resolved(source.method.grpo, source.model.seq_len)


def test_a_bare_reward_kind_takes_every_setting_from_a_grpo_source() -> None:
    (reward,) = EvalAfterSpec.model_validate({"evaluations": ["reward"]}).evaluations
    assert isinstance(reward, RewardEval) and reward.name == "reward"
    assert (reward.dataset, reward.graders, reward.max_new_tokens) == (None, None, None)
    assert (reward.max_prompts, reward.temperature, reward.samples_per_prompt) == (32, 0.0, 1)
    graders, max_new_tokens = _resolved(reward, _grpo_source(max_new_tokens=12))
    assert [g.name for g in graders] == ["exact"] and max_new_tokens == 12
    own = RewardEval.model_validate(
        {"kind": "reward", "graders": [{**EXACT, "name": "mine"}], "max_new_tokens": 5}
    )
    graders, max_new_tokens = _resolved(own, _grpo_source())
    assert [g.name for g in graders] == ["mine"] and max_new_tokens == 5


def test_a_source_that_is_not_grpo_needs_a_dataset_and_graders_at_their_fields() -> None:
    sft = JobSpec.model_validate(raw_spec(model={"seq_len": 64}))
    errors = dict(RewardEval.model_validate({"kind": "reward"}).source_errors(sft.method.grpo, 64))
    assert set(errors) == {("dataset",), ("graders",)}
    assert "not a GRPO job" in errors[("dataset",)] and "not a GRPO job" in errors[("graders",)]
    given = RewardEval.model_validate({"kind": "reward", "dataset": "ds_2", "graders": [EXACT]})
    graders, max_new_tokens = _resolved(given, sft)
    assert [g.name for g in graders] == ["exact"] and max_new_tokens == 32  # half of 64
    with pytest.raises(ValueError, match="dataset: required"):
        _resolved(RewardEval.model_validate({"kind": "reward"}), sft)


def test_completions_that_leave_no_room_for_a_prompt_are_refused() -> None:
    long = RewardEval.model_validate({"kind": "reward", "max_new_tokens": 128})
    (error,) = long.source_errors(_grpo_source().method.grpo, 128)
    assert error[0] == ("max_new_tokens",) and "model.seq_len 128" in error[1]


def test_a_python_grader_reading_a_file_is_refused_where_it_is_named() -> None:
    """An eval job reads no code archive of its own: a `file` grader is refused among the
    evaluation's graders, and a GRPO source's is refused when the evaluation would inherit it
    from a source without `method.grpo.code`; with one, the eval job reads that archive."""
    reads = {"type": "python", "name": "team", "file": "grade.py"}
    multi = {
        "type": "multi",
        "name": "both",
        "graders": {"team": reads, "inline": {"type": "python", "name": "x", "source": LOWER}},
        "calculate_output": "team + inline",
    }
    for graders, where in (
        ([EXACT, reads], "graders[1].file"),
        ([multi], "graders[0].graders.team.file"),
    ):
        with pytest.raises(ValidationError) as info:
            RewardEval.model_validate({"kind": "reward", "graders": graders})
        (error,) = info.value.errors()
        assert error["loc"] == ("graders",) and error["msg"].startswith(where), error
        assert "no code archive of its own" in error["msg"]
    inherits = RewardEval.model_validate({"kind": "reward"})
    (error,) = inherits.source_errors(_grpo_source(graders=[EXACT, reads]).method.grpo, 128)
    assert error[0] == ("graders",) and "graders[1] reads a `file`" in error[1]
    with_code = _grpo_source(graders=[EXACT, reads], code="code_0123456789abcdef")
    assert inherits.source_errors(with_code.method.grpo, 128) == []


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_prompts": 0}, "max_prompts"),
        ({"max_prompts": 1001}, "max_prompts"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"samples_per_prompt": 65}, "samples_per_prompt"),
        ({"graders": []}, "graders"),
        ({"dataset": ""}, "dataset"),
    ],
)
def test_out_of_range_reward_settings_name_their_field(
    settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        EvaluateSpec.model_validate(
            {"source": {"job": 1}, "evaluations": [{"kind": "reward", **settings}]}
        )
    assert [e["loc"][:4] for e in info.value.errors()] == [("evaluations", 0, "reward", field)]


def test_several_greedy_samples_per_prompt_are_refused() -> None:
    with pytest.raises(ValidationError, match="greedy completions are all alike"):
        RewardEval.model_validate({"kind": "reward", "samples_per_prompt": 4})
    sampled = RewardEval.model_validate(
        {"kind": "reward", "samples_per_prompt": 4, "temperature": 1.0}
    )
    assert sampled.samples_per_prompt == 4
