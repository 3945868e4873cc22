"""Helpers for the DPO tests: a preference set from the standard library, as preference rows.

Test modules import it. A pair's prompt is a stdlib
function's signature (`def name(args):` and a newline); the chosen answer is the first line
of its own docstring, the rejected one the first line of another function's. Bytes are the
tokens (the built-in GPT's and a byte-level Hugging Face model's vocabulary).

The rows follow the rows contract (`trainer.data.rows`): one right-padded example per row, labels
supervised on the answer only (-100 on the prompt and the padding), segment 0 then -1.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np

from trainer.data.rows import IGNORE_INDEX, Rows, RowsWriter

MODULES = ("json", "textwrap", "string", "shutil", "posixpath", "functools", "fnmatch", "glob")
PAD_ID = 0


def stdlib_pairs(count: int, max_bytes: int) -> list[tuple[str, str, str]]:
    """`count` (prompt, chosen, rejected) triples, each prompt + answer at most `max_bytes`
    UTF-8 bytes, chosen != rejected, in a fixed order. Raises `ValueError` if too few."""
    functions: list[tuple[str, str]] = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, fn in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(fn) or not fn.__doc__:
                continue
            try:
                prompt = f"def {name}{inspect.signature(fn)}:\n"
            except (TypeError, ValueError):
                continue
            answer = fn.__doc__.strip().splitlines()[0].strip() + "\n"
            if len(answer) > 8:
                functions.append((prompt, answer))
    pairs = []
    for i, (prompt, chosen) in enumerate(functions):
        rejected = functions[(i + 7) % len(functions)][1]
        longest = max(len(chosen.encode()), len(rejected.encode()))
        if rejected != chosen and len(prompt.encode()) + longest <= max_bytes:
            pairs.append((prompt, chosen, rejected))
    if len(pairs) < count:
        raise ValueError(f"only {len(pairs)} stdlib pairs fit in {max_bytes} bytes")
    return pairs[:count]


def preference_row(prompt: str, answer: str, seq_len: int) -> dict[str, np.ndarray]:
    """One row of `prompt` + `answer` bytes: targets shifted by one, the answer supervised."""
    tokens = np.frombuffer((prompt + answer).encode(), dtype=np.uint8).astype(np.int32)
    if tokens.size > seq_len + 1:
        raise ValueError(f"{tokens.size} tokens exceed seq_len + 1 = {seq_len + 1}")
    n = tokens.size - 1  # positions with a target
    input_ids = np.full(seq_len, PAD_ID, dtype=np.int32)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int32)
    input_ids[:n] = tokens[:-1]
    labels[:n] = tokens[1:]
    labels[: len(prompt.encode()) - 1] = IGNORE_INDEX  # targets inside the prompt
    segment_ids = np.full(seq_len, -1, dtype=np.int32)
    segment_ids[:n] = 0
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": np.arange(seq_len, dtype=np.int32),
        "segment_ids": segment_ids,
    }


def write_preference_rows(
    directory: Path, pairs: list[tuple[str, str, str]], seq_len: int
) -> tuple[Rows, Rows]:
    """`directory/chosen` and `directory/rejected` row sets of `pairs` (row i = pair i)."""
    out = []
    for side, column in (("chosen", 1), ("rejected", 2)):
        writer = RowsWriter(directory / side, seq_len=seq_len, capacity=len(pairs))
        for pair in pairs:
            writer.append(**preference_row(pair[0], pair[column], seq_len))
        out.append(writer.close({"side": side}))
    return out[0], out[1]
