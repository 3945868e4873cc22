"""`TrialPruner`: the sweep pruner's watcher on node 0 of a trial's attempt.

Every `ingest_interval_s` it reads the trial's metric points ingested since its last look,
reports them to Optuna (`core.sweeps.prune.report`) and, when the pruner says so, moves the job
to `cancelling` with the cause `pruned` and stops the trainer (`Stop.CANCEL`: SIGTERM, the
trainer checkpoints and stops at its next step boundary; the other nodes of a gang see the job
cancelling at their next heartbeat). The decision is made as the metric arrives, not on a
controller round later, so a pruned trial trains at most one report interval past it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import Job
from core.sweeps import prune
from workers.supervisor import Stop

log = logging.getLogger(__name__)


class TrialPruner:
    """The pruning watcher of one trial's node 0 (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        session_factory: Callable[[], Session],
        job: Job,
        trial: prune.Trial,
    ) -> None:
        self.interval_s = settings.ingest_interval_s
        self.reason: str | None = None
        self.database_url = settings.database_url
        self.session_factory = session_factory
        self.job_id = job.id
        self.trial = trial
        self.last_step = -1

    def tick(self, now: float) -> Stop | None:
        with self.session_factory() as session:
            points = prune.new_points(session, self.job_id, self.trial.spec.metric, self.last_step)
            if not points:
                return None
            verdict = prune.report(self.database_url, self.trial, points)
            self.last_step = points[-1][0]
            if verdict is None or not prune.stop(session, self.job_id, self.trial, verdict):
                return None
        self.reason = jobs.pruned_reason(self.trial.sweep_id, verdict.step, verdict.rung)
        return Stop.CANCEL

    def close(self) -> None:
        pass


def pruner_for(
    settings: Settings, session_factory: Callable[[], Session], job: Job, node_rank: int
) -> list[TrialPruner]:
    """The pruning watcher when `job` is a running trial of a sweep that prunes and this is
    node 0; else none."""
    if node_rank != 0:
        return []
    try:
        with session_factory() as session:
            trial = prune.trial_of(session, job)
    except Exception:  # the run matters more than its pruning
        log.exception("job %s: could not read its sweep trial; it will not be pruned", job.id)
        return []
    if trial is None:
        return []
    return [TrialPruner(settings=settings, session_factory=session_factory, job=job, trial=trial)]
