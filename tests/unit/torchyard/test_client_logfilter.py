"""`--since` forms and the one-prefix log line (torchyard/logfilter.py, torchyard/render.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from torchyard.logfilter import parse_since
from torchyard.render import log_line
from torchyard.types import LogLine

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("90s", timedelta(seconds=90)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1.5d", timedelta(hours=36)),
    ],
)
def test_since_a_time_ago(text: str, ago: timedelta) -> None:
    assert parse_since(text, now=NOW) == NOW - ago


def test_since_an_iso_time_is_utc_unless_it_has_an_offset() -> None:
    assert parse_since("2026-11-25T10:00") == datetime(2026, 11, 25, 10, tzinfo=UTC)
    assert parse_since("2026-11-25T10:00+02:00") == datetime(2026, 11, 25, 8, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rank", "text", "shown"),
    [
        (0, "[rank0] INFO step 1", "[rank 0] INFO step 1"),
        (3, "[rank3]: Traceback", "[rank 3] Traceback"),  # torchrun's own prefix
        (1, "[rank0] from another rank's text", "[rank 1] [rank0] from another rank's text"),
        (-1, "torchrun exited 1", "[launcher] torchrun exited 1"),
    ],
)
def test_a_line_shows_one_rank_prefix(rank: int, text: str, shown: str) -> None:
    assert log_line(LogLine(id=1, rank=rank, line=text)) == shown
