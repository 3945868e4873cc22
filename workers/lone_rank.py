"""A node's lone rank, started without torchrun.

One process on one node, with no in-place restarts (`applies`), needs nothing of torchrun's
elastic agent that the worker does not do already: signals go to the launch's process group,
the worker redirects the output itself, restarts go through the queue. The agent would still
cost a second Python with torch imported: ~2.3 CPU-s and ~1.5 s of wall time before the first
step (measured on 2 cores), and its RSS for the whole run. `accelerate launch` runs a single
process without torchrun the same way.

The rank gets the environment torchrun would give it (`env`) and its output and error files
where torchrun would put them (`rank_dir`: torchrun's layout for local rank 0 of its first run),
so the trainer, the runner (`torchyard.train`), the log tails (`RunPaths.rank_logs`) and
`workers.exits` read both launches alike. What differs: the rank leads its process group, its
exit status is the node's (-N for a death by signal N) and there is no launcher output (rank
-1). docs/CONTRACTS.md, section 1.
"""

from __future__ import annotations

from pathlib import Path

from workers.launcher import GangNode, RunPaths, rdzv_id


def applies(*, nproc_per_node: int, gang: GangNode | None, max_restarts: int) -> bool:
    """Whether a node runs its one rank without torchrun: one process (`nproc_per_node`), one
    node (`gang` None) and no in-place restarts (`max_restarts` 0, which only torchrun does)."""
    return nproc_per_node == 1 and gang is None and max_restarts == 0


def rank_dir(paths: RunPaths, job_id: int, attempt: int) -> Path:
    """Where the lone rank of `job_id`'s attempt `attempt` writes `stdout.log`, `stderr.log`
    and `error.json`: `LOG_DIR/job{id}-a{attempt}_single/attempt_0/0`."""
    return paths.log_dir / f"{rdzv_id(job_id, attempt)}_single" / "attempt_0" / "0"


def env(*, job_id: int, attempt: int, rdzv_port: int, paths: RunPaths) -> dict[str, str]:
    """What torchrun would set for the one rank (torch's `LocalElasticAgent`): rank 0 of a
    world of 1, `MASTER_PORT` the node's drawn port (a program that builds a process group
    anyway hosts its store there), and the error file that torch's `@record` writes an uncaught
    exception to, in `rank_dir`."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "ROLE_NAME": "default",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(rdzv_port),
        "TORCHELASTIC_RUN_ID": rdzv_id(job_id, attempt),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",  # no agent: rank 0 hosts a store itself
        "TORCHELASTIC_ERROR_FILE": str(rank_dir(paths, job_id, attempt) / "error.json"),
    }
