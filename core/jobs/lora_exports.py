"""A LoRA/QLoRA run's own exports, to download: the PEFT adapter directory and the merged model
that `trainer.exports.lora` writes at the end of the run (its `export` events, recorded by the
worker's ingest as `info` events "exported <format> at step N" with the uri in their data).

A LoRA run's checkpoints hold adapters on a base model, not a built-in GPT, so the checkpoint
export (`core.jobs.exports`) refuses them; these are what such a run offers instead, read file by
file from the storage (each directory is flat: `adapter_config.json` and
`adapter_model.safetensors`; `config.json` and `model.safetensors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import fsspec
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform import storage
from core.platform.errors import Conflict, NotFound
from core.platform.tables import JobEvent

Kind = Literal["adapter", "merged"]
# `trainer.exports.lora`'s formats, as its export events name them (CONTRACTS.md, section 1).
FORMATS: dict[str, str] = {"adapter": "peft_adapter", "merged": "merged_safetensors"}


@dataclass(frozen=True)
class LoraExport:
    """One of a run's exports: its step, where it is, its files (name, bytes) by name."""

    job_id: int
    kind: str
    step: int
    uri: str
    files: list[tuple[str, int]]


def of_job(
    *, session: Session, project_id: str, job_id: int, kinds: tuple[str, ...] = tuple(FORMATS)
) -> dict[str, LoraExport | None]:
    """The job's newest export of each of `kinds` with its files, None for a kind it wrote none
    of (not a LoRA run, not ended yet, or its files gone). Raises NotFound (no such job in the
    project)."""
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=project_id)
    found: dict[str, LoraExport | None] = {}
    for kind in kinds:
        fmt = FORMATS[kind]
        event = session.scalars(
            select(JobEvent)
            .where(
                JobEvent.job_id == job.id,
                JobEvent.kind == "info",
                JobEvent.message.like(f"exported {fmt} at step %"),
            )
            .order_by(JobEvent.id.desc())
            .limit(1)
        ).one_or_none()
        uri = str(event.data.get("uri") or "") if event is not None else ""
        files = _files(uri) if uri else []
        step = int(event.data.get("step") or 0) if event is not None else 0
        found[kind] = LoraExport(job.id, kind, step, uri, files) if files else None
    return found


def latest(*, session: Session, project_id: str, job_id: int, kind: Kind) -> LoraExport:
    """The job's newest export of `kind`. Raises NotFound (no such job in the project),
    Conflict (the job wrote none: not a LoRA run, or not ended yet; or its files are gone)."""
    found = of_job(session=session, project_id=project_id, job_id=job_id, kinds=(kind,))[kind]
    if found is None:
        raise Conflict(
            f"job {job_id} has no LoRA {kind}: a LoRA/QLoRA run writes its adapter and merged "
            "model when it ends"
        )
    return found


def file_uri(export: LoraExport, name: str) -> str:
    """Where the export's file `name` is. Raises NotFound for a name it does not hold."""
    if name not in {n for n, _ in export.files}:
        raise NotFound(f"job {export.job_id}'s LoRA {export.kind} has no file {name[:100]!r}")
    return storage.join(export.uri, name)


def _files(uri: str) -> list[tuple[str, int]]:
    """(name, bytes) of the files directly in the directory `uri`, by name; [] when it is gone."""
    fs, path = fsspec.core.url_to_fs(uri)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return sorted(
        (str(e["name"]).rstrip("/").rsplit("/", 1)[-1], int(e.get("size") or 0))
        for e in entries
        if e.get("type") == "file"
    )
