"""`torchyard.train` in one process without torch.distributed: where it writes, what marks a
checkpoint complete, which one is the latest, retention, rank 0 only, the stop flag, and the
runner's argument parsing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import torchyard.train as ty
from torchyard.train.__main__ import Target, parse_argv

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process's state of its own for each test, and none of the platform's variables."""
    for name in list(os.environ):
        if name.startswith("TORCHYARD_") or name in ("RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(ty, "_state", ty._State())
    yield
    for writer in (ty._state.reporter, ty._state.part_writer):
        if writer is not None:
            writer.close()


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHYARD_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TORCHYARD_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    return tmp_path


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def complete(step: int, payload: bytes = b"x") -> Path:
    path = ty.checkpoint_dir(step)
    (path / "state.pt").write_bytes(payload)
    ty.completed_checkpoint(path)
    return path


def test_off_platform_everything_goes_under_torchyard_run_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ty.report(1, loss=2.0)
    path = complete(1)
    assert path == Path("torchyard_run/checkpoints/step_00000001")
    assert [e["type"] for e in events(tmp_path / "torchyard_run")] == ["metric", "checkpoint"]
    assert ty.latest_checkpoint() == path


def test_checkpoint_dir_is_created_under_the_platforms_directory(platform: Path) -> None:
    path = ty.checkpoint_dir(7)
    assert path == platform / "ckpt" / "step_00000007"
    assert path.is_dir()
    with pytest.raises(ValueError, match="step must be >= 0"):
        ty.checkpoint_dir(-1)


def test_completed_checkpoint_marks_it_and_reports_its_step_uri_and_size(platform: Path) -> None:
    path = complete(5, b"12345678")
    assert (path / ".torchyard_complete").exists()
    (event,) = events(platform / "run")
    assert (event["type"], event["step"], event["uri"]) == ("checkpoint", 5, str(path))
    assert event["size_bytes"] == 8


def test_completed_checkpoint_refuses_a_directory_not_named_by_step(platform: Path) -> None:
    (platform / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="not a checkpoint_dir"):
        ty.completed_checkpoint(platform / "elsewhere")
    with pytest.raises(ValueError, match="not a checkpoint_dir"):
        ty.completed_checkpoint(platform / "ckpt" / "step_00000003")  # never created


def test_latest_checkpoint_is_the_highest_complete_step(platform: Path) -> None:
    assert ty.latest_checkpoint() is None  # no directory yet
    complete(20)
    complete(100)
    ty.checkpoint_dir(300)  # being written: no marker
    (platform / "ckpt" / "notes").mkdir()
    assert ty.latest_checkpoint() == platform / "ckpt" / "step_00000100"
    dcp = ty.checkpoint_dir(200)
    (dcp / ".metadata").write_bytes(b"")  # what torch.distributed.checkpoint writes last
    assert ty.latest_checkpoint() == dcp
    trainer_dir = platform / "ckpt" / "checkpoint-250"  # transformers.Trainer's name
    trainer_dir.mkdir()
    ty.completed_checkpoint(trainer_dir)
    assert ty.latest_checkpoint() == trainer_dir
    assert ty.checkpoint_step(trainer_dir) == 250


def test_retention_deletes_the_oldest_complete_checkpoints_beyond_keep_last(
    platform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_KEEP_LAST_CHECKPOINTS", "2")
    in_progress = ty.checkpoint_dir(1)  # incomplete: not counted, not deleted
    for step in (10, 20, 30, 40):
        complete(step)
    left = sorted(p.name for p in (platform / "ckpt").iterdir())
    assert left == ["step_00000001", "step_00000030", "step_00000040"]
    assert in_progress.exists()
    deleted = [e for e in events(platform / "run") if e["type"] == "checkpoint_deleted"]
    assert [(e["step"], e["uri"]) for e in deleted] == [
        (10, str(platform / "ckpt" / "step_00000010")),
        (20, str(platform / "ckpt" / "step_00000020")),
    ]


def test_only_rank_0_writes_events_and_marks_checkpoints(
    platform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    ty.report(1, loss=1.0)
    ty.log_event("hello")
    path = complete(1)
    assert not (platform / "run" / "events.jsonl").exists()
    assert not (path / ".torchyard_complete").exists()


@pytest.mark.parametrize(
    ("local_rank", "parts", "declared"), [(0, True, True), (1, True, False), (0, False, False)]
)
def test_another_nodes_local_rank_0_declares_its_part_where_nodes_stage_their_own(
    platform: Path, monkeypatch: pytest.MonkeyPatch, local_rank: int, parts: bool, declared: bool
) -> None:
    """Several nodes on remote storage: each host stages its ranks' files, and its worker
    uploads them on a `checkpoint_part` event of its own node (workers.entrypoint.staging)."""
    monkeypatch.setenv("RANK", str(2 + local_rank))  # node 1 of 2-process nodes
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    if parts:
        monkeypatch.setenv("TORCHYARD_CHECKPOINT_PARTS", "1")
    path = complete(7)
    written = events(platform / "run")
    expected = [("checkpoint_part", 7, str(path.resolve()))] if declared else []
    assert [(e["type"], e["step"], e["uri"]) for e in written] == expected
    assert not (path / ".torchyard_complete").exists()  # node 0's worker marks it


def test_report_keeps_finite_values_and_log_event_one_line(platform: Path) -> None:
    ty.report(3, loss=1.5, grad_norm=float("nan"), lr=1)
    ty.log_event("line one\nline two " + "x" * 3000, rows=7)
    metric, info = events(platform / "run")
    assert metric["values"] == {"loss": 1.5, "lr": 1.0}
    assert info["type"] == "info"
    assert info["message"].startswith("line one line two x")
    assert len(info["message"]) == 2000
    assert info["data"] == {"rows": 7}
    with pytest.raises(ValueError, match="step must be >= 0"):
        ty.report(-1, loss=1.0)


def test_set_max_steps_writes_a_plan_event_and_refuses_what_is_not_a_step_count(
    platform: Path,
) -> None:
    ty.set_max_steps(120)
    ty.set_max_steps(80)  # the plan changed: the newest counts
    assert [(e["type"], e["max_steps"]) for e in events(platform / "run")] == [
        ("plan", 120),
        ("plan", 80),
    ]
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        ty.set_max_steps(0)
    for wrong in (12.5, "12", True):
        with pytest.raises(TypeError, match="max_steps must be an int"):
            ty.set_max_steps(wrong)  # type: ignore[arg-type]
    assert len(events(platform / "run")) == 2


def test_should_stop_turns_true_after_sigterm_once_the_handler_is_installed() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ty.install_stop_handler()
        assert not ty.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert ty.should_stop()
    finally:
        signal.signal(signal.SIGTERM, previous)


LATE_SIGTERM = """
import os, signal, sys
import torch.distributed as dist
import torchyard.train as ty

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
ty.install_stop_handler()
collective = dist.all_reduce


def sigterm_during(tensor, op):  # the SIGTERM lands while the collective runs
    collective(tensor, op=op)
    os.kill(os.getpid(), signal.SIGTERM)


dist.all_reduce = sigterm_during
first = ty.should_stop()
dist.all_reduce = collective
print(first, ty.should_stop())
dist.destroy_process_group()
"""


def test_a_sigterm_during_the_agreeing_all_reduce_stops_the_next_step(tmp_path: Path) -> None:
    """The handler of a SIGTERM that arrives inside `should_stop`'s all-reduce runs when the
    collective returns: that call answers what the ranks agreed on (no stop), the next one
    stops. (It used to overwrite the flag with the agreed value and lose the signal.)"""
    script = tmp_path / "late.py"
    script.write_text(LATE_SIGTERM)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_the_runner_parses_a_script_or_a_module_with_their_arguments() -> None:
    assert parse_argv(["train.py", "--lr", "3e-4"]) == Target("train.py", False, ["--lr", "3e-4"])
    assert parse_argv(["-m", "pkg.train", "-x"]) == Target("pkg.train", True, ["-x"])
    for bad in ([], ["-m"], ["-c", "print(1)"]):
        with pytest.raises(ValueError, match="usage"):
            parse_argv(bad)


MODULE = """
import sys
print(sys.argv[1:], sys.path[0] == __import__("os").getcwd(), __name__)
"""


def test_the_runner_runs_a_module_as_python_m_would(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(MODULE)
    done = subprocess.run(
        [sys.executable, "-m", "torchyard.train", "-m", "pkg.job", "--flag", "1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TORCHYARD_RUN_DIR": str(tmp_path / "run")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['--flag', '1'] True __main__"
    running, completed = events(tmp_path / "run")
    assert running["message"] == "running -m pkg.job"
    assert completed["data"] == {"steps": 0}


def test_inputs_on_the_platform_are_its_variables(
    platform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_INPUT_CORPUS", "/inputs/corpus")
    monkeypatch.setenv("TORCHYARD_INPUT_BASE_MODEL", "/inputs/base_model")
    assert ty.inputs() == {
        "base_model": Path("/inputs/base_model"),
        "corpus": Path("/inputs/corpus"),
    }
    assert ty.input_path("corpus") == Path("/inputs/corpus")
    # A path given on the command line is only the fallback.
    assert ty.input_path("corpus", "/elsewhere") == Path("/inputs/corpus")
    with pytest.raises(KeyError, match=r"no input 'model' \(declared: base_model, corpus\)"):
        ty.input_path("model")


def test_inputs_off_platform_come_from_inputs_json_then_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert ty.inputs() == {}
    assert ty.input_path("model", "/models/llama") == Path("/models/llama")
    (tmp_path / "torchyard_run").mkdir()
    (tmp_path / "torchyard_run" / "inputs.json").write_text('{"corpus": "/data/corpus.txt"}')
    monkeypatch.setenv("TORCHYARD_INPUT_MODEL", "/models/by-hand")
    assert ty.inputs() == {"corpus": Path("/data/corpus.txt"), "model": Path("/models/by-hand")}
    (tmp_path / "torchyard_run" / "inputs.json").write_text('["not", "a", "map"]')
    with pytest.raises(ValueError, match="no JSON object of paths"):
        ty.inputs()
