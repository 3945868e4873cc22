"""Looking inside a dataset: its files, and a sample of its first records (issue 28, item 2:
"a dataset's page shows its files, a sample of its records").

Both read the dataset's location as a job would (fsspec: a local path or an object-store URI;
records through `dataformat.readers`, the job's own reader), streamed: a sample reads the first
records only, a file listing lists names and sizes without opening a file. A directory's files
are listed as `core.datasets.service.digest_path` counts them (`num_files`): caches, VCS data
and third-party packages left out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import fsspec

from core.datasets.service import tree_files
from core.platform.tables import Dataset
from dataformat import readers
from dataformat.records import RECORD_FORMATS

# A sample's long values are cut: a record at the size limit stays a few KB of JSON.
MAX_SAMPLE_CHARS = 2000
MAX_SAMPLE_ITEMS = 64  # a list of token ids
_TEXT_HEAD_BYTES = 4 * MAX_SAMPLE_CHARS  # UTF-8: at most 4 bytes a character


@dataclass(frozen=True)
class DataFileEntry:
    """One file of a dataset: its path relative to the dataset's location, its size in bytes."""

    path: str
    size_bytes: int


@dataclass(frozen=True)
class SampleItem:
    """One sampled record: where it is (`file:line`, `file:row`, a text file's path, or
    `file:0` for a flat token array), the record (a JSON object, a text head or token ids), and
    whether a value was cut to `MAX_SAMPLE_CHARS` characters or `MAX_SAMPLE_ITEMS` items."""

    where: str
    record: Any
    truncated: bool


def files(
    dataset: Dataset, *, limit: int, after: str | None = None
) -> tuple[list[DataFileEntry], str | None]:
    """The dataset's files in relative-path order, `limit` at a time, those after `after`
    (the last path of the previous page). Returns (page, the next page's `after` or None).
    Raises OSError when the location cannot be read (gone since registration)."""
    fs, root = fsspec.core.url_to_fs(dataset.uri)
    if fs.isfile(root):
        found = [DataFileEntry(root.rstrip("/").rsplit("/", 1)[-1], int(fs.size(root) or 0))]
    elif not fs.isdir(root):
        raise FileNotFoundError(f"{dataset.uri} no longer exists")
    else:
        found = [DataFileEntry(rel, size) for rel, size in tree_files(fs, root)]
    page = [entry for entry in found if after is None or entry.path > after][: limit + 1]
    if len(page) <= limit:
        return page, None
    return page[:limit], page[limit - 1].path


def sample(dataset: Dataset, *, limit: int) -> list[SampleItem]:
    """The dataset's first `limit` records as a job reads them: JSON records (`RECORD_FORMATS`
    and Parquet `tokens` rows), the head of each of the first text files (`text`), or the first
    token ids of a flat `.npy`/`.bin` token file. Raises OSError (unreadable location) or
    `dataformat.errors.InvalidJobError` (a record that no longer parses)."""
    if dataset.format == "text":
        heads = files(dataset, limit=limit)[0]
        fs, root = fsspec.core.url_to_fs(dataset.uri)
        return [_text_head(fs, root, entry) for entry in heads]
    listed = readers.list_files(dataset.uri, ["**"], [])
    if dataset.format in RECORD_FORMATS or listed[0].kind == "parquet":
        records = itertools.islice(readers.iter_records(listed), limit)
        return [_cut(where, record) for where, _, record in records]
    dtype = (dataset.stats or {}).get("token_dtype") or "uint16"
    ids = readers.token_array(listed[0], dtype)[:MAX_SAMPLE_ITEMS]
    return [
        SampleItem(
            f"{listed[0].rel}:0", [int(i) for i in ids], truncated=len(ids) == MAX_SAMPLE_ITEMS
        )
    ]


def _text_head(fs: Any, root: str, entry: DataFileEntry) -> SampleItem:
    path = root if fs.isfile(root) else f"{root.rstrip('/')}/{entry.path}"
    with fs.open(path, "rb") as stream:
        head = stream.read(_TEXT_HEAD_BYTES)
    text = head.decode("utf-8", errors="replace")
    cut = len(text) > MAX_SAMPLE_CHARS or len(head) < entry.size_bytes
    return SampleItem(entry.path, text[:MAX_SAMPLE_CHARS], truncated=cut)


def _cut(where: str, record: Any) -> SampleItem:
    cut = False

    def shorten(value: Any) -> Any:
        nonlocal cut
        if isinstance(value, str) and len(value) > MAX_SAMPLE_CHARS:
            cut = True
            return value[:MAX_SAMPLE_CHARS]
        if isinstance(value, list):
            if len(value) > MAX_SAMPLE_ITEMS:
                cut = True
            return [shorten(v) for v in value[:MAX_SAMPLE_ITEMS]]
        if isinstance(value, dict):
            return {k: shorten(v) for k, v in value.items()}
        return value

    return SampleItem(where, shorten(record), truncated=cut)
