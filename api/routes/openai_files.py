"""OpenAI-compatible files and models (`/openai/v1/files`, `/openai/v1/models`): files are the
project's record datasets, models the registered base models and succeeded fine-tunes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import fsspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy import select, tuple_
from starlette.concurrency import run_in_threadpool

from api import openai_errors, uploads
from api import openai_examples as ex
from api.deps import DatasetsWritePrincipal, ReadPrincipal, SessionDep, SettingsDep
from api.openapi_examples import json_example
from core.access.auth import new_id
from core.datasets import service as datasets
from core.jobs import service as jobs
from core.openai import projection
from core.openai import results as openai_results
from core.platform import storage
from core.platform.errors import Conflict, InvalidInput, NotFound
from core.platform.tables import TERMINAL_STATES, Dataset, Job, JobState
from jobspec.job import JobSpec

PREFIX = "/openai/v1"
FILES_PATH = f"{PREFIX}/files"
# Record formats a file may have: those some `method.type` trains on (`prompt`: OpenAI's RFT
# JSONL, `messages` ending in a user turn plus the fields its grader reads).
RECORD_FORMATS = ("messages", "prompt_completion", "preference", "prompt")

router = APIRouter(prefix=PREFIX, tags=["openai"], responses=openai_errors.RESPONSES)

FileId = Annotated[str, Path(max_length=100, description="The file's id (its dataset's).")]


@router.get("/models", responses={200: json_example(ex.MODEL_LIST)})
def list_models(
    principal: ReadPrincipal, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """The base models this deployment fine-tunes, then the project's fine-tuned models."""
    data = projection.model_objects(session, settings, principal.project_id)
    return {"object": "list", "data": data}


@router.get("/models/{model_id:path}", responses={200: json_example(ex.BASE_MODEL_OBJECT)})
def get_model(
    model_id: Annotated[str, Path(max_length=300)],
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """One model: a base model's name or `ft:<base>:<project>:<suffix>:<job id>`. 404 else."""
    return projection.find_model(session, settings, principal.project_id, model_id)


@router.post(
    "/files", openapi_extra=uploads.OPENAI_FILE_BODY, responses={200: json_example(ex.FILE)}
)
async def create_file(
    request: Request, principal: DatasetsWritePrincipal, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """Upload a JSONL file (multipart `file`, `purpose=fine-tune`) as a dataset of format
    `messages`, `prompt_completion`, `preference` or `prompt` (detected; `prompt`: OpenAI's
    reinforcement fine-tuning records, `messages` ending in a user turn), checked record by
    record as `POST /v1/datasets/upload` checks it. 400 names the first bad line; 413 over the
    size limit."""
    dataset_id = new_id("ds")
    root_uri = storage.join(settings.storage_url, "datasets", dataset_id)
    async with uploads.streamed(
        request, session, root_uri=root_uri, max_bytes=settings.max_upload_bytes,
        text_fields=("purpose",), required=("purpose",),
    ) as upload:  # fmt: skip
        purpose = upload.fields["purpose"].decode("utf-8", "replace")
        if purpose != "fine-tune":
            msg = f"only purpose 'fine-tune' is supported, not {purpose[:50]!r}"
            raise InvalidInput(
                f"purpose: {msg}",
                details=[{"loc": ["body", "purpose"], "msg": msg, "type": "enum"}],
            )
        dataset = await run_in_threadpool(
            _store, session, settings, principal.project_id, dataset_id, upload
        )
    return projection.file_object(dataset)


def _store(
    session: SessionDep, settings: SettingsDep, project_id: str, dataset_id: str, upload: Any
) -> Dataset:
    checked = datasets.check(
        settings=settings, uri=upload.uri, format=None, token_dtype=None, where=("body", "file")
    )
    if checked.format not in RECORD_FORMATS:
        msg = f"expected JSONL records of {', '.join(RECORD_FORMATS)}; found {checked.format!r}"
        raise InvalidInput(
            f"file: {msg}", details=[{"loc": ["body", "file"], "msg": msg, "type": "format"}]
        )
    name = (upload.filename or "upload.jsonl")[:150]
    for candidate in (name, f"{name}.{dataset_id}"):
        try:
            return datasets.create(
                session=session,
                project_id=project_id,
                name=candidate,
                uri=upload.uri,
                size_bytes=upload.size_bytes,
                sha256=upload.sha256,
                num_files=1,
                format=checked.format,
                stats=checked.stats,
                dataset_id=dataset_id,
            )
        except Conflict:
            continue
    raise Conflict(f"file name {name!r} is taken in this project")


def _files(
    session: SessionDep, project_id: str, after: str | None, limit: int, order: str
) -> list[Dataset]:
    """Up to `limit` + 1 of the project's record datasets in (created_at, id) `order`, those
    after the file `after` (InvalidInput naming `after` when the project has no such file)."""
    key = (Dataset.created_at, Dataset.id)
    query = select(Dataset).where(
        Dataset.project_id == project_id, Dataset.format.in_(RECORD_FORMATS)
    )
    if after is not None:
        mark = session.get(Dataset, after)
        if mark is None or mark.project_id != project_id or mark.format not in RECORD_FORMATS:
            msg = "not the id of a file of this project"
            raise InvalidInput(
                f"after: {msg}",
                details=[{"loc": ["query", "after"], "msg": msg, "type": "value_error"}],
            )
        row, bound = tuple_(*key), tuple_(mark.created_at, mark.id)
        query = query.where(row < bound if order == "desc" else row > bound)
    ordered = [c.desc() for c in key] if order == "desc" else list(key)
    return list(session.scalars(query.order_by(*ordered).limit(limit + 1)))


@router.get("/files", responses={200: json_example(ex.FILE_LIST)})
def list_files(
    principal: ReadPrincipal,
    session: SessionDep,
    after: Annotated[
        str | None, Query(max_length=100, description="Id of the previous page's last file.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query(description="By `created_at`.")] = "desc",
    purpose: Annotated[str | None, Query(max_length=100)] = None,
) -> dict[str, Any]:
    """The project's uploaded files (record datasets), newest first (`order=asc`: oldest),
    `limit` at a time after the file `after`, as OpenAI pages them. Result files
    (`fine-tune-results`) are reached from their job's `result_files`, not listed here."""
    found = (
        []
        if purpose not in (None, "fine-tune")
        else _files(session, principal.project_id, after, limit, order)
    )
    data = [projection.file_object(d) for d in found[:limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(found) > limit,
    }


def _file(session: SessionDep, project_id: str, file_id: str) -> Dataset:
    found = datasets.get(session=session, dataset_id=file_id, project_id=project_id)
    if found is None or found.format not in RECORD_FORMATS:
        raise NotFound(f"file {file_id!r} not found")
    return found


def _result_job(session: SessionDep, project_id: str, file_id: str) -> Job | None:
    """The succeeded fine-tuning job whose result file `file_id` is; None when it is not a
    result file's id. Raises NotFound for a result id of no such job (or another project's)."""
    job_id = openai_results.result_job_id(file_id)
    if job_id is None:
        return None
    job = jobs.get(session=session, job_id=job_id, project_id=project_id)
    if job is None or not projection.is_fine_tune(job) or job.state != JobState.SUCCEEDED:
        raise NotFound(f"file {file_id!r} not found")
    return job


def _result_object(job: Job, body: bytes) -> dict[str, Any]:
    return {
        "id": openai_results.result_file_id(job),
        "object": "file",
        "bytes": len(body),
        "created_at": projection.ts(job.finished_at or job.created_at),
        "filename": "step_metrics.csv",
        "purpose": openai_results.RESULT_PURPOSE,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


@router.get("/files/{file_id}", responses={200: json_example(ex.FILE)})
def get_file(file_id: FileId, principal: ReadPrincipal, session: SessionDep) -> dict[str, Any]:
    """One file: an uploaded one, or a succeeded job's result file (`file-result-<job id>`,
    purpose `fine-tune-results`). 404 when the project has no such file."""
    job = _result_job(session, principal.project_id, file_id)
    if job is not None:
        return _result_object(job, openai_results.results_csv(session, job).encode())
    return projection.file_object(_file(session, principal.project_id, file_id))


@router.get(
    "/files/{file_id}/content",
    response_model=None,
    response_class=Response,
    responses={
        200: {
            "description": "The file's bytes: an upload as it was sent, a result file as CSV",
            "content": {
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                    "example": ex.FILE_CONTENT_JSONL,
                },
                "text/csv": {"schema": {"type": "string"}, "example": ex.RESULT_CSV},
            },
        }
    },
)
def file_content(
    file_id: FileId, principal: ReadPrincipal, session: SessionDep
) -> StreamingResponse | Response:
    """The file's bytes as uploaded (streamed); a result file's CSV (`step,train_loss,
    train_accuracy,valid_loss,valid_mean_token_accuracy`; a reinforcement job's
    `step,train_reward_mean,valid_reward_mean`), generated from the job's metrics."""
    job = _result_job(session, principal.project_id, file_id)
    if job is not None:
        return Response(openai_results.results_csv(session, job), media_type="text/csv")
    found = _file(session, principal.project_id, file_id)
    return StreamingResponse(storage.read_chunks(found.uri), media_type="application/octet-stream")


@router.delete("/files/{file_id}", responses={200: json_example(ex.FILE_DELETED)})
def delete_file(
    file_id: FileId, principal: DatasetsWritePrincipal, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """Delete a file and, for an uploaded one, its stored bytes. 409 while a job that has not
    ended trains on it, and for a result file (a view of its job's metrics)."""
    if _result_job(session, principal.project_id, file_id) is not None:
        raise Conflict(f"file {file_id!r} is a view of its job's metrics; it cannot be deleted")
    found = _file(session, principal.project_id, file_id)
    active = select(Job).where(
        Job.project_id == principal.project_id, Job.state.not_in(list(TERMINAL_STATES))
    )
    for job in session.scalars(active):
        spec = job.spec
        if isinstance(spec, JobSpec) and file_id in (spec.data.dataset, spec.data.eval_dataset):
            raise Conflict(f"file {file_id!r} is used by job {job.id}, which has not ended")
    root_uri = storage.join(settings.storage_url, "datasets", found.id)
    uploaded = found.uri.startswith(root_uri)
    session.delete(found)
    session.commit()
    if uploaded:
        fs, path = fsspec.core.url_to_fs(root_uri)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    return {"id": file_id, "object": "file", "deleted": True}
