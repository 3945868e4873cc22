"""`workers.watchers.watchdog.dump_stacks` on real processes: a stand-in for torchrun (its own
process group) with one stopped rank child, dumped by py-spy, or by its faulthandler when py-spy
fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from workers.watchers.watchdog import dump_stacks, py_spy

# A rank: registers faulthandler as the trainer does, then waits in a function of its own.
RANK = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
def waiting_for_a_peer():
    print("ready", flush=True)
    time.sleep(120)
waiting_for_a_peer()
"""
# torchrun's stand-in: starts the rank with torchrun's variables, waits for it.
LAUNCHER = """
import os, subprocess, sys
env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1"}
with open(sys.argv[2], "wb") as out, open(sys.argv[3], "wb") as err:
    subprocess.run([sys.executable, "-c", sys.argv[1]], env=env, stdout=out, stderr=err)
"""


@pytest.fixture
def stopped_rank(tmp_path: Path) -> Iterator[tuple[int, psutil.Process, Path]]:
    """(launcher pgid, the SIGSTOPped rank, the rank's stderr file)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    command = [sys.executable, "-c", LAUNCHER, RANK, str(out), str(err)]
    launcher = subprocess.Popen(command, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text() == "ready\n"):
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.05)
        (rank,) = psutil.Process(launcher.pid).children()
        rank.send_signal(signal.SIGSTOP)
        # the kernel stops it a moment later: a dump that attached before would meet a running
        # rank (CI once saw it running at the test's end, under a loaded host)
        while rank.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the rank never stopped"
            time.sleep(0.01)
        yield launcher.pid, rank, err
    finally:
        for p in psutil.Process(launcher.pid).children():
            p.kill()
        launcher.kill()
        launcher.wait()


def test_py_spy_dumps_a_stopped_rank_numbered_by_its_local_rank(
    stopped_rank: tuple[int, psutil.Process, Path],
) -> None:
    pgid, rank, _ = stopped_rank
    (stacks,) = dump_stacks(pgid, 4, py_spy_path=py_spy())
    assert (stacks.rank, stacks.global_rank, stacks.pid) == (5, 3, rank.pid)  # 4 + LOCAL_RANK
    assert stacks.tool == "py-spy" and stacks.error is None
    assert stacks.text is not None and "waiting_for_a_peer" in stacks.text
    assert rank.status() == psutil.STATUS_STOPPED  # left as it was


@pytest.mark.parametrize(
    ("tool", "error"), [(None, "py-spy not found"), ("/bin/false", "exited 1")]
)
def test_without_py_spy_the_stacks_go_to_the_ranks_stderr_by_faulthandler_once_it_runs(
    stopped_rank: tuple[int, psutil.Process, Path], tool: str | None, error: str
) -> None:
    pgid, rank, stderr = stopped_rank
    (stacks,) = dump_stacks(pgid, 0, py_spy_path=tool)
    assert stacks.tool == "faulthandler" and stacks.text is None
    assert stacks.error is not None and error in stacks.error
    assert stderr.read_text() == ""  # SIGUSR1 is pending while the rank is stopped
    rank.send_signal(signal.SIGCONT)  # as the watchdog does after dumping
    deadline = time.monotonic() + 10
    while "waiting_for_a_peer" not in stderr.read_text():
        assert time.monotonic() < deadline, stderr.read_text()
        time.sleep(0.05)
    assert rank.is_running()  # faulthandler dumps and goes on


def test_a_launch_that_is_itself_the_one_rank_is_dumped_as_that_rank(tmp_path: Path) -> None:
    """A node's one rank started without torchrun (`workers.lone_rank`) leads
    its own process group: the group leader is the rank to dump."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0"}
    with open(tmp_path / "stdout", "wb") as out:
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK], env=env, stdout=out, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while (tmp_path / "stdout").read_text() != "ready\n":
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.05)
        rank.send_signal(signal.SIGSTOP)
        (stacks,) = dump_stacks(rank.pid, 0, py_spy_path=py_spy())
        assert (stacks.rank, stacks.global_rank, stacks.pid) == (0, 0, rank.pid)
        assert stacks.text is not None and "waiting_for_a_peer" in stacks.text
    finally:
        rank.kill()
        rank.wait()
