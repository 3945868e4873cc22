"""`entrypoint.inputs` (`jobspec.inputs`): each input is one of four kinds, told by its key, and
every problem is reported at `entrypoint.inputs.<name>[.<field>]` without a union's tag."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.inputs import (
    BaseModelInput,
    CheckpointInput,
    DatasetInput,
    PathInput,
    env_name,
    mount_path,
)
from jobspec.job import ScriptJobSpec
from torchyard import train


def _spec(inputs: Any) -> dict[str, Any]:
    return {
        "name": "inputs",
        "entrypoint": {"code": "code_0123456789abcdef", "command": ["python", "t.py"], **inputs},
    }


def test_each_kind_of_input_is_read_by_the_key_it_holds() -> None:
    spec = ScriptJobSpec.model_validate(
        _spec(
            {
                "inputs": {
                    "corpus": {"dataset": "stdlib"},
                    "model": {"base_model": "tiny-llama"},
                    "start": {"job": 12},
                    "pinned": {"job": 12, "checkpoint": 40},
                    "raw": {"path": "s3://corpora/wiki/"},
                }
            }
        )
    )
    got = spec.entrypoint.inputs
    assert got["corpus"] == DatasetInput(dataset="stdlib")
    assert got["model"] == BaseModelInput(base_model="tiny-llama")
    assert got["start"] == CheckpointInput(job=12)
    assert got["pinned"] == CheckpointInput(job=12, checkpoint=40)
    assert got["raw"] == PathInput(path="s3://corpora/wiki/")
    # A stored spec reads back as it was written.
    again = ScriptJobSpec.model_validate(spec.model_dump(mode="json"))
    assert again.entrypoint.inputs == got


def test_a_spec_without_inputs_has_none() -> None:
    assert ScriptJobSpec.model_validate(_spec({})).entrypoint.inputs == {}


def test_every_bad_input_is_reported_at_its_own_path() -> None:
    with pytest.raises(ValidationError) as caught:
        ScriptJobSpec.model_validate(
            _spec(
                {
                    "inputs": {
                        "Corpus": {"dataset": "x"},  # a name with a capital
                        "two": {"dataset": "a", "path": "/b"},  # two kinds at once
                        "none": {},
                        "text": "stdlib",  # not a mapping
                        "early": {"job": 0},
                        "typo": {"dataset": "x", "sha265": "0"},
                    }
                }
            )
        )
    found = {".".join(map(str, e["loc"])): e["type"] for e in caught.value.errors()}
    assert found == {
        "entrypoint.inputs.Corpus": "input_name",
        "entrypoint.inputs.two": "input_kind",
        "entrypoint.inputs.none": "input_kind",
        "entrypoint.inputs.text": "input_kind",
        "entrypoint.inputs.early.job": "greater_than_equal",
        "entrypoint.inputs.typo.sha265": "extra_forbidden",
    }


def test_an_inputs_path_inside_and_its_variable() -> None:
    assert mount_path("corpus") == "/inputs/corpus"
    assert env_name("base_model") == "TORCHYARD_INPUT_BASE_MODEL"
    # `torchyard.train` reads the same variables without importing the spec.
    assert env_name("x").removesuffix("X") == train.INPUT_ENV_PREFIX
