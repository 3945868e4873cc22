"""One look at the host's process table per tick, shared by every job's watchers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from workers.watchers.proctable import ProcessTable
from workers.watchers.usage_watch import tree_cpu_seconds

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


def test_a_tree_is_found_with_its_cpu_seconds_and_one_look_serves_every_caller() -> None:
    table = ProcessTable(max_age_s=3600.0)
    first = table.snapshot()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert table.snapshot() is first  # within max_age_s: the same look for every caller
        # A root the look lacks (a job launched since) is looked for afresh.
        found = table.snapshot(parent.pid)
        assert found is not first and table.snapshot(os.getpid()) is found
        assert found.tree(parent.pid) == [parent.pid, child]
        expected = sum(
            t.user + t.system + t.children_user + t.children_system
            for t in (psutil.Process(parent.pid).cpu_times(), psutil.Process(child).cpu_times())
        )
        measured = tree_cpu_seconds(parent.pid, table)
        assert measured is not None and abs(measured - expected) < 0.05
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=30)
    assert found.tree(-1) == [] and found.tree_cpu_s(-1) is None


def test_a_look_older_than_max_age_is_taken_again() -> None:
    table = ProcessTable(max_age_s=0.0)
    first = table.snapshot()
    while time.monotonic() == first.taken_at:
        pass  # the clock's resolution; no wait for anything else
    assert table.snapshot() is not first
    assert tree_cpu_seconds(os.getpid(), table) is not None
