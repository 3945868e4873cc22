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
  (`rouge-score`), all computed locally;
- `reward`: completions of held-out prompts (a GRPO job's own, or a `prompt` dataset's) scored
  by graders (`jobspec.graders`, a GRPO job's by default): the checkpoint's mean reward, as the
  trainer's `eval_reward` measures it while a GRPO job trains.

Imports nothing heavier than pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from jobspec.base import StrictSpec
from jobspec.graders import AnyGrader, Graders, file_graders
from jobspec.method import GRPOSpec

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
        "out (the job's latest complete checkpoint then, unless `initial`).",
    )
    initial: bool = Field(
        default=False,
        description="Evaluate `job`'s starting weights instead of a checkpoint: its model "
        "as its trainer builds it before the first step (the `model.init_from` checkpoint or "
        "Hugging Face weights, fresh LoRA adapters, which change nothing): the base model's "
        "scores, on the job's own data and template. Needs no checkpoint; reported at step 0.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EvalSourceSpec:
        if self.initial and self.checkpoint is not None:
            raise PydanticCustomError(
                "spec_conflict",
                "`initial` evaluates the starting weights, `checkpoint` a checkpoint: give one",
            )
        return self


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


# Keys of an lm-eval task config that say where its data comes from: an inline task's data is
# a dataset of the project (`dataset`), which the worker maps to a local file.
LM_EVAL_DATA_KEYS: Final = ("dataset_path", "dataset_name", "dataset_kwargs", "custom_dataset")


class LmEvalEval(StrictSpec):
    """Tasks of EleutherAI's lm-evaluation-harness (`lm-eval`), run through its Python API
    (`lm_eval.simple_evaluate`): on its Hugging Face backend (`HFLM`) for a Hugging Face source
    with a tokenizer, else on Torchyard's adapter of the built-in GPT (`trainer.lm_eval_model`).
    Workers reach no hub, so every task's data is local: a task of the server's task
    directories (`TORCHYARD_LM_EVAL_TASK_DIRS`), or an inline task config whose `dataset` is a
    dataset of the project."""

    kind: Literal["lm_eval"] = Field(description="`lm_eval`.")
    name: EvalName | None = Field(default=None, description=NAME_DESCRIPTION)
    tasks: list[str | dict[str, Any]] = Field(
        min_length=1,
        max_length=32,
        description="Task names of the server's task directories, or inline task configs: "
        "lm-eval's YAML keys as an object (`task`, `output_type`, `doc_to_text`, "
        "`doc_to_target`, `doc_to_choice`, `metric_list`, ...) with `dataset`: the id of a "
        "dataset of the project (its records are the task's documents; `test_split` and the "
        "other split keys name `test`). Their `dataset_path` and the like are refused.",
    )
    num_fewshot: int | None = Field(
        default=None, ge=0, le=64, description="Few-shot examples per prompt; null: the task's."
    )
    limit: int | None = Field(
        default=None, ge=1, le=100_000, description="Documents per task at most; null: all."
    )
    batch_size: int = Field(default=8, ge=1, le=1024, description="Requests per forward pass.")
    apply_chat_template: bool = Field(
        default=False, description="Render prompts with the model's chat template (lm-eval's)."
    )

    @field_validator("tasks")
    @classmethod
    def _inline_tasks(cls, tasks: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        """An inline task has `task` and `dataset`, and no key that names other data."""
        for index, task in enumerate(tasks):
            if isinstance(task, str):
                continue
            if not isinstance(task.get("task"), str) or not isinstance(task.get("dataset"), str):
                raise PydanticCustomError(
                    "spec_conflict",
                    "tasks[{index}]: an inline task needs `task` (its name) and `dataset` (a "
                    "dataset of the project)",
                    {"index": index},
                )
            found = [key for key in LM_EVAL_DATA_KEYS if key in task]
            if found:
                raise PydanticCustomError(
                    "spec_conflict",
                    "tasks[{index}].{key}: an inline task reads a dataset of the project "
                    "(`dataset`); workers reach no hub or other path",
                    {"index": index, "key": found[0]},
                )
        return tasks

    def datasets(self) -> list[str]:
        """The project datasets its inline tasks read."""
        return [str(t["dataset"]) for t in self.tasks if isinstance(t, dict)]


# `RewardEval.max_new_tokens` when the source is not a GRPO job (whose own is the default).
REWARD_MAX_NEW_TOKENS: Final = 64
NO_CODE_DIRECTORY: Final = (
    "an eval job reads no code archive of its own (only its GRPO source's "
    "`method.grpo.code`, for the source's graders): give the python grader its `source` inline"
)


class RewardEval(StrictSpec):
    """Completions of held-out prompts, scored by graders: a checkpoint's mean reward, as a GRPO
    job's trainer measures `eval_reward` (greedy by default), with each completion stored."""

    kind: Literal["reward"] = Field(description="`reward`.")
    name: EvalName | None = Field(default=None, description=NAME_DESCRIPTION)
    dataset: DatasetId | None = Field(
        default=None,
        description="Id of a `prompt`, `prompt_completion` or `messages` dataset of the "
        "project: each record's prompt as a GRPO job reads it, the record what graders read "
        "as `item`. null: the source GRPO job's own held-out prompts (its trainer's "
        "evaluation split, in order); required when the source is not a GRPO job.",
    )
    graders: Graders | None = Field(
        default=None,
        description="How a completion is scored, as `method.grpo.graders` (a python grader "
        "with inline `source`: an eval job has no code directory for a `file`); the reward is "
        "their weighted sum. null: the source GRPO job's graders; required when the source is "
        "not a GRPO job.",
    )
    max_prompts: int = Field(
        default=32, ge=1, le=1000, description="Score at most this many prompts (the first)."
    )
    max_new_tokens: int | None = Field(
        default=None,
        ge=1,
        le=2048,
        description="Tokens per completion at most (it ends earlier at the tokenizer's "
        "end-of-sequence token). null: the source GRPO job's `max_new_tokens`, else the smaller "
        "of 64 and half the source's `model.seq_len`. Prompts too long to leave room for it "
        "within the source's `model.seq_len` are left out.",
    )
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature; 0: greedy (the most likely token each step), as "
        "the trainer's `eval_reward`.",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="Sample among the k most likely tokens; null: all."
    )
    top_p: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling: only the most likely tokens whose probability adds up "
        "to `top_p` (Holtzman et al. 2020); 1 keeps all.",
    )
    samples_per_prompt: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Completions sampled per prompt, all scored (the reward is their mean); "
        "more than one needs `temperature` > 0 (greedy completions are all alike).",
    )

    @field_validator("graders")
    @classmethod
    def _graders_run_without_code(cls, graders: list[AnyGrader] | None) -> list[AnyGrader] | None:
        found = file_graders(graders or [])
        if found:
            index, inside, _ = found[0]
            raise PydanticCustomError(
                "grader_file",
                "graders[{index}]{where}.file: {why}",
                {"index": index, "where": _dotted(inside), "why": NO_CODE_DIRECTORY},
            )
        return graders

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> RewardEval:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise PydanticCustomError(
                "spec_conflict",
                "samples_per_prompt {count} with temperature 0: greedy completions are all "
                "alike; set temperature > 0 or samples_per_prompt 1",
                {"count": self.samples_per_prompt},
            )
        return self

    def resolved(self, grpo: GRPOSpec | None, seq_len: int) -> tuple[list[AnyGrader], int]:
        """(graders, max_new_tokens) for a checkpoint of a source job whose `method.grpo` is
        `grpo` (None: not a GRPO job) and whose `model.seq_len` is `seq_len`: these, or the
        source's. Raises `ValueError` when `source_errors` has any."""
        errors = self.source_errors(grpo, seq_len)
        if errors:
            raise ValueError("; ".join(f"{'.'.join(loc)}: {msg}" for loc, msg in errors))
        graders = self.graders if self.graders is not None else grpo.graders if grpo else []
        return list(graders), self._max_new_tokens(grpo, seq_len)

    def _max_new_tokens(self, grpo: GRPOSpec | None, seq_len: int) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if grpo is not None:
            return grpo.max_new_tokens
        return min(REWARD_MAX_NEW_TOKENS, seq_len // 2)  # a default always leaves room

    def source_errors(
        self, grpo: GRPOSpec | None, seq_len: int
    ) -> list[tuple[tuple[str, ...], str]]:
        """What this evaluation cannot do with a checkpoint of a source job (its `method.grpo`,
        None when it is not a GRPO job, and its `model.seq_len`), each at its field: no
        prompts or graders of its own for a source that is not a GRPO job, a python grader's
        `file` among the source's graders when the source has no `method.grpo.code` (with
        one, the eval job reads that archive as the source did), completions that leave no
        room for a prompt."""
        errors: list[tuple[tuple[str, ...], str]] = []
        if grpo is None:
            if self.dataset is None:
                why = "required: the source job is not a GRPO job (it has no held-out prompts)"
                errors.append((("dataset",), f"{why}; give a prompt dataset of the project"))
            if self.graders is None:
                why = "required: the source job is not a GRPO job (it has no graders)"
                errors.append((("graders",), f"{why}; give the graders that score a completion"))
        elif self.graders is None and grpo.code is None:
            for index, inside, _ in file_graders(grpo.graders):
                why = f"the source job's graders[{index}]{_dotted(inside)} reads a `file`"
                errors.append((("graders",), f"{why}; {NO_CODE_DIRECTORY} (give `graders`)"))
        tokens = self._max_new_tokens(grpo, seq_len)
        if tokens >= seq_len:
            why = f"{tokens} tokens per completion leave no room for a prompt within the source's"
            errors.append((("max_new_tokens",), f"{why} model.seq_len {seq_len}"))
        return errors


def _dotted(inside: tuple[str, ...]) -> str:
    """`('graders', 'a')` as `.graders.a`: where a grader lies inside a `multi` grader."""
    return "".join(f".{part}" for part in inside)


AnyEvaluation = PerplexityEval | GenerateEval | LmEvalEval | RewardEval
Evaluation = Annotated[AnyEvaluation, Field(discriminator="kind")]


class EvaluateSpec(StrictSpec):
    """What an eval job evaluates, and the evaluations it runs, in order."""

    source: EvalSourceSpec = Field(description="The checkpoint to evaluate.")
    evaluations: list[Evaluation] = Field(
        min_length=1, max_length=16, description="Evaluations to run, in order."
    )

    @model_validator(mode="after")
    def _names(self) -> EvaluateSpec:
        _name_each(self.evaluations)
        return self

    def names(self) -> list[str]:
        return [e.name or e.kind for e in self.evaluations]


def _name_each(evaluations: list[AnyEvaluation]) -> None:
    """Every evaluation gets a name (its kind by default). Raises `PydanticCustomError`
    (`spec_conflict`) when two share one."""
    seen: set[str] = set()
    for index, evaluation in enumerate(evaluations):
        if evaluation.name is None:
            evaluation.name = evaluation.kind
        if evaluation.name in seen:
            raise PydanticCustomError(
                "spec_conflict",
                "evaluations[{index}].name: {name} names two evaluations; give each a "
                "distinct `name`",
                {"index": index, "name": repr(evaluation.name)},
            )
        seen.add(evaluation.name)


class EvalAfterSpec(StrictSpec):
    """Evaluations a training job's checkpoints get automatically (`JobSpec.eval_after`): each
    becomes an eval job of the project (labels `eval_of=<job>`, `eval_at=<step>|initial`), queued
    on the training job's pool when the checkpoint it scores exists; results show on the
    training job (`GET /v1/jobs/{id}/evals`). A bare list is read as `evaluations`, a bare
    string as `{kind: <string>}`."""

    evaluations: list[Evaluation] = Field(
        min_length=1, max_length=16, description="Evaluations to run on each, in order."
    )
    every_checkpoints: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Also evaluate every k-th periodic checkpoint while training (steps that "
        "are multiples of k x `checkpoint.interval_steps`); null: only the final one. A "
        "checkpoint that retention (`checkpoint.keep_last`) deletes before its eval job runs "
        "fails that eval job.",
    )
    baseline: bool = Field(
        default=True,
        description="Also evaluate the starting weights once (`evaluate.source.initial`), so "
        "the base model's scores stand beside the trained ones.",
    )
    procs_per_node: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes of each eval job (perplexity shares "
        "its rows between them; generation runs on rank 0).",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, list):
            data = {"evaluations": data}
        if isinstance(data, dict) and isinstance(data.get("evaluations"), list):
            given = data["evaluations"]
            data = {
                **data,
                "evaluations": [{"kind": e} if isinstance(e, str) else e for e in given],
            }
        return data

    @model_validator(mode="after")
    def _names(self) -> EvalAfterSpec:
        _name_each(self.evaluations)
        return self
