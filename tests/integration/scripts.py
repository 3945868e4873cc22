"""Running user scripts the way the worker does (docs/CONTRACTS.md section 5), without the
server: `torchrun ... --no-python python -m torchyard.train SCRIPT args` in the script's
directory, with `TORCHYARD_RUN_DIR` and `TORCHYARD_CHECKPOINT_DIR` set to a test's directories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.training import REPO_ROOT, trainer_env
from workers.launcher import free_port

EXAMPLES = REPO_ROOT / "examples"
RUN_TIMEOUT_S = 300


def script_command(script: str, args: list[str], *, nproc: int | None, log_dir: Path) -> list[str]:
    """`python -m torchyard.train SCRIPT args` under torchrun with `nproc` processes (its
    per-rank logs and error files under `log_dir`), or alone when `nproc` is None."""
    runner = [sys.executable, "-m", "torchyard.train", script, *args]
    if nproc is None:
        return runner
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    torchrun += ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
    torchrun += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--log-dir", str(log_dir)]
    return [*torchrun, "--no-python", *runner]


def script_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The platform's variables for a run in `workdir` (run dir `run`, checkpoints `ckpt`)."""
    return trainer_env(
        TORCHYARD_RUN_DIR=str(workdir / "run"),
        TORCHYARD_CHECKPOINT_DIR=str(workdir / "ckpt"),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        **extra,
    )


def start_script(
    code_dir: Path,
    workdir: Path,
    args: list[str],
    *,
    nproc: int | None = 2,
    script: str = "train.py",
    **env: str,
) -> subprocess.Popen[str]:
    """Start SCRIPT of `code_dir` (its working directory) in a new process group."""
    cmd = script_command(script, args, nproc=nproc, log_dir=workdir / "run" / "logs")
    return subprocess.Popen(
        cmd,
        cwd=code_dir,
        env=script_env(workdir, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_script(
    code_dir: Path, workdir: Path, args: list[str], **kwargs: Any
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run to the end: (exit code, output, events)."""
    proc = start_script(code_dir, workdir, args, **kwargs)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        _end(proc)
    return proc.returncode, out, read_events(workdir / "run")


def sigterm_when(
    proc: subprocess.Popen[str], run_dir: Path, seen: Callable[[list[dict[str, Any]]], bool]
) -> tuple[int, str]:
    """Poll the events file until `seen(events)`, then SIGTERM the run's process group (as a
    pause does) and wait for it: (exit code, output). Fails when `seen` never holds."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not seen(read_events(run_dir)):
            assert proc.poll() is None, "the run ended before the awaited event"
            assert time.monotonic() < deadline, "the awaited event never came"
            time.sleep(0.1)  # polling interval of the condition, not a synchronisation
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        _end(proc)
    return proc.returncode, out


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of `run_dir/events.jsonl` (none before it exists)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def of_type(events: list[dict[str, Any]], type_: str, attempt: int | None = None) -> list[Any]:
    return [e for e in events if e["type"] == type_ and attempt in (None, e["attempt"])]


def states(events: list[dict[str, Any]], attempt: int | None = None) -> list[str]:
    return [e["state"] for e in of_type(events, "status", attempt)]


def metric_steps(events: list[dict[str, Any]], attempt: int | None = None) -> list[int]:
    return [e["step"] for e in of_type(events, "metric", attempt)]
