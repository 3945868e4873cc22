"""Restart the broker (a Redis without persistence) while jobs wait in its queue: the messages
are gone, the reconciler re-sends from Postgres, and every job runs exactly once.

The jobs are `STEPS_PY` programs (the broker's messages are the subject, not training); the busy
job's last step waits for a gate, so the worker is still busy while the broker restarts."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine

from core.platform.db import session_factory
from core.platform.queue import celery_config
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.archives import open_gate, steps_spec
from tests.integration.workers.helpers import (
    create_job,
    job_events,
    launches,
    send,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
)
from workers.launcher import free_port
from workers.reconcile import reconcile


@dataclass
class RedisServer:
    """A redis-server of this test's own (never the shared one), without any persistence."""

    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.folder)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(f"redis-server on port {self.port}", answers, 20)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def queue_length(self, queue: str) -> int:
        client = redis.Redis.from_url(self.url)
        try:
            return int(client.llen(queue))
        finally:
            client.close()


pytestmark = pytest.mark.long  # restarts a Redis server: ~1.5 min


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), folder=tmp_path)
    server.start()
    yield server
    server.stop()


def test_jobs_queued_when_the_broker_restarts_each_run_exactly_once(
    engine: Engine,
    settings: Settings,
    worker_logs: Path,
    project: ProjectKey,
    steps_code: str,
    private_redis: RedisServer,
) -> None:
    broker = settings.model_copy(update={"broker_url": private_redis.url})
    client = Celery("torchyard-tests-private-redis")
    client.conf.update(celery_config(broker))
    queue = unique_queue("redis")
    worker = start_worker(settings=broker, client=client, queue=queue, log_dir=worker_logs)
    try:
        busy = create_job(engine, project, steps_spec(steps_code, pool=queue, steps=8, gate="go"))
        send(client, busy, queue)
        wait_state(engine, busy, ("running",), 60, worker)
        short = steps_spec(steps_code, pool=queue, steps=2)
        waiting = [create_job(engine, project, short) for _ in range(2)]
        for job_id in waiting:
            send(client, job_id, queue)
        assert private_redis.queue_length(queue) == len(waiting)

        private_redis.stop()
        private_redis.start()
        assert private_redis.queue_length(queue) == 0  # the messages are gone

        report = reconcile(
            settings=broker,
            session_factory=session_factory(engine),
            dispatch=lambda jid, q: send(client, jid, q),
            redispatch_after_s=0,
            pools=[queue],
        )
        assert sorted(report.redispatched) == waiting
        open_gate(settings, busy, "go")
        for job_id in [busy, *waiting]:
            job = wait_state(engine, job_id, ("succeeded", "failed", "cancelled"), 120, worker)
            assert job.state == "succeeded", job.error
            assert job.attempt == 1
            assert len(launches(job_events(engine, job_id))) == 1  # exactly one trainer
    finally:
        worker.stop()
        client.close()
