"""Chat templates: render a conversation, and find in the rendered text what the loss sees.

A conversation is rendered with its chat template exactly as `transformers` renders it
(`tokenizer.apply_chat_template(..., tokenize=False)`, or `render_jinja_template` for the
byte-level GPT, which has no tokenizer object). The loss mask is then taken from the rendered
text itself, not from `{% generation %}` markers (which most templates lack): message k's span
is the difference between the renderings of `messages[:k]` and `messages[:k + 1]`, and an
assistant message's supervised region runs from the end of the generation prompt
(`messages[:k]` rendered with `add_generation_prompt=True`, e.g. `<|im_start|>assistant\\n`) to
the end of its span without trailing whitespace, so it covers the content and the
end-of-turn token (`<|im_end|>`) but not the role header. A template for which a rendered
prefix is not a prefix of the whole rendering ("breaks offsets") is refused: the mask could
not be located.

Torch-free (jinja2 through `transformers.utils.chat_template_utils`), so the API's preview can
use it too.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dataformat.errors import InvalidJobError
from dataformat.records import Message

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# ChatML (as OpenAI and Qwen use it): `<|im_start|>{role}\n{content}<|im_end|>\n` per message;
# tools as JSON in a leading system turn; assistant tool calls as `<tool_call>{json}</tool_call>`.
CHATML = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' + (tools | tojson) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content %}{{ message.content }}{% endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{{ '<tool_call>' + (call | tojson) + '</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")


def resolve_template(chat_template: str | None, tokenizer: PreTrainedTokenizerBase | None) -> str:
    """The Jinja source to render with: `data.chat_template` (`chatml` = `CHATML`, other
    values are Jinja), else the tokenizer's own `chat_template`, else `CHATML`."""
    if chat_template == "chatml":
        return CHATML
    if chat_template is not None:
        return chat_template
    own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return own if isinstance(own, str) and own else CHATML


def message_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as the dicts templates read (`weight` is ours, not the template's)."""
    return [m.model_dump(exclude_none=True, exclude={"weight"}) for m in messages]


def render(
    messages: list[dict[str, Any]],
    *,
    template: str,
    tokenizer: PreTrainedTokenizerBase | None,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """`messages` rendered with `template` (tokenizer's special tokens in scope, as in
    `apply_chat_template`). Raises `InvalidJobError` when the template fails (syntax, or its
    own `raise_exception`, e.g. "roles must alternate")."""
    from jinja2 import TemplateError

    schemas: list[Any] | None = list(tools) if tools is not None else None
    try:
        if tokenizer is not None:
            text: Any = tokenizer.apply_chat_template(
                messages,
                chat_template=template,
                tools=schemas,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        else:
            from transformers.utils.chat_template_utils import render_jinja_template

            result: Any = render_jinja_template(  # (rendered chats, generation indices)
                conversations=[messages],
                tools=schemas,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
            )
            text = result[0][0]
    except (TemplateError, ValueError, TypeError) as exc:
        raise InvalidJobError(f"data.chat_template: cannot render a conversation: {exc}") from exc
    return str(text)


@dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation and where its parts are, in characters of `text`.

    `spans[k]`: message k's [start, end) (the spans tile the text); `supervised`: sorted,
    disjoint [start, end) regions the loss sees; `allowed`: where `assistant` mode may
    supervise at all (the whole span of each trained assistant message), for the verifier.
    """

    text: str
    spans: list[tuple[int, int]]
    roles: list[str]
    supervised: list[tuple[int, int]]
    allowed: list[tuple[int, int]]


def render_chat(
    messages: Sequence[Message],
    *,
    template: str,
    tokenizer: PreTrainedTokenizerBase | None,
    tools: list[dict[str, Any]] | None,
    loss_on: str,
    num_prompt: int = 0,
) -> RenderedChat:
    """Render `messages` and locate the supervised text for `loss_on`: `assistant` (each
    assistant message without weight 0), `completion` (everything after the first
    `num_prompt` messages), `all`.

    Raises `InvalidJobError` when the template fails or breaks offsets (a rendered prefix is
    not a prefix of the whole), or drops a trained message's content.
    """
    dicts = message_dicts(messages)

    def draw(count: int, generation: bool = False) -> str:
        if count == 0 and not generation:
            return ""
        return render(
            dicts[:count],
            template=template,
            tokenizer=tokenizer,
            tools=tools,
            add_generation_prompt=generation,
        )

    def content_of(k: int) -> str | None:
        return messages[k].content if k < len(messages) else None

    text = draw(len(dicts))
    bounds = [0]
    for k in range(1, len(dicts)):
        prefix = draw(k)
        if not text.startswith(prefix) or len(prefix) < bounds[-1]:
            raise InvalidJobError(
                f"data.chat_template breaks offsets: messages[:{k}] does not render as a "
                "prefix of the whole conversation, so the loss mask cannot be located; "
                "use a prefix-stable template (e.g. chat_template: chatml)"
            )
        bounds.append(len(prefix))
    bounds.append(len(text))
    spans = list(itertools.pairwise(bounds))
    if loss_on == "all":
        regions = [(0, len(text))]
    elif loss_on == "completion":
        start = _answer_start(draw, num_prompt, spans, text, content_of)
        regions = [(start, len(text.rstrip()))]
    else:
        trained = [k for k, m in enumerate(messages) if m.trained]
        regions = [
            (_answer_start(draw, k, spans, text, content_of), _trim(text, spans[k]))
            for k in trained
        ]
    for k, m in enumerate(messages):
        if m.content and (loss_on == "assistant" and m.trained):
            region = next((r for r in regions if spans[k][0] <= r[0] < spans[k][1]), None)
            if region is None or m.content.strip() not in text[region[0] : region[1]]:
                raise InvalidJobError(
                    f"data.chat_template does not render messages[{k}].content verbatim "
                    "inside its turn; the loss mask cannot be located"
                )
    allowed = [spans[k] for k, m in enumerate(messages) if m.trained]
    return RenderedChat(
        text=text,
        spans=spans,
        roles=[m.role for m in messages],
        supervised=[r for r in regions if r[1] > r[0]],
        allowed=allowed,
    )


def _answer_start(
    draw: Any, k: int, spans: list[tuple[int, int]], text: str, content_of: Any
) -> int:
    """Where message k's answer starts: after its generation prompt (role header) when the
    template renders one as a prefix, else where its content starts (else its span's start)."""
    start, end = spans[k]
    header = draw(k, True)
    if text.startswith(header) and start <= len(header) <= end:
        return len(header)
    content = (content_of(k) or "").strip()
    found = text.find(content, start, end) if content else -1
    return found if found >= 0 else start


def _trim(text: str, span: tuple[int, int]) -> int:
    """The end of `span` without trailing whitespace (the newline after `<|im_end|>`)."""
    start, end = span
    return start + len(text[start:end].rstrip())
