"""Watch one launched attempt until torchrun exits: ingest, heartbeat, cancel, shutdown.

The loop never lets a database error reach the trainer: a failed flush or heartbeat is logged
and tried again at the next tick (the files are the buffer). Whatever ends the loop, even an
exception, the trainer's process group is signalled and reaped before `run` returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from core.attempts.gang import Beat
from core.attempts.lifecycle_policy import Stop
from core.platform.settings import Settings
from core.platform.tables import JobState
from workers import observability
from workers.ingest import JobLost, Reported, RunIngest
from workers.isolation.sandbox import SandboxedProcess
from workers.processes import kill_tree, signal_group

log = logging.getLogger(__name__)

FINAL_DRAIN_RETRIES = 10
# The stops one node's worker decides for itself that every node of its gang follows; cancel
# and pause reach every node through the job's state anyway.
PEER_STOPS = frozenset({Stop.SHUTDOWN, Stop.MAX_RUNTIME, Stop.BUDGET})
MAX_WAIT_S = 0.2  # how quickly the loop notices torchrun's exit or a worker shutdown
# The shortest wait between two turns of the loop, unless a watcher asks for less (a session's
# relay, 1 ms while its program holds a call: `workers.watchers.session_relay`). Never less
# otherwise: with the job lost (`Stop.LOST`) the flush is not rescheduled and stays due, and
# the loop would spin.
MIN_WAIT_S = 0.01


class Watcher(Protocol):
    """Something the supervisor consults while the trainer runs (system metrics, hang
    detection): `tick(now)` every `interval_s` seconds of `time.monotonic()` (read after each
    tick, so a tick may change it), and at once when the descriptor its optional `wake_fd()`
    returns becomes readable (a session relay's wake-ups); a `Stop` it
    returns stops the trainer with that reason, and its `reason` (one line, e.g. "no step
    progress for 61 s after step 36") becomes the attempt's `Exit.stop_reason`. `close()` once,
    after torchrun exited. A watcher must not raise: the supervisor logs and ignores its errors.
    """

    interval_s: float
    reason: str | None

    def tick(self, now: float) -> Stop | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Exit:
    returncode: int
    stop: Stop | None
    reported: Reported
    drained: bool
    runtime_s: float = 0.0  # seconds the trainer trained (since its `running` report)
    stop_reason: str | None = None  # a watcher's words for the stop it asked for


class Supervisor:
    """Supervises `proc` (a torchrun started in its own process group, or the sandbox around
    one: its `pid` is torchrun's) for one attempt."""

    def __init__(
        self,
        *,
        settings: Settings,
        session_factory: Callable[[], Session],
        proc: subprocess.Popen[bytes] | SandboxedProcess,
        ingest: RunIngest,
        shutdown: threading.Event,
        heartbeat: Callable[[Session, Stop | None], Beat],
        runtime_budget_s: float | None = None,
        watchers: Sequence[Watcher] = (),
    ) -> None:
        """`heartbeat(session, stop)`: writes this node's heartbeat (and its own stop, if any)
        in the session, without committing, and returns what it learned (`core.attempts.gang.Beat`):
        the job's state (None: the attempt is no longer ours) and another node's stop, which
        stops this trainer too. `runtime_budget_s`: seconds this attempt may train (from the
        trainer's `running` report) before `limits.max_runtime_s` is reached (the limit minus
        what earlier attempts trained); None for no limit. `watchers`: see `Watcher`."""
        self.write_heartbeat = heartbeat
        self.watchers = list(watchers)
        self._watch_at = [time.monotonic()] * len(self.watchers)
        self.settings = settings
        self.session_factory = session_factory
        self.proc = proc
        self.pgid = proc.pgid if isinstance(proc, SandboxedProcess) else proc.pid
        self.ingest = ingest
        self.shutdown = shutdown
        self.stop: Stop | None = None
        self.stop_reason: str | None = None
        self._kill_at: float | None = None
        self.runtime_budget_s = runtime_budget_s
        self.training_since: float | None = None  # when the trainer reported `running`
        self.deadline: float | None = None
        self._pidfd: int | None = None

    def run(self) -> Exit:
        try:
            returncode = self._watch()
            if self.stop is None and self.shutdown.is_set() and returncode != 0:
                # The host's stop reached torchrun before this loop did: Slurm signals every
                # process of the step (`workers.slurm.agent`). The trainer took the same SIGTERM
                # (it checkpoints at the step boundary): the exit is the shutdown's, not a failure.
                self.stop = Stop.SHUTDOWN
        finally:
            for watcher in self.watchers:
                try:
                    watcher.close()
                except Exception:
                    log.exception("job %s: watcher %r failed to close", self.ingest.job_id, watcher)
            if self.proc.poll() is None:  # an exception (e.g. hard worker shutdown) got here
                self._terminate(wait=True)
            # Ranks that outlived torchrun would be orphans: the group goes with it.
            signal_group(self.pgid, signal.SIGKILL)
        returncode = self.proc.wait()
        runtime_s = 0.0 if self.training_since is None else time.monotonic() - self.training_since
        drained = self.stop is Stop.LOST or self._final_drain()
        self.ingest.close()
        return Exit(
            returncode, self.stop, self.ingest.reported, drained, runtime_s, self.stop_reason
        )

    def _watch(self) -> int:
        popen = self.proc.bwrap if isinstance(self.proc, SandboxedProcess) else self.proc
        try:  # readable once the process has ended; it is not reaped before `poll` says so
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: Popen.wait's polling
            self._pidfd = None
        try:
            return self._supervise()
        finally:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None

    def _supervise(self) -> int:
        s = self.settings
        next_flush = next_beat = time.monotonic()
        while (returncode := self.proc.poll()) is None:
            now = time.monotonic()
            if now >= next_flush and self.stop is not Stop.LOST:
                self._observe(self._flush())
                next_flush = now + s.ingest_interval_s
            if now >= next_beat and self.stop is not Stop.LOST:
                self._observe(self._heartbeat())
                next_beat = now + s.heartbeat_interval_s
            if self.shutdown.is_set() and self.stop is None:
                self._begin_stop(Stop.SHUTDOWN)
            if self.training_since is None and self.ingest.reported.running:
                self.training_since = now  # setup (imports, rendezvous, loading) is not counted
                if self.runtime_budget_s is not None:
                    self.deadline = now + self.runtime_budget_s
            if self.deadline is not None and now >= self.deadline and self.stop is None:
                log.info("job %s: limits.max_runtime_s reached", self.ingest.job_id)
                self._begin_stop(Stop.MAX_RUNTIME)
            wake_watch = self._tick_watchers(now)
            if self._kill_at is not None and now >= self._kill_at:
                log.warning("job %s: trainer ignored SIGTERM; SIGKILL", self.ingest.job_id)
                kill_tree(self.pgid)
                self._kill_at = None
            wake = min(
                next_flush,
                next_beat,
                wake_watch,
                self._kill_at or next_beat,
                self.deadline or next_beat,
            )
            floor = min([MIN_WAIT_S, *(w.interval_s for w in self.watchers)])
            self._wait_exit(max(floor, min(MAX_WAIT_S, wake - time.monotonic())))
        return returncode

    def _wait_exit(self, timeout_s: float) -> None:
        """Block until torchrun (or the sandbox's keeper) exits or `timeout_s` passes. On its
        pidfd when the kernel has them: `Popen.wait(timeout)` polls `waitpid` with sleeps of
        0.5-50 ms, ~50 wake-ups a second for each running job, a worker's CPU for nothing."""
        if self._pidfd is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
            return
        wakes = self._wake_fds()
        ready, _, _ = select.select([self._pidfd, *wakes], [], [], timeout_s)
        for fd in ready:
            if fd in wakes:  # that watcher has something to do now
                self._watch_at[wakes[fd]] = 0.0

    def _wake_fds(self) -> dict[int, int]:
        """The watchers' wake-up descriptors (`Watcher`), each to its watcher's index."""
        fds = {}
        for i, watcher in enumerate(self.watchers):
            wake_fd = getattr(watcher, "wake_fd", None)
            if wake_fd is not None and (fd := wake_fd()) is not None:
                fds[fd] = i
        return fds

    def _tick_watchers(self, now: float) -> float:
        """Tick the watchers that are due; returns when the next one is."""
        for i, watcher in enumerate(self.watchers):
            if now < self._watch_at[i]:
                continue
            try:
                stop = watcher.tick(now)
            except Exception:  # a watcher's bug must not cost the training run
                log.exception("job %s: watcher %r failed", self.ingest.job_id, watcher)
                continue
            finally:  # after the tick: a watcher may set its next interval in it
                self._watch_at[i] = now + watcher.interval_s
            if stop is not None and self.stop is None:
                self.stop_reason = watcher.reason
                self._begin_stop(stop)
        return min(self._watch_at, default=now + MAX_WAIT_S)

    def _observe(self, state: str | None) -> None:
        if state == JobState.CANCELLING and self.stop is None:
            self._begin_stop(Stop.CANCEL)
        elif state == JobState.PAUSING and self.stop is None:
            self._begin_stop(Stop.PAUSE)
        elif state == JobState.PREEMPTING and self.stop is None:
            self._begin_stop(Stop.PREEMPT)

    def _flush(self) -> str | None:
        try:
            return self.ingest.flush(self.session_factory)
        except JobLost as exc:
            log.error("%s: stopping the trainer", exc)
            self._begin_stop(Stop.LOST)
        except Exception:  # a DB outage or a bug here must not cost the training run
            log.exception("job %s: ingest failed; retrying next tick", self.ingest.job_id)
        return None

    def _heartbeat(self) -> str | None:
        """Record that this attempt is alive; returns the job's state (None on DB error)."""
        job_id, attempt = self.ingest.job_id, self.ingest.attempt
        try:
            with self.session_factory() as session:
                beat = self.write_heartbeat(session, self.stop)
                session.commit()
        except Exception:
            log.exception("job %s: heartbeat failed; retrying next tick", job_id)
            observability.heartbeat(ok=False)
            return None
        state, peer_stop = beat.state, beat.peer_stop
        observability.heartbeat(ok=state is not None)
        if state is None:
            log.error("job %s attempt %s is no longer ours: stopping the trainer", job_id, attempt)
            self._begin_stop(Stop.LOST)
        elif peer_stop in PEER_STOPS and self.stop is None:
            log.info("job %s: another node of the gang stopped (%s)", job_id, peer_stop)
            self._begin_stop(Stop(peer_stop))
        return state

    def _begin_stop(self, why: Stop) -> None:
        if self.stop is None or why is Stop.LOST:
            log.info("job %s: stopping the trainer (%s)", self.ingest.job_id, why)
            self.stop = why
            if why is Stop.LOST:
                # Fenced out: another attempt may own the job's checkpoint dir by now, so this
                # trainer must not write a stop checkpoint into it (SIGTERM would).
                kill_tree(self.pgid)
            else:
                self._terminate(wait=False)

    def _terminate(self, *, wait: bool) -> None:
        """SIGTERM the group (the trainer checkpoints and stops); SIGKILL after the grace."""
        if self._kill_at is None:
            signal_group(self.pgid, signal.SIGTERM)
            self._kill_at = time.monotonic() + self.settings.cancel_grace_s
        if wait:
            try:
                self.proc.wait(timeout=max(0.0, self._kill_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(self.pgid)
                self.proc.wait()

    def _final_drain(self) -> bool:
        """Store everything the trainer wrote, retrying DB errors with backoff."""
        delay = 0.2
        for _ in range(FINAL_DRAIN_RETRIES):
            try:
                while True:
                    before = self.ingest.stored_bytes()
                    self.ingest.flush(self.session_factory, final=True)
                    if not self.ingest.pending() or self.ingest.stored_bytes() == before:
                        return True
            except JobLost as exc:
                log.error("%s: final output not stored", exc)
                return False
            except Exception:
                log.exception("job %s: final ingest failed; retrying", self.ingest.job_id)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return False
