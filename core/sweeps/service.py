"""Sweeps as a resource: create (the study with it), read, list, cancel.

A sweep's trials are made and ended by the controller's round (`core.sweeps.drive`), not
here: `create` only records the sweep and its Optuna study, so a request returns at once and
a restarted API or controller loses nothing (the study and the trials are in the database).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.errors import Conflict, NotFound
from core.platform.tables import (
    TERMINAL_STATES,
    Job,
    Sweep,
    SweepState,
    SweepTrial,
    TrialState,
    utcnow,
)
from core.sweeps import study
from jobspec.job import STORED
from jobspec.sweep import SweepSpec

ENDED = frozenset({SweepState.SUCCEEDED, SweepState.FAILED, SweepState.CANCELLED})


def create(
    *,
    session: Session,
    database_url: str,
    project_id: str,
    spec: SweepSpec,
    owner: str | None = None,
) -> Sweep:
    """Record a running sweep and create its study. `spec` has passed the submission checks
    (its `base` with `init_from` pinned). Commits."""
    sweep = Sweep(
        project_id=project_id,
        name=spec.name,
        state=SweepState.RUNNING,
        spec=spec.model_dump(mode="json"),
        study_name="",
        owner=owner,
    )
    session.add(sweep)
    session.flush()
    sweep.study_name = study.study_name(sweep.id)
    study.create(database_url, sweep.study_name, spec)
    session.commit()
    return sweep


def spec_of(sweep: Sweep) -> SweepSpec:
    """The sweep's spec as stored (`STORED`: accepted at submission, not checked again)."""
    return SweepSpec.model_validate(sweep.spec, context=STORED)


def get_or_raise(*, session: Session, sweep_id: int, project_id: str | None = None) -> Sweep:
    """The sweep; NotFound when there is none with that id in `project_id`."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or (project_id is not None and sweep.project_id != project_id):
        raise NotFound(f"sweep {sweep_id} not found")
    return sweep


def page(
    *, session: Session, project_id: str, after: int | None = None, limit: int = 50
) -> list[Sweep]:
    """The project's sweeps, newest first, below id `after` (keyset paging)."""
    query = select(Sweep).where(Sweep.project_id == project_id)
    if after is not None:
        query = query.where(Sweep.id < after)
    return list(session.execute(query.order_by(Sweep.id.desc()).limit(limit)).scalars())


def trials(*, session: Session, sweep_id: int) -> list[tuple[SweepTrial, Job | None]]:
    """The sweep's trials by number, each with its job (None for one that never had a job)."""
    rows = session.execute(
        select(SweepTrial, Job)
        .outerjoin(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id == sweep_id)
        .order_by(SweepTrial.number)
    ).all()
    return [(trial, job) for trial, job in rows]


def counts(*, session: Session, sweep_id: int) -> dict[str, int]:
    """Trials by state."""
    out: dict[str, int] = {str(s): 0 for s in TrialState}
    for (state,) in session.execute(
        select(SweepTrial.state).where(SweepTrial.sweep_id == sweep_id)
    ):
        out[state] = out.get(state, 0) + 1
    return out


def cancel(*, session: Session, sweep_id: int, project_id: str | None = None) -> Sweep:
    """Cancel the sweep and every trial job still queued or running (they go to cancelled, or
    cancelling while their trainer checkpoints and stops); no trial starts after this.
    Conflict when the sweep already ended. Commits."""
    sweep = get_or_raise(session=session, sweep_id=sweep_id, project_id=project_id)
    if sweep.state in ENDED:
        raise Conflict(
            f"sweep {sweep_id} already {sweep.state}",
            details=[{"loc": ["state"], "msg": f"sweep is {sweep.state}", "type": sweep.state}],
        )
    now = utcnow()
    sweep.state = SweepState.CANCELLED
    sweep.updated_at = now
    sweep.finished_at = now
    for _trial, job in trials(session=session, sweep_id=sweep_id):
        if job is not None and job.state not in TERMINAL_STATES:
            jobs.cancel(session=session, job_id=job.id)
    session.commit()
    return sweep


def best(*, session: Session, sweep: Sweep) -> tuple[SweepTrial, Job | None] | None:
    """The best completed trial (the sweep's `best_trial`), with its job; None before one."""
    if sweep.best_trial is None:
        return None
    row = session.execute(
        select(SweepTrial, Job)
        .outerjoin(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id == sweep.id, SweepTrial.number == sweep.best_trial)
    ).first()
    return None if row is None else (row[0], row[1])
