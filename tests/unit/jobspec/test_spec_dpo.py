"""JobSpec validation of `method`: sft by default, dpo with its settings, and the layouts DPO
refuses, each at the JSON path of the field to change."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec.job import JobSpec
from tests.support.spec_errors import raw_spec, spec_errors


def test_method_defaults_to_sft_without_dpo_settings() -> None:
    spec = JobSpec.model_validate(raw_spec())
    assert spec.method.kind == "sft" and spec.method.dpo is None


def test_dpo_gets_the_papers_default_settings() -> None:
    spec = JobSpec.model_validate(raw_spec(method={"kind": "dpo"}))
    dpo = spec.method.dpo
    assert dpo is not None
    assert (dpo.beta, dpo.loss_type, dpo.label_smoothing, dpo.reference) == (
        0.1, "sigmoid", 0.0, "initial",
    )  # fmt: skip
    spec = JobSpec.model_validate(
        raw_spec(method={"kind": "dpo", "dpo": {"beta": 0.5, "loss_type": "ipo"}})
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
    errors = spec_errors(raw_spec(method={"kind": "dpo", "dpo": dpo}))
    assert ("method", "dpo", field) in errors


def test_label_smoothing_is_refused_with_ipo() -> None:
    errors = spec_errors(
        raw_spec(method={"kind": "dpo", "dpo": {"loss_type": "ipo", "label_smoothing": 0.1}})
    )
    assert "sigmoid' only" in errors[("method", "dpo")]


def test_dpo_settings_with_sft_are_refused() -> None:
    errors = spec_errors(raw_spec(method={"kind": "sft", "dpo": {"beta": 0.2}}))
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
    errors = spec_errors(
        raw_spec(
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
            raw_spec(
                model={"init_from": {"job": 1}},  # LoRA adapts trained weights
                method={"kind": "dpo"},
                parallelism={"strategy": strategy},
                resources={"procs_per_node": procs},
                lora=lora,
            )
        )


def test_dpo_refuses_qat() -> None:
    errors = spec_errors(raw_spec(method={"kind": "dpo"}, qat={}))
    assert "method 'dpo'" in errors[("qat",)]


def test_dpo_refuses_packing() -> None:
    errors = spec_errors(
        raw_spec(method={"kind": "dpo"}, data={"dataset": "ds_1", "packing": True})
    )
    assert "one pair per row" in errors[("data", "packing")]
