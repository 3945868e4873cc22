"""The events file `RUN_DIR/events.jsonl` that the worker tails (docs/CONTRACTS.md section 2).

Only the reporting rank (rank 0; under `pipeline` the last stage's rank, where the loss is)
writes it (`EventWriter`); every other rank gets a
`NullReporter` with the same methods, so the training code never asks "am I rank 0?".
Each event is one JSON object on one line, written with a single `write` and flushed, so a
reader that consumes complete lines never sees half an event.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal

EVENTS_FILE = "events.jsonl"
Status = Literal["running", "completed", "stopped"]


def current_attempt() -> int:
    """`TORCHYARD_ATTEMPT` as an int (0 when unset or empty)."""
    return int(os.environ.get("TORCHYARD_ATTEMPT") or 0)


def restart_count() -> int:
    """How often torchrun has restarted this worker group in place (`--max-restarts`):
    `TORCHELASTIC_RESTART_COUNT`, set by torchrun; 0 when unset (stand-alone)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


class Reporter:
    """Emits the events of the contract; this base class drops them (non-reporting ranks)."""

    def emit(self, type_: str, **fields: Any) -> None:
        """Write one event of `type_` with `fields` (plus `type`, `time`, `attempt`)."""

    def status(self, state: Status, message: str, data: dict[str, Any]) -> None:
        self.emit("status", state=state, message=message, data=data)

    def metric(self, step: int, values: dict[str, float]) -> None:
        """Metric values at optimizer step `step`; non-finite values are left out (not JSON)."""
        finite = {k: float(v) for k, v in values.items() if math.isfinite(v)}
        if finite:
            self.emit("metric", step=step, values=finite)

    def rank_step_times(
        self,
        step: int,
        seconds: list[float],
        wall_seconds: list[float],
        measure: Literal["compute", "wall"],
    ) -> None:
        """Every rank's mean seconds per step over the log interval ending at optimizer step
        `step`, in global rank order: `seconds` what the worker compares to find stragglers,
        of kind `measure` (`compute`: up to the rank's last gradient, without waiting for the
        others; `wall`: the whole step), and `wall_seconds` the whole steps'."""
        self.emit(
            "rank_step_times", step=step, seconds=seconds, wall_seconds=wall_seconds,
            measure=measure,
        )  # fmt: skip

    def plan(self, max_steps: int) -> None:
        """The optimizer steps the run takes in all (the number of its last step), declared by
        a program that knows it only once running (`torchyard.train.set_max_steps`)."""
        self.emit("plan", max_steps=max_steps)

    def checkpoint(self, step: int, uri: str, size_bytes: int) -> None:
        self.emit("checkpoint", step=step, uri=uri, size_bytes=size_bytes)

    def checkpoint_deleted(self, step: int, uri: str) -> None:
        """A complete checkpoint removed by retention (`checkpoint.keep_last`)."""
        self.emit("checkpoint_deleted", step=step, uri=uri)

    def export(self, step: int, format: str, uri: str, size_bytes: int) -> None:
        """An exported model of optimizer step `step`, complete at `uri` (a directory):
        `format` `peft_adapter` or `merged_safetensors` (LoRA runs)."""
        self.emit("export", step=step, format=format, uri=uri, size_bytes=size_bytes)

    def sample(self, step: int, prompt: str, text: str) -> None:
        self.emit("sample", step=step, prompt=prompt, text=text)

    def data(self, fields: dict[str, Any]) -> None:
        """How the data became rows (`trainer.data.prep`): counts, masks, packing, cache."""
        self.emit("data", **fields)

    def error(
        self, message: str, traceback: str, exit_code: int, failure_class: str, rank: int
    ) -> None:
        """The exception this run fails with. `exit_code`: the code the rank exits with (2 =
        do not retry; torchrun itself exits 1 whatever its workers' codes were);
        `failure_class`: what the exception means (`dataformat.failures.FailureClass`); `rank`:
        the global rank that raised it; `restart` (added here): torchrun's in-place restart
        count of the run that failed."""
        self.emit(
            "error",
            message=message,
            traceback=traceback,
            exit_code=exit_code,
            failure_class=failure_class,
            rank=rank,
            restart=restart_count(),
        )

    def close(self) -> None:
        """Release the file, if any."""


class NullReporter(Reporter):
    """The reporter of every rank but the reporting one: all events are dropped."""


class EventWriter(Reporter):
    """Appends events to `run_dir/events.jsonl`, one flushed line each.

    Raises `OSError` when `run_dir` cannot be created or the file cannot be opened.
    """

    def __init__(self, run_dir: Path, attempt: int | None = None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / EVENTS_FILE
        self.attempt = current_attempt() if attempt is None else attempt
        torn = _ends_without_newline(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        if torn:  # a writer before us (an in-place restart's) died mid-line: end that line
            self._file.write("\n")
            self._file.flush()

    def emit(self, type_: str, **fields: Any) -> None:
        event = {"type": type_, "time": time.time(), "attempt": self.attempt, **fields}
        self._file.write(json.dumps(event, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ends_without_newline(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False
