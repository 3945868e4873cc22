"""Consolidated safetensors exports of checkpoints, made on request (`POST .../export`).

The API records the request (`request`), commits, and sends `workers.export_checkpoint(id)` to
the export queue (`settings.export_queue`: exports need no GPU, so they never wait behind
training on the job's pool); an exporter (`torchyard exporter`) claims the export (`claim`: a
fencing UPDATE `pending -> running`, `attempt + 1`), runs `python -m trainer.exports.safetensors`
as a
subprocess and records the outcome (`finish` / `fail`, fenced by the attempt it claimed, so
an exporter whose claim was taken over cannot overwrite the newer outcome). There is one export
per checkpoint: asking again returns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform import storage
from core.platform.errors import Conflict, NotFound
from core.platform.settings import Settings
from core.platform.tables import (
    Checkpoint,
    CheckpointExport,
    ExportState,
    Job,
    JobEvent,
    Worker,
    utcnow,
)
from core.webhooks import subscriptions as webhooks
from jobspec.job import EvalJobSpec, ScriptJobSpec, SessionJobSpec

# What `python -m trainer.exports.safetensors` writes (CONTRACTS.md, 1).
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A `running` export whose worker has not finished it after this long is taken to have lost
# its worker (killed, host gone): a new request queues it again.
STALE_AFTER_S = 3600.0
ERROR_CHARS = 4000  # the end of the exporter's stderr kept in `error`


@dataclass(frozen=True, slots=True)
class Requested:
    """What `request` did: `created` (new or queued again: 202, else 200) and `dispatch`
    (the caller sends the task after committing; a repeated message is harmless)."""

    export: CheckpointExport
    created: bool
    dispatch: bool


@dataclass(frozen=True, slots=True)
class Claimed:
    """An export a worker now owns: read `source_uri`, write `uri`, report with `attempt`."""

    id: int
    job_id: int
    step: int
    attempt: int
    source_uri: str
    uri: str


def not_exportable(job: Job) -> str | None:
    """Why `POST .../export` refuses `job`'s checkpoints (409), or None when it takes them:
    `trainer.exports.safetensors` consolidates the built-in GPT's full weights; LoRA/QLoRA runs
    write their adapter and merged model at the end of the run instead, and Hugging Face models
    are saved by `transformers`. What the API's sweep view and the CLI offer follows it."""
    spec = job.spec
    if isinstance(spec, ScriptJobSpec):
        return (
            f"job {job.id} runs its own code: its checkpoints are the script's own files "
            "(kept in the server's storage at the checkpoint's `uri`), not a built-in model to "
            "export"
        )
    if isinstance(spec, EvalJobSpec):
        return f"job {job.id} is an eval job: it writes scores, not checkpoints"
    if isinstance(spec, SessionJobSpec):
        return (
            f"job {job.id} serves a training session: its weights are LoRA adapters its client "
            "saves (`save_state`), not a built-in GPT to export"
        )
    if spec.lora is not None or spec.qlora is not None or spec.model.kind == "hf":
        return (
            f"job {job.id} is a LoRA/QLoRA or Hugging Face run: its checkpoints hold no full "
            "built-in GPT to export; a LoRA run writes its adapter and merged model at its end "
            f"(`GET /v1/jobs/{job.id}/lora`, `torchyard export-lora {job.id} --out DIR`)"
        )
    return None


def _require_full_gpt(job: Job) -> None:
    """Raises `Conflict` (409) for a job whose checkpoints are `not_exportable`."""
    why = not_exportable(job)
    if why is not None:
        raise Conflict(why)


def request(
    *, session: Session, settings: Settings, project_id: str, job_id: int, checkpoint_id: int
) -> Requested:
    """Ask for the export of checkpoint `checkpoint_id` of job `job_id`. Does not commit.

    An export already pending, running or ready is returned as it is (a stale `running` one is
    queued again); a failed one is queued again. Raises `NotFound` (404) for a job or
    checkpoint that is not of `project_id`/`job_id`, `Conflict` (409) when the checkpoint's
    files are gone (deleted by retention).
    """
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=project_id)
    _require_full_gpt(job)
    export = _find(session, job.id, checkpoint_id, lock=True)
    if export is not None and export.state != ExportState.FAILED:
        if export.state == ExportState.RUNNING and _stale(export):
            _requeue(export)
            return Requested(export=export, created=True, dispatch=True)
        return Requested(export=export, created=False, dispatch=export.state == ExportState.PENDING)
    checkpoint = session.scalar(
        select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job.id)
    )
    if checkpoint is None:
        if export is not None:  # it was recorded once: retention deleted it since
            raise Conflict(
                f"checkpoint {checkpoint_id} (step {export.step}) was deleted by retention; "
                f"its export failed: {export.error or 'unknown error'}"
            )
        raise NotFound(f"checkpoint {checkpoint_id} not found in job {job.id}")
    if not storage.checkpoint_complete(checkpoint.uri):
        raise Conflict(
            f"the files of checkpoint {checkpoint_id} (step {checkpoint.step}) no longer exist "
            "(deleted by retention)"
        )
    if export is not None:
        _requeue(export)
        return Requested(export=export, created=True, dispatch=True)
    export = CheckpointExport(
        job_id=job.id,
        checkpoint_id=checkpoint.id,
        step=checkpoint.step,
        source_uri=checkpoint.uri,
        uri=storage.job_export_uri(settings, job.id, checkpoint.step),
        state=ExportState.PENDING,
        attempt=0,
        created_at=utcnow(),
    )
    try:
        with session.begin_nested():
            session.add(export)
    except IntegrityError:  # a concurrent request made it first
        session.rollback()  # a fresh transaction sees what that request committed
        found = session.scalar(  # by the unique key alone
            select(CheckpointExport).where(CheckpointExport.checkpoint_id == checkpoint_id)
        )
        if found is None or found.job_id != job_id:  # never a 500, never another job's
            raise Conflict(
                f"another request for the export of checkpoint {checkpoint_id} is under way; "
                "ask again"
            ) from None
        return Requested(export=found, created=False, dispatch=False)
    return Requested(export=export, created=True, dispatch=True)


def get_or_raise(
    *, session: Session, project_id: str, job_id: int, checkpoint_id: int
) -> CheckpointExport:
    """The export of a checkpoint of a job of `project_id`. Raises `NotFound` (404) when the
    job is not the project's or no export of that checkpoint was asked for."""
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=project_id)
    export = _find(session, job.id, checkpoint_id)
    if export is None:
        raise NotFound(f"no export of checkpoint {checkpoint_id} of job {job.id} was requested")
    return export


def of_job(*, session: Session, job_id: int) -> dict[int, CheckpointExport]:
    """The job's exports by checkpoint id."""
    rows = session.scalars(select(CheckpointExport).where(CheckpointExport.job_id == job_id))
    return {e.checkpoint_id: e for e in rows}


def claim(*, session: Session, export_id: int, worker: str) -> Claimed | None:
    """Take a pending export (`pending -> running`, `attempt + 1`); None when it is not
    pending (done, taken, or gone). Does not commit."""
    row = session.execute(
        update(CheckpointExport)
        .where(CheckpointExport.id == export_id, CheckpointExport.state == ExportState.PENDING)
        .values(
            state=ExportState.RUNNING,
            attempt=CheckpointExport.attempt + 1,
            worker=worker,
            started_at=utcnow(),
            finished_at=None,
            error=None,
        )
        .returning(
            CheckpointExport.id,
            CheckpointExport.job_id,
            CheckpointExport.step,
            CheckpointExport.attempt,
            CheckpointExport.source_uri,
            CheckpointExport.uri,
        )
    ).first()
    return Claimed(*row) if row is not None else None


def finish(*, session: Session, claimed: Claimed, size_bytes: int, sha256: str) -> bool:
    """Mark the claimed export ready with the size (bytes) and hex sha256 of its
    `model.safetensors`; False when the claim was taken over meanwhile. Does not commit."""
    done = _end(session, claimed, ExportState.READY, size_bytes=size_bytes, sha256=sha256)
    if done:
        _event(
            session,
            claimed,
            f"export of checkpoint at step {claimed.step} ready ({size_bytes} bytes)",
            {"sha256": sha256, "size_bytes": size_bytes},
        )
        job = session.get(Job, claimed.job_id)
        assert job is not None
        payload = {
            "job": {"id": job.id, "name": job.name, "state": job.state, "pool": job.pool},
            "export_id": claimed.id,
            "step": claimed.step,
            "size_bytes": size_bytes,
            "sha256": sha256,
        }
        webhooks.emit(
            session=session, project_id=job.project_id, type="export.ready", payload=payload
        )
    return done


def fail(*, session: Session, claimed: Claimed, error: str) -> bool:
    """Mark the claimed export failed with `error` (its end kept); False when the claim was
    taken over meanwhile. Does not commit."""
    error = error[-ERROR_CHARS:]
    done = _end(session, claimed, ExportState.FAILED, error=error)
    if done:
        _event(session, claimed, f"export of checkpoint at step {claimed.step} failed", {})
    return done


def queue_position(*, session: Session, export: CheckpointExport) -> int | None:
    """A pending export's 1-based place in the export queue (every project's pending exports,
    oldest first: the order exporters take them); None unless pending."""
    if export.state != ExportState.PENDING:
        return None
    ahead = session.scalar(
        select(func.count())
        .select_from(CheckpointExport)
        .where(CheckpointExport.state == ExportState.PENDING, CheckpointExport.id < export.id)
    )
    return int(ahead or 0) + 1


NO_EXPORTER = "no exporter is running (start one: torchyard exporter)"


def exporter_missing(*, session: Session, queue: str, timeout_s: float) -> str | None:
    """Why pending exports do not start: `NO_EXPORTER` when no live exporter serves the export
    queue `queue` (no row in `workers` with that queue, not stopping, beaten within `timeout_s`
    seconds); None when one does."""
    since = utcnow() - timedelta(seconds=timeout_s)
    rows = session.execute(
        select(Worker.pool).where(Worker.heartbeat_at >= since, Worker.stopping.is_(False))
    ).scalars()
    alive = any(queue in pool.split(",") for pool in rows)
    return None if alive else NO_EXPORTER


def _find(
    session: Session, job_id: int, checkpoint_id: int, lock: bool = False
) -> CheckpointExport | None:
    query = select(CheckpointExport).where(
        CheckpointExport.job_id == job_id, CheckpointExport.checkpoint_id == checkpoint_id
    )
    return session.scalar(query.with_for_update() if lock else query)


def _stale(export: CheckpointExport) -> bool:
    started = export.started_at
    if started is None:
        return True
    if started.tzinfo is None:  # SQLite hands back naive UTC
        started = started.replace(tzinfo=utcnow().tzinfo)
    return utcnow() - started > timedelta(seconds=STALE_AFTER_S)


def _requeue(export: CheckpointExport) -> None:
    export.state = ExportState.PENDING
    export.error = None
    export.size_bytes = None
    export.sha256 = None
    export.worker = None
    export.started_at = None
    export.finished_at = None


def _end(session: Session, claimed: Claimed, state: ExportState, **values: object) -> bool:
    result = session.execute(
        update(CheckpointExport)
        .where(
            CheckpointExport.id == claimed.id,
            CheckpointExport.state == ExportState.RUNNING,
            CheckpointExport.attempt == claimed.attempt,
        )
        .values(state=state, finished_at=utcnow(), **values)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _event(session: Session, claimed: Claimed, message: str, data: dict[str, object]) -> None:
    """An `info` event on the job's timeline."""
    attempt = session.scalar(select(Job.attempt).where(Job.id == claimed.job_id)) or 0
    session.add(
        JobEvent(
            job_id=claimed.job_id,
            attempt=attempt,
            kind="info",
            message=message,
            data={
                "export_id": claimed.id,
                "step": claimed.step,
                "uri": claimed.uri,
                **data,
            },
            created_at=utcnow(),
        )
    )
