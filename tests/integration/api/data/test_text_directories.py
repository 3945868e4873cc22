"""A `text` directory dataset is its text (issue 45, item 1): registration reads every selected
file, leaves out what is not UTF-8 text and says so; the file filter it was registered with
is part of the dataset and every job on it applies it.

The directory is the quickstart's own: this machine's Python standard library (sources, a
static library, object files, wheels, icons)."""

from __future__ import annotations

import fnmatch
import sysconfig
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.datasets.service import DEFAULT_EXCLUDE
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, counts

STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _selected(root: Path, include: list[str], exclude: list[str]) -> list[Path]:
    """What a filter selects, by pathlib's glob and fnmatch: the test's own reading."""
    found = {p for pattern in include for p in root.glob(pattern) if p.is_file()}
    rel = {p: p.relative_to(root).as_posix() for p in found}
    return sorted(p for p in found if not any(fnmatch.fnmatchcase(rel[p], x) for x in exclude))


def _is_text(data: bytes, *, block: bool = False) -> bool:
    """No NUL byte and UTF-8 throughout (`block`: but for a character cut by its end)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not (block and exc.reason == "unexpected end of data"):
            return False
    return b"\x00" not in data


def _binary(path: Path) -> bool:
    """The first MiB is not text: the rule by which a directory leaves a file out."""
    return not _is_text(path.read_bytes()[: 1 << 20], block=True)


def _repaired(path: Path) -> bool:
    return not _binary(path) and not _is_text(path.read_bytes())


def _register(client: TestClient, project: ProjectKey, **body: Any) -> Any:
    name = f"stdlib-{uuid.uuid4().hex[:6]}"
    return client.post("/v1/datasets", json={"name": name, **body}, headers=project.headers)


def test_the_stdlib_directory_leaves_out_its_binary_files_and_says_which(
    client: TestClient, project: ProjectKey
) -> None:
    answer = _register(client, project, uri=str(STDLIB))
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    assert (ds["include"], ds["exclude"]) == (["**/*"], DEFAULT_EXCLUDE)
    selected = _selected(STDLIB, ["**/*"], DEFAULT_EXCLUDE)
    binary = [p for p in selected if _binary(p)]
    assert binary  # a static library, wheels, icons: the 64% of bytes
    left = ds["left_out"]
    assert (left["files"], left["of_files"]) == (len(binary), len(selected))
    assert left["bytes"] == sum(p.stat().st_size for p in binary)
    assert left["of_bytes"] == sum(p.stat().st_size for p in selected)
    shown = [e["path"] for e in left["examples"]]
    assert shown == [p.relative_to(STDLIB).as_posix() for p in binary][:20]
    assert all(e["reason"].startswith(e["path"] + ": byte ") for e in left["examples"])
    repaired = [p.relative_to(STDLIB).as_posix() for p in selected if _repaired(p)]
    assert left["repaired_files"] == len(repaired)
    assert [e["path"] for e in left["repaired"]] == repaired[:20]
    assert client.get(f"/v1/datasets/{ds['id']}", headers=project.headers).json() == ds


def test_a_directorys_filter_travels_with_it_into_every_job(
    client: TestClient, project: ProjectKey
) -> None:
    """The quickstart's `**/*.py` is the dataset's: a job naming the dataset reads its sources
    only, unless it sets its own `include`; its own excludes add to the dataset's."""
    answer = _register(client, project, uri=str(STDLIB), include=["**/*.py"], exclude=["test/*"])
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    assert (ds["include"], ds["exclude"]) == (["**/*.py"], ["test/*"])
    selected = _selected(STDLIB, ["**/*.py"], ["test/*"])
    assert ds["left_out"]["of_files"] == len(selected)
    assert ds["left_out"]["files"] == sum(_binary(p) for p in selected)
    assert ds["left_out"]["repaired_files"] == sum(_repaired(p) for p in selected)

    def submitted(data: dict[str, Any]) -> dict[str, Any]:
        spec = {"name": "j", "data": {"dataset": ds["name"], **data}}
        answer = client.post("/v1/jobs", json=spec, headers=project.headers)
        assert answer.status_code == 201, answer.text
        stored: dict[str, Any] = answer.json()["spec"]["data"]
        return stored

    plain = submitted({})
    assert (plain["dataset"], plain["include"], plain["exclude"]) == (
        ds["id"], ["**/*.py"], ["test/*"],
    )  # fmt: skip
    own = submitted({"include": ["json/*.py"], "exclude": ["json/tool.py", "test/*"]})
    assert (own["include"], own["exclude"]) == (["json/*.py"], ["test/*", "json/tool.py"])


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        pytest.param(
            {"include": ["**/*.nothing"]}, ["body", "include"], "no file matches", id="none"
        ),
        pytest.param(
            {"include": ["ensurepip/_bundled/*.whl"]},
            ["body", "include"],
            "is UTF-8 text",
            id="only_binary",
        ),
        pytest.param(
            {"uri": str(STDLIB / "json" / "__init__.py"), "include": ["*.py"]},
            ["body", "include"],
            "is a file",
            id="filter_on_a_file",
        ),
        pytest.param({"include": []}, ["body", "include"], "at least 1", id="empty_include"),
        pytest.param({"exclude": ["a\x00"]}, ["body", "exclude", 0], "pattern", id="nul"),
    ],
)
def test_a_filter_that_selects_no_text_is_refused_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    engine: Engine,
    body: dict[str, Any],
    loc: list[Any],
    words: str,
) -> None:
    before = counts(engine, project.project_id)
    answer = _register(client, project, **{"uri": str(STDLIB), **body})
    error = assert_error(answer, 422, "validation_error", loc)
    assert words in str(error), error
    assert counts(engine, project.project_id) == before
