"""Every job and sweep spec shown in README.md, the docs site (docs/**/*.md) and examples/ is
one the server accepts (issue 45: the README's sweep was refused as written).

Each YAML block of the docs that holds a mapping is read as `POST /v1/spec/validate` reads a
spec (`core.jobs.spec_yaml.parse`, then `jobspec.problems.spec_errors`, the same field and
cross-field checks) or, with `space`, as `POST /v1/sweeps` reads a sweep (`SweepSpec`). A block
showing part of a spec (no `name`) is checked on a minimal job that gives the rest. What a
server fills in or checks against its database (a `--code` archive's id, a dataset's existence)
is the API's to test, not this."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.jobs import spec_yaml
from jobspec.problems import spec_errors
from jobspec.sweep import SweepSpec
from tests.support.doc_blocks import README, ROOT, yaml_blocks

DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
SPEC_FILES = sorted((ROOT / "examples").glob("*/spec.yaml"))
# What `torchyard submit --code DIR` sets: the uploaded archive's id.
CODE = "code_0123456789abcdef"
# The rest of a job around a block that shows a part of one.
TRAINER_REST: dict[str, Any] = {"name": "doc", "data": {"dataset": "ds_1"}}


BLOCKS = [b for doc in DOCS for b in yaml_blocks(doc)] + [
    (str(f.relative_to(ROOT)), f.read_text()) for f in SPEC_FILES
]


def as_submitted(data: dict[str, Any]) -> dict[str, Any]:
    """A doc block as a whole job: a part completed with `TRAINER_REST`, an entrypoint given the
    code id `--code` sets."""
    if "name" not in data:
        data = {**({"name": "doc"} if "entrypoint" in data else TRAINER_REST), **data}
    if "entrypoint" in data and "code" not in data["entrypoint"]:
        data = {**data, "entrypoint": {"code": CODE, **data["entrypoint"]}}
    return data


def spec_problems(text: str) -> list[tuple[str, str]]:
    """(path, message) of everything the server would refuse in the spec or sweep `text`."""
    data = spec_yaml.parse(text).data
    if "space" in data:
        base = as_submitted(data.get("base", {}))
        try:
            SweepSpec.model_validate({**data, "base": base})
        except ValidationError as exc:
            return [(".".join(map(str, e["loc"])), e["msg"]) for e in exc.errors()]
        return []
    found = spec_errors(as_submitted(data))
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in found.errors]


def test_the_docs_show_job_and_sweep_specs() -> None:
    """The extraction finds what it checks: the README's sweep and eval job, the guides' LoRA
    example and job spec."""
    texts = [text for _, text in BLOCKS]
    assert any("space:" in t for t in texts)
    assert any("lora:" in t for t in texts)
    assert any("evaluate:" in t for t in texts)
    wheres = {where.split(":")[0] for where, _ in BLOCKS}
    assert {"README.md", "docs/job-spec.md", "docs/fine-tuning.md", "docs/evals.md"} <= wheres


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_every_spec_in_the_docs_is_accepted(where: str, text: str) -> None:
    assert spec_problems(text) == [], f"{where} shows a spec the server refuses"


def test_a_refused_doc_example_fails_the_check() -> None:
    """The check catches what issue 45 found: the old README sweep (LoRA rank swept on a GPT
    trained from scratch) and warmup past max_steps."""
    old_sweep = """
name: lr
base: {name: gpt, data: {dataset: ds_1}, train: {max_steps: 600}}
space:
  lora.r: {choice: [8, 16, 32]}
"""
    assert [path for path, _ in spec_problems(old_sweep)] == ["space.lora.r"]
    warmup = "optim: {warmup_steps: 75}\ntrain: {max_steps: 60}\n"
    assert [path for path, _ in spec_problems(warmup)] == ["optim.warmup_steps"]
