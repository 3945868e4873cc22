"""A node's lone rank without torchrun (`workers.lone_rank`): a program written for torchrun
runs unchanged, a process group included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workers import lone_rank
from workers.launcher import RunPaths, free_port

# What a team's script often does even on one process: join the default group from torchrun's
# variables (`env://`) and run a collective.
PROGRAM = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
print(dist.get_rank(), dist.get_world_size(), t.tolist(), flush=True)
dist.destroy_process_group()
"""


def test_a_program_that_joins_a_process_group_runs_as_a_world_of_one(tmp_path: Path) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="")
    env = {**os.environ, **lone_rank.env(job_id=3, attempt=1, rdzv_port=free_port(), paths=paths)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "0 1 [1.0, 1.0]"


def test_only_one_process_on_one_node_without_in_place_restarts_goes_without_torchrun() -> None:
    assert lone_rank.applies(nproc_per_node=1, gang=None, max_restarts=0)
    assert not lone_rank.applies(nproc_per_node=2, gang=None, max_restarts=0)
    assert not lone_rank.applies(nproc_per_node=1, gang=None, max_restarts=1)
