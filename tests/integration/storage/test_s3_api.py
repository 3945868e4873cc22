"""The API on S3 storage (a real S3 server, `moto`): uploads land in the bucket and are read
back from it (dataset registration and preview, code archives, OpenAI files), and no answer
carries the storage credentials."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
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
def client(s3_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(s3_settings), raise_server_exceptions=True) as test_client:
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
