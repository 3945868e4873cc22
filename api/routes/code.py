"""Code archives: upload a team's training code (a `.tar.gz` or `.zip`), list and read them."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path as LocalPath
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Path, Request, Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from api import openapi_examples, uploads
from api.deps import JobsWritePrincipal, ReadPrincipal, SessionDep, SettingsDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas.code import CodeArchive, CodeArchiveList, CodeArchiveSummary, CodeName
from core.jobs import code_archives
from core.platform import tables
from core.platform.errors import InvalidInput, NotFound
from core.platform.storable import unstorable

PATH = "/v1/code"
router = APIRouter(prefix=PATH, tags=["code"], responses=ERROR_RESPONSES)

CodeId = Annotated[str, Path(max_length=100, description="The archive's id (`code_...`).")]
_NAME = TypeAdapter(CodeName)
_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "minLength": 1,
                            "description": "A .tar.gz/.tgz or .zip (told by its bytes).",
                        },
                        "name": {**_NAME.json_schema(), "description": "Default: the file's name."},
                    },
                    "additionalProperties": False,
                },
                "example": openapi_examples.CODE_UPLOAD,
            }
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=CodeArchive,
    responses={
        200: {"model": CodeArchive, "description": "The project already has these bytes"},
        413: {
            "model": ErrorBody,
            "description": "Over the archive size, unpacked size or file count limit",
        },
        422: {
            "model": ErrorBody,
            "description": "Not a .tar.gz/.zip, or a member it may not hold (named)",
        },
    },
    openapi_extra=_BODY,
    operation_id="code_create",
)
async def upload_code(
    request: Request,
    response: Response,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> CodeArchive:
    """Upload training code (multipart `file`, optional `name`); the same bytes again: 200."""
    workdir = await to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="torchyard-code-"))
    try:
        async with uploads.streamed(
            request, session, root_uri=str(LocalPath(workdir) / "upload"),
            max_bytes=settings.code_max_bytes, limit="the code archive limit",
            text_fields=("name",), required=(),
        ) as upload:  # fmt: skip
            name = _name(upload.fields.get("name"), upload.filename)
            path = LocalPath(upload.uri)
            contents = await run_in_threadpool(
                code_archives.inspect, path, max_unpacked_bytes=settings.code_max_unpacked_bytes
            )
            archive, created = await run_in_threadpool(
                code_archives.create,
                session=session,
                storage_url=settings.storage_url,
                project_id=principal.project_id,
                name=name,
                path=path,
                sha256=upload.sha256,
                size_bytes=upload.size_bytes,
                contents=contents,
            )
    finally:
        await to_thread.run_sync(shutil.rmtree, workdir, True)
    if not created:
        response.status_code = 200
    return _full(archive)


def _name(raw: bytes | None, filename: str) -> str:
    """The form's `name` validated (InvalidInput at `["body", "name"]`), else the file's name."""
    if raw is None:
        base = re.split(r"[\\/]", filename)[-1][:200]
        try:
            return _NAME.validate_python(base)
        except ValidationError:
            return uploads.safe_filename(filename)
    try:
        return _NAME.validate_python(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValidationError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "not valid UTF-8"
        raise InvalidInput(
            f"name: {msg}", details=[{"loc": ["body", "name"], "msg": msg, "type": "value_error"}]
        ) from None


def _summary_fields(archive: tables.CodeArchive) -> dict[str, Any]:
    return {
        "id": archive.id,
        "name": archive.name,
        "format": archive.format,
        "sha256": archive.sha256,
        "size_bytes": archive.size_bytes,
        "unpacked_bytes": archive.unpacked_bytes,
        "num_files": len(archive.files),
        "created_at": archive.created_at,
    }


def _full(archive: tables.CodeArchive) -> CodeArchive:
    return CodeArchive(**_summary_fields(archive), files=list(archive.files))


@router.get("", response_model=CodeArchiveList)
def list_code(principal: ReadPrincipal, session: SessionDep) -> CodeArchiveList:
    """List the project's code archives, newest first (without their files)."""
    items = code_archives.list_all(session=session, project_id=principal.project_id)
    return CodeArchiveList(items=[CodeArchiveSummary(**_summary_fields(a)) for a in items])


@router.get("/{code_id}", response_model=CodeArchive)
def get_code(code_id: CodeId, principal: ReadPrincipal, session: SessionDep) -> CodeArchive:
    """Read one code archive, with its files."""
    archive = None
    if not unstorable(code_id):  # cannot be in the database otherwise, so it is not there
        archive = code_archives.get(
            session=session, archive_id=code_id, project_id=principal.project_id
        )
    if archive is None:
        raise NotFound(f"code archive {code_id!r} not found")
    return _full(archive)
