"""Packing rows: positions restart, segments, padding, no label across an example boundary,
efficiency, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.packing import IGNORE_INDEX, RowPacker


def _example(length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, length).astype(np.int32)
    supervised = rng.random(length) < 0.6
    labels = np.full(length, IGNORE_INDEX, dtype=np.int32)
    labels[:-1] = np.where(supervised[1:], ids[1:], IGNORE_INDEX)
    return ids, labels


def _pack(lengths: list[int], *, packing: bool, seq_len: int = 32) -> tuple[list, RowPacker]:  # type: ignore[type-arg]
    rows: list[dict[str, np.ndarray]] = []
    packer = RowPacker(
        seq_len, packing=packing, pad_id=0, emit=lambda **r: rows.append(r), window=4
    )
    for i, length in enumerate(lengths):
        packer.add(*_example(length, i))
    packer.close()
    return rows, packer


LENGTHS = [5, 17, 9, 32, 1, 30, 12, 12, 7, 20, 3, 8]


def test_packed_rows_hold_every_example_whole_with_positions_restarting() -> None:
    rows, _ = _pack(LENGTHS, packing=True)
    found = []
    for row in rows:
        segs = row["segment_ids"]
        for s in sorted(set(segs[segs >= 0].tolist())):
            where = np.flatnonzero(segs == s)
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1))  # contiguous
            assert np.array_equal(row["position_ids"][where], np.arange(len(where)))
            found.append(row["input_ids"][where])
        assert np.all(np.diff(segs[segs >= 0]) >= 0)  # 0, 0, 1, 1, 2 ...
        assert np.all(segs[segs < 0] == -1) and np.all(row["labels"][segs < 0] == IGNORE_INDEX)
    expected = sorted(_example(n, i)[0].tolist() for i, n in enumerate(LENGTHS))
    assert sorted(ids.tolist() for ids in found) == expected
    assert len(rows) < len(LENGTHS)


def test_no_supervised_label_crosses_an_example_boundary() -> None:
    rows, _ = _pack(LENGTHS, packing=True)
    for row in rows:
        segs, labels, ids = row["segment_ids"], row["labels"], row["input_ids"]
        last_of_segment = np.flatnonzero((segs[:-1] != segs[1:]) & (segs[:-1] >= 0))
        assert np.all(labels[last_of_segment] == IGNORE_INDEX)
        within = np.flatnonzero((labels[:-1] != IGNORE_INDEX) & (segs[:-1] == segs[1:]))
        assert np.array_equal(labels[within], ids[within + 1])  # shifted within the example


def test_unpacked_rows_hold_one_example_each_padded() -> None:
    rows, packer = _pack(LENGTHS, packing=False)
    assert len(rows) == len(LENGTHS)
    for row, length in zip(rows, LENGTHS, strict=True):
        assert np.array_equal(row["segment_ids"][:length], np.zeros(length))
        assert np.all(row["segment_ids"][length:] == -1)
    assert packer.stats.real_tokens == sum(LENGTHS)


def test_efficiency_counts_real_and_supervised_positions_over_slots() -> None:
    rows, packer = _pack(LENGTHS, packing=True)
    report = packer.stats.report()
    assert report["rows"] == len(rows)
    assert report["packing_efficiency"] == pytest.approx(sum(LENGTHS) / (32 * len(rows)))
    supervised = sum(int((r["labels"] != IGNORE_INDEX).sum()) for r in rows)
    assert report["supervised_efficiency"] == pytest.approx(supervised / (32 * len(rows)))
    unpacked = _pack(LENGTHS, packing=False)[1].stats.report()["packing_efficiency"]
    assert report["packing_efficiency"] > unpacked


def test_packing_is_deterministic_in_example_order() -> None:
    a, _ = _pack(LENGTHS, packing=True)
    b, _ = _pack(LENGTHS, packing=True)
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))


def test_an_example_longer_than_a_row_is_refused() -> None:
    packer = RowPacker(8, packing=True, pad_id=0, emit=lambda **r: None)
    with pytest.raises(ValueError, match="9 tokens"):
        packer.add(*_example(9, 0))


def test_a_row_that_fills_up_is_written_while_an_earlier_one_stays_open() -> None:
    rows, _ = _pack([5, 32, 20], packing=True)
    assert [r["segment_ids"].max() for r in rows] == [0, 1]  # [32], then [5, 20]
    assert np.array_equal(rows[0]["input_ids"], _example(32, 1)[0])
