"""The trainer as the workers run it: real `torchrun` processes over gloo on CPU.

One uninterrupted 2-process DDP run (`ddp_run`, 4 sequences x 2 accumulation steps x 2 ranks
= 16 per step) is the reference for the other tests: the resumed run must follow its loss
curve, and a single process taking the same 16 sequences in one micro-batch must match its
first steps.
"""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

import pytest

from jobspec.job import JobSpec
from tests.support.tolerances import reordered_sum_rel, tokens_per_step
from tests.support.training import (
    RUN_TIMEOUT_S,
    explain,
    read_events,
    run_trainer,
    start_trainer,
    statuses,
    tiny_spec,
    train_losses,
    trainer_command,
)

MAX_STEPS = 120
# Exact on CPU in practice (gloo's 2-rank all-reduce and the kernels are deterministic).
RESUME_TOLERANCE = 1e-6
# Single vs DDP: the same 16 x 64 per-token losses (and gradients), summed in another order:
# (n - 1) eps relative (tests/support/tolerances.py), 1.2e-4; observed ~1e-7.
LAYOUT_TOLERANCE = reordered_sum_rel(tokens_per_step(16, 64))


def ddp_spec(corpus_dir: Path, **sections: dict[str, Any]) -> JobSpec:
    """The reference run's spec; `sections` update parts of it."""
    base: dict[str, dict[str, Any]] = {
        "parallelism": {"strategy": "ddp"},
        "resources": {"procs_per_node": 2},
        "train": {"micro_batch_size": 4, "grad_accum_steps": 2, "max_steps": MAX_STEPS},
        "eval": {"interval_steps": 60, "num_batches": 32},  # 256 of the eval split's chunks
        "checkpoint": {"interval_steps": 10, "keep_last": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return tiny_spec(corpus_dir, **base)


@pytest.fixture(scope="module")
def ddp_run(
    corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    """The reference: 2 processes, uninterrupted, to MAX_STEPS. (workdir, events)"""
    workdir = tmp_path_factory.mktemp("ddp_run")
    proc = run_trainer(ddp_spec(corpus_dir), workdir, nproc=2)
    assert proc.returncode == 0, explain(proc)
    return workdir, read_events(workdir / "run")


def test_ddp_two_processes_train_to_completion_and_beat_the_unigram_baseline(
    ddp_run: tuple[Path, list[dict[str, Any]]], corpus_dir: Path
) -> None:
    _, events = ddp_run
    assert {"status", "metric", "checkpoint", "sample"} <= {e["type"] for e in events}
    assert all({"type", "time", "attempt"} <= e.keys() for e in events)
    assert [e["state"] for e in statuses(events)] == ["running", "completed"]
    running, completed = statuses(events)
    assert running["data"]["world_size"] == 2
    assert running["data"]["tokens_per_step"] == 16 * 64
    assert running["data"]["start_step"] == 0
    losses = train_losses(events)
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))
    first = sum(losses[s] for s in range(1, 6)) / 5
    last = sum(losses[s] for s in range(MAX_STEPS - 4, MAX_STEPS + 1)) / 5
    assert last < first - 1.5, (first, last)
    unigram = running["data"]["unigram_eval_loss"]
    final_eval = completed["data"]["final_eval_loss"]
    assert final_eval < unigram - 0.1, (final_eval, unigram)
    assert completed["data"]["steps"] == MAX_STEPS
    assert completed["data"]["final_loss"] == losses[MAX_STEPS]
    assert completed["data"]["tokens_per_second"] > 0
    (sample,) = [e for e in events if e["type"] == "sample"]
    assert sample["step"] == MAX_STEPS
    assert sample["prompt"] == "def "
    assert len(sample["text"].encode()) >= 16  # 32 bytes, fewer characters if multi-byte


def test_every_ranks_step_time_is_reported_at_each_log_interval_with_max_and_median(
    ddp_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, events = ddp_run
    reports = [e for e in events if e["type"] == "rank_step_times"]
    assert [e["step"] for e in reports] == list(range(1, MAX_STEPS + 1))  # log interval 1
    assert all(len(e["seconds"]) == 2 and min(e["seconds"]) > 0 for e in reports)
    assert all(e["measure"] == "compute" for e in reports)  # DDP on CPU
    train = {
        e["step"]: e["values"] for e in events if e["type"] == "metric" and "loss" in e["values"]
    }
    for e in reports:
        values = train[e["step"]]
        assert values["step_time_s/max"] == max(e["wall_seconds"])
        assert values["step_time_s/median"] == pytest.approx(sum(e["wall_seconds"]) / 2)
        assert values["step_time_s"] == e["wall_seconds"][0]  # the reporting rank's own


def test_checkpoints_are_evented_when_complete_retained_and_carry_their_spec(
    ddp_run: tuple[Path, list[dict[str, Any]]], corpus_dir: Path
) -> None:
    workdir, events = ddp_run
    saved = [e for e in events if e["type"] == "checkpoint"]
    assert [e["step"] for e in saved] == list(range(10, MAX_STEPS + 1, 10))
    assert all(e["size_bytes"] > 100_000 for e in saved)  # 120k fp32 params + AdamW state
    last = workdir / "ckpt" / f"step_{MAX_STEPS:08d}"
    assert statuses(events)[-1]["data"]["checkpoint_uri"] == str(last)
    kept = sorted(p.name for p in (workdir / "ckpt").iterdir())
    assert kept == [f"step_{MAX_STEPS - 10:08d}", f"step_{MAX_STEPS:08d}"]  # keep_last 2
    files = {p.name for p in last.iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "spec.json"} <= files
    assert JobSpec.load(last / "spec.json") == ddp_spec(corpus_dir)


def test_run_resumed_after_a_crash_follows_the_uninterrupted_loss_curve(
    ddp_run: tuple[Path, list[dict[str, Any]]], corpus_dir: Path, tmp_path: Path
) -> None:
    _, reference = ddp_run
    spec = ddp_spec(corpus_dir)
    crashed = run_trainer(spec, tmp_path, nproc=2, crash_after_step=13)
    assert crashed.returncode == 1, explain(crashed)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000010"]
    resumed = run_trainer(spec, tmp_path, nproc=2, env={"TORCHYARD_ATTEMPT": "1"})
    assert resumed.returncode == 0, explain(resumed)

    events = read_events(tmp_path / "run")
    assert max(train_losses(events, attempt=0)) == 13
    running = next(e for e in statuses(events) if e["attempt"] == 1)
    assert running["state"] == "running" and running["data"]["start_step"] == 10
    expected, got = train_losses(reference), train_losses(events, attempt=1)
    assert sorted(got) == list(range(11, MAX_STEPS + 1))
    worst = max(abs(got[s] - expected[s]) for s in got)
    assert worst <= RESUME_TOLERANCE, worst
    final = statuses(events)[-1]["data"]
    assert math.isclose(
        final["final_eval_loss"],
        statuses(reference)[-1]["data"]["final_eval_loss"],
        abs_tol=RESUME_TOLERANCE,
    )
    sample = [e["text"] for e in events if e["type"] == "sample"]
    assert sample == [e["text"] for e in reference if e["type"] == "sample"]


def test_single_process_takes_the_same_global_batches_as_ddp(
    ddp_run: tuple[Path, list[dict[str, Any]]], corpus_dir: Path, tmp_path: Path
) -> None:
    """1 process x 16 sequences == 2 ranks x 2 micro-steps x 4 sequences, step by step."""
    _, reference = ddp_run
    spec = tiny_spec(
        corpus_dir,
        train={"micro_batch_size": 16, "grad_accum_steps": 1, "max_steps": 5},
        eval={"interval_steps": 5},
    )
    proc = run_trainer(spec, tmp_path, nproc=None)
    assert proc.returncode == 0, explain(proc)
    events = read_events(tmp_path / "run")
    single, ddp = train_losses(events), train_losses(reference)
    assert sorted(single) == [1, 2, 3, 4, 5]
    for step, loss in single.items():
        assert loss == pytest.approx(ddp[step], rel=LAYOUT_TOLERANCE), step
    single_norms, ddp_norms = grad_norms(events), grad_norms(reference)
    assert sorted(single_norms) == [1, 2, 3, 4, 5]  # logged every step: not a vacuous loop
    for step, norm in single_norms.items():
        assert norm == pytest.approx(ddp_norms[step], rel=LAYOUT_TOLERANCE), step


def grad_norms(events: list[dict[str, Any]]) -> dict[int, float]:
    return {
        e["step"]: e["values"]["grad_norm"]
        for e in events
        if e["type"] == "metric" and "grad_norm" in e["values"]
    }


def _run_until_training_then_sigterm(cmd: list[str]) -> tuple[int, str]:
    """Start `cmd`, wait (by reading its log) for the 3rd training step, SIGTERM it."""
    proc = start_trainer(cmd)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "trainer.loop: step 3 loss" in line:
            proc.send_signal(signal.SIGTERM)
            break
    else:
        proc.kill()
    out = "".join(seen) + proc.stdout.read()
    return proc.wait(timeout=RUN_TIMEOUT_S), out


def _assert_stopped_with_checkpoint(workdir: Path, shards: set[str]) -> None:
    events = read_events(workdir / "run")
    assert [e["state"] for e in statuses(events)] == ["running", "stopped"]
    stopped = statuses(events)[-1]
    step = stopped["data"]["step"]
    assert step >= 3
    assert max(train_losses(events)) == step  # stopped at the step boundary after SIGTERM
    ckpt = workdir / "ckpt" / f"step_{step:08d}"
    assert stopped["data"]["checkpoint_uri"] == str(ckpt)
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [step]
    assert {".metadata", *shards} <= {p.name for p in ckpt.iterdir()}


def test_sigterm_stops_a_single_process_at_a_step_boundary_with_a_checkpoint(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(corpus_dir, train={"max_steps": 100_000}, checkpoint={"interval_steps": 1000})
    spec.dump(tmp_path / "spec.json")
    cmd = trainer_command(tmp_path / "spec.json", tmp_path / "run", tmp_path / "ckpt", nproc=None)
    rc, out = _run_until_training_then_sigterm(cmd)
    assert rc == 0, out
    _assert_stopped_with_checkpoint(tmp_path, {"__0_0.distcp"})


def test_sigterm_forwarded_by_torchrun_stops_every_rank_at_the_same_step(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """torchrun forwards SIGTERM to the ranks; they agree on the step and save together.

    torchrun itself then exits 1 (its own SignalException), whatever the ranks' codes:
    the `stopped` event, not torchrun's exit code, is what tells a clean stop.
    """
    spec = ddp_spec(
        corpus_dir,
        train={"max_steps": 100_000},
        eval={"interval_steps": 1000},
        checkpoint={"interval_steps": 1000},
    )
    spec.dump(tmp_path / "spec.json")
    cmd = trainer_command(tmp_path / "spec.json", tmp_path / "run", tmp_path / "ckpt", nproc=2)
    _run_until_training_then_sigterm(cmd)
    _assert_stopped_with_checkpoint(tmp_path, {"__0_0.distcp", "__1_0.distcp"})
