"""A `POST /openai/v1/fine_tuning/jobs` body as a Torchyard JobSpec (LoRA SFT, DPO or GRPO over a
registered base model), with OpenAI's `"auto"` hyperparameters resolved.

OpenAI's `method.type: reinforcement` (reinforcement fine-tuning) is Torchyard's `method.kind:
grpo` (`jobspec.method.GRPOSpec`): its one grader is the job's only grader, validated as
`jobspec.graders.Grader` validates one (so `score_model` and `label_model` are refused with
their reason) plus OpenAI's `image_tag` of a python grader, accepted and dropped; its
hyperparameters map as `ReinforcementHyperparameters` says field by field."""

from __future__ import annotations

import math
import re
import secrets
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.openai.graders import OpenAIGrader, without_image_tags
from core.openai.projection import (
    BASE_LABEL,
    COMPUTE_LABEL,
    FULL_VALID,
    LR_LABEL,
    META_PREFIX,
    MODEL_LABEL,
    SUFFIX_LABEL,
    base_model,
    fine_tuned,
)
from core.platform.errors import InvalidInput
from core.platform.settings import BaseModelEntry, Settings
from jobspec.job import JobSpec
from jobspec.method_checks import method_data_error

Auto = Literal["auto"]
_ID = Annotated[str, Field(min_length=1, max_length=100)]


def _one_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A number-or-`"auto"` field's value, refused with one error at the field itself: the
    union's own errors name each member (`n_epochs.constrained-int`, `n_epochs.literal['auto']`),
    and OpenAI's `param` must be the field's path."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if e["type"] != "literal_error"] or exc.errors()
        raise PydanticCustomError(
            errors[0]["type"], '{msg}, or "auto"', {"msg": errors[0]["msg"]}
        ) from None


_N = TypeVar("_N", int, float)
AutoOr = Annotated[_N | Auto | None, WrapValidator(_one_error)]
"""A number (bounded as given), `"auto"` or null."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class _Passes(_Open):
    """The hyperparameters every method has besides its batch size."""

    n_epochs: AutoOr[Annotated[int, Field(ge=1, le=50)]] = None
    """Passes over the training file (OpenAI's meaning); the job's `train.epochs`. `"auto"`:
    the base model's registered `n_epochs`."""
    learning_rate_multiplier: AutoOr[Annotated[float, Field(gt=0, le=100)]] = None
    """Scales the base model's registered `learning_rate` (OpenAI's meaning); the job's peak
    `optim.lr` is their product. `"auto"`: 1.0."""


class Hyperparameters(_Passes):
    """OpenAI's hyperparameters of `supervised` and `dpo`; each `"auto"` (or absent) takes the
    base model's default."""

    batch_size: AutoOr[Annotated[int, Field(ge=1, le=256)]] = None
    """Examples per batch (OpenAI's meaning); the job's `train.micro_batch_size` (sequences per
    process per forward/backward), so an optimizer step sees this times the data-parallel
    processes and `train.grad_accum_steps` of the base model's registered job settings.
    `"auto"`: the base model's registered `batch_size`."""
    beta: AutoOr[Annotated[float, Field(gt=0, le=100)]] = None
    """DPO's beta, the weight of the penalty for drifting from the reference (base) model;
    the job's `method.dpo.beta`. Read for method `dpo` only, ignored for `supervised`.
    `"auto"`: 0.1."""


GROUP_SIZE_PER_COMPUTE: Final = 8  # completions per prompt at compute_multiplier 1.0
GROUP_SIZE_RANGE: Final = (2, 64)  # GRPOSpec.group_size's bounds


def group_size(compute_multiplier: float) -> int:
    """GRPO's `group_size` (completions per prompt) for OpenAI's `compute_multiplier`:
    8 x the multiplier rounded half up, clamped to [2, 64]."""
    low, high = GROUP_SIZE_RANGE
    return min(high, max(low, math.floor(GROUP_SIZE_PER_COMPUTE * compute_multiplier + 0.5)))


REASONING_EFFORTS: Final = ("low", "medium", "high")  # OpenAI's, besides "default"


def _no_reasoning(value: Any) -> Any:
    """Refuses OpenAI's reasoning efforts by name, with the reason (the schema offers only
    `"default"`, which the Literal then checks)."""
    if isinstance(value, str) and value in REASONING_EFFORTS:
        raise PydanticCustomError(
            "not_supported",
            'not supported: the base models do not reason (only "default" is accepted)',
        )
    return value


class ReinforcementHyperparameters(_Passes):
    """OpenAI's hyperparameters of `reinforcement` (GRPO); each `"auto"` (or absent) takes the
    base model's default or the job spec's."""

    batch_size: AutoOr[Annotated[int, Field(ge=1, le=256)]] = None
    """Prompts per batch; the job's `train.micro_batch_size` (prompts per process per step),
    each sampled `group_size` times (`compute_multiplier`), so an optimizer step samples this
    times the data-parallel processes times `train.grad_accum_steps` prompts. `"auto"`: the
    base model's registered `batch_size`."""
    compute_multiplier: AutoOr[Annotated[float, Field(gt=0, le=100)]] = None
    """How much sampling a step does; the job's `method.grpo.group_size` (completions per
    prompt) = 8 x `compute_multiplier`, rounded half up and clamped to [2, 64] (so 0.25 gives
    2, 2 gives 16, 8 or more gives 64). `"auto"`: 1.0 (8 completions per prompt)."""
    eval_interval: AutoOr[Annotated[int, Field(ge=1, le=1_000_000)]] = None
    """Training steps between evaluations of the held-out prompts (`validation_file`, else a
    share of the training file); the job's `eval.interval_steps`. `"auto"`: the base model's
    registered job settings (`eval.interval_steps`, else 100)."""
    eval_samples: AutoOr[Annotated[int, Field(ge=1, le=100_000)]] = None
    """Held-out prompts each evaluation completes (one greedy completion each, graded: the
    result file's `valid_reward_mean`); the job's `eval.num_batches` = ceil(eval_samples /
    batch_size), so an evaluation reads the first num_batches x batch_size prompts per
    data-parallel process (at most the whole held-out set). `"auto"`: the base model's
    registered job settings (`eval.num_batches`, else 8)."""
    reasoning_effort: Annotated[Literal["default"] | None, BeforeValidator(_no_reasoning)] = None
    """OpenAI's reasoning effort of reasoning models: only `"default"` (or absent); the base
    models do not reason, so OpenAI's `low`, `medium` and `high` are refused, saying so."""


class _Wrapped(_Open):
    """A method's settings."""

    hyperparameters: Hyperparameters | None = None
    """The method's hyperparameters; when given, they are used instead of the top-level
    (deprecated) `hyperparameters`."""


class Reinforcement(_Open):
    """Settings for `type: reinforcement`: Torchyard's GRPO (`method.kind: grpo`, see
    docs/reinforcement.md) with one grader."""

    grader: OpenAIGrader
    """How a sampled completion is scored: one grader (`string_check`, `text_similarity`,
    `python`, or `multi` over several), the job's `method.grpo.graders` (a list of it). OpenAI's
    shapes and Torchyard's checks (`jobspec.graders`): `score_model` and `label_model` are
    refused (no grader model is registered), as are `text_similarity`'s `meteor` and `cosine`.
    A python grader's `image_tag` (OpenAI's runtime image) is accepted and ignored: the grader
    runs with the worker's Python in the job's sandbox."""
    hyperparameters: ReinforcementHyperparameters | None = None
    """The method's hyperparameters (the top-level `hyperparameters` are refused with this
    method)."""


class Method(_Open):
    """The fine-tuning method and its hyperparameters."""

    type: Literal["supervised", "dpo", "reinforcement"]
    """`supervised`: supervised fine-tuning on a `messages` or `prompt_completion` file
    (Torchyard's method `sft`); `dpo`: Direct Preference Optimization on a `preference`
    file (method `dpo`); `reinforcement`: reinforcement fine-tuning by GRPO (method `grpo`) on
    a `prompt` file (OpenAI's RFT JSONL: `messages` ending in a user turn, and the fields the
    grader reads), or the prompts of `messages` / `prompt_completion` records. All train LoRA
    adapters on the base model."""
    supervised: _Wrapped | None = None
    """Settings for `type: supervised`; read only for that type."""
    dpo: _Wrapped | None = None
    """Settings for `type: dpo`; read only for that type."""
    reinforcement: Reinforcement | None = None
    """Settings for `type: reinforcement`, required with it (its `grader` has no default);
    read only for that type."""


class FineTuneCreate(_Open):
    """The body of `POST /openai/v1/fine_tuning/jobs` (OpenAI's fields; `integrations` are
    accepted and ignored)."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    """The model to fine-tune: the name of a base model this deployment registers
    (`TORCHYARD_BASE_MODELS`, listed by `GET /openai/v1/models`), which supplies the weights,
    LoRA settings, sequence length, resources, pool and defaults; or a model this project
    fine-tuned (`ft:<base>:<project>:<suffix>:<job id>`, a succeeded job's
    `fine_tuned_model`), whose final checkpoint the job starts from (`model.init_from`) with
    its base model's settings, as OpenAI continues a fine-tune (e.g. reinforcement after
    supervised). 400 for any other name."""
    training_file: _ID
    """The id of a file of this project uploaded with purpose `fine-tune`: records of format
    `messages` or `prompt_completion` for `supervised`, `preference` for `dpo`, `prompt` (or
    `messages`, `prompt_completion`, whose prompts are read) for `reinforcement`. The job's
    `data.dataset`."""
    validation_file: _ID | None = None
    """The id of a file like `training_file`, evaluated during training (`valid_loss` in the
    result file; `valid_reward_mean` for `reinforcement`); the job's `data.eval_dataset`.
    Null: the job holds out a share of the training file instead (`data.eval_fraction`). For
    `supervised`, the final checkpoint is also scored on all of the validation file by an eval
    job (`eval_after`, evaluation `full_valid`): its checkpoint's `metrics.full_valid_loss`."""
    suffix: (
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None
    ) = None
    """Up to 64 letters, digits, `.`, `_` or `-`, part of the fine-tuned model's name
    (`ft:<base>:<project>:<suffix>:<job id>`) and of the job's name."""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    """The job's `seed` (data order, initialisation), for a reproducible run; null: a random
    seed, shown on the job."""
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=16),
        ]
        | None
    ) = None
    """Up to 16 key-value pairs (keys up to 64 characters, values up to 512), stored on the
    job as labels (`openai.meta.<key>`), returned with it and matched by
    `GET /openai/v1/fine_tuning/jobs?metadata[<key>]=<value>`."""
    method: Method | None = None
    """The fine-tuning method and its hyperparameters; null: `supervised`."""
    hyperparameters: Hyperparameters | None = None
    """Hyperparameters for `supervised` or `dpo` (deprecated by OpenAI in favour of
    `method.<type>.hyperparameters`, which take precedence when given); refused with
    `reinforcement`, whose hyperparameters differ."""
    integrations: list[Any] | None = None
    """OpenAI's third-party integrations (such as Weights & Biases): accepted and ignored;
    follow a job's metrics with `GET /v1/jobs/{job_id}/metrics` instead."""


def build(
    *, session: Session, settings: Settings, project_id: str, body: FineTuneCreate
) -> tuple[JobSpec, dict[str, Any]]:
    """(the JobSpec, the resolved hyperparameters) for `body`. Raises InvalidInput naming the
    OpenAI field (`model`, `training_file`, `validation_file`, `method.reinforcement`,
    `hyperparameters`)."""
    parent = fine_tuned(session, project_id, body.model)
    base = (parent.labels or {})[BASE_LABEL] if parent is not None else body.model
    entry = base_model(settings, base)
    kind = body.method.type if body.method is not None else "supervised"
    _check_file(session, project_id, body.training_file, "training_file", kind)
    if body.validation_file is not None:
        _check_file(session, project_id, body.validation_file, "validation_file", kind)
    hyper = _resolve(entry, _given(body, kind), kind)
    labels = {BASE_LABEL: base, LR_LABEL: repr(hyper["learning_rate_multiplier"])}
    if kind == "reinforcement":
        labels[COMPUTE_LABEL] = repr(hyper["compute_multiplier"])
    if parent is not None:
        labels[MODEL_LABEL] = body.model
    if body.suffix:
        labels[SUFFIX_LABEL] = body.suffix
    labels.update({META_PREFIX + k: v for k, v in (body.metadata or {}).items()})
    ours: dict[str, Any] = {
        "name": _name(base, body.suffix),
        "labels": labels,
        "seed": body.seed if body.seed is not None else secrets.randbelow(2**31),
        "model": {"kind": "hf", "hf": {"path_or_id": entry.path}, "seq_len": entry.seq_len},
        "lora": entry.lora,
        "method": _method(body, entry, hyper, kind),
        "data": {"dataset": body.training_file, "eval_dataset": body.validation_file},
        "optim": {"lr": entry.learning_rate * hyper["learning_rate_multiplier"]},
        "train": {"micro_batch_size": hyper["batch_size"], "epochs": hyper["n_epochs"]},
        "resources": {**entry.resources, "pool": entry.pool},
    }
    if parent is not None:  # its final checkpoint (adapters merged into the base weights)
        ours["model"]["init_from"] = {"job": parent.id}
    if kind == "reinforcement":
        ours["eval"] = _eval(hyper)
    if body.validation_file is not None and kind == "supervised":
        # OpenAI's `full_valid_loss` of the final checkpoint: its loss on the whole validation
        # file (the trainer's `eval_loss` reads `eval.num_batches` batches of it)
        ours["eval_after"] = {
            "evaluations": [
                {"kind": "perplexity", "name": FULL_VALID, "dataset": body.validation_file}
            ],
            "baseline": False,
        }
    merged = _merge(entry.spec, ours)
    try:
        return JobSpec.model_validate(merged), hyper
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidInput(
            f"the job for base model {body.model!r} is not valid: {where}: {err['msg']}",
            details=[{"loc": ["body", "model"], "msg": err["msg"], "type": err["type"]}],
        ) from None


def _method(
    body: FineTuneCreate, entry: BaseModelEntry, hyper: dict[str, Any], kind: str
) -> dict[str, Any]:
    """The job's `method` section."""
    if kind == "dpo":
        return {"kind": "dpo", "dpo": {"beta": hyper["beta"]}}
    if kind == "supervised":
        return {"kind": "sft"}
    assert body.method is not None and body.method.reinforcement is not None  # by _given
    given = body.method.reinforcement.grader.model_dump(mode="json", exclude_unset=True)
    grader = without_image_tags(given)
    grpo = {
        **entry.grpo,
        "graders": [grader],
        "group_size": group_size(hyper["compute_multiplier"]),
    }
    return {"kind": "grpo", "grpo": grpo}


def _eval(hyper: dict[str, Any]) -> dict[str, Any]:
    """The `eval` settings a reinforcement job's hyperparameters give (none for `"auto"`)."""
    out: dict[str, Any] = {}
    if hyper["eval_interval"] is not None:
        out["interval_steps"] = hyper["eval_interval"]
    if hyper["eval_samples"] is not None:
        out["num_batches"] = math.ceil(hyper["eval_samples"] / hyper["batch_size"])
    return out


def _given(body: FineTuneCreate, kind: str) -> Hyperparameters | ReinforcementHyperparameters:
    """The hyperparameters the body gives for method `kind`. Raises InvalidInput naming
    `method.reinforcement` when `reinforcement` lacks its settings, `hyperparameters` when the
    deprecated top-level ones come with it."""
    if kind == "reinforcement":
        assert body.method is not None  # kind comes from it
        if body.method.reinforcement is None:
            msg = "method type reinforcement needs method.reinforcement with its grader"
            where = ["body", "method", "reinforcement"]
            raise InvalidInput(
                f"method.reinforcement: {msg}",
                details=[{"loc": where, "msg": msg, "type": "missing"}],
            )
        if body.hyperparameters is not None:
            msg = (
                "not read with method reinforcement: give them in "
                "method.reinforcement.hyperparameters"
            )
            raise InvalidInput(
                f"hyperparameters: {msg}",
                details=[{"loc": ["body", "hyperparameters"], "msg": msg, "type": "unused"}],
            )
        return body.method.reinforcement.hyperparameters or ReinforcementHyperparameters()
    if body.method is not None:
        wrapped = body.method.dpo if kind == "dpo" else body.method.supervised
        if wrapped is not None and wrapped.hyperparameters is not None:
            return wrapped.hyperparameters
    return body.hyperparameters or Hyperparameters()


def _resolve(
    entry: BaseModelEntry, given: Hyperparameters | ReinforcementHyperparameters, kind: str
) -> dict[str, Any]:
    """The hyperparameters with `"auto"` resolved; a reinforcement job's `eval_interval` and
    `eval_samples` stay None for `"auto"` (the job spec's settings apply)."""

    def pick(value: Any, default: Any) -> Any:
        return default if value is None or value == "auto" else value

    out = {
        "n_epochs": pick(given.n_epochs, entry.n_epochs),
        "batch_size": pick(given.batch_size, entry.batch_size),
        "learning_rate_multiplier": float(pick(given.learning_rate_multiplier, 1.0)),
    }
    if isinstance(given, Hyperparameters) and kind == "dpo":
        out["beta"] = float(pick(given.beta, 0.1))
    if isinstance(given, ReinforcementHyperparameters):
        out["compute_multiplier"] = float(pick(given.compute_multiplier, 1.0))
        out["eval_interval"] = pick(given.eval_interval, None)
        out["eval_samples"] = pick(given.eval_samples, None)
        out["reasoning_effort"] = "default"
    return out


# The record formats each OpenAI method trains on, where narrower than the spec's rule.
_FORMATS = {"supervised": ("messages", "prompt_completion"), "dpo": ("preference",)}


def _check_file(session: Session, project_id: str, file_id: str, param: str, kind: str) -> None:
    found = datasets.get(session=session, dataset_id=file_id, project_id=project_id)
    msg: str | None
    if found is None:
        msg = f"no file {file_id!r} in this project"
    elif kind == "reinforcement":
        unfit = method_data_error("grpo", found.format)
        msg = unfit and f"method reinforcement (GRPO) needs prompts: {unfit}"
    elif found.format not in _FORMATS[kind]:
        msg = f"method {kind} needs a {' or '.join(_FORMATS[kind])} file, not {found.format!r}"
    else:
        msg = None
    if msg is None:
        return
    raise InvalidInput(
        f"{param}: {msg}", details=[{"loc": ["body", param], "msg": msg, "type": "invalid_file"}]
    )


def _name(model: str, suffix: str | None) -> str:
    raw = re.sub(r"[^A-Za-z0-9._-]+", "-", f"ft-{model}" + (f"-{suffix}" if suffix else ""))
    return raw[:100]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, section by section (dicts merged, other values replaced)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
