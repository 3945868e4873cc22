"""Training rows: the writer's atomic, trimmed output and the raw-text degenerate case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.data.rows import ARRAYS, IGNORE_INDEX, Rows, RowsWriter

CPU = torch.device("cpu")


def _row(offset: int, seq_len: int = 4) -> dict[str, np.ndarray]:
    labels = np.arange(seq_len) + offset + 1
    labels[0] = IGNORE_INDEX  # a prompt position
    return {
        "input_ids": np.arange(seq_len) + offset,
        "labels": labels,
        "position_ids": np.arange(seq_len),
        "segment_ids": np.zeros(seq_len, dtype=np.int32),
    }


def test_writer_trims_to_the_rows_written_and_moves_the_entry_into_place(tmp_path: Path) -> None:
    writer = RowsWriter(tmp_path / "entry", seq_len=4, capacity=10)
    for offset in range(3):
        writer.append(**_row(offset))
    rows = writer.close({"dataset": "abc"})
    assert len(rows) == 3 and rows.seq_len == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no temporary left
    batch = rows.batch(np.array([2, 0]), CPU)
    assert batch.input_ids.tolist() == [[2, 3, 4, 5], [0, 1, 2, 3]]
    assert batch.num_supervised == 6 == rows.num_supervised(np.array([0, 2]))


def test_writer_refuses_a_row_of_the_wrong_length(tmp_path: Path) -> None:
    writer = RowsWriter(tmp_path / "entry", seq_len=4, capacity=2)
    with pytest.raises(ValueError, match="input_ids"):
        writer.append(**{**_row(0), "input_ids": np.arange(5)})
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_rows_from_chunks_supervise_every_next_token() -> None:
    chunks = torch.arange(20, dtype=torch.uint8).view(4, 5)
    rows = Rows.from_chunks(chunks)
    assert rows.plain and rows.num_supervised(np.array([1, 3, 3])) == 12  # B x T, no read
    batch = rows.batch(np.array([1]), CPU)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8]]
    assert batch.labels.tolist() == [[6, 7, 8, 9]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0]]


def _mapped_file_bytes() -> int:
    """Resident pages of this process backed by files or shmem (/proc/self/status)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return sum(int(fields[k].split()[0]) * 1024 for k in ("RssFile", "RssShmem"))


def test_writer_keeps_the_rows_it_writes_out_of_its_rss(tmp_path: Path) -> None:
    num_rows, seq_len = 4096, 256  # 4 MiB per array, 16 MiB in all
    row = {
        name: np.arange(seq_len, dtype=np.int32)
        for name in ("input_ids", "labels", "position_ids", "segment_ids")
    }
    writer = RowsWriter(tmp_path / "entry", seq_len=seq_len, capacity=num_rows)
    writer.append(**row)  # the first write opens what it needs
    before = _mapped_file_bytes()
    for _ in range(num_rows - 1):
        writer.append(**row)
    grown = _mapped_file_bytes() - before
    rows = writer.close()
    assert len(rows) == num_rows and np.array_equal(rows.labels[-1], row["labels"])
    # Writing through memory maps made every written page resident (16 MiB); a quarter of one
    # array is left for unrelated mappings of the process.
    assert grown < num_rows * seq_len * 4 / 4


def test_batches_of_mapped_rows_equal_the_arrays_and_leave_no_pages_mapped(
    tmp_path: Path,
) -> None:
    num_rows, seq_len = 2048, 1024  # a row of an array is one 4 KiB page; 8 MiB per array
    writer = RowsWriter(tmp_path / "entry", seq_len=seq_len, capacity=num_rows)
    for offset in range(num_rows):
        writer.append(**_row(offset, seq_len))
    rows = writer.close()
    expected = {name: np.load(tmp_path / "entry" / f"{name}.npy") for name in ARRAYS}
    rng = np.random.default_rng(0)
    rows.batch(rng.integers(0, num_rows, 16), CPU)  # the first call imports what it needs
    before = _mapped_file_bytes()
    batches = np.split(rng.permutation(num_rows)[:1024], 64)  # 1,024 distinct rows
    for indices in batches:
        batch = rows.batch(indices, CPU)
        for name in ARRAYS:
            assert np.array_equal(getattr(batch, name).numpy(), expected[name][indices])
    # Through the mapping, each of the 1,024 distinct rows read makes at least its own 4 KiB
    # page of each of the 4 arrays resident (>= 16 MiB); a quarter of that is left for
    # unrelated mappings of the process.
    assert _mapped_file_bytes() - before < 64 * 16 * 4 * 4096 / 4
    with pytest.raises(IndexError):
        rows.batch(np.array([num_rows]), CPU)
