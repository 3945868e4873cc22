"""Several trainer runs in one process group: the scenarios of a test module that share a
world size, run one after another by the same ranks, so their imports (~3 CPU-s per process)
and the gloo rendezvous are paid once per world size instead of once per run.

    torchrun --nproc-per-node W -m tests.support.rank_driver --plan PLAN.json
    python -m tests.support.rank_driver --plan PLAN.json           # W = 1

PLAN.json (written by `run_scenarios` of the trainer test helpers): {"results": PATH,
"scenarios": [{"name", "argv", "env", "crash_after_step", "copy"}, ...]}. Each scenario runs
the trainer's own entry point, `trainer.train.main(argv)`, unchanged but for two seams:

- the process group: `init_distributed` returns the group this driver joined once, and
  `shutdown` leaves it up for the next scenario (the driver destroys it at the end);
- a crash (`crash_after_step` N): `Checkpointer.save` raises `SimulatedCrash` once step N's
  checkpoint, if one was due, is complete, on every rank at the same step. It is a
  BaseException, so the trainer writes no error event and runs no failure path, as after a
  killed process; only its `finally` blocks run (the events file and checkpointer close).
  `tests.support.crashing_trainer` keeps the real `os._exit` crash under torchrun.

`env` is set for the scenario only (e.g. `TORCHYARD_ATTEMPT`); `copy` ([SRC, DST, IGNORED...]
or null) copies a directory tree first (a checkpoint another scenario wrote), less the names
IGNORED. Rank 0 writes RESULTS: {name: {"outcome": "ok" | "crashed" | "exit N" | "error",
"message"}}. Every rank runs every scenario in plan order; after each, a barrier (with the
group's timeout) keeps them in step, and a scenario that failed stops the driver, since a
half-run collective leaves the group unusable.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import shutil
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import trainer.train as trainer_train
from tests.support.crashing_trainer import crash_after_step
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.distributed import DistInfo, env_rank, env_world_size

GROUP_TIMEOUT = datetime.timedelta(seconds=120)


class SimulatedCrash(BaseException):
    """A crash after a chosen step: not an Exception, so no trainer handler sees it."""


@contextlib.contextmanager
def crash_after(step: int | None) -> Iterator[None]:
    """Within the block, `Checkpointer.save` raises `SimulatedCrash` right after `step`."""
    if step is None:
        yield
        return

    def crash(at: int) -> None:
        raise SimulatedCrash(f"crash after step {at}")

    save = crash_after_step(step, crash)
    try:
        yield
    finally:
        Checkpointer.save = save  # type: ignore[method-assign]


@contextlib.contextmanager
def scenario_env(env: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_one(scenario: dict[str, Any]) -> dict[str, str]:
    """Run one scenario on this rank; its outcome."""
    if scenario.get("copy"):
        src, dst, *ignore = scenario["copy"]
        if env_rank() == 0:
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*ignore))
        if dist.is_initialized():
            dist.barrier()
    try:
        with scenario_env(scenario.get("env") or {}), crash_after(scenario.get("crash_after_step")):
            trainer_train.main(scenario["argv"])
        return {"outcome": "ok", "message": ""}
    except SimulatedCrash as exc:
        return {"outcome": "crashed", "message": str(exc)}
    except SystemExit as exc:
        return {"outcome": f"exit {exc.code}", "message": ""}
    except Exception as exc:
        message = "".join(traceback.format_exception(exc))
        traceback.clear_frames(exc.__traceback__)  # free the run's model and optimizer
        return {"outcome": "error", "message": message}
    finally:
        gc.collect()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.rank_driver")
    parser.add_argument("--plan", required=True, type=Path)
    plan = json.loads(parser.parse_args(argv).plan.read_text())
    info: DistInfo | None = None
    if env_world_size() > 1:
        dist.init_process_group(backend="gloo", timeout=GROUP_TIMEOUT)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        info = DistInfo(env_rank(), local_rank, env_world_size(), torch.device("cpu"))
    if info is not None:
        shared = info
        trainer_train.init_distributed = lambda device_kind: shared  # type: ignore[assignment]
    trainer_train.shutdown = lambda info, *, clean: None  # type: ignore[assignment]
    results: dict[str, dict[str, str]] = {}
    for scenario in plan["scenarios"]:
        print(f"=== scenario {scenario['name']}", flush=True)
        result = run_one(scenario)
        results[scenario["name"]] = result
        print(f"=== {scenario['name']}: {result['outcome']}", flush=True)
        if result["outcome"] not in ("ok", "crashed") and info is not None:
            print(result["message"], file=sys.stderr, flush=True)
            break  # the group may be mid-collective on another rank
        if info is not None:
            dist.barrier()
    if env_rank() == 0:
        Path(plan["results"]).write_text(json.dumps(results, indent=2))
    if info is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
