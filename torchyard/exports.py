"""Checkpoint exports: a consolidated ``model.safetensors`` of a checkpoint, made by a worker.

    with Client() as client:
        export = client.exports.request(job_id, checkpoint_id)      # pending (or as it is)
        export = client.exports.wait(job_id, checkpoint_id, timeout_s=600)
        client.exports.download(job_id, checkpoint_id, "model.safetensors")

``torchyard export JOB CHECKPOINT --out FILE`` does all three.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import httpx

from torchyard.errors import ConnectionFailed, ExportFailed, ExportTimeout, error_from_response
from torchyard.transport import Transport
from torchyard.types import CheckpointExport

CHUNK_BYTES = 1 << 20


class Exports:
    """``client.exports``: ask for, follow and download checkpoint exports."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    @staticmethod
    def _path(job_id: int, checkpoint_id: int) -> str:
        return f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export"

    def request(self, job_id: int, checkpoint_id: int) -> CheckpointExport:
        """Ask for the export of a checkpoint; returns it (pending, or as it already is: one
        export per checkpoint). Raises `NotFound`, or `Conflict` when the checkpoint's files
        were deleted by retention."""
        answer = self._client.request("POST", self._path(job_id, checkpoint_id))
        return CheckpointExport.model_validate(answer)

    def get(self, job_id: int, checkpoint_id: int) -> CheckpointExport:
        """The export of a checkpoint. Raises `NotFound` when none was asked for."""
        answer = self._client.request("GET", self._path(job_id, checkpoint_id))
        return CheckpointExport.model_validate(answer)

    def wait(
        self, job_id: int, checkpoint_id: int, *, poll_s: float = 1.0, timeout_s: float = 600.0
    ) -> CheckpointExport:
        """Poll until the export is ready and return it. Raises `ExportFailed` when it failed,
        `ExportTimeout` after `timeout_s` seconds (saying why when the server knows: e.g. no
        exporter is running)."""
        deadline = time.monotonic() + timeout_s
        while True:
            export = self.get(job_id, checkpoint_id)
            if export.state == "failed":
                raise ExportFailed(f"export of checkpoint {checkpoint_id} failed: {export.error}")
            if export.state == "ready":
                return export
            if time.monotonic() >= deadline:
                why = f": {export.waiting_for}" if export.waiting_for else ""
                raise ExportTimeout(
                    f"export of checkpoint {checkpoint_id} still {export.state} after "
                    f"{timeout_s:g} s{why}"
                )
            time.sleep(poll_s)

    def download(self, job_id: int, checkpoint_id: int, out: str | Path) -> Path:
        """Stream the ready export's ``model.safetensors`` to `out` (via `out.part`, renamed
        when whole) and check its size and sha256 against the export. Returns `out`.

        Raises `Conflict` while it is not ready, `ExportFailed` on a size or sha256 mismatch.
        """
        out = Path(out)
        export = self.get(job_id, checkpoint_id)
        part = out.with_name(out.name + ".part")
        digest, size = hashlib.sha256(), 0
        path = f"{self._path(job_id, checkpoint_id)}/download"
        try:
            # The client's pool, streamed: the file is never held whole in memory.
            with self._client.http.stream("GET", path) as response:
                if not response.is_success:
                    response.read()
                    try:
                        body = response.json()
                    except ValueError:
                        body = None
                    raise error_from_response(response.status_code, body, response.text)
                with part.open("wb") as fh:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        fh.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
        except httpx.TransportError as exc:
            part.unlink(missing_ok=True)
            raise ConnectionFailed(f"downloading {path}: {exc}") from exc
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        if (size, digest.hexdigest()) != (export.size_bytes, export.sha256):
            part.unlink(missing_ok=True)
            raise ExportFailed(
                f"download of checkpoint {checkpoint_id}'s export is corrupt: {size} bytes, "
                f"sha256 {digest.hexdigest()}; expected {export.size_bytes} bytes, "
                f"sha256 {export.sha256}"
            )
        os.replace(part, out)
        return out
