"""Datasets: registering server-side paths, streamed uploads with a size cap, reading them."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.main import create_app
from core.jobs import service as jobs
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, counts
from workers import attempt

BOUNDARY = "torchyard-test-boundary"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def _stored(settings: Settings) -> set[Path]:
    root = Path(settings.storage_url) / "datasets"
    return set(root.rglob("*")) if root.exists() else set()


def _multipart(name: str, filename: str, data: bytes) -> bytes:
    return (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
            f"--{BOUNDARY}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )


@pytest.fixture(scope="module")
def small_limit_client(settings: Settings) -> Iterator[TestClient]:
    """The app with a 4 KiB upload limit."""
    small = settings.model_copy(update={"max_upload_bytes": 4096})
    with TestClient(create_app(small), raise_server_exceptions=True) as client:
        yield client


def test_register_a_directory_records_its_size_digest_and_files(
    client: TestClient, project: ProjectKey, corpus_dir: Path
) -> None:
    answer = client.post(
        "/v1/datasets", json={"name": "stdlib", "uri": str(corpus_dir)}, headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    files = [p for p in corpus_dir.iterdir() if p.is_file()]
    assert ds["id"].startswith("ds_")
    assert ds["project_id"] == project.project_id
    assert ds["uri"] == str(corpus_dir.resolve())
    assert ds["num_files"] == len(files)
    assert ds["size_bytes"] == sum(p.stat().st_size for p in files)
    assert len(ds["sha256"]) == 64
    assert client.get(f"/v1/datasets/{ds['id']}", headers=project.headers).json() == ds
    assert client.get("/v1/datasets", headers=project.headers).json() == {"items": [ds]}


@pytest.mark.parametrize(
    ("make_body", "status", "code", "loc"),
    [
        pytest.param(
            lambda c: {"name": "x", "uri": "/etc"},
            403,
            "forbidden",
            ["body", "uri"],
            id="outside_roots",
        ),
        pytest.param(
            lambda c: {"name": "x", "uri": f"{c}/../../../../etc"},
            403,
            "forbidden",
            ["body", "uri"],
            id="dotdot_escape",
        ),
        pytest.param(
            lambda c: {"name": "x", "uri": f"{c}/missing"},
            422,
            "validation_error",
            ["body", "uri"],
            id="missing_path",
        ),
        pytest.param(
            lambda c: {"name": "x", "uri": "~no-such-user-xyz/x"},
            422,
            "validation_error",
            ["body", "uri"],
            id="unknown_home",
        ),
        pytest.param(
            lambda c: {"uri": str(c)}, 422, "validation_error", ["body", "name"], id="no_name"
        ),
        pytest.param(
            lambda c: {"name": "", "uri": str(c)},
            422,
            "validation_error",
            ["body", "name"],
            id="empty_name",
        ),
        pytest.param(
            lambda c: {"name": "a\x00b", "uri": str(c)},
            422,
            "validation_error",
            ["body", "name"],
            id="nul_in_name",
        ),
        pytest.param(
            lambda c: {"name": "a\ud800", "uri": str(c)},
            422,
            "validation_error",
            ["body", "name"],
            id="surrogate_in_name",
        ),
        pytest.param(
            lambda c: {"name": "x", "uri": str(c), "extra": 1},
            422,
            "validation_error",
            ["body", "extra"],
            id="unknown_field",
        ),
        pytest.param(
            lambda c: {"name": "x", "uri": 5},
            422,
            "validation_error",
            ["body", "uri"],
            id="wrong_type",
        ),
    ],
)
def test_bad_registration_is_refused_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    corpus_dir: Path,
    engine: Engine,
    make_body: Any,
    status: int,
    code: str,
    loc: list[Any],
) -> None:
    before = counts(engine, project.project_id)
    body = json.dumps(make_body(corpus_dir)).encode()
    answer = client.post(
        "/v1/datasets",
        content=body,
        headers={**project.headers, "content-type": "application/json"},
    )
    assert_error(answer, status, code, loc)
    assert counts(engine, project.project_id) == before


def test_a_taken_name_is_409(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], corpus_dir: Path
) -> None:
    answer = client.post(
        "/v1/datasets",
        json={"name": dataset["name"], "uri": str(corpus_dir)},
        headers=project.headers,
    )
    assert_error(answer, 409, "conflict", ["body", "name"])


def test_upload_streams_to_storage_and_records_digest_and_size(
    client: TestClient, project: ProjectKey, settings: Settings
) -> None:
    data = b"def f(x):\n    return x\n" * 500
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "snippets"},
        files={"file": ("code.py", data, "text/x-python")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    assert ds["sha256"] == hashlib.sha256(data).hexdigest()
    assert ds["size_bytes"] == len(data)
    assert ds["num_files"] == 1
    stored = Path(settings.storage_url) / "datasets" / ds["id"] / "code.py"
    assert ds["uri"] == f"datasets/{ds['id']}/code.py"  # in storage, not the server's path
    assert ds["server_uri"] == str(stored)  # the caller's key is an admin's
    assert stored.read_bytes() == data
    assert client.get(f"/v1/datasets/{ds['id']}", headers=project.headers).json() == ds


def test_only_admins_see_where_the_server_keeps_a_dataset(
    client: TestClient, project: ProjectKey, settings: Settings
) -> None:
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "private"},
        files={"file": ("notes.txt", b"some text\n", "text/plain")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    ds_id = answer.json()["id"]
    made = client.post(
        "/v1/keys", json={"name": "reader", "role": "viewer"}, headers=project.headers
    )
    assert made.status_code == 201, made.text
    reader = {"Authorization": f"Bearer {made.json()['secret']}"}
    for path in (f"/v1/datasets/{ds_id}", "/v1/datasets"):
        seen = client.get(path, headers=reader)
        assert seen.status_code == 200, seen.text
        assert settings.storage_url not in seen.text
        assert str(Path(settings.storage_url).resolve()) not in seen.text
    one = client.get(f"/v1/datasets/{ds_id}", headers=reader).json()
    assert one["uri"] == f"datasets/{ds_id}/notes.txt"
    assert one["server_uri"] is None


@pytest.mark.parametrize(
    ("filename", "stored_as"),
    [
        ("../../escape.txt", "escape.txt"),
        ("..\\..\\win.txt", "win.txt"),
        ("/etc/passwd", "passwd"),
        ("..", "data"),
        (".hidden", "hidden"),
        ("we ird;$name.txt", "we_ird__name.txt"),
    ],
)
def test_upload_filename_cannot_leave_the_dataset_directory(
    client: TestClient, project: ProjectKey, settings: Settings, filename: str, stored_as: str
) -> None:
    answer = client.post(
        "/v1/datasets/upload",
        content=_multipart(f"f-{stored_as}", filename, b"some text\n"),
        headers={**project.headers, **MULTIPART},
    )
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    directory = Path(settings.storage_url) / "datasets" / ds["id"]
    assert [p.name for p in directory.iterdir()] == [stored_as]
    assert Path(ds["server_uri"]).parent == directory
    assert ds["uri"] == f"datasets/{ds['id']}/{stored_as}"


def test_upload_over_the_limit_by_content_length_is_413_before_reading(
    small_limit_client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    before, files = counts(engine, project.project_id), _stored(settings)
    answer = small_limit_client.post(
        "/v1/datasets/upload",
        data={"name": "big"},
        files={"file": ("big.txt", b"x" * 200_000)},
        headers=project.headers,
    )
    assert_error(answer, 413, "payload_too_large", ["header", "Content-Length"])
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files


def test_upload_over_the_limit_while_streaming_is_413_and_the_partial_file_is_removed(
    small_limit_client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    before, files = counts(engine, project.project_id), _stored(settings)
    # Content-Length is within the framing allowance; the file itself is over 4 KiB.
    answer = small_limit_client.post(
        "/v1/datasets/upload",
        content=_multipart("big", "big.txt", b"x" * 10_000),
        headers={**project.headers, **MULTIPART},
    )
    assert_error(answer, 413, "payload_too_large", ["body", "file"])
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files


def test_chunked_upload_without_content_length_is_cut_off_at_the_limit(
    small_limit_client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    before, files = counts(engine, project.project_id), _stored(settings)
    body = _multipart("big", "big.txt", b"y" * 500_000)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 16384):
            yield body[i : i + 16384]

    answer = small_limit_client.post(
        "/v1/datasets/upload", content=chunks(), headers={**project.headers, **MULTIPART}
    )
    assert "content-length" not in answer.request.headers
    assert_error(answer, 413, "payload_too_large")
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files


def test_upload_at_the_limit_is_accepted(
    small_limit_client: TestClient, project: ProjectKey
) -> None:
    answer = small_limit_client.post(
        "/v1/datasets/upload",
        content=_multipart("exact", "exact.txt", b"z" * 4096),
        headers={**project.headers, **MULTIPART},
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["size_bytes"] == 4096


def _parts(*parts: tuple[str, str | None, bytes]) -> bytes:
    out = b""
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "loc"),
    [
        pytest.param(
            _parts(("file", "a.txt", b"x")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "name"],
            id="no_name",
        ),
        pytest.param(
            _parts(("name", None, b"n")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "file"],
            id="no_file",
        ),
        pytest.param(
            _parts(("name", None, b"n"), ("file", "a.txt", b"")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "file"],
            id="empty_file",
        ),
        pytest.param(
            _parts(("name", None, b"n"), ("file", None, b"text")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "file"],
            id="file_as_text",
        ),
        pytest.param(
            _parts(("name", None, b"n"), ("file", "a", b"x"), ("file", "b", b"y")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "file"],
            id="two_files",
        ),
        pytest.param(
            _parts(("name", None, b"n"), ("file", "a", b"x"), ("extra", None, b"1")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "extra"],
            id="unknown_field",
        ),
        pytest.param(
            _parts(("name", None, b"a\x00b"), ("file", "a", b"x")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "name"],
            id="nul_in_name",
        ),
        pytest.param(
            _parts(("name", None, b"\xff\xfe"), ("file", "a", b"x")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "name"],
            id="name_not_utf8",
        ),
        pytest.param(
            _parts(("name", None, b"n" * 2000), ("file", "a", b"x")),
            MULTIPART,
            422,
            "validation_error",
            ["body", "name"],
            id="name_too_long",
        ),
        pytest.param(
            _parts(("name", None, b"n"), ("file", "a", b"x"))[:-10],
            MULTIPART,
            422,
            "validation_error",
            ["body"],
            id="truncated",
        ),
        pytest.param(
            b"garbage with no boundary at all",
            MULTIPART,
            422,
            "validation_error",
            ["body"],
            id="garbage",
        ),
        pytest.param(
            b'{"name": "x"}',
            {"content-type": "application/json"},
            422,
            "validation_error",
            ["header", "Content-Type"],
            id="json",
        ),
        pytest.param(
            b"x",
            {"content-type": "multipart/form-data"},
            422,
            "validation_error",
            ["header", "Content-Type"],
            id="no_boundary",
        ),
    ],
)
def test_bad_upload_is_refused_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    body: bytes,
    headers: dict[str, str],
    status: int,
    code: str,
    loc: list[Any],
) -> None:
    before, files = counts(engine, project.project_id), _stored(settings)
    answer = client.post(
        "/v1/datasets/upload", content=body, headers={**project.headers, **headers}
    )
    assert_error(answer, status, code, loc)
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files


def test_upload_with_a_taken_name_is_409_and_its_file_is_removed(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    settings: Settings,
) -> None:
    files = _stored(settings)
    answer = client.post(
        "/v1/datasets/upload",
        content=_multipart(dataset["name"], "a.txt", b"text"),
        headers={**project.headers, **MULTIPART},
    )
    assert_error(answer, 409, "conflict", ["body", "name"])
    assert _stored(settings) == files


def test_a_job_can_use_an_uploaded_dataset(
    client: TestClient, project: ProjectKey, engine: Engine, settings: Settings
) -> None:
    """The job pins the upload, and what its worker hands the trainer (`--data`, prepared by
    `workers.attempt.prepare` as for a run) is the uploaded file, byte for byte."""
    uploaded = b"hello world\n" * 100
    ds = client.post(
        "/v1/datasets/upload",
        content=_multipart("up", "up.txt", uploaded),
        headers={**project.headers, **MULTIPART},
    ).json()
    answer = client.post(
        "/v1/jobs",
        json={"name": "j", "data": {"dataset": ds["id"]}},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert (job["spec"]["data"]["dataset"], job["spec"]["data"]["format"]) == (ds["id"], "text")
    with Session(engine) as session:
        claimed = jobs.claim(session=session, job_id=job["id"], worker="w-datasets")
        assert claimed is not None
        session.commit()
        session.refresh(claimed)
        session.expunge(claimed)
    paths = attempt.prepare(settings, lambda: Session(engine), claimed, claimed.spec)
    assert Path(paths.data.removeprefix("file://")).read_bytes() == uploaded
    assert json.loads(paths.spec.read_text())["data"]["dataset"] == ds["id"]


def test_a_dataset_is_named_by_its_name_or_its_id_and_a_job_pins_the_id(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    """Issue 28, item 2: `GET /v1/datasets/{name}`, `data.dataset: NAME` and an eval
    evaluation's `dataset: NAME` work like the id; the stored spec holds the id, so the job
    reads what the name named at submission. Another project's name is a 404."""
    name = f"named-{uuid.uuid4().hex[:6]}"
    records = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    ds = client.post(
        "/v1/datasets/upload",
        content=_multipart(name, "qa.jsonl", body),
        headers={**project.headers, **MULTIPART},
    ).json()
    shown = client.get(f"/v1/datasets/{name}", headers=project.headers)
    assert shown.status_code == 200 and shown.json()["id"] == ds["id"], shown.text
    assert_error(
        client.get(f"/v1/datasets/{name}", headers=other_project.headers), 404, "not_found"
    )
    spec = {
        "name": "j",
        "data": {"dataset": name, "eval_dataset": name},
        "eval_after": [{"kind": "generate", "dataset": name}],
    }
    answer = client.post("/v1/jobs", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    stored = answer.json()["spec"]
    assert (stored["data"]["dataset"], stored["data"]["eval_dataset"]) == (ds["id"], ds["id"])
    assert stored["eval_after"]["evaluations"][0]["dataset"] == ds["id"]
    elsewhere = client.post("/v1/jobs", json=spec, headers=other_project.headers)
    assert_error(elsewhere, 422, "validation_error", ["body", "data", "dataset"])


def test_dataset_ids_that_cannot_exist_are_404(client: TestClient, project: ProjectKey) -> None:
    for bad in ("ds_missing", "ds%00x", "x" * 100):
        assert_error(client.get(f"/v1/datasets/{bad}", headers=project.headers), 404, "not_found")


def test_every_bad_upload_form_field_is_named_at_once_and_nothing_is_stored(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    before, files = counts(engine, project.project_id), _stored(settings)
    body = _parts(
        ("name", None, b"tab\there"),
        ("format", None, b"chat"),
        ("token_dtype", None, b"\xff"),
        ("file", "a.txt", b"text"),
    )
    answer = client.post(
        "/v1/datasets/upload", content=body, headers={**project.headers, **MULTIPART}
    )
    error = assert_error(answer, 422, "validation_error")
    assert [(d["loc"], d["type"]) for d in error["details"]] == [
        (["body", "token_dtype"], "string_unicode"),
        (["body", "name"], "string_pattern_mismatch"),
        (["body", "format"], "literal_error"),
    ]
    assert error["details"][2]["msg"] == (
        "must be one of text, jsonl_text, messages, prompt_completion, preference, tokens or "
        "prompt (got 'chat')"
    )
    assert error["message"].startswith("token_dtype: not valid UTF-8 (and 2 more)")
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files


@pytest.mark.parametrize(
    "name", ["0*", " ", "é ü", "a" * 200, "a" * 201, "", "a\x1fb", "a\x7f", "line\n", "\x85"]
)
def test_an_upload_name_is_accepted_exactly_when_the_documented_form_allows_it(
    client: TestClient, project: ProjectKey, name: str
) -> None:
    doc = client.get("/openapi.json").json()
    form = doc["paths"]["/v1/datasets/upload"]["post"]["requestBody"]["content"]
    schema = form["multipart/form-data"]["schema"]["properties"]["name"]
    allowed = jsonschema_rs.is_valid(schema, name)  # ECMA-262 regexes, as JSON Schema has them
    unique = f"{name}-{uuid.uuid4().hex[:8]}" if name and allowed and len(name) < 190 else name
    answer = client.post(
        "/v1/datasets/upload",
        content=_parts(("name", None, unique.encode()), ("file", "a.txt", b"text")),
        headers={**project.headers, **MULTIPART},
    )
    if allowed:
        assert answer.status_code == 201, answer.text
        assert answer.json()["name"] == unique
    else:
        assert_error(answer, 422, "validation_error", ["body", "name"])
