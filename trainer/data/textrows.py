"""The degenerate rows of raw text and flat token files: contiguous windows.

The rows contract: docs/ARCHITECTURE.md, 'Raw text and token files'.

The token stream of each side is cut into non-overlapping chunks of seq_len + 1 tokens; a row
is `input_ids = chunk[:-1]`, `labels = chunk[1:]` (all supervised), positions 0..T-1, one
segment. The tail shorter than a chunk is dropped.

- `text`: files are read in 1 MiB blocks (never a whole file in memory), decoded as UTF-8
  and tokenized at line boundaries; bytes are the ids of the byte-level GPT. Only text is
  read (`dataformat.text`): a file whose first block is not UTF-8 text (a NUL byte, bytes that
  do not decode: a static library, a wheel, an image) is binary, left out and counted in the
  report's `left_out`; from the others, stray NUL and non-UTF-8 bytes are dropped (counted
  in `left_out.repaired`).
  A directory's whole files go to evaluation by a hash of their relative path
  (`trainer.data.selection.document_sides`), a single file's last `eval_fraction` of bytes; at most
  `data.max_bytes` bytes of text are read, in sorted relative-path order.
- `jsonl_text` (without packing): each record's text, then the tokenizer's EOS (or a newline
  byte for bytes), split by example (`trainer.data.selection.ExampleSplit`).
- `tokens` (`.npy`, `.bin` of `data.token_dtype`): the last `eval_fraction` of each file's
  tokens is evaluation.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np

from dataformat import text as text_check
from dataformat.errors import InvalidJobError
from dataformat.masks import Example, Tokenizer
from dataformat.readers import DataFile, iter_records, token_array
from trainer.data.rows import RowsWriter
from trainer.data.selection import ExampleSplit, RowRecipe, document_sides

if TYPE_CHECKING:
    from jobspec.job import DataSpec

_BLOCK = 1 << 20


class Chunker:
    """Collects a token stream and writes each full chunk of T + 1 tokens as one row."""

    def __init__(self, seq_len: int, emit: Callable[..., None]) -> None:
        self.seq_len = seq_len
        self.emit = emit
        self.carry = np.zeros(0, dtype=np.int32)
        self.rows = 0
        self.tokens = 0
        self._positions = np.arange(seq_len, dtype=np.int32)
        self._segments = np.zeros(seq_len, dtype=np.int32)

    def add(self, ids: np.ndarray) -> None:
        self.tokens += int(ids.shape[0])
        data = np.concatenate([self.carry, ids.astype(np.int32, copy=False)])
        width = self.seq_len + 1
        full = data.shape[0] // width
        for chunk in data[: full * width].reshape(full, width):
            self.emit(
                input_ids=chunk[:-1],
                labels=chunk[1:],
                position_ids=self._positions,
                segment_ids=self._segments,
            )
        self.rows += full
        self.carry = data[full * width :].copy()

    def report(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "rows": self.rows,
            "packing_efficiency": 1.0,
            "supervised_efficiency": 1.0,
        }


def token_example(where: str, obj: Any) -> Example:
    """A pre-tokenized record (`input_ids`, optional `labels` with -100 or `loss_mask` 0/1,
    per token) as an `Example`. Raises `InvalidJobError` naming `where`."""
    try:
        ids = np.asarray(obj["input_ids"], dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0:
            raise ValueError("input_ids: must be a non-empty list of token ids")
        if obj.get("labels") is not None:
            supervised = np.asarray(obj["labels"], dtype=np.int64) != -100
        elif obj.get("loss_mask") is not None:
            supervised = np.asarray(obj["loss_mask"], dtype=np.int64) != 0
        else:
            supervised = np.ones(ids.shape, dtype=bool)
        if supervised.shape != ids.shape:
            raise ValueError("labels / loss_mask: must have one entry per input id")
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidJobError(f"{where}: {exc}") from exc
    return Example(ids.astype(np.int32), supervised, np.zeros(ids.shape, np.int8), ("tokens",))


def build_text_rows(
    recipe: RowRecipe,
    files: list[DataFile],
    eval_files: list[DataFile] | None,
    tok: Tokenizer,
    out: Path,
    data: DataSpec,
) -> dict[str, Any]:
    """Write `out/{train,eval}` for `text`, unpacked `jsonl_text` and flat `tokens`."""
    skipped = LeftOut()
    if recipe.format == "text":  # what is not text is never read, nor counted in the bound
        files = skipped.sniff(files)
        eval_files = skipped.sniff(eval_files) if eval_files is not None else None
        if not files:
            why = skipped.files[0][2]
            raise InvalidJobError(
                f"none of the {len(skipped.files)} data files is UTF-8 text ({why}); a text "
                "dataset is read as text: choose its text files with data.include"
            )
    capacity = _capacity(files + (eval_files or []), recipe, data.token_dtype or "uint16")
    writers = [
        RowsWriter(out / name, seq_len=recipe.seq_len, capacity=capacity)
        for name in ("train", "eval")
    ]
    chunkers = [Chunker(recipe.seq_len, w.append) for w in writers]
    if recipe.format == "jsonl_text":
        _feed_records(files, eval_files, tok, chunkers, data.eval_fraction)
    elif recipe.format == "tokens":
        _feed_tokens(files, eval_files, chunkers, data)
    else:
        for side, blocks in _text_sides(files, eval_files, data, skipped):
            _feed_text(blocks, tok, chunkers[side])
    report: dict[str, Any] = {"format": recipe.format, "loss_on": "all"}
    if skipped.files or skipped.repaired:
        report["left_out"] = skipped.report()
    for name, writer, chunker in zip(("train", "eval"), writers, chunkers, strict=True):
        if writer.count == 0:
            raise InvalidJobError(
                f"the {name} split has {chunker.tokens} tokens, fewer than one chunk of "
                f"seq_len + 1 = {recipe.seq_len + 1}; give more data or a shorter model.seq_len"
            )
        writer.close({"format": recipe.format, "plain": True})  # the model's plain causal path
        report[name] = chunker.report()
    return report


def _capacity(files: list[DataFile], recipe: RowRecipe, bin_dtype: str) -> int:
    """An upper bound on rows per side: tokens <= bytes + one separator per record/file."""
    if recipe.format == "tokens":
        total = sum(int(token_array(f, bin_dtype).shape[0]) for f in files)
    else:
        total = 2 * sum(_size(f) for f in files)
    return total // (recipe.seq_len + 1) + 1


def _feed_records(
    files: list[DataFile],
    eval_files: list[DataFile] | None,
    tok: Tokenizer,
    chunkers: list[Chunker],
    eval_fraction: float,
) -> None:
    separator = np.array([tok.eos_id if tok.eos_id is not None else 10], dtype=np.int32)
    split = ExampleSplit(iter_records(files), eval_fraction) if eval_files is None else None
    for source, held_out in ((files, False), (eval_files or [], True)):
        for index, (where, raw, obj) in enumerate(iter_records(source)):
            text = obj.get("text") if isinstance(obj, dict) else None
            if not isinstance(text, str) or not text:
                raise InvalidJobError(f"{where}: text: must be a non-empty string")
            side = 1 if held_out else split.side(index, raw)  # type: ignore[union-attr]
            chunkers[side].add(np.concatenate([tok.ids(text), separator]))


def _feed_tokens(
    files: list[DataFile],
    eval_files: list[DataFile] | None,
    chunkers: list[Chunker],
    data: DataSpec,
) -> None:
    bin_dtype = data.token_dtype or "uint16"
    for f in files:
        array = token_array(f, bin_dtype)
        n_eval = 0 if eval_files else max(1, math.floor(array.shape[0] * data.eval_fraction))
        for start in range(0, array.shape[0] - n_eval, _BLOCK):
            chunkers[0].add(np.asarray(array[start : min(start + _BLOCK, array.shape[0] - n_eval)]))
        if n_eval:
            chunkers[1].add(np.asarray(array[array.shape[0] - n_eval :]))
    for f in eval_files or []:
        array = token_array(f, bin_dtype)
        for start in range(0, array.shape[0], _BLOCK):
            chunkers[1].add(np.asarray(array[start : start + _BLOCK]))


def _text_sides(
    files: list[DataFile], eval_files: list[DataFile] | None, data: DataSpec, text: LeftOut
) -> Iterator[tuple[int, Iterator[bytes]]]:
    """(side, byte blocks) per document. The documents are those within the `max_bytes`
    budget (in order, the last one cut); the split is then made among them, so a held-out
    document always lies within the budget and one document splits by position.
    Each document's blocks are cleaned of what is not text (`text`).
    Raises `InvalidJobError` when they hold no byte."""
    budget = data.max_bytes if data.max_bytes is not None else math.inf
    taken: list[tuple[DataFile, int]] = []
    for f in files:
        if budget <= 0:
            break
        take = int(min(_size(f), budget))
        budget -= take
        taken.append((f, take))
    if not any(take for _, take in taken):
        raise InvalidJobError(f"the text data ({', '.join(f.rel for f, _ in taken)}) is empty")
    if eval_files is None and len(taken) == 1:
        (f, size), n_eval = taken[0], max(1, math.floor(taken[0][1] * data.eval_fraction))
        yield 0, text.blocks(f, 0, size - n_eval)
        yield 1, text.blocks(f, size - n_eval, size)
        return
    held = (
        document_sides([f.rel for f, _ in taken], data.eval_fraction)
        if eval_files is None
        else [False] * len(taken)
    )
    for (f, take), is_eval in zip(taken, held, strict=True):
        yield int(is_eval), text.blocks(f, 0, take)
    for f in eval_files or []:
        yield 1, text.blocks(f, 0, _size(f))


class LeftOut:
    """What of the `text` files is not read as text: binary files, whose first block is not
    UTF-8 text (`sniff`, the rule registration lists them by), and the stray bytes dropped
    from the others (`blocks`)."""

    EXAMPLES = 20

    def __init__(self) -> None:
        self.files: list[tuple[str, int, str]] = []  # (relative path, bytes, reason)
        self.repaired: dict[str, int] = {}  # relative path -> bytes dropped

    def sniff(self, files: list[DataFile]) -> list[DataFile]:
        """`files` without the binary ones."""
        kept = []
        for f in files:
            problem = text_check.sniff(f.url, f.rel)
            if problem is None:
                kept.append(f)
            else:
                self.files.append((f.rel, _size(f), problem[0]))
        return kept

    def blocks(self, f: DataFile, start: int, stop: int) -> Iterator[bytes]:
        """`f`'s bytes `start:stop` in blocks, without NUL bytes and bytes that are not UTF-8
        (`dataformat.text.CleanBlocks`; a `start` inside a character drops its rest)."""
        clean = text_check.CleanBlocks(mid_file=start > 0)
        for block in _blocks(f, start, stop):
            if out := clean.clean(block):
                yield out
        if out := clean.finish():
            yield out
        if clean.dropped:
            self.repaired[f.rel] = self.repaired.get(f.rel, 0) + clean.dropped

    def report(self) -> dict[str, Any]:
        """`{"files", "bytes", "examples", "repaired"}` for the data report."""
        return {
            "files": len(self.files),
            "bytes": sum(size for _, size, _ in self.files),
            "examples": [
                {"path": rel, "size_bytes": size, "reason": why}
                for rel, size, why in self.files[: self.EXAMPLES]
            ],
            "repaired": [
                {"path": rel, "bytes_dropped": dropped}
                for rel, dropped in list(self.repaired.items())[: self.EXAMPLES]
            ],
            "repaired_files": len(self.repaired),
        }


def _size(f: DataFile) -> int:
    return int(fsspec.core.url_to_fs(f.url)[0].size(f.url))


def _blocks(f: DataFile, start: int, stop: int) -> Iterator[bytes]:
    with fsspec.open(f.url, "rb") as stream:
        stream.seek(start)
        left = stop - start
        while left > 0 and (block := stream.read(min(_BLOCK, left))):
            left -= len(block)
            yield block


def _feed_text(blocks: Iterator[bytes], tok: Tokenizer, chunker: Chunker) -> None:
    """Tokenize a document block by block (bytes: as they are; else decoded text cut after
    its last newline, so no token straddles two blocks but at line ends)."""
    if tok.hf is None:
        for block in blocks:
            chunker.add(np.frombuffer(block, dtype=np.uint8))
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for block in blocks:
        pending += decoder.decode(block)
        cut = pending.rfind("\n") + 1
        if cut:
            chunker.add(tok.ids(pending[:cut]))
            pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:
        chunker.add(tok.ids(pending))
