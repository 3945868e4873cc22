"""The FSDP2 and `transformers.Trainer` examples under the runner and real torchrun (2 CPU
processes over gloo): each completes with its checkpoints known to the platform and a second
run resumes from the newest one; the Trainer's callback turns SIGTERM into save-and-stop."""

from __future__ import annotations

from pathlib import Path

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


def test_fsdp2_example_saves_dcp_checkpoints_and_resumes_from_the_newest(tmp_path: Path) -> None:
    code = EXAMPLES / "fsdp2"
    rc, out, events = run_script(code, tmp_path, ["--max-steps", "8", "--checkpoint-every", "4"])
    assert rc == 0, out
    assert states(events) == ["running", "completed"]
    assert [e["step"] for e in of_type(events, "checkpoint")] == [4, 8]
    saved = {p.name for p in (tmp_path / "ckpt" / "step_00000008").iterdir()}
    assert {".metadata", ".torchyard_complete", "__0_0.distcp", "__1_0.distcp"} <= saved

    args = ["--max-steps", "11", "--checkpoint-every", "4"]
    rc, out, events = run_script(code, tmp_path, args, TORCHYARD_ATTEMPT="1")
    assert rc == 0, out
    assert states(events, attempt=1) == ["running", "completed"]
    assert of_type(events, "status", attempt=1)[0]["data"]["start_step"] == 8
    assert metric_steps(events, attempt=1) == [9, 10, 11]
    assert of_type(events, "checkpoint", attempt=1)[-1]["step"] == 11


def test_hf_trainer_example_stops_on_sigterm_with_a_checkpoint_and_resumes_from_it(
    tmp_path: Path,
) -> None:
    code = EXAMPLES / "hf_trainer"
    proc = start_script(code, tmp_path, ["--max-steps", "100000", "--save-steps", "1000"])
    sigterm_when(proc, tmp_path / "run", lambda events: len(metric_steps(events)) >= 2)
    events = read_events(tmp_path / "run")
    assert states(events) == ["running", "stopped"]
    step = of_type(events, "status")[-1]["data"]["step"]
    assert step >= 2
    # the callback had the Trainer save at the stop (not at a save_steps multiple)
    (checkpoint,) = of_type(events, "checkpoint")
    assert checkpoint["step"] == step
    assert checkpoint["uri"] == str(tmp_path / "ckpt" / f"checkpoint-{step}")
    assert {"loss", "grad_norm", "learning_rate"} <= of_type(events, "metric")[0]["values"].keys()
    # the callback declared the Trainer's step count (the job's progress and ETA)
    assert [e["max_steps"] for e in of_type(events, "plan")] == [100000]

    args = ["--max-steps", str(step + 2), "--save-steps", "1000"]
    rc, out, events = run_script(code, tmp_path, args, TORCHYARD_ATTEMPT="1")
    assert rc == 0, out
    assert states(events, attempt=1) == ["running", "completed"]
    assert of_type(events, "status", attempt=1)[0]["data"]["start_step"] == step
    assert metric_steps(events, attempt=1)[0] == step + 1  # the Trainer resumed, not restarted
    assert [e["max_steps"] for e in of_type(events, "plan", attempt=1)] == [step + 2]
