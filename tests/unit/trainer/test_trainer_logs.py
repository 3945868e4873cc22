"""The trainer's log stamps are UTC and say so (issue 45, item 6): a worker in Berlin wrote
`06:47:56,934` in its own zone with no label, beside a job page and a CLI in UTC."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from trainer.logs import formatter

AT = datetime(2026, 11, 25, 6, 47, 56, 934_000, tzinfo=UTC)


@pytest.fixture
def berlin() -> Iterator[None]:
    """The process's local zone is Europe/Berlin (UTC+1 in November)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ")
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_a_trainer_line_in_a_berlin_process_is_stamped_in_utc_and_says_so(berlin: None) -> None:
    assert time.localtime(AT.timestamp()).tm_hour == 7  # the local zone is not UTC
    record = logging.makeLogRecord(
        {"name": "trainer", "levelno": logging.INFO, "levelname": "INFO", "msg": "step 10"}
    )
    record.created = AT.timestamp()
    record.msecs = 934.0
    line = formatter(3).format(record)
    assert line == "[rank3] 2026-11-25 06:47:56.934 UTC INFO trainer: step 10"
