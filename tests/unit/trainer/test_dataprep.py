"""prepare_rows: records -> verified, packed rows in a content-addressed cache, reused
without tokenizing; raw text and token files on the same path; readers for the formats."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dataformat import masks
from dataformat.errors import InvalidJobError
from tests.support.sft_data import (
    SYSTEM,
    bpe_tokenizer,
    data_spec,
    messages_records,
    prepare,
    write_jsonl,
)
from trainer.data.prep import unigram_eval_loss
from trainer.data.rows import IGNORE_INDEX, Rows


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
    prepared = prepare(tmp_path, data_spec(data, packing=True, eval_fraction=0.2), tok)
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
    spec = data_spec(data, packing=True, eval_fraction=0.2)
    first = prepare(tmp_path, spec)

    def refuse(self: Any, text: str) -> Any:
        raise AssertionError("the tokenizer was called")

    monkeypatch.setattr(masks.Tokenizer, "encode", refuse)
    second = prepare(tmp_path, spec)
    assert second.directory == first.directory and second.report["cached"] is True
    assert np.array_equal(np.asarray(second.train.labels), np.asarray(first.train.labels))


def test_changed_content_or_packing_is_a_new_cache_entry(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    first = prepare(tmp_path, data_spec(data, eval_fraction=0.2)).directory
    assert prepare(tmp_path, data_spec(data, eval_fraction=0.2, packing=True)).directory != first
    write_jsonl(data, messages_records(41))
    assert prepare(tmp_path, data_spec(data, eval_fraction=0.2)).directory != first


def test_too_many_examples_lost_to_truncation_refuse_the_job(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    with pytest.raises(InvalidJobError, match="lose every supervised token"):
        prepare(tmp_path, data_spec(data, seq_len=64, truncation="truncate_right"))
    assert not any((tmp_path / "cache").iterdir())  # nothing half-built stays


def test_an_invalid_record_is_refused_with_its_line_and_field(tmp_path: Path) -> None:
    records = messages_records(5)
    records[2]["messages"][1]["role"] = "robot"
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    with pytest.raises(InvalidJobError, match=r"chat.jsonl:3: messages\[1\].role"):
        prepare(tmp_path, data_spec(data))


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".parquet"])
def test_compressed_jsonl_and_parquet_read_the_same_rows(tmp_path: Path, suffix: str) -> None:
    records = messages_records(30)
    plain = prepare(tmp_path / "a", data_spec(write_jsonl(tmp_path / "p.jsonl", records)))
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
    other = prepare(tmp_path / "b", data_spec(path))
    assert sorted(_segments(other.train) + _segments(other.eval)) == sorted(
        _segments(plain.train) + _segments(plain.eval)
    )


@pytest.mark.parametrize(
    ("name", "encoding"),
    [("d.ndjson", "plain"), ("d.jsonl.zstd", "zstd"), ("d.jsonl", "gzip"), ("d.jsonl", "bom")],
)
def test_the_trainer_reads_every_jsonl_the_upload_accepts(
    tmp_path: Path, name: str, encoding: str
) -> None:
    import zstandard

    from core.datasets.formats import check

    records = messages_records(30)
    plain = prepare(tmp_path / "a", data_spec(write_jsonl(tmp_path / "p.jsonl", records)))
    raw = (tmp_path / "p.jsonl").read_bytes()
    path = tmp_path / name
    path.write_bytes(
        {
            "plain": raw,
            "zstd": zstandard.ZstdCompressor().compress(raw),
            "gzip": gzip.compress(raw),  # compressed, by its magic bytes, not its name
            "bom": b"\xef\xbb\xbf" + raw,
        }[encoding]
    )
    accepted = check(
        str(path), declared=None, token_dtype=None, max_record_bytes=1 << 20, where=("body",)
    )
    assert accepted.format == "messages"
    other = prepare(tmp_path / "b", data_spec(path))
    assert sorted(_segments(other.train) + _segments(other.eval)) == sorted(
        _segments(plain.train) + _segments(plain.eval)
    )


def test_token_files_become_rows_and_token_records_keep_their_loss_mask(tmp_path: Path) -> None:
    flat = tmp_path / "tokens.npy"
    np.save(flat, np.arange(2000, dtype=np.uint16) % 251)
    prepared = prepare(tmp_path, data_spec(flat, seq_len=32))
    assert np.array_equal(np.asarray(prepared.train.input_ids[0]), np.arange(32))
    records = [
        {"input_ids": list(range(1, 11 + i)), "loss_mask": [0] * 5 + [1] * (5 + i)}
        for i in range(30)
    ]
    data = write_jsonl(tmp_path / "tok.jsonl", records)
    rows = prepare(tmp_path, data_spec(data, format="tokens", seq_len=48, packing=True)).train
    labels = np.asarray(rows.labels)
    # loss_mask 1 from token 5 on: token t's label is supervised iff token t + 1 is
    for i in range(len(rows)):
        segs = rows.segment_ids[i]
        for s in np.unique(segs[segs >= 0]):
            seg_labels = labels[i][segs == s]
            assert np.all(seg_labels[:4] == IGNORE_INDEX) and np.all(seg_labels[4:-1] >= 0)
            assert seg_labels[-1] == IGNORE_INDEX


def test_preference_pairs_become_aligned_chosen_and_rejected_rows(tmp_path: Path) -> None:
    from tests.support.sft_data import preference_records

    records = preference_records(30)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    prepared = prepare(tmp_path, data_spec(data, eval_fraction=0.2))
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
    prepared = prepare(tmp_path, data_spec(train_file), eval_location=str(eval_file))
    assert prepared.report["train"]["examples"] == 20
    assert prepared.report["eval"]["examples"] == 10
    assert len(prepared.eval) == 10 - prepared.report["eval"]["dropped"]


def test_jsonl_text_is_a_token_stream_unpacked_and_whole_documents_packed(
    tmp_path: Path,
) -> None:
    docs = [{"text": f"document {i}: " + "lorem ipsum " * (3 + i % 7)} for i in range(60)]
    data = write_jsonl(tmp_path / "docs.jsonl", docs)
    stream = prepare(tmp_path / "s", data_spec(data, seq_len=32, eval_fraction=0.2))
    assert np.all(np.asarray(stream.train.segment_ids) == 0)
    assert np.all(np.asarray(stream.train.labels) != IGNORE_INDEX)
    packed = prepare(tmp_path / "p", data_spec(data, seq_len=128, eval_fraction=0.2, packing=True))
    texts = {d["text"] for d in docs}
    for row in range(len(packed.train)):
        segs, ids = packed.train.segment_ids[row], packed.train.input_ids[row]
        for s in np.unique(segs[segs >= 0]):
            assert bytes(ids[segs == s].astype(np.uint8)).decode() in texts  # whole documents


def test_raw_text_with_a_bpe_tokenizer_is_tokenized_block_by_block_losslessly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.data import textrows

    monkeypatch.setattr(textrows, "_BLOCK", 97)  # many blocks, cut at line ends
    tok = bpe_tokenizer()
    data = tmp_path / "corpus.txt"
    text = "".join(f"def f{i}(x):\n    return x + {i}  # é\n" for i in range(300))
    data.write_text(text)
    train = prepare(tmp_path, data_spec(data, seq_len=64), tok).train
    chunks = np.concatenate(
        [np.asarray(train.input_ids), np.asarray(train.labels)[:, -1:]], axis=1
    ).reshape(-1)
    decoded = tok.decode(chunks.tolist())
    assert len(decoded) > len(text) // 2 and text.startswith(decoded)


def _label_rows(labels: list[list[int]]) -> Rows:
    array = np.array(labels, dtype=np.int32)
    zeros = np.zeros_like(array)
    return Rows(input_ids=zeros, labels=array, position_ids=zeros, segment_ids=zeros)


def test_unigram_baseline_counts_supervised_targets_only() -> None:
    train = _label_rows([[1, 1, 2, IGNORE_INDEX], [3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    held = _label_rows([[1, 2, IGNORE_INDEX, IGNORE_INDEX]])
    # counts + 1 over a vocabulary of 4: token 0: 1, 1: 3, 2: 2, 3: 2 -> total 8
    expected = -(np.log(3 / 8) + np.log(2 / 8)) / 2
    assert unigram_eval_loss(train, held, 4) == pytest.approx(expected, rel=1e-12)


def test_unigram_baseline_is_the_cross_entropy_under_train_byte_frequencies() -> None:
    train = _label_rows([[65] * 3000 + [66] * 1000])
    held = _label_rows([[65, 66]])
    p_a, p_b = 3001 / (4000 + 256), 1001 / (4000 + 256)  # add-one smoothing
    expected = -(math.log(p_a) + math.log(p_b)) / 2
    assert unigram_eval_loss(train, held, 256) == pytest.approx(expected, rel=1e-12)
    uniform = _label_rows([list(range(256)) * 10])
    assert unigram_eval_loss(uniform, uniform, 256) == pytest.approx(math.log(256))


def test_a_uint32_bin_file_is_read_with_the_declared_token_dtype(tmp_path: Path) -> None:
    flat = tmp_path / "tokens.bin"
    (np.arange(3000, dtype=np.uint32) + 70_000).tofile(flat)
    prepared = prepare(tmp_path, data_spec(flat, seq_len=32, token_dtype="uint32"))
    assert np.array_equal(np.asarray(prepared.train.input_ids[0]), np.arange(32) + 70_000)


UPPER = "{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}"


@pytest.mark.parametrize(
    "data",
    [
        {"seq_len": 64, "truncation": "truncate_right"},
        {"seq_len": 64, "truncation": "drop"},
        {"chat_template": UPPER},
        {"loss_on": "all", "seq_len": 8, "truncation": "drop"},
    ],
    ids=["truncated_away", "dropped", "template_cannot_mark", "all_dropped"],
)
def test_the_preview_refuses_a_sample_with_the_jobs_reason_word_for_word(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    from dataformat.chat import resolve_template
    from dataformat.readers import iter_records, list_files

    path = write_jsonl(tmp_path / "chat.jsonl", messages_records(40))
    spec = data_spec(path, **data)
    with pytest.raises(InvalidJobError) as refused:
        prepare(tmp_path, spec)
    records = ((where, obj) for where, _, obj in iter_records(list_files(str(path), ["*"], [])))
    shown = masks.preview(
        records,
        format="messages",
        tokenizer=masks.Tokenizer(None),
        template=resolve_template(spec.data.chat_template, None),
        loss_on=spec.data.loss_on,
        seq_len=spec.model.seq_len,
        truncation=spec.data.truncation,
        max_truncated_share=spec.data.max_truncated_share,
    )
    assert shown["refused"] == str(refused.value)


def _rss_file_bytes() -> int:
    """This process's resident file-backed pages (`RssFile` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_unigram_baseline_reads_a_memmapped_corpus_without_mapping_it_into_rss(
    tmp_path: Path,
) -> None:
    from trainer.data.prep import unigram_eval_loss
    from trainer.data.rows import RowsWriter

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
    text = prepare(tmp_path, data_spec(data, seq_len=64))
    chat = write_jsonl(tmp_path / "chat.jsonl", messages_records(8))
    messages = prepare(tmp_path, data_spec(chat, format="messages"))
    assert text.train.plain and text.eval.plain  # reopened from the cache, not just built
    assert Rows.open(text.directory / "train").plain
    assert not messages.train.plain and not messages.eval.plain
