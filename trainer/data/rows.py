"""Training rows: fixed-length, pre-shifted token sequences with their loss mask, memory-mapped.

One row is one sequence of T = `model.seq_len` positions; `labels[t]` is the target of input
position `t` (already shifted), `-100` where the position is not supervised (prompt tokens,
padding, the boundary between packed examples). `segment_ids` says which example of the row a
position belongs to (packing: attention is causal *and* confined to one segment, positions
restart per segment); padding has segment -1. Raw text is the degenerate case: every label
supervised, one segment per row.

Rows live as four `.npy` files in one directory, opened with `np.load(mmap_mode="r")` for their
shapes and read row by row with `os.preadv` (`take_rows`), so a rank's memory does not grow
with the corpus: only the rows a batch indexes are read, and none stay mapped.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

IGNORE_INDEX = -100  # `F.cross_entropy(ignore_index=...)` default, and Hugging Face's
ARRAYS = ("input_ids", "labels", "position_ids", "segment_ids")
_META = "rows.json"
_COPY_BYTES = 1 << 20


class Batch(NamedTuple):
    """A micro-batch of rows: four (B, T) int64 tensors on the training device."""

    input_ids: Tensor
    labels: Tensor
    position_ids: Tensor
    segment_ids: Tensor

    @property
    def num_supervised(self) -> int:
        """Positions whose label is supervised (the loss's denominator contribution)."""
        return int((self.labels != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class Rows:
    """N rows of T positions: four (N, T) int32 arrays (memory-mapped when opened from disk).

    `plain`: the raw-text case (`from_chunks`): every label supervised, positions 0..T-1, one
    segment per row. The loop then calls the model without position/segment ids (the plain
    causal path) and counts B x T supervised positions per batch without reading labels.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    segment_ids: np.ndarray
    plain: bool = False

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def batch(self, indices: np.ndarray, device: torch.device) -> Batch:
        """The rows at `indices` (sorted reads are cheapest on a memmap) as a `Batch`."""
        return Batch(*(_gather(getattr(self, name), indices, device) for name in ARRAYS))

    def num_supervised(self, indices: np.ndarray) -> int:
        """Supervised positions over the rows at `indices` (no device transfer; repeated
        indices count again)."""
        if self.plain:
            return len(indices) * self.seq_len
        return int((take_rows(self.labels, np.sort(indices)) != IGNORE_INDEX).sum())

    @classmethod
    def open(cls, directory: str | Path) -> Rows:
        """Memory-map the rows written by `RowsWriter` in `directory` (read-only); `plain`
        when its `rows.json` says so (the raw-text rows of `trainer.data.textrows`)."""
        root = Path(directory)
        arrays = {name: np.load(root / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        meta = json.loads((root / _META).read_text()) if (root / _META).is_file() else {}
        return cls(**arrays, plain=bool(meta.get("plain", False)))

    @classmethod
    def from_chunks(cls, chunks: Tensor) -> Rows:
        """Raw text: (N, T + 1) token chunks -> rows (every target supervised, one segment)."""
        data = chunks.numpy()
        n, t = data.shape[0], data.shape[1] - 1
        positions = np.broadcast_to(np.arange(t, dtype=np.int32), (n, t))
        return cls(
            input_ids=data[:, :-1],
            labels=data[:, 1:],
            position_ids=positions,
            segment_ids=np.broadcast_to(np.zeros(1, dtype=np.int32), (n, t)),
            plain=True,
        )


def _gather(array: np.ndarray, indices: np.ndarray, device: torch.device) -> Tensor:
    if array.strides[0] == 0:  # one row broadcast to all (from_chunks): expand, no copy
        row = torch.from_numpy(np.array(array[0]))  # T values
        row = row.to(device=device, dtype=torch.long, non_blocking=True)
        return row.expand(len(indices), -1)
    values = torch.from_numpy(take_rows(array, indices))
    return values.to(device=device, dtype=torch.long, non_blocking=True)


def mapped_file(array: np.ndarray) -> tuple[str, int] | None:
    """(path, byte offset of row 0) when `array` is a whole C-ordered `.npy` file opened with
    `np.load(mmap_mode=...)`, else None (in memory, or a view of a mapping)."""
    if (
        isinstance(array, np.memmap)
        and isinstance(array.base, mmap.mmap)
        and array.flags.c_contiguous
        and array.filename is not None
    ):
        return str(array.filename), int(array.offset)
    return None


def take_rows(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """`array[indices]` of an (N, T) array as a new (len(indices), T) array.

    A memory-mapped file is read with one `os.preadv` per row instead of through the mapping:
    pages touched through a mapping, and what the kernel reads and maps around them, count in
    the process's RSS for as long as it is mapped, so over an epoch each rank's RSS would grow
    to the size of the corpus. Reads leave the pages in the page cache only. Raises
    `IndexError` for an index outside 0..N-1.
    """
    where = mapped_file(array)
    if where is None:
        return np.ascontiguousarray(array[indices])
    path, offset = where
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= len(array)):
        raise IndexError(f"row index out of range 0..{len(array) - 1}")
    out = np.empty((len(indices), array.shape[1]), dtype=array.dtype)
    row_bytes = out.shape[1] * out.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, index in enumerate(indices.tolist()):
            if os.preadv(fd, [out[i].data], offset + index * row_bytes) != row_bytes:
                raise OSError(f"{path}: shorter than its header says")
    finally:
        os.close(fd)
    return out


class RowsWriter:
    """Builds a rows directory atomically: rows go to a temporary sibling directory, and
    `close()` renames it into place, so a reader sees all of a cache entry or none of it.

    Rows are appended to raw files with buffered writes, never through a memory map: pages
    written through a mapping stay in the writer's RSS until unmapped, which would grow the
    building rank's memory with the corpus. `capacity` bounds the rows. Raises `ValueError`
    on a row of the wrong length or when full.
    """

    def __init__(self, directory: str | Path, *, seq_len: int, capacity: int) -> None:
        self.directory = Path(directory)
        self.seq_len = seq_len
        self.capacity = capacity
        self._tmp = self.directory.with_name(f".{self.directory.name}.{uuid.uuid4().hex}")
        self._tmp.mkdir(parents=True)
        self._files = {name: (self._tmp / f"{name}.raw").open("wb") for name in ARRAYS}
        self.count = 0

    def append(self, **row: np.ndarray) -> None:
        """Add one row: `input_ids`, `labels`, `position_ids`, `segment_ids`, each (T,)."""
        if self.count >= self.capacity:
            raise ValueError(f"RowsWriter is full ({self.capacity} rows)")
        for name in ARRAYS:
            if row[name].shape != (self.seq_len,):
                raise ValueError(f"{name}: shape {row[name].shape}, expected ({self.seq_len},)")
        for name in ARRAYS:
            self._files[name].write(row[name].astype(np.int32, copy=False).tobytes())
        self.count += 1

    def close(self, meta: dict[str, Any] | None = None) -> Rows:
        """Write each array as `.npy` (header, then the raw rows streamed in), write
        `rows.json` (count, seq_len, `meta`), move into place (an existing complete entry
        wins), and return the opened rows."""
        descr = np.lib.format.dtype_to_descr(np.dtype(np.int32))
        header = {"descr": descr, "fortran_order": False, "shape": (self.count, self.seq_len)}
        for name in ARRAYS:
            self._files[name].close()
            raw = self._tmp / f"{name}.raw"
            with raw.open("rb") as source, (self._tmp / f"{name}.npy").open("wb") as target:
                np.lib.format.write_array_header_1_0(target, header)
                shutil.copyfileobj(source, target, _COPY_BYTES)
            raw.unlink()
        self._files.clear()
        info = {"count": self.count, "seq_len": self.seq_len, **(meta or {})}
        (self._tmp / _META).write_text(json.dumps(info, indent=2))
        try:
            os.replace(self._tmp, self.directory)
        except OSError:  # another rank/job finished the same entry first
            shutil.rmtree(self._tmp, ignore_errors=True)
        return Rows.open(self.directory)

    def abort(self) -> None:
        for file in self._files.values():
            file.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
