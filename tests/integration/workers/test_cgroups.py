"""Job cgroups on this host's real cgroup filesystem (`workers/isolation/cgroups.py`): what a
starting worker's sweep may remove. Every worker of a host puts its jobs' groups under the same
parent, and a node's group is empty from its creation until its first process joins it; a sweep that
removed it then made the node's launch fail (CI: "cannot launch: No such file or directory:
.../cgroup.procs")."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from workers.isolation import cgroups


@pytest.fixture
def group() -> Iterator[cgroups.JobCgroup]:
    made = cgroups.create(cgroups.node_name(0, 1, 0), memory_bytes=None, cpus=None)
    if made is None:
        pytest.skip("this host gives no writable cgroup")
    yield made
    made.remove()


def test_a_sweep_keeps_a_group_just_made_for_a_node_that_has_not_joined_it_yet(
    group: cgroups.JobCgroup,
) -> None:
    cgroups.sweep()
    assert all(d.is_dir() for d in group.dirs), "a young empty group is a node about to join it"
    assert len(group.join_fds()) == len(group.dirs), "and its node can still join it"


def test_a_sweep_removes_an_empty_group_older_than_its_minimum_age(
    group: cgroups.JobCgroup,
) -> None:
    past = time.time() - cgroups.SWEEP_MIN_AGE_S - 5
    for d in group.dirs:
        os.utime(d, (past, past))
    assert cgroups.sweep() >= len(group.dirs)
    assert not any(d.exists() for d in group.dirs), "an old empty group is a dead worker's"


def test_a_sweep_keeps_an_old_group_whose_processes_still_run(
    group: cgroups.JobCgroup,
) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        for fd in group.join_fds():
            os.write(fd, str(child.pid).encode())
        past = time.time() - cgroups.SWEEP_MIN_AGE_S - 5
        for d in group.dirs:
            os.utime(d, (past, past))
        cgroups.sweep()
        assert group.processes() == [child.pid]
        assert all(d.is_dir() for d in group.dirs)
    finally:
        child.kill()
        child.wait()
