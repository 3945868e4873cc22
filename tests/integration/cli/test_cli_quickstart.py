"""``torchyard quickstart`` for real: migrate, bootstrap, API + worker, a DDP-free GPT run on a
real corpus, the summary, and nothing left running afterwards, also after Ctrl-C.

Every quickstart pays for a migration, an API, a worker and a trainer, so the module runs two:
a first one on a fresh home (`first_run`), and a rerun on that home that must reuse its corpus
and is stopped with Ctrl-C once its job runs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.platform.settings import Settings
from tests.conftest import REPO_ROOT

# Each test may be the one that runs `first_run`: two quickstarts, minutes each on a loaded host.
pytestmark = [pytest.mark.embedded, pytest.mark.timeout(1200)]


def _quickstart(home: Path, corpus_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env["COLUMNS"] = "200"
    return subprocess.Popen(
        [sys.executable, "-m", "torchyard", "quickstart", "--home", str(home),
         "--data", str(corpus_dir), "--procs", "1", *args],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _api_port(output: str) -> int:
    port = _api_port_in(output)
    assert port is not None, output
    return port


def _api_port_in(output: str) -> int | None:
    match = re.search(r"starting the API at http://127\.0\.0\.1:(\d+)", output)
    return int(match.group(1)) if match else None


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _job_states(home: Path) -> list[str]:
    with sqlite3.connect(home / "torchyard.db") as db:
        return [state for (state,) in db.execute("SELECT state FROM jobs ORDER BY id")]


def _export_queues(home: Path) -> list[str]:
    """The queues of the exporters that registered on the quickstart's database."""
    with sqlite3.connect(home / "torchyard.db") as db:
        query = "SELECT pool FROM workers WHERE name LIKE 'quickstart-exporter-%'"
        return [pool for (pool,) in db.execute(query)]


def _controllers(home: Path) -> list[tuple[int, bool]]:
    """(pid, still alive) of each controller that reconciled on the quickstart's database."""
    with sqlite3.connect(home / "torchyard.db") as db:
        query = "SELECT pid FROM controllers WHERE reconciled_at IS NOT NULL"
        return [(pid, Path(f"/proc/{pid}").exists()) for (pid,) in db.execute(query)]


def _leftovers(home: Path, quickstart_pid: int) -> list[str]:
    """Live processes of that quickstart: its worker (by node name) or a trainer (by home)."""
    return [
        *_processes_mentioning(str(home)),
        *_processes_mentioning(f"quickstart-{quickstart_pid}@"),
        *_processes_mentioning(f"quickstart-exporter-{quickstart_pid}@"),
    ]


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


@dataclass(frozen=True)
class FirstRun:
    """A quickstart on a fresh home, and what was left of it the moment it exited."""

    home: Path
    returncode: int
    output: str
    api_port_open: bool
    leftovers: list[str]
    job_states: list[str]
    controllers: list[tuple[int, bool]]
    export_queues: list[str]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Iterator[FirstRun]:
    """`quickstart --steps 20` on a fresh home; the rerun test reuses that home."""
    home = tmp_path_factory.mktemp("quickstart") / "home"
    proc = _quickstart(home, corpus_dir, "--steps", "20")
    output, _ = proc.communicate(timeout=600)
    port = _api_port_in(output)
    db = (home / "torchyard.db").exists()
    yield FirstRun(
        home=home,
        returncode=proc.returncode,
        output=output,
        api_port_open=port is not None and _port_open(port),
        leftovers=_leftovers(home, proc.pid),
        job_states=_job_states(home) if db else [],
        controllers=_controllers(home) if db else [],
        export_queues=_export_queues(home) if db else [],
    )


def test_quickstart_trains_reports_and_stops_everything(first_run: FirstRun) -> None:
    output = first_run.output
    assert first_run.returncode == 0, output
    for expected in (
        "-> running",
        "-> succeeded",
        "train loss",
        "eval loss",
        "unigram baseline",
        "tokens/s",
        "sample",
        f"{first_run.home}/storage",
    ):
        assert expected in output, f"{expected!r} missing from:\n{output}"
    assert re.search(r"API key\s+\S+", output)
    port = _api_port(output)
    # where the dashboard is, and how to get in (issue 28, item 10)
    assert re.search(rf"dashboard\s+http://127\.0\.0\.1:{port}/ui/", output), output
    eval_loss = float(re.search(r"eval loss\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    unigram = float(re.search(r"unigram baseline\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    assert 0 < eval_loss < 8 and 0 < unigram < 8
    _api_port(output)  # the API was started
    assert not first_run.api_port_open, "the API must be stopped"
    assert first_run.leftovers == []
    assert first_run.job_states == ["succeeded"]
    # It ran a controller (the reconcile loop; /readyz says `degraded` without one), stopped too
    assert len(first_run.controllers) == 1, first_run.controllers
    assert first_run.controllers[0][1] is False, "the controller must be stopped"
    # and an exporter on the export queue, so the dashboard's Export button is served
    assert first_run.export_queues == [Settings.model_fields["export_queue"].default]


def test_a_rerun_reuses_the_corpus_and_ctrl_c_cancels_its_job_and_stops_the_servers(
    first_run: FirstRun, corpus_dir: Path
) -> None:
    assert first_run.returncode == 0, first_run.output
    home = first_run.home
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
    assert _job_states(home) == ["succeeded", "cancelled"]
    (dataset,) = re.findall(r"dataset (ds_\w+)", first_run.output)
    assert re.findall(r"dataset (ds_\w+)", output) == [dataset], (
        "a rerun on the same home must reuse the registered corpus"
    )
