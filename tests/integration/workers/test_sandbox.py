"""A curious tenant's program, run as an entrypoint job on a real worker, probes what a job can
reach (issue 32; `workers/sandbox.py`). Each probe must fail inside the sandbox and each
succeeds on a worker without it (`TORCHYARD_SANDBOX=none`): the test of that worker shows the
probe is able to see what it looks for.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from core.platform.storage import job_run_dir
from jobspec.job import ScriptJobSpec
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.workers.archives import store_archive
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_row,
    metric_series,
    send,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
)
from workers import cgroups, sandbox

pytestmark = pytest.mark.skipif(sandbox.probe() is not None, reason=str(sandbox.probe()))

TIMEOUT_S = 120.0
WORKER_SECRET = f"postgresql://torchyard:{secrets.token_hex(8)}@db/torchyard"

# Prints what it could reach as JSON in its run dir: True where a probe got through.
PROBE_PY = r"""
import json, os, socket, sys

facts = json.loads(sys.argv[1])
reached = {}

def environ_of_others():
    mine = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if facts["secret"].encode() in text:
            return True
    return False

def readable(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False

def listable(path):
    try:
        return bool(set(os.listdir(path)) - set(facts["own"].get(path, [])))
    except OSError:
        return False

def connects(host, port):
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False

def other_processes():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"celery" in cmd:
            return True
    return False

def writes(path):
    try:
        with open(path, "w") as f:
            f.write("escaped")
        return True
    except OSError:
        return False

reached["ancestor_environ"] = environ_of_others()
reached["other_projects_file"] = readable(facts["other_file"])
reached["worker_home_file"] = readable(facts["home_file"])
reached["storage_root_listing"] = listable(facts["storage_root"])
reached["postgres"] = connects("127.0.0.1", 5432)
reached["redis"] = connects("127.0.0.1", 6379)
reached["metadata"] = connects("169.254.169.254", 80)
reached["other_processes"] = other_processes()
for name, path in facts["writes"].items():
    writes(path)
with open(os.path.join(os.environ["TORCHYARD_RUN_DIR"], "probe.json"), "w") as f:
    json.dump(reached, f)
"""


def _worker(
    settings: Settings, client: Celery, logs: Path, name: str, env: dict[str, str]
) -> Worker:
    return start_worker(
        settings=settings,
        client=client,
        queue=unique_queue(name),
        log_dir=logs,
        extra_env={"TORCHYARD_DATABASE_URL_NOTE": WORKER_SECRET, **env},
    )


@pytest.fixture(scope="module")
def sandboxed(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    w = _worker(settings, celery_client, worker_logs, "sandboxed", {"TORCHYARD_SANDBOX": "bwrap"})
    yield w
    w.stop()


@pytest.fixture(scope="module")
def unsandboxed(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    w = _worker(settings, celery_client, worker_logs, "unsandboxed", {"TORCHYARD_SANDBOX": "none"})
    yield w
    w.stop()


def _probe(
    engine: Engine,
    settings: Settings,
    client: Celery,
    worker: Worker,
    project: ProjectKey,
    tmp_path: Path,
) -> tuple[dict[str, bool], dict[str, Path]]:
    """Run the probe as project `project`'s job; (what it reached, the files it tried to write
    outside its directories)."""
    storage = settings.storage_path
    other = storage / "datasets" / f"prj_other_{secrets.token_hex(4)}" / "train.jsonl"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text('{"text": "project A\'s data"}\n')
    home_file = settings.home / f"secret-{secrets.token_hex(4)}.txt"
    home_file.write_text("the worker's own")
    tag = secrets.token_hex(4)
    escapes = {
        "storage_root": storage / f"escape-{tag}",
        "worker_home": settings.home / f"escape-{tag}",
        "source_tree": Path(sys.prefix) / f"escape-{tag}",
        "elsewhere": tmp_path / f"escape-{tag}",
    }
    facts = {
        "secret": WORKER_SECRET,
        "other_file": str(other),
        "home_file": str(home_file),
        "storage_root": str(storage),
        "own": {str(storage): ["jobs"]},
        "writes": {k: str(v) for k, v in escapes.items()},
    }
    code = store_archive(engine, settings, project, {"probe.py": PROBE_PY})
    spec = ScriptJobSpec.model_validate(
        {
            "name": "curious",
            "resources": {"procs_per_node": 1, "pool": worker.queue},
            "entrypoint": {"code": code, "command": ["python", "probe.py", json.dumps(facts)]},
        }
    )
    job_id = create_job(engine, project, spec)
    send(client, job_id, worker.queue)
    job = wait_state(engine, job_id, ("succeeded", "failed"), TIMEOUT_S, worker)
    assert job.state == "succeeded", job.failure
    reached = json.loads((job_run_dir(settings, job_id, 1) / "probe.json").read_text())
    return reached, escapes


def test_inside_the_sandbox_a_job_reaches_nothing_of_the_worker_or_another_project(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    sandboxed: Worker,
    project: ProjectKey,
    tmp_path: Path,
) -> None:
    reached, escapes = _probe(engine, settings, celery_client, sandboxed, project, tmp_path)
    assert not any(reached.values()), {k: v for k, v in reached.items() if v}
    assert not [name for name, path in escapes.items() if path.exists()]


def test_without_the_sandbox_the_same_probe_reaches_them(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    unsandboxed: Worker,
    project: ProjectKey,
    tmp_path: Path,
) -> None:
    """The probe's checks can fail: unsandboxed, it finds what the sandbox hides."""
    reached, escapes = _probe(engine, settings, celery_client, unsandboxed, project, tmp_path)
    expected = {
        "ancestor_environ",
        "other_projects_file",
        "worker_home_file",
        "storage_root_listing",
        "postgres",
        "redis",
        "other_processes",
    }
    assert {k for k, v in reached.items() if v} >= expected, reached
    written = {name for name, path in escapes.items() if path.exists()}
    for path in escapes.values():
        path.unlink(missing_ok=True)
    assert written == set(escapes), written


def test_a_host_that_cannot_sandbox_refuses_production_and_bwrap_but_runs_with_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No `bwrap` on PATH: `auto` in production and `bwrap` anywhere refuse, saying why and
    how to accept the risk; `none`, and `auto` outside production, run unsandboxed."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sandbox, "_MODE", {})
    for setting, env in (("auto", "production"), ("bwrap", "dev")):
        with pytest.raises(sandbox.SandboxUnavailable, match="TORCHYARD_SANDBOX=none"):
            sandbox.enabled(setting, env)
    assert sandbox.enabled("none", "production") is False
    assert sandbox.enabled("auto", "dev") is False


def test_a_worker_that_must_sandbox_and_cannot_refuses_to_start_and_says_why(
    settings: Settings, tmp_path: Path
) -> None:
    """`TORCHYARD_SANDBOX=bwrap` on a host without bwrap (PATH without it): the Celery worker
    exits non-zero before consuming anything, its log naming the cause and the way out."""
    env = {
        **settings_env(settings),
        "TORCHYARD_SANDBOX": "bwrap",
        "PATH": str(tmp_path),  # no bwrap here; the worker runs by its absolute path
    }
    command = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker"]
    command += ["-Q", unique_queue("refused"), "--pool", "solo", "--without-gossip"]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "cannot sandbox jobs" in done.stderr + done.stdout
    assert "TORCHYARD_SANDBOX=none" in done.stderr + done.stdout


# Grows by 32 MiB of touched pages at a time up to 3 GiB (a bound, should no limit stop it).
OVER_PY = """
import sys
import torchyard.train as ty
ty.report(1, loss=1.0)
chunks = [bytearray(32 * 2**20) for _ in range(96)]
sys.exit(3)
"""
# Reports steps until the test's `go` file appears in its run dir, then one more and ends.
NEIGHBOUR_PY = """
import os, time
import torchyard.train as ty
go = os.path.join(os.environ["TORCHYARD_RUN_DIR"], "go")
step = 0
while not os.path.exists(go):
    step += 1
    ty.report(step, loss=1.0)
    time.sleep(0.1)
ty.report(step + 1, loss=0.5)
"""


def test_a_job_over_its_memory_fails_as_oom_alone_and_its_neighbour_finishes(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
) -> None:
    """Two jobs on one worker of 2 slots, 1 GiB each (`TORCHYARD_SLOT_MEMORY_MB`): the one
    that grows past its slot is killed by the OOM killer inside its own cgroup and fails as
    `oom`; the other, running beside it all along, finishes."""
    probe = cgroups.create("probe", memory_bytes=None, cpus=None)
    if probe is None:
        pytest.skip("no writable cgroup hierarchy on this host")
    probe.remove()
    worker = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("memory"),
        log_dir=worker_logs,
        slots=2,
        extra_env={"TORCHYARD_SLOT_MEMORY_MB": "1024"},
    )
    try:
        code = store_archive(
            engine, settings, project, {"over.py": OVER_PY, "neighbour.py": NEIGHBOUR_PY}
        )

        def submit(command: list[str], name: str) -> int:
            spec = ScriptJobSpec.model_validate(
                {
                    "name": name,
                    "resources": {"procs_per_node": 1, "pool": worker.queue},
                    "entrypoint": {"code": code, "command": command},
                }
            )
            job_id = create_job(engine, project, spec)
            send(celery_client, job_id, worker.queue)
            return job_id

        neighbour = submit(["python", "neighbour.py"], "neighbour")
        wait_for(
            "the neighbour's first step",
            lambda: metric_series(engine, neighbour, "loss"),
            TIMEOUT_S,
        )
        over = submit(["python", "over.py"], "over")
        failed = wait_state(engine, over, ("succeeded", "failed"), TIMEOUT_S, worker)
        assert failed.state == "failed" and failed.failure is not None
        assert failed.failure["class"] == "oom", failed.failure
        assert job_row(engine, neighbour).state == "running"
        (job_run_dir(settings, neighbour, 1) / "go").write_text("")
        done = wait_state(engine, neighbour, ("succeeded", "failed"), TIMEOUT_S, worker)
        assert done.state == "succeeded", done.failure
    finally:
        worker.stop()


def test_get_workers_says_which_worker_sandboxes_its_jobs(
    engine: Engine,
    settings: Settings,
    sandboxed: Worker,
    unsandboxed: Worker,
    project: ProjectKey,
) -> None:
    """Each worker writes how it contains its jobs on its row at startup; `GET /v1/workers`
    (any reader) shows it beside its pool and liveness."""

    def rows() -> dict[str, Any] | None:
        with TestClient(create_app(settings)) as client:
            answer = client.get("/v1/workers", headers=project.headers)
        assert answer.status_code == 200, answer.text
        found = {w["name"]: w for w in answer.json()["items"]}
        mine = [found.get(w.name) for w in (sandboxed, unsandboxed)]
        return found if all(m and m["sandbox"] for m in mine) else None

    found = wait_for("both workers' rows", rows, 30)
    on, off = found[sandboxed.name], found[unsandboxed.name]
    assert (on["sandbox"], on["alive"], on["pool"]) == ("bwrap", True, sandboxed.queue)
    assert off["sandbox"] == "none: TORCHYARD_SANDBOX=none"


def test_the_keeper_passes_a_stop_on_and_kills_what_outlives_the_grace(tmp_path: Path) -> None:
    """The sandbox's keeper (`workers.keeper`) gets the worker's parent-death SIGTERM: a job
    that handles SIGTERM ends by itself (its status comes back); one that ignores it is
    SIGKILLed after the grace, and no process of its group is left either way."""
    mounts = sandbox.Mounts(network=False, writable=(str(tmp_path),), python=())
    started = tmp_path / "started"
    handles = f"trap 'exit 5' TERM; touch {started}; sleep 60 & wait"
    ignores = f"trap '' TERM; touch {started}; sleep 60"
    for script, code in ((handles, 5), (ignores, -9)):
        started.unlink(missing_ok=True)
        proc = sandbox.start(
            mounts,
            ["/bin/sh", "-c", script],
            env={"PATH": "/usr/bin:/bin"},
            cwd=None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            grace_s=1.0,
        )
        wait_for("the job's trap", started.exists, 30)
        proc.bwrap.send_signal(signal.SIGTERM)  # as the worker's death would
        assert proc.wait(timeout=30) == code
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pgid, 0)
