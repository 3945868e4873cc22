"""Checkpoint exports: ask for a consolidated safetensors export, follow it, download it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from api import redaction, schemas
from api.deps import (
    JobsWritePrincipal,
    ReadPrincipal,
    ServerPathsDep,
    SessionDep,
    SettingsDep,
)
from api.errors import ERROR_RESPONSES, ErrorBody
from api.validation import MAX_ID, JobId
from core.access.auth import Principal
from core.jobs import exports
from core.platform import storage, tables
from core.platform.errors import Conflict
from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings
from core.platform.tables import ExportState

router = APIRouter(prefix="/v1/jobs", tags=["checkpoints"], responses=ERROR_RESPONSES)

CheckpointId = Annotated[int, Path(ge=1, le=MAX_ID, description="The checkpoint's id.")]
_PATH = "/{job_id}/checkpoints/{checkpoint_id}/export"


@router.post(
    _PATH,
    status_code=202,
    response_model=schemas.CheckpointExport,
    responses={
        200: {
            "model": schemas.CheckpointExport,
            "description": "The export already asked for (pending, running or ready)",
        },
        409: {
            "model": ErrorBody,
            "description": "The checkpoint's files were deleted by retention",
        },
    },
)
def request_export(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    request: Request,
    response: Response,
) -> schemas.CheckpointExport:
    """Ask for a consolidated `model.safetensors` (+ `config.json`) of a checkpoint, made by an
    exporter (`torchyard exporter`: the export queue, so it never waits behind training): 202
    when queued, 200 with the export already asked for."""
    asked = exports.request(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        job_id=job_id,
        checkpoint_id=checkpoint_id,
    )
    session.commit()
    if asked.dispatch:
        request.app.state.dispatcher.dispatch_export(asked.export)
    if not asked.created:
        response.status_code = 200
    return _out(session, asked.export, paths, principal, settings)


@router.get(_PATH, response_model=schemas.CheckpointExport)
def get_export(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.CheckpointExport:
    """The export of a checkpoint: its state (a pending one's place in the export queue, and
    `waiting_for` when no exporter runs), and once ready its size and sha256."""
    export = exports.get_or_raise(
        session=session, project_id=principal.project_id, job_id=job_id, checkpoint_id=checkpoint_id
    )
    return _out(session, export, paths, principal, settings)


def _out(
    session: Session,
    export: tables.CheckpointExport,
    paths: ServerPaths,
    principal: Principal,
    settings: Settings,
) -> schemas.CheckpointExport:
    out = redaction.export(export, paths, admin=redaction.is_admin(principal))
    out.queue_position = exports.queue_position(session=session, export=export)
    if export.state == ExportState.PENDING:
        out.waiting_for = exports.exporter_missing(
            session=session, queue=settings.export_queue, timeout_s=settings.worker_timeout_s
        )
    return out


@router.get(
    f"{_PATH}/download",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "description": "`model.safetensors`, streamed; `ETag` is its quoted sha256",
        },
        409: {"model": ErrorBody, "description": "The export is not ready (or failed)"},
    },
)
def download_export(
    job_id: JobId, checkpoint_id: CheckpointId, principal: ReadPrincipal, session: SessionDep
) -> StreamingResponse:
    """Download the export's `model.safetensors` (streamed); 409 until it is ready."""
    export = exports.get_or_raise(
        session=session, project_id=principal.project_id, job_id=job_id, checkpoint_id=checkpoint_id
    )
    if export.state != ExportState.READY:
        detail = f": {export.error}" if export.error else ""
        raise Conflict(f"the export of checkpoint {checkpoint_id} is {export.state}{detail}")
    weights = storage.join(export.uri, exports.WEIGHTS_FILE)
    size = storage.file_size(weights)
    if size is None:
        raise Conflict(f"the files of the export of checkpoint {checkpoint_id} no longer exist")
    filename = f"job{export.job_id}-step{export.step:08d}.safetensors"
    headers = {
        "Content-Disposition": f'attachment; filename="{filename}"',
        "Content-Length": str(size),
        "ETag": f'"{export.sha256}"',
    }
    return StreamingResponse(
        storage.read_chunks(weights), media_type="application/octet-stream", headers=headers
    )
