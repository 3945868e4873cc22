"""The API on S3 storage (a real S3 server, `moto`): uploads land in the bucket and are read
back from it (dataset registration and preview, code archives, OpenAI files), and no answer
carries the storage credentials."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.datasets.service import digest_path
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.code_archives import code_files, tar_gz
from tests.integration.api.code_archives import upload as upload_code
from tests.integration.s3server import S3, keys, s3_fs, under

pytestmark = pytest.mark.s3

ROWS = [
    {"messages": [{"role": "user", "content": f"question {i}?"},
                  {"role": "assistant", "content": f"answer {i}."}]}
    for i in range(40)
]  # fmt: skip
JSONL = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS)


@pytest.fixture(scope="module")
def corpora(s3: S3) -> str:
    """A prefix of the bucket outside the storage root that the server may register datasets
    from: a data root that is a URI (`TORCHYARD_DATA_ROOTS=s3://.../`)."""
    return f"s3://{s3.bucket}/corpora-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def client(s3_settings: Settings, corpora: str) -> Iterator[TestClient]:
    settings = s3_settings.model_copy(update={"data_roots": [f"{corpora}/"]})
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


def _no_secret(s3: S3, *texts: str) -> None:
    for text in texts:
        assert s3.secret not in text and s3.key not in text


def test_an_uploaded_dataset_is_stored_in_the_bucket_and_previewed_from_it(
    client: TestClient, project: ProjectKey, s3_settings: Settings, s3: S3
) -> None:
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "chat-on-s3", "format": "messages"},
        files={"file": ("chat.jsonl", JSONL, "application/octet-stream")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    dataset = answer.json()
    stored = f"{s3_settings.storage_url}/datasets/{dataset['id']}/chat.jsonl"
    assert keys(f"{s3_settings.storage_url}/datasets/{dataset['id']}") == [stored]
    assert s3_fs().cat_file(under(stored)) == JSONL
    assert (dataset["sha256"], dataset["size_bytes"]) == (
        hashlib.sha256(JSONL).hexdigest(),
        len(JSONL),
    )
    assert dataset["stats"]["records"] == len(ROWS)  # read back from the bucket

    preview = client.post(
        f"/v1/datasets/{dataset['id']}/preview",
        json={"chat_template": "chatml", "num_examples": 2},
        headers=project.headers,
    )
    assert preview.status_code == 200, preview.text
    shown = "".join(preview.json()["examples"][0]["tokens"])
    assert "question 0?" in shown and "answer 0." in shown  # read back from the bucket
    listed = client.get(f"/v1/datasets/{dataset['id']}", headers=project.headers)
    _no_secret(s3, answer.text, preview.text, listed.text)


def test_a_bad_upload_leaves_nothing_in_the_bucket(
    client: TestClient, project: ProjectKey, s3_settings: Settings
) -> None:
    before = keys(f"{s3_settings.storage_url}/datasets")
    bad = JSONL + b'{"messages": 3}\n'
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "bad-on-s3", "format": "messages"},
        files={"file": ("bad.jsonl", bad, "application/octet-stream")},
        headers=project.headers,
    )
    assert answer.status_code == 422, answer.text
    assert f"line {len(ROWS) + 1}" in answer.text
    assert keys(f"{s3_settings.storage_url}/datasets") == before


def test_a_code_archive_is_stored_in_the_bucket_by_its_digest(
    client: TestClient, project: ProjectKey, s3_settings: Settings, s3: S3
) -> None:
    data = tar_gz(code_files())
    answer = upload_code(client, project, data, name="trainer-code")
    assert answer.status_code == 201, answer.text
    digest = hashlib.sha256(data).hexdigest()
    stored = f"{s3_settings.storage_url}/code/{digest}.tar.gz"
    assert stored in keys(f"{s3_settings.storage_url}/code")
    assert s3_fs().cat_file(under(stored)) == data
    _no_secret(s3, answer.text)


def test_an_openai_file_is_stored_in_the_bucket_and_its_content_read_back(
    client: TestClient, project: ProjectKey, s3_settings: Settings, s3: S3
) -> None:
    answer = client.post(
        "/openai/v1/files",
        data={"purpose": "fine-tune"},
        files={"file": ("train.jsonl", JSONL, "application/jsonl")},
        headers=project.headers,
    )
    assert answer.status_code == 200, answer.text
    file_id = answer.json()["id"]
    content = client.get(f"/openai/v1/files/{file_id}/content", headers=project.headers)
    assert content.status_code == 200, content.text
    assert content.content == JSONL
    stored = [k for k in keys(s3_settings.storage_url) if s3_fs().size(under(k)) == len(JSONL)]
    assert any(s3_fs().cat_file(under(k)) == JSONL for k in stored)
    _no_secret(s3, answer.text)


def _register(client: TestClient, project: ProjectKey, name: str, uri: str) -> dict[str, Any]:
    answer = client.post("/v1/datasets", json={"name": name, "uri": uri}, headers=project.headers)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_a_prefix_under_a_data_root_registers_as_the_same_tree_on_disk_would(
    client: TestClient, project: ProjectKey, corpora: str, s3: S3, tmp_path: Path
) -> None:
    """An organisation's corpus already in its object store is registered where it lies (no
    upload): digested, listed and sampled from the bucket exactly as the same files on disk."""
    tree = tmp_path / "stdlib"
    (tree / "json" / "__pycache__").mkdir(parents=True)
    (tree / "abc.py").write_text('"""Abstract Base Classes."""\n' * 40)
    (tree / "json" / "decoder.py").write_text("def decode(s):\n    return s\n")
    (tree / "json" / "__pycache__" / "decoder.cpython-311.pyc").write_bytes(b"\x00" * 64)
    s3_fs().put(str(tree), under(f"{corpora}/stdlib"), recursive=True)

    dataset = _register(client, project, "stdlib-on-s3", f"{corpora}/stdlib/")
    size, sha256, num_files = digest_path(tree)
    assert (dataset["size_bytes"], dataset["sha256"], dataset["num_files"]) == (
        size,
        sha256,
        num_files,
    )
    assert (dataset["uri"], dataset["format"], num_files) == (f"{corpora}/stdlib", "text", 2)
    files = client.get(f"/v1/datasets/{dataset['id']}/files", headers=project.headers)
    assert files.status_code == 200, files.text
    assert [(f["path"], f["size_bytes"]) for f in files.json()["items"]] == [
        ("abc.py", (tree / "abc.py").stat().st_size),
        ("json/decoder.py", (tree / "json" / "decoder.py").stat().st_size),
    ]
    sample = client.get(f"/v1/datasets/{dataset['id']}/sample", headers=project.headers)
    assert sample.status_code == 200, sample.text
    assert sample.json()["items"][0]["record"].startswith('"""Abstract Base Classes."""')
    _no_secret(s3, files.text, sample.text)


def test_a_jsonl_object_under_a_data_root_is_checked_record_by_record_from_the_bucket(
    client: TestClient, project: ProjectKey, corpora: str
) -> None:
    s3_fs().pipe_file(under(f"{corpora}/chat.jsonl"), JSONL)
    dataset = _register(client, project, "chat-registered", f"{corpora}/chat.jsonl")
    assert dataset["format"] == "messages"
    assert dataset["sha256"] == hashlib.sha256(JSONL).hexdigest()
    assert dataset["stats"]["records"] == len(ROWS)  # read from the bucket

    s3_fs().pipe_file(under(f"{corpora}/bad.jsonl"), JSONL + b'{"messages": 3}\n')
    bad = client.post(
        "/v1/datasets",
        json={"name": "bad-registered", "uri": f"{corpora}/bad.jsonl"},
        headers=project.headers,
    )
    assert bad.status_code == 422, bad.text
    assert f"line {len(ROWS) + 1}" in bad.text


@pytest.mark.parametrize(
    ("where", "status", "said"),
    [
        ("storage", 403, "outside the allowed data roots"),  # every project's uploads
        ("dotdot", 403, "outside the allowed data roots"),
        ("sibling", 403, "outside the allowed data roots"),  # a prefix of the root's name
        ("missing", 422, "does not exist"),
    ],
)
def test_an_object_store_uri_outside_the_roots_or_missing_is_refused_with_nothing_made(
    client: TestClient,
    project: ProjectKey,
    s3_settings: Settings,
    corpora: str,
    where: str,
    status: int,
    said: str,
) -> None:
    uri = {
        "storage": f"{s3_settings.storage_url}/datasets",
        "dotdot": f"{corpora}/../{s3_settings.storage_url.rsplit('/', 1)[1]}",
        "sibling": f"{corpora}-other/x.txt",
        "missing": f"{corpora}/nothing-here/",
    }[where]
    before = client.get("/v1/datasets", headers=project.headers).json()["items"]
    answer = client.post(
        "/v1/datasets", json={"name": f"refused-{where}", "uri": uri}, headers=project.headers
    )
    assert answer.status_code == status, answer.text
    assert said in answer.json()["error"]["message"]
    assert answer.json()["error"]["details"][0]["loc"] == ["body", "uri"]
    assert client.get("/v1/datasets", headers=project.headers).json()["items"] == before
