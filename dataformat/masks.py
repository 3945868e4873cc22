"""Examples -> token ids with their loss mask, truncation, and the mask verifier.

An `Example` is one record tokenized: ids (L,) and which tokens the loss sees as targets. For
chat records the supervised text comes from `dataformat.chat.render_chat` (character regions of
the rendered conversation), mapped to tokens with the fast tokenizer's `offset_mapping` (for
the byte-level GPT a token is a byte: each byte maps to its character). A token is supervised
iff its whole character span lies inside a supervised region, so a token that straddles a
role header and an answer is never trained (conservative: it can lose one token, never leak
one). Standard `prompt_completion` records are tokenized as two parts (prompt, completion +
EOS), as TRL does, so no token straddles them.

The verifier (`MaskStats.check`) runs on a sample before any training step and on the whole
corpus after it is tokenized; it refuses, with `InvalidJobError` (a data error, exit 2), when
no token is supervised, when `assistant` mode supervises a token outside a trained assistant
message, or when more than `max_truncated_share` of the examples lose every supervised token
to truncation. Torch-free (numpy, tokenizers/transformers, jinja2), so the API can reuse it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dataformat.chat import render_chat
from dataformat.errors import InvalidJobError
from dataformat.records import (
    MessagesRecord,
    PromptCompletionRecord,
    PromptRecord,
    Record,
    TextRecord,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100  # == trainer.data.rows.IGNORE_INDEX (rows imports torch; this module must not)
DEFAULT_LOSS_ON = {
    "messages": "assistant",
    "prompt_completion": "completion",
    "preference": "completion",
    "prompt": "completion",
    "jsonl_text": "all",
    "text": "all",
    "tokens": "all",
}


class Tokenizer:
    """Text -> ids with character offsets: a fast Hugging Face tokenizer, or bytes (None)."""

    def __init__(self, hf: PreTrainedTokenizerBase | None) -> None:
        if hf is not None and not getattr(hf, "is_fast", False):
            raise InvalidJobError("the model's tokenizer must be a fast tokenizer (offsets)")
        self.hf = hf
        self.eos_id: int | None = None if hf is None else hf.eos_token_id

    @property
    def identity(self) -> str:
        """Name and a hash of the whole vocabulary/merges/normalizer (the cache key's part)."""
        if self.hf is None:
            return "bytes"
        digest = hashlib.sha256(self.hf.backend_tokenizer.to_str().encode()).hexdigest()
        return f"{type(self.hf).__name__}:{self.hf.name_or_path}:{digest}"

    @property
    def pad_id(self) -> int:
        """The id that fills padding positions (their labels are ignored, so any id would do):
        the tokenizer's pad token, else its EOS, else 0 (bytes: 0)."""
        if self.hf is None:
            return 0
        return int(self.hf.pad_token_id or self.eos_id or 0)

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, starts, ends): (L,) int32 ids and each token's [start, end) in characters."""
        if self.hf is None:  # byte i belongs to the character whose first byte precedes it
            data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            starts = np.cumsum((data & 0xC0) != 0x80, dtype=np.int64) - 1
            return data.astype(np.int32), starts, starts + 1
        out = self.hf(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = np.asarray(out["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return np.asarray(out["input_ids"], dtype=np.int32), offsets[:, 0], offsets[:, 1]

    def ids(self, text: str) -> np.ndarray:
        return self.encode(text)[0]

    def pieces(self, ids: list[int]) -> list[str]:
        """Each id decoded alone, for display: a byte that starts a UTF-8 character carries
        the whole character (its continuation bytes show as ""); a Hugging Face token is
        `decode([id])` (special tokens kept; a character split across tokens shows U+FFFD)."""
        if self.hf is None:
            data = bytes(ids)
            heads = [i for i, b in enumerate(data) if b & 0xC0 != 0x80] + [len(data)]
            out = [""] * len(data)
            for a, b in itertools.pairwise(heads):
                out[a] = data[a:b].decode("utf-8", errors="replace")
            for i in range(heads[0]):  # stray continuation bytes before the first character
                out[i] = "\ufffd"
            return out
        decoded: list[str] = self.hf.batch_decode(
            [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return decoded


@dataclass(frozen=True)
class Example:
    """One tokenized example: `input_ids` (L,) int32, `supervised` (L,) bool (token t is a
    target of the loss), `roles` (L,) int8 indexes into `role_names`, and `leaks`: supervised
    tokens outside every trained assistant message (must be 0 under `assistant`)."""

    input_ids: np.ndarray
    supervised: np.ndarray
    roles: np.ndarray
    role_names: tuple[str, ...]
    leaks: int = 0

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_targets(self) -> int:
        """Supervised targets: token 0 is never a target (nothing precedes it)."""
        return int(self.supervised[1:].sum())

    def labels(self) -> np.ndarray:
        """(L,) int32 shifted within the example: labels[t] = ids[t + 1] where supervised,
        -100 elsewhere and at the last position (it never sees the next example)."""
        out = np.full(len(self), IGNORE_INDEX, dtype=np.int32)
        out[:-1] = np.where(self.supervised[1:], self.input_ids[1:], IGNORE_INDEX)
        return out


def _covered(starts: np.ndarray, ends: np.ndarray, regions: list[tuple[int, int]]) -> np.ndarray:
    """(L,) bool: token [start, end) lies inside one of the sorted disjoint `regions`."""
    if not regions:
        return np.zeros(starts.shape, dtype=bool)
    lo = np.array([r[0] for r in regions], dtype=np.int64)
    hi = np.array([r[1] for r in regions], dtype=np.int64)
    idx = np.searchsorted(lo, starts, side="right") - 1
    ok = idx >= 0
    safe = np.clip(idx, 0, None)
    return ok & (starts >= lo[safe]) & (ends <= hi[safe]) & (ends > starts)


def encode_record(record: Record, *, tokenizer: Tokenizer, template: str, loss_on: str) -> Example:
    """Tokenize one record and mark its supervised tokens for `loss_on`.

    Raises `InvalidJobError` for a record the template cannot render or locate, and for a
    `loss_on` its format cannot honour.
    """
    if isinstance(record, TextRecord):
        return _plain([("text", record.text, True)], tokenizer)
    if isinstance(record, PromptCompletionRecord) and isinstance(record.prompt, str):
        assert isinstance(record.completion, str)
        if loss_on == "assistant":
            raise InvalidJobError("data.loss_on 'assistant' needs conversational records")
        return _plain(
            [("prompt", record.prompt, loss_on == "all"), ("completion", record.completion, True)],
            tokenizer,
        )
    if isinstance(record, MessagesRecord):
        messages, tools, num_prompt = record.messages, record.tools, 0
        if loss_on == "completion":
            raise InvalidJobError("data.loss_on 'completion' needs prompt_completion records")
    elif isinstance(record, PromptCompletionRecord):
        assert not isinstance(record.prompt, str) and not isinstance(record.completion, str)
        messages, tools, num_prompt = [*record.prompt, *record.completion], None, len(record.prompt)
    elif isinstance(record, PromptRecord):
        raise InvalidJobError(
            "prompt records hold no answer to learn from: a prompt dataset trains with "
            "method.kind grpo"
        )
    else:
        raise InvalidJobError(f"{type(record).__name__} records do not make SFT examples")
    chat = render_chat(
        messages,
        template=template,
        tokenizer=tokenizer.hf,
        tools=tools,
        loss_on=loss_on,
        num_prompt=num_prompt,
    )
    ids, starts, ends = tokenizer.encode(chat.text)
    supervised = _covered(starts, ends, chat.supervised)
    names = tuple(dict.fromkeys(chat.roles))
    bounds = np.array([a for a, _ in chat.spans], dtype=np.int64)
    message = np.clip(np.searchsorted(bounds, starts, side="right") - 1, 0, None)
    lookup = np.array([names.index(r) for r in chat.roles], dtype=np.int8)
    leaks = 0
    if loss_on == "assistant":
        leaks = int((supervised & ~_covered(starts, ends, chat.allowed)).sum())
    return Example(ids, supervised, lookup[message], names, leaks)


def _plain(parts: list[tuple[str, str, bool]], tokenizer: Tokenizer) -> Example:
    """Text parts tokenized separately and concatenated, then EOS (supervised) if any."""
    names = tuple(name for name, _, _ in parts)
    ids, sup, roles = [], [], []
    for i, (_, text, trained) in enumerate(parts):
        part = tokenizer.ids(text)
        ids.append(part)
        sup.append(np.full(part.shape, trained))
        roles.append(np.full(part.shape, i, dtype=np.int8))
    if tokenizer.eos_id is not None:
        ids.append(np.array([tokenizer.eos_id], dtype=np.int32))
        sup.append(np.array([True]))
        roles.append(np.array([len(parts) - 1], dtype=np.int8))
    return Example(np.concatenate(ids), np.concatenate(sup), np.concatenate(roles), names)


def truncate(example: Example, seq_len: int, mode: str) -> Example | None:
    """`example` cut to `seq_len` tokens by `mode` (`truncate_left` keeps the end,
    `truncate_right` the start), or None when `mode` is `drop` and it is longer."""
    if len(example) <= seq_len:
        return example
    if mode == "drop":
        return None
    cut = slice(len(example) - seq_len, None) if mode == "truncate_left" else slice(0, seq_len)
    return Example(
        example.input_ids[cut],
        example.supervised[cut],
        example.roles[cut],
        example.role_names,
        example.leaks,
    )


@dataclass
class MaskStats:
    """Counts over examples: how many, dropped/truncated, supervised targets per role."""

    examples: int = 0
    dropped: int = 0
    truncated: int = 0
    lost_all_supervision: int = 0
    leaks: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    tokens_by_role: Counter[str] = field(default_factory=Counter)
    supervised_by_role: Counter[str] = field(default_factory=Counter)

    def add(self, example: Example, kept: Example | None) -> None:
        """Count `example` and what truncation kept of it (None: dropped)."""
        self.examples += 1
        self.leaks += example.leaks
        if kept is None:
            self.dropped += 1
        elif len(kept) < len(example):
            self.truncated += 1
        if example.num_targets and (kept is None or kept.num_targets == 0):
            self.lost_all_supervision += 1
        if kept is None:
            return
        self.tokens += len(kept)
        self.supervised_tokens += kept.num_targets
        roles = kept.roles[1:]
        for i, name in enumerate(kept.role_names):
            mine = roles == i
            self.tokens_by_role[name] += int(mine.sum())
            self.supervised_by_role[name] += int((mine & kept.supervised[1:]).sum())

    def report(self) -> dict[str, Any]:
        """The counts as the `data` event's fields (shares as fractions of all targets)."""
        total = max(self.supervised_tokens, 1)
        return {
            "examples": self.examples,
            "dropped": self.dropped,
            "truncated": self.truncated,
            "lost_all_supervision": self.lost_all_supervision,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "supervised_share_by_role": {
                r: self.supervised_by_role[r] / total for r in sorted(self.supervised_by_role)
            },
        }

    def check(self, *, loss_on: str, max_truncated_share: float, what: str) -> None:
        """Refuse the data (`InvalidJobError`) for the verifier's three reasons."""
        if self.leaks and loss_on == "assistant":
            raise InvalidJobError(
                f"{what}: loss_on 'assistant' supervises {self.leaks} token(s) outside the "
                "assistant messages; the chat template's offsets are not trustworthy"
            )
        share = self.lost_all_supervision / max(self.examples, 1)
        if share > max_truncated_share:
            raise InvalidJobError(
                f"{what}: {self.lost_all_supervision} of {self.examples} examples "
                f"({share:.1%}) lose every supervised token to truncation, more than "
                f"data.max_truncated_share ({max_truncated_share:.1%}); raise model.seq_len "
                "or change data.truncation"
            )
        if self.supervised_tokens == 0:
            raise InvalidJobError(
                f"{what}: no token is supervised (loss_on {loss_on!r}); check the chat "
                "template and data.loss_on"
            )


def verify_masks(
    examples: list[Example],
    *,
    loss_on: str,
    seq_len: int,
    truncation: str,
    max_truncated_share: float,
    what: str = "data",
) -> MaskStats:
    """The mask verifier over a sample of tokenized examples: counts them (after
    truncation to `seq_len`) and refuses as `MaskStats.check` says. Returns the counts."""
    stats = MaskStats()
    for example in examples:
        stats.add(example, truncate(example, seq_len, truncation))
    stats.check(loss_on=loss_on, max_truncated_share=max_truncated_share, what=what)
    return stats


def encode_at(
    where: str, obj: Any, *, format: str, tokenizer: Tokenizer, template: str, loss_on: str
) -> Example:
    """One decoded record of `format` -> `Example`, as the job encodes it. Raises
    `InvalidJobError` prefixed with `where` (`file:line`) for an invalid record or one the
    template cannot render or locate."""
    from pydantic import ValidationError

    from dataformat.records import describe_error, parse_record

    try:
        record = parse_record(format, obj)
    except ValidationError as exc:
        raise InvalidJobError(f"{where}: {describe_error(exc.errors()[0])}") from exc
    try:
        return encode_record(record, tokenizer=tokenizer, template=template, loss_on=loss_on)
    except InvalidJobError as exc:
        raise InvalidJobError(f"{where}: {exc}") from exc


def preview(
    records: Iterable[tuple[str, Any]],
    *,
    format: str,
    tokenizer: Tokenizer,
    template: str,
    loss_on: str | None,
    seq_len: int,
    truncation: str,
    max_truncated_share: float,
    max_shown_tokens: int | None = None,
) -> dict[str, Any]:
    """What a job would learn from `records` ((where, decoded object) pairs of `format`, not
    `text`/`tokens`/`preference`), as `POST /v1/datasets/{id}/preview` shows them.

    Returns `examples` (per record: `where`, `num_tokens` L, `input_ids`, decoded `tokens`,
    `supervised` and `roles` for its first min(L, `max_shown_tokens`) tokens, and `status`:
    kept, truncated or dropped at `seq_len`; the counts always cover every token), the
    verifier's `report` (with per-role token and supervised counts), the `loss_on` applied, and
    `refused`: None, or the reason exactly as the job's verifier refuses the same sample (an
    unrenderable record, or `MaskStats.check`'s reasons). Never raises for the data.
    """
    mode = loss_on or DEFAULT_LOSS_ON[format]
    stats, shown, refused = MaskStats(), [], None
    try:
        for where, obj in records:
            example = encode_at(
                where, obj, format=format, tokenizer=tokenizer, template=template, loss_on=mode
            )
            kept = truncate(example, seq_len, truncation)
            stats.add(example, kept)
            status = "dropped" if kept is None else "kept" if kept is example else "truncated"
            shown_len = len(example) if max_shown_tokens is None else max_shown_tokens
            ids = example.input_ids[:shown_len].tolist()
            shown.append(
                {
                    "where": where,
                    "status": status,
                    "num_tokens": len(example),
                    "input_ids": ids,
                    "tokens": tokenizer.pieces(ids),
                    "supervised": example.supervised[:shown_len].tolist(),
                    "roles": [example.role_names[r] for r in example.roles[:shown_len].tolist()],
                }
            )
        stats.check(loss_on=mode, max_truncated_share=max_truncated_share, what="data sample")
    except InvalidJobError as exc:
        refused = str(exc)
    report = stats.report()
    report["tokens_by_role"] = dict(sorted(stats.tokens_by_role.items()))
    report["supervised_by_role"] = dict(sorted(stats.supervised_by_role.items()))
    return {"examples": shown, "report": report, "loss_on": mode, "refused": refused}
