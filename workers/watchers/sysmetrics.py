"""System metrics of a running job: CPU and memory of every rank, and the GPUs it uses.

`SysMetrics` is a `workers.supervisor.Watcher`: every `sys_metrics_interval_s` seconds it
samples one node's torchrun process tree with psutil (the tree found in the worker's shared
look at the process table, `workers.watchers.proctable`) and, on a host with an NVIDIA driver, the
GPUs the job's processes use with nvidia-ml-py (NVML); it stores the samples as `sys/*` metric
series (charted on the job page like any metric) and sets the job's Prometheus gauges
(`workers.observability.JobGauges`), which `close()` removes.

Series (`r`: global rank, `RANK` of the rank's process = node_rank * procs_per_node + local
rank; `n`: node rank; `i`: NVML device index):

- `sys/cpu_percent/rank<r>`: CPU time of the rank's process and its descendants (data loader
  workers, checkpoint writers) over the last interval, in percent of one core (200 = two
  cores busy); none at a rank's first sample, which has no interval yet;
- `sys/rss_bytes/rank<r>`: resident set size of the same processes, summed, in bytes (pages
  they share, e.g. a forked loader worker's, count once per process);
- `sys/rss_bytes/node<n>`: the same over every process of the node's torchrun tree, torchrun
  itself included, in bytes;
- `sys/gpu_util_percent/gpu<i>`, `sys/gpu_memory_bytes/gpu<i>`, `sys/gpu_power_watts/gpu<i>`:
  percent of NVML's last sample period in which a kernel ran, memory used (the whole device,
  bytes) and power draw (watts) of each device that runs one of the job's processes (NVML's
  compute processes; when none matches, e.g. a worker in its own PID namespace, the ranks'
  `CUDA_VISIBLE_DEVICES` entries, as NVML indices or UUIDs). Nodes other than node 0 of a
  multi-node job name their devices `node<n>-gpu<i>`, so that two nodes' `gpu0` stay apart.

Metric points are keyed by (job, name, step): a sample is stored at the latest training step
this node's ingest has stored (`Reported.step`), or, before this attempt's first one and on
the nodes of a gang whose ranks report no metrics, at the job's `current_step` (the latest
stored by any node or attempt; 0 before any). So a later sample at the same step overwrites
the earlier one: a slow step keeps only its last sample, a fast run has gaps between its
samples. That is the price of charting them on the step axis with the rest.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg
import pynvml  # type: ignore[import-untyped]
from prometheus_client import Gauge
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.jobs import upserts
from core.jobs.service import ACTIVE_STATES
from core.platform.settings import Settings
from core.platform.tables import Job
from workers import observability
from workers.ingest import MAX_METRIC_NAME_CHARS, RunIngest
from workers.supervisor import Stop, Watcher
from workers.watchers import proctable
from workers.watchers.proctable import ProcessTable

log = logging.getLogger(__name__)

PREFIX = "sys/"


@dataclass(frozen=True)
class ProcessSample:
    """One look at a torchrun tree. Ranks are global; a rank first seen has no CPU figure."""

    cpu_percent: dict[int, float] = field(default_factory=dict)  # percent of one core
    rss_bytes: dict[int, int] = field(default_factory=dict)
    node_rss_bytes: int = 0  # every process of the tree, torchrun included
    pids: frozenset[int] = frozenset()  # every process of the tree
    visible_devices: frozenset[str] = frozenset()  # the ranks' CUDA_VISIBLE_DEVICES entries


@dataclass(frozen=True)
class _Member:
    """What one process of the tree contributes to a sample."""

    pid: int
    ppid: int
    cpu_percent: float
    rss_bytes: int
    fresh: bool  # first seen now: its CPU figure (0.0) covers no interval


class ProcessSampler:
    """Samples the process tree under `root_pid` (a torchrun: its children are the ranks).

    Keeps the `psutil.Process` of every process between samples, as `cpu_percent` measures
    from the previous call on the same object. `rank_offset` (node_rank * procs_per_node)
    turns `LOCAL_RANK` into a global rank for a rank process without `RANK`."""

    def __init__(
        self, root_pid: int, *, rank_offset: int = 0, table: ProcessTable = proctable.HOST
    ) -> None:
        self.root_pid = root_pid
        self.rank_offset = rank_offset
        self.table = table  # the look at the host's processes this sample shares
        self._known: dict[psutil.Process, psutil.Process] = {}
        self._env: dict[psutil.Process, tuple[int | None, str]] = {}  # (rank, CUDA devices)

    def sample(self) -> ProcessSample:
        """Measure every process of the tree now; an empty sample once torchrun is gone."""
        tree = []
        for pid in self.table.snapshot(self.root_pid).tree(self.root_pid):
            try:
                tree.append(psutil.Process(pid))
            except psutil.Error:  # gone since the table was read
                continue
        if not tree or tree[0].pid != self.root_pid:
            return ProcessSample()
        root = tree[0]
        known, members = {}, {}
        for proc in tree:
            proc = self._known.get(proc, proc)
            member = _measure(proc, fresh=proc not in self._known)
            if member is not None:
                known[proc] = proc
                members[member.pid] = member
        self._known = known
        self._env = {p: env for p, env in self._env.items() if p in known}
        ranks: dict[int, list[_Member]] = {}
        fresh: set[int] = set()  # ranks whose own process is new: no CPU interval yet
        devices: set[str] = set()
        # The ranks: torchrun's children, or the root itself when it is the node's one rank,
        # started without torchrun (`workers.lone_rank`).
        root_is_rank = root in known and self._rank_env(root)[0] is not None
        for proc in known:
            parent = proc.pid if root_is_rank else members[proc.pid].ppid
            if parent != self.root_pid:
                continue
            rank, visible = self._rank_env(proc)
            if rank is not None:
                ranks[rank] = [m for m in members.values() if _under(m, proc.pid, members)]
                if members[proc.pid].fresh:
                    fresh.add(rank)
                devices.update(d.strip() for d in visible.split(",") if d.strip())
        return ProcessSample(
            cpu_percent={
                rank: sum(m.cpu_percent for m in group)
                for rank, group in ranks.items()
                if rank not in fresh
            },
            rss_bytes={rank: sum(m.rss_bytes for m in group) for rank, group in ranks.items()},
            node_rss_bytes=sum(m.rss_bytes for m in members.values()),
            pids=frozenset(members),
            visible_devices=frozenset(devices),
        )

    def _rank_env(self, proc: psutil.Process) -> tuple[int | None, str]:
        """(global rank, CUDA_VISIBLE_DEVICES) of a rank process; rank None when its
        environment is unreadable or names none.

        A readable, non-empty environment is read once and kept. An empty or unreadable one
        is read again at the next sample: a process caught in `execve` (after its parent's
        `Popen` returned, before the kernel set up the new image's environment) reads as
        empty, and keeping that would leave the rank unrecognised for its whole life."""
        if proc in self._env:
            return self._env[proc]
        try:
            env = proc.environ()
        except psutil.Error:
            env = {}
        rank: int | None = None
        if env.get("RANK", "").isdigit():
            rank = int(env["RANK"])
        elif env.get("LOCAL_RANK", "").isdigit():
            rank = self.rank_offset + int(env["LOCAL_RANK"])
        found = (rank, env.get("CUDA_VISIBLE_DEVICES", ""))
        if env:
            self._env[proc] = found
        return found


def _measure(proc: psutil.Process, *, fresh: bool) -> _Member | None:
    """One process's figures; None when it is gone, exiting (a zombie, or its memory already
    released: RSS 0) or cannot be read."""
    try:
        with proc.oneshot():
            if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            member = _Member(
                pid=proc.pid,
                ppid=proc.ppid(),
                cpu_percent=proc.cpu_percent(interval=None),
                rss_bytes=proc.memory_info().rss,
                fresh=fresh,
            )
    except psutil.Error:
        return None
    return member if member.rss_bytes > 0 else None


def _under(member: _Member, ancestor: int, members: dict[int, _Member]) -> bool:
    """Whether `member` is process `ancestor` or descends from it."""
    pid: int | None = member.pid
    while pid is not None:
        if pid == ancestor:
            return True
        parent = members.get(pid)
        pid = parent.ppid if parent is not None and parent.ppid != pid else None
    return False


@dataclass(frozen=True)
class GpuUsage:
    """One GPU's figures (None: the device does not report it)."""

    util_percent: float | None
    memory_bytes: int | None
    power_watts: float | None


class GpuSampler:
    """The GPUs a job's processes use, through NVML. On a host without an NVIDIA driver
    `nvmlInit` raises NVMLError once, here, and every sample is empty."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
            self.available = True
        except pynvml.NVMLError as exc:
            log.debug("no GPU metrics: NVML unavailable (%s)", exc)
            self.available = False

    def sample(self, pids: Iterable[int], visible: Iterable[str] = ()) -> dict[int, GpuUsage]:
        """{NVML index: usage} of the devices running one of `pids` (else those named by
        `visible`, CUDA_VISIBLE_DEVICES entries); {} without NVML."""
        if not self.available:
            return {}
        handles = self._devices(set(pids), visible)
        usage = {}
        for index, handle in handles.items():
            util = _nvml(pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _nvml(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = _nvml(pynvml.nvmlDeviceGetPowerUsage, handle)
            usage[index] = GpuUsage(
                util_percent=None if util is None else float(util.gpu),
                memory_bytes=None if memory is None else int(memory.used),
                power_watts=None if power_mw is None else power_mw / 1000.0,
            )
        return usage

    def _devices(self, pids: set[int], visible: Iterable[str]) -> dict[int, object]:
        found: dict[int, object] = {}
        for index in range(_nvml(pynvml.nvmlDeviceGetCount) or 0):
            handle = _nvml(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            running = _nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            if any(p.pid in pids for p in running):
                found[index] = handle
        if found:
            return found
        for entry in visible:
            handle = _nvml(
                pynvml.nvmlDeviceGetHandleByIndex if entry.isdigit() else _by_uuid,
                int(entry) if entry.isdigit() else entry,
            )
            named = _nvml(pynvml.nvmlDeviceGetIndex, handle) if handle is not None else None
            if named is not None:
                found[int(named)] = handle
        return found

    def close(self) -> None:
        if self.available:
            _nvml(pynvml.nvmlShutdown)
            self.available = False


def _by_uuid(uuid: str) -> object:
    return pynvml.nvmlDeviceGetHandleByUUID(uuid)


def _nvml(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)`, or None when NVML refuses (device lost, query not supported)."""
    try:
        return call(*args)
    except pynvml.NVMLError as exc:
        log.debug("NVML %s failed: %s", getattr(call, "__name__", call), exc)
        return None


@dataclass(frozen=True)
class Reading:
    """One figure of a sample: its `sys/*` series and its Prometheus gauge and label."""

    series: str
    gauge: Gauge
    label: str
    value: float


def readings(procs: ProcessSample, gpus: dict[int, GpuUsage], *, node_rank: int) -> list[Reading]:
    """The series and gauge values of one sample (finite numbers only). A sample of a tree
    that is gone (torchrun exited between two samples) has no node figure: its RSS is not 0,
    it is not there."""
    o = observability
    out = []
    if procs.pids:
        node = float(procs.node_rss_bytes)
        out.append(
            Reading(f"{PREFIX}rss_bytes/node{node_rank}", o.JOB_NODE_RSS, str(node_rank), node)
        )
    gpu_name = "gpu" if node_rank == 0 else f"node{node_rank}-gpu"  # unique across a gang
    for rank, rss in sorted(procs.rss_bytes.items()):
        out.append(Reading(f"{PREFIX}rss_bytes/rank{rank}", o.JOB_RSS, str(rank), float(rss)))
    for rank, cpu in sorted(procs.cpu_percent.items()):
        out.append(Reading(f"{PREFIX}cpu_percent/rank{rank}", o.JOB_CPU, str(rank), cpu))
    for index, gpu in sorted(gpus.items()):
        for quantity, gauge, value in (
            ("gpu_util_percent", o.JOB_GPU_UTIL, gpu.util_percent),
            ("gpu_memory_bytes", o.JOB_GPU_MEMORY, gpu.memory_bytes),
            ("gpu_power_watts", o.JOB_GPU_POWER, gpu.power_watts),
        ):
            if value is not None:
                series = f"{PREFIX}{quantity}/{gpu_name}{index}"
                out.append(Reading(series, gauge, str(index), float(value)))
    return [r for r in out if math.isfinite(r.value) and len(r.series) <= MAX_METRIC_NAME_CHARS]


class SysMetrics:
    """The system-metrics watcher of one node of one attempt (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: Settings,
        session_factory: Callable[[], Session],
        root_pid: int,
        ingest: RunIngest,
        node_rank: int = 0,
    ) -> None:
        self.interval_s = settings.sys_metrics_interval_s
        self.reason: str | None = None  # it never stops the trainer (`Watcher.reason`)
        self.session_factory = session_factory
        self.ingest = ingest
        self.node_rank = node_rank
        self.processes = ProcessSampler(root_pid, rank_offset=ingest.rank_offset)
        self.gpus = GpuSampler()
        self.gauges = observability.JobGauges(ingest.job_id)

    def tick(self, now: float) -> Stop | None:
        """Sample, set the gauges, store the series; never stops the trainer. A database
        error is logged and the sample dropped (the next one comes `interval_s` later)."""
        procs = self.processes.sample()
        values = readings(
            procs, self.gpus.sample(procs.pids, procs.visible_devices), node_rank=self.node_rank
        )
        self.gauges.update({(r.gauge, r.label): r.value for r in values})
        try:
            self._store(values, time.time())
        except (SQLAlchemyError, psycopg.Error) as exc:
            log.warning("job %s: system metrics not stored: %s", self.ingest.job_id, exc)
        return None

    def _store(self, values: list[Reading], when: float) -> None:
        """Store at the latest step (module docstring), if the job is still this attempt's and
        its trainer has not reported its end: a sample taken while it tears down (processes
        exiting, memory freed) would overwrite the last step's and chart a drop at the end."""
        if self.ingest.reported.completed is not None or self.ingest.reported.stopped:
            return
        job_id, attempt = self.ingest.job_id, self.ingest.attempt
        with self.session_factory() as session:
            ours = session.execute(
                select(Job.current_step).where(
                    Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES)
                )
            ).first()
            if ours is None:  # lost: the supervisor's heartbeat stops the trainer
                return
            step = self.ingest.reported.step
            if step is None:
                step = ours.current_step or 0
            points = [upserts.Metric(r.series, step, r.value, when) for r in values]
            upserts.metrics(session=session, job_id=job_id, attempt=attempt, points=points)
            session.commit()

    def close(self) -> None:
        """Remove the job's gauges and release NVML."""
        self.gauges.remove()
        self.gpus.close()


def watchers_for(
    settings: Settings,
    session_factory: Callable[[], Session],
    root_pid: int,
    ingest: RunIngest,
    node_rank: int = 0,
) -> list[Watcher]:
    """The watchers of one supervised torchrun (`root_pid`) of node `node_rank`."""
    return [
        SysMetrics(
            settings=settings,
            session_factory=session_factory,
            root_pid=root_pid,
            ingest=ingest,
            node_rank=node_rank,
        )
    ]
