"""Read what a growing file gained since last time, complete lines only, by byte offset.

The offset moves only when the caller says the lines are stored (`advance`), so a failed
database write re-reads the same bytes next time; the keyed upserts (`core.jobs.upserts`) make
that safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MAX_READ_BYTES = 1 << 20  # per file per flush: keeps each transaction short


@dataclass(frozen=True, slots=True)
class Chunk:
    """Lines read from `start` up to `end` (byte offsets); each is (offset, bytes without EOL)."""

    start: int
    end: int
    lines: list[tuple[int, bytes]] = field(default_factory=list)


class FileTail:
    """A reader of complete lines appended to `path` (which may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self, *, final: bool = False, max_bytes: int = MAX_READ_BYTES) -> Chunk:
        """Lines after the current offset; does not move it.

        A trailing line without a newline is left for later unless `final` (the writer has
        exited) or it alone fills `max_bytes` (a runaway line must not stall the reader).
        """
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(max_bytes)
        except FileNotFoundError:
            return Chunk(self.offset, self.offset)
        cut = data.rfind(b"\n") + 1
        at_eof = len(data) < max_bytes
        if (final and at_eof) or (cut == 0 and not at_eof and data):
            cut = len(data)
        lines: list[tuple[int, bytes]] = []
        pos = 0
        while pos < cut:
            nl = data.find(b"\n", pos, cut)
            stop = cut if nl < 0 else nl
            lines.append((self.offset + pos, data[pos:stop].rstrip(b"\r")))
            pos = stop + 1
        return Chunk(self.offset, self.offset + cut, lines)

    def advance(self, chunk: Chunk) -> None:
        """Mark `chunk` as stored. Chunks must be advanced in the order they were read."""
        if chunk.start == self.offset:
            self.offset = chunk.end
