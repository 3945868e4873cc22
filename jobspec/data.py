"""The job spec's data section (`JobSpec.data`): which data, and how it becomes token rows.
Pure pydantic (the API imports it through `jobspec.job`)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from dataformat.records import Format
from jobspec.base import StrictSpec, given


class DataSpec(StrictSpec):
    """Training data and how it becomes token rows. Exactly one of `dataset` or `uri`; at
    most one of `eval_dataset` or `eval_uri`."""

    # The same rules in the JSON Schema, so clients and fuzzers see them (JSON Schema 2020-12).
    model_config = ConfigDict(
        **StrictSpec.model_config,
        json_schema_extra={
            "oneOf": [given("dataset"), given("uri")],
            "not": given("eval_dataset", "eval_uri"),
        },
    )

    dataset: str | None = Field(
        default=None,
        description="Id (`ds_...`) or name of a dataset registered through `/v1/datasets` in "
        "the job's project; a name is replaced by the id it names at submission.",
    )
    uri: str | None = Field(
        default=None,
        description="A file or directory (local path or fsspec URI) readable by the workers. "
        "Only for trusted deployments; prefer `dataset`.",
    )
    include: list[str] = Field(
        default=["**/*"],
        min_length=1,
        description="Glob patterns selecting files when the data is a directory.",
    )
    exclude: list[str] = Field(
        default=["site-packages/*", "dist-packages/*", "*__pycache__/*", ".git/*"],
        description="`fnmatch` patterns of files to skip, matched against the path relative "
        "to the data directory (`*` also matches `/`).",
    )
    max_bytes: int | None = Field(
        default=None, ge=1024, description="Read at most this many bytes of the corpus."
    )
    eval_fraction: float = Field(
        default=0.05,
        gt=0.0,
        lt=0.5,
        description="Share of the corpus held out for evaluation when `eval_dataset` is not "
        "given: for record formats, whole examples chosen by a hash of their content (so a "
        "duplicate never lands on both sides); for `text`, whole files of a directory or the "
        "last bytes of a single file.",
    )
    format: Format | None = Field(
        default=None,
        description="Record format (`text`, `jsonl_text`, `messages`, `prompt_completion`, "
        "`preference`, `tokens`, `prompt`; see `dataformat.records`). null: the registered "
        "dataset's format "
        "(filled in at submission), or for a `uri` detected from the file extension and the "
        "first record.",
    )
    token_dtype: Literal["uint16", "uint32"] | None = Field(
        default=None,
        description="Integer type of a flat `.bin` token file (`tokens` format; `.npy` files "
        "carry their own). null: the registered dataset's, else `uint16` (nanoGPT's).",
    )
    loss_on: Literal["assistant", "completion", "all"] | None = Field(
        default=None,
        description="Which tokens are supervised. `assistant`: the content and end-of-turn "
        "token of each assistant message (weight 0 excluded); `completion`: the completion "
        "of a `prompt_completion` record (and its end-of-turn / EOS); `all`: every token. "
        "null: `assistant` for `messages`, `completion` for `prompt_completion` and "
        "`preference`, `all` for `text`, `jsonl_text` and `tokens` (whose own `labels` / "
        "`loss_mask`, when present, decide).",
    )
    chat_template: str | None = Field(
        default=None,
        max_length=65536,
        description="How conversations are rendered to text. null: the tokenizer's own "
        "template (`tokenizer.chat_template`), else the built-in ChatML; `chatml`: the "
        "built-in ChatML (`<|im_start|>role\\n...<|im_end|>`); any other value: a Jinja "
        "template rendered as `transformers` renders chat templates.",
    )
    truncation: Literal["drop", "truncate_left", "truncate_right"] = Field(
        default="drop",
        description="An example longer than `model.seq_len` tokens: `drop` it (default: no "
        "answer is ever trained without its whole prompt, nor cut before its end-of-turn), "
        "`truncate_left` (keep its last seq_len tokens) or `truncate_right` (keep its first "
        "seq_len tokens). Counts are reported in the `data` event.",
    )
    max_truncated_share: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Refuse the job (a data error) when more than this share of the examples "
        "lose every supervised token to `truncation` (dropped, or cut down to prompt only).",
    )
    packing: bool = Field(
        default=False,
        description="Pack several whole examples into each sequence of `model.seq_len` "
        "positions (positions restart per example, attention confined to it); false: one "
        "example per sequence, padded.",
    )
    eval_dataset: str | None = Field(
        default=None,
        description="Id or name of a registered dataset (same project and format) used for "
        "evaluation instead of a held-out share of `dataset`; a name is pinned to its id.",
    )
    eval_uri: str | None = Field(
        default=None,
        description="A file or directory used for evaluation (with `uri`, like `uri`) instead "
        "of a held-out share.",
    )
