"""`python -m workers worker --pool POOL` | `python -m workers controller` |
`python -m workers exporter [--queue exports] [--concurrency 2]` | `python -m workers control`.

`worker`: consumes the pool's queue, as many jobs at once as fit the host's devices (threads
pool, one thread per device, prefetch 1; `workers.app`).
`controller`: the reconcile loop in a process of its own, one leader among any number
(`workers.controller`): run it in every deployment.
`control`: a worker on the control queue with Celery beat embedded (beat's `workers.reconcile`
messages run on it, or on any worker with an idle thread); the controller does not need it.
`slurm`: the submitter of a Slurm pool (`TORCHYARD_SLURM_POOLS`), on a login node: places the
pool's jobs with `sbatch` and follows them with `squeue` (`workers.slurm.submitter`).
`slurm-node --job ID`: the node agent `srun` starts on each node of a job's allocation
(`workers.slurm.agent`); not run by hand.
`exporter`: checkpoint exports (`workers.export_checkpoint`), `--concurrency` at once: no
devices, so training never holds them up.
Extra arguments go to `celery worker` (e.g. `-l DEBUG`, `-n name@%h`).
"""

from __future__ import annotations

import argparse
import sys

from core.platform.settings import get_settings
from workers.app import CONTROL_QUEUE, app


def celery_argv(command: str, pool: str, extra: list[str], concurrency: int = 2) -> list[str]:
    queue = CONTROL_QUEUE if command == "control" else pool
    pool_args = ["--pool", "solo", "--concurrency", "1"]  # the reconciler: one thing at a time
    if command == "worker":
        pool_args = ["--pool", "threads"]  # --concurrency: the device count (workers.app)
    elif command in ("exporter", "slurm"):
        pool_args = ["--pool", "threads", "--concurrency", str(concurrency)]
    argv = ["worker", "-Q", queue, *pool_args]
    argv += ["--prefetch-multiplier", "1", "--loglevel", "INFO"]
    if command == "control":
        argv.append("--beat")
    return argv + extra


def main(args: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["slurm-node"]:
        from workers.slurm import agent

        agent.main(args[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    parser.add_argument("command", choices=["worker", "controller", "control", "exporter", "slurm"])
    parser.add_argument("--pool", default="default", help="pool (queue) a worker serves")
    parser.add_argument("--queue", default=None, help="the exporter's queue (settings)")
    parser.add_argument("--concurrency", type=int, default=None, help="exports at once")
    known, extra = parser.parse_known_args(args)
    if known.command == "controller":
        from workers import controller

        controller.main()
        return
    if known.command == "exporter":
        settings = get_settings()
        queue = known.queue or settings.export_queue
        concurrency = known.concurrency or settings.export_concurrency
        app.worker_main(celery_argv("exporter", queue, extra, concurrency))
        return
    if known.command == "slurm":
        from workers.slurm.submitter import submitter_env_ok

        settings = get_settings()
        if known.pool not in settings.slurm_pools:
            sys.exit(f"pool {known.pool!r} is not in TORCHYARD_SLURM_POOLS")
        if (missing := submitter_env_ok()) is not None:
            sys.exit(f"cannot submit to Slurm here: {missing}")
        app.worker_main(celery_argv("slurm", known.pool, extra, known.concurrency or 4))
        return
    app.worker_main(celery_argv(known.command, known.pool, extra))


if __name__ == "__main__":
    main()
