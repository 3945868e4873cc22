"""Store what one attempt's trainer reports: events.jsonl and the per-rank logs.

One `RunIngest.flush` reads everything new (complete lines, by byte offset), writes it in one
short transaction through the keyed upserts of `core.jobs.upserts`, and only then moves the
offsets: a failed write is simply read again at the next flush.

In-place restarts (`retries.max_inplace_restarts`): torchrun gives every restart of the worker
group new per-rank files (`attempt_<restart>/<local_rank>/`), each tailed on its own; a line's
stored `offset` is `restart * RESTART_OFFSET_STRIDE + byte offset`, so the lines of every
restart are kept, each once. The restarted trainer appends to the same `events.jsonl`, which
is tailed by offset as before; its re-reported steps upsert the same metric keys.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.attempts import gang
from core.jobs import alerts, evaluations, outbox, upserts
from core.jobs import service as jobs
from core.jobs.service import ACTIVE_STATES
from core.platform.errors import Conflict
from core.platform.tables import Job, JobState
from core.submission import eval_after
from workers import observability
from workers.attempt import Dispatch
from workers.data_report import data_message
from workers.entrypoint.staging import SYNCED_KINDS, CheckpointSync
from workers.launcher import LAUNCHER_RANK, RunPaths
from workers.tail import Chunk, FileTail
from workers.watchers.pace import StepProgress, Straggler, StragglerDetector

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 16_384
MAX_METRIC_NAME_CHARS = 100  # metric_points.name is varchar(100)
RESTART_OFFSET_STRIDE = 1 << 40  # log_lines.offset of a restart's files: bytes < 1 TiB each


class JobLost(Exception):
    """The job is no longer this attempt's: reaped, re-claimed, or ended by someone else."""


@dataclass
class Reported:
    """What the trainer has said so far (only what is stored in the DB)."""

    running: bool = False
    completed: dict[str, Any] | None = None
    stopped: bool = False
    errors: list[str] = field(default_factory=list)
    num_events: int = 0
    num_log_lines: int = 0
    step: int | None = None  # the step of the last metric line stored (None before the first)


@dataclass
class _Batch:
    metrics: list[upserts.Metric] = field(default_factory=list)
    # (step, trainer time) of each metric line that stored a point: what progress and the lag
    # metric read, a tenth of the points to walk
    lines: list[tuple[int, float]] = field(default_factory=list)
    # (name, step) of the NaN/Inf values skipped, for the `nan_loss` alert (core.jobs.alerts)
    nonfinite: list[tuple[str, int]] = field(default_factory=list)
    logs: list[upserts.Log] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def empty(self) -> bool:
        """Nothing to store (a metric line of non-finite values only still counts: its alert)."""
        return not (self.metrics or self.nonfinite or self.logs or self.events)


class RunIngest:
    """Tails the files of attempt `attempt` of job `job_id` into the database."""

    def __init__(
        self,
        *,
        paths: RunPaths,
        job_id: int,
        attempt: int,
        node_rank: int = 0,
        nproc: int = 1,
        dispatch: Dispatch | None = None,
    ) -> None:
        """`node_rank`, `nproc`: this node's place in a multi-node attempt. Its local rank r is
        stored as rank `node_rank * nproc + r` and its launcher as rank `-1 - node_rank`.
        `dispatch`: sends the eval jobs a checkpoint starts (`eval_after`); without it they
        wait for the reconciler's re-send."""
        self.paths = paths
        self.dispatch = dispatch
        self.job_id = job_id
        self.attempt = attempt
        self.nproc = nproc
        self.rank_offset = node_rank * nproc
        self.launcher_rank = LAUNCHER_RANK - node_rank
        self.events = FileTail(paths.events)
        # (restart, local rank, stream); torchrun's own files (rank -1) span all restarts.
        self.logs: dict[tuple[int, int, str], FileTail] = {
            (0, LAUNCHER_RANK, s): FileTail(paths.launcher_log(s)) for s in ("stdout", "stderr")
        }
        self.reported = Reported()
        # Read from the files, not the database: a DB outage is no hang.
        self.progress = StepProgress()
        self.stragglers = StragglerDetector()
        # An entrypoint job on remote storage: its staged checkpoints are uploaded before their
        # events are stored (`workers.entrypoint.staging`); `_taken` are the offsets of the events
        # handed over, `_synced` the transferred ones not yet committed.
        self.sync = (
            None
            if paths.checkpoint_remote is None
            else CheckpointSync(
                job_id=job_id,
                staging=Path(paths.checkpoint_dir),
                remote=paths.checkpoint_remote,
                keep_last=paths.checkpoint_keep_last,
                attempt=attempt,
                node_rank=node_rank,
                nnodes=paths.checkpoint_nodes,
            )
        )
        self._taken: set[int] = set()
        self._synced: list[dict[str, Any]] = []
        observability.start_exporter()  # once per process; only with the port set

    def flush(self, session_factory: Callable[[], Session], *, final: bool = False) -> str | None:
        """Store everything new; returns the job's state, or None when nothing was new (then no
        transaction is opened: a quiet job costs the database nothing between its heartbeats,
        which carry its liveness and its state). Raises JobLost, or DB errors.

        `final`: the trainer has exited, so a last line without a newline counts too; a final
        flush always opens its transaction (it says whether the attempt is still ours).
        """
        started = time.perf_counter()
        for key, path in self.paths.rank_logs().items():
            self.logs.setdefault(key, FileTail(path))
        event_chunk = self.events.read(final=final)  # a torn last line is then skipped
        log_chunks = {key: tail.read(final=final) for key, tail in self.logs.items()}
        batch = _Batch()
        for offset, raw in event_chunk.lines:
            self._parse_event(offset, raw, batch)
        if self.sync is not None:  # finished uploads, each in the batch until committed
            self._synced += self.sync.ready(wait=final)
            batch.events += self._synced
        self._observe_progress(batch)
        for (restart, rank, stream), chunk in log_chunks.items():
            stored = self.launcher_rank if rank == LAUNCHER_RANK else self.rank_offset + rank
            base = restart * RESTART_OFFSET_STRIDE
            batch.logs += [
                upserts.Log(rank=stored, stream=stream, offset=base + offset, line=_text(raw))
                for offset, raw in chunk.lines
            ]
        if not final and batch.empty():  # lines with nothing to store are read all the same
            self._advance(event_chunk, log_chunks)
            return None
        with session_factory() as session:
            outbox.bind(session, self.dispatch)  # the eval jobs a checkpoint starts
            state = self._write(session, batch)
            session.commit()
        self._synced = []
        observability.flushed(
            points=len(batch.metrics),
            log_lines=len(batch.logs),
            events=len(batch.events),
            times=(when for _, when in batch.lines),
            started=started,
        )
        self._advance(event_chunk, log_chunks)
        self._remember(batch)
        return state

    def _advance(self, event_chunk: Chunk, log_chunks: dict[tuple[int, int, str], Chunk]) -> None:
        self.events.advance(event_chunk)
        for key, chunk in log_chunks.items():
            self.logs[key].advance(chunk)

    def stored_bytes(self) -> int:
        """How far the reading has got in all files together."""
        return sum(t.offset for t in (self.events, *self.logs.values()))

    def pending(self) -> bool:
        """Whether a file has bytes not stored yet (after a flush: more than one batch)."""
        tails: list[FileTail] = [self.events, *self.logs.values()]
        syncing = self.sync is not None and (self.sync.pending() or bool(self._synced))
        return syncing or any(_size(t) > t.offset for t in tails)

    def close(self) -> None:
        """End the checkpoint uploads' thread (an upload under way is not waited for)."""
        if self.sync is not None:
            self.sync.close()

    def _observe_progress(self, batch: _Batch) -> None:
        for event in batch.events:
            data = event.get("data")
            restart = data.get("restart") if isinstance(data, dict) else None
            if event.get("state") == "running" and isinstance(restart, int) and restart > 0:
                self.progress.restarted()
        self.progress.observe(batch.lines, time.monotonic())

    def _parse_event(self, offset: int, raw: bytes, batch: _Batch) -> None:
        try:
            event = _loads(raw)
            kind = event["type"]
            if kind == "metric":
                _parse_metric(event, batch.metrics, batch.nonfinite, batch.lines)
            elif self.sync is not None and kind in SYNCED_KINDS:
                if offset not in self._taken:  # a retried flush reads it again
                    self.sync.take(_clean(event))
                    self._taken.add(offset)
            elif kind == "checkpoint_part":  # a node's part, for a worker that stages: not here
                return
            else:
                batch.events.append(_clean(event))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            log.warning("job %s: skipping bad events.jsonl line at byte %d", self.job_id, offset)

    def _write(self, session: Session, batch: _Batch) -> str:
        job = session.execute(
            select(Job).where(Job.id == self.job_id).execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if job is None or job.attempt != self.attempt or job.state not in ACTIVE_STATES:
            raise JobLost(
                f"job {self.job_id} is {job.state if job else 'gone'} at attempt "
                f"{job.attempt if job else '?'}; this worker ran attempt {self.attempt}"
            )
        upserts.metrics(
            session=session, job_id=self.job_id, attempt=self.attempt, points=batch.metrics
        )
        alerts.on_metrics(session=session, job=job, points=batch.metrics, nonfinite=batch.nonfinite)
        upserts.logs(session=session, job_id=self.job_id, attempt=self.attempt, lines=batch.logs)
        state = job.state
        for event in batch.events:
            state = self._write_event(session, job, state, event)
        return state

    def _write_event(self, session: Session, job: Job, state: str, event: dict[str, Any]) -> str:
        kind = event.get("type")
        if kind == "checkpoint":
            step, uri = int(event["step"]), str(event["uri"])
            size = int(event.get("size_bytes") or 0)
            recorded = upserts.checkpoint(
                session=session,
                job_id=job.id,
                attempt=self.attempt,
                step=step,
                uri=uri,
                size_bytes=size,
            )
            if recorded is not None:
                data = {"step": step, "uri": uri, "size_bytes": size}
                self._add(session, job, "checkpoint", f"checkpoint at step {step}", data)
                eval_after.after_checkpoint(session=session, job=job, checkpoint=recorded)
        elif kind == "checkpoint_deleted":
            step = int(event["step"])
            if upserts.checkpoint_deleted(session=session, job_id=job.id, step=step):
                data = {"step": step, "uri": str(event.get("uri", ""))}
                self._add(session, job, "info", f"checkpoint at step {step} deleted", data)
        elif kind == "export":
            data = {k: event.get(k) for k in ("step", "format", "uri", "size_bytes")}
            message = f"exported {data['format']} at step {data['step']}"
            self._add(session, job, "info", message, data)
        elif kind == "data":
            data = {k: v for k, v in event.items() if k not in ("type", "time", "attempt")}
            self._add(session, job, "info", data_message(data), data)
        elif kind == "plan":  # a user script's `torchyard.train.set_max_steps`
            _plan(job, event.get("max_steps"))
        elif kind == "info":  # a user script's `torchyard.train.log_event`
            note = event.get("data")
            note = dict(note) if isinstance(note, dict) else {}
            self._add(session, job, "info", str(event.get("message", ""))[:2000], note)
        elif kind == "sample":  # a GRPO run's adds `samples`: completions with their rewards
            data = {k: event.get(k) for k in ("step", "prompt", "text", "samples") if k in event}
            self._add(session, job, "sample", f"sample at step {event.get('step')}", data)
        elif kind == "evaluation":
            row = evaluations.record(session=session, job=job, attempt=self.attempt, event=event)
            scores = ", ".join(f"{name} {value:.4g}" for name, value in row.metrics.items())
            data = {"evaluation": row.name, "step": row.step, "metrics": row.metrics}
            self._add(session, job, "info", f"evaluation {row.name}: {scores}", data)
        elif kind == "rank_step_times" and (report := _step_times(event)) is not None:
            for found in self.stragglers.observe(*report):
                self._straggler(session, job, found)
        elif kind == "error":
            data = {k: event.get(k) for k in ("traceback", "exit_code", "failure_class")}
            self._add(session, job, "error", str(event.get("message", "")), data)
        elif kind == "status":
            return self._write_status(session, job, state, event)
        else:
            log.warning("job %s: unknown event type %r", job.id, kind)
        return state

    def _write_status(self, session: Session, job: Job, state: str, event: dict[str, Any]) -> str:
        trainer_state = str(event.get("state"))
        data = event.get("data") or {}
        message = str(event.get("message") or f"trainer {trainer_state}")
        restart = data.get("restart") if isinstance(data, dict) else None
        if trainer_state == "running" and isinstance(restart, int) and restart > 0:
            message = f"ranks restarted in place (restart {restart}); {message}"
        if trainer_state == "running" and isinstance(data, dict):
            _plan(job, data.get("max_steps"))  # the built-in trainer's, epochs resolved
        if trainer_state == "running" and state == JobState.STARTING:
            try:
                jobs.transition(
                    session=session,
                    job_id=job.id,
                    to=JobState.RUNNING,
                    from_states=[JobState.STARTING],
                    message=message,
                    data=data,
                )
                return JobState.RUNNING
            except Conflict:  # cancel won the race: keep the report as an info event
                pass
        self._add(session, job, "info", message, {"trainer_state": trainer_state, **data})
        return state

    def _straggler(self, session: Session, job: Job, found: Straggler) -> None:
        """A `straggler` event naming the rank and its node's worker and host (node
        `rank // procs_per_node` of a gang; the job's worker otherwise)."""
        nodes = gang.members(session=session, job_id=job.id, attempt=self.attempt)
        node = nodes[min(found.rank // self.nproc, len(nodes) - 1)] if nodes else None
        worker = node.worker if node is not None else job.worker
        host = node.host if node is not None else None
        message = (
            f"straggler: rank {found.rank} on {host or worker} took {found.seconds:.3g} s per "
            f"step, {found.ratio:.1f}x the median {found.median_s:.3g} s of the other ranks, "
            f"{found.reports} reports in a row (step {found.step})"
        )
        data = {
            "rank": found.rank,
            "worker": worker,
            "host": host,
            "step": found.step,
            "seconds": found.seconds,
            "median_s": found.median_s,
        }
        self._add(session, job, "straggler", message, data)

    def _add(self, session: Session, job: Job, kind: str, message: str, data: Any) -> None:
        jobs.add_event(
            session=session, job=job, kind=kind, message=message, data=data, attempt=self.attempt
        )

    def _remember(self, batch: _Batch) -> None:
        r = self.reported
        r.num_log_lines += len(batch.logs)
        r.num_events += len(batch.events)
        if batch.metrics:
            r.step = batch.metrics[-1].step
        for event in batch.events:
            if event.get("type") == "status":
                r.running |= event.get("state") == "running"
                r.stopped |= event.get("state") == "stopped"
                if event.get("state") == "completed":
                    r.completed = dict(event.get("data") or {})
            elif event.get("type") == "error":
                r.errors.append(str(event.get("message", "")))


def _plan(job: Job, max_steps: Any) -> None:
    """The run's own count of its steps becomes the job's `max_steps` (progress, the queue's
    ETA): the spec's for a job by `train.epochs` or an entrypoint job is 0 (unknown)."""
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        job.max_steps = max_steps


def _loads(raw: bytes) -> Any:
    """A JSON line: orjson, or the standard library for what strict JSON refuses but Python's
    `json.dumps` writes (NaN, Infinity). Raises ValueError."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _parse_metric(
    event: dict[str, Any],
    out: list[upserts.Metric],
    nonfinite: list[tuple[str, int]],
    lines: list[tuple[int, float]],
) -> None:
    """Append the points of one metric line: finite numbers under names of at most
    `MAX_METRIC_NAME_CHARS` (NUL replaced); other values are skipped. The line's (step, time)
    goes to `lines` when it had a point. The hot path of ingest: no per-value recursion
    (`_clean`) here."""
    step = int(event["step"])
    if not -(2**31) <= step < 2**31:  # metric_points.step is a 32-bit integer
        raise ValueError(f"step {step} out of range")
    make = upserts.Metric._make
    when = float(event.get("time") or 0.0)
    if not math.isfinite(when):
        when = 0.0
    before = len(out)
    for name, value in (event.get("values") or {}).items():
        if type(value) is not float:
            if type(value) is not int:  # bool, None, str, ...: not a measurement
                continue
            value = float(value)
        if math.isfinite(value) and len(name) <= MAX_METRIC_NAME_CHARS:
            out.append(make((name.replace("\x00", "\ufffd"), step, value, when)))
        elif not math.isfinite(value):
            nonfinite.append((name[:MAX_METRIC_NAME_CHARS], step))
    if len(out) > before:
        lines.append((step, when))


def _step_times(event: dict[str, Any]) -> tuple[int, list[float]] | None:
    """(step, every rank's seconds) of a `rank_step_times` event; None for a malformed one
    (a non-finite time is null after `_clean`), which is skipped rather than stop the ingest."""
    step, seconds = event.get("step"), event.get("seconds")
    if not isinstance(step, int) or not isinstance(seconds, list):
        return None
    if not all(isinstance(t, int | float) for t in seconds):
        return None
    return step, [float(t) for t in seconds]


def _text(raw: bytes) -> str:
    """A storable line: valid UTF-8, no NUL (Postgres text refuses it), bounded length."""
    text = raw.decode("utf-8", "replace").replace("\x00", "\ufffd")
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + " [truncated]"


def _clean(value: Any) -> Any:
    """JSON the database takes: no NUL in strings (Postgres refuses `\\u0000`), no NaN/inf
    (JSONB has none; a non-finite metric becomes null and is skipped)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _size(tail: FileTail) -> int:
    try:
        return tail.path.stat().st_size
    except FileNotFoundError:
        return 0


def stderr_tail(paths: RunPaths, num_lines: int = 20) -> tuple[int, list[str]] | None:
    """(rank, last lines) of the stderr that best explains a failure, or None if all are empty.

    Looks at the last in-place restart of the worker group only (the one that ended the
    attempt). Prefers the lowest rank whose stderr holds a traceback, then any rank with
    output, then torchrun's own stderr (rank -1).
    """
    logs = paths.rank_logs()
    last = max((restart for restart, _, _ in logs), default=0)
    candidates: list[tuple[int, list[str]]] = []
    for (restart, rank, stream), path in logs.items():
        if stream == "stderr" and restart == last:
            candidates.append((rank, last_lines(path, num_lines)))
    launcher = (LAUNCHER_RANK, last_lines(paths.launcher_log("stderr"), num_lines))
    for rank, lines in candidates:
        if any("Traceback" in line or "Error" in line for line in lines):
            return rank, lines
    for rank, lines in [*candidates, launcher]:
        if lines:
            return rank, lines
    return None


def last_lines(path: Any, num_lines: int, max_bytes: int = 64 * 1024) -> list[str]:
    """The last `num_lines` non-blank lines within the last `max_bytes` bytes of `path`
    ([] when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return []
    lines = [_text(x) for x in data.splitlines() if x.strip()]
    return lines[-num_lines:]
