"""Latency figures of the fault tests (issue 44): the behaviour is asserted, the performance
is measured.

A timed fault test (a lost worker requeued, a cut link noticed, a standby taking over, a cancel
that ends every process) asserts its behaviour within `bound(goal_s)`, a generous limit a
loaded 2-core host never misses, and `record`s what it measured against the goal to
`TORCHYARD_TEST_FIGURES` (a JSONL file; scripts/test.sh sets it). The suite's summary prints
them (tests/conftest.py), which is where README's Performance table takes them from: nothing
in the suite fails because a figure missed its goal in one run of twenty.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FIGURES = os.environ.get("TORCHYARD_TEST_FIGURES")


def bound(goal_s: float) -> float:
    """The suite's limit for a figure whose goal is `goal_s` seconds: three times the goal, and
    at least 30 s more than it."""
    return max(3 * goal_s, goal_s + 30.0)


def record(name: str, value_s: float, goal_s: float) -> None:
    """Append `name`'s measured `value_s` and its `goal_s` (seconds) to the figures file."""
    if not FIGURES:
        return
    line = {
        "figure": name,
        "value_s": round(value_s, 3),
        "goal_s": goal_s,
        "met": value_s <= goal_s,
        "test": (os.environ.get("PYTEST_CURRENT_TEST") or "").split(" ")[0],
    }
    with open(FIGURES, "a") as out:
        out.write(json.dumps(line) + "\n")


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The figures recorded in `path` (none when it does not exist)."""
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
