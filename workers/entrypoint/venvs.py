"""The Python of an `entrypoint` job with `requirements` (docs/CONTRACTS.md section 5).

A virtual environment per set of requirements, `VENV_ROOT/<key>/`, created with `uv venv` and
filled with `uv pip install`, then given a `.pth` file that adds the worker's own
site-packages after the environment's: torch, `torchyard` and the rest of the worker stay
importable, and the job's pins win. Built once under a file lock (`fcntl.flock` on
`VENV_ROOT/<key>.lock`) into a temporary directory that is renamed into place when whole, so a
crash leaves no half-built environment behind; reused by later jobs and attempts on the host.

The installer runs over an allow-listed environment (`workers.launcher.ALLOWED_ENV`, uv's own
`UV_*` and the proxy variables): building an sdist runs the package's code, which must not see
the worker's secrets.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from workers.ingest import last_lines
from workers.launcher import allowed_env

PTH_NAME = "_torchyard_worker_site.pth"
READY = ".torchyard_ready"  # written last inside the temporary directory, before the rename
INSTALLER_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
LOG_TAIL_LINES = 20
BEAT_S = 2.0  # how often `beat` is called while the installer runs


class InstallStopped(Exception):
    """`beat` said the attempt is over (cancelled, paused, lost): the installer was killed."""


class InstallFailed(Exception):
    """The installer failed; `log_tail` holds the last lines of its output."""

    def __init__(self, message: str, log_tail: Sequence[str]) -> None:
        super().__init__(message)
        self.log_tail = tuple(log_tail)


def venv_key(requirements: Sequence[str]) -> str:
    """sha256 (hex) of the sorted, de-duplicated requirement lines, the worker's Python version
    and `sys.prefix`: the same set in any order names the same environment."""
    lines = sorted({line.strip() for line in requirements})
    material = "\n".join([*lines, "--", sys.version, sys.prefix])
    return hashlib.sha256(material.encode()).hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(
    requirements: Sequence[str],
    *,
    root: Path,
    log: BinaryIO,
    base_env: Mapping[str, str],
    beat: Callable[[], bool] | None = None,
) -> str:
    """The interpreter of the environment with `requirements` under `root` (built when absent).

    `log`: where the installer's stdout and stderr go (bytes); `base_env`: the worker's
    environment, of which only the allow-list reaches the installer; `beat`: called every
    `BEAT_S` seconds while it runs (the job's heartbeat); when it returns False the installer
    is killed and nothing is kept. Without requirements: the worker's own `sys.executable`.
    Raises InstallFailed (the installer exited non-zero), InstallStopped, or OSError.
    """
    if not requirements:
        return sys.executable
    key = venv_key(requirements)
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with _locked(root / f"{key}.lock"):
        if (final / READY).exists():
            log.write(f"requirements: reusing {final}\n".encode())
            return str(venv_python(final))
        shutil.rmtree(final, ignore_errors=True)  # never whole without READY
        for leftover in root.glob(f".{key[:16]}.*"):  # of a build whose worker died
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=root))
        try:
            _build(tmp, sorted({r.strip() for r in requirements}), log, base_env, beat)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(venv_python(final))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(
    venv: Path,
    requirements: list[str],
    log: BinaryIO,
    base_env: Mapping[str, str],
    beat: Callable[[], bool] | None,
) -> None:
    """Create the environment at `venv` (relocatable: it is renamed afterwards), install the
    requirements into it, add the worker's site-packages behind its own, mark it whole."""
    from uv import find_uv_bin  # only jobs with entrypoint.requirements need uv

    uv = find_uv_bin()
    env = installer_env(base_env)
    _run([uv, "venv", "--relocatable", "--python", sys.executable, str(venv)], log, env, beat)
    python = str(venv_python(venv))
    _run([uv, "pip", "install", "--python", python, *requirements], log, env, beat)
    (_site_packages(venv) / PTH_NAME).write_text(worker_site_line() + "\n")
    (venv / READY).write_text(" ".join(requirements) + "\n")


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def worker_site_line() -> str:
    """The `.pth` line that adds each of the worker's site-packages directories (after the
    environment's own, which `site` has added already)."""
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    return "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs)


def installer_env(base: Mapping[str, str]) -> dict[str, str]:
    """The installer's environment: the job's allow-list, uv's `UV_*` and the proxies."""
    env = allowed_env(base)
    env |= {k: v for k, v in base.items() if k.startswith("UV_") or k in INSTALLER_VARS}
    return env


def _run(
    argv: list[str], log: BinaryIO, env: dict[str, str], beat: Callable[[], bool] | None
) -> None:
    """Run one installer step with its output into `log`; InstallFailed when it exits non-zero."""
    log.write(("$ " + " ".join(argv) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
    )
    while True:
        try:
            code = proc.wait(timeout=BEAT_S)
            break
        except subprocess.TimeoutExpired:
            if beat is not None and not beat():
                proc.kill()
                proc.wait()
                log.write(b"requirements: install stopped (the attempt is over)\n")
                raise InstallStopped("requirements: install stopped") from None
    if code != 0:
        log.flush()
        os.fsync(log.fileno())
        tail = last_lines(log.name, LOG_TAIL_LINES) if isinstance(log.name, str) else []
        step = "uv venv" if argv[1] == "venv" else "uv pip install"
        raise InstallFailed(f"requirements: install failed ({step} exited {code})", tail)
