"""A LoRA/QLoRA run's adapter and merged model, written at its end, file by file
(`core.jobs.lora_exports`): what such a run offers where the checkpoint export refuses it."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse

from api import redaction
from api.deps import ReadPrincipal, ServerPathsDep, SessionDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas.lora import LoraExport, LoraExports, LoraFile
from api.validation import JobId
from core.jobs import lora_exports
from core.platform import storage
from core.platform.errors import Conflict

router = APIRouter(prefix="/v1/jobs", tags=["checkpoints"], responses=ERROR_RESPONSES)

KindArg = Annotated[
    Literal["adapter", "merged"],
    Path(description="`adapter` (the PEFT adapter) or `merged` (the base with it merged in)."),
]
FileName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="A file of the directory (`GET /v1/jobs/{job_id}/lora` lists them).",
    ),
]


@router.get("/{job_id}/lora", response_model=LoraExports)
def get_lora_exports(
    job_id: JobId, principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> LoraExports:
    """The adapter and merged model a LoRA/QLoRA run wrote when it ended, with their files (each
    null until then, and for a run of another kind). Download a file from
    `.../lora/{kind}/files/{name}`."""
    admin = redaction.is_admin(principal)
    found = lora_exports.of_job(session=session, project_id=principal.project_id, job_id=job_id)
    shown: dict[str, LoraExport | None] = {}
    for kind, export in found.items():
        if export is None:
            shown[kind] = None
            continue
        out = LoraExport(
            job_id=export.job_id,
            kind=kind,
            step=export.step,
            uri=export.uri,
            files=[LoraFile(name=n, size_bytes=s) for n, s in export.files],
        )
        shown[kind] = redaction.located(out, paths, admin=admin)
    return LoraExports(adapter=shown["adapter"], merged=shown["merged"])


@router.get(
    "/{job_id}/lora/{kind}/files/{name}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file, streamed"},
        409: {"model": ErrorBody, "description": "The job wrote none (not a LoRA run, not ended)"},
    },
)
def download_lora_file(
    job_id: JobId, kind: KindArg, name: FileName, principal: ReadPrincipal, session: SessionDep
) -> StreamingResponse:
    """One file of the adapter or merged model (streamed); 404 for a name it does not hold."""
    found = lora_exports.latest(
        session=session, project_id=principal.project_id, job_id=job_id, kind=kind
    )
    uri = lora_exports.file_uri(found, name)
    size = storage.file_size(uri)
    if size is None:
        raise Conflict(f"job {job_id}'s LoRA {kind} file {name} no longer exists")
    headers = {
        "Content-Disposition": f'attachment; filename="{name}"',
        "Content-Length": str(size),
    }
    return StreamingResponse(
        storage.read_chunks(uri), media_type="application/octet-stream", headers=headers
    )
