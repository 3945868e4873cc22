"""User scripts under the runner (`python -m torchyard.train`), run by real torchrun processes
over gloo on CPU, as the worker runs them but without the server: the events they leave,
SIGTERM stops, resumes from their own checkpoints, failures, and stop agreement."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent

from tests.integration.scripts import (
    EXAMPLES,
    metric_steps,
    of_type,
    read_events,
    run_script,
    sigterm_when,
    start_script,
    states,
)

DDP = EXAMPLES / "ddp"


def test_ddp_example_reports_checkpoints_with_retention_and_completes(tmp_path: Path) -> None:
    args = ["--max-steps", "30", "--checkpoint-every", "10"]
    rc, out, events = run_script(DDP, tmp_path, args, TORCHYARD_KEEP_LAST_CHECKPOINTS="2")
    assert rc == 0, out
    assert states(events) == ["running", "completed"]
    running, completed = of_type(events, "status")
    assert running["data"] == {"world_size": 2, "restart": 0, "start_step": 0, "entrypoint": True}
    assert metric_steps(events) == list(range(1, 31))  # rank 0's reports only
    assert completed["data"]["steps"] == 30
    assert completed["data"]["final_loss"] == of_type(events, "metric")[-1]["values"]["loss"]
    assert [e["step"] for e in of_type(events, "checkpoint")] == [10, 20, 30]
    assert [e["step"] for e in of_type(events, "checkpoint_deleted")] == [10]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step_00000020",
        "step_00000030",
    ]
    last = of_type(events, "checkpoint")[-1]
    assert last["uri"] == str(tmp_path / "ckpt" / "step_00000030")
    assert last["size_bytes"] == (tmp_path / "ckpt" / "step_00000030" / "state.pt").stat().st_size


def test_sigterm_stops_the_ddp_example_with_a_checkpoint_and_the_next_run_resumes_from_it(
    tmp_path: Path,
) -> None:
    proc = start_script(DDP, tmp_path, ["--max-steps", "100000", "--checkpoint-every", "5"])
    sigterm_when(proc, tmp_path / "run", lambda events: bool(of_type(events, "checkpoint")))
    events = of_type(read_events(tmp_path / "run"), "status")
    assert [e["state"] for e in events] == ["running", "stopped"]
    stopped = events[-1]
    all_events = read_events(tmp_path / "run")
    step = stopped["data"]["step"]
    assert step == max(metric_steps(all_events)) >= 5
    assert of_type(all_events, "checkpoint")[-1]["step"] == step  # saved at the stop
    assert stopped["data"]["checkpoint_uri"] == str(tmp_path / "ckpt" / f"step_{step:08d}")
    assert not of_type(all_events, "error")

    args = ["--max-steps", str(step + 4), "--checkpoint-every", "5"]
    rc, out, events = run_script(DDP, tmp_path, args, TORCHYARD_ATTEMPT="1")
    assert rc == 0, out
    assert states(events, attempt=1) == ["running", "completed"]
    assert of_type(events, "status", attempt=1)[0]["data"]["start_step"] == step
    assert metric_steps(events, attempt=1) == list(range(step + 1, step + 5))
    assert [e["message"] for e in of_type(events, "info", attempt=1)] == [
        f"resumed from step {step}"
    ]


def test_the_runner_exits_0_after_a_stop_and_writes_stopped(tmp_path: Path) -> None:
    """One process, no torchrun: the runner's own exit code after SIGTERM is 0."""
    proc = start_script(DDP, tmp_path, ["--max-steps", "100000"], nproc=None)
    rc, out = sigterm_when(proc, tmp_path / "run", lambda events: len(metric_steps(events)) >= 3)
    assert rc == 0, out
    assert states(read_events(tmp_path / "run")) == ["running", "stopped"]


RAISES = """
import torchyard.train as ty
ty.report(1, loss=2.5)
raise ValueError("bad row 7")
"""


def test_a_script_that_raises_writes_an_error_event_and_torchruns_error_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "crash.py").write_text(dedent(RAISES))
    rc, out, events = run_script(tmp_path / "code", tmp_path, [], script="crash.py")
    assert rc != 0
    assert states(events) == ["running"]
    (error,) = of_type(events, "error")
    assert error["message"] == "ValueError: bad row 7"
    assert error["failure_class"] == "user_error"
    assert (error["rank"], error["exit_code"], error["restart"]) == (0, 1, 0)
    assert error["traceback"].splitlines()[1].startswith('  File "crash.py", line 4')
    files = sorted((tmp_path / "run" / "logs").glob("*/attempt_0/*/error.json"))
    assert len(files) == 2  # every rank's
    for path in files:
        message = json.loads(path.read_text())["message"]
        assert message["message"] == "ValueError: bad row 7"
    assert "ValueError: bad row 7" in out  # the traceback on stderr


def test_a_nonzero_sys_exit_is_a_failure_with_exit_code_1(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "bail.py").write_text("import sys\nsys.exit(3)\n")
    rc, _, events = run_script(tmp_path / "code", tmp_path, [], script="bail.py", nproc=None)
    assert rc == 1
    assert [e["message"] for e in of_type(events, "error")] == ["SystemExit: 3"]


AGREES = """
import os, signal, sys
import torch
import torch.distributed as dist
import torchyard.train as ty

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(1, 1000):
    if rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is told to stop
    ty.report(step, loss=1.0)
    if ty.should_stop():
        break
with open(f"stopped_{rank}.txt", "w") as f:
    f.write(str(step))
dist.barrier()
dist.destroy_process_group()
"""


def test_should_stop_agrees_across_ranks_when_only_one_was_signalled(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "agree.py").write_text(dedent(AGREES))
    rc, out, events = run_script(code, tmp_path, [], script="agree.py")
    assert rc == 0, out
    assert [(code / f"stopped_{r}.txt").read_text() for r in (0, 1)] == ["3", "3"]
    assert states(events) == ["running", "stopped"]  # rank 0 stops although not signalled
