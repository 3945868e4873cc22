"""Code archives (`POST/GET /v1/code`): uploads stored once per content, every unsafe archive
refused by member name with nothing stored, and `entrypoint` jobs and a GRPO job's grader code
(`method.grpo.code`) checked against them."""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from api.main import create_app
from core.platform.settings import Settings
from core.platform.tables import CodeArchive
from tests.conftest import ProjectKey
from tests.integration.api.code_archives import code_files, tar_gz, upload, zip_bytes
from tests.integration.api.conftest import assert_error


def stored(settings: Settings) -> set[Path]:
    root = Path(settings.storage_url) / "code"
    return set(root.rglob("*")) if root.exists() else set()


def rows(engine: Engine, project_id: str) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(CodeArchive.project_id == project_id)
        return int(conn.scalar(query) or 0)


@pytest.fixture(scope="module")
def small_client(settings: Settings) -> Iterator[TestClient]:
    """The app with a 4 KiB archive limit and a 64 KiB unpacked limit."""
    small = settings.model_copy(
        update={"code_max_bytes": 4096, "code_max_unpacked_bytes": 64 * 1024}
    )
    with TestClient(create_app(small), raise_server_exceptions=True) as client:
        yield client


@pytest.mark.parametrize(("make", "fmt"), [(tar_gz, "tar.gz"), (zip_bytes, "zip")])
def test_an_upload_is_stored_by_its_digest_and_read_back_with_its_files(
    client: TestClient, project: ProjectKey, settings: Settings, make: Any, fmt: str
) -> None:
    data = make(code_files())
    answer = upload(client, project, data, filename=f"my code.{fmt}")
    assert answer.status_code == 201, answer.text
    archive = answer.json()
    digest = hashlib.sha256(data).hexdigest()
    assert archive["id"].startswith("code_") and len(archive["id"]) == 5 + 16
    assert archive["name"] == f"my code.{fmt}"
    assert archive["format"] == fmt
    assert archive["sha256"] == digest
    assert archive["size_bytes"] == len(data)
    assert archive["files"] == ["pkg/__init__.py", "pkg/model.py", "train.py"]
    assert archive["num_files"] == 3
    assert archive["unpacked_bytes"] == sum(len(v) for v in code_files().values())
    path = Path(settings.storage_url) / "code" / f"{digest}.{fmt}"
    assert path.read_bytes() == data
    assert client.get(f"/v1/code/{archive['id']}", headers=project.headers).json() == archive


def test_the_same_bytes_again_are_200_with_the_first_archive(
    client: TestClient, project: ProjectKey, other_project: ProjectKey, settings: Settings
) -> None:
    data = tar_gz(code_files())
    first = upload(client, project, data, name="v1")
    assert first.status_code == 201, first.text
    again = upload(client, project, data, name="renamed")
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    listed = client.get("/v1/code", headers=project.headers).json()["items"]
    assert [a["id"] for a in listed] == [first.json()["id"]]
    # another project: an archive of its own, the stored file shared
    theirs = upload(client, other_project, data)
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["id"] != first.json()["id"]
    digest = first.json()["sha256"]
    assert [p.name for p in stored(settings) if digest in p.name] == [f"{digest}.tar.gz"]


def test_the_list_is_newest_first_without_files(client: TestClient, project: ProjectKey) -> None:
    ids = [upload(client, project, tar_gz(code_files())).json()["id"] for _ in range(3)]
    items = client.get("/v1/code", headers=project.headers).json()["items"]
    assert [a["id"] for a in items] == ids[::-1]
    assert all("files" not in a and a["num_files"] == 3 for a in items)


def _symlink_out() -> tarfile.TarInfo:
    info = tarfile.TarInfo("data/link")
    info.type = tarfile.SYMTYPE
    info.linkname = "../../etc/passwd"
    return info


@pytest.mark.parametrize(
    ("data", "member"),
    [
        pytest.param(tar_gz({"../evil.py": b"x"}), "../evil.py", id="zip_slip_tar"),
        pytest.param(zip_bytes({"a/../../evil.py": b"x"}), "a/../../evil.py", id="zip_slip_zip"),
        pytest.param(tar_gz({"/etc/cron.d/x": b"x"}), "/etc/cron.d/x", id="absolute"),
        pytest.param(tar_gz({"ok.py": b"x"}, (_symlink_out(),)), "data/link", id="symlink_out"),
        pytest.param(tar_gz({"ok.py": b"x", "bad\udcff.py": b"x"}), "bad", id="not_utf8"),
    ],
)
def test_an_unsafe_archive_is_422_naming_the_member_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    data: bytes,
    member: str,
) -> None:
    before = stored(settings)
    error = assert_error(upload(client, project, data), 422, "validation_error", ["body", "file"])
    assert member in error["message"]
    assert stored(settings) == before
    assert rows(engine, project.project_id) == 0


@pytest.mark.parametrize(
    "data", [b"print('not an archive')\n", b"\x1f\x8b but not gzip", b"PK\x03\x04 not a zip"]
)
def test_a_file_that_is_no_archive_is_422(
    client: TestClient, project: ProjectKey, settings: Settings, data: bytes
) -> None:
    before = stored(settings)
    assert_error(upload(client, project, data), 422, "validation_error", ["body", "file"])
    assert stored(settings) == before


def test_too_large_is_413_and_nothing_is_stored(
    small_client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    before = stored(settings)
    big = secrets.token_bytes(8192)  # incompressible: the archive passes 4 KiB
    by_header = upload(small_client, project, tar_gz({"weights.bin": big}))
    assert_error(by_header, 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off while streaming
        yield from io.BytesIO(
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="c.tgz"\r\n\r\n'
            + tar_gz({"weights.bin": big})
            + b"\r\n--b--\r\n"
        )

    streamed = small_client.post(
        "/v1/code",
        content=chunks(),
        headers={**project.headers, "content-type": "multipart/form-data; boundary=b"},
    )
    assert_error(streamed, 413, "payload_too_large", ["body", "file"])
    unpacked = upload(small_client, project, tar_gz({"zeros.bin": bytes(100 * 1024)}))
    assert unpacked.json()["error"]["message"].endswith(f"more than {64 * 1024} bytes")
    assert_error(unpacked, 413, "payload_too_large")
    assert stored(settings) == before
    assert rows(engine, project.project_id) == 0


def test_bad_forms_are_422_naming_the_field(client: TestClient, project: ProjectKey) -> None:
    data = tar_gz(code_files())
    assert_error(
        upload(client, project, data, name="a\x01b"), 422, "validation_error", ["body", "name"]
    )
    no_file = client.post("/v1/code", data={"name": "x"}, files={}, headers=project.headers)
    assert_error(no_file, 422, "validation_error")
    extra = client.post(
        "/v1/code",
        data={"format": "zip"},
        files={"file": ("c.tgz", data, "application/octet-stream")},
        headers=project.headers,
    )
    assert_error(extra, 422, "validation_error", ["body", "format"])


def script_spec(code: str, command: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": "own-code",
        "entrypoint": {"code": code, "command": command or ["python", "train.py", "--lr", "1"]},
    }


def test_a_job_runs_only_code_its_project_has(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    archive = upload(client, project, tar_gz(code_files())).json()
    unknown = client.post(
        "/v1/jobs", json=script_spec("code_0000000000000000"), headers=project.headers
    )
    assert_error(unknown, 422, "validation_error", ["body", "entrypoint", "code"])
    theirs = client.post("/v1/jobs", json=script_spec(archive["id"]), headers=other_project.headers)
    assert_error(theirs, 422, "validation_error", ["body", "entrypoint", "code"])
    missing = client.post(
        "/v1/jobs",
        json=script_spec(archive["id"], ["python", "-u", "nope.py"]),
        headers=project.headers,
    )
    assert_error(missing, 422, "validation_error", ["body", "entrypoint", "command"])
    good = client.post(
        "/v1/jobs",
        json=script_spec(archive["id"], ["python", "pkg/model.py"]),
        headers=project.headers,
    )
    assert good.status_code == 201, good.text
    entry = good.json()["spec"]["entrypoint"]
    assert entry["code"] == archive["id"]
    assert entry["command"] == ["python", "pkg/model.py"]
    assert "data" not in good.json()["spec"]
    shown = client.get(f"/v1/jobs/{good.json()['id']}", headers=project.headers)
    assert shown.status_code == 200, shown.text
    assert shown.json()["spec"]["entrypoint"] == entry
    listed = client.get("/v1/jobs", headers=project.headers)
    assert [j["id"] for j in listed.json()["items"]] == [good.json()["id"]]


def test_a_grpo_jobs_grader_file_comes_from_an_archive_its_project_has(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    """`method.grpo.code` is checked like `entrypoint.code` (another project's archive is not
    found), and every python grader's `file` must be in it; a `file` grader without it is
    refused at the grader's `file`."""
    prompts = b'{"prompt": "alpha: ", "answer": "alpha"}\n' * 4
    for key in (project, other_project):
        added = client.post(
            "/v1/datasets/upload",
            files={"file": ("prompts.jsonl", prompts, "application/octet-stream")},
            data={"name": "prompts"},
            headers=key.headers,
        )
        assert added.status_code == 201, added.text
    archive = upload(client, project, tar_gz({**code_files(), "graders/lower.py": b""})).json()

    def grpo(code: str | None, file: str = "graders/lower.py") -> dict[str, Any]:
        grader = {"type": "python", "name": "lower", "file": file}
        section = {"graders": [grader], **({"code": code} if code else {})}
        return {
            "name": "grpo",
            "data": {"dataset": "prompts"},
            "method": {"kind": "grpo", "grpo": section},
        }

    loc = ["body", "method", "grpo", "graders", 0, "file"]
    without = client.post("/v1/jobs", json=grpo(None), headers=project.headers)
    assert_error(without, 422, "validation_error", loc)
    assert "method.grpo.code" in without.text
    theirs = client.post("/v1/jobs", json=grpo(archive["id"]), headers=other_project.headers)
    assert_error(theirs, 422, "validation_error", ["body", "method", "grpo", "code"])
    assert "no code archive" in theirs.text
    absent = client.post(
        "/v1/jobs", json=grpo(archive["id"], "graders/upper.py"), headers=project.headers
    )
    assert_error(absent, 422, "validation_error", loc)
    good = client.post("/v1/jobs", json=grpo(archive["id"]), headers=project.headers)
    assert good.status_code == 201, good.text
    assert good.json()["spec"]["method"]["grpo"]["code"] == archive["id"]
