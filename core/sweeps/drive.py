"""The controller's sweep round: end the trials whose jobs ended (told to Optuna), start new
ones up to `max_concurrent_trials`, and end the sweep when no trial is left to run.

It runs in the controller (`workers.controller`), one process at a time, every round. Every
step is safe to repeat after a crash: a trial is Optuna's first (`ask`), then a row here with
that number, then a job whose `Idempotency-Key` is `sweep-<id>-trial-<n>`; a round that finds
an asked trial without a row adopts it, and a row without a job makes the job again under the
same key (the first one, if it was made, comes back). Telling Optuna an ended trial twice is
skipped (`skip_if_finished`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import outbox
from core.jobs import service as jobs
from core.platform.errors import Conflict, DomainError, QuotaExceeded
from core.platform.settings import Settings
from core.platform.tables import (
    TERMINAL_STATES,
    Job,
    JobState,
    Sweep,
    SweepState,
    SweepTrial,
    TrialState,
    utcnow,
)
from core.submission import service as submission
from core.sweeps import study
from core.sweeps.service import spec_of
from core.usage import report as usage_report
from jobspec.sweep import SweepSpec, with_values

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

Dispatch = outbox.Dispatch  # (job id, pool): sends the job's run message


@dataclass
class Round:
    """What one round did, for logs and tests."""

    started: int = 0
    ended: int = 0
    sweeps_ended: int = 0


def advance_all(
    *,
    session_factory: Callable[[], Session],
    settings: Settings,
    dispatch: Dispatch,
) -> Round:
    """One round over every running sweep, and the trials of cancelled ones still running.
    A sweep whose round fails is logged and tried again next round; the others go on."""
    done = Round()
    with session_factory() as session:
        ids = list(
            session.execute(
                select(Sweep.id).where(
                    (Sweep.state == SweepState.RUNNING)
                    | Sweep.id.in_(
                        select(SweepTrial.sweep_id).where(SweepTrial.state == TrialState.RUNNING)
                    )
                )
            ).scalars()
        )
    for sweep_id in ids:
        with session_factory() as session:
            try:
                advance(
                    session=session,
                    sweep_id=sweep_id,
                    settings=settings,
                    dispatch=dispatch,
                    done=done,
                )
            except Exception:
                session.rollback()
                log.exception("sweep %s: the round failed; trying again next round", sweep_id)
    return done


def advance(
    *,
    session: Session,
    sweep_id: int,
    settings: Settings,
    dispatch: Dispatch,
    done: Round | None = None,
) -> None:
    """One round of one sweep. Commits as it goes; a trial's job is sent through `dispatch`
    after the commit that made it (`core.jobs.outbox`)."""
    outbox.bind(session, dispatch)
    database_url = settings.database_url
    done = done if done is not None else Round()
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return
    spec = spec_of(sweep)
    rows = list(
        session.execute(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id)).scalars()
    )
    if sweep.state == SweepState.RUNNING and spec.limits.max_cost is not None:
        _stop_over_budget(session, sweep, spec, rows, settings.slot_prices)
    if not _has_work(session, sweep, spec, rows):
        return  # nothing ended, nothing to start: Optuna is not asked (a round stays cheap)
    the_study = study.load(database_url, sweep.study_name, spec, len(rows))
    rows += _adopt(session, sweep, the_study, rows)
    done.ended += _end_trials(session, sweep, spec, the_study, rows)
    if sweep.state != SweepState.RUNNING:
        return
    running = [r for r in rows if r.state == TrialState.RUNNING]
    for row in running:
        if row.job_id is None and row.error is None:  # asked, the job not made yet
            _start(session, settings, sweep, spec, row)
    total = study.max_trials(spec)
    budget_left = _budget_left(session, spec, rows, settings.slot_prices)
    while budget_left and len(rows) < total and len(running) < spec.max_concurrent_trials:
        trial = the_study.ask(study.distributions(spec))
        row = _row(sweep, trial.number, trial._trial_id, trial.params)
        session.add(row)
        session.commit()
        rows.append(row)
        if _start(session, settings, sweep, spec, row):
            running.append(row)
            done.started += 1
        else:
            the_study.tell(
                row.number, state=_optuna_state(TrialState.FAILED), skip_if_finished=True
            )
        the_study = study.load(database_url, sweep.study_name, spec, len(rows))
    if not running and (len(rows) >= total or not budget_left):
        _finish(session, sweep, rows, "" if budget_left else "limits.max_cost reached")
        done.sweeps_ended += 1


def _adopt(
    session: Session, sweep: Sweep, the_study: optuna.Study, rows: list[SweepTrial]
) -> list[SweepTrial]:
    """Rows for trials Optuna holds but this table lacks (the controller stopped between the
    ask and the row): each is started like a new one."""
    import optuna

    known = {r.number for r in rows}
    adopted = []
    for trial in the_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.number in known:
            continue
        row = _row(sweep, trial.number, trial._trial_id, trial.params)
        session.add(row)
        adopted.append(row)
    if adopted:
        session.commit()
    return adopted


def _has_work(session: Session, sweep: Sweep, spec: SweepSpec, rows: list[SweepTrial]) -> bool:
    """Whether a round of this sweep can change anything: a running trial whose job ended or
    was never made, room for another trial, or a running sweep with no trial left running.
    (A trial Optuna holds without a row, after a crash, counts toward neither `rows` nor
    `running`, so it is adopted once there is room.)"""
    running = [r for r in rows if r.state == TrialState.RUNNING]
    if any(r.job_id is None for r in running):
        return True
    job_ids = [r.job_id for r in running if r.job_id is not None]
    if (
        job_ids
        and session.execute(
            select(Job.id).where(Job.id.in_(job_ids), Job.state.in_(TERMINAL_STATES)).limit(1)
        ).first()
    ):
        return True
    if sweep.state != SweepState.RUNNING:
        return False
    if not running:
        return True  # it ends, or starts its first trials
    return len(rows) < study.max_trials(spec) and len(running) < spec.max_concurrent_trials


def _row(sweep: Sweep, number: int, trial_id: int, params: Mapping[str, object]) -> SweepTrial:
    """The row of Optuna's trial `number` (id `trial_id`, Optuna's own: `Trial._trial_id`,
    which its public API does not name) with the values it drew."""
    return SweepTrial(
        sweep_id=sweep.id,
        number=number,
        optuna_trial_id=trial_id,
        state=TrialState.RUNNING,
        params=dict(params),
    )


def _start(
    session: Session,
    settings: Settings,
    sweep: Sweep,
    spec: SweepSpec,
    row: SweepTrial,
) -> bool:
    """Make the trial's job through the one door (`core.submission.service.submit`, door `SWEEP`:
    the checks of `POST /v1/jobs`, so a drawn `data.dataset` or `model.init_from.job` is the
    sweep's project's or nothing); its run message goes after the commit. False (the row failed,
    with the reason) when the sampled spec does not validate or is refused. A full
    `max_queued_jobs` quota leaves the row waiting for the next round. Commits."""
    try:
        drawn = with_values(spec.base, row.params)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _refuse(session, row, f"the sampled spec is invalid: {problems}")
    labels = {**drawn.labels, "sweep": str(sweep.id), "trial": str(row.number)}
    drawn = drawn.model_copy(update={"name": f"{spec.name}-{row.number}"[:100], "labels": labels})
    try:
        created = submission.submit(
            session=session,
            settings=settings,
            project_id=sweep.project_id,
            spec=drawn,
            owner=sweep.owner,
            door=submission.SWEEP,
            idempotency_key=f"sweep-{sweep.id}-trial-{row.number}",
        )
    except QuotaExceeded:
        session.rollback()
        return True  # still running: made next round, when the queue has room
    except DomainError as exc:
        return _refuse(session, row, f"the sampled spec is refused: {exc.message}")
    row.job_id = created.job.id
    session.commit()
    return True


def _refuse(session: Session, row: SweepTrial, why: str) -> bool:
    session.rollback()
    _end_row(row, TrialState.FAILED, error=why)
    session.commit()
    return False


def _end_trials(
    session: Session, sweep: Sweep, spec: SweepSpec, the_study: optuna.Study, rows: list[SweepTrial]
) -> int:
    """Tell Optuna how each running trial whose job ended went; returns how many ended."""

    ended = 0
    for row in rows:
        if row.state != TrialState.RUNNING:
            continue
        job = session.get(Job, row.job_id) if row.job_id is not None else None
        if row.job_id is None and row.error is None and sweep.state == SweepState.RUNNING:
            continue  # its job is made this round
        if job is not None and job.state not in TERMINAL_STATES:
            continue
        state, value, error = _outcome(spec, row, job)
        if state == TrialState.SUCCEEDED:
            the_study.tell(row.number, value, skip_if_finished=True)
        else:
            the_study.tell(row.number, state=_optuna_state(state), skip_if_finished=True)
        _end_row(row, state, value=value, error=error)
        if (
            state == TrialState.SUCCEEDED
            and value is not None
            and _better(spec, value, sweep.best_value)
        ):
            sweep.best_trial, sweep.best_value = row.number, value
        sweep.updated_at = utcnow()
        session.commit()
        ended += 1
    return ended


def _outcome(
    spec: SweepSpec, row: SweepTrial, job: Job | None
) -> tuple[TrialState, float | None, str | None]:
    if job is None:
        return TrialState.CANCELLED, None, row.error or "the sweep ended before its job was made"
    # the metric's last value as ingested (`Job.latest_metrics`; null for a non-finite one)
    value = (job.latest_metrics or {}).get(spec.metric)
    if job.state == JobState.SUCCEEDED:
        # a verdict that came too late (the run ended before it stopped) did not prune it
        row.pruned_step = row.pruned_rung = None
        if value is None:
            return TrialState.FAILED, None, f"the job never reported {spec.metric!r}"
        return TrialState.SUCCEEDED, value, None
    if job.state == JobState.PRUNED:
        return TrialState.PRUNED, value, None
    if job.state == JobState.CANCELLED:
        return TrialState.CANCELLED, None, row.error or "its job was cancelled"
    return TrialState.FAILED, None, job.error or f"its job {job.state}"


def _better(spec: SweepSpec, value: float, best: float | None) -> bool:
    if best is None:
        return True
    return value < best if spec.direction == "minimize" else value > best


def _end_row(
    row: SweepTrial, state: TrialState, *, value: float | None = None, error: str | None = None
) -> None:
    row.state = state
    row.value = value
    row.error = error
    row.finished_at = utcnow()


def _optuna_state(state: TrialState) -> optuna.trial.TrialState:
    import optuna

    return (
        optuna.trial.TrialState.PRUNED
        if state == TrialState.PRUNED
        else (optuna.trial.TrialState.FAIL)
    )


def _budget_left(
    session: Session, spec: SweepSpec, rows: list[SweepTrial], prices: Mapping[str, float]
) -> bool:
    """Whether the trials' cost together is below `limits.max_cost` (always, without one)."""
    if spec.limits.max_cost is None:
        return True
    ids = [r.job_id for r in rows if r.job_id is not None]
    used = usage_report.job_usage(session=session, job_ids=ids, prices=prices)
    return sum(t.cost for t in used.values()) < spec.limits.max_cost


def _stop_over_budget(
    session: Session,
    sweep: Sweep,
    spec: SweepSpec,
    rows: list[SweepTrial],
    prices: Mapping[str, float],
) -> None:
    """Stop the running trials once the trials' cost together reached `limits.max_cost`: a
    running job goes to `cancelling` (its trainer checkpoints and stops at its next step), one
    not started yet is cancelled; each trial then ends `cancelled` saying why, and the sweep
    ends. Without this, trials under way ran to their end past the budget. Commits."""
    live = [
        (row, job)
        for row in rows
        if row.state == TrialState.RUNNING and row.job_id is not None
        for job in [session.get(Job, row.job_id)]
        if job is not None and job.state not in (*TERMINAL_STATES, JobState.CANCELLING)
    ]
    if not live or _budget_left(session, spec, rows, prices):
        return
    why = f"sweep {sweep.id}: limits.max_cost {spec.limits.max_cost:g} reached"
    for row, job in live:
        try:
            if job.state in (JobState.STARTING, JobState.RUNNING, JobState.PAUSING):
                jobs.transition(
                    session=session,
                    job_id=job.id,
                    to=JobState.CANCELLING,
                    from_states=[JobState(job.state)],
                    message=why,
                    data={"cause": "sweep_budget", "sweep": sweep.id, "trial": row.number},
                )
            else:
                jobs.cancel(session=session, job_id=job.id)
        except Conflict:  # it moved on meanwhile (ended, or a worker took it): next round
            session.rollback()
            continue
        row.error = "stopped: the sweep's limits.max_cost was reached"
        session.commit()
    log.info("%s: %d trial(s) stopped", why, len(live))


def _finish(session: Session, sweep: Sweep, rows: list[SweepTrial], why: str) -> None:
    completed = any(r.state == TrialState.SUCCEEDED for r in rows)
    now = utcnow()
    sweep.state = SweepState.SUCCEEDED if completed else SweepState.FAILED
    if not completed:
        sweep.error = "no trial completed" + (f" ({why})" if why else "")
    elif why:
        sweep.error = why
    sweep.updated_at = sweep.finished_at = now
    session.commit()
    log.info(
        "sweep %s %s: best trial %s (%s)", sweep.id, sweep.state, sweep.best_trial, sweep.best_value
    )
