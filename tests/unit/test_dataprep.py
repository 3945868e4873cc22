"""prepare_rows: records -> verified, packed rows in a content-addressed cache, reused
without tokenizing; raw text and token files on the same path; readers for the formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.sft_data import SYSTEM, bpe_tokenizer, messages_records, write_jsonl
from trainer import masks
from trainer.dataprep import prepare_rows
from trainer.errors import InvalidJobError
from trainer.events import EventWriter
from trainer.rows import IGNORE_INDEX, Rows
from trainer.spec import JobSpec


def _spec(location: Path, **data: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "sft", "model": {"seq_len": data.pop("seq_len", 2048)},
         "data": {"uri": str(location), "max_truncated_share": 0.5, **data}}
    )  # fmt: skip


def _prepare(tmp_path: Path, spec: JobSpec, tokenizer: Any = None, **kw: Any) -> Any:
    run_dir = tmp_path / "run"
    reporter = EventWriter(run_dir, attempt=1)
    try:
        return prepare_rows(
            spec, str(spec.data.uri), tokenizer, cache_dir=tmp_path / "cache", dist=None,
            reporter=reporter, **kw,
        )  # fmt: skip
    finally:
        reporter.close()


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _segments(rows: Rows) -> list[tuple[int, ...]]:
    out = []
    for i in range(len(rows)):
        segs, ids = rows.segment_ids[i], rows.input_ids[i]
        for s in np.unique(segs[segs >= 0]):
            out.append(tuple(ids[segs == s].tolist()))
    return out


def test_messages_are_packed_masked_and_split_by_example(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(120))
    tok = bpe_tokenizer()
    prepared = _prepare(tmp_path, _spec(data, packing=True, eval_fraction=0.2), tok)
    train, held = prepared.train, prepared.eval
    assert len(train) > 0 and len(held) > 0 and train.seq_len == 2048
    # eval examples are whole examples, none of them also in train
    assert not set(_segments(train)) & set(_segments(held))
    # every supervised label is an assistant token: its decoded text is in an answer
    supervised = np.asarray(train.labels)[np.asarray(train.labels) != IGNORE_INDEX]
    text = tok.decode(supervised.tolist())
    assert "<|im_start|>" not in text and SYSTEM not in text
    assert (
        text.count("<|im_end|>")
        == prepared.report["train"]["examples"] - (prepared.report["train"]["dropped"])
    )
    event = next(e for e in _events(tmp_path) if e["type"] == "data")
    assert event["cached"] is False and event["format"] == "messages"
    assert event["loss_on"] == "assistant"
    assert 0 < event["train"]["packing_efficiency"] <= 1
    assert event["train"]["supervised_share_by_role"] == {"assistant": 1, "system": 0, "user": 0}


def test_a_second_job_reuses_the_cache_without_calling_the_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    spec = _spec(data, packing=True, eval_fraction=0.2)
    first = _prepare(tmp_path, spec)

    def refuse(self: Any, text: str) -> Any:
        raise AssertionError("the tokenizer was called")

    monkeypatch.setattr(masks.Tokenizer, "encode", refuse)
    second = _prepare(tmp_path, spec)
    assert second.directory == first.directory and second.report["cached"] is True
    assert np.array_equal(np.asarray(second.train.labels), np.asarray(first.train.labels))


def test_changed_content_or_packing_is_a_new_cache_entry(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    first = _prepare(tmp_path, _spec(data, eval_fraction=0.2)).directory
    assert _prepare(tmp_path, _spec(data, eval_fraction=0.2, packing=True)).directory != first
    write_jsonl(data, messages_records(41))
    assert _prepare(tmp_path, _spec(data, eval_fraction=0.2)).directory != first


def test_too_many_examples_lost_to_truncation_refuse_the_job(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    with pytest.raises(InvalidJobError, match="lose every supervised token"):
        _prepare(tmp_path, _spec(data, seq_len=64, truncation="truncate_right"))
    assert not any((tmp_path / "cache").iterdir())  # nothing half-built stays


def test_an_invalid_record_is_refused_with_its_line_and_field(tmp_path: Path) -> None:
    records = messages_records(5)
    records[2]["messages"][1]["role"] = "robot"
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    with pytest.raises(InvalidJobError, match=r"chat.jsonl:3: messages\[1\].role"):
        _prepare(tmp_path, _spec(data))


def test_raw_text_rows_are_the_contiguous_chunks_of_the_old_path(tmp_path: Path) -> None:
    import torch

    from trainer.data import load_corpus, make_chunks

    data = tmp_path / "corpus.txt"
    data.write_text("".join(f"line {i}: the quick brown fox é\n" for i in range(400)))
    spec = _spec(data, seq_len=64)
    prepared = _prepare(tmp_path, spec)
    corpus = load_corpus(str(data), spec.data)
    for rows, tokens in ((prepared.train, corpus.train), (prepared.eval, corpus.eval)):
        expected = Rows.from_chunks(make_chunks(tokens, 64, what="x").to(torch.int32))
        assert np.array_equal(np.asarray(rows.input_ids), expected.input_ids)
        assert np.array_equal(np.asarray(rows.labels), expected.labels)
        assert np.all(np.asarray(rows.segment_ids) == 0)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".parquet"])
def test_compressed_jsonl_and_parquet_read_the_same_rows(tmp_path: Path, suffix: str) -> None:
    records = messages_records(30)
    plain = _prepare(tmp_path / "a", _spec(write_jsonl(tmp_path / "p.jsonl", records)))
    path = tmp_path / f"d{suffix}"
    if suffix == ".jsonl.gz":
        path.write_bytes(gzip.compress((tmp_path / "p.jsonl").read_bytes()))
    elif suffix == ".jsonl.zst":
        import zstandard

        path.write_bytes(zstandard.ZstdCompressor().compress((tmp_path / "p.jsonl").read_bytes()))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    other = _prepare(tmp_path / "b", _spec(path))
    assert sorted(_segments(other.train) + _segments(other.eval)) == sorted(
        _segments(plain.train) + _segments(plain.eval)
    )


def test_token_files_become_rows_and_token_records_keep_their_loss_mask(tmp_path: Path) -> None:
    flat = tmp_path / "tokens.npy"
    np.save(flat, np.arange(2000, dtype=np.uint16) % 251)
    prepared = _prepare(tmp_path, _spec(flat, seq_len=32))
    assert np.array_equal(np.asarray(prepared.train.input_ids[0]), np.arange(32))
    records = [
        {"input_ids": list(range(1, 11 + i)), "loss_mask": [0] * 5 + [1] * (5 + i)}
        for i in range(30)
    ]
    data = write_jsonl(tmp_path / "tok.jsonl", records)
    rows = _prepare(tmp_path, _spec(data, format="tokens", seq_len=48, packing=True)).train
    labels = np.asarray(rows.labels)
    # loss_mask 1 from token 5 on: token t's label is supervised iff token t + 1 is
    for i in range(len(rows)):
        segs = rows.segment_ids[i]
        for s in np.unique(segs[segs >= 0]):
            seg_labels = labels[i][segs == s]
            assert np.all(seg_labels[:4] == IGNORE_INDEX) and np.all(seg_labels[4:-1] >= 0)
            assert seg_labels[-1] == IGNORE_INDEX


def test_preference_pairs_become_aligned_chosen_and_rejected_rows(tmp_path: Path) -> None:
    from tests.unit.sft_data import preference_records

    records = preference_records(30)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    prepared = _prepare(tmp_path, _spec(data, eval_fraction=0.2))
    train = prepared.train
    assert len(train.chosen) == len(train.rejected) > 0
    docs = {r["chosen"][0]["content"] for r in records}
    for i in range(len(train)):
        chosen, rejected = (
            np.asarray(rows.input_ids[i]) for rows in (train.chosen, train.rejected)
        )
        labels = np.asarray(train.chosen.labels[i])
        first = int(np.argmax(labels != IGNORE_INDEX))  # the answer's first target
        assert np.array_equal(chosen[: first + 1], rejected[: first + 1])  # same prompt
        answer = bytes(labels[labels != IGNORE_INDEX].astype(np.uint8)).decode()
        assert answer.removesuffix("<|im_end|>") in docs
        segments = np.asarray(train.chosen.segment_ids[i])
        assert segments[0] == 0 and set(segments.tolist()) <= {0, -1}  # one pair per row


def test_a_separate_eval_file_is_all_evaluation_and_the_data_all_training(tmp_path: Path) -> None:
    train_file = write_jsonl(tmp_path / "train.jsonl", messages_records(30)[:20])
    eval_file = write_jsonl(tmp_path / "eval.jsonl", messages_records(30)[20:])
    prepared = _prepare(tmp_path, _spec(train_file), eval_location=str(eval_file))
    assert prepared.report["train"]["examples"] == 20
    assert prepared.report["eval"]["examples"] == 10
    assert len(prepared.eval) == 10 - prepared.report["eval"]["dropped"]


def test_jsonl_text_is_a_token_stream_unpacked_and_whole_documents_packed(
    tmp_path: Path,
) -> None:
    docs = [{"text": f"document {i}: " + "lorem ipsum " * (3 + i % 7)} for i in range(60)]
    data = write_jsonl(tmp_path / "docs.jsonl", docs)
    stream = _prepare(tmp_path / "s", _spec(data, seq_len=32, eval_fraction=0.2))
    assert np.all(np.asarray(stream.train.segment_ids) == 0)
    assert np.all(np.asarray(stream.train.labels) != IGNORE_INDEX)
    packed = _prepare(tmp_path / "p", _spec(data, seq_len=128, eval_fraction=0.2, packing=True))
    texts = {d["text"] for d in docs}
    for row in range(len(packed.train)):
        segs, ids = packed.train.segment_ids[row], packed.train.input_ids[row]
        for s in np.unique(segs[segs >= 0]):
            assert bytes(ids[segs == s].astype(np.uint8)).decode() in texts  # whole documents


def test_raw_text_with_a_bpe_tokenizer_is_tokenized_block_by_block_losslessly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import textrows

    monkeypatch.setattr(textrows, "_BLOCK", 97)  # many blocks, cut at line ends
    tok = bpe_tokenizer()
    data = tmp_path / "corpus.txt"
    text = "".join(f"def f{i}(x):\n    return x + {i}  # é\n" for i in range(300))
    data.write_text(text)
    train = _prepare(tmp_path, _spec(data, seq_len=64), tok).train
    chunks = np.concatenate(
        [np.asarray(train.input_ids), np.asarray(train.labels)[:, -1:]], axis=1
    ).reshape(-1)
    decoded = tok.decode(chunks.tolist())
    assert len(decoded) > len(text) // 2 and text.startswith(decoded)


def test_unigram_baseline_counts_supervised_targets_only() -> None:
    from trainer.dataprep import unigram_eval_loss

    def rows(labels: list[list[int]]) -> Rows:
        array = np.array(labels, dtype=np.int32)
        zeros = np.zeros_like(array)
        return Rows(input_ids=zeros, labels=array, position_ids=zeros, segment_ids=zeros)

    train = rows([[1, 1, 2, IGNORE_INDEX], [3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    held = rows([[1, 2, IGNORE_INDEX, IGNORE_INDEX]])
    # counts + 1 over a vocabulary of 4: token 0: 1, 1: 3, 2: 2, 3: 2 -> total 8
    expected = -(np.log(3 / 8) + np.log(2 / 8)) / 2
    assert unigram_eval_loss(train, held, 4) == pytest.approx(expected, rel=1e-12)


def test_a_uint32_bin_file_is_read_with_the_declared_token_dtype(tmp_path: Path) -> None:
    flat = tmp_path / "tokens.bin"
    (np.arange(3000, dtype=np.uint32) + 70_000).tofile(flat)
    prepared = _prepare(tmp_path, _spec(flat, seq_len=32, token_dtype="uint32"))
    assert np.array_equal(np.asarray(prepared.train.input_ids[0]), np.arange(32) + 70_000)


def _rss_file_bytes() -> int:
    """This process's resident file-backed pages (`RssFile` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_unigram_baseline_reads_a_memmapped_corpus_without_mapping_it_into_rss(
    tmp_path: Path,
) -> None:
    from trainer.dataprep import unigram_eval_loss
    from trainer.rows import RowsWriter

    num_rows, seq_len, vocab = 3 * 4096 + 5, 256, 300  # > 3 read blocks, a partial last one
    rng = np.random.default_rng(0)
    labels = rng.integers(-1, vocab, size=(num_rows, seq_len)).astype(np.int32)
    labels[labels < 0] = IGNORE_INDEX
    writer = RowsWriter(tmp_path / "rows", seq_len=seq_len, capacity=num_rows)
    zeros = np.zeros(seq_len, dtype=np.int32)
    for row in labels:
        writer.append(input_ids=zeros, labels=row, position_ids=zeros, segment_ids=zeros)
    mapped = writer.close()
    held = Rows(input_ids=labels[:8], labels=labels[:8], position_ids=labels[:8],
                segment_ids=labels[:8])  # fmt: skip
    in_memory = Rows(input_ids=labels, labels=labels, position_ids=labels, segment_ids=labels)
    expected = unigram_eval_loss(in_memory, held, vocab)  # also imports everything it needs
    before = _rss_file_bytes()
    assert unigram_eval_loss(mapped, held, vocab) == expected
    # Reading through the mapping made every label page resident (growth = labels.nbytes,
    # 12.6 MB); a quarter of that is left for unrelated mappings of the process.
    assert _rss_file_bytes() - before < labels.nbytes / 4


def test_raw_text_rows_take_the_plain_path_and_chat_rows_do_not(tmp_path: Path) -> None:
    data = tmp_path / "corpus.txt"
    data.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(200)))
    text = _prepare(tmp_path, _spec(data, seq_len=64))
    chat = write_jsonl(tmp_path / "chat.jsonl", messages_records(8))
    messages = _prepare(tmp_path, _spec(chat, format="messages"))
    assert text.train.plain and text.eval.plain  # reopened from the cache, not just built
    assert Rows.open(text.directory / "train").plain
    assert not messages.train.plain and not messages.eval.plain
