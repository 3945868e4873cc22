"""The byte-level tokenizer (`trainer.data.byte_tokenizer`). Reading, splitting and chunking raw
text: tests/unit/trainer/test_textrows.py; the unigram baseline:
tests/unit/trainer/test_dataprep.py."""

from __future__ import annotations

import torch

from trainer.data.byte_tokenizer import decode, encode


def test_tokenizer_round_trips_any_text_through_utf8_bytes() -> None:
    text = "def f(x):\n    return 'héllo → 世界' + \"\\t\"  # ok\x00"
    ids = encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert decode(ids) == text
    assert decode(torch.tensor(ids)) == text


def test_decode_replaces_invalid_utf8_instead_of_failing() -> None:
    assert decode([0xE4, 0xB8]) == "\ufffd"  # a truncated 3-byte sequence
