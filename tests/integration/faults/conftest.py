"""Fault injection against real Postgres, Redis, Celery workers and torchrun: the worker
fixtures and helpers of `tests/integration/workers` are reused."""

from tests.integration.workers.conftest import celery_client, dataset_id, worker, worker_logs

__all__ = ["celery_client", "dataset_id", "worker", "worker_logs"]
