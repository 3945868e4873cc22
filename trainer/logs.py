"""The trainer's own log lines: `[rank0] 2026-11-25 06:47:56.934 UTC INFO trainer.loop: ...`.

Stamps are UTC and say so, whatever `TZ` the worker's host or the job sets: the job page and
`torchyard logs` show these lines beside times they print in UTC (`torchyard.render.format_when`,
the dashboard's `fmtTime`), so one instant reads the same in all three.
"""

from __future__ import annotations

import logging
import sys
import time

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class UtcFormatter(logging.Formatter):
    """`logging.Formatter` with `asctime` in UTC (`time.gmtime`), not the host's local time."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime(datefmt or DATE_FORMAT, time.gmtime(record.created))


def formatter(rank: int) -> logging.Formatter:
    """The format of rank `rank`'s lines (its `[rank<r>]` prefix, the page's rank filter)."""
    return UtcFormatter(
        f"[rank{rank}] %(asctime)s.%(msecs)03d UTC %(levelname)s %(name)s: %(message)s",
        datefmt=DATE_FORMAT,
    )


def log_to_stdout(rank: int) -> None:
    """Send INFO and above to stdout (which the worker stores as this rank's log)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter(rank))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
