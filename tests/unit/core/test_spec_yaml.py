"""Reading a spec text with the line of every field (core/jobs/spec_yaml.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.jobs.spec_yaml import parse
from core.platform.errors import InvalidInput
from jobspec.job import JobSpec
from torchyard.specs import load_spec

SPEC = """\
name: my-run   # a comment
data:
  dataset: ds_abc
optim:
  lr: 3e-4
  grad_clip: 1.0
labels: {team: nlp}
train:
  micro_batch_size: 0
"""


def test_every_field_and_list_item_has_its_line_and_column() -> None:
    doc = parse(SPEC + "pipeline:\n  split_points:\n    - 1\n    - 3\n")
    assert doc.positions[("name",)] == (1, 1)
    assert doc.positions[("data", "dataset")] == (3, 3)
    assert doc.positions[("train", "micro_batch_size")] == (9, 3)
    assert doc.positions[("labels", "team")] == (7, 10)
    assert doc.positions[("pipeline", "split_points", 1)] == (13, 7)
    assert doc.locate(["body_tag_absent", "train", "micro_batch_size"]) == (9, 3)
    # a missing field points at the deepest written parent
    assert doc.locate(["train", "max_steps"]) == (8, 1)


def test_floats_without_a_dot_are_numbers_as_in_json() -> None:
    doc = parse(SPEC)
    assert doc.data["optim"] == {"lr": 3e-4, "grad_clip": 1.0}
    assert doc.data["labels"] == {"team": "nlp"}


def test_json_text_is_read_too() -> None:
    doc = parse('{\n  "name": "x",\n  "train": {"max_steps": 5}\n}')
    assert doc.data == {"name": "x", "train": {"max_steps": 5}}
    assert doc.positions[("train", "max_steps")] == (3, 13)


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("name: x\ndata: [1, 2\n", 3, "not YAML"),
        ("name: x\n  bad: indent\n", 2, "not YAML"),
        ("", 1, "empty"),
        ("- 1\n- 2\n", 1, "mapping"),
        ("a: &x [1]\nb: *x\n", 2, "aliases"),
        ("name: x\ntrain:\n  max_steps: .inf\n", 3, "finite"),
        ("name: x\n---\nname: y\n", 2, "not YAML"),
        ("name: x\nentrypoint:\n  inputs:\n    a: {path: /x}\n    a: {path: /y}\n", 5, "twice"),
    ],
)
def test_texts_that_are_no_spec_are_refused_at_their_line(text: str, line: int, says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse(text)
    (detail,) = caught.value.details
    assert detail["line"] == line, detail
    assert says in detail["msg"], detail


def test_an_alias_bomb_is_refused_without_expanding_it() -> None:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    with pytest.raises(InvalidInput, match="aliases"):
        parse("\n".join(rows))


def test_yaml_1_1_booleans_are_strings_so_retries_on_is_a_key(tmp_path: Path) -> None:
    """`on`, `yes`, `no` stay strings (YAML 1.2): the server and the CLI read `retries.on` the
    same way, and only `true`/`false` are booleans."""
    text = "name: x\ndata: {uri: /d}\nretries:\n  on: {oom: 1, hang: 2}\nlabels: {a: yes, b: no}\n"
    server = parse(text).data
    (tmp_path / "spec.yaml").write_text(text)
    client = load_spec(tmp_path / "spec.yaml")
    assert server == client
    assert server["retries"] == {"on": {"oom": 1, "hang": 2}}
    assert server["labels"] == {"a": "yes", "b": "no"}
    assert JobSpec.model_validate(server).retries.on == {"oom": 1, "hang": 2}
    assert parse("a: true\nb: False\n").data == {"a": True, "b": False}
