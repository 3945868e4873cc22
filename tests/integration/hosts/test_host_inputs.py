"""Declared inputs on object storage (`entrypoint.inputs`, `workers.inputs`): hosts that share
only the network, Postgres, Redis and the S3 server each fetch an input into their own cache
once, with the worker's credentials (the program holds none: it reads `/inputs/corpus`), and a
host's next job reads the cached copy. Host A runs the job until a checkpoint is in the bucket
and is SIGKILLed; host B, a home of its own, started after the kill, fetches the dataset again
and resumes; B's next job with the same input reads it from B's cache."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import Checkpoint, Dataset
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey
from tests.integration.hosts.conftest import HostWorker
from tests.integration.hosts.netns import Network
from tests.integration.workers.archives import store_archive
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    TERMINAL,
    job_events,
    kill_tree,
    metric_series,
    send,
    unique_queue,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.hosts, pytest.mark.s3]

STEPS, EVERY = 24, 4
START_S = 60.0

# Reads its declared corpus, reports its size and a digest of its bytes each step, checkpoints
# (staged; the worker uploads) and resumes from its latest.
READER_PY = """
import hashlib, json, os, time
import torchyard.train as ty
corpus = ty.input_path("corpus")
data = corpus.read_bytes()
digest = int(hashlib.sha256(data).hexdigest()[:8], 16)
latest = ty.latest_checkpoint()
start = json.loads((latest / "state.json").read_text())["step"] if latest else 0
ty.log_event("reader started", start_step=start, corpus=str(corpus),
             credentials=sorted(k for k in os.environ if k.startswith("AWS_")))
ty.set_max_steps(STEPS)
for step in range(start + 1, STEPS + 1):
    time.sleep(0.3)
    ty.report(step, loss=1.0 / step, corpus_bytes=len(data), corpus_digest=digest)
    if step % EVERY == 0:
        path = ty.checkpoint_dir(step)
        (path / "state.json").write_text(json.dumps({"step": step}))
        ty.completed_checkpoint(path)
""".replace("STEPS", str(STEPS)).replace("EVERY", str(EVERY))


def _fetches(engine: Engine, job_id: int) -> list[tuple[int | None, str, str]]:
    """(attempt, cache: miss | hit, worker) of the job's input events for `corpus`."""
    return [
        (e.attempt, e.data["cache"], e.data["worker"])
        for e in job_events(engine, job_id)
        if e.data.get("input") == "corpus" and e.data.get("cache") in ("miss", "hit")
    ]


def _newest_recorded(engine: Engine, job_id: int) -> int:
    with Session(engine) as s:
        step = s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))
    return step or 0


@pytest.mark.long  # ~1.5 min
def test_each_host_fetches_an_input_once_and_its_next_job_reads_its_cache(
    engine: Engine,
    s3_settings: Settings,
    celery_client: Celery,
    network: Network,
    host_worker: HostWorker,
    api: TestClient,
    uploaded: tuple[ProjectKey, str],
    controllers: list[Controller],
    worker_logs: Path,
    corpus_dir: Path,
) -> None:
    project, dataset_id = uploaded
    with Session(engine) as s:
        dataset = s.get(Dataset, dataset_id)
        assert dataset is not None and dataset.uri.startswith("s3://")
    a, b = network.add_host(), network.add_host()
    queue = unique_queue("inputs-hosts")
    controller = start_controller(controllers, s3_settings, worker_logs)
    wait_for("the controller to lead", lambda: controller.says("controller: leading"), START_S)
    on_a = host_worker(a, queue)
    code = store_archive(engine, s3_settings, project, {"reader.py": READER_PY})

    def submit() -> int:
        spec = ScriptJobSpec.model_validate(
            {
                "name": "reads-the-bucket",
                "entrypoint": {
                    "code": code,
                    "command": ["python", "reader.py"],
                    "inputs": {"corpus": {"dataset": "corpus"}},
                },
                "resources": {"pool": queue},
                "retries": {"max_restarts": 1},
            }
        )
        answer = api.post("/v1/jobs", json=spec.model_dump(mode="json"), headers=project.headers)
        assert answer.status_code == 201, answer.text
        job: dict[str, Any] = answer.json()
        assert job["spec"]["entrypoint"]["inputs"]["corpus"]["sha256"] == dataset.sha256
        send(celery_client, job["id"], queue)  # the API's own message may be ahead of a worker
        return int(job["id"])

    first = submit()
    wait_for(
        f"a checkpoint at step >= {EVERY} in the bucket",
        lambda: _newest_recorded(engine, first) >= EVERY,
        180,
    )
    kill_tree(on_a)  # then B starts: the job cannot end on A meanwhile
    assert _newest_recorded(engine, first) < STEPS, "the job ended before the kill"
    on_b = host_worker(b, queue)
    done = wait_state(engine, first, TERMINAL, 240, on_b)
    assert done.state == "succeeded", f"{done.error}\n{on_b.log[-4000:]}"
    second = submit()
    again = wait_state(engine, second, TERMINAL, 240, on_b)
    assert again.state == "succeeded", f"{again.error}\n{on_b.log[-4000:]}"

    assert done.attempt == 2
    assert _fetches(engine, first) == [(1, "miss", on_a.name), (2, "miss", on_b.name)]
    assert _fetches(engine, second) == [(1, "hit", on_b.name)]
    # Every step of both jobs read the dataset's bytes as they were uploaded, on both hosts.
    uploaded_bytes = sorted(corpus_dir.glob("*.py"))[0].read_bytes()  # `upload_corpus`'s file
    digest = int(hashlib.sha256(uploaded_bytes).hexdigest()[:8], 16)
    for job_id in (first, second):
        sizes = {p.value for p in metric_series(engine, job_id, "corpus_bytes")}
        assert sizes == {len(uploaded_bytes)}
        assert {p.value for p in metric_series(engine, job_id, "corpus_digest")} == {digest}
        steps = [p.step for p in metric_series(engine, job_id, "loss")]
        assert steps == list(range(1, STEPS + 1))
    started = [e for e in job_events(engine, first) if e.message == "reader started"]
    assert [e.data["start_step"] for e in started] == [0, _resumed_from(engine, first)]
    assert {e.data["corpus"] for e in started} == {"/inputs/corpus"}
    assert all(e.data["credentials"] == [] for e in started), "the program holds no credential"


def _resumed_from(engine: Engine, job_id: int) -> int:
    """The step attempt 2 resumed from (its `running` event's `start_step`)."""
    (running,) = [
        e for e in job_events(engine, job_id) if e.state_to == "running" and e.attempt == 2
    ]
    step = running.data.get("start_step")
    assert isinstance(step, int) and step >= EVERY and step % EVERY == 0, running.data
    return step
