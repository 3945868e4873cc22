"""The Slurm pool's submitter: places jobs with `sbatch` and follows them with `squeue`.

`python -m workers slurm --pool NAME` is a Celery worker on the pool's queue (on a login node:
it needs `sbatch`, `squeue`, `scancel`, the database and the broker; no devices). A
`workers.run_job` delivery of a job on a Slurm pool calls `place`: if the job is queued, has no
live placement and its project's quotas let it start, a `slurm_jobs` row is written (the guard
against a repeated delivery) and the job's script (`workers.slurm.batch.script`) is submitted.
The job stays `queued` until Slurm starts the allocation and its node 0 agent claims it
(`workers.slurm.agent`): quotas are checked again at that claim, as on any pool.

`Watcher` (a thread of the same process, every `SlurmPool.poll_s`) reads all live placements'
Slurm states in one `squeue --json` call and applies `follow` to each:
- pending or running: Slurm's state, reason and start estimate are written to the row (the job's
  queue reason and ETA, `core.scheduling.queue_forecast`);
- the Torchyard job no longer wants the allocation (cancelled or paused while Slurm still holds it,
  before any agent claimed it): `scancel`;
- the allocation ended: the row is closed; if the attempt its agents claimed is still active, its
  agents never recorded its end (the node failed, memory ran out, the time limit struck) and the
  attempt fails with the class Slurm's state gives (`workers.slurm.batch.end_failure`), through
  the same lifecycle as any failure; a job still queued (its agent handed it back, or never
  claimed it) is dispatched again. `MAX_UNCLAIMED` allocations in a row that end without a claim
  stop the placing: the job keeps waiting with the reason and the output file to read.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.attempts.lifecycle_apply import apply, facts_for
from core.attempts.lifecycle_policy import Failure, decide
from core.jobs.service import ACTIVE_STATES
from core.platform.settings import Settings, SlurmPool
from core.platform.tables import Job, JobState, SlurmJob, aware, utcnow
from core.scheduling import quotas
from workers.attempt import Dispatch
from workers.slurm import batch

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_UNCLAIMED = 3  # allocations in a row that ended without a claim: stop placing the job
COMMAND_TIMEOUT_S = 30.0


class SlurmUnavailable(RuntimeError):
    """`sbatch`, `squeue` or `scancel` failed (not installed, controller down): stderr in the
    message."""


def _run(argv: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise SlurmUnavailable(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def output_path(settings: Settings, job_id: int) -> Path:
    """Where the Slurm jobs of job `job_id` write their output (`%j`: the Slurm job id): under
    the submitter's home, a directory the cluster's nodes share with the login node."""
    return settings.home / "slurm" / f"job-{job_id}" / "slurm-%j.out"


def pool_of(factory: Callable[[], Session], job_id: int) -> str | None:
    """Job `job_id`'s pool (None: no such job)."""
    with factory() as session:
        return session.execute(select(Job.pool).where(Job.id == job_id)).scalar_one_or_none()


def place(
    job_id: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    submit: Callable[[str], int] | None = None,
) -> str:
    """Submit job `job_id` to its Slurm pool if it is queued and not placed yet; the outcome in
    words. `submit(script) -> Slurm job id` defaults to `sbatch --parsable`."""
    submit = submit or sbatch
    with factory() as session:
        job = session.execute(
            select(Job).where(Job.id == job_id).with_for_update()
        ).scalar_one_or_none()
        if job is None or job.state != JobState.QUEUED:
            return "not queued"
        pool = settings.slurm_pools.get(job.pool)
        if pool is None:
            return "not a slurm pool"
        if _live(session, job_id) is not None:
            return "already placed"
        unclaimed = _unclaimed_ends(session, job_id)
        if unclaimed >= MAX_UNCLAIMED:
            job.wait_reason = (
                f"slurm: {unclaimed} allocations in a row ended before their node agent claimed "
                f"the job (their output: {output_path(settings, job_id).parent}); cancel it"
            )
            session.commit()
            return "not placed: its allocations keep ending unclaimed"
        nodes = job.spec.resources.nodes
        standing = quotas.standings(session=session, pool=job.pool, project_ids=[job.project_id])
        blocked = standing[job.project_id].blocked(job.slots * nodes)
        if blocked is not None:
            job.wait_reason = blocked
            session.commit()
            return f"not placed: {blocked}"
        row = SlurmJob(job_id=job_id, pool=job.pool)
        session.add(row)
        session.commit()  # the guard: a repeated delivery finds it live
        row_id, slots = row.id, job.slots
    output = output_path(settings, job_id)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = batch.script(
            pool,
            job_id=job_id,
            nodes=nodes,
            slots=slots,
            python=sys.executable,
            workdir=str(REPO_ROOT),
            output=str(output),
        )
        slurm_job_id = submit(text)
    except (SlurmUnavailable, batch.BadPool) as exc:
        log.error("job %s: sbatch failed: %s", job_id, exc)
        _close(factory, row_id, state="SUBMIT_FAILED", reason=str(exc))
        return f"sbatch failed: {exc}"
    with factory() as session:
        placed = session.get(SlurmJob, row_id)
        assert placed is not None
        placed.slurm_job_id = slurm_job_id
        placed.state = "PENDING"
        session.commit()
    log.info("job %s: submitted as Slurm job %s", job_id, slurm_job_id)
    return f"submitted as Slurm job {slurm_job_id}"


def sbatch(text: str) -> int:
    """Submit a batch script on stdin; its Slurm job id (`sbatch --parsable`: `id[;cluster]`)."""
    out = _run(["sbatch", "--parsable"], stdin=text).strip()
    return int(out.split(";", 1)[0])


def squeue(slurm_job_ids: Iterable[int]) -> dict[int, batch.SlurmState]:
    ids = sorted(set(slurm_job_ids))
    if not ids:
        return {}
    try:
        return batch.parse_squeue(_run(batch.squeue_argv(ids)))
    except ValueError as exc:
        raise SlurmUnavailable(f"squeue --json: {exc}") from exc


def scancel(slurm_job_id: int) -> None:
    _run(["scancel", str(slurm_job_id)])


def _live(session: Session, job_id: int) -> SlurmJob | None:
    return session.execute(
        select(SlurmJob).where(SlurmJob.job_id == job_id, SlurmJob.ended_at.is_(None))
    ).scalar_one_or_none()


def _unclaimed_ends(session: Session, job_id: int) -> int:
    """How many of the job's latest allocations ended without a claim, in a row (a failed
    `sbatch` is no allocation: Slurm's controller briefly down must not stop the placing)."""
    rows = session.execute(
        select(SlurmJob.claimed)
        .where(
            SlurmJob.job_id == job_id,
            SlurmJob.ended_at.is_not(None),
            SlurmJob.slurm_job_id.is_not(None),
        )
        .order_by(SlurmJob.id.desc())
        .limit(MAX_UNCLAIMED)
    ).scalars()
    count = 0
    for claimed in rows:
        if claimed:
            break
        count += 1
    return count


def _close(factory: Callable[[], Session], row_id: int, *, state: str, reason: str) -> None:
    with factory() as session:
        row = session.get(SlurmJob, row_id)
        if row is not None and row.ended_at is None:
            row.state, row.reason, row.ended_at = state, reason, utcnow()
            session.commit()


def agent_worker(slurm_job_id: int, restart: int, host: str) -> str:
    """The worker name the node agents of run `restart` (Slurm's `SLURM_RESTART_COUNT`: 0, then
    one more per requeue) of Slurm job `slurm_job_id` record (`jobs.worker`)."""
    return f"slurm-{slurm_job_id}.{restart}@{host}"


def claimed_run(job: Job, slurm_job_id: int) -> int | None:
    """Which run of Slurm job `slurm_job_id` claimed the job's attempt (None: none of its)."""
    name, _, _ = (job.worker or "").partition("@")
    prefix = f"slurm-{slurm_job_id}."
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    return int(name[len(prefix) :])


def follow(
    *,
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    pools: Iterable[str],
    query: Callable[[Iterable[int]], dict[int, batch.SlurmState]] = squeue,
    cancel: Callable[[int], None] = scancel,
) -> None:
    """One round of the watcher over the live placements of `pools` (module docstring)."""
    with factory() as session:
        live = list(
            session.execute(
                select(SlurmJob.id, SlurmJob.job_id, SlurmJob.slurm_job_id).where(
                    SlurmJob.pool.in_(list(pools)),
                    SlurmJob.ended_at.is_(None),
                    SlurmJob.slurm_job_id.is_not(None),
                )
            ).all()
        )
    if not live:
        return
    states = query([row.slurm_job_id for row in live])
    for row in live:
        state = states.get(row.slurm_job_id)
        try:
            _follow_one(settings, factory, dispatch, row.id, state, cancel)
        except Exception:  # one placement must not stop the others; tried again next round
            log.exception("job %s: following Slurm job %s failed", row.job_id, row.slurm_job_id)


def _follow_one(
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    row_id: int,
    state: batch.SlurmState | None,
    cancel: Callable[[int], None],
) -> None:
    send: tuple[int, str] | None = None
    with factory() as session:
        row = session.get(SlurmJob, row_id)
        if row is None or row.ended_at is not None or row.slurm_job_id is None:
            return
        job = session.execute(
            select(Job).where(Job.id == row.job_id).with_for_update()
        ).scalar_one_or_none()
        slurm_id = row.slurm_job_id
        if state is None:  # aged out of squeue (MinJobAge): over, its end unknown
            state = batch.SlurmState(slurm_id, "UNKNOWN", None, None, None, None, 0, "")
            ended = True
        else:
            ended = state.ended
        row.state, row.reason = state.state, state.reason
        row.start_at = state.start_at
        run = claimed_run(job, slurm_id) if job is not None else None
        if run is not None:
            row.claimed = True
        ours = run is not None and job is not None and job.state in ACTIVE_STATES
        # Requeued since the run that holds the attempt claimed it (a later run's claim is newer
        # than this squeue answer: its run number says so).
        requeued = run is not None and state.restarts > run and state.state in batch.REQUEUED
        if ours and not ended and requeued:
            assert job is not None
            send = _fail(session, job, batch.requeued_failure(state, host=_host(job)), state)
            session.commit()
        elif not ended:
            wanted = ours or (job is not None and job.state == JobState.QUEUED)
            # A claimed allocation still running winds down by itself once its agents recorded
            # the end (scancel would turn its COMPLETED into CANCELLED); a pending one would run.
            if not wanted and (not row.claimed or state.state in batch.REQUEUED):
                session.commit()
                log.info("job %s: no longer wants Slurm job %s; scancel", row.job_id, slurm_id)
                cancel(slurm_id)
                return
            session.commit()
            return
        else:
            row.ended_at, row.exit_code = utcnow(), state.exit_code
            if ours:
                assert job is not None
                send = _fail(session, job, batch.end_failure(state, host=_host(job)), state)
            elif job is not None and job.state == JobState.QUEUED:
                send = (job.id, job.pool)  # handed back, or never claimed: place it again
            session.commit()
    if send is not None:
        try:
            dispatch(*send)
        except Exception:  # still queued in the DB: the reconciler sends it again
            log.exception("job %s: dispatch to %r failed", *send)


def _host(job: Job) -> str | None:
    return (job.worker or "").split("@", 1)[-1] or None


def _fail(
    session: Session, job: Job, failure: Failure, state: batch.SlurmState
) -> tuple[int, str] | None:
    """End the job's active attempt with `failure` through the lifecycle (its retry policy);
    (job id, pool) when it goes back to the queue. Does not commit."""
    decision = decide(facts_for(job, lost=failure))
    log.warning("job %s attempt %s: %s -> %s", job.id, job.attempt, failure.reason,
                decision.outcome)  # fmt: skip
    started = aware(job.started_at) if job.started_at else utcnow()
    runtime = max(0.0, ((state.end_at or utcnow()) - started).total_seconds())
    pool = apply(session=session, job=job, decision=decision, runtime_s=runtime)
    return (job.id, pool) if pool is not None else None


class Watcher:
    """The daemon thread that runs `follow` every `poll_s` seconds (the pools' smallest)."""

    def __init__(
        self,
        *,
        settings: Settings,
        factory: Callable[[], Session],
        dispatch: Dispatch,
        pools: dict[str, SlurmPool],
    ) -> None:
        self._args = {"settings": settings, "factory": factory, "dispatch": dispatch}
        self._pools = sorted(pools)
        self._interval_s = min(p.poll_s for p in pools.values())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        log.info("following Slurm pools %s every %g s", self._pools, self._interval_s)
        while not self._stop.wait(self._interval_s):
            try:
                follow(pools=self._pools, **self._args)  # type: ignore[arg-type]
            except Exception:  # Slurm or the database unreachable: try again next round
                log.exception("following the Slurm pools failed")


def slurm_pools_served(settings: Settings, queues: Iterable[str]) -> dict[str, SlurmPool]:
    """The Slurm pools among the queues this process consumes."""
    return {q: settings.slurm_pools[q] for q in queues if q in settings.slurm_pools}


def submitter_env_ok() -> str | None:
    """Why this host cannot submit (no `sbatch` on PATH), or None."""
    for tool in ("sbatch", "squeue", "scancel"):
        if shutil.which(tool) is None:
            return f"{tool} not on PATH"
    return None
