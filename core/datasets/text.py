"""Raw `text` datasets are UTF-8 text: each file checked block by block as it streams.

The trainer reads a `text` dataset's files in 1 MiB blocks and decodes them as UTF-8, replacing
what does not decode with U+FFFD (trainer/data/textrows.py): a PNG, a UTF-16 file or a stray binary
would train on replacement characters and NUL bytes without a word. So registration and upload
refuse a file holding a NUL byte or bytes that are not UTF-8 (Python's strict incremental
decoder: a character split across two blocks is fine), naming the file, the byte (1-based) and
the line where the text stops being text. Memory is one block, whatever the file's size.
"""

from __future__ import annotations

import codecs

import fsspec

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
    check = TextCheck(name)
    with fsspec.open(uri, "rb") as fh:
        while check.problem is None and (block := fh.read(BLOCK_BYTES)):
            check.feed(block)
    return check.finish()
