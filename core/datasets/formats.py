"""Dataset validation at registration/upload: every record checked against its format, streamed.

A file is read once, in chunks (never whole in memory), from storage (local or fsspec):

- JSONL (`.jsonl`, `.ndjson`, `.json`, or any file declared as a record format), optionally
  gzip- or zstd-compressed (recognised by magic bytes), decoded with orjson line by line, as
  the trainer reads it (`dataformat.jsonl`);
- Parquet (by magic bytes), read with pyarrow in row batches: record formats as columns, or
  `tokens` (core/datasets/tokens.py);
- `.npy` / `.bin` token arrays (`tokens`, core/datasets/tokens.py);
- anything else is `text`: UTF-8 text without NUL bytes, checked block by block
  (dataformat/text.py).

Each record is validated with the models of `dataformat.records` (the trainer renders from the same
models). Problems name the line (JSONL, 1-based) or row (Parquet, 1-based) and the field path:
`line 17: messages[2].role: must be one of system, user, assistant, tool (got 'robot')`. The
first `MAX_LISTED` are kept, all are counted, and any problem refuses the whole file with
`InvalidInput` (422). A valid file yields its format and `DatasetStats`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from pydantic import ValidationError

from core.datasets import tokens as dataset_tokens
from core.datasets.problems import Problems
from core.datasets.stats import DatasetStats, StatsAccumulator
from dataformat import text as dataset_text
from dataformat.jsonl import decode_line, is_jsonl_name, iter_lines, open_decompressed
from dataformat.records import (
    RECORD_FORMATS,
    detect_format,
    parse_record,
)

PARQUET_BATCH_ROWS = 1024
_PARQUET_MAGIC = b"PAR1"
_NPY_MAGIC = b"\x93NUMPY"
_KEYS_HINT = (
    "expected the keys of one format: text (jsonl_text), messages, prompt + completion, "
    "prompt + chosen + rejected or input + preferred_output (preference)"
)


class Refused(Exception):
    """A problem that ends the scan (the file cannot be read further)."""


@dataclass(frozen=True)
class Checked:
    """A file that passed: its format and (record or token formats) its stats."""

    format: str
    stats: DatasetStats | None


def file_kind(name: str, head: bytes) -> str:
    """`jsonl`, `parquet`, `npy`, `bin` or `text`, by magic bytes and then by name."""
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if name.lower().endswith(".bin"):
        return "bin"
    return "jsonl" if is_jsonl_name(name) else "text"


def check(
    uri: str,
    *,
    declared: str | None,
    token_dtype: str | None,
    max_record_bytes: int,
    where: tuple[str, ...],
) -> Checked:
    """Validate the file at `uri` as `declared` (None: detect it). Streams the file once.

    Raises InvalidInput (422) listing the first `MAX_LISTED` problems, each with its line or
    row and field path, and counting all of them (a `text` file that is not UTF-8 or holds a NUL
    byte: one problem naming the file, byte and line); `where` prefixes every detail's `loc`.
    Raises OSError when the file cannot be read.
    """
    with fsspec.open(uri, "rb") as fh:
        head = fh.read(8)
    kind = file_kind(uri.rsplit("/", 1)[-1], head)
    if declared in RECORD_FORMATS and kind not in ("parquet", "jsonl"):
        kind = "jsonl"  # a declared record format: read the file as JSONL, whatever its name
    problems = Problems(where)
    result = Checked(declared or "text", None)
    try:
        if declared == "tokens" or (declared is None and kind in ("npy", "bin")):
            stats = dataset_tokens.check(uri, kind, token_dtype, problems)
            result = Checked("tokens", stats)
        elif declared == "text" or kind == "text":
            problem = dataset_text.check_file(uri, uri.rsplit("/", 1)[-1])
            if problem is not None:
                problems.add(None, None, [], *problem)
            result = Checked("text", None)
        elif kind == "parquet":
            result = _check_parquet(uri, declared, max_record_bytes, problems)
        else:
            result = _check_jsonl(uri, declared, max_record_bytes, problems)
    except Refused:
        pass
    problems.raise_if_any()
    return result


class _Records:
    """Per-record checks shared by JSONL lines and Parquet rows: decode, format, model, stats."""

    def __init__(self, unit: str, declared: str | None, problems: Problems) -> None:
        self.unit, self.format, self.problems = unit, declared, problems
        self.stats = StatsAccumulator(unit=unit)

    def add(self, number: int, obj: Any, nbytes: int) -> None:
        if not isinstance(obj, dict):
            kind = type(obj).__name__ if obj is not None else "null"
            self.problems.add(
                self.unit, number, [], f"a record is a JSON object, not {kind}", "dict_type"
            )
            return
        detected = detect_format(obj)
        if self.format is None:
            if detected is None or detected == "tokens":
                hint = "tokens are Parquet, .npy or .bin" if detected else _KEYS_HINT
                self.problems.add(
                    self.unit, number, [], f"cannot tell the format: {hint}", "format"
                )
                raise Refused
            self.format = detected
        elif detected is not None and not _same_family(detected, self.format):
            message = f"mixed formats: this record is {detected}, the dataset is {self.format}"
            self.problems.add(self.unit, number, [], message, "mixed_formats")
            return
        try:
            record = parse_record(self.format, obj)
        except ValidationError as exc:
            self.problems.add_validation(self.unit, number, exc)
            return
        self.stats.add(
            number, orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), record, nbytes=nbytes
        )

    def result(self) -> Checked:
        if self.format is None:
            self.problems.add(None, None, [], "the file has no records", "empty")
            raise Refused
        return Checked(self.format, self.stats.result())


def _check_jsonl(uri: str, declared: str | None, limit: int, problems: Problems) -> Checked:
    if declared == "tokens":
        problems.add(None, None, [], "tokens datasets are Parquet, .npy or .bin", "format")
        raise Refused
    records = _Records("line", declared, problems)
    number = 0
    try:
        with open_decompressed(uri) as fh:
            for number, (line, size) in enumerate(iter_lines(fh, limit), start=1):
                if line is None:
                    problems.add(
                        "line",
                        number,
                        [],
                        f"record of {size} bytes is over the limit of {limit} bytes",
                        "too_large",
                    )
                elif line.strip():
                    obj, message, type_ = decode_line(line, number)
                    if type_:
                        problems.add("line", number, [], message, type_)
                    else:
                        records.add(number, obj, size)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        problems.add("line", number + 1, [], f"cannot decompress: {exc}", "compression")
        raise Refused from None
    return records.result()


def _check_parquet(uri: str, declared: str | None, limit: int, problems: Problems) -> Checked:
    with fsspec.open(uri, "rb") as fh:
        try:
            parquet = pq.ParquetFile(fh)
            names = parquet.schema_arrow.names
            if declared == "tokens" or (
                declared is None and detect_format(dict.fromkeys(names)) == "tokens"
            ):
                return Checked("tokens", dataset_tokens.check_parquet(parquet, problems))
            records = _Records("row", declared, problems)
            number = 0
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for row in batch.to_pylist():
                    number += 1
                    size = len(orjson.dumps(row))
                    if size > limit:
                        problems.add(
                            "row",
                            number,
                            [],
                            f"record of {size} bytes is over the limit of {limit} bytes",
                            "too_large",
                        )
                    else:
                        records.add(number, row, size)
        except (pa.ArrowException, OSError, orjson.JSONEncodeError) as exc:
            problems.add(None, None, [], f"not a readable Parquet file: {exc}", "parquet")
            raise Refused from None
    return records.result()


# Record shapes that differ only in whether the last turn is answered: a `messages` record
# without an assistant turn looks like a `prompt` one (OpenAI's RFT shape), a `prompt` record
# with its answer like a `messages` one. Within a dataset of one, a record of the other is
# validated as the dataset's format, whose error says what is wrong with it ("no assistant
# message"), rather than refused as another format.
_FAMILIES = ({"messages", "prompt"},)


def _same_family(detected: str, declared: str) -> bool:
    return detected == declared or any({detected, declared} <= f for f in _FAMILIES)
