"""A GRPO job's prompts: records -> the token ids the policy continues, with each record kept
for the graders (`Prompts`).

    train, held, report = load_prompts(spec, data_location, tokenizer, eval_location=None)
    prompts, too_long = dataset_prompts(spec, location, fmt, tokenizer, max_prompts=32,
                                        max_new_tokens=64)   # a dataset's first prompts

Records are read as the SFT pipeline reads them (`dataformat.readers`), of format `prompt`
(the prompt, or OpenAI's RFT `messages` ending in a user turn), `prompt_completion` (its
prompt; the completion stays in the record, `{{ item.completion }}`) or `messages` (the
conversation before its last assistant message, which stays in the record). A conversation is
rendered with the job's chat template and its generation prompt (`dataformat.chat.render`), a
string prompt is taken as it is; both are tokenized without special tokens added.

The held-out prompts are `eval_location`'s, else the records whose content hash ranks below
`data.eval_fraction` (`trainer.data.selection.ExampleSplit`, the SFT split). Prompts too long to
leave `max_new_tokens` within `model.seq_len` are left out and counted. Every rank reads and renders
the prompts itself: a prompt set is small next to a corpus, so there is no cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from dataformat.chat import message_dicts, render, resolve_template
from dataformat.errors import InvalidJobError
from dataformat.masks import Tokenizer
from dataformat.readers import detect, iter_records, list_files
from dataformat.records import (
    MessagesRecord,
    PromptCompletionRecord,
    PromptRecord,
    describe_error,
    parse_record,
)
from jobspec.method_checks import method_data_error
from trainer.data.selection import ExampleSplit

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from jobspec.job import JobSpec


@dataclass(frozen=True)
class Prompts:
    """N prompts: each one's token ids (1-D int64, what the model continues: the chat
    template's generation prompt included) and its dataset record (what graders read as
    `item`)."""

    ids: Sequence[np.ndarray]
    records: Sequence[dict[str, Any]]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.records):
            raise ValueError(f"{len(self.ids)} prompts but {len(self.records)} records")

    def __len__(self) -> int:
        return len(self.ids)


def load_prompts(
    spec: JobSpec,
    data_location: str,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    eval_location: str | None = None,
) -> tuple[Prompts, Prompts, dict[str, Any]]:
    """(train prompts, held-out prompts, report) of a `method.kind: grpo` job.

    The report (the `data` event's payload) counts records, prompts per side, prompts left out
    as too long, and gives the format and the longest prompt in tokens. Raises
    `InvalidJobError` for unreadable data, a record of the wrong shape (its file and line), a
    format GRPO cannot read, or a side left without a prompt."""
    assert spec.method.grpo is not None
    files = list_files(data_location, spec.data.include, spec.data.exclude)
    if not files:
        raise InvalidJobError(f"no data files at {data_location}")
    fmt = spec.data.format or detect(files)
    unfit = method_data_error("grpo", fmt)
    if unfit is not None:
        raise InvalidJobError(unfit)
    encode = _encoder(spec, fmt, tokenizer)
    limit = spec.model.seq_len - spec.method.grpo.max_new_tokens
    sides: list[tuple[list[np.ndarray], list[dict[str, Any]]]] = [([], []), ([], [])]
    too_long = [0, 0]

    def add(side: int, where: str, obj: Any) -> None:
        ids = encode(where, obj)
        if ids.size > limit:
            too_long[side] += 1
            return
        sides[side][0].append(ids)
        sides[side][1].append(obj)

    if eval_location is not None:
        for where, _, obj in iter_records(files):
            add(0, where, obj)
        eval_files = list_files(eval_location, spec.data.include, spec.data.exclude)
        for where, _, obj in iter_records(eval_files):
            add(1, where, obj)
    else:
        split = ExampleSplit(iter_records(files), spec.data.eval_fraction)
        for index, (where, raw, obj) in enumerate(iter_records(files)):
            add(split.side(index, raw), where, obj)
    for side, name in enumerate(("training", "evaluation")):
        if not sides[side][0]:
            raise InvalidJobError(
                f"no {name} prompt fits model.seq_len {spec.model.seq_len} with max_new_tokens "
                f"{spec.method.grpo.max_new_tokens} ({too_long[side]} too long)"
            )
    train, held = (Prompts(ids=ids, records=records) for ids, records in sides)
    report = {
        "format": fmt,
        "method": "grpo",
        "train_prompts": len(train),
        "eval_prompts": len(held),
        "too_long": sum(too_long),
        "max_prompt_tokens": max(int(ids.size) for ids in [*train.ids, *held.ids]),
        "files": len(files),
    }
    return train, held, report


def dataset_prompts(
    spec: JobSpec,
    location: str,
    fmt: str,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    max_prompts: int,
    max_new_tokens: int,
) -> tuple[Prompts, int]:
    """(the first `max_prompts` prompts of the records at `location`, of `fmt`, as a GRPO job
    of `spec` reads them (its chat template); prompts left out as too long to leave
    `max_new_tokens` within `model.seq_len`). Raises `InvalidJobError` as `load_prompts`."""
    unfit = method_data_error("grpo", fmt)
    if unfit is not None:
        raise InvalidJobError(unfit)
    encode = _encoder(spec, fmt, tokenizer)
    limit = spec.model.seq_len - max_new_tokens
    ids: list[np.ndarray] = []
    records: list[dict[str, Any]] = []
    too_long = 0
    for where, _, obj in iter_records(list_files(location, [], [])):
        if len(ids) >= max_prompts:
            break
        encoded = encode(where, obj)
        if encoded.size > limit:
            too_long += 1
            continue
        ids.append(encoded)
        records.append(obj)
    return Prompts(ids=ids, records=records), too_long


def _encoder(
    spec: JobSpec, fmt: str, tokenizer: PreTrainedTokenizerBase | None
) -> Callable[[str, Any], np.ndarray]:
    """(where, record) -> its prompt's token ids (1-D int64), rendered with `spec`'s chat
    template. Raises `InvalidJobError` for a record of the wrong shape or an empty prompt."""
    tok = Tokenizer(tokenizer)
    template = resolve_template(spec.data.chat_template, tokenizer)

    def encode(where: str, obj: Any) -> np.ndarray:
        text = prompt_text(where, fmt, obj, template=template, tokenizer=tokenizer)
        ids = tok.ids(text).astype(np.int64)
        if ids.size == 0:
            raise InvalidJobError(f"{where}: the prompt renders to no token")
        return ids

    return encode


def prompt_text(
    where: str,
    fmt: str,
    obj: Any,
    *,
    template: str,
    tokenizer: PreTrainedTokenizerBase | None,
) -> str:
    """The text the policy continues for the record `obj` of `fmt` (read at `where`). Raises
    `InvalidJobError` naming `where` and the field for a record of the wrong shape."""
    try:
        record = parse_record(fmt, obj)
    except ValidationError as exc:
        raise InvalidJobError(f"{where}: {describe_error(exc.errors()[0])}") from exc
    tools = None
    if isinstance(record, PromptRecord):
        conversation, tools = record.conversation, record.tools
        plain = record.prompt if conversation is None else None
    elif isinstance(record, PromptCompletionRecord):
        conversation = None if isinstance(record.prompt, str) else record.prompt
        plain = record.prompt if isinstance(record.prompt, str) else None
    elif isinstance(record, MessagesRecord):
        last = max(k for k, m in enumerate(record.messages) if m.role == "assistant")
        conversation, plain, tools = record.messages[:last], None, record.tools
        if not conversation:
            raise InvalidJobError(f"{where}: no message precedes the assistant's answer")
    else:  # method_data_error admitted only the three formats above
        raise InvalidJobError(f"{where}: {type(record).__name__} records hold no prompt")
    if plain is not None:
        assert isinstance(plain, str)
        return plain
    assert conversation is not None
    return render(
        message_dicts(conversation),
        template=template,
        tokenizer=tokenizer,
        tools=tools,
        add_generation_prompt=True,
    )
