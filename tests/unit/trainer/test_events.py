"""The trainer's events file: whole lines, also after a writer died mid-line."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.events import EventWriter


def test_a_new_writer_ends_a_torn_last_line_before_appending(tmp_path: Path) -> None:
    """An in-place restart's trainer appends to the events file of the one that died."""
    (tmp_path / "events.jsonl").write_text('{"type": "metric"}\n{"type": "metr')
    writer = EventWriter(tmp_path, attempt=1)
    writer.status("running", "go", {"restart": 1})
    writer.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert lines[:2] == ['{"type": "metric"}', '{"type": "metr']
    assert json.loads(lines[2])["data"] == {"restart": 1}


def test_a_new_writer_adds_nothing_to_whole_lines(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text('{"type": "metric"}\n')
    EventWriter(tmp_path, attempt=1).close()
    EventWriter(tmp_path / "fresh", attempt=1).close()
    assert (tmp_path / "events.jsonl").read_text() == '{"type": "metric"}\n'
    assert (tmp_path / "fresh" / "events.jsonl").read_text() == ""
