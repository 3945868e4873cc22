"""JobSpec validation: defaults, strictness and cross-field errors with JSON paths."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from jobspec.job import JobSpec, json_schema


def _spec(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "job", "data": {"dataset": "ds_1"}}
    base.update(overrides)
    return base


def _locs(exc: ValidationError) -> list[tuple[object, ...]]:
    return [tuple(e["loc"]) for e in exc.errors()]


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = JobSpec.model_validate(_spec())
    assert spec.parallelism.strategy == "ddp"
    assert spec.world_size == 1
    assert spec.global_batch_size == spec.train.micro_batch_size


def test_unknown_field_is_rejected_with_its_path() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(model={"n_layer": 2}))
    assert ("model", "n_layer") in _locs(exc.value)


def test_negative_size_is_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(train={"micro_batch_size": -1}))
    assert ("train", "micro_batch_size") in _locs(exc.value)


def test_true_or_false_is_no_number_and_is_refused_at_its_path() -> None:
    """Pydantic's lax mode read `max_steps: true` as 1 and `dropout: false` as 0.0."""
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(
            _spec(train={"max_steps": True}, model={"dropout": False}, optim={"lr": True})
        )
    assert sorted(_locs(exc.value)) == [
        ("model", "dropout"),
        ("optim", "lr"),
        ("train", "max_steps"),
    ]
    assert all("true" in str(e["input"]) or "false" in str(e["input"]) for e in exc.value.errors())


def test_true_or_false_is_no_string_either() -> None:
    """Found by the contract fuzzer: `revision: false` was passed on as the text "false", a
    valid hub revision, so the mask preview answered 200 to a body its schema refuses."""
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(
            _spec(model={"kind": "hf", "hf": {"path_or_id": "gpt2", "revision": False}})
        )
    assert _locs(exc.value) == [("model", "hf", "revision")]
    assert exc.value.errors()[0]["type"] == "string_type"


@pytest.mark.parametrize("value", [True, False])
def test_true_or_false_is_no_section_even_read_from_attributes(value: bool) -> None:
    """Found by the contract fuzzer (an order-dependent CI failure): FastAPI validates a body
    with `from_attributes`, which read the wrapped `model.hf: false` as an `hf` section of
    defaults, so the mask preview answered 200 to a body its schema refuses."""
    adapter = TypeAdapter(JobSpec)
    with pytest.raises(ValidationError) as exc:
        adapter.validate_python(_spec(model={"hf": value}), from_attributes=True)
    assert _locs(exc.value) == [("model", "hf")]


def test_a_boolean_field_still_takes_true_and_false() -> None:
    spec = JobSpec.model_validate(_spec(data={"dataset": "ds_1", "packing": False}))
    assert spec.data.packing is False


def test_heads_must_divide_width_and_error_names_n_heads() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(model={"d_model": 128, "n_heads": 3}))
    assert _locs(exc.value) == [("model", "n_heads")]
    assert "divide" in exc.value.errors()[0]["msg"]


def test_single_strategy_with_several_processes_names_procs_per_node() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(
            _spec(parallelism={"strategy": "single"}, resources={"procs_per_node": 2})
        )
    assert _locs(exc.value) == [("resources", "procs_per_node")]


def test_data_needs_exactly_one_source() -> None:
    for data in ({}, {"dataset": "ds_1", "uri": "/x"}):
        with pytest.raises(ValidationError) as exc:
            JobSpec.model_validate(_spec(data=data))
        assert ("data",) in _locs(exc.value)


def test_all_cross_field_errors_are_reported_together() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(
            _spec(model={"n_heads": 3}, eval={"interval_steps": 50}, train={"max_steps": 10})
        )
    assert set(_locs(exc.value)) == {("model", "n_heads"), ("eval", "interval_steps")}


def test_json_schema_documents_every_field() -> None:
    schema = json_schema()
    undocumented = [
        f"{model}.{field}"
        for model, body in [("JobSpec", schema), *schema["$defs"].items()]
        for field, prop in body.get("properties", {}).items()
        if "description" not in prop
    ]
    assert not undocumented


def test_inplace_restarts_are_for_single_node_jobs_only() -> None:
    retries = {"max_inplace_restarts": 2}
    assert JobSpec.model_validate(_spec(retries=retries)).retries.max_inplace_restarts == 2
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(retries=retries, resources={"nodes": 2}))
    assert _locs(exc.value) == [("retries", "max_inplace_restarts")]


def test_epochs_replace_the_default_step_count_and_survive_a_round_trip() -> None:
    spec = JobSpec.model_validate(_spec(train={"epochs": 3}))
    assert (spec.train.max_steps, spec.train.epochs) == (None, 3)
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert JobSpec.model_validate(_spec()).train.max_steps == 1000  # no epochs: the default


@pytest.mark.parametrize(
    ("train", "loc"),
    [
        ({"epochs": 3, "max_steps": 100}, ("train", "epochs")),
        ({"max_steps": None}, ("train", "max_steps")),
    ],
    ids=["both", "neither"],
)
def test_exactly_one_of_max_steps_and_epochs_ends_training(
    train: dict[str, object], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(train=train, eval={"interval_steps": 10}))
    assert _locs(exc.value) == [loc]


def test_warmup_longer_than_the_run_is_refused_at_warmup_steps_naming_both_numbers() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(optim={"warmup_steps": 75}, train={"max_steps": 60}))
    assert _locs(exc.value) == [("optim", "warmup_steps")]
    message = exc.value.errors()[0]["msg"]
    assert "warmup_steps (75) exceeds train.max_steps (60)" in message


def test_warmup_as_long_as_the_run_is_valid() -> None:
    spec = JobSpec.model_validate(_spec(optim={"warmup_steps": 60}, train={"max_steps": 60}))
    assert spec.optim.warmup_steps == 60


def test_the_default_warmup_fits_a_shorter_run_and_survives_a_round_trip() -> None:
    """A default never makes a valid spec invalid: 50 warmup steps left out of a 20-step run
    warm up over the 20 (and the stored spec, every field written out, reads back)."""
    spec = JobSpec.model_validate(_spec(train={"max_steps": 20}))
    assert spec.optim.warmup_steps == 20
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert JobSpec.model_validate(_spec()).optim.warmup_steps == 50


def test_warmup_of_a_run_by_epochs_is_not_checked_at_submission() -> None:
    """Its step count depends on the dataset's rows, known when the run starts."""
    spec = JobSpec.model_validate(_spec(optim={"warmup_steps": 5000}, train={"epochs": 1}))
    assert (spec.optim.warmup_steps, spec.train.max_steps) == (5000, None)
