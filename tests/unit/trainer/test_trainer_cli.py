"""The trainer's command line and events file (docs/CONTRACTS.md sections 1 and 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.training import tiny_spec
from trainer.events import EventWriter, NullReporter
from trainer.train import main


def _main_exit_code(spec_path: Path, run_dir: Path, *extra: str) -> int:
    args = ["--spec", str(spec_path), "--run-dir", str(run_dir)]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--checkpoint-dir", str(run_dir / "ckpt"), *extra])
    return int(exit_info.value.code or 0)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unknown_field", "invalid spec"),
        ("heads_do_not_divide", "n_heads (5) must divide d_model (64)"),
        ("not_json", "invalid spec"),
        ("missing_data", "does not exist"),
        ("dataset_without_data_arg", "needs --data PATH"),
        ("init_from_without_arg", "needs --init-from URI"),
        ("init_from_not_a_checkpoint", "is not a complete checkpoint"),
    ],
)
def test_invalid_spec_or_data_exits_2_with_an_error_event(
    case: str, message: str, corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHYARD_ATTEMPT", raising=False)
    raw = tiny_spec(corpus_dir).model_dump(mode="json")
    if case == "unknown_field":
        raw["train"]["epochz"] = 3
    elif case == "heads_do_not_divide":
        raw["model"]["n_heads"] = 5
    elif case == "missing_data":
        raw["data"]["uri"] = str(tmp_path / "nowhere")
    elif case == "dataset_without_data_arg":
        raw["data"] = {"dataset": "ds_123"}
    elif case.startswith("init_from"):
        raw["model"]["init_from"] = {"job": 1, "checkpoint": 2}
    extra = ["--init-from", str(tmp_path / "nowhere")] if case.endswith("checkpoint") else []
    spec_path = tmp_path / "spec.json"
    spec_path.write_text("{not json" if case == "not_json" else json.dumps(raw))
    assert _main_exit_code(spec_path, tmp_path / "run", *extra) == 2
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    (error,) = [e for e in map(json.loads, lines) if e["type"] == "error"]
    assert error["type"] == "error" and error["attempt"] == 0
    assert message in error["message"]
    assert error["exit_code"] == 2
    assert (error["failure_class"], error["rank"], error["restart"]) == ("user_error", 0, 0)
    assert "Traceback" in error["traceback"]


def test_event_lines_carry_type_time_and_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_ATTEMPT", "3")
    writer = EventWriter(tmp_path)
    writer.status("running", "go", {"world_size": 1})
    writer.metric(5, {"loss": 2.5, "grad_norm": math.inf})  # inf is not JSON: left out
    writer.metric(6, {"grad_norm": math.nan})  # nothing finite: no event
    writer.close()
    appended = EventWriter(tmp_path, attempt=4)  # a later attempt appends
    appended.checkpoint(10, "/c/step_00000010", 123)
    appended.close()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["type"], e["attempt"]) for e in events] == [
        ("status", 3),
        ("metric", 3),
        ("checkpoint", 4),
    ]
    assert events[1]["values"] == {"loss": 2.5} and events[1]["step"] == 5
    assert all(isinstance(e["time"], float) for e in events)


def test_null_reporter_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    reporter = NullReporter()
    reporter.status("completed", "done", {})
    reporter.error("boom", "tb", 1, "user_error", 0)
    reporter.close()
    assert list(tmp_path.iterdir()) == []
