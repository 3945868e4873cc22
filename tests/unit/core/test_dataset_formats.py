"""The streaming pieces of dataset validation: line splitting, file kinds, bounded statistics."""

from __future__ import annotations

import io

import pytest

from core.datasets import stats as dataset_stats
from core.datasets.formats import file_kind
from core.datasets.stats import StatsAccumulator
from dataformat.jsonl import iter_lines
from dataformat.records import parse_record


class _CountingReader(io.BytesIO):
    """A file whose largest single read is recorded."""

    largest = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.largest = max(self.largest, len(data))
        return data


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 1 << 20])
def test_lines_split_across_chunks_come_out_whole(chunk_bytes: int) -> None:
    data = b'{"a": 1}\n\n{"b": "xyz"}\r\nlast-without-newline'
    lines = list(iter_lines(io.BytesIO(data), limit=100, chunk_bytes=chunk_bytes))
    assert lines == [
        (b'{"a": 1}', 8),
        (b"", 0),
        (b'{"b": "xyz"}\r', 13),
        (b"last-without-newline", 20),
    ]


@pytest.mark.parametrize("chunk_bytes", [4, 5, 16])
def test_an_over_long_line_is_reported_by_size_and_not_held(chunk_bytes: int) -> None:
    long = b"x" * 1000
    fh = _CountingReader(b"ok\n" + long + b"\nok2\n" + long)
    lines = list(iter_lines(fh, limit=10, chunk_bytes=chunk_bytes))
    assert lines == [(b"ok", 2), (None, 1000), (b"ok2", 3), (None, 1000)]
    assert fh.largest <= chunk_bytes


@pytest.mark.parametrize(
    ("name", "head", "kind"),
    [
        ("a.parquet", b"PAR1\x15\x04", "parquet"),
        ("no-suffix", b"PAR1\x15\x04", "parquet"),
        ("a.npy", b"\x93NUMPY\x01\x00", "npy"),
        ("train.bin", b"\x01\x00\x02\x00", "bin"),
        ("chat.jsonl", b'{"messa', "jsonl"),
        ("chat.JSONL.gz", b"\x1f\x8b\x08\x00", "jsonl"),
        ("chat.ndjson.zst", b"\x28\xb5\x2f\xfd", "jsonl"),
        ("chat.json", b"[", "jsonl"),
        ("notes.txt", b'{"text"', "text"),
        ("module.py", b"import", "text"),
    ],
)
def test_file_kind_by_magic_bytes_then_name(name: str, head: bytes, kind: str) -> None:
    assert file_kind(name, head) == kind


def _text_record(n: int) -> tuple[bytes, object]:
    text = "x" * n
    return f'{{"text":"{text}","i":{n}}}'.encode(), parse_record("jsonl_text", {"text": text})


def test_percentiles_are_exact_nearest_rank_below_the_reservoir_size() -> None:
    acc = StatsAccumulator()
    for n in range(1, 101):  # lengths 1..100
        canonical, record = _text_record(n)
        acc.add(n, canonical, record, nbytes=len(canonical))
    chars = acc.result().chars
    assert chars is not None
    # Nearest rank: the ceil(q * 100)-th smallest of 1..100 is ceil(q * 100) itself.
    assert chars["example"].model_dump() == {"p50": 50, "p90": 90, "p99": 99, "max": 100}


def test_the_sample_stays_bounded_and_max_exact_beyond_the_reservoir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dataset_stats, "RESERVOIR", 50)
    acc = StatsAccumulator()
    total = 5000
    for n in range(1, total + 1):
        canonical, record = _text_record(n)
        acc.add(n, canonical, record, nbytes=len(canonical))
    assert len(acc._chars.rows) == 50
    stats = acc.result()
    assert stats.records == total
    assert stats.chars is not None
    example = stats.chars["example"]
    assert example.max == total
    # A uniform sample of 50 from 1..5000: its median lies within the middle 60% with
    # probability > 1 - 1e-6 (binomial tail), and the fixed seed makes this deterministic.
    assert 0.2 * total < example.p50 < 0.8 * total


def test_duplicates_count_records_equal_to_an_earlier_one() -> None:
    acc = StatsAccumulator(unit="row")
    for number, n in enumerate([3, 4, 3, 3, 5], start=1):
        canonical, record = _text_record(n)
        acc.add(number, canonical, record, nbytes=len(canonical))
    stats = acc.result()
    assert stats.duplicates == 2
    assert [(w.type, w.count, w.first) for w in stats.warnings] == [("duplicates", 2, "row 3")]


def test_an_example_over_the_long_record_threshold_is_warned_about() -> None:
    acc = StatsAccumulator()
    for number, n in enumerate([10, dataset_stats.LONG_RECORD_CHARS + 1, 20], start=1):
        canonical, record = _text_record(n)
        acc.add(number, canonical, record, nbytes=len(canonical))
    warnings = acc.result().warnings
    assert [(w.type, w.count, w.first) for w in warnings] == [("long_record", 1, "line 2")]


def test_duplicate_hashes_stop_growing_at_the_cap_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dataset_stats, "MAX_HASHES", 3)
    acc = StatsAccumulator()
    for number, n in enumerate([1, 2, 3, 4, 5, 1], start=1):
        canonical, record = _text_record(n)
        acc.add(number, canonical, record, nbytes=len(canonical))
    assert len(acc._hashes) == 3
    stats = acc.result()
    assert stats.duplicates == 1  # the last record repeats the first, which is tracked
    assert [(w.type, w.count, w.first) for w in stats.warnings] == [
        ("duplicates_sampled", 2, "line 4"),
        ("duplicates", 1, "line 6"),
    ]


@pytest.mark.parametrize(
    ("text", "degenerate"),
    [
        ("Let me check. " + "I'm not sure. " * 9, True),  # a loop to the length limit
        ("the " * 9, True),
        ("ha" * 16, True),  # a 2-character string, 32 characters of it
        ("ha" * 15, False),
        ("x" * 32 + "\n\n", True),  # trailing whitespace aside
        ("the " * 7, False),  # fewer than REPEAT_TIMES
        ("Sure: " + "and then " * 8, True),
        ("abc" * 5 + "defg" * 8 + "." * 3, False),  # the loop does not reach the end
        ("1" + "0" * 40, False),  # a number, not a word
        ("-" * 80, False),  # a rule
        ("| a | b |\n" + "|---" * 20 + "|", False),
        ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP" * 8, False),  # unit of 52
        ("A perfectly ordinary answer. It ends here.", False),
        ("", False),
    ],
)
def test_a_short_string_repeated_at_the_end_is_a_degenerate_answer(
    text: str, degenerate: bool
) -> None:
    assert dataset_stats.repeats_short_string(text) is degenerate
