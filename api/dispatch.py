"""Tell the workers about a new job (or export): one Celery message naming it, by task name.

The API holds only a Celery *client* built from `core.platform.queue.celery_config`, never worker
code. Postgres is the source of truth: the message is sent after the job row is committed, and if
the broker is down the job simply stays `queued` until the workers' reconciler re-dispatches it. A
broker failure therefore never fails the request.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery

from core.platform.queue import EXPORT_CHECKPOINT_TASK, RUN_JOB_TASK, celery_config
from core.platform.settings import Settings
from core.platform.tables import CheckpointExport, Job

log = logging.getLogger("torchyard.api.dispatch")

# Fail fast when the broker is unreachable: the reconciler covers a lost message.
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


class Dispatcher:
    """Sends `workers.run_job(job_id)` to the job's pool queue. The client is built lazily."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: Celery | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Celery:
        with self._lock:
            if self._client is None:
                client = Celery("torchyard-api", set_as_current=False)
                client.config_from_object(celery_config(self._settings))
                self._client = client
            return self._client

    def dispatch(self, job: Job) -> bool:
        """Send the job's message; False (logged) when the broker refused or is unreachable."""
        return self.send(job.id, job.pool)

    def send(self, job_id: int, pool: str) -> bool:
        """`dispatch` by id and pool: the `core.jobs.outbox.Dispatch` of the API's sessions."""
        return self._send(RUN_JOB_TASK, job_id, pool, f"job {job_id} stays queued")

    def dispatch_export(self, export: CheckpointExport) -> bool:
        """Send `workers.export_checkpoint(export.id)` to the export queue (`settings.
        export_queue`, served by `torchyard exporter`); False (logged) when the broker is
        unreachable (the export stays pending; asking again re-sends it)."""
        queue = self._settings.export_queue
        return self._send(
            EXPORT_CHECKPOINT_TASK, export.id, queue, f"export {export.id} stays pending"
        )

    def _send(self, task: str, item_id: int, queue: str, outcome: str) -> bool:
        try:
            self.client.send_task(
                task, args=[item_id], queue=queue, retry=True, retry_policy=_RETRY_POLICY
            )
        except Exception as exc:  # the broker's errors vary by transport; none may fail a request
            log.warning(
                "%s: could not send %s to queue %r (%s: %s)",
                outcome,
                task,
                queue,
                type(exc).__name__,
                exc,
            )
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
