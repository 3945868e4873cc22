"""``torchyard quickstart`` for real: migrate, bootstrap, API + worker, a DDP-free GPT run on a
real corpus, the summary, and nothing left running afterwards, also after Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.embedded


def _quickstart(home: Path, corpus_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env["COLUMNS"] = "200"
    return subprocess.Popen(
        [sys.executable, "-m", "torchyard", "quickstart", "--home", str(home),
         "--data", str(corpus_dir), "--procs", "1", *args],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _api_port(output: str) -> int:
    match = re.search(r"starting the API at http://127\.0\.0\.1:(\d+)", output)
    assert match, output
    return int(match.group(1))


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _job_states(home: Path) -> list[str]:
    with sqlite3.connect(home / "torchyard.db") as db:
        return [state for (state,) in db.execute("SELECT state FROM jobs ORDER BY id")]


def _leftovers(home: Path, quickstart_pid: int) -> list[str]:
    """Live processes of that quickstart: its worker (by node name) or a trainer (by home)."""
    return _processes_mentioning(str(home)) + _processes_mentioning(f"quickstart-{quickstart_pid}@")


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (e.g. the quickstart's home)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # exited meanwhile
            continue
        if text in cmdline and proc.name != str(os.getpid()):
            found.append(cmdline)
    return found


@pytest.mark.timeout(1200)  # two full quickstarts; a loaded 2-core host needs minutes each
def test_quickstart_trains_reports_and_stops_everything(tmp_path: Path, corpus_dir: Path) -> None:
    home = tmp_path / "home"
    proc = _quickstart(home, corpus_dir, "--steps", "20")
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    for expected in (
        "-> running",
        "-> succeeded",
        "train loss",
        "eval loss",
        "unigram baseline",
        "tokens/s",
        "sample",
        f"{home}/storage",
    ):
        assert expected in output, f"{expected!r} missing from:\n{output}"
    assert re.search(r"API key\s+\S+", output)
    eval_loss = float(re.search(r"eval loss\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    unigram = float(re.search(r"unigram baseline\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    assert 0 < eval_loss < 8 and 0 < unigram < 8
    assert not _port_open(_api_port(output)), "the API must be stopped"
    assert _leftovers(home, proc.pid) == []
    assert _job_states(home) == ["succeeded"]

    rerun = _quickstart(home, corpus_dir, "--steps", "10")
    again, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, again
    assert re.findall(r"dataset (ds_\w+)", again) == re.findall(r"dataset (ds_\w+)", output), (
        "a rerun on the same home must reuse the registered corpus"
    )
    assert _job_states(home) == ["succeeded", "succeeded"]


def test_ctrl_c_cancels_the_job_and_stops_the_servers(tmp_path: Path, corpus_dir: Path) -> None:
    home = tmp_path / "home"
    proc = _quickstart(home, corpus_dir, "--steps", "5000")
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "-> running" in line:
            break
    else:
        pytest.fail("the job never ran:\n" + "".join(seen))
    proc.send_signal(signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        stacks = subprocess.run(
            [str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(proc.pid)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        proc.kill()
        pytest.fail(
            "quickstart still running 120 s after Ctrl-C; its threads:\n"
            + stacks.stdout
            + stacks.stderr
            + "\noutput:\n"
            + "".join(seen)
        )
    output = "".join(seen) + rest
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert not _port_open(_api_port(output))
    assert _leftovers(home, proc.pid) == [], "a trainer or worker outlived Ctrl-C"
    assert _job_states(home) == ["cancelled"]
