"""What decides a job's rows (`RowRecipe`, whose hash is the row cache's key), and the held-out
split: which side, training or evaluation, each example or document falls on.

Both splits rank by `eval_score`, a stable number in [0, 1) from sha256 (its first 8 bytes),
so a split does not move when data is added or reordered:

- by example (`ExampleSplit`; records of JSONL/Parquet): the hash of the record's bytes, so
  duplicates land on one side;
- by document (`document_sides`; a directory of raw text files): the hash of the file's
  relative path, so whole documents go to evaluation.

Either way a side left empty by the hashes gets the one example or document that ranks
nearest to it, so both sides hold at least one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

PIPELINE_VERSION = 2  # bump when the rows a recipe produces change (2: max_bytes before split)


@dataclass(frozen=True)
class RowRecipe:
    """Everything that decides the rows; `key` hashes it."""

    format: str
    loss_on: str
    template: str | None
    tokenizer: str
    seq_len: int
    packing: bool
    truncation: str
    eval_fraction: float
    train_digest: str
    eval_digest: str | None
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    max_bytes: int | None
    token_dtype: str | None
    version: int = PIPELINE_VERSION

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def eval_score(key: bytes) -> float:
    """A stable number in [0, 1) from `key`; below `eval_fraction` -> evaluation."""
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64


class ExampleSplit:
    """Held-out split by example: an example is evaluation data when the hash of its bytes
    ranks below `eval_fraction` (duplicates land on one side), with at least one example on
    each side (a count pass over the records finds the extremes). Counts per side are the
    `RowsWriter` capacities."""

    def __init__(self, records: Iterator[tuple[str, bytes, Any]], eval_fraction: float) -> None:
        self.eval_fraction = eval_fraction
        self.counts = [0, 0]  # train, eval
        low = high = (2.0, -1)
        for index, (_, raw, _) in enumerate(records):
            score = eval_score(raw)
            self.counts[score < eval_fraction] += 1
            low, high = min(low, (score, index)), max(high, (-score, index))
        self.forced: dict[int, int] = {}
        if self.counts[1] == 0 and self.counts[0] > 1:
            self.forced[low[1]] = 1
        if self.counts[0] == 0 and self.counts[1] > 1:
            self.forced[high[1]] = 0
        for side in self.forced.values():
            self.counts[side] += 1
            self.counts[1 - side] -= 1

    def side(self, index: int, raw: bytes) -> int:
        """0 train, 1 eval."""
        if index in self.forced:
            return self.forced[index]
        return int(eval_score(raw) < self.eval_fraction)


def document_sides(rel_paths: list[str], eval_fraction: float) -> list[bool]:
    """Held-out split by document: whether each document (by its relative path, two or more)
    is evaluation data. With no document below `eval_fraction` the lowest-ranked one is held
    out; with all of them below, the highest-ranked one stays in training."""
    scores = [eval_score(rel.encode("utf-8")) for rel in rel_paths]
    held = [score < eval_fraction for score in scores]
    if not any(held):
        held[min(range(len(scores)), key=scores.__getitem__)] = True
    if all(held):
        held[max(range(len(scores)), key=scores.__getitem__)] = False
    return held
