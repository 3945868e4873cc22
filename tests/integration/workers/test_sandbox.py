"""A curious tenant's program, run as an entrypoint job on a real worker, probes what a job can
reach (issue 32; `workers/isolation/sandbox.py`). Each probe must fail inside the sandbox and each
succeeds on a worker without it (`TORCHYARD_SANDBOX=none`): the test of that worker shows the
probe is able to see what it looks for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from core.platform.storage import job_run_dir
from jobspec.job import ScriptJobSpec
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.workers.archives import OVER_PY, store_archive
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
from tests.integration.workers.probe import WORKER_SECRET, run_probe
from workers.isolation import cgroups, sandbox

pytestmark = pytest.mark.skipif(sandbox.probe() is not None, reason=str(sandbox.probe()))

TIMEOUT_S = 120.0


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


def test_inside_the_sandbox_a_job_reaches_nothing_of_the_worker_or_another_project(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    sandboxed: Worker,
    project: ProjectKey,
    tmp_path: Path,
    dataset_id: str,
    corpus_dir: Path,
) -> None:
    """The probe declares a dataset of its project as an input (`entrypoint.inputs`): it reads
    that, read-only, and still nothing else."""
    reached, escapes = run_probe(
        engine, settings, celery_client, sandboxed, project, tmp_path,
        declared=(dataset_id, corpus_dir),
    )  # fmt: skip
    assert reached.pop("declared_input") is True
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
    reached, escapes = run_probe(engine, settings, celery_client, unsandboxed, project, tmp_path)
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


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    """A TCP listener on loopback: what a job that keeps the network does reach."""
    import socket

    server = socket.create_server(("127.0.0.1", 0), backlog=16)
    yield ("127.0.0.1", server.getsockname()[1])
    server.close()


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_a_job_that_keeps_the_network_cannot_reach_the_control_plane(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    fleet: list[Worker],
    project: ProjectKey,
    tmp_path: Path,
    listener: tuple[str, int],
    fenced: bool,
) -> None:
    """A 2-node gang keeps the host's network (its ranks meet over it), so the sandbox's
    `--unshare-net` cannot fence it: the worker's nftables rules on the jobs' cgroups do
    (`workers.isolation.netfence`). Fenced, the probe reaches its own listener but not Postgres,
    Redis or the metadata address; on a worker that cannot fence (no `nft` on its PATH), the same
    probe reaches Postgres and Redis, so the checks can fail."""
    if fenced and os.geteuid() != 0:
        pytest.skip("installing nftables rules needs root")
    path = os.environ["PATH"] if fenced else "/usr/local/bin:/usr/bin:/bin"  # no /usr/sbin/nft
    worker = start_worker(
        settings=settings, client=celery_client, queue=unique_queue("netfence"),
        log_dir=worker_logs, slots=2,
        extra_env={"TORCHYARD_DATABASE_URL_NOTE": WORKER_SECRET, "TORCHYARD_SANDBOX": "bwrap",
                   "PATH": path},
    )  # fmt: skip
    fleet.append(worker)

    def row() -> dict[str, Any] | None:
        with TestClient(create_app(settings)) as client:
            items = client.get("/v1/workers", headers=project.headers).json()["items"]
        return next((w for w in items if w["name"] == worker.name and w["sandbox"]), None)

    described = wait_for("the worker's row", row, 30)["sandbox"]
    reached, _ = run_probe(
        engine, settings, celery_client, worker, project, tmp_path, nodes=2, listener=listener,
        metadata=fenced,  # unfenced, a connection to 169.254.169.254 would leave this host
    )  # fmt: skip
    assert reached["own_listener"], reached  # the job has the network
    control_plane = {k: reached.get(k, False) for k in ("postgres", "redis", "metadata")}
    if fenced:
        assert described == "bwrap, network fenced", described
        assert not any(control_plane.values()), control_plane
        assert not any(v for k, v in reached.items() if k != "own_listener"), reached
    else:
        assert described.startswith("bwrap, network not fenced: nft not installed"), described
        assert control_plane["postgres"] and control_plane["redis"], control_plane


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
    assert (on["alive"], on["pool"]) == (True, sandboxed.queue)
    assert on["sandbox"] in (
        "bwrap, network fenced",
        "bwrap, network not fenced: nft not installed (Debian: nftables)",
    )
    assert off["sandbox"] == "none: TORCHYARD_SANDBOX=none"


def test_the_keeper_passes_a_stop_on_and_kills_what_outlives_the_grace(tmp_path: Path) -> None:
    """The sandbox's keeper (`workers.isolation.keeper`) gets the worker's parent-death SIGTERM: a
    job that handles SIGTERM ends by itself (its status comes back); one that ignores it is
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


def test_a_stop_signal_sent_to_every_process_of_the_job_leaves_bwrap_standing(
    tmp_path: Path,
) -> None:
    """Slurm's cancel, requeue and `--signal` SIGTERM every process of a step at once (bwrap
    included). bwrap ignores it (`workers.isolation.keeper._shield_bwrap`), so the namespace lives
    on and the job's command, which has the default dispositions back (`env --default-signal`),
    takes the same signal through its own trap: its status comes back, nothing was SIGKILLed."""
    mounts = sandbox.Mounts(network=False, writable=(str(tmp_path),), python=())
    started = tmp_path / "started"
    proc = sandbox.start(
        mounts,
        ["/bin/sh", "-c", f"trap 'exit 7' TERM; touch {started}; sleep 60 & wait"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        grace_s=30.0,
    )
    wait_for("the job's trap", started.exists, 30)
    keeper = psutil.Process(proc.bwrap.pid)  # `.bwrap` is the keeper, bwrap's parent
    tree = [keeper, *keeper.children(recursive=True)]
    assert any(p.name() == "bwrap" for p in tree), tree
    for process in tree:  # as slurmstepd signals every process of a step
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
