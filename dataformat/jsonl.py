"""JSON Lines files as upload validation (`core.datasets.formats`) and the trainer
(`dataformat.readers`) both read them, so that the trainer reads every file the upload accepted.

- A file is JSONL by its name: `.jsonl`, `.ndjson` or `.json`, optionally followed by `.gz`,
  `.zst` or `.zstd` (`is_jsonl_name`).
- It is decompressed by what its magic bytes say (gzip or zstd, through `zstandard`), not by
  its name (`open_decompressed`).
- It is split into lines in chunks of `CHUNK_BYTES`, so a line over a size limit is reported
  by its size and never held whole (`iter_lines`); the first line loses a UTF-8 byte order
  mark (written by some Windows tools) before it is decoded (`decode_line`, orjson).

Torch- and numpy-free: the API imports it (tests/unit/project/test_layers.py checks).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec
import orjson
import zstandard

CHUNK_BYTES = 1 << 20
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UTF8_BOM = b"\xef\xbb\xbf"


def is_jsonl_name(name: str) -> bool:
    """Whether a file called `name` is JSONL (case-insensitive, compression suffix ignored)."""
    lower = name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        lower = lower.removesuffix(suffix)
    return lower.endswith(JSONL_SUFFIXES)


@contextmanager
def open_decompressed(url: str) -> Iterator[IO[bytes]]:
    """The file at `url` (path or fsspec URL), gzip or zstd decompressed on the fly when its
    magic bytes say so. Decompression errors surface on read (`OSError`, `EOFError`,
    `zlib.error`, `zstandard.ZstdError`)."""
    with fsspec.open(url, "rb") as raw:
        head = raw.read(4)
        raw.seek(0)
        if head.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw) as gz:
                yield gz  # type: ignore[misc]
        elif head.startswith(ZSTD_MAGIC):
            with zstandard.ZstdDecompressor().stream_reader(raw) as zst:
                yield zst
        else:
            yield raw


def iter_lines(
    fh: IO[bytes], limit: int, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[bytes | None, int]]:
    """(line without its newline, size in bytes) per line, read `chunk_bytes` at a time; a
    line over `limit` bytes comes as (None, size) and is never held in memory whole."""
    pending = bytearray()
    skipped = -1  # bytes of an over-long line so far, or -1
    while chunk := fh.read(chunk_bytes):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            start = end + 1
            if skipped >= 0:
                yield None, skipped + len(piece)
                skipped = -1
                continue
            pending += piece
            yield (bytes(pending) if len(pending) <= limit else None), len(pending)
            pending.clear()
        rest = chunk[start:]
        if skipped >= 0:
            skipped += len(rest)
        else:
            pending += rest
            if len(pending) > limit:
                skipped = len(pending)
                pending.clear()
    if skipped >= 0:
        yield None, skipped
    elif pending:
        yield bytes(pending), len(pending)


def decode_line(line: bytes, number: int) -> tuple[Any, str, str]:
    """(object, "", "") or (None, problem message, problem type) for JSONL line `number`
    (1-based; the first loses a UTF-8 byte order mark). Types: `unicode`, `json_invalid`."""
    if number == 1:
        line = line.removeprefix(UTF8_BOM)
    try:
        return orjson.loads(line), "", ""
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as bad:
            return None, f"not valid UTF-8 (byte {bad.start + 1}: {bad.reason})", "unicode"
        return None, f"malformed JSON: {exc}", "json_invalid"
