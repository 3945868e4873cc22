"""Loss masks from the rendered text's offsets, truncation, and each refusal of the verifier,
on a locally trained BPE tokenizer (ChatML special tokens) and on bytes."""

from __future__ import annotations

import numpy as np
import pytest

from dataformat.chat import CHATML, render_chat
from dataformat.errors import InvalidJobError
from dataformat.masks import IGNORE_INDEX, Tokenizer, encode_record, truncate, verify_masks
from dataformat.records import parse_record
from tests.support.sft_data import bpe_tokenizer, messages_records, prompt_completion_records

CONVERSATION = {
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": "Let me compute.", "weight": 0},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "mul", "arguments": "[6, 7]"}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "assistant", "content": "It is 42 (quarante-deux, é)."},
    ],
    "tools": [{"type": "function", "function": {"name": "mul"}}],
}


def _tokenizers() -> list[Tokenizer]:
    return [Tokenizer(bpe_tokenizer()), Tokenizer(None)]


def _decode(tok: Tokenizer, ids: np.ndarray) -> str:
    if tok.hf is None:
        return bytes(ids.astype(np.uint8)).decode("utf-8")
    return str(tok.hf.decode(ids.tolist()))


@pytest.mark.parametrize("tok", _tokenizers(), ids=["bpe", "bytes"])
def test_assistant_mode_supervises_trained_answers_and_their_end_of_turn_only(
    tok: Tokenizer,
) -> None:
    record = parse_record("messages", CONVERSATION)
    example = encode_record(record, tokenizer=tok, template=CHATML, loss_on="assistant")
    supervised = _decode(tok, example.input_ids[example.supervised])
    tool_call = '<tool_call>{"id": "c1", "function": {"name": "mul", "arguments": "[6, 7]"}}'
    assert supervised == f"{tool_call}</tool_call><|im_end|>It is 42 (quarante-deux, é).<|im_end|>"
    assert example.leaks == 0
    # every supervised token belongs to an assistant message; no header, no weight-0 answer
    names = np.array(example.role_names)[example.roles]
    assert set(names[example.supervised]) == {"assistant"}
    assert "Let me compute." not in supervised and "<|im_start|>" not in supervised


@pytest.mark.parametrize("tok", _tokenizers(), ids=["bpe", "bytes"])
def test_labels_are_shifted_within_the_example_and_the_last_is_ignored(tok: Tokenizer) -> None:
    record = parse_record("messages", CONVERSATION)
    example = encode_record(record, tokenizer=tok, template=CHATML, loss_on="assistant")
    labels = example.labels()
    assert labels[-1] == IGNORE_INDEX
    assert np.array_equal(labels[:-1] != IGNORE_INDEX, example.supervised[1:])
    kept = labels[:-1] != IGNORE_INDEX
    assert np.array_equal(labels[:-1][kept], example.input_ids[1:][kept])


def test_completion_mode_on_the_stdlib_set_supervises_the_docstring_and_eos() -> None:
    tok = Tokenizer(bpe_tokenizer())
    raw = prompt_completion_records(5)[0]
    example = encode_record(
        parse_record("prompt_completion", raw), tokenizer=tok, template=CHATML, loss_on="completion"
    )
    assert _decode(tok, example.input_ids[example.supervised]) == raw["completion"] + "<|im_end|>"


def test_all_mode_supervises_every_token_of_a_conversation() -> None:
    tok = Tokenizer(None)
    record = parse_record("messages", messages_records(1)[0])
    example = encode_record(record, tokenizer=tok, template=CHATML, loss_on="all")
    assert example.supervised.all()


def test_a_template_that_breaks_offsets_is_refused() -> None:
    # The system prompt moves to the end of the rendering: messages[:1] is not a prefix.
    moving = (
        "{% for m in messages if m.role != 'system' %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% for m in messages if m.role == 'system' %}[{{ m.content }}]{% endfor %}"
    )
    record = parse_record("messages", messages_records(1)[0])
    with pytest.raises(InvalidJobError, match="breaks offsets"):
        encode_record(record, tokenizer=Tokenizer(None), template=moving, loss_on="assistant")


def test_a_template_that_drops_the_answer_is_refused() -> None:
    record = parse_record("messages", messages_records(1)[0])
    hiding = "{% for m in messages %}<{{ m.role }}>{% endfor %}"
    with pytest.raises(InvalidJobError, match="verbatim"):
        render_chat(
            record.messages, template=hiding, tokenizer=None, tools=None, loss_on="assistant"
        )


def _examples(n: int, loss_on: str = "assistant") -> list:  # type: ignore[type-arg]
    tok = Tokenizer(None)
    return [
        encode_record(parse_record("messages", r), tokenizer=tok, template=CHATML, loss_on=loss_on)
        for r in messages_records(n)
    ]


def test_verifier_refuses_when_no_token_is_supervised() -> None:
    example = _examples(1)[0]
    empty = type(example)(
        example.input_ids, np.zeros_like(example.supervised), example.roles, example.role_names
    )
    with pytest.raises(InvalidJobError, match="no token is supervised"):
        verify_masks(
            [empty], loss_on="assistant", seq_len=10_000, truncation="drop", max_truncated_share=1
        )


def test_verifier_refuses_assistant_mode_supervising_a_prompt_token() -> None:
    # The masking never produces a leak by construction (containment rule); the verifier is
    # the safety net, so it is given a mask that also covers the system and user turns.
    example = _examples(1)[0]
    leaky = type(example)(
        example.input_ids,
        np.ones_like(example.supervised),
        example.roles,
        example.role_names,
        leaks=int((example.roles != example.role_names.index("assistant")).sum()),
    )
    with pytest.raises(InvalidJobError, match="outside the assistant messages"):
        verify_masks(
            [leaky], loss_on="assistant", seq_len=10_000, truncation="drop", max_truncated_share=1
        )


def test_verifier_refuses_when_too_many_examples_lose_their_answer_to_truncation() -> None:
    examples = _examples(20)
    lengths = sorted(len(e) for e in examples)
    seq_len = lengths[len(lengths) // 2]  # about half the examples are longer
    longer = sum(len(e) > seq_len for e in examples)
    with pytest.raises(InvalidJobError, match=f"{longer} of 20 examples"):
        verify_masks(
            examples, loss_on="assistant", seq_len=seq_len, truncation="drop",
            max_truncated_share=0.25,
        )  # fmt: skip
    stats = verify_masks(
        examples, loss_on="assistant", seq_len=seq_len, truncation="drop", max_truncated_share=0.6
    )
    assert (stats.dropped, stats.lost_all_supervision, stats.truncated) == (longer, longer, 0)


def test_truncate_right_keeps_the_prompt_and_loses_the_answer_truncate_left_keeps_it() -> None:
    example = _examples(1)[0]
    prompt_len = int(np.argmax(example.supervised))  # first supervised token
    right = truncate(example, prompt_len, "truncate_right")
    left = truncate(example, prompt_len, "truncate_left")
    assert right is not None and left is not None
    assert len(right) == len(left) == prompt_len
    assert right.num_targets == 0 and left.num_targets > 0
    assert truncate(example, prompt_len, "drop") is None
    stats = verify_masks(
        [example], loss_on="assistant", seq_len=prompt_len, truncation="truncate_left",
        max_truncated_share=0.0,
    )  # fmt: skip
    assert (stats.truncated, stats.dropped, stats.lost_all_supervision) == (1, 0, 0)


def test_supervised_share_per_role_is_reported() -> None:
    stats = verify_masks(
        _examples(10, "all"), loss_on="all", seq_len=10_000, truncation="drop",
        max_truncated_share=0.0,
    )  # fmt: skip
    shares = stats.report()["supervised_share_by_role"]
    assert set(shares) == {"system", "user", "assistant"}
    assert sum(shares.values()) == pytest.approx(1.0)


def test_the_verifier_modules_import_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys, dataformat.masks; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ignore_index_matches_the_rows_contract() -> None:
    from trainer.data.rows import IGNORE_INDEX as ROWS_IGNORE_INDEX

    assert IGNORE_INDEX == ROWS_IGNORE_INDEX


LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}"
    "{{ m.content | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def test_a_user_jinja_template_with_other_markers_masks_answer_and_end_of_turn() -> None:
    record = parse_record("messages", messages_records(2)[1])
    tok = Tokenizer(None)
    example = encode_record(record, tokenizer=tok, template=LLAMA3_STYLE, loss_on="assistant")
    answer = record.messages[-1].content
    assert answer is not None
    assert _decode(tok, example.input_ids[example.supervised]) == answer.strip() + "<|eot_id|>"
    assert example.leaks == 0


def test_the_tokenizers_own_template_is_used_through_apply_chat_template() -> None:
    from dataformat.chat import resolve_template

    hf = bpe_tokenizer()
    assert resolve_template(None, hf) == hf.chat_template
    assert resolve_template(None, None) == CHATML
    assert resolve_template("chatml", hf) == CHATML
    assert resolve_template(LLAMA3_STYLE, hf) == LLAMA3_STYLE


def test_preview_returns_tokens_with_mask_bits_and_the_verdict() -> None:
    from dataformat.masks import preview

    records = [(f"chat.jsonl:{n}", r) for n, r in enumerate(messages_records(3), start=1)]
    shown = preview(
        records, format="messages", tokenizer=Tokenizer(bpe_tokenizer()), template=CHATML,
        loss_on=None, seq_len=4096, truncation="drop", max_truncated_share=0.1,
    )  # fmt: skip
    assert shown["refused"] is None and shown["loss_on"] == "assistant"
    first = shown["examples"][0]
    assert len(first["tokens"]) == len(first["supervised"]) == len(first["roles"])
    trained = [t for t, s in zip(first["tokens"], first["supervised"], strict=True) if s]
    assert trained[-1] == "<|im_end|>"
    assert {r for r, s in zip(first["roles"], first["supervised"], strict=True) if s} == {
        "assistant"
    }
    refused = preview(
        records, format="messages", tokenizer=Tokenizer(None), template=CHATML, loss_on=None,
        seq_len=16, truncation="truncate_right", max_truncated_share=0.1,
    )  # fmt: skip
    assert refused["refused"].startswith("data sample: 3 of 3 examples")
    assert "lose every supervised token" in refused["refused"]
    assert [e["status"] for e in refused["examples"]] == ["truncated"] * 3
    capped = preview(
        records[:1], format="messages", tokenizer=Tokenizer(None), template=CHATML, loss_on=None,
        seq_len=4096, truncation="drop", max_truncated_share=0.1, max_shown_tokens=5,
    )  # fmt: skip
    (example,) = capped["examples"]
    assert example["tokens"] == list("<|im_") and len(example["roles"]) == 5
    assert example["num_tokens"] > 5 and capped["report"]["tokens"] == example["num_tokens"]


def test_preview_reports_a_record_the_template_cannot_render_as_the_job_would() -> None:
    from dataformat.masks import preview

    records = [("chat.jsonl:1", messages_records(1)[0])]
    shown = preview(
        records, format="messages", tokenizer=Tokenizer(None),
        template="{{ raise_exception('roles must alternate') }}", loss_on=None, seq_len=4096,
        truncation="drop", max_truncated_share=0.1,
    )  # fmt: skip
    assert shown["refused"].startswith("chat.jsonl:1: data.chat_template: cannot render")
    assert shown["examples"] == []


def test_byte_pieces_give_each_character_once_at_its_first_byte() -> None:
    ids = list("aé€".encode())
    assert Tokenizer(None).pieces(ids) == ["a", "é", "", "€", "", ""]
    assert Tokenizer(None).pieces([0x82, 0x61]) == ["\ufffd", "a"]


def test_a_template_that_drops_the_assistant_turn_is_refused_not_crashed() -> None:
    record = parse_record("messages", messages_records(1)[0])
    silent = "{% for m in messages if m.role != 'assistant' %}{{ m.content }}{% endfor %}"
    with pytest.raises(InvalidJobError, match=r"does not render messages\[2\]\.content"):
        encode_record(record, tokenizer=Tokenizer(None), template=silent, loss_on="assistant")
