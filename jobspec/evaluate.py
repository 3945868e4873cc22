"""The `evaluate` section of an eval job (`jobspec.job.EvalJobSpec`): what to evaluate (a
checkpoint of an earlier built-in-trainer job) and how (a list of evaluations).

An eval job is queued, placed, retried and billed like any job; its program is
`trainer.evaluate`, which rebuilds the source job's model from the spec saved with the
checkpoint (a LoRA checkpoint with its adapters, not merged) and runs each evaluation:

- `perplexity`: the mean next-token loss (nats per supervised token) and its exponential on a
  dataset of the project, tokenized, templated and masked exactly as the source job's trainer
  does (`trainer.data.prep`); with no `dataset`, the source's own evaluation split, scored over
  the same rows its trainer's `eval_loss` used: the two numbers are equal by construction;
- `generate`: the prompts of a `messages` or `prompt_completion` dataset (everything before the
  last supervised span, rendered with the source's chat template), answered by the model, and
  scored against the references (that span): exact match, chrF (`sacrebleu`) and ROUGE-L
  (`rouge-score`), all computed locally.

Imports nothing heavier than pydantic.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from jobspec.base import StrictSpec

EVAL_NAME: Final = r"^[A-Za-z][A-Za-z0-9_-]{0,39}$"
EvalName = Annotated[str, Field(pattern=EVAL_NAME)]
NAME_DESCRIPTION: Final = (
    "Names the evaluation's results and metrics (`<name>.<metric>`): a letter, then letters, "
    "digits, '_' or '-' (at most 40). Default: its `kind`."
)
DatasetId = Annotated[str, Field(min_length=1, max_length=100)]


class EvalSourceSpec(StrictSpec):
    """The checkpoint to evaluate: `job` (its latest complete checkpoint, pinned when the eval
    job is submitted) or `checkpoint` (an id from `GET /v1/jobs/{id}/checkpoints`) of it."""

    job: int = Field(ge=1, description="Id of a built-in-trainer job of the same project.")
    checkpoint: int | None = Field(
        default=None,
        ge=1,
        description="Id of a complete checkpoint of `job`; filled in at submission when left "
        "out (the job's latest complete checkpoint then).",
    )


class PerplexityEval(StrictSpec):
    """Mean token loss and perplexity on a dataset, as the source's trainer computes its eval
    loss (same tokenizer, template, `loss_on` mask, packing and sequence length)."""

    kind: Literal["perplexity"] = Field(description="`perplexity`.")
    name: EvalName | None = Field(default=None, description=NAME_DESCRIPTION)
    dataset: DatasetId | None = Field(
        default=None,
        description="Id of a dataset of the project (every record is scored, up to "
        "`max_rows` rows). null: the source job's own evaluation split, scored over the rows "
        "its trainer's `eval_loss` used, so the two are equal.",
    )
    max_rows: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Score at most this many rows (sequences of `model.seq_len`). null: all of "
        "`dataset`'s, or exactly the trainer's eval rows for the source's own split.",
    )


class GenerateEval(StrictSpec):
    """Answers to a dataset's prompts, stored with their references and scored against them."""

    kind: Literal["generate"] = Field(description="`generate`.")
    name: EvalName | None = Field(default=None, description=NAME_DESCRIPTION)
    dataset: DatasetId = Field(
        description="Id of a `messages` or `prompt_completion` dataset of the project: "
        "each record's prompt is everything before its last supervised span (the last "
        "assistant turn, or the completion), its reference that span."
    )
    max_prompts: int = Field(
        default=32, ge=1, le=1000, description="Answer at most this many records (the first)."
    )
    max_new_tokens: int = Field(
        default=64, ge=1, le=2048, description="Tokens generated per answer at most."
    )
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature; 0: greedy (the most likely token each step).",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="Sample among the k most likely tokens; null: all."
    )
    stop_at_eos: bool = Field(
        default=True,
        description="End an answer at the tokenizer's end-of-sequence token (bytes: never).",
    )


Evaluation = Annotated[PerplexityEval | GenerateEval, Field(discriminator="kind")]


class EvaluateSpec(StrictSpec):
    """What an eval job evaluates, and the evaluations it runs, in order."""

    source: EvalSourceSpec = Field(description="The checkpoint to evaluate.")
    evaluations: list[Evaluation] = Field(
        min_length=1, max_length=16, description="Evaluations to run, in order."
    )

    @model_validator(mode="after")
    def _names(self) -> EvaluateSpec:
        """Every evaluation gets a name (its kind by default); names are unique."""
        seen: set[str] = set()
        for index, evaluation in enumerate(self.evaluations):
            if evaluation.name is None:
                evaluation.name = evaluation.kind
            if evaluation.name in seen:
                raise PydanticCustomError(
                    "spec_conflict",
                    "evaluations[{index}].name: {name!r} names two evaluations; give each a "
                    "distinct `name`",
                    {"index": index, "name": evaluation.name},
                )
            seen.add(evaluation.name)
        return self

    def names(self) -> list[str]:
        return [e.name or e.kind for e in self.evaluations]
