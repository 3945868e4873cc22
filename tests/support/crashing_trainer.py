"""The real trainer, crashing like a killed process right after a chosen step: a fault the
tests inject from outside the product (the trainer carries no hook for it).

    torchrun ... -m tests.support.crashing_trainer --crash-after-step N <trainer arguments>
    python -m tests.support.crashing_trainer --crash-after-step N <trainer arguments>

Every rank runs `trainer.train.main` unchanged, with one seam wrapped from here:
`Checkpointer.save`, which the training loop calls once after every step (the checkpointer
decides whether one is due). After the call for step N, the wrapper waits for that step's
checkpoint, if one was started, to be complete (`Checkpointer.wait`: an async save too, with
its `checkpoint` event), flushes stdout and stderr and ends the process with `os._exit(1)`:
no exception, no error event, no cleanup, as a crash in native code or a signal would leave
it. All ranks reach step N together, so the whole worker group goes down; a later run of the
plain trainer resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from trainer.checkpoint.checkpointer import Checkpointer
from trainer.train import main as trainer_main

log = logging.getLogger(__name__)
CRASH_EXIT_CODE = 1


def _exit_now(step: int) -> None:
    log.error("crashing after step %d: exiting with code %d", step, CRASH_EXIT_CODE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def crash_after_step(
    step: int, crash: Callable[[int], None] = _exit_now
) -> Callable[[Checkpointer, int], None]:
    """Make every `Checkpointer` call `crash(step)` once the loop has saved `step` (and that
    step's checkpoint, if one was due, is complete): by default the process exits 1 at once.
    Returns the original `Checkpointer.save`, for a caller that restores it
    (`tests.support.rank_driver` raises instead of exiting)."""
    save = Checkpointer.save

    def save_then_crash(self: Checkpointer, at: int, *, force: bool = False) -> None:
        save(self, at, force=force)
        if at == step:
            self.wait()
            crash(at)

    Checkpointer.save = save_then_crash  # type: ignore[method-assign]
    return save


def main(argv: list[str] | None = None) -> Any:
    """Parse `--crash-after-step N` (an int >= 1), hand every other argument to the trainer."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.crashing_trainer")
    parser.add_argument("--crash-after-step", type=int, required=True, metavar="N")
    known, rest = parser.parse_known_args(argv)
    if known.crash_after_step < 1:
        parser.error("--crash-after-step must be at least 1")
    crash_after_step(known.crash_after_step)
    return trainer_main(rest)


# The guard matters: DCP's process-based async save spawns interpreters that import this.
if __name__ == "__main__":
    main()
