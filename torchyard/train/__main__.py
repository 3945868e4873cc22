"""The runner: `python -m torchyard.train SCRIPT [args]` or `python -m torchyard.train -m MODULE
[args]` runs the user's program as `python SCRIPT args` would, on every rank, inside the
platform's contract (docs/CONTRACTS.md section 5):

- before the program: a SIGTERM handler (the flag `torchyard.train.should_stop()` reads) and,
  on rank 0, `status running`;
- after it: on rank 0 `status completed` (or `stopped` once a stop was asked for);
- when it raises (or exits non-zero): torchrun's per-rank error file (torch's `ErrorHandler`,
  when torch is importable), on rank 0 an `error` event with its `failure_class`, the
  traceback on stderr, exit code 1.

The worker puts it in front of `python SCRIPT` commands itself; off-platform it is optional.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import sys
import traceback
from dataclasses import dataclass

import torchyard.train as ty
from dataformat.failures import classify_exception
from trainer.events import restart_count

USAGE = "usage: python -m torchyard.train SCRIPT [args ...] | -m MODULE [args ...]"


@dataclass(frozen=True)
class Target:
    """What to run: a script path or (`module` true) a module name, and its arguments."""

    name: str
    module: bool
    args: list[str]


def parse_argv(argv: list[str]) -> Target:
    """The target of the runner's arguments (`argv` without the program name).
    Raises `ValueError` (with the usage line) when no script or module is named."""
    if argv and argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError(USAGE)
        return Target(argv[1], module=True, args=argv[2:])
    if not argv or argv[0].startswith("-"):
        raise ValueError(USAGE)
    return Target(argv[0], module=False, args=argv[1:])


def run_target(target: Target) -> None:
    """Run `target` as `__main__` with `sys.argv` and `sys.path[0]` as `python` sets them:
    the script's directory for a script, the working directory for `-m`."""
    if target.module:
        sys.argv = [target.name, *target.args]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target.name, *target.args]
        sys.path[0] = os.path.dirname(os.path.abspath(target.name))
        runpy.run_path(target.name, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    """Run the program named by `argv` (default `sys.argv[1:]`); returns the exit code:
    0 when it returned or exited 0, 1 when it raised or exited non-zero, 2 for bad usage."""
    try:
        target = parse_argv(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    ty.install_stop_handler()
    _write_running(target)
    try:
        run_target(target)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            return _fail(exc)
    except BaseException as exc:
        return _fail(exc)
    _write_end()
    return 0


def _write_running(target: Target) -> None:
    if ty.rank() != 0:
        return
    latest = ty.latest_checkpoint()
    start_step = (ty.checkpoint_step(latest) or 0) if latest is not None else 0
    shown = f"-m {target.name}" if target.module else target.name
    data = {
        "world_size": int(os.environ.get("WORLD_SIZE") or 1),
        "restart": restart_count(),
        "start_step": start_step,
        "entrypoint": True,
    }
    ty.reporter().status("running", f"running {shown}", data)


def _write_end() -> None:
    if ty.rank() != 0:
        return
    state = ty._state
    steps = state.last_step or 0
    if state.stop_requested:
        latest = ty.latest_checkpoint()
        data = {"step": steps, "checkpoint_uri": str(latest.resolve()) if latest else None}
        ty.reporter().status("stopped", f"stopped after step {steps}", data)
    else:
        done: dict[str, float | int] = {"steps": steps}
        if state.last_loss is not None:
            done["final_loss"] = state.last_loss
        ty.reporter().status("completed", f"completed at step {steps}", done)
    ty.reporter().close()


def _fail(exc: BaseException) -> int:
    """Record `exc` for torchrun and the worker; the exit code 1."""
    _drop_runner_frames(exc)
    _write_error_file(exc)
    text = "".join(traceback.format_exception(exc))
    print(text, file=sys.stderr, end="")
    if ty.rank() == 0:
        ty.reporter().error(
            message=f"{type(exc).__name__}: {exc}",
            traceback=text,
            exit_code=1,
            failure_class=classify_exception(exc).value,
            rank=ty.rank(),
        )
        ty.reporter().close()
    return 1


def _drop_runner_frames(exc: BaseException) -> None:
    """Start `exc`'s traceback at the user's code: leave out this module's and runpy's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and "runpy" not in name:
            break
        tb = tb.tb_next
    exc.__traceback__ = tb


def _write_error_file(exc: BaseException) -> None:
    """torchrun's per-rank `error.json` (`TORCHELASTIC_ERROR_FILE`), written by torch's own
    `ErrorHandler` so the worker reads it as it reads the trainer's; skipped without torch."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or importlib.util.find_spec("torch") is None:
        return
    errors = importlib.import_module("torch.distributed.elastic.multiprocessing.errors")
    errors.ErrorHandler().record_exception(exc)


if __name__ == "__main__":
    sys.exit(main())
