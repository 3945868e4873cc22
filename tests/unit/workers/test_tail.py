"""`workers.tail.FileTail`: complete lines by byte offset, in bounded chunks."""

from __future__ import annotations

from pathlib import Path

from workers.tail import FileTail


def test_tail_returns_complete_lines_with_their_byte_offsets(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    tail = FileTail(path)
    assert tail.read().lines == []  # not created yet
    path.write_bytes(b"one\r\ntwo\nthr")
    chunk = tail.read()
    assert chunk.lines == [(0, b"one"), (5, b"two")]
    assert tail.read().lines == chunk.lines  # nothing moves until advance()
    tail.advance(chunk)
    with path.open("ab") as f:
        f.write(b"ee\nfour")
    chunk = tail.read()
    assert chunk.lines == [(9, b"three")]
    tail.advance(chunk)
    final = tail.read(final=True)
    assert final.lines == [(15, b"four")]
    tail.advance(final)
    assert tail.read(final=True).lines == []


def test_tail_reads_in_bounded_chunks_and_splits_a_runaway_line(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"a" * 10 + b"\nbb\n")
    tail = FileTail(path)
    chunk = tail.read(max_bytes=4)
    assert chunk.lines == [(0, b"aaaa")]
    tail.advance(chunk)
    chunk = tail.read(max_bytes=8)
    assert chunk.lines == [(4, b"aaaaaa")]
    tail.advance(chunk)
    assert tail.read(max_bytes=8).lines == [(11, b"bb")]
