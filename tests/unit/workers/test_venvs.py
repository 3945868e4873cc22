"""The virtual environments of `entrypoint.requirements` (workers/entrypoint/venvs.py), built for
real with uv: cached by the requirement set, layered over the worker's site-packages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.entrypoint.venvs import (
    READY,
    InstallFailed,
    InstallStopped,
    ensure_venv,
    installer_env,
    venv_key,
)

BASE_ENV = dict(os.environ)  # the worker's: its CA bundle (SSL_CERT_FILE) reaches uv


def _ensure(requirements: list[str], root: Path, log: Path) -> str:
    with log.open("ab") as out:
        return ensure_venv(requirements, root=root, log=out, base_env=BASE_ENV)


def test_no_requirements_is_the_workers_own_python(tmp_path: Path) -> None:
    assert _ensure([], tmp_path / "venvs", tmp_path / "log") == sys.executable
    assert not (tmp_path / "venvs").exists()


def test_the_same_requirements_in_any_order_reuse_one_environment(tmp_path: Path) -> None:
    root, log = tmp_path / "venvs", tmp_path / "install.log"
    first = _ensure(["tomli-w>=1.0", "tomli-w<99"], root, log)
    built = (Path(first).parent.parent / READY).stat().st_mtime_ns
    again = _ensure(["tomli-w<99", " tomli-w>=1.0"], root, log)
    assert again == first
    assert (Path(first).parent.parent / READY).stat().st_mtime_ns == built  # not rebuilt
    assert [p.name for p in root.iterdir() if p.is_dir()] == [
        venv_key(["tomli-w>=1.0", "tomli-w<99"])
    ]
    assert "reusing" in log.read_text() and "tomli-w" in log.read_text()
    # The job's package from the venv, the worker's packages (orjson) still importable after it.
    probe = "import tomli_w, orjson, sys; print(tomli_w.__file__); print(orjson.__file__)"
    out = subprocess.run([first, "-c", probe], capture_output=True, text=True, check=True)
    job_pkg, worker_pkg = out.stdout.split()
    assert job_pkg.startswith(str(root)) and not worker_pkg.startswith(str(root))


def test_a_failed_install_raises_with_the_installers_last_lines_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    root, log = tmp_path / "venvs", tmp_path / "install.log"
    with pytest.raises(InstallFailed) as raised:
        _ensure(["torchyard-no-such-package-zzz==1.0"], root, log)
    assert "requirements: install failed" in str(raised.value)
    assert any("torchyard-no-such-package-zzz" in line for line in raised.value.log_tail)
    assert [p for p in root.iterdir() if p.is_dir()] == []  # no half-built environment


def test_the_installer_sees_the_jobs_allow_list_uv_and_proxies_but_no_worker_secret() -> None:
    base = {
        "PATH": "/usr/bin",
        "SSL_CERT_FILE": "/etc/ssl/ca.pem",
        "UV_INDEX_URL": "https://mirror/simple",
        "HTTPS_PROXY": "http://proxy:3128",
        "TORCHYARD_DATABASE_URL": "postgresql://u:pw@db/ty",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HF_TOKEN": "hf-secret",
    }
    assert installer_env(base) == {
        "PATH": "/usr/bin",
        "SSL_CERT_FILE": "/etc/ssl/ca.pem",
        "UV_INDEX_URL": "https://mirror/simple",
        "HTTPS_PROXY": "http://proxy:3128",
    }


def test_an_install_is_killed_when_the_attempt_is_over_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    with socket.socket() as index:  # an index that accepts connections and never answers
        index.bind(("127.0.0.1", 0))
        index.listen(8)
        port = index.getsockname()[1]
        env = {**BASE_ENV, "UV_INDEX_URL": f"http://127.0.0.1:{port}/simple", "UV_NO_CACHE": "1"}
        beats: list[float] = []

        def beat() -> bool:  # the job was cancelled while its requirements installed
            beats.append(time.monotonic())
            return False

        root, log = tmp_path / "venvs", tmp_path / "install.log"
        started = time.monotonic()
        with log.open("ab") as out, pytest.raises(InstallStopped):
            ensure_venv(["tomli-w==1.0.0"], root=root, log=out, base_env=env, beat=beat)
    assert len(beats) == 1 and time.monotonic() - started < 15
    assert [p for p in root.iterdir() if p.is_dir()] == []
    assert "install stopped" in log.read_text()
