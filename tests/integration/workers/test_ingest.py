"""What the worker stores from a run's files: complete lines once, torn ones never half."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.db import session_factory
from core.platform.tables import JobState
from tests.integration.workers.helpers import (
    job_events,
    job_row,
    log_lines,
    metric_series,
)
from workers.ingest import RESTART_OFFSET_STRIDE, JobLost, RunIngest
from workers.launcher import RunPaths


def _event(kind: str, **fields: object) -> bytes:
    return json.dumps({"type": kind, "time": 1.0, "attempt": 1, **fields}).encode() + b"\n"


def test_flush_stores_complete_lines_once_and_the_final_one_only_at_the_end(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    rank0 = tmp_path / "logs" / "job1-a1_abc" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_bytes(b"hello\nbad \x00 byte \xff\npartial")
    paths.launcher_log("stderr").write_bytes(b"launcher says\n")
    paths.events.write_bytes(
        _event("status", state="running", message="go", data={"start_step": 0})
        + b"".join(_event("metric", step=s, values={"loss": 5.0 - s, "lr": 0.1}) for s in (1, 2))
        + _event("metric", step=3, values={"loss": float("nan"), "grad_norm": 1.5})
        + _event("checkpoint", step=2, uri="ckpt/step_00000002", size_bytes=10)
        + _event("sample", step=3, prompt="def ", text="x\u0000y")
        + _event("export", step=3, format="peft_adapter", uri="ckpt/lora/a", size_bytes=7)
        + _event(
            "data",
            format="messages",
            loss_on="assistant",
            cached=False,
            train={"rows": 40, "dropped": 1},
            eval={"rows": 3},
        )
        + b'{"type": "metric", "step": 4, "val'  # torn: the writer died mid-line
    )
    ingest = RunIngest(paths=paths, job_id=claimed_job, attempt=1)
    factory = session_factory(engine)

    assert ingest.flush(factory) == JobState.RUNNING
    assert [(p.step, p.value) for p in metric_series(engine, claimed_job, "loss")] == [
        (1, 4.0),
        (2, 3.0),
    ]  # NaN is not stored
    assert [p.step for p in metric_series(engine, claimed_job, "grad_norm")] == [3]
    events = job_events(engine, claimed_job)
    assert [e.state_to for e in events if e.kind == "state"][-1] == "running"
    (checkpoint,) = [e for e in events if e.kind == "checkpoint"]
    assert checkpoint.data == {"step": 2, "uri": "ckpt/step_00000002", "size_bytes": 10}
    (sample,) = [e for e in events if e.kind == "sample"]
    assert sample.data["text"] == "x\ufffdy"
    (export,) = [e for e in events if e.kind == "info" and e.data.get("uri")]
    assert export.message == "exported peft_adapter at step 3"
    assert export.data == {
        "step": 3,
        "format": "peft_adapter",
        "uri": "ckpt/lora/a",
        "size_bytes": 7,
    }
    (data,) = [e for e in events if e.kind == "info" and "loss_on" in e.data]
    assert data.message == (
        "data tokenized: messages, loss on assistant; 40 training and 3 evaluation rows"
    )
    assert data.data["train"] == {"rows": 40, "dropped": 1}
    assert [(x.rank, x.offset, x.line) for x in log_lines(engine, claimed_job)] == [
        (-1, 0, "launcher says"),
        (0, 0, "hello"),
        (0, 6, "bad \ufffd byte \ufffd"),
    ]
    assert ingest.pending()

    ingest.flush(factory, final=True)
    assert not ingest.pending()
    assert log_lines(engine, claimed_job)[-1].line == "partial"
    ingest.flush(factory, final=True)  # nothing new: nothing stored twice
    assert len(log_lines(engine, claimed_job)) == 4
    assert len(job_events(engine, claimed_job)) == len(events)
    assert job_row(engine, claimed_job).current_step == 3


def test_flush_refuses_a_job_that_is_no_longer_this_attempts(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    paths.events.write_bytes(_event("metric", step=1, values={"loss": 1.0}))
    with Session(engine) as s:
        jobs.transition(session=s, job_id=claimed_job, to=JobState.FAILED, message="reaped")
        s.commit()
    with pytest.raises(JobLost):
        RunIngest(paths=paths, job_id=claimed_job, attempt=1).flush(session_factory(engine))
    assert metric_series(engine, claimed_job, "loss") == []


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        # a job by epochs: the trainer's `running` carries the steps it resolved
        (_event("status", state="running", message="go", data={"max_steps": 37}), 37),
        # a script's `set_max_steps`, changed once it knew better
        (_event("plan", max_steps=90) + _event("plan", max_steps=120), 120),
        # what is not a step count changes nothing
        (_event("plan", max_steps=-3) + _event("plan", max_steps=True), None),
        (_event("plan", max_steps="50") + _event("plan"), None),
    ],
)
def test_the_runs_own_step_count_becomes_the_jobs_max_steps(
    engine: Engine, claimed_job: int, tmp_path: Path, reported: bytes, expected: int | None
) -> None:
    before = job_row(engine, claimed_job).max_steps
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    paths.events.write_bytes(reported)
    RunIngest(paths=paths, job_id=claimed_job, attempt=1).flush(session_factory(engine))
    assert job_row(engine, claimed_job).max_steps == (before if expected is None else expected)


def test_lines_of_every_inplace_restart_are_stored_once_and_the_restart_is_an_event(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    """torchrun's restart N of the worker group writes `attempt_N/<rank>/` files that start at
    byte 0 again: their lines are kept apart from restart 0's, not taken for re-reads."""
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    logs = tmp_path / "logs" / "job1-a1_abc"
    (logs / "attempt_0" / "0").mkdir(parents=True)
    (logs / "attempt_0" / "0" / "stdout.log").write_bytes(b"step 1\ncrash\n")
    paths.events.write_bytes(
        _event("status", state="running", message="go", data={"start_step": 0, "restart": 0})
        + _event("metric", step=1, values={"loss": 4.0})
    )
    ingest = RunIngest(paths=paths, job_id=claimed_job, attempt=1)
    factory = session_factory(engine)
    ingest.flush(factory)

    (logs / "attempt_1" / "0").mkdir(parents=True)
    (logs / "attempt_1" / "0" / "stdout.log").write_bytes(b"step 1\nstep 2\n")
    with paths.events.open("ab") as f:
        f.write(
            _event("status", state="running", message="go", data={"start_step": 0, "restart": 1})
            + _event("metric", step=1, values={"loss": 4.0})
            + _event("metric", step=2, values={"loss": 3.0})
        )
    ingest.flush(factory)
    ingest.flush(factory, final=True)

    assert [(x.offset, x.line) for x in log_lines(engine, claimed_job) if x.rank == 0] == [
        (0, "step 1"),
        (7, "crash"),
        (RESTART_OFFSET_STRIDE, "step 1"),
        (RESTART_OFFSET_STRIDE + 7, "step 2"),
    ]
    assert [(p.step, p.value) for p in metric_series(engine, claimed_job, "loss")] == [
        (1, 4.0),
        (2, 3.0),
    ]
    events = job_events(engine, claimed_job)
    assert [e.state_to for e in events if e.kind == "state"] == ["queued", "starting", "running"]
    (restarted,) = [e for e in events if e.kind == "info"]
    assert restarted.message == "ranks restarted in place (restart 1); go"
    assert (restarted.attempt, restarted.data["restart"]) == (1, 1)


def test_a_rank_slow_in_three_reports_in_a_row_is_one_straggler_event_naming_it_and_its_worker(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    slow = [0.1, 0.1, 0.1, 0.35]
    paths.events.write_bytes(
        b"".join(_event("rank_step_times", step=s, seconds=slow) for s in (1, 2, 3, 4))
        + _event("rank_step_times", step=5, seconds=[0.1] * 4)  # recovered
        + b"".join(_event("rank_step_times", step=s, seconds=slow) for s in (6, 7))
        + _event("rank_step_times", step=8, seconds=[0.1, None, 0.1, 0.35])  # skipped
        + _event("rank_step_times", step="9", seconds=slow)  # skipped
    )
    ingest = RunIngest(paths=paths, job_id=claimed_job, attempt=1)
    ingest.flush(session_factory(engine))
    ingest.flush(session_factory(engine))  # nothing new: no second event

    (straggler,) = [e for e in job_events(engine, claimed_job) if e.kind == "straggler"]
    assert straggler.data == {
        "rank": 3,
        "worker": "in-process",
        "host": None,
        "step": 3,
        "seconds": 0.35,
        "median_s": 0.1,
    }
    assert straggler.message.startswith("straggler: rank 3 on in-process took 0.35 s per step")
    assert "3.5x the median 0.1 s" in straggler.message


def test_step_progress_is_read_from_the_files_even_while_the_database_is_unreachable(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    paths.events.write_bytes(
        b"".join(_event("metric", step=s, values={"loss": 1.0}) for s in (1, 2))
    )
    ingest = RunIngest(paths=paths, job_id=claimed_job, attempt=1)

    def unreachable() -> Session:
        raise OSError("database unreachable")

    with pytest.raises(OSError):
        ingest.flush(unreachable)
    assert ingest.progress.step == 2 and ingest.progress.observed_at is not None


def test_the_data_event_says_what_of_the_text_was_not_read(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    """Issue 45, item 1: a `text` job on a directory names in its events the files it left
    out as not UTF-8 text and the files it read without their stray bytes."""
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    left_out = {
        "files": 189,
        "bytes": 65_077_704,
        "examples": [{"path": "a.whl", "size_bytes": 9, "reason": "a.whl: byte 6 ..."}],
        "repaired": [{"path": "b.py", "bytes_dropped": 2}],
        "repaired_files": 1,
    }
    sides = {"train": {"rows": 272_209}, "eval": {"rows": 16_130}}
    event = _event("data", format="text", loss_on="all", cached=False, left_out=left_out, **sides)
    paths.events.write_bytes(event)
    RunIngest(paths=paths, job_id=claimed_job, attempt=1).flush(session_factory(engine))
    (data,) = [e for e in job_events(engine, claimed_job) if e.data.get("format") == "text"]
    assert data.message == (
        "data tokenized: text, loss on all; 272209 training and 16130 evaluation rows; "
        "189 files not UTF-8 text, not read (65.1 MB); stray bytes dropped from 1 text files"
    )
    assert data.data["left_out"] == left_out


def test_a_flush_with_nothing_new_opens_no_transaction_and_moves_past_lines_with_nothing_to_store(
    engine: Engine, claimed_job: int, tmp_path: Path
) -> None:
    """A quiet job costs the database nothing between its heartbeats: the supervise loop's
    flush every `ingest_interval_s` opens a transaction only for something to store."""
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    paths.events.write_bytes(_event("metric", step=1, values={"loss": 4.0}))
    ingest = RunIngest(paths=paths, job_id=claimed_job, attempt=1)
    opened: list[Session] = []

    def factory() -> Session:
        session = session_factory(engine)()
        opened.append(session)
        return session

    assert ingest.flush(factory) is not None and ingest.reported.step == 1
    assert len(opened) == 1
    assert ingest.flush(factory) is None  # nothing new
    with paths.events.open("ab") as f:  # a bad line and another node's part: nothing to store
        f.write(b"not json\n" + _event("checkpoint_part", step=2, node_rank=1))
    assert ingest.flush(factory) is None and len(opened) == 1
    stored = ingest.stored_bytes()
    assert stored == paths.events.stat().st_size and not ingest.pending()  # read past them
    with paths.events.open("ab") as f:
        f.write(_event("metric", step=2, values={"loss": 3.0}))
    assert ingest.flush(factory) is not None and len(opened) == 2
    assert [(p.step, p.value) for p in metric_series(engine, claimed_job, "loss")] == [
        (1, 4.0),
        (2, 3.0),
    ]
    ingest.flush(factory, final=True)  # the final flush asks whether the attempt is ours
    assert len(opened) == 3
