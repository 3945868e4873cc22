"""JobSpec validation of LoRA / QLoRA and Hugging Face models: each conflict is an error at the
JSON path of the field to change, before any GPU is allocated."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec.job import InitFromSpec, JobSpec, LoRASpec
from tests.support.spec_errors import raw_spec, spec_errors

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 256,
}
# Trained weights to adapt: an earlier job's checkpoint (LoRA on a random init is refused).
PRETRAINED = {"init_from": {"job": 1}}


def test_lora_defaults_and_hf_model_from_config_are_valid() -> None:
    spec = JobSpec.model_validate(
        raw_spec(
            model={"kind": "hf", "hf": {"from_config": LLAMA}, **PRETRAINED}, lora={}, qlora={}
        )
    )
    assert spec.lora is not None and spec.lora.r == 8 and spec.lora.target_modules is None
    assert spec.qlora is not None and spec.qlora.quant_type == "nf4" and spec.qlora.double_quant
    assert spec.model.hf is not None and spec.model.hf.tokenizer == "auto"


@pytest.mark.parametrize(
    "targets", [["wq", "wv"], ["attn.wo", "mlp.fc"], ["blocks.1.mlp.proj"]], ids=str
)
def test_gpt_lora_targets_match_linear_names_or_dotted_suffixes(targets: list[str]) -> None:
    spec = JobSpec.model_validate(
        raw_spec(model={"n_layers": 2, **PRETRAINED}, lora={"target_modules": targets})
    )
    assert spec.lora is not None and spec.lora.target_modules == targets


def test_gpt_lora_target_that_does_not_exist_names_target_modules() -> None:
    errors = spec_errors(
        raw_spec(model={"n_layers": 2, **PRETRAINED}, lora={"target_modules": ["wq", "q_proj"]})
    )
    assert list(errors) == [("lora", "target_modules")]
    assert "q_proj" in errors[("lora", "target_modules")]
    assert "'wq'" in errors[("lora", "target_modules")]  # the message lists the valid names


def test_gpt_lora_target_in_a_block_the_model_lacks_is_rejected() -> None:
    errors = spec_errors(
        raw_spec(model={"n_layers": 2, **PRETRAINED}, lora={"target_modules": ["blocks.2.attn.wq"]})
    )
    assert list(errors) == [("lora", "target_modules")]


def test_gpt_modules_to_save_must_be_a_non_linear_module_of_the_model() -> None:
    JobSpec.model_validate(raw_spec(model=PRETRAINED, lora={"modules_to_save": ["ln_f", "ln_1"]}))
    errors = spec_errors(raw_spec(model=PRETRAINED, lora={"modules_to_save": ["wte"]}))
    assert list(errors) == [("lora", "modules_to_save")]


@pytest.mark.parametrize(
    ("field", "strategy", "procs", "extra"),
    [
        ("lora", "tensor", 2, {}),
        ("lora", "pipeline", 2, {"train": {"micro_batch_size": 16}}),
        ("qlora", "tensor", 2, {}),
        ("lora", "fsdp", 2, {"tensor_parallel_size": 2}),
    ],
    ids=["lora_tensor", "lora_pipeline", "qlora_tensor", "lora_fsdp_2d"],
)
def test_lora_with_tensor_or_pipeline_parallelism_is_rejected(
    field: str, strategy: str, procs: int, extra: dict[str, Any]
) -> None:
    parallelism = {"strategy": strategy}
    if "tensor_parallel_size" in extra:
        parallelism["tensor_parallel_size"] = extra.pop("tensor_parallel_size")
    raw = raw_spec(
        **{field: {}},
        model=PRETRAINED,
        parallelism=parallelism,
        resources={"procs_per_node": procs},
        **extra,
    )
    errors = spec_errors(raw)
    assert (field,) in errors
    assert "single, ddp or fsdp" in errors[(field,)]


def test_qlora_with_fsdp_is_rejected_and_says_why() -> None:
    errors = spec_errors(
        raw_spec(
            model=PRETRAINED,
            qlora={},
            parallelism={"strategy": "fsdp"},
            resources={"procs_per_node": 2},
        )
    )
    assert list(errors) == [("qlora",)]
    assert "4-bit" in errors[("qlora",)]


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_qlora_runs_with_single_and_ddp(strategy: str) -> None:
    procs = 1 if strategy == "single" else 2
    spec = JobSpec.model_validate(
        raw_spec(model=PRETRAINED, qlora={"compute_dtype": "fp32"}, lora={"r": 4},
              parallelism={"strategy": strategy}, resources={"procs_per_node": procs})
    )  # fmt: skip
    assert spec.qlora is not None and spec.qlora.compute_dtype == "fp32"


def test_lora_with_fsdp_is_valid() -> None:
    spec = JobSpec.model_validate(
        raw_spec(
            model=PRETRAINED,
            lora={},
            parallelism={"strategy": "fsdp"},
            resources={"procs_per_node": 2},
        )
    )
    assert spec.lora == LoRASpec()  # the documented defaults, nothing else
    assert (spec.parallelism.strategy, spec.world_size, spec.qlora) == ("fsdp", 2, None)


def test_hf_kind_needs_the_hf_block() -> None:
    assert list(spec_errors(raw_spec(model={"kind": "hf"}))) == [("model", "hf")]


def test_hf_block_needs_exactly_one_source() -> None:
    both = {"kind": "hf", "hf": {"path_or_id": "/models/x", "from_config": LLAMA}}
    neither = {"kind": "hf", "hf": {}}
    for model in (both, neither):
        assert list(spec_errors(raw_spec(model=model))) == [("model", "hf")]


def test_hf_from_config_needs_a_model_type() -> None:
    errors = spec_errors(raw_spec(model={"kind": "hf", "hf": {"from_config": {"n_layer": 2}}}))
    assert list(errors) == [("model", "hf", "from_config")]


def test_hf_block_with_the_builtin_gpt_is_rejected() -> None:
    errors = spec_errors(raw_spec(model={"kind": "gpt", "hf": {"path_or_id": "/models/x"}}))
    assert list(errors) == [("model", "hf")]


@pytest.mark.parametrize("strategy", ["tensor", "pipeline"])
def test_hf_model_with_tensor_or_pipeline_parallelism_names_the_strategy(strategy: str) -> None:
    raw = raw_spec(
        model={"kind": "hf", "hf": {"path_or_id": "/models/x"}},
        parallelism={"strategy": strategy},
        resources={"procs_per_node": 2},
        train={"micro_batch_size": 16},
    )
    assert ("parallelism", "strategy") in spec_errors(raw)


def test_hf_lora_targets_are_left_to_the_trainer() -> None:
    """Their names depend on the model's architecture: the trainer checks them (exit 2)."""
    spec = JobSpec.model_validate(
        raw_spec(
            model={"kind": "hf", "hf": {"path_or_id": "/models/x"}},
            lora={"target_modules": ["q_proj", "v_proj"]},
        )
    )
    assert spec.lora is not None and spec.lora.target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"qat": {}}, ("qat",)),
        ({"checkpoint": {"export_safetensors": True}}, ("checkpoint", "export_safetensors")),
    ],
    ids=["qat", "export_safetensors"],
)
def test_lora_with_qat_or_checkpoint_export_is_rejected(
    extra: dict[str, Any], loc: tuple[str, ...]
) -> None:
    assert list(spec_errors(raw_spec(model=PRETRAINED, lora={}, **extra))) == [loc]


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"qat": {}}, ("qat",)),
        ({"checkpoint": {"export_safetensors": True}}, ("checkpoint", "export_safetensors")),
    ],
    ids=["qat", "export_safetensors"],
)
def test_hf_model_with_gpt_only_features_is_rejected(
    extra: dict[str, Any], loc: tuple[str, ...]
) -> None:
    raw = raw_spec(model={"kind": "hf", "hf": {"path_or_id": "/models/x"}}, **extra)
    assert list(spec_errors(raw)) == [loc]


def test_hf_model_init_from_an_earlier_job_is_valid() -> None:
    model = {"kind": "hf", "hf": {"path_or_id": "/models/x"}, "init_from": {"job": 1}}
    spec = JobSpec.model_validate(raw_spec(model=model, lora={}))
    assert spec.model.init_from is not None and spec.model.init_from.job == 1


def test_lora_fine_tune_of_an_earlier_job_is_valid() -> None:
    spec = JobSpec.model_validate(raw_spec(model={"init_from": {"job": 1}}, lora={}))
    assert spec.model.init_from == InitFromSpec(job=1)  # the checkpoint is pinned at submission
    assert spec.lora == LoRASpec()


RANDOM_INIT = {
    "gpt": {"n_layers": 2},
    "hf_from_config": {"kind": "hf", "hf": {"from_config": LLAMA}},
}


@pytest.mark.parametrize("field", ["lora", "qlora"])
@pytest.mark.parametrize("model", list(RANDOM_INIT))
def test_lora_on_a_randomly_initialised_model_is_refused_at_its_field(
    field: str, model: str
) -> None:
    """Adapters on random weights train a model that ends worse than plain training (issue 45):
    the refusal names the field and what to give instead."""
    errors = spec_errors(raw_spec(model=RANDOM_INIT[model], **{field: {}}))
    assert list(errors) == [(field,)]
    message = errors[(field,)]
    assert message.startswith("LoRA adapts pretrained weights; this model starts from random")
    assert "model.init_from" in message and "model.hf.path_or_id" in message
    assert f"drop {field}" in message


def test_lora_and_qlora_on_a_random_init_are_one_error_at_lora() -> None:
    errors = spec_errors(raw_spec(lora={"r": 4}, qlora={}))
    assert list(errors) == [("lora",)]


@pytest.mark.parametrize(
    "model",
    [PRETRAINED, {"kind": "hf", "hf": {"path_or_id": "/models/x"}}],
    ids=["init_from", "hf_path_or_id"],
)
def test_lora_on_pretrained_weights_is_valid(model: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(raw_spec(model=model, lora={"r": 4}))
    assert spec.lora is not None and spec.lora.r == 4
