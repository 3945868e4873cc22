"""Dataset record formats: what each accepts, what it refuses, and the error's field path."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dataformat.records import (
    MessagesRecord,
    PreferenceRecord,
    PromptCompletionRecord,
    PromptRecord,
    describe_error,
    detect_format,
    parse_record,
)

USER = {"role": "user", "content": "What does len() return?"}
ASSISTANT = {"role": "assistant", "content": "The number of items."}


def _errors(format: str, obj: Any) -> list[str]:
    with pytest.raises(ValidationError) as info:
        parse_record(format, obj)
    return [describe_error(e) for e in info.value.errors()]


def test_messages_record_accepts_a_conversation_with_a_weighted_assistant_turn() -> None:
    record = parse_record("messages", {"messages": [USER, {**ASSISTANT, "weight": 1}], "id": 7})
    assert isinstance(record, MessagesRecord)
    assert [m.trained for m in record.messages] == [False, True]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {"messages": [USER, {"role": "robot", "content": "x"}]},
            "messages[1].role: must be one of system, user, assistant, tool (got 'robot')",
        ),
        ({"messages": [USER]}, "messages: no assistant message"),
        (
            {"messages": [USER, {**ASSISTANT, "weight": 0}]},
            "messages: every assistant message has weight 0",
        ),
        (
            {"messages": [{**USER, "content": ""}, ASSISTANT]},
            "messages[0].content: must not be empty",
        ),
        (
            {"messages": [{**USER, "weight": 1}, ASSISTANT]},
            "messages[0].weight: only assistant messages have a weight",
        ),
        ({"messages": []}, "messages: must not be empty"),
    ],
)
def test_messages_record_refusals_name_the_field(obj: dict[str, Any], expected: str) -> None:
    assert _errors("messages", obj) == [expected]


def test_prompt_completion_accepts_strings_and_message_lists_but_not_a_mix() -> None:
    plain = parse_record("prompt_completion", {"prompt": "2+2=", "completion": "4"})
    chat = parse_record("prompt_completion", {"prompt": [USER], "completion": [ASSISTANT]})
    assert isinstance(plain, PromptCompletionRecord) and not plain.conversational
    assert isinstance(chat, PromptCompletionRecord) and chat.conversational
    assert _errors("prompt_completion", {"prompt": "q", "completion": [ASSISTANT]}) == [
        "prompt and completion must both be strings or both message lists"
    ]


def test_openai_dpo_shape_becomes_the_trl_conversational_shape() -> None:
    record = parse_record(
        "preference",
        {
            "input": {"messages": [USER]},
            "preferred_output": [ASSISTANT],
            "non_preferred_output": [{**ASSISTANT, "content": "A string."}],
        },
    )
    assert isinstance(record, PreferenceRecord) and record.conversational
    assert record.prompt[0].content == USER["content"]  # type: ignore[union-attr]
    assert record.chosen[0].content == ASSISTANT["content"]  # type: ignore[index]


def test_preference_pair_whose_chosen_equals_rejected_is_refused() -> None:
    assert _errors("preference", {"prompt": "q", "chosen": "a", "rejected": "a"}) == [
        "chosen: equals rejected"
    ]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"text": "x"}, "jsonl_text"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}, "messages"),
        ({"messages": [{"role": "system", "content": "s"}, {"role": "user"}]}, "prompt"),
        ({"prompt": "2 + 3 =", "answer": "5"}, "prompt"),
        ({"prompt": "a", "completion": "b"}, "prompt_completion"),
        ({"prompt": "a", "chosen": "b", "rejected": "c"}, "preference"),
        ({"input": {}, "preferred_output": []}, "preference"),
        ({"input_ids": [1, 2]}, "tokens"),
        ({"other": 1}, None),
        ([1, 2], None),
    ],
)
def test_detect_format_by_keys(obj: Any, expected: str | None) -> None:
    assert detect_format(obj) == expected


def test_a_prompt_record_keeps_its_fields_for_graders() -> None:
    record = parse_record("prompt", {"prompt": "2 + 3 =", "answer": "5", "id": 7})
    assert isinstance(record, PromptRecord) and record.conversation is None
    assert record.model_extra == {"answer": "5", "id": 7}
    rft = {"messages": [{"role": "user", "content": "2 + 3 ="}], "reference_answer": "5"}
    record = parse_record("prompt", rft)
    assert isinstance(record, PromptRecord) and record.conversation is not None
    assert [m.role for m in record.conversation] == ["user"]


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        ({"answer": "5"}, "give exactly one of prompt or messages"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "give exactly one"),
        ({"prompt": ""}, "prompt: must not be empty"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "the last message is the assistant's",
        ),
    ],
)
def test_a_prompt_record_that_asks_nothing_or_answers_itself_is_refused(
    obj: dict[str, Any], error: str
) -> None:
    assert any(error in e for e in _errors("prompt", obj)), _errors("prompt", obj)
