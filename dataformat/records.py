"""Dataset record formats: the shape of one training example, checked once at upload.

Pure pydantic (like `jobspec.job`), so the API validates uploads with the same models the
trainer renders from. One record is one JSON object (a JSONL line or a Parquet row).

| format | one record |
|---|---|
| `text` | files/directories of raw text (no records; not validated here) |
| `jsonl_text` | `{"text": "..."}` |
| `messages` | `{"messages": [{"role", "content", "weight"?}], "tools"?: [...]}` (OpenAI chat
  fine-tuning format) |
| `prompt_completion` | `{"prompt", "completion"}`, both strings or both message lists (TRL) |
| `preference` | `{"prompt", "chosen", "rejected"}` (TRL) or the OpenAI DPO shape
  `{"input": {"messages"}, "preferred_output", "non_preferred_output"}` |
| `tokens` | pre-tokenized: Parquet `input_ids` (+ `labels` or `loss_mask`), or `.bin`/`.npy` |
| `prompt` | prompts to sample answers for (GRPO): `{"prompt": str or messages}` or OpenAI's
  reinforcement fine-tuning shape `{"messages": [...]}` ending in a user turn; every other key
  is the record's data that graders read (`{{ item.answer }}`) |

`parse_record(format, obj)` returns the validated model (the OpenAI DPO shape is normalised to
`PreferenceRecord`) or raises `pydantic.ValidationError`, whose error locations are field
paths such as `("messages", 2, "role")`; `error_path` renders them as `messages[2].role`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

Format = Literal[
    "text", "jsonl_text", "messages", "prompt_completion", "preference", "tokens", "prompt"
]
FORMATS: tuple[str, ...] = (
    "text",
    "jsonl_text",
    "messages",
    "prompt_completion",
    "preference",
    "tokens",
    "prompt",
)
RECORD_FORMATS: tuple[str, ...] = (
    "jsonl_text",
    "messages",
    "prompt_completion",
    "preference",
    "prompt",
)
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# `data.loss_on` values each record format can honour (None: the format's default,
# `dataformat.masks.DEFAULT_LOSS_ON`).
LOSS_ON_BY_FORMAT: dict[str, tuple[str, ...]] = {
    "text": ("all",),
    "jsonl_text": ("all",),
    "tokens": ("all",),
    "messages": ("assistant", "all"),
    "prompt_completion": ("completion", "assistant", "all"),
    "preference": ("completion",),
    "prompt": ("completion",),  # the sampled completion (GRPO); nothing of the record itself
}


class _Record(BaseModel):
    # Unknown keys in a record are ignored (datasets carry ids, sources, metadata), but a
    # known key must have the right shape.
    model_config = ConfigDict(extra="ignore", frozen=True)


class Message(_Record):
    """One chat message. `weight` (assistant messages only): 0 excludes it from the loss."""

    role: str
    content: str | None = None
    weight: Literal[0, 1] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Message:
        if self.role not in ROLES:
            raise PydanticCustomError(
                "role", "role: must be one of " + ", ".join(ROLES) + f" (got {self.role!r})"
            )
        if not self.content and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("empty_content", "content: must not be empty")
        if self.weight is not None and self.role != "assistant":
            raise PydanticCustomError("weight", "weight: only assistant messages have a weight")
        return self

    @property
    def trained(self) -> bool:
        """Whether the loss may see this message (an assistant message without weight 0)."""
        return self.role == "assistant" and self.weight != 0


Conversation = list[Message]


def _check_conversation(messages: Conversation, *, needs_assistant: bool) -> None:
    if not messages:
        raise PydanticCustomError("empty", "messages: must not be empty")
    if needs_assistant and not any(m.role == "assistant" for m in messages):
        raise PydanticCustomError("no_assistant", "messages: no assistant message")
    if needs_assistant and not any(m.trained for m in messages):
        raise PydanticCustomError(
            "all_weights_zero", "messages: every assistant message has weight 0"
        )


class TextRecord(_Record):
    """`jsonl_text`: one document."""

    text: str = Field(min_length=1)


class MessagesRecord(_Record):
    """`messages`: a conversation; at least one assistant message with weight 1 (or none)."""

    messages: Conversation
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _check(self) -> MessagesRecord:
        _check_conversation(self.messages, needs_assistant=True)
        return self


class PromptCompletionRecord(_Record):
    """`prompt_completion`: standard (two strings) or conversational (two message lists)."""

    prompt: str | Conversation
    completion: str | Conversation

    @model_validator(mode="after")
    def _check(self) -> PromptCompletionRecord:
        if isinstance(self.prompt, str) != isinstance(self.completion, str):
            raise PydanticCustomError(
                "mixed", "prompt and completion must both be strings or both message lists"
            )
        if isinstance(self.completion, str):
            if not self.completion:
                raise PydanticCustomError("empty_content", "completion: must not be empty")
        else:
            _check_conversation(self.completion, needs_assistant=True)
        return self

    @property
    def conversational(self) -> bool:
        return not isinstance(self.prompt, str)


class PreferenceRecord(_Record):
    """`preference`: a prompt with a chosen and a rejected answer (TRL's shape)."""

    prompt: str | Conversation
    chosen: str | Conversation
    rejected: str | Conversation
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_openai(cls, data: Any) -> Any:
        """The OpenAI DPO shape -> TRL's conversational shape."""
        if isinstance(data, dict) and "input" in data and "prompt" not in data:
            source = data.get("input")
            if not isinstance(source, dict) or "messages" not in source:
                raise PydanticCustomError("input", "input: must be an object with messages")
            return {
                "prompt": source["messages"],
                "chosen": data.get("preferred_output"),
                "rejected": data.get("non_preferred_output"),
                "tools": source.get("tools"),
            }
        return data

    @model_validator(mode="after")
    def _check(self) -> PreferenceRecord:
        answers = (self.chosen, self.rejected)
        if len({isinstance(x, str) for x in (self.prompt, *answers)}) != 1:
            raise PydanticCustomError(
                "mixed", "prompt, chosen and rejected must all be strings or all message lists"
            )
        for name, answer in zip(("chosen", "rejected"), answers, strict=True):
            if not answer:
                raise PydanticCustomError("empty_content", f"{name}: must not be empty")
            if not isinstance(answer, str):
                _check_conversation(answer, needs_assistant=True)
        if self.chosen == self.rejected:
            raise PydanticCustomError("same_answers", "chosen: equals rejected")
        return self

    @property
    def conversational(self) -> bool:
        return not isinstance(self.prompt, str)


class PromptRecord(_Record):
    """`prompt`: what a policy is asked, with no answer to imitate (reinforcement fine-tuning).
    `prompt` (a string or messages) or `messages` (OpenAI's RFT shape), whose last message is
    not an assistant's; the record's other keys are kept for graders (`extra="allow"`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    prompt: str | Conversation | None = None
    messages: Conversation | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _check(self) -> PromptRecord:
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError("prompt", "give exactly one of prompt or messages")
        turns = self.conversation
        if isinstance(self.prompt, str):
            if not self.prompt:
                raise PydanticCustomError("empty_content", "prompt: must not be empty")
        elif turns is not None:
            _check_conversation(turns, needs_assistant=False)
            if turns[-1].role == "assistant":
                raise PydanticCustomError(
                    "ends_with_assistant",
                    "the last message is the assistant's: a prompt ends where the answer starts",
                )
        return self

    @property
    def conversation(self) -> Conversation | None:
        """The prompt's messages; None for a plain-text prompt."""
        if self.messages is not None:
            return self.messages
        return None if isinstance(self.prompt, str) else self.prompt


Record = TextRecord | MessagesRecord | PromptCompletionRecord | PreferenceRecord | PromptRecord
MODELS: dict[str, type[_Record]] = {
    "jsonl_text": TextRecord,
    "messages": MessagesRecord,
    "prompt_completion": PromptCompletionRecord,
    "preference": PreferenceRecord,
    "prompt": PromptRecord,
}
_ADAPTERS = {name: TypeAdapter(model) for name, model in MODELS.items()}


def parse_record(format: str, obj: Any) -> Record:
    """Validate one decoded JSON object as a record of `format` (one of `RECORD_FORMATS`).

    Raises `pydantic.ValidationError` (field paths in `.errors()[i]["loc"]`) or `KeyError`
    for a format without records (`text`, `tokens`).
    """
    record = _ADAPTERS[format].validate_python(obj)
    assert isinstance(record, Record)  # MODELS holds exactly the Record classes
    return record


def detect_format(obj: Any) -> str | None:
    """The record format a decoded JSON object looks like, by its keys; None if none fits."""
    if not isinstance(obj, dict):
        return None
    if "chosen" in obj or "preferred_output" in obj:
        return "preference"
    if "messages" in obj:
        messages = obj["messages"]
        last = messages[-1] if isinstance(messages, list) and messages else None
        ends_asking = isinstance(last, dict) and last.get("role") not in (None, "assistant")
        return "prompt" if ends_asking else "messages"
    if "completion" in obj:
        return "prompt_completion"
    if "prompt" in obj:
        return "prompt"
    if "text" in obj:
        return "jsonl_text"
    if "input_ids" in obj:
        return "tokens"
    return None


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: `("messages", 2, "role")` ->
    `messages[2].role`. Union branch names pydantic inserts (`str`, `list[Message]`) and
    validator-only locations are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "str" or part.startswith(("function-", "list[")):
            continue
        else:
            out += f".{part}" if out else part
    return out


def describe_error(error: Any) -> str:
    """One pydantic error (an item of `ValidationError.errors()`) as `path: message`, e.g.
    `messages[2].role: must be one of system, user, assistant, tool (got 'robot')`.

    The record validators word their messages as `field: what is wrong`; that field is joined
    to the error's location."""
    path = error_path(tuple(error["loc"]))
    message = str(error["msg"])
    if error["type"] in _CUSTOM_TYPES and path:
        return f"{path}.{message}"
    return f"{path}: {message}" if path else message


_CUSTOM_TYPES = frozenset(
    {"role", "empty_content", "weight", "empty", "no_assistant", "all_weights_zero", "mixed",
     "input", "same_answers"}
)  # fmt: skip
