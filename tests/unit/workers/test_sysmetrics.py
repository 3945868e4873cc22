"""System metrics of a real process tree: a launcher-like parent and two rank processes.

The tree stands in for torchrun: its children carry RANK/LOCAL_RANK in their environment as
torchrun's ranks do; rank 1 holds ~200 MB, rank 0 spins on a core.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.db import make_engine, session_factory
from core.platform.settings import Settings
from core.platform.tables import Base, Job, MetricPoint, Project
from jobspec.job import JobSpec
from workers.ingest import RunIngest
from workers.launcher import RunPaths
from workers.watchers.sysmetrics import ProcessSample, ProcessSampler, SysMetrics, readings

BIG_BYTES = 200 * 1024**2
T = TypeVar("T")

RANK = f"""
import os, sys
big = b"x" * {BIG_BYTES} if os.environ["RANK"] == "1" else b""  # written, so resident
print("ready", flush=True)
while os.environ["RANK"] == "0":
    pass  # busy: a CPU figure well above 0
sys.stdin.read()
"""
LAUNCHER = f"""
import os, subprocess, sys
env = {{**os.environ, "CUDA_VISIBLE_DEVICES": ""}}
ranks = [
    subprocess.Popen([sys.executable, "-c", {RANK!r}], stdout=subprocess.PIPE,
                     stdin=subprocess.PIPE, env={{**env, "RANK": str(r), "LOCAL_RANK": str(r)}})
    for r in (0, 1)
]
for rank in ranks:
    assert rank.stdout.readline() == b"ready\\n"
print("ready", flush=True)
sys.stdin.read()
for rank in ranks:
    rank.kill()
    rank.wait()
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    """The launcher, once both ranks have started (rank 1 with its memory allocated)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the launcher kills its ranks and exits
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _poll(what: str, probe: Callable[[], T | None], timeout_s: float = 20.0) -> T:
    deadline = time.monotonic() + timeout_s
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return found


def test_sampler_gives_each_rank_its_rss_and_cpu_percent(
    tree: subprocess.Popen[bytes],
) -> None:
    sampler = ProcessSampler(tree.pid)
    first = sampler.sample()
    assert set(first.rss_bytes) == {0, 1}
    assert first.cpu_percent == {}  # a first look has no interval to measure CPU over

    # CPU % is measured between two samples: poll until the busy rank has spent some.
    def busy() -> ProcessSample | None:
        sample = sampler.sample()
        return sample if sample.cpu_percent.get(0, 0.0) > 0 else None

    sample = _poll("CPU use of the busy rank", busy)
    assert set(sample.cpu_percent) == set(sample.rss_bytes) == {0, 1}
    assert all(math.isfinite(v) and v >= 0 for v in sample.cpu_percent.values())
    # It spins while rank 1 sleeps; how big a share of a core it gets depends on the host's load.
    assert sample.cpu_percent[0] > sample.cpu_percent[1]
    assert sample.rss_bytes[1] > 150 * 1024**2 > sample.rss_bytes[0]
    assert sample.node_rss_bytes > sample.rss_bytes[0] + sample.rss_bytes[1]  # + the launcher
    assert tree.pid in sample.pids and len(sample.pids) == 3


def test_a_root_that_is_itself_the_one_rank_is_sampled_as_that_rank() -> None:
    """A node's one rank started without torchrun (`workers.lone_rank`): the
    sampled tree's root is rank 0 itself, with its own child counted in its figures."""
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'input()'])"
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0"}
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, env=env)
    try:
        sampler = ProcessSampler(proc.pid)

        def both() -> ProcessSample | None:
            sample = sampler.sample()
            return sample if len(sample.pids) == 2 else None

        sample = _poll("the rank's child to start", both)
        assert set(sample.rss_bytes) == {0}
        assert sample.rss_bytes[0] == sample.node_rss_bytes  # the rank is the whole tree
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # its child reads EOF and ends, then it does
        proc.wait(timeout=30)


def test_an_environment_read_mid_exec_as_empty_is_read_again_at_the_next_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Popen` returns once the child's `execve` has begun, before the kernel has set up the
    new image's environment: a first read can see it empty. That read must not stick."""
    import psutil

    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0"}
    proc = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE, env=env)
    real = psutil.Process.environ
    reads: list[int] = []

    def environ(self: psutil.Process) -> dict[str, str]:
        reads.append(self.pid)
        return {} if len(reads) == 1 else real(self)

    monkeypatch.setattr(psutil.Process, "environ", environ)
    try:
        sampler = ProcessSampler(proc.pid)
        assert sampler.sample().rss_bytes == {}  # the empty read: no rank yet
        assert set(sampler.sample().rss_bytes) == {0}  # read again: the process is rank 0
        assert set(sampler.sample().rss_bytes) == {0}
        assert reads == [proc.pid, proc.pid]  # a real environment is read once and kept
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_sampler_of_a_process_that_is_gone_is_empty_and_gives_no_readings() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sample = ProcessSampler(proc.pid).sample()
    assert sample.rss_bytes == {}
    # Not a node RSS of 0 bytes: a gang test once found a 0 in `sys/rss_bytes/node1`.
    assert readings(sample, {}, node_rank=1) == []


def _job(tmp_path: Path, current_step: int | None = None) -> tuple[Callable[[], Session], int]:
    """A running job at attempt 1 in a SQLite database of its own."""
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    Base.metadata.create_all(engine)
    factory = session_factory(engine)
    with factory() as s:
        s.add(Project(id="p", name="p"))
        s.flush()  # no ORM relationship orders the inserts
        job = Job(
            project_id="p",
            name="j",
            spec=JobSpec(name="j", data={"uri": "/data/corpus"}).model_dump(mode="json"),
            max_steps=100,
            state="running",
            attempt=1,
            current_step=current_step,
        )
        s.add(job)
        s.commit()
        return factory, job.id


def _gauge(name: str, job_id: int, rank: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"job_id": str(job_id), "rank": str(rank)})


def test_watcher_stores_sys_series_sets_gauges_and_close_removes_them(
    tree: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    factory, job_id = _job(tmp_path)
    paths = RunPaths(run_dir=tmp_path / "run", checkpoint_dir="ckpt", data="data")
    paths.run_dir.mkdir()
    paths.events.write_text('{"type": "metric", "step": 7, "values": {"loss": 2.5}}\n')
    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1)
    ingest.flush(factory)  # the trainer's step 7 is stored: samples go to step 7
    watcher = SysMetrics(
        settings=Settings(sys_metrics_interval_s=0.5, home=tmp_path),
        session_factory=factory,
        root_pid=tree.pid,
        ingest=ingest,
    )
    try:
        assert watcher.tick(time.monotonic()) is None
        cpu = "torchyard_job_cpu_percent"
        _poll("a CPU figure", lambda: watcher.tick(0) or _gauge(cpu, job_id, 1) is not None or None)
        rss = _gauge("torchyard_job_rss_bytes", job_id, 1)
        assert rss is not None and rss > 150 * 1024**2
        with factory() as s:
            rows = s.execute(select(MetricPoint).where(MetricPoint.job_id == job_id)).scalars()
            points = {p.name: p for p in rows}
        assert {
            "sys/cpu_percent/rank0",
            "sys/cpu_percent/rank1",
            "sys/rss_bytes/rank0",
            "sys/rss_bytes/rank1",
            "sys/rss_bytes/node0",
        } <= set(points)
        sys_steps = {p.step for name, p in points.items() if name.startswith("sys/")}
        assert sys_steps == {7}  # later samples overwrote the first ones at that step
        assert points["sys/rss_bytes/rank1"].value > 150 * 1024**2
        assert not any(name.startswith("sys/gpu_") for name in points)  # the tree uses none
    finally:
        watcher.close()
    for name in ("torchyard_job_cpu_percent", "torchyard_job_rss_bytes"):
        assert _gauge(name, job_id, 0) is None and _gauge(name, job_id, 1) is None
    node = {"job_id": str(job_id), "node": "0"}
    assert REGISTRY.get_sample_value("torchyard_job_node_rss_bytes", node) is None


def _sys_steps(factory: Callable[[], Session], job_id: int) -> set[int]:
    with factory() as s:
        query = select(MetricPoint.step).where(
            MetricPoint.job_id == job_id, MetricPoint.name.startswith("sys/")
        )
        return set(s.execute(query).scalars())


def test_a_node_whose_ranks_report_no_metrics_samples_at_the_jobs_current_step(
    tree: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A gang's other node (or an attempt before its first step): its ingest has stored no
    metric line, so the sample goes to the job's latest stored step."""
    factory, job_id = _job(tmp_path, current_step=12)
    paths = RunPaths(run_dir=tmp_path / "run", checkpoint_dir="ckpt", data="data")
    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1, node_rank=1, nproc=2)
    watcher = SysMetrics(
        settings=Settings(home=tmp_path),
        session_factory=factory,
        root_pid=tree.pid,
        ingest=ingest,
        node_rank=1,
    )
    try:
        watcher.tick(time.monotonic())
    finally:
        watcher.close()
    assert _sys_steps(factory, job_id) == {12}
    with factory() as s:
        names = set(s.execute(select(MetricPoint.name)).scalars())
    assert {"sys/rss_bytes/node1", "sys/rss_bytes/rank0", "sys/rss_bytes/rank1"} <= names


def test_no_sample_is_stored_once_the_trainer_reported_its_end(
    tree: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Issue 28, item 5: a sample taken during teardown overwrote the last step's, so the
    memory chart dropped at the end. After the trainer's `completed` report none is stored."""
    factory, job_id = _job(tmp_path, current_step=12)
    paths = RunPaths(run_dir=tmp_path / "run", checkpoint_dir="ckpt", data="data")
    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1)
    watcher = SysMetrics(
        settings=Settings(home=tmp_path), session_factory=factory, root_pid=tree.pid, ingest=ingest
    )
    try:
        ingest.reported.completed = {"trainer_state": "completed", "step": 12}
        watcher.tick(time.monotonic())
        assert _sys_steps(factory, job_id) == set()
        ingest.reported.completed = None  # still training: stored as before
        watcher.tick(time.monotonic())
        assert _sys_steps(factory, job_id) == {12}
    finally:
        watcher.close()
