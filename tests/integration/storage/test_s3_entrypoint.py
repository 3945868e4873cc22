"""An entrypoint job on S3 storage (a real S3 server, `moto`), resumed on another host.

The program never holds the storage credentials: it writes its checkpoints to a local staging
directory and the worker uploads each one it completes, recording it only once it is whole in
the bucket (`workers.entrypoint.staging`). Here host A (a worker with a home of its own) runs the
first attempt until a checkpoint is recorded, and is then SIGKILLed with its program, as a lost host
is; host B (another home: none of A's local files) takes the requeued job, downloads the newest
recorded checkpoint into its own staging directory, and the program resumes from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Checkpoint
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey, make_project
from tests.integration.s3server import S3, s3_fs, under
from tests.integration.workers.archives import STEPS_PY, store_archive
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    kill_tree,
    kill_trees,
    metric_series,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
)
from workers.entrypoint.staging import COMPLETE_MARKER, part_marker, staging_dir

pytestmark = pytest.mark.s3

STEPS = 20
EVERY = 5
KEEP_LAST = 2


def _newest_recorded(engine: Engine, job_id: int) -> int | None:
    with Session(engine) as s:
        return s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))


def _spec(code: str, pool: str) -> ScriptJobSpec:
    command = ["python", "steps.py", "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]
    return ScriptJobSpec.model_validate(
        {
            "name": "steps-on-s3",
            "entrypoint": {
                "code": code,
                "command": [*command, "--step-s", "0.4"],
                "keep_last_checkpoints": KEEP_LAST,
            },
            "resources": {"pool": pool},
            "retries": {"max_restarts": 1},
        }
    )


def test_an_entrypoint_job_uploads_its_checkpoints_and_resumes_on_another_host_from_the_bucket(
    engine: Engine,
    s3_settings: Settings,
    s3: S3,
    celery_client: Celery,
    worker_logs: Path,
    tmp_path: Path,
) -> None:
    project: ProjectKey = make_project(engine)
    code = store_archive(engine, s3_settings, project, {"steps.py": STEPS_PY})
    queue = unique_queue("s3-script")
    host_a = start_worker(
        settings=s3_settings, client=celery_client, queue=queue, log_dir=worker_logs,
        extra_env=s3.env,
    )  # fmt: skip
    job_id = submit(engine, celery_client, project, _spec(code, queue))
    try:
        wait_for(
            "a checkpoint at step >= 10 recorded (uploaded)",
            lambda: (_newest_recorded(engine, job_id) or 0) >= 2 * EVERY,
            120,
        )
    finally:
        kill_tree(host_a)
    resume_step = _newest_recorded(engine, job_id)
    assert resume_step is not None and resume_step % EVERY == 0, resume_step

    # Host B: a home of its own (its own staging directory), and beat, so its idle reconcile
    # requeues the job host A lost.
    settings_b = s3_settings.model_copy(update={"home": tmp_path / "host-b"})
    host_b = start_worker(
        settings=settings_b, client=celery_client, queue=queue, log_dir=worker_logs,
        extra_env=s3.env, beat=True,
    )  # fmt: skip
    try:
        job = wait_state(engine, job_id, TERMINAL, 180, host_b)
    finally:
        host_b.stop()
    assert job.state == "succeeded", f"{job.error}\n{host_b.log[-4000:]}"
    assert job.attempt == 2

    events = job_events(engine, job_id)
    (started,) = [
        e for e in events if e.message == "steps program started" and e.attempt == 2
    ]  # fmt: skip
    assert started.data["start_step"] == resume_step  # B read the checkpoint from the bucket
    assert (staging_dir(settings_b, job_id) / f"step_{STEPS:08d}" / "state.json").exists()
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))

    root = job_checkpoint_uri(s3_settings, job_id)
    with Session(engine) as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
    kept = [STEPS - EVERY * i for i in reversed(range(KEEP_LAST))]
    assert sorted(r.step for r in rows) == kept
    assert all(r.uri == f"{root}/step_{r.step:08d}" for r in rows)
    s3_fs().invalidate_cache()
    on_s3 = sorted(p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    assert [n for n in on_s3 if n.startswith("step_")] == [f"step_{k:08d}" for k in kept]
    for step in kept:
        names = {p.rsplit("/", 1)[1] for p in s3_fs().find(under(f"{root}/step_{step:08d}"))}
        assert names == {"state.json", COMPLETE_MARKER}
    recorded = [e for e in events if e.kind == "checkpoint"]
    assert all(e.data["uri"].startswith(root) for e in recorded)


PARTS_PY = """
import argparse
import json
import time

import torch.distributed as dist

import torchyard.train as ty

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--checkpoint-every", type=int, required=True)
parser.add_argument("--step-s", type=float, default=0.3)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
ty.set_max_steps(args.steps)
latest = ty.latest_checkpoint()
files = sorted(p.name for p in latest.glob("rank_*.json")) if latest else []
# every rank reads its own file: a node missing the other host's part would fail here
start = json.loads((latest / f"rank_{rank}.json").read_text())["step"] if latest else 0
ty.log_event("parts program started", start_step=start, files=files)
for step in range(start + 1, args.steps + 1):
    time.sleep(args.step_s)
    ty.report(step, loss=10.0 / (1 + step))
    if step % args.checkpoint_every == 0:
        path = ty.checkpoint_dir(step)
        (path / f"rank_{rank}.json").write_text(json.dumps({"step": step, "rank": rank}))
        ty.completed_checkpoint(path)  # a barrier; then node 1 declares its part
dist.destroy_process_group()
"""


def test_a_two_node_entrypoint_job_stages_a_part_per_host_and_resumes_on_two_other_hosts(
    engine: Engine,
    s3_settings: Settings,
    s3: S3,
    celery_client: Celery,
    worker_logs: Path,
    fleet: list[Worker],
    tmp_path: Path,
) -> None:
    """Each host holds only its own rank's file of each checkpoint; the bucket holds both, and
    a checkpoint is recorded only once both are in. Hosts A0 and A1 are SIGKILLed after a
    recorded checkpoint; B0 and B1 (homes of their own) each download the whole checkpoint,
    so each rank finds its own file, written on another host."""
    project: ProjectKey = make_project(engine)
    code = store_archive(engine, s3_settings, project, {"parts.py": PARTS_PY})
    queue = unique_queue("s3-parts")

    def host(name: str, beat: bool = False) -> Worker:
        settings = s3_settings.model_copy(update={"home": tmp_path / name})
        worker = start_worker(
            settings=settings, client=celery_client, queue=queue, log_dir=worker_logs,
            extra_env=s3.env, beat=beat,
        )  # fmt: skip
        fleet.append(worker)
        return worker

    hosts_a = [host("a0"), host("a1")]
    command = ["python", "parts.py", "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]
    spec = ScriptJobSpec.model_validate(
        {
            "name": "parts-on-s3",
            "entrypoint": {"code": code, "command": command, "keep_last_checkpoints": KEEP_LAST},
            "resources": {"pool": queue, "nodes": 2, "procs_per_node": 1},
            "retries": {"max_restarts": 1},
        }
    )
    job_id = submit(engine, celery_client, project, spec)
    try:
        wait_for(
            "a checkpoint at step >= 10 recorded (both parts uploaded)",
            lambda: (_newest_recorded(engine, job_id) or 0) >= 2 * EVERY,
            180,
        )
    finally:
        kill_trees(hosts_a)
    resume_step = _newest_recorded(engine, job_id)
    assert resume_step is not None and resume_step % EVERY == 0, resume_step
    root = job_checkpoint_uri(s3_settings, job_id)
    s3_fs().invalidate_cache()
    recorded = {p.rsplit("/", 1)[1] for p in s3_fs().find(under(f"{root}/step_{resume_step:08d}"))}
    assert {"rank_0.json", "rank_1.json", COMPLETE_MARKER} <= recorded

    host_b = [host("b0", beat=True), host("b1")]  # beat: its reconcile requeues the job
    job = wait_state(engine, job_id, TERMINAL, 240, host_b[0])
    assert job.state == "succeeded", (
        f"{job.error}\n{host_b[0].log[-3000:]}\n{host_b[1].log[-3000:]}"
    )
    assert job.attempt == 2

    (started,) = [
        e for e in job_events(engine, job_id)
        if e.message == "parts program started" and e.attempt == 2
    ]  # fmt: skip
    assert started.data == {"start_step": resume_step, "files": ["rank_0.json", "rank_1.json"]}
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))
    s3_fs().invalidate_cache()
    kept = [STEPS - EVERY * i for i in reversed(range(KEEP_LAST))]
    on_s3 = sorted(p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    assert [n for n in on_s3 if n.startswith("step_")] == [f"step_{k:08d}" for k in kept]
    # the part came from whichever node rank 0 was not on (c10d numbers nodes by arrival)
    markers = {part_marker(0, 2), part_marker(1, 2)}
    for step in kept:
        names = {p.rsplit("/", 1)[1] for p in s3_fs().find(under(f"{root}/step_{step:08d}"))}
        assert names - markers == {"rank_0.json", "rank_1.json", COMPLETE_MARKER}, names
        assert len(names & markers) == 1, names
    # On the hosts: node 0's own files of the last checkpoint; node 1's part only in transit.
    final = [
        staging_dir(s3_settings.model_copy(update={"home": tmp_path / home}), job_id)
        / f"step_{STEPS:08d}"
        for home in ("b0", "b1")
    ]
    assert [sorted(p.name for p in d.iterdir()) for d in final if d.exists()] == [
        [COMPLETE_MARKER, "rank_0.json"]
    ]
