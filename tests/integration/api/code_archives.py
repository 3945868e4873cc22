"""Code archives for the API tests: tar.gz and zip bytes built in memory, and the upload call."""

from __future__ import annotations

import io
import secrets
import tarfile
import zipfile
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import ProjectKey


def tar_gz(files: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in extra:
            tf.addfile(info)
    return buf.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def code_files() -> dict[str, bytes]:
    """A small training program, different each call (so no test shares another's digest)."""
    token = secrets.token_hex(8)
    return {
        "train.py": f"print('training {token}')\n".encode(),
        "pkg/__init__.py": b"",
        "pkg/model.py": b"WIDTH = 8\n",
    }


def upload(
    client: TestClient,
    project: ProjectKey,
    data: bytes,
    filename: str = "code.tar.gz",
    name: str | None = None,
) -> Any:
    return client.post(
        "/v1/code",
        files={"file": (filename, data, "application/octet-stream")},
        data={} if name is None else {"name": name},
        headers=project.headers,
    )
