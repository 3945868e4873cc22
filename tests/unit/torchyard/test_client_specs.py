"""Spec files and ``--set`` overrides become the nested dict the API receives."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchyard.specs import SpecFileError, apply_overrides, load_spec, parse_override, parse_value


def test_set_builds_nested_dicts_and_keeps_siblings() -> None:
    spec = {"name": "a", "train": {"max_steps": 10, "precision": "fp32"}}
    out = apply_overrides(spec, ["train.max_steps=600", "model.n_heads=8", "labels.team=nlp"])
    assert out == {
        "name": "a",
        "train": {"max_steps": 600, "precision": "fp32"},
        "model": {"n_heads": 8},
        "labels": {"team": "nlp"},
    }
    assert spec["train"]["max_steps"] == 10, "the input must not be modified"


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("600", 600),
        ("2e-3", 0.002),
        ("0.5", 0.5),
        ("true", True),
        ("null", None),
        ('"123"', "123"),
        ('["**/*.py", "**/*.txt"]', ["**/*.py", "**/*.txt"]),
        ("[a, b]", ["a", "b"]),
        ("{k: v}", {"k": "v"}),
        ("ds_abc123", "ds_abc123"),
        ("def ", "def "),
        ("a=b", "a=b"),
        ("", ""),
    ],
)
def test_set_values_are_typed_like_json(raw: str, value: object) -> None:
    assert parse_value(raw) == value


def test_set_splits_on_the_first_equals_sign() -> None:
    assert parse_override("sample.prompt=x = 1") == (["sample", "prompt"], "x = 1")


def test_set_indexes_into_an_existing_list() -> None:
    out = apply_overrides({"data": {"include": ["a", "b"]}}, ["data.include.1=c"])
    assert out["data"]["include"] == ["a", "c"]


@pytest.mark.parametrize("bad", ["train.max_steps", "train..x=1", "=1"])
def test_malformed_set_is_rejected(bad: str) -> None:
    with pytest.raises(SpecFileError):
        apply_overrides({}, [bad])


def test_set_through_a_scalar_names_the_path() -> None:
    with pytest.raises(SpecFileError, match=r"name\.first"):
        apply_overrides({"name": "x"}, ["name.first.second=1"])


def test_yaml_and_json_files_load_to_the_same_dict(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("name: a\ntrain:\n  max_steps: 5\n  lr: 2.0e-3\n")
    (tmp_path / "s.json").write_text('{"name": "a", "train": {"max_steps": 5, "lr": 0.002}}')
    assert load_spec(tmp_path / "s.yaml") == load_spec(tmp_path / "s.json")


def test_unknown_extension_is_read_as_yaml(tmp_path: Path) -> None:
    (tmp_path / "spec.txt").write_text("name: b\n")
    assert load_spec(tmp_path / "spec.txt") == {"name": "b"}


@pytest.mark.parametrize(
    ("filename", "text", "message"),
    [
        ("s.yaml", "- a\n- b\n", "must be a mapping"),
        ("s.json", "{nope", "not valid JSON"),
        ("s.yaml", "a: [1,\n", "not valid YAML"),
    ],
)
def test_bad_spec_files_say_what_is_wrong(
    tmp_path: Path, filename: str, text: str, message: str
) -> None:
    (tmp_path / filename).write_text(text)
    with pytest.raises(SpecFileError, match=message):
        load_spec(tmp_path / filename)


def test_missing_spec_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecFileError, match="No such file"):
        load_spec(tmp_path / "absent.yaml")
