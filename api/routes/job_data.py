"""A job's history: events, metric series, log lines and checkpoints (read-only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api import redaction, schemas
from api.deps import ReadPrincipal, ServerPathsDep, SessionDep, SettingsDep
from api.errors import ERROR_RESPONSES
from api.validation import After, JobId
from core.jobs import evaluations, exports
from core.jobs import reports as queries
from core.jobs import service as jobs

router = APIRouter(prefix="/v1/jobs", tags=["job data"], responses=ERROR_RESPONSES)


@router.get("/{job_id}/events", response_model=schemas.EventPage)
def job_events(
    job_id: JobId,
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> schemas.EventPage:
    """The job's history (state changes, checkpoints, samples, errors), oldest first."""
    jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    items, next_after = queries.events_page(
        session=session, job_id=job_id, after=after, limit=limit
    )
    return schemas.EventPage(
        items=[redaction.event(e, paths) for e in items],
        next_cursor=str(next_after) if next_after is not None else None,
    )


@router.get("/{job_id}/metrics", response_model=schemas.Metrics, response_model_exclude_unset=True)
def job_metrics(
    job_id: JobId,
    principal: ReadPrincipal,
    session: SessionDep,
    names: Annotated[
        str | None,
        Query(
            max_length=4000,
            pattern=r"^[^\x00]*$",
            description="Comma-separated metric names; all when absent.",
        ),
    ] = None,
    start: Annotated[
        int | None, Query(ge=0, le=2**31 - 1, description="First step (inclusive).")
    ] = None,
    end: Annotated[
        int | None, Query(ge=0, le=2**31 - 1, description="Last step (inclusive).")
    ] = None,
    max_points: Annotated[
        int | None,
        Query(
            ge=1,
            le=100_000,
            description="At most this many points per series, shape kept (min/max per step "
            "bucket, first and last point exact); every point when absent.",
        ),
    ] = None,
    times: Annotated[
        bool,
        Query(
            description="Also return `times`: the trainer's clock (unix seconds) at each point, "
            "for charts by wall time; absent when false."
        ),
    ] = False,
) -> schemas.Metrics:
    """The job's metric series by name, each with its last point; optionally a step range and
    downsampled to `max_points` per series."""
    # Held for the request: the session's identity map keeps only weak references, and the
    # downsampling cache reads this row's `updated_at` again (a second query and spec parse).
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    wanted = [n.strip() for n in names.split(",") if n.strip()] if names else None
    if max_points is None:
        series = queries.metric_series(
            session=session, job_id=job_id, names=wanted or None, start=start, end=end
        )
    else:
        series = queries.downsampled_series(
            session=session,
            job_id=job.id,
            names=wanted or None,
            start=start,
            end=end,
            max_points=max_points,
        )
    return schemas.Metrics(
        series=[
            schemas.MetricSeries(
                name=s.name,
                steps=s.steps,
                values=s.values,
                last=schemas.MetricLast(step=s.steps[-1], value=s.values[-1]) if s.steps else None,
                # Only when asked: unset fields are left out, so the default answer is unchanged.
                **(
                    {
                        "times": queries.point_times(
                            session=session, job_id=job_id, name=s.name, steps=s.steps
                        )
                    }
                    if times
                    else {}
                ),
            )
            for s in series
        ]
    )


@router.get("/{job_id}/logs", response_model=schemas.LogPage)
def job_logs(
    job_id: JobId,
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    rank: Annotated[
        int | None, Query(ge=-1, le=2**31 - 1, description="One rank's lines; -1: launcher.")
    ] = None,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> schemas.LogPage:
    """The job's log lines, oldest first."""
    jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    items, next_after = queries.logs_page(
        session=session, job_id=job_id, rank=rank, after=after, limit=limit
    )
    return schemas.LogPage(
        items=[redaction.log_line(x, paths) for x in items],
        next_cursor=str(next_after) if next_after is not None else None,
    )


@router.get("/{job_id}/checkpoints", response_model=schemas.CheckpointList)
def job_checkpoints(
    job_id: JobId,
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
) -> schemas.CheckpointList:
    """The job's complete checkpoints, by step, each with its safetensors export if one was
    requested (a pending one says when no exporter runs: `waiting_for`)."""
    jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    items = queries.checkpoints(session=session, job_id=job_id)
    made = exports.of_job(session=session, job_id=job_id)
    admin = redaction.is_admin(principal)
    out = [redaction.checkpoint(c, made.get(c.id), paths, admin=admin) for c in items]
    pending = [c.export for c in out if c.export is not None and c.export.state == "pending"]
    if pending:
        why = exports.exporter_missing(
            session=session, queue=settings.export_queue, timeout_s=settings.worker_timeout_s
        )
        for export in pending:
            export.waiting_for = why
    return schemas.CheckpointList(items=out)


@router.get("/{job_id}/evals", response_model=schemas.EvaluationList)
def job_evaluations(
    job_id: JobId, principal: ReadPrincipal, session: SessionDep
) -> schemas.EvaluationList:
    """The job's evaluations (`kind: eval` jobs, `jobspec.evaluate`): the ones it ran, for an
    eval job; the ones run on its checkpoints, for a training job. By checkpoint step."""
    jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)
    found = evaluations.for_job(session=session, job_id=job_id)
    return schemas.EvaluationList(items=[schemas.Evaluation.model_validate(e) for e in found])
