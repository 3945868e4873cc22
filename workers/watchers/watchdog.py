"""Hang detection: no step progress for the hang timeout -> every rank's Python stacks go
into the job's logs and a `hang` event, and the attempt is stopped with `Stop.HANG`.

The timeout is `limits.hang_timeout_s`, or else derived from the job's own pace:
max(`hang_timeout_floor_s`, `HANG_FACTOR` x the median time between its step reports). The
clock starts at the first step the trainer reports (`RunIngest.progress`, read from the
events file, so a database outage is no hang); setup before it (imports, data preparation,
rendezvous, the setup of ranks restarted in place) is never a hang.

Stacks: `py-spy dump --nonblocking` of each rank (torchrun's children; works on a stopped
process). Where py-spy is missing or fails, the rank gets SIGUSR1, on which the trainer's
`faulthandler` writes all its threads' stacks to its stderr, which the worker stores as that
rank's log anyway. Every rank then gets SIGCONT, so that a stopped one acts on the SIGTERM
(and torchrun's SIGKILL) that follow; a SIGKILL from the supervisor ends it regardless.

The only node that sees step progress is the one whose run dir holds `events.jsonl` (the
reporting rank's); it dumps the ranks of its own host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.jobs import upserts
from core.jobs.service import ACTIVE_STATES
from core.platform.settings import Settings
from core.platform.tables import Job
from jobspec.job import LimitsSpec
from workers.ingest import RunIngest
from workers.supervisor import Stop

log = logging.getLogger(__name__)

HANG_FACTOR = 10.0  # derived timeout: this x the median time between step reports
CHECK_INTERVAL_S = 1.0
DUMP_TIMEOUT_S = 20.0  # py-spy of all ranks together
STACKS_STREAM = "stacks"  # log_lines.stream of the dumps (the rank's own stdout/stderr aside)
MAX_EVENT_DUMP_CHARS = 8_000  # per rank, in the `hang` event's data


def hang_timeout_s(configured: float | None, median_gap_s: float | None, floor_s: float) -> float:
    """Seconds without step progress that make a hang: `configured` (`limits.hang_timeout_s`)
    when set, else max(`floor_s`, `HANG_FACTOR` x `median_gap_s`), or `floor_s` before the
    median is known (None)."""
    if configured is not None:
        return configured
    if median_gap_s is None:
        return floor_s
    return max(floor_s, HANG_FACTOR * median_gap_s)


@dataclass(frozen=True)
class RankStacks:
    """The stacks of one rank: `rank` as the job's logs number it (node offset + LOCAL_RANK),
    `global_rank` torchrun's RANK; `text` None when they went to the rank's stderr instead
    (`tool` `faulthandler`)."""

    rank: int
    global_rank: int
    pid: int
    tool: str
    text: str | None
    error: str | None = None


def py_spy() -> str | None:
    """The py-spy executable: next to this interpreter (a venv's bin), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def rank_processes(pgid: int) -> list[tuple[int, int, psutil.Process]]:
    """(LOCAL_RANK, RANK, process) of each rank of the torchrun whose pid is `pgid`: its
    children (their own children, e.g. a DCP checkpoint process, are not ranks); or `pgid`
    itself when it is a rank, started without torchrun (`workers.lone_rank`)."""
    try:
        root = psutil.Process(pgid)
        children = [root] if "LOCAL_RANK" in root.environ() else root.children()
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            env = child.environ()
            found.append((int(env["LOCAL_RANK"]), int(env["RANK"]), child))
        except (psutil.Error, KeyError, ValueError):
            continue
    return sorted(found, key=lambda x: x[0])


def dump_stacks(pgid: int, rank_offset: int, *, py_spy_path: str | None) -> list[RankStacks]:
    """Every local rank's Python stacks by `py_spy_path dump --nonblocking` (at most
    `DUMP_TIMEOUT_S` seconds for all), else by SIGUSR1 to the rank (its faulthandler writes
    them to its stderr, once it runs). Ranks are left as they were (stopped or not).
    `rank_offset`: added to LOCAL_RANK to number the ranks as the job's logs do. Never raises
    for a rank that vanished or could not be read."""
    exe = py_spy_path
    ranks = rank_processes(pgid)
    running: dict[int, subprocess.Popen[bytes]] = {}
    failed: dict[int, str] = {}
    for _, _, proc in ranks:
        if exe is None:
            failed[proc.pid] = "py-spy not found"
            continue
        command = [exe, "dump", "--nonblocking", "--pid", str(proc.pid)]
        try:
            running[proc.pid] = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            failed[proc.pid] = f"py-spy did not start: {exc}"
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    out = []
    for local_rank, rank, proc in ranks:
        text, error = None, failed.get(proc.pid)
        if (spy := running.get(proc.pid)) is not None:
            try:
                stdout, stderr = spy.communicate(timeout=max(0.1, deadline - time.monotonic()))
                if spy.returncode == 0:
                    text = stdout.decode("utf-8", "replace")
                else:
                    error = f"py-spy exited {spy.returncode}: {stderr.decode(errors='replace')}"
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.communicate()
                error = f"py-spy took over {DUMP_TIMEOUT_S:.0f} s"
        if text is None:
            _signal(proc.pid, signal.SIGUSR1)  # faulthandler: stacks to the rank's stderr
        tool = "py-spy" if text is not None else "faulthandler"
        out.append(RankStacks(rank_offset + local_rank, rank, proc.pid, tool, text, error))
    return out


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class Watchdog:
    """A `workers.supervisor.Watcher`: `Stop.HANG` once the trainer made no step progress
    for the hang timeout, after its ranks' stacks were stored. `reason` then says why, in one
    line ("no step progress for N s (last step S)"); None until then."""

    interval_s = CHECK_INTERVAL_S

    def __init__(
        self,
        *,
        settings: Settings,
        limits: LimitsSpec,
        ingest: RunIngest,
        pgid: int,
        session_factory: Callable[[], Session],
    ) -> None:
        self.floor_s = settings.hang_timeout_floor_s
        self.configured_s = limits.hang_timeout_s
        self.ingest = ingest
        self.pgid = pgid
        self.session_factory = session_factory
        self.reason: str | None = None
        self.stored = False  # the stacks and the `hang` event are in the database
        self._unstored: list[RankStacks] = []
        self._found: dict[str, float | int | None] = {}  # what the `hang` event's data says
        self._idle_s = 0.0  # seconds without progress when the hang was found

    def timeout_s(self) -> float:
        """The hang timeout now (seconds; the derived one follows the job's pace)."""
        return hang_timeout_s(self.configured_s, self.ingest.progress.median_gap_s(), self.floor_s)

    def tick(self, now: float) -> Stop | None:
        """`now`: `time.monotonic()`. Returns `Stop.HANG` once; None otherwise."""
        if self.reason is not None:
            self._store()  # a failed write is tried again while the trainer stops
            return None
        progress = self.ingest.progress
        if progress.observed_at is None or now - progress.observed_at < self.timeout_s():
            return None
        self._idle_s = idle_s = now - progress.observed_at
        self._found = {
            "timeout_s": self.timeout_s(),
            "idle_s": round(idle_s, 1),
            "step": progress.step,
        }
        self.reason = f"no step progress for {idle_s:.0f} s (last step {progress.step})"
        log.warning("job %s: %s; dumping stacks", self.ingest.job_id, self.reason)
        try:
            self._unstored = dump_stacks(self.pgid, self.ingest.rank_offset, py_spy_path=py_spy())
        except Exception:  # no stacks is no reason to leave a hung job running
            log.exception("job %s: dumping the stacks failed", self.ingest.job_id)
        for _, _, proc in rank_processes(self.pgid):
            _signal(proc.pid, signal.SIGCONT)  # a stopped rank must act on what follows
        self._store()
        return Stop.HANG

    def close(self) -> None:
        self._store()

    def _store(self) -> None:
        """The dumps as log lines of their ranks and one `hang` event, in one transaction;
        kept for the next try on a database error, dropped when the job is no longer this
        attempt's."""
        if self.reason is None or self.stored:
            return
        ingest = self.ingest
        try:
            with self.session_factory() as session:
                job = session.execute(
                    select(Job).where(Job.id == ingest.job_id)
                ).scalar_one_or_none()
                if job is not None and job.attempt == ingest.attempt and job.state in ACTIVE_STATES:
                    self._write(session, job)
                    session.commit()
            self.stored, self._unstored = True, []
        except Exception:
            log.exception("job %s: storing the stacks failed; retrying", ingest.job_id)

    def _write(self, session: Session, job: Job) -> None:
        lines: list[upserts.Log] = []
        for s in self._unstored:
            header = (
                f"--- stacks of rank {s.rank} ({s.tool}, hang after {self._idle_s:.0f} s "
                f"without progress) ---"
            )
            body = (s.text or "").splitlines()
            if s.text is None:
                body = [f"py-spy failed ({s.error}); faulthandler's stacks follow in stderr"]
            lines += [
                upserts.Log(rank=s.rank, stream=STACKS_STREAM, offset=i, line=line)
                for i, line in enumerate([header, *body])
            ]
        upserts.logs(session=session, job_id=job.id, attempt=self.ingest.attempt, lines=lines)
        data = {
            **self._found,
            "stacks": [
                {
                    "rank": s.rank,
                    "global_rank": s.global_rank,
                    "tool": s.tool,
                    "error": s.error,
                    "text": (s.text or "")[:MAX_EVENT_DUMP_CHARS],
                }
                for s in self._unstored
            ],
        }
        assert self.reason is not None
        jobs.add_event(
            session=session,
            job=job,
            kind="hang",
            message=self.reason,
            data=data,
            attempt=self.ingest.attempt,
        )


def hang_watchdog(
    settings: Settings,
    limits: LimitsSpec,
    ingest: RunIngest,
    pgid: int,
    session_factory: Callable[[], Session],
) -> Watchdog:
    """The watchdog of one supervised torchrun (the one-line factory the node code calls)."""
    return Watchdog(
        settings=settings, limits=limits, ingest=ingest, pgid=pgid, session_factory=session_factory
    )
