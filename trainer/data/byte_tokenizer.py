"""The byte-level tokenizer of the built-in GPT, and the local-path-or-URI test.

A token is a byte of the UTF-8 encoding (ids 0..255), so any text is valid input and the
vocabulary is fixed (`trainer.models.gpt.VOCAB_SIZE`). The data itself is read, split and cut into
rows by `trainer.data.prep.prepare_rows`.
"""

from __future__ import annotations

from torch import Tensor


def encode(text: str) -> list[int]:
    """Text -> token ids: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids: list[int] | Tensor) -> str:
    """Token ids -> text; byte sequences that are not valid UTF-8 become U+FFFD."""
    values = ids.tolist() if isinstance(ids, Tensor) else ids
    return bytes(values).decode("utf-8", errors="replace")


def is_uri(location: str) -> bool:
    """Whether `location` is a URI for fsspec (`scheme://...`) rather than a local path."""
    return "://" in location
