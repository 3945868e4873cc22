"""Streaming readers for the dataset formats: records one at a time, never the whole corpus.

A location is a file or a directory (local path or fsspec URI); a directory's files are those
matching `data.include` and not `data.exclude`, in sorted relative-path order.

- JSONL (`.jsonl`, `.ndjson`, `.json`, optionally `.gz` / `.zst` / `.zstd`, decompressed by
  magic bytes), read line by line as upload validation reads it (`dataformat.jsonl`).
- Parquet (`.parquet`), read in record batches with `pyarrow.parquet.ParquetFile.iter_batches`.
- Flat token arrays (`.npy`, or `.bin` of `data.token_dtype`, uint16 as nanoGPT writes),
  memory-mapped.
- Anything else is raw text (`text` format).

`content_digest` hashes every selected file's bytes (sha256, with its relative path), the
dataset-content part of the cache key: a changed byte anywhere is a new cache entry.
"""

from __future__ import annotations

import fnmatch
import hashlib
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import orjson

from dataformat.errors import InvalidJobError
from dataformat.jsonl import decode_line, is_jsonl_name, iter_lines, open_decompressed
from dataformat.records import detect_format

TOKEN_SUFFIXES = (".npy", ".bin")
_BATCH_ROWS = 1024
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class DataFile:
    """One selected file: its path relative to the location, and its fsspec URL."""

    rel: str
    url: str

    @property
    def kind(self) -> str:
        name = self.rel.lower()
        if is_jsonl_name(name):
            return "jsonl"
        if name.endswith(".parquet"):
            return "parquet"
        if name.endswith(TOKEN_SUFFIXES):
            return "tokens"
        return "text"


def list_files(location: str, include: list[str], exclude: list[str]) -> list[DataFile]:
    """The files of `location` in sorted relative-path order. Raises `InvalidJobError` when it
    does not exist or selects nothing."""
    fs, root = fsspec.core.url_to_fs(location)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]

    def url(path: str) -> str:
        return path if _is_local(fs) else f"{protocol}://{path}"

    if fs.isfile(root):
        return [DataFile(root.rsplit("/", 1)[-1], url(root))]
    if not fs.isdir(root):
        raise InvalidJobError(f"data location {location!r} does not exist")
    root = root.rstrip("/")
    found = {p for pattern in include for p in fs.glob(f"{root}/{pattern}") if fs.isfile(p)}
    files = [
        DataFile(p[len(root) + 1 :], url(p))
        for p in sorted(found)
        if not any(fnmatch.fnmatchcase(p[len(root) + 1 :], x) for x in exclude)
    ]
    if not files:
        raise InvalidJobError(f"no file under {location!r} matches {include} (minus exclude)")
    return files


def content_digest(files: list[DataFile]) -> str:
    """sha256 over each file's relative path and bytes, in order (streamed)."""
    tree = hashlib.sha256()
    for f in files:
        h = hashlib.sha256()
        with fsspec.open(f.url, "rb") as stream:
            while block := stream.read(_READ_BYTES):
                h.update(block)
        tree.update(f"{f.rel}\0{h.hexdigest()}\n".encode())
    return tree.hexdigest()


def iter_records(files: list[DataFile]) -> Generator[tuple[str, bytes, Any], None, None]:
    """(where, raw bytes, decoded object) per record: `where` is `file:line` (JSONL) or
    `file:row` (Parquet). Raises `InvalidJobError` for malformed JSON or a non-record file."""
    for f in files:
        if f.kind == "jsonl":
            yield from _jsonl(f)
        elif f.kind == "parquet":
            yield from _parquet(f)
        else:
            raise InvalidJobError(f"{f.rel}: not a JSONL or Parquet file of records")


def _jsonl(f: DataFile) -> Iterator[tuple[str, bytes, Any]]:
    with open_decompressed(f.url) as stream:
        for number, (line, _) in enumerate(iter_lines(stream, limit=sys.maxsize), start=1):
            if line is None or not line.strip():
                continue
            obj, message, _ = decode_line(line, number)
            if message:
                raise InvalidJobError(f"{f.rel}:{number}: {message}")
            yield f"{f.rel}:{number}", line.rstrip(b"\r"), obj


def _parquet(f: DataFile) -> Iterator[tuple[str, bytes, Any]]:
    import pyarrow.parquet as pq

    with fsspec.open(f.url, "rb") as stream:
        number = 0
        for batch in pq.ParquetFile(stream).iter_batches(batch_size=_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield f"{f.rel}:{number}", orjson.dumps(row, option=orjson.OPT_SORT_KEYS), row


def token_array(f: DataFile, bin_dtype: str = "uint16") -> np.ndarray:
    """A flat `.npy` (any integer dtype) or `.bin` (`bin_dtype`) token file, memory-mapped
    (local files) or read (other URIs)."""
    fs, path = fsspec.core.url_to_fs(f.url)
    local = _is_local(fs)
    if f.rel.lower().endswith(".npy"):
        if local:
            return np.load(path, mmap_mode="r")
        with fsspec.open(f.url, "rb") as stream:
            return np.load(stream)
    if local:
        return np.memmap(path, dtype=np.dtype(bin_dtype), mode="r")
    with fsspec.open(f.url, "rb") as stream:
        return np.frombuffer(stream.read(), dtype=np.dtype(bin_dtype))


def detect(files: list[DataFile]) -> str:
    """The format of `files` from the first file's extension and first record. Raises
    `InvalidJobError` when a record fits no format."""
    first = files[0]
    if first.kind in ("text", "tokens"):
        return first.kind
    for where, _, obj in iter_records([first]):
        found = detect_format(obj)
        if found is None:
            raise InvalidJobError(f"{where}: the record fits no format; set data.format")
        return found
    raise InvalidJobError(f"{first.rel}: no record")


def _is_local(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols
