"""CPU-seconds of a running node, and the job's `limits.max_cost`.

`UsageWatch` is a `workers.supervisor.Watcher`: every `usage_interval_s` seconds it measures
the CPU time of the node's torchrun process tree (from the worker's one look at the process
table per tick, `workers.watchers.proctable`, not one per job) and writes it to the node's
`job_nodes.cpu_seconds`; `close()` writes the last figure once torchrun exited. When the job
sets `limits.max_cost`, it then reads the job's cost so far (`core.usage.report.job_cost`:
every attempt's slot-seconds x the pool's price) and, once it reached the limit, stops the
trainer with `Stop.BUDGET` (SIGTERM: the trainer checkpoints and stops; the other nodes of a
gang follow). The stop waits for the trainer's `running` report, as `max_runtime_s` counts
from it, so that a stopped job has a checkpoint to resume from.

The tree's CPU time is, over its live processes, user + system time plus that of their
reaped children (a finished data-loader worker's time is in its parent's `children_*`), so
nothing is counted twice; a process that ended since the last sample and was reparented
away is lost, and the figure never goes down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import JobNode
from core.usage import report as usage_report
from workers.ingest import RunIngest
from workers.supervisor import Stop
from workers.watchers import proctable
from workers.watchers.proctable import ProcessTable

log = logging.getLogger(__name__)


def tree_cpu_seconds(root_pid: int, table: ProcessTable = proctable.HOST) -> float | None:
    """CPU-seconds (user + system) of the process tree under `root_pid`, its reaped
    descendants included; None when the root is gone. Read from `table`'s look at the host's
    processes, which every job of the worker shares (`workers.watchers.proctable`)."""
    return table.snapshot(root_pid).tree_cpu_s(root_pid)


class UsageWatch:
    """The usage watcher of one node of one attempt (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        session_factory: Callable[[], Session],
        root_pid: int,
        ingest: RunIngest,
        node_rank: int,
        max_cost: float | None,
    ) -> None:
        self.interval_s = settings.usage_interval_s
        self.reason: str | None = None
        self.prices = dict(settings.slot_prices)
        self.currency = settings.currency
        self.session_factory = session_factory
        self.root_pid = root_pid
        self.ingest = ingest
        self.node_rank = node_rank
        self.max_cost = max_cost
        self.cpu_seconds = 0.0
        self._stored: float | None = None  # what the row holds

    def tick(self, now: float) -> Stop | None:
        """Measure and store the CPU-seconds; `Stop.BUDGET` once the cost reached the limit.
        A database error is logged and the check waits for the next tick."""
        measured = tree_cpu_seconds(self.root_pid)
        if measured is not None:
            self.cpu_seconds = max(self.cpu_seconds, measured)
        try:
            with self.session_factory() as session:
                self._store(session)
                session.commit()
                self._stored = self.cpu_seconds
                return self._over_budget(session)
        except SQLAlchemyError as exc:
            log.warning("job %s: usage not stored: %s", self.ingest.job_id, exc)
        return None

    def _store(self, session: Session) -> None:
        """Write the figure to the node's row unless the row has it already."""
        if self._stored == self.cpu_seconds:
            return
        session.execute(
            update(JobNode)
            .where(
                JobNode.job_id == self.ingest.job_id,
                JobNode.attempt == self.ingest.attempt,
                JobNode.node_rank == self.node_rank,
            )
            .values(cpu_seconds=self.cpu_seconds)
        )

    def _over_budget(self, session: Session) -> Stop | None:
        if self.max_cost is None or not self.ingest.reported.running:
            return None
        spent = usage_report.job_cost(
            session=session, job_id=self.ingest.job_id, prices=self.prices
        )
        if spent < self.max_cost:
            return None
        self.reason = (
            f"cost {spent:.6g} {self.currency} reached limits.max_cost "
            f"{self.max_cost:g} {self.currency}"
        )
        log.info("job %s: %s", self.ingest.job_id, self.reason)
        return Stop.BUDGET

    def close(self) -> None:
        """Write the last measured CPU-seconds (torchrun has exited)."""
        try:
            with self.session_factory() as session:
                self._store(session)
                session.commit()
                self._stored = self.cpu_seconds
        except SQLAlchemyError as exc:
            log.warning("job %s: final usage not stored: %s", self.ingest.job_id, exc)
