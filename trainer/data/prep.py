"""A job's data -> training and evaluation rows, once, in a content-addressed cache.

    prepared = prepare_rows(spec, data_location, tokenizer, cache_root=..., dist=..., reporter=...)
    prepared.train, prepared.eval   # trainer.data.rows.Rows, memory-mapped

Pipeline (docs/ARCHITECTURE.md, 'From records to rows'): records are streamed
(`dataformat.readers`), rendered and masked (`dataformat.chat`, `dataformat.masks`), the masks of a
first sample verified before anything else is tokenized, over-long examples dropped or cut
(`data.truncation`), then packed or padded into rows (`trainer.data.packing`) written with
`trainer.data.rows.RowsWriter`. Raw text and flat token files take the degenerate path
(`trainer.data.textrows`): contiguous windows of seq_len + 1 tokens.

Cache: `CACHE_ROOT/<key>/{train,eval}/` plus `data.json` (the counts), where `key` is the
sha256 of everything that decides the rows (`RowRecipe`): the data's content digest (sha256
of every file's bytes), the tokenizer's identity (class, name and a hash of its whole
serialization), the chat template's source, seq_len, packing, loss_on, truncation, format,
eval source and split share, file selection. The job seed is not in it: nothing here depends
on it (the split hashes example content, packing follows file order), so jobs that differ
only by seed share an entry. An entry is built in a temporary directory and renamed into
place, so a reader sees all of it or nothing; a later job or a resumed attempt finds it and
tokenizes nothing. On each node local rank 0 builds while the other ranks wait (one
`all_gather_object` over a gloo group with a long timeout, which also carries a failure to
every rank); then every rank memory-maps the entry.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dataformat.chat import resolve_template
from dataformat.errors import InvalidJobError
from dataformat.masks import DEFAULT_LOSS_ON, Example, MaskStats, Tokenizer, encode_at, truncate
from dataformat.readers import DataFile, content_digest, detect, iter_records, list_files
from dataformat.records import LOSS_ON_BY_FORMAT
from trainer.data.packing import RowPacker
from trainer.data.rows import Rows, RowsWriter, mapped_file
from trainer.data.selection import ExampleSplit, RowRecipe
from trainer.events import Reporter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from jobspec.job import JobSpec
    from trainer.data.pairs import PreferenceRows
    from trainer.distributed import DistInfo

VERIFY_SAMPLE = 256  # examples whose masks are verified before the corpus is tokenized
CACHE_ENV = "TORCHYARD_CACHE_DIR"
BUILD_TIMEOUT = timedelta(hours=12)  # how long ranks wait for their node's builder
_REPORT = "data.json"
_COUNT_ROWS = 4096  # rows read at once when counting labels
CHAT_FORMATS = ("messages", "prompt_completion", "preference")


@dataclass(frozen=True)
class PreparedRows:
    """The rows of both sides (`PreferenceRows` for `preference` data), their cache entry and
    the `data` event's fields."""

    train: Rows | PreferenceRows
    eval: Rows | PreferenceRows
    directory: Path
    report: dict[str, Any]


def cache_root(explicit: str | None = None) -> Path:
    """Where row caches live: `explicit`, else `$TORCHYARD_CACHE_DIR`, else
    `$XDG_CACHE_HOME/torchyard/rows` (`~/.cache/torchyard/rows`). Local: rows are mmapped."""
    chosen = explicit or os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "torchyard" / "rows"


def prepare_rows(
    spec: JobSpec,
    data_location: str,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    cache_dir: Path,
    dist: DistInfo | None,
    reporter: Reporter,
    eval_location: str | None = None,
) -> PreparedRows:
    """The job's rows from `cache_dir`, built first when absent (see the module docstring).

    `tokenizer`: the model's fast tokenizer, or None for bytes. `eval_location`: the
    evaluation data (`data.eval_dataset` / `data.eval_uri` resolved), else a held-out share.
    Raises `InvalidJobError` (exit 2) for unreadable or invalid data, a refused mask, or a
    side without one row.
    """
    builder = dist is None or dist.local_rank == 0
    outcome: tuple[str, str] = ("wait", "")
    failure: BaseException | None = None
    if builder:
        try:
            entry, cached = _build_entry(
                spec, data_location, eval_location, Tokenizer(tokenizer), cache_dir
            )
            outcome = ("ok", f"{int(cached)}{entry}")
        except InvalidJobError as exc:
            outcome, failure = ("invalid", str(exc)), exc
        except Exception as exc:
            outcome, failure = ("error", f"{type(exc).__name__}: {exc}"), exc
    outcomes = _gather(outcome, dist)
    if failure is not None:
        raise failure
    for status, message in outcomes:
        if status == "invalid":
            raise InvalidJobError(f"data preparation on another rank: {message}")
        if status == "error":
            raise RuntimeError(f"data preparation failed on another rank: {message}")
    found = outcome[1] if outcome[0] == "ok" else next(m for s, m in outcomes if s == "ok")
    cached, entry = found[0] == "1", Path(found[1:])
    report = json.loads((entry / _REPORT).read_text()) | {"cached": cached, "key": entry.name}
    reporter.data(report)
    if report["format"] == "preference":
        from trainer.data.pairs import PreferenceRows

        sides: list[Any] = [PreferenceRows.open(entry / side) for side in ("train", "eval")]
    else:
        sides = [Rows.open(entry / side) for side in ("train", "eval")]
    return PreparedRows(sides[0], sides[1], entry, report)


def _gather(outcome: tuple[str, str], dist: DistInfo | None) -> list[tuple[str, str]]:
    """Every rank's outcome; doubles as the barrier the non-builders wait on."""
    if dist is None or not dist.is_distributed:
        return [outcome]
    import torch.distributed as tdist

    group = tdist.new_group(backend="gloo", timeout=BUILD_TIMEOUT)
    gathered: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(gathered, outcome, group=group)
    tdist.destroy_process_group(group)
    return [tuple(x) for x in gathered]


def row_recipe(
    spec: JobSpec, files: list[DataFile], eval_files: list[DataFile] | None, tok: Tokenizer
) -> RowRecipe:
    """The row recipe of `spec`'s data (everything that decides its rows). Raises
    `InvalidJobError` for a `loss_on` the format cannot honour."""
    data = spec.data
    fmt = data.format or detect(files)
    loss_on = data.loss_on or DEFAULT_LOSS_ON[fmt]
    if loss_on not in LOSS_ON_BY_FORMAT[fmt]:
        raise InvalidJobError(
            f"data.loss_on {loss_on!r} does not apply to format {fmt!r}; choose among "
            f"{list(LOSS_ON_BY_FORMAT[fmt])}"
        )
    return RowRecipe(
        format=fmt,
        loss_on=loss_on,
        template=resolve_template(data.chat_template, tok.hf) if fmt in CHAT_FORMATS else None,
        tokenizer=tok.identity,
        seq_len=spec.model.seq_len,
        packing=data.packing,
        truncation=data.truncation,
        eval_fraction=data.eval_fraction,
        train_digest=content_digest(files),
        eval_digest=content_digest(eval_files) if eval_files is not None else None,
        include=tuple(data.include),
        exclude=tuple(data.exclude),
        max_bytes=data.max_bytes,
        token_dtype=data.token_dtype,
    )


def _build_entry(
    spec: JobSpec, location: str, eval_location: str | None, tok: Tokenizer, cache_dir: Path
) -> tuple[Path, bool]:
    """(entry directory, whether it was already there)."""
    data = spec.data
    files = list_files(location, data.include, data.exclude)
    eval_files = list_files(eval_location, data.include, data.exclude) if eval_location else None
    recipe = row_recipe(spec, files, eval_files, tok)
    entry = cache_dir / recipe.key
    if (entry / _REPORT).is_file():
        return entry, True
    tmp = cache_dir / f".{recipe.key}.{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        if _is_stream(recipe, files):
            from trainer.data.textrows import build_text_rows

            report = build_text_rows(recipe, files, eval_files, tok, tmp, spec.data)
        else:
            report = _build_example_rows(recipe, files, eval_files, tok, tmp, spec)
        (tmp / _REPORT).write_text(json.dumps(report, indent=2))
        try:
            os.replace(tmp, entry)
        except OSError:  # another builder (a shared cache) finished the same entry first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry, False


def _is_stream(recipe: RowRecipe, files: list[DataFile]) -> bool:
    """Whether the data takes the degenerate contiguous-windows path (`trainer.data.textrows`)."""
    if recipe.format == "tokens":
        return files[0].kind == "tokens"  # flat arrays; Parquet token records are examples
    return recipe.format == "text" or (recipe.format == "jsonl_text" and not recipe.packing)


def encode_one(where: str, obj: Any, recipe: RowRecipe, tok: Tokenizer) -> Example:
    """One decoded record -> `Example`. Raises `InvalidJobError` naming `where` (file:line)."""
    if recipe.format == "tokens":
        from trainer.data.textrows import token_example

        return token_example(where, obj)
    return encode_at(
        where, obj, format=recipe.format, tokenizer=tok, template=recipe.template or "",
        loss_on=recipe.loss_on,
    )  # fmt: skip


def _build_example_rows(
    recipe: RowRecipe,
    files: list[DataFile],
    eval_files: list[DataFile] | None,
    tok: Tokenizer,
    out: Path,
    spec: JobSpec,
) -> dict[str, Any]:
    """Records -> verified, truncated, packed rows in `out/{train,eval}`; the counts."""
    max_share = spec.data.max_truncated_share
    _verify_sample(recipe, files, tok, max_share)
    sources: list[tuple[list[DataFile], ExampleSplit | int]]
    if eval_files is None:
        split = ExampleSplit(iter_records(files), spec.data.eval_fraction)
        sources, capacity = [(files, split)], split.counts
    else:
        sources, capacity = [(files, 0), (eval_files, 1)], [_count(files), _count(eval_files)]
    if recipe.format == "preference":
        from trainer.data.pairs import build_preference_rows

        return build_preference_rows(recipe, sources, capacity, tok, out, max_share)
    return _write_examples(recipe, sources, capacity, tok, out, max_share)


def _verify_sample(
    recipe: RowRecipe, files: list[DataFile], tok: Tokenizer, max_truncated_share: float
) -> None:
    """The mask verifier on the first `VERIFY_SAMPLE` records, before the rest is read."""
    verifier = MaskStats()
    examples: tuple[Example, ...]
    for index, (where, _, obj) in enumerate(iter_records(files)):
        if index == VERIFY_SAMPLE:
            break
        if recipe.format == "preference":
            from trainer.data.pairs import encode_pair

            examples = encode_pair(where, obj, tokenizer=tok, template=recipe.template or "")
        else:
            examples = (encode_one(where, obj, recipe, tok),)
        for example in examples:
            verifier.add(example, truncate(example, recipe.seq_len, recipe.truncation))
    verifier.check(
        loss_on=recipe.loss_on, max_truncated_share=max_truncated_share, what="data sample"
    )


def _write_examples(
    recipe: RowRecipe,
    sources: list[tuple[list[DataFile], ExampleSplit | int]],
    capacity: list[int],
    tok: Tokenizer,
    out: Path,
    max_truncated_share: float,
) -> dict[str, Any]:
    """SFT examples -> packed or padded rows in `out/{train,eval}`; the counts per side.
    `sources`: (files, split), where split is an `ExampleSplit` or a fixed side (0 train,
    1 evaluation)."""
    writers = [
        RowsWriter(out / name, seq_len=recipe.seq_len, capacity=max(n, 1))
        for name, n in zip(("train", "eval"), capacity, strict=True)
    ]
    packers = [
        RowPacker(recipe.seq_len, packing=recipe.packing, pad_id=tok.pad_id, emit=w.append)
        for w in writers
    ]
    stats = [MaskStats(), MaskStats()]
    for source, split in sources:
        for index, (where, raw, obj) in enumerate(iter_records(source)):
            side = split if isinstance(split, int) else split.side(index, raw)
            example = encode_one(where, obj, recipe, tok)
            kept = truncate(example, recipe.seq_len, recipe.truncation)
            stats[side].add(example, kept)
            if kept is not None:
                packers[side].add(kept.input_ids, kept.labels())
    report: dict[str, Any] = {"format": recipe.format, "loss_on": recipe.loss_on}
    for name, writer, packer, side_stats in zip(
        ("train", "eval"), writers, packers, stats, strict=True
    ):
        side_stats.check(loss_on=recipe.loss_on, max_truncated_share=max_truncated_share, what=name)
        packing = packer.close()
        if writer.count == 0:
            raise InvalidJobError(f"the {name} split has no example that fits model.seq_len")
        writer.close({"format": recipe.format})
        report[name] = side_stats.report() | packing.report()
    return report


def _count(files: list[DataFile]) -> int:
    return sum(1 for _ in iter_records(files))


def unigram_eval_loss(train: Rows, held: Rows, vocab_size: int) -> float:
    """Cross-entropy in nats/token of `held`'s supervised targets under the frequencies of
    `train`'s supervised targets (add-one smoothed), the baseline a model must beat (as
    over rows). Reads the labels in blocks of rows."""
    counts = _label_counts(train, vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    held_counts = _label_counts(held, vocab_size)
    return float(-(held_counts * log_p).sum() / max(int(held_counts.sum()), 1))


def _label_counts(rows: Rows, vocab_size: int) -> np.ndarray:
    total = np.zeros(vocab_size, dtype=np.int64)
    for labels in _label_blocks(rows.labels):
        total += np.bincount(labels[labels >= 0], minlength=vocab_size)[:vocab_size]
    return total


def _label_blocks(labels: np.ndarray) -> Iterator[np.ndarray]:
    """`labels` (N, T) as flat blocks of at most `_COUNT_ROWS` rows. A whole memory-mapped
    file is read with plain reads into one reused buffer: pages touched through a mapping
    count in the process's RSS for as long as it is mapped, so scanning every label through
    the memmap would grow each rank's RSS with the corpus; reads only warm the page cache."""
    where = mapped_file(labels)
    if where is None:
        for start in range(0, len(labels), _COUNT_ROWS):
            yield np.asarray(labels[start : start + _COUNT_ROWS]).reshape(-1)
        return
    path, width = Path(where[0]), int(labels.shape[1])
    buffer = np.empty(_COUNT_ROWS * width, dtype=labels.dtype)
    with path.open("rb") as file:
        file.seek(where[1])
        for start in range(0, len(labels), _COUNT_ROWS):
            view = buffer[: min(_COUNT_ROWS, len(labels) - start) * width]
            if file.readinto(view.data.cast("B")) != view.nbytes:
                raise OSError(f"{path}: shorter than its header says")
            yield view
