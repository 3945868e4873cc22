"""Datasets: register a server-side path, upload a file, list and read them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api import redaction, schemas, uploads
from api.deps import (
    DatasetsWritePrincipal,
    ReadPrincipal,
    ServerPathsDep,
    SessionDep,
    SettingsDep,
)
from api.errors import ERROR_RESPONSES, ErrorBody
from core.access.auth import Principal, new_id
from core.datasets import browse
from core.datasets import preview as dataset_preview
from core.datasets import service as datasets
from core.platform import storage, tables
from core.platform.errors import Conflict, InvalidInput, NotFound
from core.platform.server_paths import ServerPaths
from core.platform.storable import require_storable, unstorable
from dataformat.errors import InvalidJobError

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=ERROR_RESPONSES)

DatasetId = Annotated[
    str, Path(max_length=200, description="The dataset's id (`ds_...`) or its name.")
]
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "The project has a dataset of that name"}
}


@router.post(
    "",
    status_code=201,
    response_model=schemas.Dataset,
    responses={
        **_CONFLICT,
        403: {"model": ErrorBody, "description": "`uri` is outside the allowed data roots"},
    },
)
def register_dataset(
    body: schemas.DatasetRegister,
    principal: DatasetsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Dataset:
    """Register a server-side file or directory (under an allowed data root) as a dataset.
    A directory's `include` / `exclude` choose its files and stay with it; its files that are
    not UTF-8 text are left out (`left_out`) and never read by a job."""
    require_storable(body.model_dump(), ("body",))
    try:
        dataset = datasets.register(
            session=session,
            settings=settings,
            project_id=principal.project_id,
            name=body.name,
            uri=body.uri,
            format=body.format,
            token_dtype=body.token_dtype,
            include=body.include,
            exclude=body.exclude,
        )
    except (OSError, RuntimeError) as exc:  # unreadable file, unknown ~user, name too long
        raise InvalidInput(
            f"uri: cannot read {body.uri!r}: {exc}",
            details=[{"loc": ["body", "uri"], "msg": "cannot be read", "type": "value_error"}],
        ) from None
    return _out(dataset, paths, principal)


@router.post(
    "/upload",
    status_code=201,
    response_model=schemas.Dataset,
    responses={
        **_CONFLICT,
        413: {"model": ErrorBody, "description": "The file exceeds the upload limit"},
    },
    openapi_extra=uploads.OPENAPI_BODY,
)
async def upload_dataset(
    request: Request,
    principal: DatasetsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Dataset:
    """Upload a file (multipart: `name`, `file`, optional `format`, `token_dtype`) as a dataset;
    streamed to storage, size-capped, then checked record by record (422 names each bad line;
    a text file must be UTF-8 text)."""
    dataset_id = new_id("ds")
    root_uri = storage.join(settings.storage_url, "datasets", dataset_id)
    limit = settings.max_upload_bytes
    async with uploads.streamed(request, session, root_uri=root_uri, max_bytes=limit) as upload:
        form = uploads.parse_form(schemas.DatasetUploadForm, upload.fields)
        checked = await run_in_threadpool(
            datasets.check,
            settings=settings,
            uri=upload.uri,
            format=form.format,
            token_dtype=form.token_dtype,
            where=("body", "file"),
        )
        dataset = await run_in_threadpool(
            datasets.create,
            session=session,
            project_id=principal.project_id,
            name=form.name,
            uri=upload.uri,
            size_bytes=upload.size_bytes,
            sha256=upload.sha256,
            num_files=1,
            format=checked.format,
            stats=checked.stats,
            dataset_id=dataset_id,
        )
    return _out(dataset, paths, principal)


@router.get("", response_model=schemas.DatasetList)
def list_datasets(
    principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> schemas.DatasetList:
    """List the project's datasets, oldest first."""
    items = datasets.list_all(session=session, project_id=principal.project_id)
    return schemas.DatasetList(items=[_out(d, paths, principal) for d in items])


@router.get("/{dataset_id}", response_model=schemas.Dataset)
def get_dataset(
    dataset_id: DatasetId, principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> schemas.Dataset:
    """Read one dataset (by its id or its name)."""
    return _out(_dataset(session, principal, dataset_id), paths, principal)


_UNREADABLE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "The dataset's location cannot be read now"}
}


@router.get("/{dataset_id}/files", response_model=schemas.DatasetFilePage, responses=_UNREADABLE)
def list_dataset_files(
    dataset_id: DatasetId,
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="Files per page.")] = 100,
    cursor: Annotated[
        str | None,
        Query(max_length=4096, description="`next_cursor` of the previous page."),
    ] = None,
) -> schemas.DatasetFilePage:
    """The dataset's files with their sizes, in relative-path order, a page at a time (a
    registered directory lists what its `num_files` counts)."""
    dataset = _detached(session, principal, dataset_id)
    found, after = _readable(paths, lambda: browse.files(dataset, limit=limit, after=cursor))
    return schemas.DatasetFilePage(
        items=[schemas.DatasetFile(path=f.path, size_bytes=f.size_bytes) for f in found],
        next_cursor=after,
    )


@router.get("/{dataset_id}/sample", response_model=schemas.DatasetSample, responses=_UNREADABLE)
def sample_dataset(
    dataset_id: DatasetId,
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    limit: Annotated[int, Query(ge=1, le=20, description="Records to read.")] = 5,
) -> schemas.DatasetSample:
    """The dataset's first records as a job reads them (JSON records, the head of each of the
    first text files, or the first token ids), long values cut (`truncated`)."""
    dataset = _detached(session, principal, dataset_id)
    items = _readable(paths, lambda: browse.sample(dataset, limit=limit))
    return schemas.DatasetSample(
        dataset_id=dataset.id,
        format=dataset.format,
        items=[
            schemas.DatasetSampleItem(where=i.where, record=i.record, truncated=i.truncated)
            for i in items
        ],
    )


T = TypeVar("T")


def _dataset(session: Session, principal: Principal, dataset_id: str) -> tables.Dataset:
    if unstorable(dataset_id):  # cannot be in the database, so it is not there
        raise NotFound(f"dataset {dataset_id!r} not found")
    return datasets.get_or_raise(
        session=session, dataset_id=dataset_id, project_id=principal.project_id
    )


def _detached(session: Session, principal: Principal, dataset_id: str) -> tables.Dataset:
    """The dataset, out of the session, whose connection is given back while its files are
    read (seconds for a large directory on an object store)."""
    dataset = _dataset(session, principal, dataset_id)
    session.expunge(dataset)
    session.rollback()
    return dataset


def _readable(paths: ServerPaths, read: Callable[[], T]) -> T:
    """`read()`, with a location gone or changed since registration as a 409 that names no
    server directory."""
    try:
        return read()
    except (OSError, InvalidJobError, ValueError) as exc:
        raise Conflict(
            paths.hide(f"the dataset's files cannot be read now: {exc}"),
            details=[{"loc": ["path", "dataset_id"], "msg": "unreadable", "type": "conflict"}],
        ) from None


@router.post(
    "/{dataset_id}/preview",
    response_model=schemas.DatasetPreview,
    responses={
        409: {
            "model": ErrorBody,
            "description": "The dataset's format has no records to render, or `loss_on` does "
            "not apply to it",
        },
        403: {"model": ErrorBody, "description": "`model.hf.path_or_id` is outside the data roots"},
    },
)
def preview_dataset(
    dataset_id: DatasetId,
    body: schemas.DatasetPreviewRequest,
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Tokenize the dataset's first records as a job would: each token with its mask bit and
    role, supervised shares per role, and the mask verifier's verdict (a refusal is reported,
    not raised)."""
    if unstorable(dataset_id):
        raise NotFound(f"dataset {dataset_id!r} not found")
    require_storable(body.model_dump(), ("body",))
    return dataset_preview.preview(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        dataset_id=dataset_id,
        model=body.model,
        chat_template=body.chat_template,
        loss_on=body.loss_on,
        seq_len=body.seq_len,
        truncation=body.truncation,
        max_truncated_share=body.max_truncated_share,
        num_examples=body.num_examples,
    )


def _out(dataset: tables.Dataset, paths: ServerPaths, principal: Principal) -> schemas.Dataset:
    return redaction.dataset(dataset, paths, admin=redaction.is_admin(principal))
