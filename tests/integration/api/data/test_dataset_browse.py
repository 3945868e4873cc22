"""Inside a dataset (issue 28, item 2): its files (`GET /v1/datasets/{id}/files`), a sample of
its first records (`GET /v1/datasets/{id}/sample`) and the jobs that used it
(`GET /v1/jobs?dataset=`), by id or by name, for the project's own datasets only."""

from __future__ import annotations

import io
import json
import shutil
import sysconfig
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error

STDLIB_JSON = Path(sysconfig.get_paths()["stdlib"]) / "json"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _upload(
    client: TestClient, project: ProjectKey, filename: str, body: bytes, **form: str
) -> dict[str, Any]:
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": _name(filename.split(".")[0]), **form},
        files={"file": (filename, body, "application/octet-stream")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _register(client: TestClient, project: ProjectKey, path: Path) -> dict[str, Any]:
    answer = client.post(
        "/v1/datasets",
        json={"name": _name(path.name), "uri": str(path)},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _expected_files(root: Path) -> list[tuple[str, int]]:
    return sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.relative_to(root).parts
    )


def test_a_directorys_files_page_through_in_path_order_without_caches(
    client: TestClient, project: ProjectKey
) -> None:
    cache = STDLIB_JSON / "__pycache__"
    assert cache.is_dir() and any(cache.iterdir())  # so leaving caches out is checked
    ds = _register(client, project, STDLIB_JSON)
    seen: list[tuple[str, int]] = []
    cursor = None
    for _ in range(20):
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get(
            f"/v1/datasets/{ds['name']}/files", params=params, headers=project.headers
        )
        assert page.status_code == 200, page.text
        items = page.json()["items"]
        assert len(items) <= 2
        seen += [(f["path"], f["size_bytes"]) for f in items]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == _expected_files(STDLIB_JSON)
    assert len(seen) == ds["num_files"]


def test_an_uploads_one_file_is_listed_with_its_size(
    client: TestClient, project: ProjectKey
) -> None:
    body = _jsonl([{"text": "hello"}, {"text": "world"}])
    ds = _upload(client, project, "notes.jsonl", body)
    answer = client.get(f"/v1/datasets/{ds['id']}/files", headers=project.headers)
    assert answer.json() == {
        "items": [{"path": "notes.jsonl", "size_bytes": len(body)}],
        "next_cursor": None,
    }


def test_a_sample_is_the_first_records_as_the_job_reads_them_long_values_cut(
    client: TestClient, project: ProjectKey
) -> None:
    long = "x" * 3000
    records = [
        {"prompt": "p1", "completion": "c1"},
        {"prompt": long, "completion": "c2"},
        {"prompt": "p3", "completion": "c3"},
    ]
    ds = _upload(client, project, "qa.jsonl", _jsonl(records))
    two = client.get(
        f"/v1/datasets/{ds['id']}/sample", params={"limit": 2}, headers=project.headers
    ).json()
    assert two["dataset_id"] == ds["id"] and two["format"] == "prompt_completion"
    assert [i["where"] for i in two["items"]] == ["qa.jsonl:1", "qa.jsonl:2"]
    assert two["items"][0] == {"where": "qa.jsonl:1", "record": records[0], "truncated": False}
    cut = two["items"][1]
    assert cut["truncated"] is True
    assert cut["record"] == {"prompt": long[:2000], "completion": "c2"}
    every = client.get(
        f"/v1/datasets/{ds['name']}/sample", params={"limit": 20}, headers=project.headers
    ).json()
    assert len(every["items"]) == 3
    assert [i["record"] for i in every["items"]][2] == records[2]


def test_a_text_directorys_sample_is_the_head_of_its_first_files(
    client: TestClient, project: ProjectKey
) -> None:
    ds = _register(client, project, STDLIB_JSON)
    sample = client.get(
        f"/v1/datasets/{ds['id']}/sample", params={"limit": 3}, headers=project.headers
    ).json()
    first = _expected_files(STDLIB_JSON)[:3]
    assert [i["where"] for i in sample["items"]] == [path for path, _ in first]
    for item, (path, _) in zip(sample["items"], first, strict=True):
        text = (STDLIB_JSON / path).read_text()
        assert item["record"] == text[:2000]
        assert item["truncated"] is (len(text) > 2000)


def test_a_token_files_sample_is_its_first_ids(client: TestClient, project: ProjectKey) -> None:
    ids = np.arange(1000, 1100, dtype=np.uint16)
    buffer = io.BytesIO()
    np.save(buffer, ids)
    ds = _upload(client, project, "ids.npy", buffer.getvalue())
    sample = client.get(f"/v1/datasets/{ds['id']}/sample", headers=project.headers).json()
    assert sample["format"] == "tokens"
    assert sample["items"] == [
        {"where": "ids.npy:0", "record": list(range(1000, 1064)), "truncated": True}
    ]


def test_a_location_gone_since_registration_is_a_409_that_says_so(
    client: TestClient, project: ProjectKey, models_root: Path
) -> None:
    gone = models_root / _name("gone")
    gone.mkdir()
    (gone / "a.txt").write_text("some text\n")
    ds = _register(client, project, gone)
    shutil.rmtree(gone)
    for what in ("files", "sample"):
        answer = client.get(f"/v1/datasets/{ds['id']}/{what}", headers=project.headers)
        assert_error(answer, 409, "conflict", ["path", "dataset_id"])
        assert f"{ds['uri']} no longer exists" in answer.json()["error"]["message"]


def test_another_projects_dataset_is_404_to_browse(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    ds = _upload(client, project, "mine.jsonl", _jsonl([{"text": "mine"}]))
    for what in ("files", "sample"):
        for ref in (ds["id"], ds["name"]):
            answer = client.get(f"/v1/datasets/{ref}/{what}", headers=other_project.headers)
            assert_error(answer, 404, "not_found")


def test_the_jobs_that_used_a_dataset_are_listed_by_its_id_or_name(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    train = _upload(client, project, "train.jsonl", _jsonl([{"text": f"t{i}"} for i in range(8)]))
    held = _upload(client, project, "held.jsonl", _jsonl([{"text": f"h{i}"} for i in range(8)]))
    qa = _upload(client, project, "qa.jsonl", _jsonl([{"prompt": "p", "completion": "c"}] * 2))

    def submit(spec: dict[str, Any]) -> int:
        answer = client.post("/v1/jobs", json=spec, headers=project.headers)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    plain = submit({"name": "plain", "data": {"dataset": train["name"]}})
    with_eval = submit(
        {"name": "with-eval", "data": {"dataset": train["id"], "eval_dataset": held["name"]}}
    )
    evals_only = submit(
        {
            "name": "evals-after",
            "data": {"dataset": qa["id"]},
            "eval_after": [{"kind": "generate", "dataset": qa["name"]}],
        }
    )

    def listed(ref: str) -> list[int]:
        answer = client.get("/v1/jobs", params={"dataset": ref}, headers=project.headers)
        assert answer.status_code == 200, answer.text
        return [j["id"] for j in answer.json()["items"]]

    assert listed(train["id"]) == [with_eval, plain]  # newest first
    assert listed(train["name"]) == [with_eval, plain]
    assert listed(held["id"]) == [with_eval]
    assert listed(qa["name"]) == [evals_only]  # named twice, listed once
    for ref in ("ds_missing", "no such name"):
        answer = client.get("/v1/jobs", params={"dataset": ref}, headers=project.headers)
        assert_error(answer, 404, "not_found", ["query", "dataset"])
    theirs = client.get("/v1/jobs", params={"dataset": train["id"]}, headers=other_project.headers)
    assert_error(theirs, 404, "not_found", ["query", "dataset"])
