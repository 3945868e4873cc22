"""Fixtures for worker tests: a worker per module, a registered corpus (the Celery client on
the test broker, `celery_client`, is tests/integration/conftest.py's).

Real Celery workers (subprocesses, `helpers.start_worker`) on the session's Postgres and Redis
run real torchrun and the real trainer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.jobs import service as jobs
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.archives import STEPS_PY, store_archive
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    start_worker,
    tiny_spec,
    unique_queue,
)


@pytest.fixture(scope="module")
def worker_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker_logs")


@pytest.fixture(scope="module")
def worker(
    request: pytest.FixtureRequest, settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    """One real Celery worker per test module, on a queue of its own named after the module."""
    label = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    w = start_worker(
        settings=settings, client=celery_client, queue=unique_queue(label), log_dir=worker_logs
    )
    yield w
    w.stop()


@pytest.fixture
def dataset_id(session: Session, settings: Settings, project: ProjectKey, corpus_dir: Path) -> str:
    """The session corpus registered as a dataset of `project`."""
    return datasets.register(
        session=session,
        settings=settings,
        project_id=project.project_id,
        name="corpus",
        uri=str(corpus_dir),
    ).id


@pytest.fixture
def steps_code(engine: Engine, settings: Settings, project: ProjectKey) -> str:
    """A code archive of `project` holding `steps.py` (`archives.STEPS_PY`), the light job of
    the control-plane tests (`archives.steps_spec`)."""
    return store_archive(engine, settings, project, {"steps.py": STEPS_PY})


@pytest.fixture
def claimed_job(engine: Engine, project: ProjectKey, dataset_id: str) -> int:
    """A job claimed (attempt 1, `starting`) by worker "in-process", with no trainer."""
    job_id = create_job(
        engine, project, tiny_spec(pool=unique_queue("ingest"), dataset_id=dataset_id)
    )
    with Session(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="in-process") is not None
        s.commit()
    return job_id
