"""Dataset statistics, accumulated record by record in bounded memory.

Served on `GET /v1/datasets/{id}` as `stats` (docs/CONTRACTS.md). Lengths are in characters
(Unicode code points) of message contents / strings, not of the JSON:

- `example`: the whole example — every message's content (or prompt + completion, or
  prompt + chosen + rejected for `preference`, or the `text`).
- `supervised`: the part a loss sees — trained assistant messages (weight not 0), the
  completion, chosen + rejected (both are scored by DPO), or the whole `text`.

Percentiles are nearest-rank (`numpy.percentile(method="inverted_cdf")`) over a uniform
reservoir sample of `RESERVOIR` records (Vitter 1985, Algorithm R), exact while the dataset has
at most that many records; `max` is always exact. Duplicates are exact: records whose canonical
JSON (keys sorted, orjson) has the same 16-byte BLAKE2b digest, counted among the first
`MAX_HASHES` distinct records (about 100 MB of digests at the cap).

Warnings count records and never refuse a dataset. Besides duplicates and long examples, a
`messages` conversation is counted, as OpenAI's data-preparation guidance for chat fine-tuning
counts examples ("Data preparation and analysis for chat model fine-tuning", OpenAI Cookbook),
when it has no user message (`no_user_message`) and when an assistant message ends in one short
string repeated over and over (`repeated_text`: a degenerate generation pasted into the data,
which fine-tuning teaches the model to produce; `repeats_short_string`).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict

from dataformat.records import (
    Conversation,
    MessagesRecord,
    PreferenceRecord,
    PromptCompletionRecord,
    PromptRecord,
    Record,
    TextRecord,
)

RESERVOIR = 10_000
MAX_HASHES = 1_000_000
LONG_RECORD_CHARS = 32_768
"""An example longer than this (characters) is warned about: at ~4 characters per token it
exceeds an 8k context and will be truncated or dropped at training time."""
REPEAT_UNIT_CHARS = 50
"""The longest string whose repetition is warned about (`repeats_short_string`)."""
REPEAT_TIMES = 8
REPEAT_RUN_CHARS = 32
"""A repetition is warned about when the string repeats at least `REPEAT_TIMES` times in a row
over at least `REPEAT_RUN_CHARS` characters (`hahaha...`: 16 times)."""
_SEED = 0  # a fixed seed: the same file gives the same stats


class Lengths(BaseModel):
    """Length percentiles (characters, or tokens for `tokens` datasets)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    p50: int
    """Median length."""
    p90: int
    """90th percentile."""
    p99: int
    """99th percentile."""
    max: int
    """Longest."""


class StatsWarning(BaseModel):
    """Something that did not refuse the dataset but deserves a look."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    type: str
    """A stable name for the kind of warning."""
    message: str
    """What was found, in words."""
    count: int
    """Records it concerns."""
    first: str
    """Where it first occurs: `line 3` (JSONL) or `row 3` (Parquet)."""


class DatasetStats(BaseModel):
    """What validation learned about a dataset's records."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    records: int
    """Records (JSONL lines / Parquet rows); a flat `.bin`/`.npy` token array is one record."""
    bytes: int
    """Uncompressed bytes of the records (JSONL lines, canonical JSON of Parquet rows, token
    array bytes)."""
    roles: dict[str, int] = {}
    """Messages per role, over every message list of every record."""
    chars: dict[str, Lengths] | None = None
    """`example` and `supervised` length percentiles in characters (record formats)."""
    tokens: Lengths | None = None
    """Per-record token counts (`tokens` in Parquet); a flat array has one record."""
    num_tokens: int | None = None
    """Tokens in all records (token formats); else None."""
    supervised_tokens: int | None = None
    """`tokens` with `labels` (!= -100) or `loss_mask` (== 1); else None (all are)."""
    max_token_id: int | None = None
    """The largest token id (token formats): must be below the model's vocabulary size."""
    token_dtype: str | None = None
    """The token array's dtype, `uint16` or `uint32` (token formats)."""
    duplicates: int = 0
    """Records identical (canonical JSON) to an earlier one."""
    warnings: list[StatsWarning] = []
    """What deserves a look, by kind."""


@dataclass
class Measure:
    """The lengths and roles of one record."""

    example_chars: int
    supervised_chars: int
    roles: list[str]
    system_after_first: bool = False
    no_user_message: bool = False
    repeated_text: bool = False


def _content_chars(messages: Conversation, *, trained_only: bool) -> int:
    return sum(len(m.content or "") for m in messages if m.trained or not trained_only)


def _chars(value: str | Conversation, *, trained_only: bool = False) -> int:
    if isinstance(value, str):
        return len(value)
    return _content_chars(value, trained_only=trained_only)


def _messages(*values: str | Conversation | None) -> list[Conversation]:
    return [v for v in values if v is not None and not isinstance(v, str)]


def repeats_short_string(text: str) -> bool:
    """Whether `text` ends (trailing whitespace aside) in one string of at most
    `REPEAT_UNIT_CHARS` characters, holding a letter, repeated `REPEAT_TIMES` times in a row
    over at least `REPEAT_RUN_CHARS` characters: `I'm sorry. I'm sorry. ...`, `the the the ...`.
    A degenerate generation loops until its length limit, so the loop is at the end; digits
    (`1000000000`) and rules (`--------`) are not repetitions of a word. Only the periods at which
    the last character recurs are tried: a few microseconds per message."""
    text = text.rstrip()
    if len(text) < REPEAT_RUN_CHARS:
        return False
    # A period p needs text[-1 - p] == text[-1]: only those p are tried, nearest first.
    window = text[-(REPEAT_UNIT_CHARS + 1) :]
    end = len(window) - 1
    at = window.rfind(window[-1], 0, end)
    while at >= 0:
        period = end - at
        times = max(REPEAT_TIMES, -(-REPEAT_RUN_CHARS // period))
        unit = text[-period:]
        fits = period * times <= len(text)
        if fits and text.endswith(unit * times) and any(c.isalpha() for c in unit):
            return True
        at = window.rfind(window[-1], 0, at)
    return False


def measure(record: Record) -> Measure:
    """Characters of the whole example and of its supervised part, its message roles, and what
    a chat conversation is warned about."""
    if isinstance(record, TextRecord):
        return Measure(len(record.text), len(record.text), [])
    if isinstance(record, MessagesRecord):
        lists = [record.messages]
        example = _chars(record.messages)
        supervised = _chars(record.messages, trained_only=True)
    elif isinstance(record, PromptCompletionRecord):
        lists = _messages(record.prompt, record.completion)
        example = _chars(record.prompt) + _chars(record.completion)
        supervised = _chars(record.completion, trained_only=True)
    elif isinstance(record, PromptRecord):  # nothing supervised: the answers are sampled
        prompt = record.conversation or record.prompt or ""
        lists = _messages(prompt)
        example, supervised = _chars(prompt), 0
    else:
        assert isinstance(record, PreferenceRecord)
        lists = _messages(record.prompt, record.chosen, record.rejected)
        answers = _chars(record.chosen, trained_only=True) + _chars(
            record.rejected, trained_only=True
        )
        example, supervised = _chars(record.prompt) + answers, answers
    roles = [m.role for messages in lists for m in messages]
    late_system = any(m.role == "system" for m in lists[0][1:]) if lists else False
    measured = Measure(example, supervised, roles, system_after_first=late_system)
    if isinstance(record, MessagesRecord):
        measured.no_user_message = "user" not in roles
        measured.repeated_text = any(
            repeats_short_string(m.content or "") for m in record.messages if m.role == "assistant"
        )
    return measured


def digest(canonical: bytes) -> bytes:
    """The 16-byte BLAKE2b digest of a record's canonical bytes (for duplicate counting)."""
    return hashlib.blake2b(canonical, digest_size=16).digest()


@dataclass
class _Warning:
    message: str
    count: int
    first: str


class _Reservoir:
    """A uniform sample of at most `RESERVOIR` rows of ints, plus the exact maximum per column."""

    def __init__(self, columns: int) -> None:
        self.rows: list[tuple[int, ...]] = []
        self.seen = 0
        self.max = [0] * columns
        self._rng = random.Random(_SEED)

    def add(self, row: tuple[int, ...]) -> None:
        self.seen += 1
        self.max = [max(a, b) for a, b in zip(self.max, row, strict=True)]
        if len(self.rows) < RESERVOIR:
            self.rows.append(row)
            return
        slot = self._rng.randrange(self.seen)
        if slot < RESERVOIR:
            self.rows[slot] = row

    def lengths(self, column: int) -> Lengths:
        values = np.array([row[column] for row in self.rows] or [0])
        p50, p90, p99 = np.percentile(values, [50, 90, 99], method="inverted_cdf")
        return Lengths(p50=int(p50), p90=int(p90), p99=int(p99), max=self.max[column])


@dataclass
class StatsAccumulator:
    """Feed it every valid record (`add`) or token row (`add_tokens`); `result()` at the end."""

    unit: str = "line"
    records: int = 0
    num_bytes: int = 0
    roles: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    _hashes: set[bytes] = field(default_factory=set)
    _chars: _Reservoir = field(default_factory=lambda: _Reservoir(2))
    _tokens: _Reservoir = field(default_factory=lambda: _Reservoir(1))
    _warnings: dict[str, _Warning] = field(default_factory=dict)

    def warn(self, type_: str, number: int, message: str) -> None:
        """Count a warning of `type_` at record `number` (the first one's message is kept)."""
        if type_ in self._warnings:
            self._warnings[type_].count += 1
        else:
            self._warnings[type_] = _Warning(message, 1, f"{self.unit} {number}")

    def _count(self, number: int, canonical: bytes, nbytes: int) -> None:
        self.records += 1
        self.num_bytes += nbytes
        key = digest(canonical)
        if key in self._hashes:
            self.duplicates += 1
            self.warn("duplicates", number, "records identical to an earlier record")
        elif len(self._hashes) < MAX_HASHES:
            self._hashes.add(key)
        else:
            self.warn(
                "duplicates_sampled",
                number,
                f"duplicates counted among the first {MAX_HASHES} distinct records only",
            )

    def add(self, number: int, canonical: bytes, record: Record, *, nbytes: int) -> None:
        """One valid record: `canonical` is its sorted-key JSON, `nbytes` its size as stored."""
        self._count(number, canonical, nbytes)
        m = measure(record)
        self.roles.update(m.roles)
        self._chars.add((m.example_chars, m.supervised_chars))
        if m.system_after_first:
            self.warn("system_not_first", number, "a system message after the first turn")
        if m.example_chars > LONG_RECORD_CHARS:
            self.warn("long_record", number, f"an example over {LONG_RECORD_CHARS} characters")
        if m.no_user_message:
            self.warn("no_user_message", number, "conversations without a user message")
        if m.repeated_text:
            self.warn(
                "repeated_text",
                number,
                "conversations with an assistant message that ends in one short string "
                f"repeated {REPEAT_TIMES}+ times (a degenerate generation?)",
            )

    def add_tokens(self, number: int, ids: bytes, num_tokens: int) -> None:
        """One pre-tokenized row: `ids` the bytes of its token ids."""
        self._count(number, ids, len(ids))
        self._tokens.add((num_tokens,))

    def result(self, **extra: object) -> DatasetStats:
        warnings = [
            StatsWarning(type=t, message=w.message, count=w.count, first=w.first)
            for t, w in self._warnings.items()
        ]
        chars = None
        if self._chars.seen:
            chars = {"example": self._chars.lengths(0), "supervised": self._chars.lengths(1)}
        tokens = self._tokens.lengths(0) if self._tokens.seen else None
        return DatasetStats.model_validate(
            {
                "records": self.records,
                "bytes": self.num_bytes,
                "roles": dict(sorted(self.roles.items())),
                "chars": chars,
                "tokens": tokens,
                "duplicates": self.duplicates,
                "warnings": warnings,
                **extra,
            }
        )
