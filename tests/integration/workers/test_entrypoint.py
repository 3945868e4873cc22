"""Entrypoint jobs on a real worker (docs/CONTRACTS.md section 5): the code archive unpacked
into the run dir, the command under torchrun with an allow-listed environment, a script's own
non-zero exit and a failed `requirements` install as `user_error`, not retried.

Archives are kept through `core.jobs.code_archives.create` (the upload route's service), not HTTP.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import Checkpoint
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey
from tests.integration.workers.archives import store_archive
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    job_row,
    log_lines,
    metric_series,
    send,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
)

# Secrets in the worker's own environment that no job may see.
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": f"aws-{secrets.token_hex(8)}",
    "TORCHYARD_API_KEY": f"tyk-{secrets.token_hex(8)}",
    "OPENAI_API_KEY": f"sk-{secrets.token_hex(8)}",
    "TORCH_HUB_TOKEN": f"hub-{secrets.token_hex(8)}",
}
COMPLETED = '{"type": "status", "state": "completed", "time": 0, "attempt": 1, "data": {}}'
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def worker(
    settings: Settings, celery_client: Celery, worker_logs: Path, tmp_path_factory: Any
) -> Iterator[Worker]:
    """A worker with secrets in its environment and a venv root of its own."""
    venvs = tmp_path_factory.mktemp("venvs")
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("entrypoint"),
        log_dir=worker_logs,
        extra_env={**SECRETS, "TORCHYARD_VENV_DIR": str(venvs)},
    )
    yield w
    w.stop()


def submit(engine: Engine, client: Celery, worker: Worker, project: ProjectKey, **spec: Any) -> int:
    body = {"name": "script", "resources": {"procs_per_node": 1, "pool": worker.queue}, **spec}
    job_id = create_job(engine, project, ScriptJobSpec.model_validate(body))
    send(client, job_id, worker.queue)
    return job_id


def test_the_program_sees_its_env_and_the_platforms_but_no_worker_secret(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    dump = (
        f'env > "$TORCHYARD_RUN_DIR/env.txt"; pwd > "$TORCHYARD_RUN_DIR/pwd.txt"; '
        f"echo '{COMPLETED}' >> \"$TORCHYARD_RUN_DIR/events.jsonl\""
    )
    code = store_archive(engine, settings, project, {"run.sh": dump, "data/x.txt": "x"})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={"code": code, "command": ["bash", "run.sh"], "env": {"MY_SETTING": "on"}},
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "succeeded", job.failure
    run_dir = settings.storage_path / "jobs" / str(job_id) / "runs" / "attempt_1"
    env = dict(
        line.split("=", 1) for line in (run_dir / "env.txt").read_text().splitlines() if "=" in line
    )
    leaked = [name for name, value in SECRETS.items() if value in (run_dir / "env.txt").read_text()]
    assert leaked == []
    assert settings.database_url not in (run_dir / "env.txt").read_text()
    assert not [k for k in env if k.startswith("TORCHYARD_") and k not in PLATFORM_VARS]
    assert env["MY_SETTING"] == "on"
    assert env["TORCHYARD_PARAMS"] == "{}"
    assert env["TORCHYARD_RUN_DIR"] == str(run_dir)
    checkpoints = settings.storage_path / "jobs" / str(job_id) / "checkpoints"
    assert env["TORCHYARD_CHECKPOINT_DIR"] == str(checkpoints) and checkpoints.is_dir()
    assert env["TORCHYARD_JOB_ID"] == str(job_id) and env["TORCHYARD_ATTEMPT"] == "1"
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1"  # torchrun's
    assert (run_dir / "pwd.txt").read_text().strip() == str(run_dir / "code")
    assert (run_dir / "code" / "data" / "x.txt").read_text() == "x"


PLATFORM_VARS = {
    "TORCHYARD_JOB_ID",
    "TORCHYARD_JOB_NAME",
    "TORCHYARD_ATTEMPT",
    "TORCHYARD_RUN_DIR",
    "TORCHYARD_CHECKPOINT_DIR",
    "TORCHYARD_PARAMS",  # the spec's entrypoint.params (here none: {})
}


def test_a_script_that_exits_3_fails_as_user_error_without_restarts(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    code = store_archive(engine, settings, project, {"run.sh": "echo about to fail >&2; exit 3"})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={"code": code, "command": ["bash", "run.sh"]},
        retries={"max_restarts": 2},
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "failed"
    assert job.failure is not None and job.failure["class"] == "user_error", job.failure
    assert "about to fail" in job.failure["log_tail"]
    assert job.restarts_used == 0 and job.attempt == 1


def test_a_failed_requirements_install_fails_the_job_with_the_installers_output(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    code = store_archive(engine, settings, project, {"train.py": "print('never runs')"})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={
            "code": code,
            "command": ["python", "train.py"],
            "requirements": ["torchyard-no-such-package-zzz==1.0"],
        },
        retries={"max_restarts": 2},
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "failed"
    failure = job.failure
    assert failure is not None and failure["class"] == "user_error", failure
    assert failure["reason"].startswith("requirements: install failed")
    assert any("torchyard-no-such-package-zzz" in line for line in failure["log_tail"])
    assert job.restarts_used == 0 and job.attempt == 1
    stored = [line for line in log_lines(engine, job_id) if line.rank == -1]
    assert any("torchyard-no-such-package-zzz" in line.line for line in stored)
    assert all(line.stream == "stdout" for line in stored)
    assert job_row(engine, job_id).state == "failed"


PROBE = """
import os, sys, tomli_w
run = os.environ["TORCHYARD_RUN_DIR"]
open(os.path.join(run, "python.txt"), "w").write(sys.executable + "\\n" + tomli_w.__file__)
with open(os.path.join(run, "events.jsonl"), "a") as events:
    events.write(COMPLETED + "\\n")
"""


def test_requirements_install_into_a_venv_whose_python_runs_the_command(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    code = store_archive(engine, settings, project, {"README": "python -c runs as it is"})
    probe = f"COMPLETED = {COMPLETED!r}\n{PROBE}"
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={
            "code": code,
            "command": ["python", "-c", probe],
            "requirements": ["tomli-w>=1.0"],
        },
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "succeeded", job.failure
    run_dir = settings.storage_path / "jobs" / str(job_id) / "runs" / "attempt_1"
    python, module = (run_dir / "python.txt").read_text().splitlines()
    venv = Path(python).parent.parent
    assert venv.parent.name.startswith("venvs") and (venv / ".torchyard_ready").exists()
    assert module.startswith(str(venv))
    installer = [line.line for line in log_lines(engine, job_id) if line.rank == -1]
    assert any("tomli-w" in line for line in installer)


TRAIN_PY = """
import sys
import torchyard.train as ty
from helpers import loss_at  # the archive's own module, importable from the code dir

start = ty.latest_checkpoint()
for step in range(1, 4):
    ty.report(step, loss=loss_at(step))
path = ty.checkpoint_dir(3)
(path / "weights.txt").write_text("w")
ty.completed_checkpoint(path)
ty.log_event("done training", argv=sys.argv[1:])
"""


def _checkpoints(engine: Engine, job_id: int) -> list[Checkpoint]:
    with Session(engine) as s:
        query = select(Checkpoint).where(Checkpoint.job_id == job_id)
        return list(s.execute(query).scalars())


def test_a_python_script_runs_under_the_runner_and_reports_metrics_and_checkpoints(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    files = {"train.py": TRAIN_PY, "helpers.py": "def loss_at(step):\n    return 4.0 / step\n"}
    code = store_archive(engine, settings, project, files)
    command = ["python", "-u", "train.py", "--lr", "3e-4"]
    job_id = submit(
        engine, celery_client, worker, project, entrypoint={"code": code, "command": command}
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "succeeded", job.failure
    losses = [(p.step, p.value) for p in metric_series(engine, job_id, "loss")]
    assert losses == [(1, 4.0), (2, 2.0), (3, 4.0 / 3)]
    (checkpoint,) = _checkpoints(engine, job_id)
    ckpt_root = settings.storage_path / "jobs" / str(job_id) / "checkpoints"
    assert checkpoint.step == 3 and checkpoint.uri == str(ckpt_root / "step_00000003")
    assert (ckpt_root / "step_00000003" / "weights.txt").read_text() == "w"
    notes = [e for e in job_events(engine, job_id) if e.message == "done training"]
    assert [e.data["argv"] for e in notes] == [["--lr", "3e-4"]]


def test_a_python_exception_fails_as_user_error_with_its_traceback_not_retried(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    script = "def main():\n    raise ValueError('bad learning rate')\n\nmain()\n"
    code = store_archive(engine, settings, project, {"train.py": script})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={"code": code, "command": ["python", "train.py"]},
        retries={"max_restarts": 2},
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "failed" and job.failure is not None
    assert job.failure["class"] == "user_error", job.failure
    assert job.failure["reason"] == "ValueError: bad learning rate"
    assert job.failure["rank"] == 0
    assert any("raise ValueError" in line for line in job.failure["log_tail"])
    assert job.restarts_used == 0 and job.attempt == 1


def test_a_python_rank_killed_by_a_signal_is_infra_and_restarted(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    script = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    code = store_archive(engine, settings, project, {"train.py": script})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={"code": code, "command": ["python", "train.py"]},
        retries={"max_restarts": 1},
    )
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "failed" and job.failure is not None
    assert job.failure["class"] == "infra", job.failure
    assert job.restarts_used == 1 and job.attempt == 2


LOOP_PY = """
import time
import torchyard.train as ty

latest = ty.latest_checkpoint()
step = int(latest.name.removeprefix("step_")) if latest else 0
while True:
    step += 1
    ty.report(step, loss=1.0)
    if ty.should_stop() or step >= 5 and latest is not None:
        break
    time.sleep(0.2)
path = ty.checkpoint_dir(step)
ty.completed_checkpoint(path)
"""


def test_a_paused_script_stops_at_its_checkpoint_and_resumes_from_it(
    engine: Engine, settings: Settings, celery_client: Celery, worker: Worker, project: ProjectKey
) -> None:
    code = store_archive(engine, settings, project, {"loop.py": LOOP_PY})
    job_id = submit(
        engine,
        celery_client,
        worker,
        project,
        entrypoint={"code": code, "command": ["python", "loop.py"]},
    )
    wait_state(engine, job_id, ("running",), TIMEOUT_S, worker)
    wait_for("a first metric", lambda: metric_series(engine, job_id, "loss"), 30)
    with Session(engine) as s:
        jobs.pause(session=s, job_id=job_id)
        s.commit()
    wait_state(engine, job_id, ("paused",), 30, worker)
    (saved,) = _checkpoints(engine, job_id)
    with Session(engine) as s:
        jobs.resume(session=s, job_id=job_id)
        s.commit()
    send(celery_client, job_id, worker.queue)
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "succeeded", job.failure
    steps = sorted(c.step for c in _checkpoints(engine, job_id))
    assert steps[0] == saved.step and steps[-1] == max(5, saved.step + 1)
