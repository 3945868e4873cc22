"""Starting the server side (API, worker, beat, admin) as separate processes.

The client package never imports server code: it runs the server modules by name with the
same interpreter (`sys.executable`). ``torchyard api`` and friends replace the CLI process
(`exec_argv`); ``torchyard quickstart`` keeps them as `Child` processes and stops them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

WORKER_APP = "workers.app:app"


def api_argv(host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """uvicorn serving `api.main:create_app` (an app factory)."""
    return [
        sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
        "--host", host, "--port", str(port),
    ]  # fmt: skip


def worker_argv(
    pool: str = "default", hostname: str | None = None, loglevel: str = "INFO"
) -> list[str]:
    """One Celery worker for its host on queue `pool`: threads pool, no prefetch.

    The worker owns the host's devices (GPUs, or `TORCHYARD_WORKER_SLOTS` CPU slots) and runs
    as many jobs at once as fit them, one pool thread per device (the worker sizes its pool;
    `workers.app`); prefetch 1, so a queued job is never held by a worker with no thread for
    it. Gossip and mingle are off: they only add start-up time and broker traffic.
    """
    argv = [
        sys.executable, "-m", "celery", "-A", WORKER_APP, "worker",
        "-Q", pool, "--pool", "threads", "--prefetch-multiplier", "1",
        "--without-gossip", "--without-mingle", "--loglevel", loglevel,
    ]  # fmt: skip
    if hostname:
        argv += ["--hostname", hostname]
    return argv


def exporter_argv(
    queue: str = "exports", concurrency: int = 2, hostname: str | None = None
) -> list[str]:
    """A Celery worker on the export queue (the API's `TORCHYARD_EXPORT_QUEUE`): it runs
    `python -m trainer.exports.safetensors` for `concurrency` checkpoint exports at once. Exports
    need no GPU, so they have a worker kind of their own and never queue behind training."""
    argv = [
        sys.executable, "-m", "workers", "exporter", "--queue", queue,
        "--concurrency", str(concurrency), "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    if hostname:
        argv += ["--hostname", hostname]
    return argv


def slurm_argv(pool: str, hostname: str | None = None) -> list[str]:
    """The submitter of a Slurm pool (`TORCHYARD_SLURM_POOLS`), on a login node: a Celery worker
    on the pool's queue that places its jobs with `sbatch` and follows them with `squeue`
    (`workers.slurm.submitter`); no devices of its own."""
    argv = [sys.executable, "-m", "workers", "slurm", "--pool", pool, "--without-gossip",
            "--without-mingle"]  # fmt: skip
    if hostname:
        argv += ["--hostname", hostname]
    return argv


def controller_argv() -> list[str]:
    """The controller: the reconcile loop (lost workers, hangs, preemption, lost messages) in
    a process of its own, one leader among any number (`workers.controller`)."""
    return [sys.executable, "-m", "workers", "controller"]


def admin_argv(*args: str) -> list[str]:
    """`core.admin` with `args`, e.g. ``("migrate",)`` or ``("bootstrap", "--project", p)``."""
    return [sys.executable, "-m", "core.admin", *args]


def exec_argv(argv: list[str]) -> NoReturn:
    """Replace this process with `argv` (signals then reach the server directly)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def parse_api_key(stdout: str) -> str | None:
    """The key from ``core.admin bootstrap`` output: its last ``TORCHYARD_API_KEY=...`` line."""
    for line in reversed(stdout.strip().splitlines()):
        key, sep, value = line.strip().partition("=")
        if sep and key == "TORCHYARD_API_KEY" and value:
            return value.strip().strip("'\"")
    return None


class Child:
    """A server process started in its own session, its output appended to a log file.

    Its own session keeps Ctrl-C in the terminal from reaching it directly: the parent
    decides the shutdown order and stops the whole process group with `stop`.
    """

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the log (empty when there is none yet)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process group, wait up to `timeout_s` s, then SIGKILL it.

        Returns the exit code (None if even SIGKILL did not reap it within 5 s).
        """
        self.terminate()
        return self.reap(timeout_s)

    def terminate(self) -> None:
        """SIGTERM the process group if the leader runs; `reap` then waits for it. Stopping
        several children this way overlaps their shutdowns."""
        if self.running:
            self._signal_group(signal.SIGTERM)

    def reap(self, timeout_s: float = 15.0) -> int | None:
        """Wait up to `timeout_s` s for the leader (after `terminate`), then SIGKILL the group.

        Returns the exit code (None if even SIGKILL did not reap it within 5 s).
        """
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout_s)
        # The leader may be gone while children it started in its group live on.
        self._signal_group(signal.SIGKILL)
        try:
            return self.process.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
