"""`torchyard logs --grep/--since`: which log lines to print, and one rank prefix per line."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta

from torchyard.types import LogLine

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """The moment `--since` names: a time ago (`90s`, `10m`, `2h`, `1d`) or an ISO 8601 time
    (UTC when it has no offset). Raises ValueError with the accepted forms otherwise."""
    if match := _AGO.match(text.strip()):
        seconds = float(match[1]) * _UNIT_S[match[2]]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give a time ago (90s, 10m, 2h, 1d) or an ISO 8601 time "
            "(2026-11-25T12:00, UTC unless it has an offset)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def compile_grep(pattern: str) -> re.Pattern[str]:
    """`--grep`'s regular expression (Python `re`). Raises ValueError naming the error."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--grep {pattern!r}: not a regular expression: {exc}") from None


def select(
    lines: Iterable[LogLine],
    *,
    grep: re.Pattern[str] | None = None,
    since: datetime | None = None,
) -> Iterator[LogLine]:
    """The lines that match `grep` (searched anywhere in the text) and were stored at or after
    `since`."""
    for line in lines:
        if since is not None and line.created_at is not None and line.created_at < since:
            continue
        if grep is not None and not grep.search(line.line):
            continue
        yield line
