"""Checkpoint exports: a consolidated ``model.safetensors`` of a checkpoint, made by a worker.

    with Client() as client:
        export = client.exports.request(job_id, checkpoint_id)      # pending (or as it is)
        export = client.exports.wait(job_id, checkpoint_id, timeout_s=600)
        client.exports.download(job_id, checkpoint_id, "model.safetensors")

``torchyard export JOB CHECKPOINT --out FILE`` does all three. A LoRA/QLoRA run's checkpoints
hold adapters, not a model to consolidate: it writes its adapter and merged model when it ends,
which ``client.exports.download_lora(job_id, DIR)`` (``torchyard export-lora JOB --out DIR``)
fetches.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Literal

import httpx

from torchyard.errors import (
    Conflict,
    ConnectionFailed,
    ExportFailed,
    ExportTimeout,
    error_from_response,
)
from torchyard.transport import Transport
from torchyard.types import CheckpointExport, LoraExports

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
        size, sha256 = self._stream(f"{self._path(job_id, checkpoint_id)}/download", part)
        if (size, sha256) != (export.size_bytes, export.sha256):
            part.unlink(missing_ok=True)
            raise ExportFailed(
                f"download of checkpoint {checkpoint_id}'s export is corrupt: {size} bytes, "
                f"sha256 {sha256}; expected {export.size_bytes} bytes, "
                f"sha256 {export.sha256}"
            )
        os.replace(part, out)
        return out

    def lora(self, job_id: int) -> LoraExports:
        """The adapter and merged model a LoRA/QLoRA job wrote when it ended (each None until
        then, and for a job of another kind), with their files. Raises `NotFound`."""
        return LoraExports.model_validate(self._client.request("GET", f"/v1/jobs/{job_id}/lora"))

    def download_lora(
        self, job_id: int, out_dir: str | Path, *, kind: Literal["adapter", "merged"] = "adapter"
    ) -> Path:
        """Download a LoRA job's adapter (a PEFT directory: `peft.PeftModel.from_pretrained(base,
        out_dir)`) or merged model (a `transformers` directory) into `out_dir`, file by file,
        each checked against its listed size. Returns `out_dir`. Raises `Conflict` when the job
        wrote none, `ExportFailed` on a short file."""
        out = Path(out_dir)
        found = getattr(self.lora(job_id), kind)
        if found is None:
            raise Conflict(
                409, "conflict", f"job {job_id} has no LoRA {kind} (not a LoRA run, or not ended)"
            )
        out.mkdir(parents=True, exist_ok=True)
        for file in found.files:
            part = out / f"{file.name}.part"
            size, _ = self._stream(f"/v1/jobs/{job_id}/lora/{kind}/files/{file.name}", part)
            if size != file.size_bytes:
                part.unlink(missing_ok=True)
                raise ExportFailed(f"{file.name}: {size} bytes downloaded of {file.size_bytes}")
            os.replace(part, out / file.name)
        return out

    def _stream(self, path: str, part: Path) -> tuple[int, str]:
        """GET `path` into `part` through the client's pool, never whole in memory: (bytes,
        hex sha256). Removes `part` and raises on an error answer or a broken connection."""
        digest, size = hashlib.sha256(), 0
        try:
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
        return size, digest.hexdigest()
