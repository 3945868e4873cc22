"""The job state machine and job services.

Every transition is one guarded UPDATE (compare-and-set on the state the caller saw) plus an
event row, in the caller's transaction: two actors racing on a job cannot both win, and the
event log is never out of step with the row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.jobs import job_datasets, outbox
from core.platform.errors import Conflict, NotFound
from core.platform.tables import (
    TERMINAL_STATES,
    Job,
    JobEvent,
    JobState,
    SweepTrial,
    utcnow,
)
from core.webhooks import subscriptions as webhooks
from jobspec.job import AnySpec, JobSpec

S = JobState
# to-state -> the states it may be entered from
ALLOWED_FROM: dict[JobState, frozenset[JobState]] = {
    # failed | cancelled -> queued only through `retry`
    S.QUEUED: frozenset({S.STARTING, S.RESTARTING, S.PAUSED, S.FAILED, S.CANCELLED, S.PREEMPTING}),
    S.STARTING: frozenset({S.QUEUED}),
    S.RUNNING: frozenset({S.STARTING}),
    S.CANCELLING: frozenset({S.STARTING, S.RUNNING, S.PAUSING, S.PREEMPTING}),
    S.CANCELLED: frozenset({S.QUEUED, S.CANCELLING, S.PAUSED, S.RESTARTING, S.STARTING}),
    S.PAUSING: frozenset({S.STARTING, S.RUNNING, S.PREEMPTING}),
    S.PREEMPTING: frozenset({S.RUNNING}),
    S.PAUSED: frozenset({S.PAUSING, S.QUEUED}),
    S.RESTARTING: frozenset({S.STARTING, S.RUNNING}),
    S.SUCCEEDED: frozenset({S.RUNNING, S.CANCELLING, S.PAUSING, S.PREEMPTING}),
    S.PRUNED: frozenset({S.CANCELLING}),
    S.FAILED: frozenset(
        {S.QUEUED, S.STARTING, S.RUNNING, S.CANCELLING, S.PAUSING, S.RESTARTING, S.PREEMPTING}
    ),
}
# A trainer may be alive: the worker heartbeats, ingests, and acts on cancel / pause / preempt.
ACTIVE_STATES = frozenset({S.STARTING, S.RUNNING, S.CANCELLING, S.PAUSING, S.PREEMPTING})

_CAS_RETRIES = 5


def get(*, session: Session, job_id: int, project_id: str | None = None) -> Job | None:
    """The job, or None. With `project_id`, a job of another project is None too."""
    job = session.get(Job, job_id)
    if job is None or (project_id is not None and job.project_id != project_id):
        return None
    return job


def get_or_raise(*, session: Session, job_id: int, project_id: str | None = None) -> Job:
    job = get(session=session, job_id=job_id, project_id=project_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def add_event(
    *,
    session: Session,
    job: Job,
    kind: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    state_from: str | None = None,
    state_to: str | None = None,
    attempt: int | None = None,
) -> JobEvent:
    event = JobEvent(
        job_id=job.id,
        attempt=job.attempt if attempt is None else attempt,
        kind=kind,
        message=message,
        data=data or {},
        state_from=state_from,
        state_to=state_to,
        created_at=utcnow(),
    )
    session.add(event)
    _emit_webhook(session, job, event)
    return event


def _emit_webhook(session: Session, job: Job, event: JobEvent) -> None:
    """The webhook event (core.webhooks.subscriptions) of a job event, in the same transaction:
    `job.<state>` for a state change, `job.preempted`, `checkpoint.saved`; other kinds emit none."""
    if event.kind == "state" and event.state_to:
        type = f"job.{event.state_to}"
    elif event.kind == "preempted":
        type = "job.preempted"
    elif event.kind == "checkpoint":
        type = "checkpoint.saved"
    else:
        return
    payload = {
        "job": {"id": job.id, "name": job.name, "state": job.state, "pool": job.pool},
        "attempt": event.attempt,
        "state_from": event.state_from,
        "state_to": event.state_to,
        "message": event.message,
        # no server-side paths (a checkpoint's `uri`, a completed run's `checkpoint_uri`)
        "data": {k: v for k, v in (event.data or {}).items() if not _names_a_path(k)},
    }
    webhooks.emit(session=session, project_id=job.project_id, type=type, payload=payload)


def _names_a_path(key: str) -> bool:
    """Whether an event's data `key` holds a server-side path (`uri`, `checkpoint_uri`,
    `export_uri`, `lora_merged_uri`, ...: docs/CONTRACTS.md, section 1)."""
    return key == "uri" or key.endswith("_uri")


def transition(
    *,
    session: Session,
    job_id: int,
    to: JobState,
    message: str = "",
    data: dict[str, Any] | None = None,
    from_states: Iterable[JobState] | None = None,
    values: dict[str, Any] | None = None,
) -> Job:
    """Move the job to `to` if its current state allows it; record a `state` event.

    `from_states` narrows the states the caller accepts (default: all that `to` allows).
    `values` are extra columns set by the same UPDATE. Raises NotFound, or Conflict naming the
    current state when the transition is not allowed. Does not commit.
    """
    allowed = ALLOWED_FROM[to] if from_states is None else ALLOWED_FROM[to] & set(from_states)
    now = utcnow()
    for _ in range(_CAS_RETRIES):
        current = session.execute(select(Job.state).where(Job.id == job_id)).scalar_one_or_none()
        if current is None:
            raise NotFound(f"job {job_id} not found")
        if current not in allowed:
            raise Conflict(
                f"job {job_id} is {current}; cannot move to {to}",
                details=[{"loc": ["state"], "msg": f"current state is {current}", "type": current}],
            )
        extra = dict(values or {})
        if to in TERMINAL_STATES:
            extra.setdefault("finished_at", now)
        result = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.state == current)
            .values(state=to, updated_at=now, **extra)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:  # type: ignore[attr-defined]
            job = session.get(Job, job_id, populate_existing=True)
            assert job is not None
            add_event(
                session=session,
                job=job,
                kind="state",
                message=message,
                data=data,
                state_from=current,
                state_to=to,
            )
            session.flush()
            return job
    raise Conflict(f"job {job_id} changed state concurrently; try again")


def claim(*, session: Session, job_id: int, worker: str) -> Job | None:
    """Fencing claim: queued -> starting with attempt + 1, or None if another claimant won.

    A second delivery of the same task finds the job no longer queued and gets None.
    """
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state == S.QUEUED)
        .values(
            state=S.STARTING,
            attempt=Job.attempt + 1,
            worker=worker,
            heartbeat_at=now,
            updated_at=now,
            started_at=now,
            exit_code=None,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    add_event(
        session=session,
        job=job,
        kind="state",
        message=f"claimed by {worker}",
        state_from=S.QUEUED,
        state_to=S.STARTING,
        data={"worker": worker},
    )
    session.flush()
    return job


def cancel(*, session: Session, job_id: int, project_id: str | None = None) -> Job:
    """Cancel in any non-terminal state: idle states end at once, running ones go to cancelling.

    Raises NotFound, or Conflict when the job already ended. Idempotent while cancelling.
    """
    job = get_or_raise(session=session, job_id=job_id, project_id=project_id)
    if job.state in TERMINAL_STATES:
        raise Conflict(
            f"job {job_id} already {job.state}",
            details=[{"loc": ["state"], "msg": f"job is {job.state}", "type": job.state}],
        )
    if job.state == S.CANCELLING:
        return job
    if job.state in (S.STARTING, S.RUNNING, S.PAUSING, S.PREEMPTING):
        return transition(
            session=session, job_id=job_id, to=S.CANCELLING, message="cancel requested"
        )
    return transition(session=session, job_id=job_id, to=S.CANCELLED, message="cancelled")


def end_stop(
    *,
    session: Session,
    job_id: int,
    message: str = "cancelled",
    values: dict[str, Any] | None = None,
) -> Job:
    """End a `cancelling` job whose trainer has stopped: `pruned` when its sweep's pruner asked
    for the stop (its trial has a `pruned_step`: core/sweeps/prune.py), with why in `error`
    ("pruned by sweep 3 at step 20, rung 1") and the event's data naming the sweep, trial, step
    and rung; else `cancelled` with `message`. `values` as `transition`'s. Raises NotFound or
    Conflict as `transition`. Does not commit."""
    trial = session.execute(
        select(SweepTrial).where(SweepTrial.job_id == job_id, SweepTrial.pruned_step.is_not(None))
    ).scalar_one_or_none()
    if trial is None:
        return transition(
            session=session, job_id=job_id, to=S.CANCELLED, message=message, values=values
        )
    reason = pruned_reason(trial.sweep_id, trial.pruned_step, trial.pruned_rung)
    return transition(
        session=session,
        job_id=job_id,
        to=S.PRUNED,
        message=reason,
        data={
            "sweep": trial.sweep_id,
            "trial": trial.number,
            "step": trial.pruned_step,
            "rung": trial.pruned_rung,
        },
        # the failure of ranks that died of the stop itself is not why the job ended
        values={**(values or {}), "error": reason},
    )


def pruned_reason(sweep_id: int, step: int | None, rung: int | None) -> str:
    """Why a trial's job was stopped, in one line: "pruned by sweep 3 at step 20, rung 1"."""
    where = f"step {step}" + (f", rung {rung}" if rung is not None else "")
    return f"pruned by sweep {sweep_id} at {where}"


def _queued_again(**transition_args: Any) -> Job:
    """`transition` to `queued` (resume, retry), its run message in the session's outbox."""
    job = transition(**transition_args)
    outbox.add(transition_args["session"], job.id, job.pool)
    return job


def _illegal(job: Job, action: str) -> Conflict:
    return Conflict(
        f"job {job.id} is {job.state}; cannot {action} it",
        details=[{"loc": ["state"], "msg": f"current state is {job.state}", "type": job.state}],
    )


def pause(*, session: Session, job_id: int, project_id: str | None = None) -> Job:
    """Pause: a queued job leaves the queue at once; a starting, running or preempting one goes
    to `pausing` (its worker stops the trainer, which checkpoints) and then `paused`.

    Idempotent while pausing or paused; Conflict in any other state. Does not commit.
    """
    job = get_or_raise(session=session, job_id=job_id, project_id=project_id)
    if job.state in (S.PAUSING, S.PAUSED):
        return job
    if job.state in (S.STARTING, S.RUNNING, S.PREEMPTING):
        return transition(session=session, job_id=job_id, to=S.PAUSING, message="pause requested")
    if job.state == S.QUEUED:
        return transition(session=session, job_id=job_id, to=S.PAUSED, message="paused")
    raise _illegal(job, "pause")


def resume(*, session: Session, job_id: int, project_id: str | None = None) -> Job:
    """paused -> queued; the next attempt resumes from the latest complete checkpoint. Its run
    message goes after the caller's commit (`core.jobs.outbox`). Conflict unless paused.
    """
    job = get_or_raise(session=session, job_id=job_id, project_id=project_id)
    if job.state != S.PAUSED:
        raise _illegal(job, "resume")
    return _queued_again(
        session=session,
        job_id=job_id,
        to=S.QUEUED,
        from_states=[S.PAUSED],
        message="resumed",
        data={"cause": "resume"},
    )


def retry(*, session: Session, job_id: int, project_id: str | None = None) -> Job:
    """failed | cancelled -> queued, with a fresh `retries.max_restarts` budget; the next
    attempt resumes from the latest complete checkpoint. Its run message goes after the
    caller's commit (`core.jobs.outbox`). Conflict in any other state (a `pruned` trial too).
    """
    job = get_or_raise(session=session, job_id=job_id, project_id=project_id)
    if job.state not in (S.FAILED, S.CANCELLED):
        raise _illegal(job, "retry")
    return _queued_again(
        session=session,
        job_id=job_id,
        to=S.QUEUED,
        from_states=[S.FAILED, S.CANCELLED],
        message=f"retry requested after {job.state}",
        data={"cause": "retry"},
        # A fresh restart budget: the counters core.attempts.lifecycle_policy reads start again.
        values={
            "finished_at": None,
            "error": None,
            "exit_code": None,
            "failure": None,
            "restarts_used": 0,
            "restarts_by_class": {},
        },
    )


def request_hash(spec: AnySpec) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Created:
    job: Job
    created: bool


def create(
    *,
    session: Session,
    project_id: str,
    spec: AnySpec,
    idempotency_key: str | None = None,
    owner: str | None = None,
    submitted: AnySpec | None = None,
    message: str = "submitted",
    origin: str | None = None,
) -> Created:
    """Insert a queued job with its `state` event; `owner` names who submitted it (the API
    key's name). Commits; its run message goes after the commit (`add_queued`). Called by
    `core.submission.service.submit` only: the one door.

    With `idempotency_key`: the same key and spec return the first job (created=False); the
    same key with another spec raises Conflict. `submitted`: the spec as the client sent it,
    when `spec` is that spec completed by the server (a pinned `model.init_from`); the
    idempotency check compares what clients send.
    """
    digest = request_hash(submitted or spec)
    if idempotency_key is not None:
        existing = by_idempotency_key(session, project_id, idempotency_key)
        if existing is not None:
            return _replay(existing, digest, idempotency_key)
    try:
        job = add_queued(
            session=session,
            project_id=project_id,
            spec=spec,
            idempotency_key=idempotency_key,
            owner=owner,
            digest=digest,
            message=message,
            origin=origin,
        )
        session.commit()
    except IntegrityError:
        session.rollback()
        if idempotency_key is None:
            raise
        existing = by_idempotency_key(session, project_id, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, digest, idempotency_key)
    return Created(job=job, created=True)


def add_queued(
    *,
    session: Session,
    project_id: str,
    spec: AnySpec,
    idempotency_key: str | None,
    owner: str | None,
    digest: str | None = None,
    message: str = "submitted",
    origin: str | None = None,
) -> Job:
    """Insert a queued job with its `state` event in the caller's transaction (flushed, not
    committed) and its run message in the session's outbox (`core.jobs.outbox`: sent after the
    commit); `digest`: the request hash (of `spec` when None); `origin`: the door it came by
    (`core.submission.service.Door`), in the event's data. Raises `IntegrityError` when
    `idempotency_key` is taken in the project. Called through `core.submission.service.submit`
    only."""
    job = Job(
        project_id=project_id,
        name=spec.name,
        state=S.QUEUED,
        spec=spec,
        slots=spec.resources.procs_per_node,
        labels=dict(spec.labels),
        pool=spec.resources.pool,
        priority=spec.priority,
        # 0: known once the run reports it (epochs over data not read yet; a script's own)
        max_steps=(spec.train.max_steps or 0) if isinstance(spec, JobSpec) else 0,
        idempotency_key=idempotency_key,
        request_hash=digest or request_hash(spec),
        owner=owner,
        created_at=utcnow(),
        updated_at=utcnow(),
    )
    session.add(job)
    session.flush()
    job_datasets.record(session, job, spec)
    add_event(
        session=session,
        job=job,
        kind="state",
        state_to=S.QUEUED,
        message=message,
        data={"origin": origin} if origin is not None else None,
    )
    outbox.add(session, job.id, job.pool)
    return job


def by_idempotency_key(session: Session, project_id: str, key: str) -> Job | None:
    """The project's job submitted with `key`, if any."""
    return session.execute(
        select(Job).where(Job.project_id == project_id, Job.idempotency_key == key)
    ).scalar_one_or_none()


def _replay(existing: Job, digest: str, key: str) -> Created:
    if existing.request_hash != digest:
        raise Conflict(
            f"Idempotency-Key {key!r} was used for a different job spec (job {existing.id})",
            details=[{"loc": ["header", "Idempotency-Key"], "msg": "reused", "type": "conflict"}],
        )
    return Created(job=existing, created=False)
