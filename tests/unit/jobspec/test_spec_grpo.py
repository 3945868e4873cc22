"""JobSpec validation of `method.kind: grpo`: its settings and defaults, the graders it needs,
and the data and layouts it refuses, each at the JSON path of the field to change."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec.job import STORED, JobSpec
from jobspec.method_checks import method_data_error
from tests.support.spec_errors import raw_spec, spec_errors

EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text | trim }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}


def _grpo(**settings: Any) -> dict[str, Any]:
    return {"kind": "grpo", "grpo": {"graders": [EXACT], **settings}}


def test_grpo_gets_trls_defaults_and_keeps_its_graders() -> None:
    grpo = JobSpec.model_validate(raw_spec(method=_grpo())).method.grpo
    assert grpo is not None
    assert (grpo.group_size, grpo.beta, grpo.epsilon, grpo.epsilon_high) == (8, 0.0, 0.2, None)
    assert (grpo.loss_type, grpo.scale_rewards, grpo.temperature) == ("dapo", "group", 1.0)
    assert grpo.num_iterations == 1, "TRL's default: every step samples anew"
    assert [g.name for g in grpo.graders] == ["exact"]


def test_grpo_without_graders_says_what_it_needs() -> None:
    errors = spec_errors(raw_spec(method={"kind": "grpo"}))
    assert "needs method.grpo with its graders" in errors[("method",)]
    errors = spec_errors(raw_spec(method={"kind": "grpo", "grpo": {"graders": []}}))
    assert ("method", "grpo", "graders") in errors


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"group_size": 1}, "group_size"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"beta": -0.1}, "beta"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"loss_type": "bnpo"}, "loss_type"),
        ({"scale_rewards": "std"}, "scale_rewards"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"num_iterations": 0}, "num_iterations"),
        ({"num_iterations": 17}, "num_iterations"),
    ],
)
def test_out_of_range_grpo_settings_name_their_field(settings: dict[str, Any], field: str) -> None:
    assert ("method", "grpo", field) in spec_errors(raw_spec(method=_grpo(**settings)))


def test_grpo_settings_with_another_method_are_refused() -> None:
    errors = spec_errors(raw_spec(method={"kind": "sft", "grpo": {"graders": [EXACT]}}))
    assert "read only with method.kind 'grpo'" in errors[("method",)]


def test_grpo_samples_from_whole_logits_with_room_for_a_completion() -> None:
    errors = spec_errors(
        raw_spec(
            method=_grpo(max_new_tokens=64),
            model={"seq_len": 64},
            parallelism={"strategy": "tensor"},
            resources={"procs_per_node": 2},
        )
    )
    assert "strategy single, ddp or fsdp" in errors[("parallelism", "strategy")]
    assert "leaves no room for a prompt" in errors[("method", "grpo", "max_new_tokens")]
    errors = spec_errors(
        raw_spec(
            method=_grpo(),
            parallelism={"strategy": "fsdp", "tensor_parallel_size": 2},
            resources={"procs_per_node": 4},
        )
    )
    assert "without tensor_parallel_size" in errors[("parallelism", "strategy")]


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_grpo_runs_single_ddp_and_fsdp_with_several_iterations(strategy: str) -> None:
    nproc = 1 if strategy == "single" else 2
    raw = raw_spec(
        method=_grpo(num_iterations=2),
        parallelism={"strategy": strategy},
        resources={"procs_per_node": nproc},
    )
    spec = JobSpec.model_validate(raw)
    assert spec.method.grpo is not None and spec.method.grpo.num_iterations == 2


@pytest.mark.parametrize(
    ("kind", "data_format", "refused"),
    [
        ("grpo", "prompt", None),
        ("grpo", "prompt_completion", None),
        ("grpo", "messages", None),
        ("grpo", "preference", "reads prompts from prompt, prompt_completion, messages"),
        ("grpo", "text", "reads prompts from"),
        ("sft", "prompt", "a prompt dataset has no answers to learn from"),
        ("dpo", "prompt", "needs a preference dataset"),
        ("sft", "preference", "trains with method.kind dpo"),
        ("sft", "messages", None),
    ],
)
def test_which_data_each_method_trains_on(kind: str, data_format: str, refused: str | None) -> None:
    error = method_data_error(kind, data_format)
    assert error is None if refused is None else refused in (error or "")
    method = _grpo() if kind == "grpo" else {"kind": kind}
    raw = raw_spec(method=method, data={"uri": "/d", "format": data_format})
    if refused is None:
        assert JobSpec.model_validate(raw).data.format == data_format
    else:
        assert refused in spec_errors(raw)[("data", "format")]


CODE = "code_0123456789abcdef"
FILE_GRADER = {"type": "python", "name": "lower", "file": "graders/lower.py"}
MULTI_OF_A_FILE = {
    "type": "multi",
    "name": "both",
    "graders": {"lower": FILE_GRADER, "exact": EXACT},
    "calculate_output": "lower + exact",
}


def test_a_file_grader_without_grpo_code_is_refused_at_its_file() -> None:
    """A built-in trainer job has no code directory but `method.grpo.code`'s: a `file` grader
    without it, top-level or inside a `multi`, is refused at submission, not at run time."""
    graders = [EXACT, FILE_GRADER, MULTI_OF_A_FILE]
    errors = spec_errors(raw_spec(method={"kind": "grpo", "grpo": {"graders": graders}}))
    assert set(errors) == {
        ("method", "grpo", "graders", 1, "file"),
        ("method", "grpo", "graders", 2, "graders", "lower", "file"),
    }
    assert all("give method.grpo.code" in msg for msg in errors.values()), errors


def test_a_file_grader_with_grpo_code_is_valid_and_a_stored_one_without_still_reads() -> None:
    graders = [EXACT, FILE_GRADER, MULTI_OF_A_FILE]
    grpo = JobSpec.model_validate(raw_spec(method=_grpo(graders=graders, code=CODE))).method.grpo
    assert grpo is not None and grpo.code == CODE
    # accepted before the rule (it failed at launch): its row still reads
    stored = JobSpec.model_validate(raw_spec(method=_grpo(graders=graders)), context=STORED)
    assert stored.method.grpo is not None and stored.method.grpo.code is None


def test_grpo_code_is_an_archive_id() -> None:
    errors = spec_errors(raw_spec(method=_grpo(code="graders.tar.gz")))
    assert list(errors) == [("method", "grpo", "code")]
