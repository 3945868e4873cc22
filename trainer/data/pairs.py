"""Preference pairs -> two row sets of equal length, `chosen` and `rejected`.

The rows contract: docs/ARCHITECTURE.md, 'Preference rows'.

Row i of each is the same prompt followed by the chosen / rejected answer, supervised on the
answer only (and its end-of-turn / EOS), one pair per row, padded, never packed: what DPO's
log-probabilities are summed over (Rafailov et al. 2023; TRL's `DPOTrainer` tokenizes the same
way: prompt + answer, answer-only labels). A pair is kept or dropped whole, so the two sets
stay aligned; `data.truncation` cuts each answer's sequence on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dataformat.errors import InvalidJobError
from dataformat.masks import Example, MaskStats, Tokenizer, encode_record, truncate
from dataformat.readers import DataFile, iter_records
from dataformat.records import (
    PreferenceRecord,
    PromptCompletionRecord,
    describe_error,
    parse_record,
)
from trainer.data.packing import RowPacker
from trainer.data.rows import Rows, RowsWriter
from trainer.data.selection import ExampleSplit, RowRecipe

ANSWERS = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferenceRows:
    """Aligned rows: `chosen[i]` and `rejected[i]` share their prompt."""

    chosen: Rows
    rejected: Rows

    def __len__(self) -> int:
        return len(self.chosen)

    @classmethod
    def open(cls, directory: Path) -> PreferenceRows:
        return cls(Rows.open(directory / "chosen"), Rows.open(directory / "rejected"))


def encode_pair(
    where: str, obj: Any, *, tokenizer: Tokenizer, template: str
) -> tuple[Example, Example]:
    """A decoded preference record -> (chosen, rejected) examples, answers supervised.
    Raises `InvalidJobError` naming `where`. (`tools` of a record are not rendered.)"""
    try:
        record = parse_record("preference", obj)
    except ValidationError as exc:
        raise InvalidJobError(f"{where}: {describe_error(exc.errors()[0])}") from exc
    assert isinstance(record, PreferenceRecord)
    pair = []
    for answer in (record.chosen, record.rejected):
        both = PromptCompletionRecord.model_construct(prompt=record.prompt, completion=answer)
        try:
            pair.append(
                encode_record(both, tokenizer=tokenizer, template=template, loss_on="completion")
            )
        except InvalidJobError as exc:
            raise InvalidJobError(f"{where}: {exc}") from exc
    return pair[0], pair[1]


def build_preference_rows(
    recipe: RowRecipe,
    sources: list[tuple[list[DataFile], ExampleSplit | int]],
    capacity: list[int],
    tok: Tokenizer,
    out: Path,
    max_truncated_share: float,
) -> dict[str, Any]:
    """Write `out/{train,eval}/{chosen,rejected}`; the counts per side. `sources`: the
    files with their `ExampleSplit` or fixed side (0 train, 1 evaluation)."""
    writers = [
        [RowsWriter(out / side / a, seq_len=recipe.seq_len, capacity=max(n, 1)) for a in ANSWERS]
        for side, n in zip(("train", "eval"), capacity, strict=True)
    ]
    packers = [
        [RowPacker(recipe.seq_len, packing=False, pad_id=tok.pad_id, emit=w.append) for w in pair]
        for pair in writers
    ]
    stats = [MaskStats(), MaskStats()]
    for files, split in sources:
        for index, (where, raw, obj) in enumerate(iter_records(files)):
            side = split if isinstance(split, int) else split.side(index, raw)
            pair = encode_pair(where, obj, tokenizer=tok, template=recipe.template or "")
            kept = [truncate(e, recipe.seq_len, recipe.truncation) for e in pair]
            whole = all(k is not None for k in kept)
            for example, k in zip(pair, kept, strict=True):
                stats[side].add(example, k if whole else None)
            for packer, k in zip(packers[side], kept, strict=True):
                if whole and k is not None:
                    packer.add(k.input_ids, k.labels())
    report: dict[str, Any] = {"format": "preference", "loss_on": "completion"}
    for name, pair_writers, pair_packers, side_stats in zip(
        ("train", "eval"), writers, packers, stats, strict=True
    ):
        side_stats.check(loss_on="completion", max_truncated_share=max_truncated_share, what=name)
        if pair_writers[0].count == 0:
            raise InvalidJobError(f"the {name} split has no preference pair that fits")
        efficiency = {}
        for answer, writer, packer in zip(ANSWERS, pair_writers, pair_packers, strict=True):
            efficiency[answer] = packer.close().report()
            writer.close({"format": "preference", "answer": answer})
        report[name] = side_stats.report() | {"pairs": pair_writers[0].count, **efficiency}
    return report
