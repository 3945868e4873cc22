"""Server commands run the server modules by name, and children are stopped for good."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from torchyard import launch


def test_api_argv_runs_the_app_factory_with_uvicorn() -> None:
    assert launch.api_argv("0.0.0.0", 9000) == [
        sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
        "--host", "0.0.0.0", "--port", "9000",
    ]  # fmt: skip


def test_worker_argv_is_a_threads_pool_sized_by_the_worker_on_its_pool() -> None:
    assert launch.worker_argv("gpu-a100", hostname="w1@%h") == [
        sys.executable, "-m", "celery", "-A", "workers.app:app", "worker",
        "-Q", "gpu-a100", "--pool", "threads", "--prefetch-multiplier", "1",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO", "--hostname", "w1@%h",
    ]  # fmt: skip
    assert "--hostname" not in launch.worker_argv()


def test_controller_and_admin_argv() -> None:
    assert launch.controller_argv()[1:] == ["-m", "workers", "controller"]
    assert launch.slurm_argv("h100", "sub@login")[1:] == [
        "-m", "workers", "slurm", "--pool", "h100", "--without-gossip", "--without-mingle",
        "--hostname", "sub@login",
    ]  # fmt: skip
    assert launch.admin_argv("bootstrap", "--project", "p")[1:] == [
        "-m", "core.admin", "bootstrap", "--project", "p",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("stdout", "key"),
    [
        ("project p (prj_1)\nTORCHYARD_API_KEY=ty_abc\n", "ty_abc"),
        ("TORCHYARD_API_KEY='ty_q'\n\n", "ty_q"),
        ("TORCHYARD_API_KEY=old\nnoise\nTORCHYARD_API_KEY=new\n", "new"),
        ("no key here\n", None),
        ("TORCHYARD_API_KEY=\n", None),
    ],
)
def test_bootstrap_output_yields_the_last_key(stdout: str, key: str | None) -> None:
    assert launch.parse_api_key(stdout) == key


def _wait_for_line(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text.strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} stayed empty")


def test_stop_kills_a_child_that_ignores_sigterm_and_its_process_group(tmp_path: Path) -> None:
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(grandchild.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = launch.Child("stubborn", [sys.executable, "-c", script], tmp_path / "c.log")
    grandchild = int(_wait_for_line(tmp_path / "c.log"))
    assert child.stop(timeout_s=0.5) == -9
    assert not child.running
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the grandchild in the child's process group survived"


def test_stop_lets_a_well_behaved_child_exit_on_sigterm(tmp_path: Path) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = launch.Child("polite", [sys.executable, "-c", script], tmp_path / "p.log")
    assert _wait_for_line(tmp_path / "p.log") == "ready"
    assert child.stop(timeout_s=10) == 0
    assert child.log_tail() == "ready"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone: it only waits for its parent (init) to reap it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False
