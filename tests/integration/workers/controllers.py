"""Controller processes (`python -m workers controller`) for tests: the reconcile loop that
requeues a lost worker's job, ends hung attempts and times gangs out."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.platform.settings import Settings
from tests.conftest import REPO_ROOT, settings_env


class Controller:
    """A `python -m workers controller` process and its log."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers", "controller"],
                cwd=REPO_ROOT,
                env=settings_env(settings),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def says(self, words: str) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"controller exited with {self.proc.returncode}:\n{self.log}")
        return words in self.log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_controller(started: list[Controller], settings: Settings, log_dir: Path) -> Controller:
    controller = Controller(settings, log_dir / f"controller-{secrets.token_hex(3)}.log")
    started.append(controller)
    return controller
