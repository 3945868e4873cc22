"""Validation of pre-tokenized (`tokens`) datasets, streamed.

- Parquet: an `input_ids` column of integer lists, optional `labels` (-100 = not supervised, as
  Hugging Face models use) or `loss_mask` (0/1) of the same length per row; read in row batches
  with pyarrow, checked column-wise with `pyarrow.compute`.
- `.npy`: a 1-D uint16/uint32 array; the header is read with `numpy.lib.format`, the data
  streamed to find the largest token id.
- `.bin`: a flat array of token ids as nanoGPT writes it (`np.uint16` by default;
  `token_dtype: uint32` for vocabularies over 65,536).
"""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.datasets.problems import Problems
from core.datasets.stats import DatasetStats, StatsAccumulator

TOKEN_DTYPES = ("uint16", "uint32")
IGNORE_INDEX = -100
_CHUNK_TOKENS = 1 << 20
_BATCH_ROWS = 4096


def check(uri: str, kind: str, token_dtype: str | None, problems: Problems) -> DatasetStats | None:
    """Stats of a `tokens` file of `kind` (`parquet`, `npy`, `bin`); problems go to `problems`."""
    if kind == "parquet":
        with fsspec.open(uri, "rb") as fh:
            try:
                return check_parquet(pq.ParquetFile(fh), problems)
            except (pa.ArrowException, OSError) as exc:
                problems.add(None, None, [], f"not a readable Parquet file: {exc}", "parquet")
                return None
    if kind == "npy":
        return _check_npy(uri, problems)
    if kind == "bin":
        return _check_flat(uri, 0, np.dtype(token_dtype or "uint16"), problems)
    problems.add(None, None, [], "tokens datasets are Parquet, .npy or .bin", "format")
    return None


def _check_npy(uri: str, problems: Problems) -> DatasetStats | None:
    with fsspec.open(uri, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        except ValueError as exc:
            problems.add(None, None, [], f"not a readable .npy file: {exc}", "npy")
            return None
        offset = fh.tell()
    if dtype.kind != "u" or dtype.itemsize not in (2, 4) or dtype.byteorder == ">":
        problems.add(
            None, None, ["dtype"], f"dtype: must be uint16 or uint32 (got {dtype})", "dtype"
        )
        return None
    if len(shape) != 1:
        problems.add(None, None, ["shape"], f"shape: must be 1-D (got {shape})", "shape")
        return None
    return _check_flat(uri, offset, dtype, problems, expect=int(shape[0]))


def _check_flat(
    uri: str, offset: int, dtype: np.dtype, problems: Problems, expect: int | None = None
) -> DatasetStats | None:
    """Stream a flat token array from byte `offset`: its length and largest token id."""
    total, largest = 0, 0
    with fsspec.open(uri, "rb") as fh:
        fh.seek(offset)
        carry = b""
        while chunk := fh.read(_CHUNK_TOKENS * dtype.itemsize):
            data = carry + chunk
            whole = len(data) - len(data) % dtype.itemsize
            carry = data[whole:]
            ids = np.frombuffer(data[:whole], dtype=dtype)
            total += len(ids)
            if len(ids):
                largest = max(largest, int(ids.max()))
    if carry:
        problems.add(
            None,
            None,
            [],
            f"{total * dtype.itemsize + len(carry)} bytes are not a "
            f"whole number of {dtype.name} tokens",
            "size",
        )
        return None
    if expect is not None and total != expect:
        problems.add(
            None, None, [], f"the header says {expect} tokens, the file has {total}", "size"
        )
        return None
    if total == 0:
        problems.add(None, None, [], "no tokens", "empty")
        return None
    return DatasetStats(
        records=1,
        bytes=total * dtype.itemsize,
        num_tokens=total,
        max_token_id=largest,
        token_dtype=dtype.name,
    )


def check_parquet(parquet: pq.ParquetFile, problems: Problems) -> DatasetStats | None:
    """Stats of a Parquet `tokens` file: `input_ids` rows, with `labels`/`loss_mask` checked."""
    schema = parquet.schema_arrow
    columns = [c for c in ("input_ids", "labels", "loss_mask") if c in schema.names]
    if "input_ids" not in columns:
        problems.add(None, None, ["input_ids"], "input_ids: column required", "missing")
        return None
    for name in columns:
        kind = schema.field(name).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
            kind.value_type
        ):
            problems.add(
                None, None, [name], f"{name}: must be a list of integers (got {kind})", "type"
            )
            return None
    stats = StatsAccumulator(unit="row")
    first_row, num_tokens, supervised, largest = 1, 0, 0, 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
        lengths = _row_checks(batch, first_row, problems)
        ids = batch.column("input_ids")
        flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i, n in enumerate(lengths):
            if n > 0:
                row_ids = flat[offsets[i] : offsets[i + 1]].astype(np.int64)
                stats.add_tokens(first_row + i, row_ids.tobytes(), int(n))
        num_tokens += int(lengths.sum())
        largest = max(largest, int(flat.max())) if len(flat) else largest
        supervised += _supervised(batch, columns)
        first_row += batch.num_rows
    has_mask = "labels" in columns or "loss_mask" in columns
    return stats.result(
        num_tokens=num_tokens,
        supervised_tokens=supervised if has_mask else None,
        max_token_id=largest,
    )


def _lengths(column: pa.Array) -> np.ndarray:
    """Per-row list lengths; -1 for a null row."""
    return pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)


def _row_checks(batch: pa.RecordBatch, first_row: int, problems: Problems) -> np.ndarray:
    """Report null/empty/negative `input_ids` and mask lengths that differ; the ids' lengths
    (0 for bad rows, which are left out of the stats)."""
    lengths = _lengths(batch.column("input_ids"))
    for i in np.flatnonzero(lengths <= 0):
        what = "must not be null" if lengths[i] < 0 else "must not be empty"
        problems.add("row", first_row + int(i), ["input_ids"], f"input_ids: {what}", "empty")
    for name in ("labels", "loss_mask"):
        if name not in batch.schema.names:
            continue
        other = _lengths(batch.column(name))
        for i in np.flatnonzero((other != lengths) & (lengths > 0)):
            problems.add(
                "row",
                first_row + int(i),
                [name],
                f"{name}: has {max(other[i], 0)} tokens, input_ids has {lengths[i]}",
                "length",
            )
    flat = pc.list_flatten(batch.column("input_ids"))
    if len(flat) and pc.min(flat).as_py() < 0:
        problems.add(
            "row",
            first_row,
            ["input_ids"],
            "input_ids: token ids must be >= 0 (in this batch of rows)",
            "value",
        )
    return np.maximum(lengths, 0)


def _supervised(batch: pa.RecordBatch, columns: list[str]) -> int:
    if "loss_mask" in columns:
        return int(pc.sum(pc.list_flatten(batch.column("loss_mask"))).as_py() or 0)
    if "labels" in columns:
        labels = pc.list_flatten(batch.column("labels"))
        return int(pc.sum(pc.not_equal(labels, IGNORE_INDEX)).as_py() or 0)
    return 0
