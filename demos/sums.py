"""A verifiable toy task for reinforcement fine-tuning: the sum of two small numbers.

The supervised data comes from a careless labeler: each training question ("What is 3+4?")
appears `copies` times, and in `noise` of them the answer is one too many ("8"). A model
fine-tuned on it (`sums_sft.yaml`) learns the format and mostly the labeler's habit, so its
greedy answer is often wrong, while its samples hold the right sum often enough for a group of
them to disagree. GRPO (`grpo.yaml`, Shao et al. 2024, arXiv:2402.03300) then trains LoRA
adapters with a `string_check` grader against each prompt record's true `answer`, and the
held-out questions (pairs of numbers never trained on) show whether what it learnt generalises.

Standard library only (the client's quickstart imports it, and the client stays light):
``python -m demos.sums OUT_DIR`` writes the three JSONL files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SumsData:
    """The example's files: SFT `messages`, GRPO training `prompt`s and held-out `prompt`s."""

    messages: Path
    prompts: Path
    heldout: Path
    num_train_pairs: int
    num_heldout_pairs: int


def question(a: int, b: int) -> str:
    """The user's turn for the pair (a, b)."""
    return f"What is {a}+{b}?"


def split_pairs(
    max_operand: int, heldout_fraction: float, seed: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Every pair (a, b) with 0 <= a, b <= `max_operand`, shuffled by `seed`, split into
    (train, held-out); held-out is the first `heldout_fraction` of them."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    cut = round(len(pairs) * heldout_fraction)
    return pairs[cut:], pairs[:cut]


def sft_records(
    pairs: Iterable[tuple[int, int]], *, copies: int, noise: float
) -> list[dict[str, Any]]:
    """`messages` records: each pair `copies` times, the first `round(copies * noise)` of them
    answered one too many (the labeler's habit), the rest with the true sum."""
    wrong = round(copies * noise)
    return [
        {
            "messages": [
                {"role": "user", "content": question(a, b)},
                {"role": "assistant", "content": str(a + b + (1 if k < wrong else 0))},
            ]
        }
        for a, b in pairs
        for k in range(copies)
    ]


def prompt_records(pairs: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
    """`prompt` records (OpenAI RFT's shape): the question as messages and the true sum as
    `answer`, which a grader reads as ``{{ item.answer }}``."""
    return [
        {"messages": [{"role": "user", "content": question(a, b)}], "answer": str(a + b)}
        for a, b in pairs
    ]


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_sums_data(
    out_dir: Path,
    *,
    max_operand: int = 9,
    heldout_fraction: float = 0.2,
    copies: int = 10,
    noise: float = 0.7,
    seed: int = 0,
) -> SumsData:
    """Write ``sums.messages.jsonl`` (SFT, noisy labels), ``sums.prompts.jsonl`` (the same
    training pairs as prompts with their true answers) and ``sums.heldout.jsonl`` (the
    held-out pairs) into `out_dir`."""
    train, heldout = split_pairs(max_operand, heldout_fraction, seed)
    return SumsData(
        messages=write_jsonl(
            out_dir / "sums.messages.jsonl", sft_records(train, copies=copies, noise=noise)
        ),
        prompts=write_jsonl(out_dir / "sums.prompts.jsonl", prompt_records(train)),
        heldout=write_jsonl(out_dir / "sums.heldout.jsonl", prompt_records(heldout)),
        num_train_pairs=len(train),
        num_heldout_pairs=len(heldout),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory for the three JSONL files")
    parser.add_argument("--max-operand", type=int, default=9, help="largest number asked")
    parser.add_argument("--noise", type=float, default=0.7, help="share of off-by-one labels")
    args = parser.parse_args(argv)
    data = write_sums_data(args.out_dir, max_operand=args.max_operand, noise=args.noise)
    for path in (data.messages, data.prompts, data.heldout):
        print(path)


if __name__ == "__main__":
    main()
