"""A slow rank under synchronous DDP shows in its compute time: real `torchrun` processes.

Rank 1 of a 2-process CPU DDP run is slowed from outside: the test stops and continues its
process on a duty cycle (SIGSTOP for 40 ms of every 50 ms; 30 ms of 50 left some reports
just over 1.5x on this loaded 2-core machine). Its wall step time then equals rank 0's
(rank 0 waits for it in the gradient all-reduce), but its compute time
(`trainer.parallel.compute_timer`) does not, and the worker's detector
(`workers.watchers.pace.StragglerDetector`, fed the trainer's `rank_step_times` events) names
it.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from jobspec.job import JobSpec
from tests.support.training import (
    RUN_TIMEOUT_S,
    read_events,
    start_trainer,
    tiny_spec,
    trainer_command,
)
from workers.watchers.pace import STRAGGLER_RATIO, StragglerDetector

MAX_STEPS = 60
LOG_INTERVAL = 5  # steps per rank_step_times report
PERIOD_S, STOPPED_S = 0.05, 0.04  # rank 1 runs 20% of the time: up to 5x slower compute


def straggler_spec(corpus_dir: Path) -> JobSpec:
    """2 ranks x 8 sequences x 2 accumulation steps; no eval or checkpoint inside the run."""
    return tiny_spec(
        corpus_dir,
        parallelism={"strategy": "ddp"},
        resources={"procs_per_node": 2},
        train={
            "micro_batch_size": 8,
            "grad_accum_steps": 2,
            "max_steps": MAX_STEPS,
            "log_interval_steps": LOG_INTERVAL,
        },
        eval={"interval_steps": MAX_STEPS, "num_batches": 2},
        checkpoint={"interval_steps": MAX_STEPS, "keep_last": 1},
    )


def rank_process(launcher: psutil.Process, rank: int, deadline: float) -> psutil.Process:
    """The child of `launcher` (torchrun) whose environment has RANK=`rank`. Raises
    AssertionError when none appears before `deadline` (time.monotonic())."""
    while time.monotonic() < deadline:
        for child in launcher.children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank):
                    return child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.05)  # polling the process table with a deadline
    raise AssertionError(f"no process of rank {rank} under torchrun")


def reports_in(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [e for e in read_events(run_dir) if e["type"] == "rank_step_times"]


def print_reports(title: str, reports: list[dict[str, Any]]) -> None:
    """The per-rank compute and wall times (ms), for the log of a run with `-s`."""
    print(f"{title}: step, compute ms per rank, wall ms per rank")
    for e in reports:
        compute = [round(1000 * t) for t in e["seconds"]]
        wall = [round(1000 * t) for t in e["wall_seconds"]]
        print(f"  {e['step']:3d} compute {compute} wall {wall}")


def run_ddp(spec: JobSpec, workdir: Path, *, slow_rank: int | None) -> list[dict[str, Any]]:
    """Run the trainer under torchrun to the end; with `slow_rank`, stop and continue that
    rank's process on the duty cycle from its first `rank_step_times` report on. Returns the
    reports made while it was slowed (all of them without `slow_rank`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec.dump(workdir / "spec.json")
    run_dir = workdir / "run"
    cmd = trainer_command(workdir / "spec.json", run_dir, workdir / "ckpt", nproc=2)
    proc = start_trainer(cmd)
    done = threading.Event()
    first_slowed_step = 0

    def duty_cycle(target: psutil.Process) -> None:
        while not done.is_set():
            try:
                target.send_signal(signal.SIGSTOP)
                done.wait(STOPPED_S)
                target.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                return
            done.wait(PERIOD_S - STOPPED_S)

    thread = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        if slow_rank is not None:
            target = rank_process(psutil.Process(proc.pid), slow_rank, deadline)
            while not reports_in(run_dir) and proc.poll() is None:
                assert time.monotonic() < deadline, "no rank_step_times report"
                time.sleep(0.05)  # polling the events file with a deadline
            before = reports_in(run_dir)  # none: the trainer failed (asserted below)
            first_slowed_step = before[-1]["step"] + LOG_INTERVAL if before else 0
            thread = threading.Thread(target=duty_cycle, args=(target,), daemon=True)
            thread.start()
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        done.set()
        if thread is not None:
            thread.join()
        if proc.poll() is None:  # timed out or failed: kill torchrun's ranks, then torchrun
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    return [e for e in reports_in(run_dir) if e["step"] >= first_slowed_step]


def test_a_rank_stopped_80_percent_of_the_time_is_a_straggler_by_compute_time_not_wall_time(
    corpus_dir: Path, tmp_path: Path
) -> None:
    reports = run_ddp(straggler_spec(corpus_dir), tmp_path, slow_rank=1)
    print_reports("slowed rank 1", reports)
    assert len(reports) >= 8
    assert all(e["measure"] == "compute" for e in reports)
    compute = [e["seconds"][1] / e["seconds"][0] for e in reports]
    wall = [e["wall_seconds"][1] / e["wall_seconds"][0] for e in reports]
    seen = f"compute ratios {compute}, wall ratios {wall}, reports {reports}"
    assert sum(r >= STRAGGLER_RATIO for r in compute) >= 0.75 * len(reports), seen
    assert statistics.median(wall) < 1.2, seen  # the wait hides it from wall time
    detector = StragglerDetector()
    found = [s for e in reports for s in detector.observe(e["step"], e["seconds"])]
    # Rank 1 and only it; it may be flagged more than once, since the detector flags a rank
    # again after a report at or under the threshold (a slowed step that missed a SIGSTOP).
    assert found and {s.rank for s in found} == {1}, seen


def test_ranks_running_alike_have_close_compute_times_and_no_straggler(
    corpus_dir: Path, tmp_path: Path
) -> None:
    reports = run_ddp(straggler_spec(corpus_dir), tmp_path, slow_rank=None)
    print_reports("plain", reports)
    assert len(reports) == MAX_STEPS // LOG_INTERVAL
    assert all(e["measure"] == "compute" for e in reports)
    compute = [max(e["seconds"]) / min(e["seconds"]) for e in reports]
    # Alike over the run: typically within 10 %, never straggler-like in the median. Not "the
    # detector flags nothing": on CI's 2 cores shared by 4 test workers one rank can be starved
    # for 3 reports in a row (1.8x, 1.5x, 1.5x at steps 45-55 of a run), and a rank its host
    # starves is a straggler; that noise shorter than the streak passes is a unit test
    # (tests/unit/workers/test_stragglers.py).
    assert statistics.median(compute) < STRAGGLER_RATIO, (compute, reports)
    for e in reports:  # compute is the part of the step before the gradients are synced
        assert all(0 < c <= w for c, w in zip(e["seconds"], e["wall_seconds"], strict=True))
