"""Mask preview: what a job would learn from a dataset, before any job (issue 11).

`preview` reads the first `num_examples` records of a dataset (streamed by
`dataformat.readers`, the job's own reader), tokenizes them with the model's tokenizer (or bytes)
and chat template, and returns each token with its mask bit and role, the per-role supervised
counts, and the mask verifier's verdict: exactly what `dataformat.masks` computes for the job,
whose verifier refuses the same sample with the same reason. `dataformat.masks`, `.readers` and
`.chat` are imported lazily: they pull in `transformers` (seconds to import), never torch.

The tokenizer is loaded with `PreTrainedTokenizerFast.from_pretrained` from a server-side
directory under an allowed data root (`AutoTokenizer` would import torch through the model
configs); the job uses `AutoTokenizer` on the same files, which for a fast tokenizer builds
the same `tokenizer.json` backend.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.platform import storage
from core.platform.errors import Conflict, InvalidInput
from core.platform.settings import Settings
from dataformat.records import LOSS_ON_BY_FORMAT
from jobspec.job import ModelSpec

if TYPE_CHECKING:
    from dataformat.masks import Tokenizer

# Formats a preview renders: one record is one example. `text` and `tokens` have no records
# to render (their masks are all-ones or stored), `preference` makes two examples per record.
PREVIEW_FORMATS = ("messages", "prompt_completion", "jsonl_text")
# == trainer.models.hf._TOKENIZER_FILES (trainer.models.hf imports torch): a model directory
# with none of them trains on bytes.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Tokens listed per example (the counts cover all): 64 examples stay a few MB of JSON even for
# records at the size limit.
MAX_SHOWN_TOKENS = 4096


def preview(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    dataset_id: str,
    model: ModelSpec,
    chat_template: str | None,
    loss_on: str | None,
    seq_len: int | None,
    truncation: str,
    max_truncated_share: float,
    num_examples: int,
) -> dict[str, Any]:
    """Tokens with mask bits and the verifier's verdict for the dataset's first `num_examples`
    records (see `dataformat.masks.preview` for the shape). `seq_len` None: `model.seq_len`.

    Raises NotFound (not the project's dataset), Conflict (a format without renderable
    records, a `loss_on` the format cannot honour), InvalidInput (a chat template that does not
    parse, a model path without a loadable tokenizer; each at its `["body", ...]` path) or
    Forbidden (a model path outside the allowed data roots).
    """
    dataset = datasets.get_or_raise(session=session, dataset_id=dataset_id, project_id=project_id)
    if dataset.format not in PREVIEW_FORMATS:
        raise Conflict(
            f"dataset {dataset_id} is {dataset.format!r}: a preview renders "
            f"{', '.join(PREVIEW_FORMATS)} records",
            details=[{"loc": ["path", "dataset_id"], "msg": "no preview", "type": "conflict"}],
        )
    uri, format = dataset.uri, dataset.format
    session.rollback()  # read-only from here: give the connection back while we tokenize
    _check_loss_on(format, loss_on)
    tokenizer = load_tokenizer(model, settings)
    template = _template(chat_template, tokenizer)

    from dataformat.masks import preview as render
    from dataformat.readers import iter_records, list_files

    def sample() -> Iterator[tuple[str, Any]]:
        files = list_files(uri, ["**/*"], [])
        with closing(iter_records(files)) as records:
            for where, _, obj in itertools.islice(records, num_examples):
                yield where, obj

    context = seq_len or model.seq_len
    shown = render(
        sample(),
        format=format,
        tokenizer=tokenizer,
        template=template,
        loss_on=loss_on,
        seq_len=context,
        truncation=truncation,
        max_truncated_share=max_truncated_share,
        max_shown_tokens=MAX_SHOWN_TOKENS,
    )
    return {
        "dataset_id": dataset_id,
        "format": format,
        "tokenizer": _tokenizer_name(tokenizer),
        "seq_len": context,
        "verdict": "ok" if shown["refused"] is None else "refused",
        **shown,
    }


def _tokenizer_name(tokenizer: Tokenizer) -> str:
    hf = tokenizer.hf
    return "bytes" if hf is None else f"{type(hf).__name__}:{hf.name_or_path}"


def _check_loss_on(format: str, loss_on: str | None) -> None:
    """A `loss_on` this dataset's format cannot honour is a Conflict (409) at `body.loss_on`:
    the request is well formed, and valid for a dataset of another format."""
    allowed = LOSS_ON_BY_FORMAT[format]
    if loss_on is not None and loss_on not in allowed:
        msg = f"loss_on {loss_on!r} does not apply to format {format!r}; choose among {allowed}"
        detail = {"loc": ["body", "loss_on"], "msg": msg, "type": "conflict"}
        raise Conflict(f"loss_on: {msg}", details=[detail])


def load_tokenizer(model: ModelSpec, settings: Settings) -> Tokenizer:
    """The tokenizer a job with `model` would use: bytes for `gpt`, `tokenizer: bytes`,
    `from_config` or a directory without tokenizer files; else the fast tokenizer saved in
    `model.hf.path_or_id` (a server-side path, or a hub id already in the local cache).

    Raises Forbidden/InvalidInput at `["body", "model", "hf", ...]`."""
    from dataformat.errors import InvalidJobError
    from dataformat.masks import Tokenizer

    hf = model.hf
    if model.kind == "hf" and hf is None:
        raise _invalid(["body", "model", "hf"], "model.kind 'hf' needs model.hf")
    if model.kind != "hf" or hf is None or hf.path_or_id is None or hf.tokenizer == "bytes":
        return Tokenizer(None)
    loc = ["body", "model", "hf", "path_or_id"]
    path = storage.model_path(hf.path_or_id, settings)
    if path is not None and not path.exists():
        raise _invalid(loc, f"{hf.path_or_id!r} does not exist on the server")
    if path is not None and (path.is_file() or not _has_tokenizer(path)):
        return Tokenizer(None)
    from transformers import PreTrainedTokenizerFast

    try:
        loaded = PreTrainedTokenizerFast.from_pretrained(
            str(path or hf.path_or_id), revision=hf.revision or "main", local_files_only=True
        )
        return Tokenizer(loaded)
    except InvalidJobError as exc:
        raise _invalid(loc, str(exc)) from None
    except Exception as exc:  # OSError, ValueError, the Rust tokenizers' own Exception types
        where = "the server-side path" if path is not None else "the local cache (no hub access)"
        raise _invalid(loc, f"no fast tokenizer loads from {where}: {exc}") from None


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).exists() for name in TOKENIZER_FILES)


def _template(chat_template: str | None, tokenizer: Tokenizer) -> str:
    """The Jinja source the job would render with; a `chat_template` that does not parse as a
    Jinja chat template (as `transformers` compiles it) is InvalidInput at `body.chat_template`."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from dataformat.chat import resolve_template

    template = resolve_template(chat_template, tokenizer.hf)
    if chat_template not in (None, "chatml"):
        try:
            _compile_jinja_template(template)
        except TemplateError as exc:
            raise _invalid(["body", "chat_template"], f"not a Jinja template: {exc}") from None
    return template


def _invalid(loc: list[str], msg: str) -> InvalidInput:
    return InvalidInput(
        f"{'.'.join(loc[1:])}: {msg}", details=[{"loc": loc, "msg": msg, "type": "value_error"}]
    )
