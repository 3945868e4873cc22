"""Jobs: submit, list, read, cancel, pause, resume, retry; a queued job says why it waits."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response
from pydantic import StringConstraints
from sqlalchemy.orm import Session

from api import openapi_examples, redaction, schemas
from api.deps import (
    JobsWritePrincipal,
    ReadPrincipal,
    ServerPathsDep,
    SessionDep,
    SettingsDep,
)
from api.errors import ERROR_RESPONSES, ErrorBody
from api.validation import MAX_ID, JobId
from core.datasets import service as datasets
from core.jobs import details as job_details
from core.jobs import listing as job_list
from core.jobs import service as jobs
from core.platform.errors import InvalidInput, NotFound
from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings
from core.platform.storable import unstorable
from core.platform.tables import Job, JobState
from core.scheduling import claim as scheduling
from core.scheduling import queue_forecast
from core.submission import service as submission
from core.usage import report as usage_report
from jobspec.job import AnyJobSpec

LABEL = r"^[^=\x00]+=[^\x00]*$"
"""A `label` filter: `key=value`, a non-empty key (the first `=` ends it), no NUL."""

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "Conflicts with the job's state"}
}


@router.post(
    "",
    status_code=201,
    response_model=schemas.Job,
    operation_id="jobs_create",
    responses={
        200: {"model": schemas.Job, "description": "Replay: the job first made with this key"},
        403: {"model": ErrorBody, "description": "`data.uri` is outside the allowed data roots"},
        404: {"model": ErrorBody, "description": "`model.init_from` names no job/checkpoint"},
        409: {
            "model": ErrorBody,
            "description": "`Idempotency-Key` reused for another spec, or the "
            "`model.init_from` job has no complete checkpoint",
        },
        429: {
            "model": ErrorBody,
            "description": "The project's `max_queued_jobs` quota on the pool is reached "
            "(`quota_exceeded`), or the key's rate limit; retry after `Retry-After` seconds",
            "headers": {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                }
            },
        },
    },
)
def submit_job(
    spec: Annotated[AnyJobSpec, Body(openapi_examples=openapi_examples.JOB_SPEC_EXAMPLES)],
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            pattern=schemas.PRINTABLE,
            description="Retrying with the same key and spec returns the first job (200).",
        ),
    ] = None,
) -> schemas.Job:
    """Submit a training job (a JobSpec, or a ScriptJobSpec with `entrypoint`); it is queued
    and dispatched to its pool."""
    result = submission.submit(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        spec=spec,
        owner=principal.key_name,
        door=submission.API,
        idempotency_key=idempotency_key,
    )
    if not result.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{result.job.id}"
    return _out(session, settings, paths, [result.job], queue=False)[0]


def _out(
    session: Session,
    settings: Settings,
    paths: ServerPaths,
    items: list[Job],
    log_tail: bool = True,
    queue: bool = True,
) -> list[schemas.Job]:
    """Jobs as the API shows them: waiting ones with their place in the queue, reason and
    estimated start (`core.scheduling.queue_forecast`: a replay per pool of the page's queued jobs;
    workers count as live for `settings.worker_timeout_s`), each with its `usage` (one query for the
    page). `log_tail=False` (the list) leaves each failure's log lines out; `queue=False` (the
    submit path, kept cheap) leaves `queue` null and gives `queue_position` by priority and age
    only."""
    timeout_s = settings.worker_timeout_s
    waits = (
        queue_forecast.queue_infos(session=session, jobs=items, worker_timeout_s=timeout_s)
        if queue
        else {}
    )
    # Without the replay: the place by priority and age (one index range count per job).
    positions = {} if queue else scheduling.queue_positions(session=session, queued=items)
    ran = [j.id for j in items if j.attempt > 0]  # a job never claimed has used nothing
    used = usage_report.job_usage(session=session, job_ids=ran, prices=settings.slot_prices)
    out = []
    for job in items:
        shown = redaction.job(job, paths)
        wait = waits.get(job.id)
        update: dict[str, Any] = {
            "queue_position": wait.position if wait is not None else positions.get(job.id),
            "queue": schemas.JobQueue(**vars(wait)) if wait is not None else None,
            "waiting_for": scheduling.waiting_for(job),
        }
        update["usage"] = schemas.JobUsage.model_validate(used.get(job.id, usage_report.Totals()))
        if shown.failure is not None and not log_tail:
            update["failure"] = shown.failure.model_copy(update={"log_tail": None})
        out.append(shown.model_copy(update=update))
    return out


@router.get("", response_model=schemas.JobPage)
def list_jobs(
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    state: Annotated[
        list[JobState] | None, Query(description="Only jobs in these states (repeatable).")
    ] = None,
    name: Annotated[
        str | None,
        Query(max_length=100, pattern=r"^[^\x00]*$", description="Substring of the job name."),
    ] = None,
    label: Annotated[
        list[Annotated[str, StringConstraints(max_length=300, pattern=LABEL)]] | None,
        Query(
            max_length=20,
            description="`key=value`: only jobs with this label (repeatable: all must match).",
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=r"^[^\x00]*$",
            description="Id or name of a dataset of the project: only jobs whose spec names it "
            "(`data.dataset`, `data.eval_dataset` or an evaluation's `dataset`).",
        ),
    ] = None,
    sort: Annotated[
        Literal[job_list.SORTS],  # type: ignore[valid-type]
        Query(description="Order: `created`, `name` or `state`; `-` first for descending."),
    ] = job_list.DEFAULT_SORT,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=600, description="`next_cursor` of the previous page.")
    ] = None,
) -> schemas.JobPage:
    """List the project's jobs, newest first unless `sort` says otherwise, a page at a time."""
    items, after = job_list.list_page(
        session=session,
        project_id=principal.project_id,
        states=[str(s) for s in state or ()],
        name=name or None,
        labels=_labels(label or []),
        dataset_id=_dataset_id(session, principal.project_id, dataset) if dataset else None,
        sort=sort,
        limit=limit,
        after=_decode_cursor(cursor, sort) if cursor is not None else None,
    )
    return schemas.JobPage(
        items=_out(session, settings, paths, items, log_tail=False),
        next_cursor=_encode_cursor(after) if after is not None else None,
    )


def _dataset_id(session: Session, project_id: str, dataset: str) -> str:
    """The id of the project's dataset named `dataset` (its id or name). Raises NotFound when
    there is none (another project's too): a mistyped name would otherwise list no job."""
    found = (
        None
        if unstorable(dataset)
        else datasets.get(session=session, dataset_id=dataset, project_id=project_id)
    )
    if found is None:
        raise NotFound(
            f"dataset: no dataset {dataset[:100]!r} in this project",
            details=[{"loc": ["query", "dataset"], "msg": "no such dataset", "type": "not_found"}],
        )
    return found.id


def _labels(pairs: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for i, pair in enumerate(pairs):
        key, eq, value = pair.partition("=")
        if not eq or not key or len(pair) > 300 or "\x00" in pair:
            raise InvalidInput(
                f"label: {pair[:50]!r} is not key=value",
                details=[
                    {"loc": ["query", "label", i], "msg": "not key=value", "type": "value_error"}
                ],
            )
        labels[key] = value
    return labels


def _encode_cursor(after: job_list.After) -> str:
    # The default order keeps its original cursor shape, so cursors already handed out work.
    body: dict[str, Any] = (
        {"before_id": after.id}
        if after.sort == job_list.DEFAULT_SORT
        else {"sort": after.sort, "value": after.value, "id": after.id}
    )
    raw = json.dumps(body, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str) -> job_list.After:
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if "before_id" in body:
            body = {
                "sort": job_list.DEFAULT_SORT,
                "value": body["before_id"],
                "id": body["before_id"],
            }
        after = job_list.After(sort=body["sort"], value=body["value"], id=body["id"])
    except (binascii.Error, ValueError, TypeError, KeyError):
        after = None
    if (
        after is None
        or after.sort != sort
        or type(after.id) is not int
        or not 1 <= after.id <= MAX_ID
        or type(after.value) is not (int if sort.lstrip("-") == "created" else str)
        or (type(after.value) is str and (len(after.value) > 200 or "\x00" in after.value))
    ):
        raise InvalidInput(
            "cursor: not a cursor this API returned for this sort",
            details=[
                {"loc": ["query", "cursor"], "msg": "malformed cursor", "type": "value_error"}
            ],
        )
    return after


@router.get("/{job_id}", response_model=schemas.Job)
def get_job(
    job_id: JobId,
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Job:
    """Read one job: a waiting one with `queue` (position, reason, estimated start), each
    with its usage so far (slot-seconds, CPU-seconds, cost)."""
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    return _out(session, settings, paths, [job])[0]


_UPDATE_EXAMPLE = {"labels": {"team": "nlp", "baseline": "yes"}, "note": "best run so far"}


@router.patch("/{job_id}", response_model=schemas.Job, operation_id="jobs_update")
def update_job(
    job_id: JobId,
    body: Annotated[
        schemas.JobUpdate,
        Body(openapi_examples={"label and note": {"value": _UPDATE_EXAMPLE}}),
    ],
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Job:
    """Replace a job's labels (the whole set) and/or set its free-text note, in any state;
    a field left out stays as it is. Needs `jobs:write`; 422 names the bad field."""
    job = job_details.update(
        session=session,
        job_id=job_id,
        project_id=principal.project_id,
        labels=body.labels,
        note=body.note,
    )
    session.commit()
    return _out(session, settings, paths, [job])[0]


@router.post("/{job_id}/cancel", status_code=202, response_model=schemas.Job, responses=_CONFLICT)
def cancel_job(
    job_id: JobId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Job:
    """Cancel a job: at once when idle, via `cancelling` when running; 409 once it has ended."""
    job = jobs.cancel(session=session, job_id=job_id, project_id=principal.project_id)
    session.commit()
    return _out(session, settings, paths, [job])[0]


@router.post("/{job_id}/pause", status_code=202, response_model=schemas.Job, responses=_CONFLICT)
def pause_job(
    job_id: JobId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.Job:
    """Pause a job: a running one checkpoints and stops (`pausing`, then `paused`); a queued
    one leaves the queue. 409 in other states."""
    job = jobs.pause(session=session, job_id=job_id, project_id=principal.project_id)
    session.commit()
    return _out(session, settings, paths, [job])[0]


@router.post("/{job_id}/resume", status_code=202, response_model=schemas.Job, responses=_CONFLICT)
def resume_job(
    job_id: JobId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    request: Request,
) -> schemas.Job:
    """Resume a paused job: it is queued again and continues from its latest checkpoint."""
    job = jobs.resume(session=session, job_id=job_id, project_id=principal.project_id)
    session.commit()  # and the job's run message goes
    return _out(session, settings, paths, [job])[0]


@router.post("/{job_id}/retry", status_code=202, response_model=schemas.Job, responses=_CONFLICT)
def retry_job(
    job_id: JobId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    request: Request,
) -> schemas.Job:
    """Run a failed or cancelled job again from its latest checkpoint, with a fresh restart
    budget. 409 in other states."""
    job = jobs.retry(session=session, job_id=job_id, project_id=principal.project_id)
    session.commit()  # and the job's run message goes
    return _out(session, settings, paths, [job])[0]
