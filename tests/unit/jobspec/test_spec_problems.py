"""`jobspec.problems.spec_errors`: a spec's field errors and the cross-field rules they hid, in
one list; an unknown field's likeliest meaning; the repaired spec for the reference checks."""

from __future__ import annotations

from typing import Any

import pytest

from jobspec.job import JobSpec, ScriptJobSpec
from jobspec.problems import spec_errors

BASE: dict[str, Any] = {"name": "a", "data": {"uri": "/d"}}


def _locs(data: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    return {tuple(e["loc"]): e["msg"] for e in spec_errors(data).errors}


def test_a_valid_spec_has_no_errors_and_comes_back_parsed() -> None:
    found = spec_errors({**BASE, "train": {"max_steps": 20}})
    assert found.errors == [] and isinstance(found.repaired, JobSpec)
    assert found.repaired.eval.interval_steps == 20  # the default fitted to max_steps


def test_field_errors_and_the_rules_they_hid_come_together() -> None:
    found = _locs({**BASE, "model": {"n_heads": 3, "d_model": 128}, "train": {"max_steps": -5}})
    assert set(found) == {("train", "max_steps"), ("model", "n_heads")}
    assert "must divide d_model" in found[("model", "n_heads")]


def test_a_rule_about_a_field_already_reported_is_not_repeated() -> None:
    # n_heads is itself invalid (0): the divisibility rule on it would only restate that
    found = _locs({**BASE, "model": {"n_heads": 0, "d_model": 128}})
    assert list(found) == [("model", "n_heads")]


@pytest.mark.parametrize(
    ("section", "wrong", "meant"),
    [
        ("optim", "learning_rate", "optim.lr"),
        ("optim", "weight_decy", "optim.weight_decay"),
        ("train", "batch_size", "train.micro_batch_size"),
        ("train", "gradient_accumulation_steps", "train.grad_accum_steps"),
        ("model", "n_layer", "model.n_layers"),
    ],
)
def test_an_unknown_field_names_the_one_it_most_likely_meant(
    section: str, wrong: str, meant: str
) -> None:
    found = _locs({**BASE, section: {wrong: 1}})
    assert found[(section, wrong)] == f"unknown field; did you mean `{meant}`?"


def test_an_unknown_top_level_field_and_one_of_a_script_job() -> None:
    assert (
        _locs({**BASE, "optimizer": {}})[("optimizer",)] == "unknown field; did you mean `optim`?"
    )
    script = {
        "name": "s",
        "entrypoint": {"code": "code_0123456789abcdef", "command": ["x"], "envs": {}},
    }
    assert "did you mean `entrypoint.env`?" in _locs(script)[("entrypoint", "envs")]
    found = spec_errors(
        {"name": "s", "entrypoint": {"code": "code_0123456789abcdef", "command": ["x"]}}
    )
    assert isinstance(found.repaired, ScriptJobSpec)


def test_the_repaired_spec_keeps_what_was_valid_for_the_reference_checks() -> None:
    found = spec_errors({"name": "a", "data": {"dataset": "ds_x"}, "train": {"max_steps": -1}})
    assert found.repaired is not None and found.repaired.data.dataset == "ds_x"


@pytest.mark.parametrize(
    ("section", "field", "wrong", "meant"),
    [
        ("parallelism", "strategy", "dpp", "ddp"),
        ("train", "precision", "bf61", "bf16"),
        ("model", "kind", "gtp", "gpt"),
    ],
)
def test_a_value_that_is_not_one_of_the_choices_names_the_one_it_most_likely_meant(
    section: str, field: str, wrong: str, meant: str
) -> None:
    """Issue 45, item 8: `strategy: dpp` had no did-you-mean; an unknown field had."""
    msg = _locs({**BASE, section: {field: wrong}})[(section, field)]
    assert msg.startswith("Input should be ") and msg.endswith(f"; did you mean `{meant}`?")


def test_a_value_far_from_every_choice_lists_them_without_a_guess() -> None:
    msg = _locs({**BASE, "parallelism": {"strategy": "zzzz"}})[("parallelism", "strategy")]
    assert msg == "Input should be 'single', 'ddp', 'fsdp', 'tensor' or 'pipeline'"


@pytest.mark.parametrize(
    ("spec", "loc", "words"),
    [
        ({"name": "my run"}, ("name",), "letters, digits, '.', '_' and '-', starting with"),
        (
            {"entrypoint": {"command": ["x"], "inputs": {"Corpus": {"path": "/d"}}}},
            ("entrypoint", "inputs", "Corpus"),
            "lower-case letters, digits and '_', starting with a letter",
        ),
    ],
)
def test_a_name_that_breaks_its_pattern_is_told_in_words_not_a_regex(
    spec: dict[str, Any], loc: tuple[Any, ...], words: str
) -> None:
    data = {**BASE, **spec}
    if "entrypoint" in spec:
        data.pop("data")
    found = {tuple(e["loc"]): e for e in spec_errors(data).errors}
    msg = next(e["msg"] for at, e in found.items() if at[: len(loc)] == loc)
    assert words in msg and "pattern" not in msg and "^" not in msg


def test_problems_come_in_the_order_the_spec_writes_its_fields() -> None:
    """A YAML file's problems listed by line: the order of the keys as parsed, whatever the
    order pydantic or the cross-field rules found them in."""
    data = {
        "name": "a",
        "train": {"precision": "fp4", "max_steps": -1},
        "model": {"n_heads": 3, "d_model": 128},
        "optim": {"lrr": 1},
        "data": {"uri": "/d"},
        "parallelism": {"strategy": "dpp"},
    }
    found = [tuple(e["loc"]) for e in spec_errors(data).errors]
    assert found == [
        ("train", "precision"),
        ("train", "max_steps"),
        ("model", "n_heads"),  # the divisibility rule, found after every field error
        ("optim", "lrr"),
        ("parallelism", "strategy"),
    ]
