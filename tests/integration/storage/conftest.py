"""The storage suite (`pytest -m s3`): the S3 server's fixtures come from
tests/integration/conftest.py (`tests/integration/s3server.py`), the worker fixtures from
tests/integration/workers."""

from tests.integration.workers.conftest import worker_logs

__all__ = ["worker_logs"]
