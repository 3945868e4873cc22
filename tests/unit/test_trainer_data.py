"""Byte tokenizer, corpus loading and splitting, chunking, and the unigram baseline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.data import (
    decode,
    encode,
    load_corpus,
    make_chunks,
    unigram_cross_entropy,
)
from trainer.errors import InvalidJobError
from trainer.rows import Rows
from trainer.spec import DataSpec


def test_tokenizer_round_trips_any_text_through_utf8_bytes() -> None:
    text = "def f(x):\n    return 'héllo → 世界' + \"\\t\"  # ok\x00"
    ids = encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert decode(ids) == text
    assert decode(torch.tensor(ids)) == text


def test_decode_replaces_invalid_utf8_instead_of_failing() -> None:
    assert decode([0xE4, 0xB8]) == "\ufffd"  # a truncated 3-byte sequence


def _write_docs(root: Path, n: int, size: int = 2000) -> None:
    for i in range(n):
        sub = root / ("pkg" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:03d}.py").write_text(f"# document {i:03d}\n" + "x = 1\n" * (size // 6))
    (root / "notes.txt").write_text("not python\n" * 100)


def test_directory_splits_whole_documents_deterministically(tmp_path: Path) -> None:
    _write_docs(tmp_path, 60)
    spec = DataSpec(uri=str(tmp_path), include=["**/*.py"], eval_fraction=0.1)
    first, again = load_corpus(str(tmp_path), spec), load_corpus(str(tmp_path), spec)
    assert torch.equal(first.train, again.train) and torch.equal(first.eval, again.eval)
    assert first.num_train_docs + first.num_eval_docs == 60  # notes.txt not included
    assert 1 <= first.num_eval_docs < 60 * 0.3
    train_text, eval_text = decode(first.train), decode(first.eval)
    headers = {line for line in (train_text + eval_text).splitlines() if line.startswith("#")}
    assert len(headers) == 60
    for header in headers:  # each document lies wholly on one side
        assert (header in train_text) != (header in eval_text)


def test_few_documents_still_hold_one_out_for_eval(tmp_path: Path) -> None:
    _write_docs(tmp_path, 3)
    corpus = load_corpus(str(tmp_path), DataSpec(uri=str(tmp_path), include=["**/*.py"]))
    assert (corpus.num_train_docs, corpus.num_eval_docs) == (2, 1)


def test_single_file_splits_by_position(tmp_path: Path) -> None:
    path = tmp_path / "one.txt"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    corpus = load_corpus(str(path), DataSpec(uri=str(path), eval_fraction=0.25))
    assert bytes(corpus.train.tolist()) == data[: len(data) * 3 // 4]
    assert bytes(corpus.eval.tolist()) == data[len(data) * 3 // 4 :]


def test_max_bytes_caps_the_corpus(tmp_path: Path) -> None:
    _write_docs(tmp_path, 10)
    spec = DataSpec(uri=str(tmp_path), include=["**/*.py"], max_bytes=5000)
    corpus = load_corpus(str(tmp_path), spec)
    assert corpus.train.numel() + corpus.eval.numel() == 5000


def test_excluded_files_such_as_site_packages_stay_out_of_the_corpus(tmp_path: Path) -> None:
    (tmp_path / "site-packages" / "pkg").mkdir(parents=True)
    (tmp_path / "site-packages" / "pkg" / "big.py").write_bytes(b"x = 1\n" * 10_000)
    (tmp_path / "mod.py").write_bytes(b"def f():\n    return 2\n" * 200)
    spec = DataSpec(uri=str(tmp_path), include=["**/*.py"])
    corpus = load_corpus(str(tmp_path), spec)
    assert corpus.train.numel() + corpus.eval.numel() == (tmp_path / "mod.py").stat().st_size
    with pytest.raises(InvalidJobError, match="exclude"):
        load_corpus(str(tmp_path), DataSpec(uri=str(tmp_path), include=["**/*.py"], exclude=["*"]))


def test_fsspec_uri_reads_the_same_corpus_as_the_local_path(tmp_path: Path) -> None:
    _write_docs(tmp_path, 12)
    spec = DataSpec(uri=str(tmp_path), include=["**/*.py"])
    local = load_corpus(str(tmp_path), spec)
    uri = load_corpus(f"file://{tmp_path}", spec)
    assert torch.equal(local.train, uri.train) and torch.equal(local.eval, uri.eval)


@pytest.mark.parametrize("where", ["missing", "no_match", "empty"])
def test_unusable_data_is_an_invalid_job(tmp_path: Path, where: str) -> None:
    location = tmp_path / "missing"
    include = ["**/*"]
    if where == "no_match":
        _write_docs(tmp_path, 2)
        location, include = tmp_path, ["*.rs"]
    elif where == "empty":
        location = tmp_path / "empty.txt"
        location.write_bytes(b"")
    with pytest.raises(InvalidJobError):
        load_corpus(str(location), DataSpec(uri=str(location), include=include))


def test_chunks_are_non_overlapping_and_batches_shift_targets_by_one() -> None:
    tokens = torch.arange(100, dtype=torch.uint8)
    chunks = make_chunks(tokens, seq_len=9, what="training")
    assert chunks.shape == (10, 10)
    assert torch.equal(chunks.flatten(), tokens)
    batch = Rows.from_chunks(chunks).batch(np.array([3, 0]), torch.device("cpu"))
    x, y = batch.input_ids, batch.labels
    assert x.dtype == torch.long and x.shape == (2, 9)
    assert torch.equal(x[0], torch.arange(30, 39)) and torch.equal(y[0], torch.arange(31, 40))


def test_a_split_shorter_than_one_chunk_is_an_invalid_job() -> None:
    with pytest.raises(InvalidJobError, match="evaluation split has 64 bytes"):
        make_chunks(torch.zeros(64, dtype=torch.uint8), seq_len=64, what="evaluation")


def test_unigram_baseline_is_the_cross_entropy_under_train_byte_frequencies() -> None:
    train = torch.tensor([65] * 3000 + [66] * 1000, dtype=torch.uint8)
    eval_tokens = torch.tensor([65, 66], dtype=torch.uint8)
    p_a, p_b = 3001 / (4000 + 256), 1001 / (4000 + 256)  # add-one smoothing
    expected = -(math.log(p_a) + math.log(p_b)) / 2
    assert unigram_cross_entropy(train, eval_tokens) == pytest.approx(expected, rel=1e-12)
    uniform = torch.arange(256, dtype=torch.uint8).repeat(10)
    assert unigram_cross_entropy(uniform, uniform) == pytest.approx(math.log(256))
