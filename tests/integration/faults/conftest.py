"""Fault injection against real Postgres, Redis, Celery workers and torchrun: the worker
fixtures and helpers of `tests/integration/workers` are reused."""

from tests.integration.workers.conftest import dataset_id, steps_code, worker, worker_logs

__all__ = ["dataset_id", "steps_code", "worker", "worker_logs"]
