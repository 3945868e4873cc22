"""Raw text through `prepare_rows` (`trainer.data.textrows`): file selection with include/exclude,
the split (whole documents by path hash, a single file by position), `max_bytes`, and the
chunk layout of the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dataformat.errors import InvalidJobError
from tests.support.sft_data import data_spec, prepare
from trainer.data.rows import Rows

SEQ_LEN = 8  # a side's stream loses at most its last seq_len bytes (a partial chunk)


def _write_docs(root: Path, n: int, size: int = 2000) -> None:
    for i in range(n):
        sub = root / ("pkg" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:03d}.py").write_text(f"# document {i:03d}\n" + "x = 1\n" * (size // 6))
    (root / "notes.txt").write_text("not python\n" * 100)


def _stream(rows: Rows) -> bytes:
    """The bytes a side's rows were cut from: each chunk is a row's inputs + its last label."""
    ids = np.concatenate([np.asarray(rows.input_ids), np.asarray(rows.labels)[:, -1:]], axis=1)
    return bytes(ids.reshape(-1).astype(np.uint8))


def _headers(rows: Rows) -> set[str]:
    text = _stream(rows).decode("utf-8", errors="replace")
    return {line for line in text.splitlines() if line.startswith("# document")}


def _same_rows(a: Rows, b: Rows) -> bool:
    return np.array_equal(np.asarray(a.input_ids), np.asarray(b.input_ids)) and np.array_equal(
        np.asarray(a.labels), np.asarray(b.labels)
    )


def test_directory_splits_whole_documents_deterministically(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_docs(data, 60)
    spec = data_spec(data, include=["**/*.py"], eval_fraction=0.1, seq_len=SEQ_LEN)
    first, again = prepare(tmp_path / "a", spec), prepare(tmp_path / "b", spec)
    assert again.report["cached"] is False  # built twice, not read back
    assert _same_rows(first.train, again.train) and _same_rows(first.eval, again.eval)
    train, held = _headers(first.train), _headers(first.eval)
    assert len(train | held) == 60  # notes.txt not included
    assert b"not python" not in _stream(first.train) + _stream(first.eval)
    assert 1 <= len(held) < 60 * 0.3
    assert not train & held  # each document lies wholly on one side


def test_few_documents_still_hold_one_out_for_eval(tmp_path: Path) -> None:
    _write_docs(tmp_path / "data", 3)
    spec = data_spec(tmp_path / "data", include=["**/*.py"], seq_len=SEQ_LEN)
    prepared = prepare(tmp_path, spec)
    assert (len(_headers(prepared.train)), len(_headers(prepared.eval))) == (2, 1)


def test_single_file_splits_by_position(tmp_path: Path) -> None:
    path = tmp_path / "one.txt"
    data = bytes(range(1, 128)) * 80  # every ASCII byte but NUL: text
    path.write_bytes(data)
    prepared = prepare(tmp_path, data_spec(path, eval_fraction=0.25, seq_len=SEQ_LEN))
    cut = len(data) * 3 // 4
    for rows, side in ((prepared.train, data[:cut]), (prepared.eval, data[cut:])):
        stream = _stream(rows)
        assert side.startswith(stream) and len(side) - len(stream) <= SEQ_LEN


def test_raw_text_rows_are_contiguous_chunks_and_batches_shift_targets_by_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "corpus.txt"
    data = bytes(range(1, 101)) * 10  # control characters but no NUL: text
    path.write_bytes(data)
    train = prepare(tmp_path, data_spec(path, eval_fraction=0.25, seq_len=9)).train
    assert len(train) == 750 // 10  # non-overlapping chunks of seq_len + 1, tail dropped
    for i in range(len(train)):
        chunk = np.frombuffer(data[i * 10 : (i + 1) * 10], dtype=np.uint8)
        assert np.array_equal(np.asarray(train.input_ids[i]), chunk[:-1])
        assert np.array_equal(np.asarray(train.labels[i]), chunk[1:])
    assert np.all(np.asarray(train.position_ids) == np.arange(9))
    assert np.all(np.asarray(train.segment_ids) == 0)
    batch = train.batch(np.array([3, 0]), torch.device("cpu"))
    x, y = batch.input_ids, batch.labels
    assert x.dtype == torch.long and x.shape == (2, 9)
    assert torch.equal(x[0], torch.arange(31, 40)) and torch.equal(y[0], torch.arange(32, 41))


def test_a_split_shorter_than_one_chunk_is_an_invalid_job(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_bytes(b"x" * 1000)
    with pytest.raises(InvalidJobError, match="eval split has 50 tokens, fewer than one chunk"):
        prepare(tmp_path, data_spec(path, eval_fraction=0.05, seq_len=64))


def test_max_bytes_caps_the_corpus(tmp_path: Path) -> None:
    _write_docs(tmp_path / "data", 10)
    spec = data_spec(tmp_path / "data", include=["**/*.py"], max_bytes=5000, seq_len=SEQ_LEN)
    report = prepare(tmp_path, spec).report
    assert report["train"]["tokens"] + report["eval"]["tokens"] == 5000


def test_excluded_files_such_as_site_packages_stay_out_of_the_corpus(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "site-packages" / "pkg").mkdir(parents=True)
    (data / "site-packages" / "pkg" / "big.py").write_bytes(b"x = 1\n" * 10_000)
    (data / "mod.py").write_bytes(b"def f():\n    return 2\n" * 200)
    report = prepare(tmp_path, data_spec(data, include=["**/*.py"], seq_len=SEQ_LEN)).report
    assert report["train"]["tokens"] + report["eval"]["tokens"] == (data / "mod.py").stat().st_size
    with pytest.raises(InvalidJobError, match="exclude"):
        prepare(tmp_path, data_spec(data, include=["**/*.py"], exclude=["*"]))


def test_fsspec_uri_reads_the_same_corpus_as_the_local_path(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_docs(data, 12)
    local = prepare(tmp_path / "a", data_spec(data, include=["**/*.py"], seq_len=SEQ_LEN))
    uri = prepare(tmp_path / "b", data_spec(f"file://{data}", include=["**/*.py"], seq_len=8))
    assert uri.report["cached"] is False  # read through fsspec, not found in a shared cache
    assert _same_rows(local.train, uri.train) and _same_rows(local.eval, uri.eval)


@pytest.mark.parametrize("where", ["missing", "no_match", "empty"])
def test_unusable_data_is_an_invalid_job(tmp_path: Path, where: str) -> None:
    location = tmp_path / "missing"
    include = ["**/*"]
    if where == "no_match":
        _write_docs(tmp_path / "data", 2)
        location, include = tmp_path / "data", ["*.rs"]
    elif where == "empty":
        location = tmp_path / "empty.txt"
        location.write_bytes(b"")
    with pytest.raises(InvalidJobError):
        prepare(tmp_path, data_spec(location, include=include, seq_len=SEQ_LEN))


def test_files_that_are_not_text_are_never_read_and_are_reported(tmp_path: Path) -> None:
    """Issue 45, item 1: the standard library's directory holds a static library, shared
    objects and wheels among its sources; a `text` job reads only the text. A file whose
    first MiB is text is read without the stray bytes it holds further on."""
    data = tmp_path / "data"
    _write_docs(data, 6)
    (data / "libpython.a").write_bytes(b"!<arch>\n" + b"\x7fELF\x02\x01\x01\x00" * 5000)
    (data / "tool.whl").write_bytes(b"PK\x03\x04\xb3\xd9\x14\x08\x08\x01" + b"z" * 4000)
    lead = b"# document 999\n" + b"y = 2\n" * ((1 << 20) // 6 + 100)  # past the first block
    (data / "later.py").write_bytes(lead + b"# caf\xe9 \x00tail\n" * 50)
    spec = data_spec(data, eval_fraction=0.2, seq_len=SEQ_LEN)
    prepared = prepare(tmp_path / "cache", spec)
    read = _stream(prepared.train) + _stream(prepared.eval)
    assert b"\x00" not in read and b"ELF" not in read and b"PK" not in read
    read.decode("utf-8")  # whole: every byte read is text
    assert read.count(b"# caf tail\n") >= 50 - 2  # the stray bytes dropped, the text kept
    left = prepared.report["left_out"]
    assert (left["files"], left["bytes"]) == (2, 8 + 8 * 5000 + 10 + 4000)
    assert [e["path"] for e in left["examples"]] == ["libpython.a", "tool.whl"]
    assert "NUL byte" in left["examples"][0]["reason"]
    assert "not UTF-8" in left["examples"][1]["reason"]
    assert left["repaired"] == [{"path": "later.py", "bytes_dropped": 2 * 50}]
    assert left["repaired_files"] == 1


def test_a_corpus_with_no_text_file_is_an_invalid_job_saying_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.dat").write_bytes(b"\x00" * 100)
    with pytest.raises(InvalidJobError, match="none of the 1 data files is UTF-8 text"):
        prepare(tmp_path / "cache", data_spec(data, seq_len=SEQ_LEN))


def test_a_single_files_eval_tail_that_starts_inside_a_character_is_still_text(
    tmp_path: Path,
) -> None:
    """The split of one file falls at a byte; the held-out tail may begin with a character's
    continuation bytes, which belong to the training side's last character."""
    path = tmp_path / "one.txt"
    data = "é".encode() * 4001  # 8,002 bytes; the eval tail (25%) starts at byte 6,001
    path.write_bytes(data)
    prepared = prepare(tmp_path / "cache", data_spec(path, eval_fraction=0.25, seq_len=SEQ_LEN))
    assert "left_out" not in prepared.report  # nothing cut: the tail's first byte is skipped
    assert len(_stream(prepared.eval)) >= 2000 - SEQ_LEN - 1


def test_the_quickstarts_unfiltered_stdlib_trains_on_its_text_only(tmp_path: Path) -> None:
    """The Submit page's template, a dataset's "Use in a new job" and README's sweep base read
    the standard library's directory whole; its binaries sort early (`config-3.11-*/libpython
    3.11.a`, 45 MB) and used to be read as text."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    spec = data_spec(stdlib, include=["**/*"], max_bytes=4_000_000, seq_len=64)
    prepared = prepare(tmp_path, spec)
    read = _stream(prepared.train) + _stream(prepared.eval)
    assert b"\x00" not in read
    read.decode("utf-8")  # whole: every byte read is text
    left = prepared.report["left_out"]
    assert left["files"] >= len(left["examples"]) > 0
    for example in left["examples"]:
        data = (stdlib / example["path"]).read_bytes()[: 1 << 20]
        assert b"\x00" in data or not _decodes(data), example
    static = {p.relative_to(stdlib).as_posix() for p in stdlib.glob("config-*/libpython*.a")}
    assert static <= {e["path"] for e in left["examples"]}  # sorted early: among the first 20


def _decodes(block: bytes) -> bool:
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(block) - 3  # a character cut by the block's end
    return True
