"""Checkpoint selection, retention, and an in-process save/resume round trip (DCP)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dataformat.errors import CheckpointWriteError
from jobspec.job import CheckpointSpec
from tests.support.training import (
    build_local_run,
    build_rows_run,
    cpu_world_of_one,
    read_events,
    tiny_spec,
    uneven_rows,
)
from trainer.checkpoint.checkpointer import Checkpointer, latest_complete, list_checkpoints
from trainer.events import EventWriter, NullReporter
from trainer.loop import Run, train_loop, train_step


def _make(root: Path, step: int, *, complete: bool) -> None:
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if complete:
        (path / ".metadata").write_bytes(b"m")


def test_latest_complete_checkpoint_ignores_directories_without_metadata(tmp_path: Path) -> None:
    assert latest_complete(str(tmp_path / "absent")) is None
    _make(tmp_path, 10, complete=True)
    _make(tmp_path, 20, complete=False)  # a save that never finished
    (tmp_path / "step_30").mkdir()  # not ours
    (tmp_path / "notes").write_text("x")
    found = latest_complete(str(tmp_path))
    assert found is not None
    assert (found.step, found.uri) == (10, str(tmp_path / "step_00000010"))
    assert [(c.step, c.complete) for c in list_checkpoints(str(tmp_path))] == [
        (10, True),
        (20, False),
    ]


def test_retention_keeps_the_newest_complete_and_never_a_newer_incomplete(
    tmp_path: Path,
) -> None:
    for step in (10, 20, 30, 40):
        _make(tmp_path, step, complete=True)
    _make(tmp_path, 25, complete=False)  # debris of a crashed attempt
    _make(tmp_path, 50, complete=False)  # possibly being written
    checkpointer = Checkpointer(
        root=str(tmp_path),
        spec=CheckpointSpec(keep_last=2),
        states={},
        rank_states={},
        job_spec_json="{}",
        dist_info=cpu_world_of_one(),
        reporter=NullReporter(),
    )
    checkpointer._apply_retention()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000030",
        "step_00000040",
        "step_00000050",
    ]


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_restores_model_optimizer_schedule_data_position_and_rng(
    async_save: bool, corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        corpus_dir,
        model={"dropout": 0.1},  # so the RNG state matters for the loss
        optim={"schedule": "cosine", "warmup_steps": 2},
        train={"micro_batch_size": 4, "max_steps": 10},
        checkpoint={"async_save": async_save},
    )
    reporter = EventWriter(tmp_path / "run")
    first = build_local_run(spec, tmp_path / "ckpt", reporter)
    for _ in range(3):
        train_step(first)
        first.state.step += 1
    first.checkpointer.save(3, force=True)
    first.checkpointer.wait()
    expected = [float(train_step(first)[0]) for _ in range(3)]

    torch.manual_seed(999)  # a different RNG state, which the checkpoint must overwrite
    resumed = build_local_run(spec, tmp_path / "ckpt")
    assert resumed.checkpointer.load_latest() == 3
    assert resumed.state.step == 3
    assert resumed.sampler.state_dict() == {"epoch": 0, "offset": 12}
    assert resumed.scheduler.last_epoch == 3
    assert [float(train_step(resumed)[0]) for _ in range(3)] == expected

    reporter.close()
    (event,) = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    ckpt = tmp_path / "ckpt" / "step_00000003"
    assert event == {**event, "type": "checkpoint", "step": 3, "uri": str(ckpt)}
    assert event["size_bytes"] == sum(p.stat().st_size for p in ckpt.iterdir())
    assert json.loads((ckpt / "spec.json").read_text()) == spec.model_dump(mode="json")


EPOCHS_TRAIN = {"micro_batch_size": 4, "epochs": 2, "max_steps": None}  # 10 rows: 5 steps


def _recorded_steps(run: Run, steps: int) -> tuple[list[list[int]], list[float]]:
    """Run `steps` train steps; (each step's global batch of row indices, its loss)."""
    order: list[list[int]] = []
    take = run.sampler.next_global_batch

    def recording() -> np.ndarray:
        batch = take()
        order.append(batch.tolist())
        return batch

    run.sampler.next_global_batch = recording  # type: ignore[method-assign]
    losses = [float(train_step(run)[0]) for _ in range(steps)]
    return order, losses


def test_epochs_govern_the_step_count_and_are_reported(corpus_dir: Path, tmp_path: Path) -> None:
    spec = tiny_spec(corpus_dir, train=EPOCHS_TRAIN, sample={"max_new_tokens": 1})
    rows = uneven_rows(10, 64, seed=0)
    reporter = EventWriter(tmp_path / "run")
    run = build_rows_run(spec, rows, tmp_path / "ckpt", cpu_world_of_one(), reporter)
    assert run.max_steps == 5  # ceil(2 epochs x 10 rows / 4 per step)
    train_loop(run)
    reporter.close()
    events = read_events(tmp_path / "run")
    epochs = [e["values"]["epoch"] for e in events if "epoch" in e.get("values", {})]
    assert epochs == pytest.approx([0.4, 0.8, 1.2, 1.6, 2.0])
    assert events[-1]["data"]["steps"] == 5


def test_a_run_by_epochs_resumes_mid_epoch_with_the_same_row_order(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(corpus_dir, train=EPOCHS_TRAIN)
    rows = uneven_rows(10, 64, seed=0)
    first = build_rows_run(spec, rows, tmp_path / "ckpt", cpu_world_of_one())
    _recorded_steps(first, 3)  # 12 rows: epoch 1, 2 rows in
    first.state.step = 3
    first.checkpointer.save(3, force=True)
    first.checkpointer.wait()
    expected_order, expected_losses = _recorded_steps(first, 2)

    resumed = build_rows_run(spec, rows, tmp_path / "ckpt", cpu_world_of_one())
    assert resumed.checkpointer.load_latest() == 3
    assert resumed.sampler.state_dict() == {"epoch": 1, "offset": 2}
    order, losses = _recorded_steps(resumed, 2)
    assert order == expected_order
    assert losses == expected_losses
    assert order[0] == resumed.sampler.permutation(1)[2:6].tolist()  # epoch 1's shuffle


@pytest.mark.parametrize("async_save", [False, True])
def test_a_write_the_storage_refuses_inside_dcp_is_a_checkpoint_write_error(
    async_save: bool, tmp_path: Path
) -> None:
    """DCP reports a failed write (a full, read-only or failing disk) as CheckpointException,
    a BaseException: `except Exception` in the trainer and in torchrun's `@record` would let
    it through, leaving no error event and no error file to classify the failure by."""
    (tmp_path / "step_00000001" / "__0_0.distcp").mkdir(parents=True)  # no file can go there
    checkpointer = Checkpointer(
        root=str(tmp_path),
        spec=CheckpointSpec(interval_steps=1, async_save=async_save),
        states={"model": torch.nn.Linear(2, 2)},
        rank_states={},
        job_spec_json="{}",
        dist_info=cpu_world_of_one(),
        reporter=NullReporter(),
    )
    with pytest.raises(CheckpointWriteError) as raised:
        checkpointer.save(1)
        checkpointer.wait()
    assert "checkpoint at step 1" in str(raised.value)
    assert "Is a directory" in str(raised.value)
    assert isinstance(raised.value.__cause__, IsADirectoryError)  # classified by its errno
