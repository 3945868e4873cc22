"""What the trainer's reports say about its pace: step progress (for hang detection,
`workers.watchers.watchdog`) and stragglers among the ranks (from the `rank_step_times` events).

Both are pure: they are fed what `workers.ingest` reads from `events.jsonl` and keep no
handle on processes, files or the database.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

GAP_SAMPLES = 64  # the median time between step reports is taken over this many, the latest
MIN_GAP_SAMPLES = 3  # fewer than this: no median yet (the floor applies)
STRAGGLER_RATIO = 1.5  # a rank slower than this x the median step time of the others ...
STRAGGLER_REPORTS = 3  # ... in this many consecutive reports is a straggler


@dataclass
class StepProgress:
    """The last optimizer step the trainer reported, when the worker saw it, and the times
    between successive step reports.

    `step` only grows within one run of the ranks: a line read again (after a failed
    database write) is no progress. `restarted()` forgets it when torchrun restarted the
    ranks in place, whose setup then is not counted as a hang.
    """

    step: int | None = None
    observed_at: float | None = None  # the worker's time.monotonic() when it saw `step`
    gaps_s: deque[float] = field(default_factory=lambda: deque(maxlen=GAP_SAMPLES))
    _reported_at: float | None = None  # the trainer's unix time of the report of `step`

    def observe(self, points: Iterable[tuple[int, float]], now: float) -> None:
        """Take the (step, unix time of the report) of new metric points, in file order;
        `now`: the worker's `time.monotonic()` (seconds)."""
        for step, reported_at in points:
            if self.step is not None and step <= self.step:
                continue
            if self._reported_at is not None and reported_at >= self._reported_at:
                self.gaps_s.append(reported_at - self._reported_at)
            self.step, self._reported_at, self.observed_at = step, reported_at, now

    def restarted(self) -> None:
        """The ranks were restarted in place: no step is known until they report one."""
        self.step = self.observed_at = self._reported_at = None

    def median_gap_s(self) -> float | None:
        """Median seconds between step reports (a log interval of steps, with whatever eval
        and checkpointing happen in it); None before `MIN_GAP_SAMPLES` gaps were seen."""
        if len(self.gaps_s) < MIN_GAP_SAMPLES:
            return None
        return statistics.median(self.gaps_s)


@dataclass(frozen=True)
class Straggler:
    """Rank `rank` took `seconds` per step, over `ratio` x the median `median_s` of the other
    ranks, in `reports` consecutive reports up to optimizer step `step`."""

    rank: int
    step: int
    seconds: float
    median_s: float
    reports: int

    @property
    def ratio(self) -> float:
        return self.seconds / self.median_s if self.median_s > 0 else float("inf")


class StragglerDetector:
    """Flags a rank whose mean step time exceeds `ratio` x the median of the other ranks in
    `reports` consecutive `rank_step_times` reports; once per rank until it recovers (a report
    at or under the threshold), after which it may be flagged again.

    The median is of the other ranks, not of all: with all, a rank's own time pulls the
    median up, and of two ranks one had to be 3x the other to be over 1.5x their median."""

    def __init__(self, ratio: float = STRAGGLER_RATIO, reports: int = STRAGGLER_REPORTS) -> None:
        """Raises ValueError when `ratio` <= 1 or `reports` < 1."""
        if ratio <= 1 or reports < 1:
            raise ValueError(f"ratio must be > 1 and reports >= 1, got {ratio}, {reports}")
        self.ratio = ratio
        self.reports = reports
        self._streak: dict[int, int] = {}
        self._flagged: set[int] = set()
        self._last_step: int | None = None

    def observe(self, step: int, seconds: Sequence[float]) -> list[Straggler]:
        """Take the report of optimizer step `step` (`seconds`: every rank's mean step time,
        in rank order); returns the ranks that became stragglers with it. A report of a step
        not after the last one (a line read again, the replay after an in-place restart) is
        ignored."""
        if (self._last_step is not None and step <= self._last_step) or len(seconds) < 2:
            return []
        self._last_step = step
        found = []
        for rank, t in enumerate(seconds):
            median = statistics.median([*seconds[:rank], *seconds[rank + 1 :]])
            if t <= self.ratio * median:
                self._streak.pop(rank, None)
                self._flagged.discard(rank)
                continue
            self._streak[rank] = streak = self._streak.get(rank, 0) + 1
            if streak >= self.reports and rank not in self._flagged:
                self._flagged.add(rank)
                found.append(Straggler(rank, step, t, median, streak))
        return found
