"""Raw `text` data is UTF-8 text: each file checked block by block as it streams.

A PNG, a UTF-16 file, a static library or a stray wheel read as text would train on
replacement characters and NUL bytes without a word. A NUL byte, or bytes that are not UTF-8
(Python's strict incremental decoder: a character split across two blocks is fine), are not
text:

- upload and registration of one file refuse a file holding any, naming the file, the byte
  (1-based) and the line where the text stops being text;
- in a directory, a file is **binary** when its first block (`BLOCK_BYTES`) holds one
  (`sniff`): a static library, a wheel, an image shows itself there. Registration leaves such
  files out of the dataset and lists them (`classify`), and the trainer never reads them
  (trainer/data/textrows.py), by the same rule, so what the dataset's page says is what a job
  reads. A file that is text in its first block and holds stray bytes later (a Latin-1
  comment in a source file) is text with those bytes dropped when read (`clean_blocks`),
  listed as `repaired` at registration and counted in the job's `data` event.

Memory is one block, whatever the file's size.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import TYPE_CHECKING

import fsspec

if TYPE_CHECKING:  # dataformat.readers imports numpy, which the API's imports leave out
    from dataformat.readers import DataFile

BLOCK_BYTES = 1 << 20


class TextCheck:
    """Feed a file's bytes in order (`feed`), then `finish()`: None, or what makes it not text
    as (message, type), type `unicode` (not UTF-8) or `nul_byte`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problem: tuple[str, str] | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._offset = 0  # bytes fed before the current block
        self._lines = 1  # the line the current block starts on

    def feed(self, block: bytes) -> None:
        """The next `block` of the file (any size; blocks may split a character)."""
        if self.problem is not None:
            return
        pending = len(self._decoder.getstate()[0])  # a character begun in the previous block
        bad_at, reason = len(block), ""
        try:
            self._decoder.decode(block)
        except UnicodeDecodeError as exc:  # its start is in `pending + block`
            bad_at, reason = exc.start - pending, exc.reason
        nul = block.find(b"\x00", 0, max(bad_at, 0))
        if nul >= 0:
            self._refuse(block, nul, "a NUL byte (binary data)", "nul_byte")
        elif reason:
            self._refuse(block, bad_at, f"not UTF-8 ({reason})", "unicode")
        self._offset += len(block)
        self._lines += block.count(b"\n")

    def finish(self) -> tuple[str, str] | None:
        """The file's problem, if any (a file may not end inside a UTF-8 character)."""
        if self.problem is None:
            pending = len(self._decoder.getstate()[0])
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                self._refuse(b"", -pending, f"not UTF-8 ({exc.reason})", "unicode")
        return self.problem

    def _refuse(self, block: bytes, at: int, what: str, type_: str) -> None:
        """The problem at `block[at]` (`at` < 0: in the character begun before `block`)."""
        line = self._lines + block.count(b"\n", 0, max(at, 0))
        byte = self._offset + at + 1
        message = f"{self.name}: byte {byte} (line {line}) is {what}; a text dataset is UTF-8 text"
        self.problem = (message, type_)


def check_file(uri: str, name: str) -> tuple[str, str] | None:
    """Stream the file at `uri` (local path or fsspec URI) through a `TextCheck` named `name`;
    its problem, or None for UTF-8 text. Raises OSError when the file cannot be read."""
    return _check(uri, name)[0]


def _check(uri: str, name: str) -> tuple[tuple[str, str] | None, bool]:
    """(`check_file`'s problem, whether it lies in the first block: `sniff`'s rule), in one
    read of the file that stops at the problem."""
    check = TextCheck(name)
    first = True
    with fsspec.open(uri, "rb") as fh:
        while check.problem is None and (block := fh.read(BLOCK_BYTES)):
            check.feed(block)
            if first and check.problem is not None:
                return check.problem, True
            first = False
    return check.finish(), False


def sniff(uri: str, name: str) -> tuple[str, str] | None:
    """The problem of the file at `uri` within its first block (`BLOCK_BYTES`), or None: a
    binary file shows itself there (a NUL byte, a zip's or an ELF header's non-UTF-8 bytes).
    A last character cut by the block's end is not a problem. Raises OSError when the file
    cannot be read."""
    check = TextCheck(name)
    with fsspec.open(uri, "rb") as fh:
        check.feed(fh.read(BLOCK_BYTES))
    return check.problem


@dataclass(frozen=True)
class NotText:
    """A file of a directory that is not all UTF-8 text: its path relative to the directory,
    its size in bytes and where and why (`check_file`'s message and type)."""

    path: str
    size_bytes: int
    reason: str
    type: str


@dataclass(frozen=True)
class Classified:
    """A directory's selected files by content: `binary` (left out), `repaired` (text with
    stray bytes that are dropped when read), and the bytes of all of them."""

    binary: list[NotText]
    repaired: list[NotText]
    total_bytes: int


def classify(files: list[DataFile]) -> Classified:
    """Read each of `files` once, in the order given, up to its first problem: binary when that
    lies in its first block (`sniff`'s rule), repaired when further on. Raises OSError when one
    cannot be read."""
    binary: list[NotText] = []
    repaired: list[NotText] = []
    total = 0
    for f in files:
        fs, path = fsspec.core.url_to_fs(f.url)
        size = int(fs.size(path))
        total += size
        problem, in_first_block = _check(f.url, f.rel)
        if problem is not None:
            (binary if in_first_block else repaired).append(NotText(f.rel, size, *problem))
    return Classified(binary, repaired, total)


class CleanBlocks:
    """A text file's blocks with what is not text dropped: bytes that are not UTF-8 and NUL
    bytes. Feed blocks in order (`clean`), then `finish()`; `dropped` counts the bytes
    removed. A first block that begins inside a character (a read from the middle of a file,
    `mid_file`) loses those continuation bytes without counting them."""

    def __init__(self, *, mid_file: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("ignore")
        self._skip_lead = mid_file
        self.dropped = 0

    def clean(self, block: bytes) -> bytes:
        if self._skip_lead:
            self._skip_lead = False
            block = block[len(block) - len(block.lstrip(_CONTINUATION)) :]
        pending = len(self._decoder.getstate()[0])
        if not pending and b"\x00" not in block and _whole_utf8(block):
            return block  # the common case, without a copy
        out = self._decoder.decode(block).replace("\x00", "").encode()
        self.dropped += pending + len(block) - len(self._decoder.getstate()[0]) - len(out)
        return out

    def finish(self) -> bytes:
        pending = len(self._decoder.getstate()[0])
        out = self._decoder.decode(b"", final=True).encode()
        self.dropped += pending - len(out)
        return out


_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 continuation bytes


def _whole_utf8(block: bytes) -> bool:
    """Whether `block` is UTF-8 that ends on a character's end."""
    if block.isascii():
        return True
    try:
        return codecs.utf_8_decode(block, "strict", False)[1] == len(block)
    except UnicodeDecodeError:
        return False
