"""End to end over the public surface: SDK -> real uvicorn API -> Redis -> real Celery worker
-> real torchrun (2 ranks, DDP) -> Postgres -> back over REST.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import Worker, start_worker, tiny_spec, unique_queue
from torchyard.client import Client
from torchyard.errors import NotFound


@pytest.fixture(scope="module")
def e2e_queue() -> str:
    return unique_queue("e2e")


@pytest.fixture(scope="module")
def e2e_worker(
    settings: Settings,
    celery_client: Celery,
    e2e_queue: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    worker = start_worker(
        settings=settings,
        client=celery_client,
        queue=e2e_queue,
        log_dir=tmp_path_factory.mktemp("e2e_worker"),
    )
    yield worker
    worker.stop()


def test_ddp_job_submitted_over_rest_succeeds_and_its_history_is_served(
    live_api: str,
    project: ProjectKey,
    other_project: ProjectKey,
    corpus_dir: Path,
    e2e_queue: str,
    e2e_worker: Worker,
) -> None:
    with Client(live_api, project.api_key) as client:
        dataset = client.datasets.register("corpus", str(corpus_dir))
        spec = tiny_spec(
            pool=e2e_queue,
            dataset_id=dataset.id,
            resources={"procs_per_node": 2, "pool": e2e_queue},
            train={"micro_batch_size": 4, "max_steps": 24, "log_interval_steps": 1},
        )
        job = client.jobs.create(spec.model_dump(mode="json"))
        assert job.state == "queued"

        done = client.jobs.wait(job.id, poll_s=0.2, timeout_s=240)
        assert done.state == "succeeded", (done.error, e2e_worker.log[-4000:])
        assert done.attempt == 1 and done.exit_code == 0
        assert done.current_step == 24

        (loss,) = client.jobs.metrics(job.id, names=["loss"])
        assert loss.steps == list(range(1, 25))
        assert sum(loss.values[-4:]) / 4 < sum(loss.values[:4]) / 4 - 0.3

        ranks = {line.rank for line in client.jobs.iter_logs(job.id)}
        assert {0, 1} <= ranks
        steps = [c.step for c in client.jobs.checkpoints(job.id)]
        assert steps == [20, 24]  # keep_last 2: retention removed step 10
        kinds = [e.kind for e in client.jobs.iter_events(job.id)]
        assert "sample" in kinds and "checkpoint" in kinds
        states = [e.state_to for e in client.jobs.iter_events(job.id) if e.kind == "state"]
        assert states == ["queued", "starting", "running", "succeeded"]

    # Another project's key cannot see any of it.
    with Client(live_api, other_project.api_key) as intruder:
        for call in (
            lambda: intruder.jobs.get(job.id),
            lambda: intruder.jobs.metrics(job.id),
            lambda: intruder.jobs.checkpoints(job.id),
            lambda: intruder.jobs.logs(job.id),
            lambda: intruder.jobs.events(job.id),
            lambda: intruder.jobs.cancel(job.id),
        ):
            with pytest.raises(NotFound):
                call()
        assert all(j.id != job.id for j in intruder.jobs.iter())
