"""A trial's reports to Optuna, and the pruner's verdict, as the worker ingests its metric.

The worker that supervises a trial's node 0 (`workers.watchers.trials.TrialPruner`) calls `report`
with the metric's points it has not sent yet; Optuna's pruner (successive halving or median, on the
study in our database) decides. A `Verdict` stops the trial: its job goes to `cancelling` with
the cause, the trainer checkpoints and stops at its next step boundary (SIGTERM), and the
controller then tells Optuna the trial was pruned (`core.sweeps.drive`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.errors import Conflict
from core.platform.tables import (
    Job,
    JobState,
    MetricPoint,
    Sweep,
    SweepState,
    SweepTrial,
    TrialState,
)
from core.sweeps import study
from core.sweeps.service import spec_of
from jobspec.job import JobSpec
from jobspec.sweep import SweepSpec

log = logging.getLogger(__name__)
RUNG_ATTR = "completed_rung_"  # Optuna's SuccessiveHalvingPruner records rungs as system attrs


@dataclass(frozen=True)
class Trial:
    """A running trial as its worker sees it: the sweep's spec and where to report."""

    sweep_id: int
    number: int
    optuna_trial_id: int
    study_name: str
    spec: SweepSpec
    tokens_per_step: int  # 1 on the step axis


@dataclass(frozen=True)
class Verdict:
    step: int  # the reported step the pruner stopped it at
    rung: int | None  # successive halving's rung; None for the median pruner


def trial_of(session: Session, job: Job) -> Trial | None:
    """The running trial `job` runs for, or None (not a trial, or its sweep prunes nothing)."""
    row = session.execute(
        select(SweepTrial, Sweep)
        .join(Sweep, Sweep.id == SweepTrial.sweep_id)
        .where(SweepTrial.job_id == job.id, SweepTrial.state == TrialState.RUNNING)
    ).first()
    if row is None:
        return None
    trial, sweep = row
    spec = spec_of(sweep)
    if spec.pruner.kind == "none" or sweep.state != SweepState.RUNNING:
        return None
    per_step = 1
    if spec.pruner.axis == "tokens" and isinstance(job.spec, JobSpec):
        per_step = job.spec.global_batch_size * job.spec.model.seq_len
    return Trial(
        sweep_id=sweep.id,
        number=trial.number,
        optuna_trial_id=trial.optuna_trial_id,
        study_name=sweep.study_name,
        spec=spec,
        tokens_per_step=per_step,
    )


def new_points(session: Session, job_id: int, metric: str, after: int) -> list[tuple[int, float]]:
    """(step, value) of `metric` reported past step `after`, by step."""
    return [
        (step, value)
        for step, value in session.execute(
            select(MetricPoint.step, MetricPoint.value)
            .where(
                MetricPoint.job_id == job_id, MetricPoint.name == metric, MetricPoint.step > after
            )
            .order_by(MetricPoint.step)
        )
    ]


def report(database_url: str, trial: Trial, points: Sequence[tuple[int, float]]) -> Verdict | None:
    """Report `points` ((step, value), by step) to the trial, then ask its pruner. A trial
    Optuna already ended (the sweep was cancelled) gets None."""
    import optuna

    if not points:
        return None
    the_study = optuna.load_study(
        study_name=trial.study_name,
        storage=study.storage(database_url),
        sampler=optuna.samplers.RandomSampler(),  # never samples here; no side effects
        pruner=study.pruner(trial.spec),
    )
    handle = optuna.trial.Trial(the_study, trial.optuna_trial_id)
    if handle._cached_frozen_trial.state != optuna.trial.TrialState.RUNNING:
        return None
    for step, value in points:
        handle.report(value, step * trial.tokens_per_step)
    if not handle.should_prune():
        return None
    attrs = the_study._storage.get_trial_system_attrs(trial.optuna_trial_id)
    rungs = [int(k[len(RUNG_ATTR) :]) for k in attrs if k.startswith(RUNG_ATTR)]
    return Verdict(step=points[-1][0], rung=max(rungs) if rungs else None)


def stop(session: Session, job_id: int, trial: Trial, verdict: Verdict) -> bool:
    """Record the verdict on the trial and move its job to `cancelling` (cause `pruned`).
    False when the job is no longer running (cancelled meanwhile). Commits."""
    row = session.get(SweepTrial, (trial.sweep_id, trial.number))
    if row is None or row.state != TrialState.RUNNING:
        return False
    job = session.get(Job, job_id)
    trained = job.current_step if job is not None else None
    try:
        jobs.transition(
            session=session,
            job_id=job_id,
            to=JobState.CANCELLING,
            from_states=[JobState.STARTING, JobState.RUNNING],
            message=jobs.pruned_reason(trial.sweep_id, verdict.step, verdict.rung),
            data={
                "cause": "pruned",
                "sweep": trial.sweep_id,
                "trial": trial.number,
                "step": verdict.step,
                "rung": verdict.rung,
                # where the trainer was when the pruner decided (it stops at its next step)
                "current_step": trained,
            },
        )
    except Conflict:
        session.rollback()
        return False
    row.pruned_step, row.pruned_rung = verdict.step, verdict.rung
    session.commit()
    log.info(
        "job %s: trial %s of sweep %s pruned at step %s",
        job_id,
        trial.number,
        trial.sweep_id,
        verdict.step,
    )
    return True
