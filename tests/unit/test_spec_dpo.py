"""JobSpec validation of `method`: sft by default, dpo with its settings, and the layouts DPO
refuses, each at the JSON path of the field to change."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trainer.spec import JobSpec


def _spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "job", "data": {"dataset": "ds_1"}}
    base.update(overrides)
    return base


def _errors(raw: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(raw)
    return {tuple(e["loc"]): e["msg"] for e in exc.value.errors()}


def test_method_defaults_to_sft_without_dpo_settings() -> None:
    spec = JobSpec.model_validate(_spec())
    assert spec.method.kind == "sft" and spec.method.dpo is None


def test_dpo_gets_the_papers_default_settings() -> None:
    spec = JobSpec.model_validate(_spec(method={"kind": "dpo"}))
    dpo = spec.method.dpo
    assert dpo is not None
    assert (dpo.beta, dpo.loss_type, dpo.label_smoothing, dpo.reference) == (
        0.1, "sigmoid", 0.0, "initial",
    )  # fmt: skip
    spec = JobSpec.model_validate(
        _spec(method={"kind": "dpo", "dpo": {"beta": 0.5, "loss_type": "ipo"}})
    )
    assert spec.method.dpo is not None and spec.method.dpo.loss_type == "ipo"


@pytest.mark.parametrize(
    ("dpo", "field"),
    [
        ({"beta": 0}, "beta"),
        ({"beta": -1}, "beta"),
        ({"label_smoothing": 0.5}, "label_smoothing"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
        ({"loss_type": "hinge"}, "loss_type"),
        ({"reference": "copy"}, "reference"),
        ({"temperature": 1}, "temperature"),
    ],
)
def test_out_of_range_dpo_settings_name_their_field(dpo: dict[str, Any], field: str) -> None:
    errors = _errors(_spec(method={"kind": "dpo", "dpo": dpo}))
    assert ("method", "dpo", field) in errors


def test_label_smoothing_is_refused_with_ipo() -> None:
    errors = _errors(
        _spec(method={"kind": "dpo", "dpo": {"loss_type": "ipo", "label_smoothing": 0.1}})
    )
    assert "sigmoid' only" in errors[("method", "dpo")]


def test_dpo_settings_with_sft_are_refused() -> None:
    errors = _errors(_spec(method={"kind": "sft", "dpo": {"beta": 0.2}}))
    assert "read only with method.kind 'dpo'" in errors[("method",)]


@pytest.mark.parametrize(
    "parallelism",
    [
        {"strategy": "tensor"},
        {"strategy": "pipeline", "pipeline": {"num_microbatches": 2}},
        {"strategy": "fsdp", "tensor_parallel_size": 2},
    ],
)
def test_dpo_refuses_tensor_and_pipeline_parallelism(parallelism: dict[str, Any]) -> None:
    errors = _errors(
        _spec(
            method={"kind": "dpo"},
            parallelism=parallelism,
            resources={"procs_per_node": 2},
            train={"micro_batch_size": 2},
        )
    )
    assert "runs with strategy single, ddp or fsdp" in errors[("method", "kind")]


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_dpo_runs_with_single_ddp_and_fsdp_with_or_without_lora(strategy: str) -> None:
    procs = 1 if strategy == "single" else 2
    for lora in (None, {"r": 4}):
        JobSpec.model_validate(
            _spec(
                method={"kind": "dpo"},
                parallelism={"strategy": strategy},
                resources={"procs_per_node": procs},
                lora=lora,
            )
        )


def test_dpo_refuses_qat() -> None:
    errors = _errors(_spec(method={"kind": "dpo"}, qat={}))
    assert "method 'dpo'" in errors[("qat",)]


def test_dpo_refuses_packing_once_the_data_spec_has_it() -> None:
    if "packing" not in JobSpec.model_fields["data"].annotation.model_fields:  # type: ignore[union-attr]
        pytest.skip("data.packing arrives with the data pipeline (issue 11)")
    errors = _errors(_spec(method={"kind": "dpo"}, data={"dataset": "ds_1", "packing": True}))
    assert "one pair per row" in errors[("data", "packing")]
