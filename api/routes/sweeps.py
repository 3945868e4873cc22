"""Sweeps: submit, list, read, list trials, cancel (`core.sweeps`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import (
    JobsWritePrincipal,
    ReadPrincipal,
    ServerPathsDep,
    SessionDep,
    SettingsDep,
)
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas.sweeps import (
    SWEEP_SPEC_EXAMPLE,
    BestTrial,
    SweepOut,
    SweepPage,
    TrialList,
    TrialOut,
)
from api.validation import MAX_ID
from core.jobs import exports
from core.platform.errors import DomainError
from core.platform.server_paths import ServerPaths
from core.platform.storable import require_storable
from core.platform.tables import Checkpoint, Sweep
from core.submission import service as submission
from core.sweeps import service as sweeps
from core.sweeps import study
from core.usage import report as usage_report
from jobspec.sweep import SweepSpec

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=ERROR_RESPONSES)

SweepId = Annotated[int, Path(ge=1, le=MAX_ID, description="The sweep's id.")]


@router.post(
    "",
    status_code=201,
    response_model=SweepOut,
    operation_id="sweeps_create",
    responses={
        403: {"model": ErrorBody, "description": "`base.data.uri` is outside the data roots"},
        404: {"model": ErrorBody, "description": "`base.model.init_from` names nothing"},
    },
)
def create_sweep(
    spec: Annotated[
        SweepSpec,
        Body(
            openapi_examples={
                "lr": {"summary": "A learning-rate sweep with ASHA", "value": SWEEP_SPEC_EXAMPLE}
            }
        ),
    ],
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    paths: ServerPathsDep,
    response: Response,
) -> SweepOut:
    """Start a sweep: `max_trials` jobs made from `base` with values drawn from `space`, at
    most `max_concurrent_trials` at a time. The base spec gets every check `POST /v1/jobs`
    makes (its problems are reported at `base...`); the controller then starts the trials.
    A trial whose drawn spec is invalid is recorded as failed with the reason, and the sweep
    goes on."""
    require_storable(spec.model_dump(), ("body",))
    usage_report.check_priced(spec.base.resources.pool, spec.limits.max_cost, settings.slot_prices)
    try:
        pinned = submission.check(
            session=session, settings=settings, project_id=principal.project_id, spec=spec.base
        )
    except DomainError as exc:
        raise _under_base(exc) from None
    sweep = sweeps.create(
        session=session,
        database_url=settings.database_url,
        project_id=principal.project_id,
        spec=spec.model_copy(update={"base": pinned}),
        owner=principal.key_name,
    )
    response.headers["Location"] = f"/v1/sweeps/{sweep.id}"
    return _out(session, paths, sweep)


@router.get("", response_model=SweepPage, operation_id="sweeps_list")
def list_sweeps(
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    after: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="Return sweeps with a smaller id.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
) -> SweepPage:
    """The project's sweeps, newest first."""
    rows = sweeps.page(session=session, project_id=principal.project_id, after=after, limit=limit)
    return SweepPage(
        items=[_out(session, paths, s) for s in rows],
        next_after=rows[-1].id if len(rows) == limit else None,
    )


@router.get("/{sweep_id}", response_model=SweepOut, operation_id="sweeps_get")
def get_sweep(
    sweep_id: SweepId, principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> SweepOut:
    """One sweep: its state, trials by state and best trial so far."""
    sweep = sweeps.get_or_raise(session=session, sweep_id=sweep_id, project_id=principal.project_id)
    return _out(session, paths, sweep)


@router.get("/{sweep_id}/trials", response_model=TrialList, operation_id="sweeps_trials")
def list_trials(
    sweep_id: SweepId, principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> TrialList:
    """Every trial of the sweep by number: its values, state, metric and job."""
    sweeps.get_or_raise(session=session, sweep_id=sweep_id, project_id=principal.project_id)
    return TrialList(
        items=[
            TrialOut(
                number=trial.number,
                state=trial.state,
                params=trial.params,
                value=trial.value,
                job_id=trial.job_id,
                job_state=job.state if job is not None else None,
                current_step=job.current_step if job is not None else None,
                pruned_step=trial.pruned_step,
                pruned_rung=trial.pruned_rung,
                error=paths.hide(trial.error),  # a job's error may name a server file
                created_at=trial.created_at,
                finished_at=trial.finished_at,
            )
            for trial, job in sweeps.trials(session=session, sweep_id=sweep_id)
        ]
    )


@router.post(
    "/{sweep_id}/cancel",
    status_code=202,
    response_model=SweepOut,
    operation_id="sweeps_cancel",
    responses={409: {"model": ErrorBody, "description": "The sweep already ended"}},
)
def cancel_sweep(
    sweep_id: SweepId, principal: JobsWritePrincipal, session: SessionDep, paths: ServerPathsDep
) -> SweepOut:
    """Cancel the sweep and its queued and running trials (running ones checkpoint and
    stop); no trial starts after this."""
    sweep = sweeps.cancel(session=session, sweep_id=sweep_id, project_id=principal.project_id)
    return _out(session, paths, sweep)


def _out(session: Session, paths: ServerPaths, sweep: Sweep) -> SweepOut:
    spec = sweeps.spec_of(sweep)
    return SweepOut(
        id=sweep.id,
        name=sweep.name,
        state=sweep.state,
        spec=spec,
        owner=sweep.owner,
        error=paths.hide(sweep.error),
        max_trials=study.max_trials(spec),
        trials=sweeps.counts(session=session, sweep_id=sweep.id),
        best=_best(session, sweep),
        created_at=sweep.created_at,
        updated_at=sweep.updated_at,
        finished_at=sweep.finished_at,
    )


def _best(session: Session, sweep: Sweep) -> BestTrial | None:
    found = sweeps.best(session=session, sweep=sweep)
    if found is None:
        return None
    trial, job = found
    checkpoint = None
    if job is not None:
        checkpoint = session.execute(
            select(Checkpoint)
            .where(Checkpoint.job_id == job.id)
            .order_by(Checkpoint.step.desc())
            .limit(1)
        ).scalar_one_or_none()
    assert trial.value is not None
    return BestTrial(
        number=trial.number,
        value=trial.value,
        params=trial.params,
        job_id=trial.job_id,
        checkpoint_id=checkpoint.id if checkpoint is not None else None,
        checkpoint_step=checkpoint.step if checkpoint is not None else None,
        export_refused=(
            exports.not_exportable(job) if job is not None and checkpoint is not None else None
        ),
    )


def _under_base(exc: DomainError) -> DomainError:
    """A submission check's error with its `["body", ...]` paths under `["body", "base"]`."""
    details: list[dict[str, Any]] = []
    for detail in exc.details:
        loc = list(detail.get("loc", []))
        if loc[:1] == ["body"]:
            loc = ["body", "base", *loc[1:]]
        details.append({**detail, "loc": loc})
    exc.details = details
    exc.message = f"base: {exc.message}"
    return exc
