"""Examples -> fixed-length rows: packed or one per row, padded.

The rows contract: docs/ARCHITECTURE.md, 'Packing' and 'What a row is'.

Each example arrives already shifted within itself (`dataformat.masks.Example.labels`: its last
position's label is -100), so no label ever crosses into the next example of a packed row.
A row holds T positions: `input_ids`, `labels` (-100 where not supervised), `position_ids`
restarting at 0 for each example, and `segment_ids` 0, 1, 2, ... per example, -1 on padding
(whose labels are -100 and ids the pad id).

Packing is greedy first-fit over a bounded window of open rows (`window`, default 64): an
example goes into the first open row with room, else opens a row; when more than `window`
rows are open the oldest is written out. The window bounds memory (it does not grow with the
corpus) and makes packing deterministic in the examples' order. First-fit-decreasing over the
whole corpus would fill rows a little better but needs all lengths up front (Krell et al.
2021, "Efficient Sequence Packing without Cross-contamination", compare the two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

IGNORE_INDEX = -100  # == trainer.data.rows.IGNORE_INDEX
PAD_SEGMENT = -1


@dataclass
class PackingStats:
    """Rows written, their slots (rows x T), real (non-padding) and supervised positions."""

    rows: int = 0
    slots: int = 0
    real_tokens: int = 0
    supervised_tokens: int = 0

    def report(self) -> dict[str, float | int]:
        slots = max(self.slots, 1)
        return {
            "rows": self.rows,
            "packing_efficiency": self.real_tokens / slots,
            "supervised_efficiency": self.supervised_tokens / slots,
        }


@dataclass(eq=False)  # rows are told apart by identity (their arrays do not compare)
class _OpenRow:
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    used: int = 0


class RowPacker:
    """Turns examples into rows of `seq_len` positions and hands each to `emit(**row)` (the
    four (T,) int32 arrays, as `trainer.data.rows.RowsWriter.append` takes them).

    `packing`: several examples per row (first-fit over `window` open rows); else one example
    per row. Raises `ValueError` for an example longer than `seq_len` (truncate first).
    """

    def __init__(
        self,
        seq_len: int,
        *,
        packing: bool,
        pad_id: int,
        emit: Callable[..., None],
        window: int = 64,
    ) -> None:
        self.seq_len = seq_len
        self.packing = packing
        self.pad_id = pad_id
        self.emit = emit
        self.window = window if packing else 0
        self.open: list[_OpenRow] = []
        self.stats = PackingStats()

    def add(self, input_ids: np.ndarray, labels: np.ndarray) -> None:
        """One example: (L,) ids and (L,) labels shifted within it, L <= seq_len."""
        length = int(input_ids.shape[0])
        if not 0 < length <= self.seq_len or labels.shape != input_ids.shape:
            raise ValueError(f"example of {length} tokens for rows of {self.seq_len}")
        row = next((r for r in self.open if self.seq_len - r.used >= length), None)
        if row is None:
            row = _OpenRow()
            self.open.append(row)
        row.parts.append((input_ids, labels))
        row.used += length
        if row.used == self.seq_len or not self.packing:
            self.open.remove(row)
            self._write(row)
        elif len(self.open) > self.window:
            self._write(self.open.pop(0))

    def close(self) -> PackingStats:
        """Write the rows still open (in the order they were opened); returns the counts."""
        for row in self.open:
            self._write(row)
        self.open = []
        return self.stats

    def _write(self, row: _OpenRow) -> None:
        t = self.seq_len
        ids = np.full(t, self.pad_id, dtype=np.int32)
        labels = np.full(t, IGNORE_INDEX, dtype=np.int32)
        positions = np.zeros(t, dtype=np.int32)
        segments = np.full(t, PAD_SEGMENT, dtype=np.int32)
        start = 0
        for segment, (part_ids, part_labels) in enumerate(row.parts):
            stop = start + part_ids.shape[0]
            ids[start:stop] = part_ids
            labels[start:stop] = part_labels
            positions[start:stop] = np.arange(stop - start, dtype=np.int32)
            segments[start:stop] = segment
            start = stop
        self.emit(input_ids=ids, labels=labels, position_ids=positions, segment_ids=segments)
        self.stats.rows += 1
        self.stats.slots += t
        self.stats.real_tokens += start
        self.stats.supervised_tokens += int((labels != IGNORE_INDEX).sum())
