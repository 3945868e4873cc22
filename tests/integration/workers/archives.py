"""Code archives for entrypoint jobs in worker tests, kept through `core.jobs.code_archives.create`
(the upload route's service) rather than HTTP."""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import code_archives
from core.platform.settings import Settings
from tests.conftest import ProjectKey


def store_archive(
    engine: Engine, settings: Settings, project: ProjectKey, files: dict[str, str]
) -> str:
    """A `.tar.gz` of `files` kept as a code archive of `project` (`core.jobs.code_archives.create`,
    as `POST /v1/code` does); returns its id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    local = settings.home / f"upload-{secrets.token_hex(4)}.tar.gz"
    local.write_bytes(raw)
    with Session(engine) as s:
        archive, _ = code_archives.create(
            session=s,
            storage_url=settings.storage_url,
            project_id=project.project_id,
            name="test",
            path=local,
            sha256=hashlib.sha256(raw).hexdigest(),
            size_bytes=len(raw),
            contents=code_archives.inspect(local, max_unpacked_bytes=1 << 30),
        )
        return archive.id
