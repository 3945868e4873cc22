"""`python -m workers worker --pool POOL` | `python -m workers control`.

`worker`: consumes the pool's queue, as many jobs at once as fit the host's devices (threads
pool, one thread per device, prefetch 1; `workers.app`).
`control`: the reconciler: a worker on the control queue with Celery beat embedded.
Extra arguments go to `celery worker` (e.g. `-l DEBUG`, `-n name@%h`).
"""

from __future__ import annotations

import argparse

from workers.app import CONTROL_QUEUE, app


def celery_argv(command: str, pool: str, extra: list[str]) -> list[str]:
    queue = CONTROL_QUEUE if command == "control" else pool
    pool_args = ["--pool", "solo", "--concurrency", "1"]  # the reconciler: one thing at a time
    if command == "worker":
        pool_args = ["--pool", "threads"]  # --concurrency: the device count (workers.app)
    argv = ["worker", "-Q", queue, *pool_args]
    argv += ["--prefetch-multiplier", "1", "--loglevel", "INFO"]
    if command == "control":
        argv.append("--beat")
    return argv + extra


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    parser.add_argument("command", choices=["worker", "control"])
    parser.add_argument("--pool", default="default", help="pool (queue) a worker serves")
    known, extra = parser.parse_known_args(args)
    app.worker_main(celery_argv(known.command, known.pool, extra))


if __name__ == "__main__":
    main()
