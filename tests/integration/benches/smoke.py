"""Every bench runs: each one's `--smoke` mode (tiny sizes, its whole path) exits 0 and prints
its JSON document with the figures README's Performance table quotes. No timing is asserted:
a bench that cannot run is the defect this catches (two crashed unseen for a round).

The benches are run by three test modules of this package, one per `GROUPS` entry: the suite
keeps each module on one worker (`--dist loadfile`), and all fourteen in one took 612 s of one
worker's time, the suite's longest module by twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
# Below the test's own limit (600 s), so that a bench that stalls is stopped here and its
# stderr so far (its `[bench]` notes, a session bench's log tails) is shown.
BENCH_TIMEOUT_S = 540

# bench -> (command, the key paths README quotes, dotted)
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "ingest": (
        ["-m", "bench.ingest"],
        [
            "burst.points_per_s",
            "burst.cpu_s_per_100k_points.worker",
            "burst.cpu_s_per_100k_points.postgres",
            "sustained.points_per_s",
            "sustained.lag.p50_ms",
            "sustained.lag.p99_ms",
        ],
    ),
    "query": (
        ["-m", "bench.query"],
        [
            "downsampled_to_1000_uncached.p99_ms",
            "downsampled_to_1000.p50_ms",
            "downsampled_to_1000.p99_ms",
            "downsampled_to_1000.points_returned",
            "downsampled_to_1000.last_exact",
            "full_series_once_ms",
            "jobs_list_first_page.p99_ms",
            "jobs_list_deep_page.p99_ms",
            "jobs_list_sort_name_first_page.p99_ms",
            "jobs_list_label_filter_first_page.p99_ms",
        ],
    ),
    "api": (
        ["-m", "bench.api"],
        [
            "submit.jobs_per_s",
            "submit.errors",
            "submit.latency.p50_ms",
            "submit.latency.p99_ms",
            "submit.cpu_ms_per_job.api",
            "sse.watchers_with_every_line",
            "sse.delivery_latency.p99_ms",
        ],
    ),
    "fleet": (
        ["-m", "bench.fleet"],
        [
            "submit.jobs_per_s",
            "submit.errors",
            "submit.latency.p50_ms",
            "submit.latency.p99_ms",
            "queue_to_claim.all.p50_ms",
            "queue_to_claim.all.p99_ms",
            "queue_to_claim.states.succeeded",
            "reconcile_spacing.p50_ms",
            "updates_per_s.workers",
            "updates_per_s.job_nodes",
            "postgres.transactions_per_s",
            "postgres.connections_max",
            "pgbouncer.cl_active",
            "pgbouncer.sv_active",
            "ingest.points_per_s",
            "ingest.lag.p99_ms",
            "cpu_s_per_1000_jobs.api",
            "cpu_s_per_1000_jobs.controllers",
            "cpu_s_per_1000_jobs.workers_own",
            "cpu_s_per_1000_jobs.workers_with_jobs",
            "cpu_s_per_1000_jobs.postgres",
            "cpu_s_per_1000_jobs.pgbouncer",
            "s3.requests_per_s",
            "sse.delivery.p99_ms",
            "faults.requeue.p99_ms",
            "faults.controller.takeover_s",
        ],
    ),
    "audit": (
        ["-m", "bench.audit"],
        ["submit_latency_ms.added_p50_ms", "audit_record_insert_ms.p50_ms"],
    ),
    "checkpoint": (
        ["-m", "bench.checkpoint"],
        ["saved_bytes", "sync_blocking_s", "async_blocking_s", "async_complete_s"],
    ),
    "inputs": (
        ["-m", "bench.inputs"],
        [
            "fetch.mb_per_s",
            "s3fs_get.mb_per_s",
            "fetch_vs_s3fs_get",
            "hit_ms.dataset.p50",
            "hit_ms.path.p50",
        ],
    ),
    "overhead": (
        ["-m", "bench.overhead"],
        [
            "steps_per_s_ratio",
            "extra_to_first_step_s",
            "bare.to_first_step_s",
            "platform.to_first_step_s",
        ],
    ),
    "data": (
        ["-m", "bench.data"],
        [
            "prepare.text_bytes_1x.tokens_per_second",
            "prepare.chat_bpe.tokens_per_second",
            "loader.tokens_per_second",
            "loader.ratio_gpt",
            "loader.ratio_llama",
            "memory.ratio_peak_rss_cold",
            "parity.trainer_step_ms",
            "parity.minimal_step_ms",
        ],
    ),
    "trainer_methods": (
        ["bench/trainer_methods.py"],
        [
            "methods.single.tokens_per_second",
            "methods.single.peak_memory_bytes_per_rank",
            "methods.fsdp.tokens_per_second",
        ],
    ),
    "float8": (
        ["-m", "bench.float8"],
        [
            "runs.bf16.tokens_per_second",
            "runs.fp8_tensorwise.tokens_per_second",
            "runs.fp8_tensorwise.speedup",
            "runs.fp8_tensorwise.curve.mean_rel",
            "runs.fp8_tensorwise.curve.max_rel_smoothed",
        ],
    ),
    "llama8b": (
        ["-m", "bench.llama8b"],
        [
            "params",
            "runs.lora.tokens_per_second",
            "runs.lora.peak_memory_bytes_per_rank",
            "runs.qlora.tokens_per_second",
            "runs.qlora.peak_memory_bytes_per_rank",
        ],
    ),
    "grpo": (
        ["-m", "bench.grpo"],
        ["ours.step_s", "ours.completions_per_s", "trl.step_s", "ours_vs_trl"],
    ),
    "sessions": (
        ["-m", "bench.sessions"],
        [
            "latency.service.p50_ms",
            "latency.in_process.p50_ms",
            "latency.p50_added_ms",
            "throughput.session_tokens_per_s",
            "throughput.trainer_tokens_per_s",
            "throughput.ratio",
            "throughput.pipelined_tokens_per_s",
            "throughput.pipelined_ratio",
        ],
    ),
    "resume_check": (
        ["bench/resume_check.py"],
        ["max_abs_loss_diff_after_resume", "resumed_only_later_steps"],
    ),
    "service_path": (
        ["bench/service_path.py"],
        ["bench.tokens_per_second", "service.tokens_per_second", "service_vs_bench"],
    ),
}
# Scripts for a GPU machine (never in tests or CI): `cuda_check.sh` runs trainer_methods and
# service_path, both smoked above, on CUDA; `gpu_round2.sh` the cuda tests and float8 (smoked
# above); `cuda_workers_check.py` asks NVML about a real CUDA process; `gpu_wheels.sh`
# downloads the wheels the GPU image lacks.
CUDA_ONLY = {"cuda_check", "cuda_workers_check", "gpu_wheels", "gpu_round2"}
HELPERS = {"__init__", "_common", "smoke"} | {
    f"_fleet_{part}" for part in ("claims", "faults", "plot", "probe", "store", "watch")
}


def _get(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for key in dotted.split("."):
        assert isinstance(value, dict) and key in value, f"{dotted}: no {key!r}"
        value = value[key]
    return value


def _fleet_is_sane(document: dict[str, Any]) -> None:
    """The fleet did its work, through PgBouncer: every job ran to success, every point of every
    job reached Postgres, and the figures are self-consistent (no timing is judged)."""
    sizes = document["sizes"]
    assert document["submit"]["errors"] == 0, document["submit"]["first_error"]
    assert document["queue_to_claim"]["states"] == {"succeeded": sizes["jobs"]}
    assert document["queue_to_claim"]["all"]["n"] == sizes["jobs"]
    assert document["ingest"]["points"] >= sizes["jobs"] * sizes["steps"] * sizes["series"]
    assert document["pgbouncer"]["cl_active"] > 0  # the API's and workers' clients
    assert document["postgres"]["connections_max"] > 0
    # A killed worker's jobs hold their slots in the table until the reconciler requeues them,
    # while the restarted worker claims anew: the bound is the slots plus the jobs it lost.
    lost = sum(k["jobs"] for k in document["faults"]["workers_killed"])
    assert document["peak"]["holding_slots"] <= sizes["slots_total"] + lost
    for path in ("submit.latency", "queue_to_claim.all", "ingest.lag", "reconcile_spacing"):
        summary = _get(document, path)
        assert 0 <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"], path
    assert all(v >= 0 for v in document["cpu_s_per_1000_jobs"].values())
    # Storage went to the S3 server; the watchers saw points arrive; the faults struck and the
    # fleet recovered: each killed worker's jobs requeued, the standby took over, all ended well.
    assert document["s3"]["requests"] > 0 and document["s3"]["by_method"]["PUT"] > 0
    assert document["sse"]["errors"] == 0, document["sse"]["first_error"]
    assert document["sse"]["followed_to_end"] == sizes["watchers"]
    assert document["sse"]["delivery"]["n"] > 0
    faults = document["faults"]
    assert faults["error"] is None, faults["error"]
    assert len(faults["workers_killed"]) == sizes["workers_killed"]
    assert faults["requeue"]["n"] == sum(k["jobs"] for k in faults["workers_killed"]) > 0
    assert faults["controller"]["takeover_s"] is not None
    assert faults["ends_unexpected"] == 0


# bench -> what its document must also satisfy, besides having the keys above
SANE = {"fleet": _fleet_is_sane}


# The benches by test module (their smoke seconds in the suite at a7abc72, 2026-11-30).
GROUPS = {
    # data 118, trainer_methods 46, resume_check 41, checkpoint 21, float8 20 (alone)
    "training": ["data", "trainer_methods", "resume_check", "checkpoint", "float8"],
    # service_path 71, overhead 70, api 20, audit 12, query 11, inputs 8, ingest 8, llama8b 50
    # (alone)
    "service": ["service_path", "overhead", "api", "audit", "query", "inputs", "ingest", "llama8b"],
    # sessions 71, fleet 61, grpo 54
    "sessions_fleet_grpo": ["sessions", "fleet", "grpo"],
}


def every_bench_is_smoked_or_needs_a_gpu() -> None:
    found = {p.stem for p in (REPO / "bench").iterdir() if p.suffix in (".py", ".sh")}
    assert found - HELPERS == set(BENCHES) | CUDA_ONLY
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(BENCHES)  # each in one group, once


# A smoke run is a bench's whole path at tiny sizes: `bench.data`'s trains, builds rows and
# launches torchrun several times, near 5 minutes on a 2-core host under the suite's own load.
SMOKE_TIMEOUT_S = 600


def run_smoke(name: str, redis_url: str, tmp_path: Path) -> None:
    """Run bench `name --smoke` and check its document (the callers' test bodies)."""
    command, keys = BENCHES[name]
    env = {
        **os.environ,
        "TORCHYARD_BENCH_REDIS": redis_url,  # this session's own Redis database
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    plot = tmp_path / "fleet.png"
    if name == "fleet":
        command = [*command, "--plot", str(plot)]
    try:
        proc = subprocess.run(
            [sys.executable, *command, "--smoke"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=BENCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:  # what it had said so far: where it waited
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"{name} --smoke ran past {BENCH_TIMEOUT_S} s:\n{(said or '')[-6000:]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    document = json.loads(proc.stdout)
    for key in keys:
        value = _get(document, key)
        assert isinstance(value, int | float | bool), (key, value)
    if name in SANE:
        SANE[name](document)
    if name == "fleet":  # the plot, and the run's JSON with its timeline beside it
        assert plot.read_bytes().startswith(b"\x89PNG")
        assert json.loads(plot.with_suffix(".json").read_text())["timeline"]["samples"]
