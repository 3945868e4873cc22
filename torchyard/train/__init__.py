"""What a user's training script sees on Torchyard (docs/CONTRACTS.md section 5).

    import torchyard.train as ty

    start = ty.latest_checkpoint()          # Path of the newest complete checkpoint, or None
    corpus = ty.input_path("corpus")        # a declared input: /inputs/corpus in the sandbox
    ty.set_max_steps(max_steps)             # optional: the job's progress and ETA
    for step in range(first_step, max_steps + 1):
        ...
        ty.report(step, loss=loss.item(), lr=lr)
        if step % 100 == 0 or ty.should_stop():
            path = ty.checkpoint_dir(step)  # TORCHYARD_CHECKPOINT_DIR/step_00000100/
            ...                             # every rank writes its part
            ty.completed_checkpoint(path)   # every rank; rank 0 marks it complete
        if ty.should_stop():                # SIGTERM: pause, cancel, max_runtime_s
            break

Events go to `TORCHYARD_RUN_DIR/events.jsonl` (section 2's format, `trainer.events`), written
by rank 0 (`RANK`) only. Off-platform (no `TORCHYARD_RUN_DIR`) everything lands under
`./torchyard_run/` (checkpoints in `./torchyard_run/checkpoints/`), so the same script runs
on a laptop. Imports only the standard library and the torch-free `trainer.events`; torch is
used only when the script has already imported it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from trainer.events import EventWriter, Reporter

__all__ = [
    "checkpoint_dir",
    "checkpoint_root",
    "checkpoint_step",
    "completed_checkpoint",
    "input_path",
    "inputs",
    "install_stop_handler",
    "latest_checkpoint",
    "log_event",
    "params",
    "rank",
    "report",
    "run_dir",
    "set_max_steps",
    "should_stop",
]

COMPLETE_MARKER = ".torchyard_complete"
DCP_METADATA = ".metadata"
MESSAGE_LIMIT = 2000  # characters of an `info` message the worker keeps
INPUT_ENV_PREFIX = "TORCHYARD_INPUT_"  # `jobspec.inputs.ENV_PREFIX` (this module stays light)
INPUTS_FILE = "inputs.json"  # off-platform: `./torchyard_run/inputs.json`, {name: path}
# `checkpoint_dir(step)`'s names, and those `transformers.Trainer` saves to (`checkpoint-N`)
_STEP_DIR = re.compile(r"^(?:step_(\d{8,})|checkpoint-(\d+))$")


class _State:
    """This process's view: the events writer (opened on first use), the stop flag and what
    the runner's final `status` event needs (the last reported step and loss)."""

    def __init__(self) -> None:
        self.reporter: Reporter | None = None
        self.part_writer: EventWriter | None = None  # another node's local rank 0: its parts
        self.stop_requested = False
        self.last_step: int | None = None
        self.last_loss: float | None = None


_state = _State()


def rank() -> int:
    """This process's global rank: torchrun's `RANK`, 0 when unset (a plain `python` run)."""
    return int(os.environ.get("RANK") or 0)


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK") or 0)


def run_dir() -> Path:
    """`TORCHYARD_RUN_DIR`, or `./torchyard_run` off-platform."""
    return Path(os.environ.get("TORCHYARD_RUN_DIR") or "torchyard_run")


def checkpoint_root() -> Path:
    """`TORCHYARD_CHECKPOINT_DIR`, or `run_dir()/checkpoints` off-platform."""
    configured = os.environ.get("TORCHYARD_CHECKPOINT_DIR")
    return Path(configured) if configured else run_dir() / "checkpoints"


def params() -> dict[str, Any]:
    """The job's `entrypoint.params` (a sweep trial's sampled values among them), from
    `TORCHYARD_PARAMS`; `{}` off-platform or when the spec gives none. Raises `ValueError`
    when the variable holds no JSON object (set by hand, not by the platform)."""
    raw = os.environ.get("TORCHYARD_PARAMS") or "{}"
    values = json.loads(raw)
    if not isinstance(values, dict):
        raise ValueError(f"TORCHYARD_PARAMS holds no JSON object: {raw[:100]!r}")
    return values


def inputs() -> dict[str, Path]:
    """The job's declared inputs (`entrypoint.inputs`): name -> path, a file or a directory,
    read-only (`/inputs/<name>` in the job's sandbox), from `TORCHYARD_INPUT_<NAME>`.

    Off-platform (no `TORCHYARD_RUN_DIR`) they come from `./torchyard_run/inputs.json` (a JSON
    object `{"corpus": "/data/corpus.txt"}`), and a `TORCHYARD_INPUT_<NAME>` set by hand wins.
    Raises `ValueError` when that file holds no JSON object of strings."""
    found: dict[str, Path] = {}
    listed = run_dir() / INPUTS_FILE
    if "TORCHYARD_RUN_DIR" not in os.environ and listed.is_file():
        values = json.loads(listed.read_text())
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise ValueError(f"{listed} holds no JSON object of paths")
        found = {str(name): Path(path) for name, path in values.items()}
    for key, value in os.environ.items():
        if key.startswith(INPUT_ENV_PREFIX) and value:
            found[key.removeprefix(INPUT_ENV_PREFIX).lower()] = Path(value)
    return dict(sorted(found.items()))


def input_path(name: str, default: str | os.PathLike[str] | None = None) -> Path:
    """The path of input `name` (`inputs()`), else `default` (a path given on the command line
    when the script runs off-platform). Raises `KeyError` naming the inputs there are when
    neither exists."""
    found = inputs()
    if name in found:
        return found[name]
    if default is not None:
        return Path(default)
    declared = ", ".join(found) or "none"
    raise KeyError(
        f"no input {name!r} (declared: {declared}); declare it in the spec's entrypoint.inputs, "
        f"or off-platform give its path in {run_dir() / INPUTS_FILE} or {INPUT_ENV_PREFIX}"
        f"{name.upper()}"
    )


def reporter() -> Reporter:
    """The events writer of this process: an `EventWriter` on rank 0, one that drops events on
    the others. Opened on first use; raises `OSError` when the run dir cannot be written."""
    if _state.reporter is None:
        _state.reporter = EventWriter(run_dir()) if rank() == 0 else Reporter()
    return _state.reporter


def report(step: int, **metrics: float) -> None:
    """Report metric values at optimizer step `step` (a `metric` event; the dashboard's charts).

    Values are anything `float()` takes (Python numbers, 0-d tensors); non-finite ones are
    left out. Only rank 0's calls are written; other ranks' are dropped, so every rank may
    call it. A metric named `loss` becomes the run's `final_loss`. Raises `ValueError` for a
    negative step, `TypeError` for a value `float()` refuses.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    values = {name: float(value) for name, value in metrics.items()}
    _state.last_step = step
    if "loss" in values:
        _state.last_loss = values["loss"]
    reporter().metric(step, values)


def set_max_steps(max_steps: int) -> None:
    """Declare how many optimizer steps the run takes in all (the step number `report` reaches
    at its end): the job then shows `step/max_steps`, and the queue's ETA for the jobs waiting
    behind it and the CLI's follow bar count down from it. Call it again when the plan changes
    (e.g. once the data is loaded and the epochs' steps are known). Rank 0 writes a `plan`
    event; other ranks' calls are dropped. Raises `ValueError` unless `max_steps` >= 1,
    `TypeError` for a non-integer.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise TypeError(f"max_steps must be an int, got {type(max_steps).__name__}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    reporter().plan(max_steps)


def log_event(message: str, **data: Any) -> None:
    """A note for the job's event list (an `info` event): `message` is kept to one line of
    2000 characters, `data` must be JSON-serialisable (else `TypeError`/`ValueError`).
    Rank 0 only; other ranks' calls are dropped."""
    line = " ".join(str(message).split())[:MESSAGE_LIMIT]
    reporter().emit("info", message=line, data=data)


def checkpoint_dir(step: int) -> Path:
    """The directory for the checkpoint of optimizer step `step`, created:
    `TORCHYARD_CHECKPOINT_DIR/step_{step:08d}/`. Raises `ValueError` for a negative step."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    path = checkpoint_root() / f"step_{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def completed_checkpoint(path: str | os.PathLike[str]) -> None:
    """Declare the checkpoint in `path` (a `checkpoint_dir(step)`) complete.

    Every rank calls it after writing its part; under an initialized `torch.distributed` it
    barriers first, so rank 0 marks it only when all ranks are done. Rank 0 then writes
    `path/.torchyard_complete`, a `checkpoint` event (`step`, `uri`, `size_bytes`) and
    deletes the oldest complete checkpoints beyond `TORCHYARD_KEEP_LAST_CHECKPOINTS` (a
    `checkpoint_deleted` event each). Where each node stages its own part
    (`TORCHYARD_CHECKPOINT_PARTS`: several nodes on remote storage), local rank 0 of every
    other node writes a `checkpoint_part` event to its node's run directory, for its worker to
    upload. Raises `ValueError` when `path` is not a `step_XXXXXXXX` directory, `OSError` when
    it cannot be written.
    """
    directory = Path(path)
    step = checkpoint_step(directory)
    if step is None or not directory.is_dir():
        raise ValueError(f"{directory} is not a checkpoint_dir(step) directory")
    _barrier()
    if rank() != 0:
        if os.environ.get("TORCHYARD_CHECKPOINT_PARTS") == "1" and _local_rank() == 0:
            if _state.part_writer is None:
                _state.part_writer = EventWriter(run_dir())
            _state.part_writer.emit("checkpoint_part", step=step, uri=str(directory.resolve()))
        return
    (directory / COMPLETE_MARKER).write_text("")
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    reporter().checkpoint(step, str(directory.resolve()), size)
    _apply_retention(directory.parent)


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The optimizer step of a checkpoint directory from its name (`step_00000100` or
    `transformers.Trainer`'s `checkpoint-100`: 100); None for any other name."""
    match = _STEP_DIR.match(Path(path).name)
    return None if match is None else int(match.group(1) or match.group(2))


def latest_checkpoint() -> Path | None:
    """The newest complete checkpoint under `checkpoint_root()`: the highest-step
    `step_XXXXXXXX` (or `transformers`' `checkpoint-N`) directory holding `.torchyard_complete`
    (or a DCP `.metadata`, which `torch.distributed.checkpoint` writes last); None when there
    is none."""
    complete = _complete_checkpoints(checkpoint_root())
    return complete[-1][1] if complete else None


def should_stop() -> bool:
    """True once SIGTERM arrived (the job is paused, cancelled, past `max_runtime_s`, or its
    worker shuts down): save a checkpoint and return.

    Under an initialized `torch.distributed` it is a MAX all-reduce of every rank's flag (a
    CUDA tensor on NCCL), so all ranks agree: call it at the same point on every rank.
    """
    flag = _state.stop_requested
    dist = _torch_distributed()
    if dist is None:
        return flag
    torch = sys.modules["torch"]
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    agreed = bool(tensor.item())
    # Another rank's SIGTERM stops this one too. Never clear the flag: a SIGTERM that came
    # during the all-reduce (its handler runs when the collective returns) is this rank's
    # vote in the next call; this call answers what all ranks agreed on.
    _state.stop_requested = _state.stop_requested or agreed
    return agreed


def install_stop_handler() -> None:
    """Make SIGTERM set the stop flag `should_stop()` reads instead of ending the process.
    The runner (`python -m torchyard.train`) calls it; must run in the main thread."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _state.stop_requested = True


def _torch_distributed() -> Any:
    """`torch.distributed` when the script imported torch and initialized a process group."""
    if "torch" not in sys.modules:
        return None
    dist = getattr(sys.modules["torch"], "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _barrier() -> None:
    dist = _torch_distributed()
    if dist is not None:
        dist.barrier()


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = checkpoint_step(child)
        if step is not None and (
            (child / COMPLETE_MARKER).exists() or (child / DCP_METADATA).exists()
        ):
            found.append((step, child))
    return sorted(found)


def _apply_retention(root: Path) -> None:
    keep = os.environ.get("TORCHYARD_KEEP_LAST_CHECKPOINTS")
    if not keep:
        return
    complete = _complete_checkpoints(root)
    for step, directory in complete[: max(len(complete) - int(keep), 0)]:
        shutil.rmtree(directory)
        reporter().checkpoint_deleted(step, str(directory.resolve()))
