"""`python -m workers.isolation.keeper --grace S -- BWRAP_ARGV`: the process between a worker and
one sandbox (`workers.isolation.sandbox`), so that a worker's death stops its jobs as gently as a
cancel.

Unsandboxed, torchrun gets SIGTERM when its worker dies (the parent-death signal) and the ranks
write a stop checkpoint before they exit. bwrap cannot pass that on: a signal kills it, and
`--die-with-parent` then SIGKILLs the namespace. The keeper takes the worker's parent-death
SIGTERM instead (it is the worker's child), sends SIGTERM to the sandbox's process group (led by
the namespace's init, bwrap's only child), and SIGKILL to it after `--grace` seconds
(`TORCHYARD_CANCEL_GRACE_S`) if the job has not ended. It also reaps the namespace's init
(bwrap exits before it: the keeper is a child subreaper), so when the keeper exits every
process of the job is gone; its exit status is bwrap's (128 + N for a death by signal N).
Standard library only: it starts in ~30 ms and imports nothing of the job's.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
TICK_S = 0.1  # how soon a stop asked before the namespace's init exists looks again


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _init_of(bwrap: int) -> int | None:
    """The host PID of the namespace's init: bwrap's only child (None before it is forked)."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split()
        if children:
            return int(children[0])
    return None


class _Stop:
    """Stops the sandbox of `bwrap` once asked: SIGTERM to its process group at once (as soon
    as the namespace's init exists), SIGKILL `grace_s` seconds later. Runs in signal handlers
    (SIGTERM/SIGINT/SIGHUP, then SIGALRM for the retries and the grace), so the keeper's main
    thread can block in `wait` the whole time."""

    def __init__(self, bwrap: subprocess.Popen[bytes], grace_s: float) -> None:
        self.bwrap, self.grace_s = bwrap, grace_s
        self.asked_at: float | None = None
        self.forwarded = False

    def ask(self, _sig: int = 0, _frame: FrameType | None = None) -> None:
        if self.asked_at is None:
            self.asked_at = time.monotonic()
        self.act()

    def act(self, _sig: int = 0, _frame: FrameType | None = None) -> None:
        if self.asked_at is None:
            return
        init = _init_of(self.bwrap.pid)
        if init is None:  # not forked yet, or gone: look again shortly while bwrap runs
            signal.setitimer(signal.ITIMER_REAL, TICK_S)
            return
        if not self.forwarded:
            self.forwarded = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(init, signal.SIGTERM)
        left = self.grace_s - (time.monotonic() - self.asked_at)
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(init, signal.SIGKILL)


def _shield_bwrap() -> None:
    """In bwrap's process before exec: the keeper's death ends it (SIGKILL), and the stop
    signals are ignored. A signal aimed at every process of the job at once (Slurm's cancel,
    requeue and `--signal`: `workers.slurm`; proctrack signals each PID) would otherwise kill
    bwrap, and the namespace with it, before the ranks wrote their stop checkpoint. The ignore
    is inherited by the namespace's init (which takes no signal it has no handler for anyway)
    and by torchrun, which installs its own SIGTERM/SIGINT/SIGHUP handlers, so the ranks it
    starts get the default dispositions back."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def run(argv: list[str], grace_s: float, pass_fds: tuple[int, ...]) -> int:
    """Run bwrap `argv` (handing it `pass_fds`) to its end, stopping the sandbox on SIGTERM,
    SIGINT or SIGHUP; return the exit status to exit with."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    bwrap = subprocess.Popen(argv, pass_fds=pass_fds, preexec_fn=_shield_bwrap)
    for fd in pass_fds:
        os.close(fd)
    stop = _Stop(bwrap, grace_s)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop.ask)
    signal.signal(signal.SIGALRM, stop.act)
    code = bwrap.wait()  # interrupted by the handlers, resumed after them (PEP 475)
    signal.setitimer(signal.ITIMER_REAL, 0)
    while True:  # the namespace's init, reparented here once bwrap exited
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    return code if code >= 0 else 128 - code


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.isolation.keeper", description=__doc__)
    parser.add_argument("--grace", type=float, required=True, help="seconds before SIGKILL")
    parser.add_argument("--pass-fd", type=int, action="append", default=[], help="for bwrap")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then bwrap's argv")
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(run(argv, args.grace, tuple(args.pass_fd)))


if __name__ == "__main__":
    main()
