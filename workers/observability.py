"""Prometheus metrics of a worker process: ingest rate and lag, heartbeats.

Exported over HTTP by `prometheus_client.start_http_server` when
`TORCHYARD_WORKER_METRICS_PORT` is set (on `TORCHYARD_WORKER_METRICS_ADDR`, default all
interfaces, for the scraper; a worker is one process (`--pool threads`), so one port
per worker; 0 or unset: no exporter). The series (rates come from PromQL `rate()`):

- `torchyard_worker_ingested_points_total`, `torchyard_worker_ingested_log_lines_total`,
  `torchyard_worker_ingested_events_total`: rows committed by the ingest path;
- `torchyard_worker_ingest_lag_seconds`: from the trainer writing a metric line (its `time`)
  to the commit that stored it;
- `torchyard_worker_ingest_flush_seconds`: one read-parse-write-commit flush;
- `torchyard_worker_heartbeats_total{outcome}` and `torchyard_worker_last_heartbeat_seconds`.

Per running job (`workers.watchers.sysmetrics`, one label set per job and rank, node or GPU, removed
when the job's attempt ends on this worker):

- `torchyard_job_cpu_percent{job_id,rank}`: percent of one core (200 = two cores busy);
- `torchyard_job_rss_bytes{job_id,rank}`, `torchyard_job_node_rss_bytes{job_id,node}`: bytes;
- `torchyard_job_gpu_utilization_percent{job_id,gpu}`, `torchyard_job_gpu_memory_used_bytes`,
  `torchyard_job_gpu_power_watts` (same labels; `gpu` is the NVML device index).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

PORT_ENV = "TORCHYARD_WORKER_METRICS_PORT"

POINTS = Counter("torchyard_worker_ingested_points", "Metric points committed by ingest.")
LOG_LINES = Counter("torchyard_worker_ingested_log_lines", "Log lines committed by ingest.")
EVENTS = Counter("torchyard_worker_ingested_events", "Trainer events committed by ingest.")
LAG = Histogram(
    "torchyard_worker_ingest_lag_seconds",
    "Seconds from the trainer writing a metric line to its database commit.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
)
FLUSH = Histogram(
    "torchyard_worker_ingest_flush_seconds",
    "Seconds one ingest flush (read, parse, write, commit) took.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
HEARTBEATS = Counter("torchyard_worker_heartbeats", "Heartbeats written, by outcome.", ["outcome"])
LAST_HEARTBEAT = Gauge(
    "torchyard_worker_last_heartbeat_seconds", "Unix time of the last successful heartbeat."
)

JOB_CPU = Gauge(
    "torchyard_job_cpu_percent",
    "CPU use of a job's rank (its process and descendants), percent of one core.",
    ["job_id", "rank"],
)
JOB_RSS = Gauge(
    "torchyard_job_rss_bytes",
    "Resident memory of a job's rank (its process and descendants), bytes.",
    ["job_id", "rank"],
)
JOB_NODE_RSS = Gauge(
    "torchyard_job_node_rss_bytes",
    "Resident memory of all of a job's processes on one node (torchrun included), bytes.",
    ["job_id", "node"],
)
JOB_GPU_UTIL = Gauge(
    "torchyard_job_gpu_utilization_percent",
    "Percent of the last sample period a kernel ran on a GPU the job uses (NVML).",
    ["job_id", "gpu"],
)
JOB_GPU_MEMORY = Gauge(
    "torchyard_job_gpu_memory_used_bytes",
    "Memory used on a GPU the job uses (the whole device, NVML), bytes.",
    ["job_id", "gpu"],
)
JOB_GPU_POWER = Gauge(
    "torchyard_job_gpu_power_watts",
    "Power draw of a GPU the job uses (NVML), watts.",
    ["job_id", "gpu"],
)


class JobGauges:
    """The per-job gauges of one job on this worker: `update` sets them, `remove` drops them."""

    def __init__(self, job_id: int) -> None:
        self.job_id = str(job_id)
        self._shown: set[tuple[Gauge, str]] = set()

    def update(self, values: dict[tuple[Gauge, str], float]) -> None:
        """Set `{(gauge, label): value}` (label: the rank, node or GPU index); label sets of
        the last update that are not in `values` (a rank that exited) are removed."""
        for gauge, label in self._shown - values.keys():
            gauge.remove(self.job_id, label)
        for (gauge, label), value in values.items():
            gauge.labels(self.job_id, label).set(value)
        self._shown = set(values)

    def remove(self) -> None:
        """Drop every label set of this job, so a finished job does not linger in scrapes."""
        self.update({})


_started = False
_lock = threading.Lock()


def start_exporter(port: int | None = None) -> int | None:
    """Serve /metrics on `port` (default: `$TORCHYARD_WORKER_METRICS_PORT`), once per process.

    Returns the port, or None when disabled. A port already in use is logged, not raised:
    metrics must never stop a worker from running jobs.
    """
    global _started
    port = port if port is not None else int(os.environ.get(PORT_ENV) or 0)
    with _lock:
        if _started or not port:
            return port or None
        try:
            addr = os.environ.get("TORCHYARD_WORKER_METRICS_ADDR") or "0.0.0.0"
            start_http_server(port, addr=addr)
        except OSError as exc:
            log.error("worker metrics exporter not started on port %d: %s", port, exc)
            return None
        _started = True
        log.info("worker metrics on :%d/metrics", port)
        return port


def flushed(
    *, points: int, log_lines: int, events: int, times: Iterable[float], started: float
) -> None:
    """Record one committed flush; `times`: trainer times of its metric lines, `started`:
    `time.perf_counter()` when the flush began."""
    now = time.time()
    POINTS.inc(points)
    LOG_LINES.inc(log_lines)
    EVENTS.inc(events)
    for t in set(times):
        if t > 0:
            LAG.observe(max(0.0, now - t))
    FLUSH.observe(time.perf_counter() - started)


def heartbeat(ok: bool) -> None:
    HEARTBEATS.labels("ok" if ok else "error").inc()
    if ok:
        LAST_HEARTBEAT.set(time.time())
