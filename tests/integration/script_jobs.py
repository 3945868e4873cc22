"""Script jobs (`entrypoint`, docs/CONTRACTS.md section 5) for tests that show them: a code
archive row written straight into the database (as `POST /v1/code` would leave it, without the
archive file: nothing here unpacks it), the spec that runs it, and a run's traces (state,
metrics, logs, a checkpoint, an info event) written through the core services a worker uses."""

from __future__ import annotations

import secrets
import time
from typing import Any

from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.platform.db import session_scope
from core.platform.tables import CodeArchive, JobState, utcnow

COMMAND = ["python", "train.py", "--note", "two words", "--lr", "3e-4"]
COMMAND_LINE = "python train.py --note 'two words' --lr 3e-4"  # as a shell reads it back
ENV = {"WANDB_MODE": "offline", "GREETING": "hi there"}
REQUIREMENTS = ["numpy>=1.26"]
FILES = ["train.py", "util/data.py"]


def insert_archive(engine: Engine, project_id: str, name: str = "mnist-code") -> str:
    """A code archive of `project_id` holding `FILES`; returns its id."""
    code_id = f"code_{secrets.token_hex(8)}"
    sha256 = secrets.token_hex(32)
    with session_scope(engine) as session:
        session.add(
            CodeArchive(
                id=code_id,
                project_id=project_id,
                name=name,
                uri=f"file:///nowhere/code/{sha256}.tar.gz",
                format="tar.gz",
                sha256=sha256,
                size_bytes=2048,
                unpacked_bytes=8192,
                files=FILES,
            )
        )
    return code_id


def script_spec(code_id: str, pool: str, name: str = "mnist-script") -> dict[str, Any]:
    """A `ScriptJobSpec` document running `COMMAND` from archive `code_id` on `pool`."""
    return {
        "name": name,
        "labels": {"team": "vision"},
        "resources": {"pool": pool},
        "entrypoint": {
            "code": code_id,
            "command": COMMAND,
            "env": ENV,
            "requirements": REQUIREMENTS,
            "keep_last_checkpoints": 2,
        },
    }


def run_script_job(engine: Engine, job_id: int, steps: int = 30) -> None:
    """Make queued job `job_id` look like a running script that reported `loss` and
    `accuracy` for `steps` steps, wrote two log lines, saved a checkpoint and logged an event."""
    now = time.time()
    points = [
        p
        for step in range(1, steps + 1)
        for p in (
            upserts.Metric("loss", step, 2.0 / step, now),
            upserts.Metric("accuracy", step, 1 - 1.0 / (step + 1), now),
        )
    ]
    lines = [
        upserts.Log(rank=0, stream="stdout", offset=0, line="hello from train.py"),
        upserts.Log(rank=0, stream="stdout", offset=20, line=f"step {steps} accuracy ok"),
    ]
    with session_scope(engine) as session:
        job = jobs.claim(session=session, job_id=job_id, worker="test-worker")
        assert job is not None, "the job was not queued"
        jobs.transition(
            session=session, job_id=job_id, to=JobState.RUNNING, values={"started_at": utcnow()}
        )
        upserts.metrics(session=session, job_id=job_id, attempt=1, points=points)
        upserts.logs(session=session, job_id=job_id, attempt=1, lines=lines)
        upserts.checkpoint(
            session=session, job_id=job_id, attempt=1, step=steps,
            uri=f"file:///nowhere/ckpt/step_{steps:08d}", size_bytes=4096,
        )  # fmt: skip
        jobs.add_event(session=session, job=job, kind="info", message="the script says hi")
