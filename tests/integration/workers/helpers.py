"""Helpers for worker tests: real `celery worker` subprocesses, job specs, DB probes.

Every module uses queues of its own (`unique_queue`), so workers of different modules never
take each other's messages. Readiness and progress are awaited by polling (the worker's
remote-control ping, the job row) against a deadline, never by fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.queue import RUN_JOB_TASK, celery_config
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Job, JobEvent, JobNode, LogLine, MetricPoint
from jobspec.job import JobSpec, ScriptJobSpec
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.faults.inject import crash_ranks

T = TypeVar("T")
WORKER_READY_TIMEOUT_S = 60.0
# torchrun imports torch and runs its rendezvous before it spawns the ranks: seconds on an idle
# host, past 10 s on CI's loaded one (a launch event precedes every rank).
RANK_SPAWN_S = 60.0
TERMINAL = ("succeeded", "failed", "cancelled")
# Spec sections of a job that trains (and never checkpoints) until it is stopped.
UNTIL_STOPPED: dict[str, Any] = {
    "train": {"max_steps": 100_000},
    "checkpoint": {"interval_steps": 100_000},
}


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float,
    poll_s: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` at the deadline, with
    what `explain` says then (e.g. the job's events, a worker's log tail), if given."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            why = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{why}")
        time.sleep(poll_s)


def log_tails(log_dir: Path, lines: int = 40) -> str:
    """The last `lines` lines of each worker log in `log_dir`: what a failed wait shows."""
    return "\n".join(
        f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        for path in sorted(log_dir.glob("*.log"))
    )


def kill_tree(worker: Worker, *, at_least: int = 1) -> float:
    """SIGKILL the worker and every process under it (torchrun, the sandbox, the ranks) at
    once, from outside, as a host dies; returns the time (unix seconds) of the kill. A process
    of the tree that ended by itself meanwhile is skipped (the last CI run raced one). Raises
    AssertionError when the tree has fewer than `at_least` processes (e.g. no trainer yet)."""
    return kill_trees([worker], at_least=at_least)


def kill_trees(workers: list[Worker], *, at_least: int = 1) -> float:
    """`kill_tree` of several workers in one instant, as hosts that die together: killed one
    after the other, a worker still alive saw its peer node fail, recorded the attempt's end
    and claimed the next attempt itself before its own kill (the S3 two-host test did)."""
    trees = []
    for worker in workers:
        root = psutil.Process(worker.proc.pid)
        tree = [root, *root.children(recursive=True)]
        assert len(tree) >= at_least, f"fewer than {at_least} processes under the worker: {tree}"
        trees += tree
    for proc in trees:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.suspend()  # nothing of any tree acts on another's death while the kill goes on
    killed_at = time.time()
    for proc in trees:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    for worker in workers:
        worker.proc.wait()
    psutil.wait_procs(trees, timeout=10)
    return killed_at


def unique_queue(label: str) -> str:
    return f"test-{label}-{secrets.token_hex(3)}"


@dataclass
class Worker:
    """A `celery worker` subprocess serving one queue."""

    name: str
    queue: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> int:
        """Warm shutdown (SIGTERM), as a process manager does; SIGKILL after `timeout_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_worker(
    *,
    settings: Settings,
    client: Celery,
    queue: str,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    beat: bool = False,
    name: str | None = None,
    slots: int | None = None,
    argv_prefix: list[str] | None = None,
) -> Worker:
    """Start a worker on `queue` and wait until it answers a ping.

    `beat`: embed Celery beat (it sends `workers.reconcile` every `RECONCILE_INTERVAL_S`), as
    `python -m workers control` does. `name`: Celery's node name (default: a new one); the
    same name again is a restart of that worker. `slots`: a worker with that many CPU slots
    (`TORCHYARD_WORKER_SLOTS`) on the threads pool it sizes itself, as `python -m workers
    worker` runs, instead of the solo pool. `argv_prefix`: what the command runs under (e.g.
    `ip netns exec NS`: a worker on another host)."""
    name = name or f"w-{secrets.token_hex(3)}@tests"
    log_path = log_dir / f"{name.split('@')[0]}.log"
    pool = ["--pool", "solo", "--concurrency", "1"] if slots is None else ["--pool", "threads"]
    command = [
        sys.executable, "-m", "celery", "-A", "workers.app:app", "worker",
        "-Q", queue, "-n", name, *pool, "--prefetch-multiplier", "1",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO",
    ]  # fmt: skip
    if beat:
        command += ["--beat", "--schedule", str(log_dir / f"{name.split('@')[0]}.beat")]
    # One OpenMP thread per rank: several trainers share these 2 cores during the tests, and
    # spinning OpenMP threads of oversubscribed processes slow a step down 20-fold.
    env = {**settings_env(settings), "OMP_NUM_THREADS": "1", **(extra_env or {})}
    if slots is not None:
        env["TORCHYARD_WORKER_SLOTS"] = str(slots)
    command = [*(argv_prefix or []), *command]
    with log_path.open("ab") as out:  # a restarted worker's log follows its predecessor's
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    worker = Worker(name=name, queue=queue, proc=proc, log_path=log_path)

    def answers() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode}:\n{worker.log}")
        return bool(client.control.ping(destination=[name], timeout=0.5))

    try:
        wait_for(f"worker {name} to answer a ping", answers, WORKER_READY_TIMEOUT_S, 0.0)
    except BaseException:
        worker.stop(5)
        raise
    return worker


def start_exporter(
    *, settings: Settings, client: Celery, log_dir: Path, extra_env: dict[str, str] | None = None
) -> Worker:
    """A worker on the export queue, as `torchyard exporter` runs one. The queue is emptied
    first: exports that earlier modules of this test process asked for (nobody served them)
    must not run ahead of the caller's."""
    broker = redis.Redis.from_url(settings.broker_url)
    try:
        broker.delete(settings.export_queue)
    finally:
        broker.close()
    return start_worker(
        settings=settings,
        client=client,
        queue=settings.export_queue,
        log_dir=log_dir,
        extra_env=extra_env,
    )


@contextlib.contextmanager
def own_worker(
    settings: Settings, queue: str, log_dir: Path, *, app_name: str, exporter: bool = False
) -> Iterator[Worker]:
    """A worker on `queue` (or the export queue, `exporter`) with a Celery client of its own,
    stopped and closed at the end: a module's worker that the session's `celery_client` (its
    default database) must not serve."""
    client = Celery(app_name)
    client.conf.update(celery_config(settings))
    started = (
        start_exporter(settings=settings, client=client, log_dir=log_dir)
        if exporter
        else start_worker(settings=settings, client=client, queue=queue, log_dir=log_dir)
    )
    try:
        yield started
    finally:
        started.stop()
        client.close()


def tiny_spec(*, pool: str, dataset_id: str, **overrides: Any) -> JobSpec:
    """A job that trains in seconds on two CPU cores: 2 layers, d_model 64, seq_len 64."""
    spec: dict[str, Any] = {
        "name": "tiny",
        "seed": 1,
        "data": {"dataset": dataset_id},
        "model": {"n_layers": 2, "n_heads": 2, "d_model": 64, "seq_len": 64},
        "optim": {"warmup_steps": 5},
        "train": {"micro_batch_size": 8, "max_steps": 24, "log_interval_steps": 1},
        "eval": {"interval_steps": 12, "num_batches": 2},
        "checkpoint": {"interval_steps": 10},
        "sample": {"max_new_tokens": 16},
        "resources": {"procs_per_node": 1, "pool": pool},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            spec[section] = {**spec.get(section, {}), **values}
        else:
            spec[section] = values
    steps = spec["train"].get("max_steps")
    if "warmup_steps" not in overrides.get("optim", {}) and steps is not None:
        # this spec's 5 warmup steps, at most the run (a longer warmup is refused)
        spec["optim"]["warmup_steps"] = min(spec["optim"]["warmup_steps"], steps)
    return JobSpec.model_validate(spec)


def create_job(engine: Engine, project: ProjectKey, spec: JobSpec | ScriptJobSpec) -> int:
    with Session(engine, expire_on_commit=False) as s:
        return jobs.create(session=s, project_id=project.project_id, spec=spec).job.id


def send(client: Celery, job_id: int, queue: str) -> None:
    client.send_task(RUN_JOB_TASK, args=[job_id], queue=queue)


def submit(
    engine: Engine, client: Celery, project: ProjectKey, spec: JobSpec | ScriptJobSpec
) -> int:
    """Create the job and send its message to the queue of its pool; the job's id."""
    job_id = create_job(engine, project, spec)
    send(client, job_id, spec.resources.pool)
    return job_id


def run_to_success(
    engine: Engine,
    client: Celery,
    project: ProjectKey,
    spec: JobSpec,
    worker: Worker,
    timeout_s: float,
) -> Job:
    """Submit the job and wait (up to `timeout_s`) until it ends; fail unless it succeeded."""
    job = wait_state(engine, submit(engine, client, project, spec), TERMINAL, timeout_s, worker)
    assert job.state == "succeeded", job.error
    return job


def job_row(engine: Engine, job_id: int) -> Job:
    with Session(engine, expire_on_commit=False) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def job_events(engine: Engine, job_id: int) -> list[JobEvent]:
    with Session(engine, expire_on_commit=False) as s:
        query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        return list(s.execute(query).scalars())


def job_nodes(engine: Engine, job_id: int) -> list[JobNode]:
    """The node slots of every attempt of the job, by attempt and node rank."""
    with Session(engine, expire_on_commit=False) as s:
        query = (
            select(JobNode)
            .where(JobNode.job_id == job_id)
            .order_by(JobNode.attempt, JobNode.node_rank)
        )
        return list(s.execute(query).scalars())


def metric_series(engine: Engine, job_id: int, name: str) -> list[MetricPoint]:
    with Session(engine, expire_on_commit=False) as s:
        query = (
            select(MetricPoint)
            .where(MetricPoint.job_id == job_id, MetricPoint.name == name)
            .order_by(MetricPoint.step)
        )
        return list(s.execute(query).scalars())


def log_lines(engine: Engine, job_id: int) -> list[LogLine]:
    with Session(engine, expire_on_commit=False) as s:
        query = select(LogLine).where(LogLine.job_id == job_id).order_by(LogLine.id)
        return list(s.execute(query).scalars())


def wait_state(
    engine: Engine, job_id: int, states: tuple[str, ...], timeout_s: float, worker: Worker
) -> Job:
    """The job once it is in one of `states`; on timeout the failure shows the worker's log."""

    def probe() -> Job | None:
        job = job_row(engine, job_id)
        return job if job.state in states else None

    deadline = time.monotonic() + timeout_s
    while (job := probe()) is None:
        if time.monotonic() > deadline:
            current = job_row(engine, job_id)
            pytest.fail(
                f"job {job_id} is {current.state} (error {current.error!r}), not one of {states}, "
                f"after {timeout_s:.0f} s; worker log tail:\n{worker.log[-6000:]}"
            )
        time.sleep(0.1)
    return job


def launches(events: list[JobEvent]) -> list[JobEvent]:
    return [e for e in events if e.kind == "info" and "pgid" in (e.data or {})]


def wait_step(
    engine: Engine, job_id: int, step: int, timeout_s: float, what: str = "the run"
) -> Job:
    """The job once it has passed `step` (its `current_step`); fail at `timeout_s` naming `what`."""

    def passed() -> Job | None:
        job = job_row(engine, job_id)
        return job if (job.current_step or 0) >= step else None

    return wait_for(f"{what} to pass step {step}", passed, timeout_s)


def running_launch(
    engine: Engine, job_id: int, worker: Worker, *, first_metric: bool = True
) -> JobEvent:
    """The job's one launch event once it is `running` (within 120 s: a sandboxed launch on a
    2-core host under the suite's load took over 60) and, with `first_metric`, has written a
    first loss (within 30 s more): its trainer is under way."""
    wait_state(engine, job_id, ("running",), 120, worker)
    if first_metric:
        wait_for("a first metric", lambda: metric_series(engine, job_id, "loss"), 30)
    (launch,) = launches(job_events(engine, job_id))
    return launch


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def rank_processes(pgid: int) -> list[psutil.Process]:
    """The rank processes of the launch whose group leader is `pgid` (torchrun, the sandbox's
    init above it, or a lone rank started without torchrun): the topmost processes from the
    leader down with a `RANK` in their environment (a rank's own children inherit it), bwrap's
    excepted (a lone rank's environment is the sandbox's too)."""

    def ranks_from(proc: psutil.Process) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            if "RANK" in proc.environ() and proc.name() != "bwrap":
                return [proc]
            return [rank for child in proc.children() for rank in ranks_from(child)]
        return []

    return ranks_from(psutil.Process(pgid))


def rank_process(pgid: int, rank: int) -> psutil.Process | None:
    """The process of global rank `rank` under the launch's group leader `pgid`."""
    for child in rank_processes(pgid):
        with contextlib.suppress(psutil.Error, KeyError):
            if child.environ()["RANK"] == str(rank):
                return child
    return None


def kill_ranks_after_checkpoint(
    engine: Engine,
    settings: Settings,
    job_id: int,
    *,
    step: int,
    nodes: tuple[int, ...] = (0,),
    timeout_s: float,
) -> int:
    """Once the job has reported a checkpoint at `step` (or later), SIGKILL every rank process
    of the nodes `nodes` (node ranks) in the attempt that saved it, the ranks of its other
    nodes paused meanwhile (`crash_ranks`). Returns the step of the newest complete checkpoint
    at the kill: where the job must resume. (A node's global ranks are not known in advance:
    torchrun's c10d rendezvous numbers the nodes in the order they join.)"""

    def checkpoint() -> JobEvent | None:
        events = job_events(engine, job_id)
        return next((e for e in events if e.kind == "checkpoint" and e.data["step"] >= step), None)

    attempt = wait_for(f"a checkpoint at step {step}", checkpoint, timeout_s).attempt
    pgids = {
        e.data.get("node_rank", 0): e.data["pgid"]
        for e in launches(job_events(engine, job_id))
        if e.attempt == attempt
    }
    assert set(nodes) <= set(pgids), (nodes, pgids)
    kill: list[psutil.Process] = []
    spare: list[psutil.Process] = []
    for node_rank, pgid in pgids.items():
        ranks = rank_processes(pgid)
        (kill if node_rank in nodes else spare).extend(ranks)
    assert kill, f"no rank processes of nodes {nodes} under torchrun {pgids}"
    return crash_ranks(kill, job_checkpoint_uri(settings, job_id), spare)


def left_running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still alive (a zombie has ended: only its exit status is left)."""
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def preemption_beat(
    settings: Settings, engine: Engine, client: Celery, pool: str
) -> Callable[[], list[int]]:
    """One reconcile of `pool` with preemption on (no minimum run time), as Celery beat sends
    it every 2 s; each call returns the jobs it preempted."""
    from core.platform.db import session_factory
    from workers.reconcile import reconcile

    enabled = settings.model_copy(update={"preemption_pools": [pool], "preemption_min_run_s": 0.0})

    def beat() -> list[int]:
        return reconcile(
            settings=enabled,
            session_factory=session_factory(engine),
            dispatch=lambda job_id, queue: send(client, job_id, queue),
            redispatch_after_s=600.0,
            pools=[pool],
        ).preempted

    return beat
