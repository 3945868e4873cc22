"""A `POST /openai/v1/fine_tuning/jobs` body as a Torchyard JobSpec (LoRA SFT or DPO over a
registered base model), with OpenAI's `"auto"` hyperparameters resolved."""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.openai.view import (
    BASE_LABEL,
    FULL_VALID,
    LR_LABEL,
    META_PREFIX,
    SUFFIX_LABEL,
    base_model,
)
from core.platform.errors import InvalidInput
from core.platform.settings import BaseModelEntry, Settings
from jobspec.job import JobSpec

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


class Hyperparameters(_Open):
    """OpenAI's hyperparameters; each `"auto"` (or absent) takes the base model's default."""

    n_epochs: AutoOr[Annotated[int, Field(ge=1, le=50)]] = None
    """Passes over the training file (OpenAI's meaning); the job's `train.epochs`. `"auto"`:
    the base model's registered `n_epochs`."""
    batch_size: AutoOr[Annotated[int, Field(ge=1, le=256)]] = None
    """Examples per batch (OpenAI's meaning); the job's `train.micro_batch_size` (sequences per
    process per forward/backward), so an optimizer step sees this times the data-parallel
    processes and `train.grad_accum_steps` of the base model's registered job settings.
    `"auto"`: the base model's registered `batch_size`."""
    learning_rate_multiplier: AutoOr[Annotated[float, Field(gt=0, le=100)]] = None
    """Scales the base model's registered `learning_rate` (OpenAI's meaning); the job's peak
    `optim.lr` is their product. `"auto"`: 1.0."""
    beta: AutoOr[Annotated[float, Field(gt=0, le=100)]] = None
    """DPO's beta, the weight of the penalty for drifting from the reference (base) model;
    the job's `method.dpo.beta`. Read for method `dpo` only, ignored for `supervised`.
    `"auto"`: 0.1."""


class _Wrapped(_Open):
    """A method's settings."""

    hyperparameters: Hyperparameters | None = None
    """The method's hyperparameters; when given, they are used instead of the top-level
    (deprecated) `hyperparameters`."""


class Method(_Open):
    """The fine-tuning method and its hyperparameters."""

    type: Literal["supervised", "dpo"]
    """`supervised`: supervised fine-tuning on a `messages` or `prompt_completion` file
    (Torchyard's method `sft`); `dpo`: Direct Preference Optimization on a `preference`
    file (method `dpo`). Both train LoRA adapters on the base model."""
    supervised: _Wrapped | None = None
    """Settings for `type: supervised`; read only for that type."""
    dpo: _Wrapped | None = None
    """Settings for `type: dpo`; read only for that type."""


class FineTuneCreate(_Open):
    """The body of `POST /openai/v1/fine_tuning/jobs` (OpenAI's fields; `integrations` are
    accepted and ignored)."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    """The model to fine-tune: the name of a base model this deployment registers
    (`TORCHYARD_BASE_MODELS`, listed by `GET /openai/v1/models`), which supplies the weights,
    LoRA settings, sequence length, resources, pool and defaults. 400 for any other name."""
    training_file: _ID
    """The id of a file of this project uploaded with purpose `fine-tune`: records of format
    `messages` or `prompt_completion` for `supervised`, `preference` for `dpo`. The job's
    `data.dataset`."""
    validation_file: _ID | None = None
    """The id of a file like `training_file`, evaluated during training (`valid_loss` in the
    result file); the job's `data.eval_dataset`. Null: no validation. For `supervised`, the
    final checkpoint is also scored on all of it by an eval job (`eval_after`, evaluation
    `full_valid`): its checkpoint's `metrics.full_valid_loss`."""
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
    """Hyperparameters for either method (deprecated by OpenAI in favour of
    `method.<type>.hyperparameters`, which take precedence when given)."""
    integrations: list[Any] | None = None
    """OpenAI's third-party integrations (such as Weights & Biases): accepted and ignored;
    follow a job's metrics with `GET /v1/jobs/{job_id}/metrics` instead."""


def build(
    *, session: Session, settings: Settings, project_id: str, body: FineTuneCreate
) -> tuple[JobSpec, dict[str, Any]]:
    """(the JobSpec, the resolved hyperparameters) for `body`. Raises InvalidInput naming the
    OpenAI field (`model`, `training_file`, `validation_file`, `method`)."""
    entry = base_model(settings, body.model)
    kind = body.method.type if body.method is not None else "supervised"
    _check_file(session, project_id, body.training_file, "training_file", kind)
    if body.validation_file is not None:
        _check_file(session, project_id, body.validation_file, "validation_file", kind)
    hyper = _resolve(entry, _given(body, kind), kind)
    labels = {BASE_LABEL: body.model, LR_LABEL: repr(hyper["learning_rate_multiplier"])}
    if body.suffix:
        labels[SUFFIX_LABEL] = body.suffix
    labels.update({META_PREFIX + k: v for k, v in (body.metadata or {}).items()})
    ours: dict[str, Any] = {
        "name": _name(body.model, body.suffix),
        "labels": labels,
        "seed": body.seed if body.seed is not None else secrets.randbelow(2**31),
        "model": {"kind": "hf", "hf": {"path_or_id": entry.path}, "seq_len": entry.seq_len},
        "lora": entry.lora,
        "method": {"kind": "dpo", "dpo": {"beta": hyper["beta"]}}
        if kind == "dpo"
        else {"kind": "sft"},
        "data": {"dataset": body.training_file, "eval_dataset": body.validation_file},
        "optim": {"lr": entry.learning_rate * hyper["learning_rate_multiplier"]},
        "train": {"micro_batch_size": hyper["batch_size"], "epochs": hyper["n_epochs"]},
        "resources": {**entry.resources, "pool": entry.pool},
    }
    if body.validation_file is not None and kind != "dpo":
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


def _given(body: FineTuneCreate, kind: str) -> Hyperparameters:
    if body.method is not None:
        wrapped = body.method.dpo if kind == "dpo" else body.method.supervised
        if wrapped is not None and wrapped.hyperparameters is not None:
            return wrapped.hyperparameters
    return body.hyperparameters or Hyperparameters()


def _resolve(entry: BaseModelEntry, given: Hyperparameters, kind: str) -> dict[str, Any]:
    def pick(value: Any, default: Any) -> Any:
        return default if value is None or value == "auto" else value

    out = {
        "n_epochs": pick(given.n_epochs, entry.n_epochs),
        "batch_size": pick(given.batch_size, entry.batch_size),
        "learning_rate_multiplier": float(pick(given.learning_rate_multiplier, 1.0)),
    }
    if kind == "dpo":
        out["beta"] = float(pick(given.beta, 0.1))
    return out


def _check_file(session: Session, project_id: str, file_id: str, param: str, kind: str) -> None:
    found = datasets.get(session=session, dataset_id=file_id, project_id=project_id)
    if found is None:
        msg = f"no file {file_id!r} in this project"
    elif kind == "dpo" and found.format != "preference":
        msg = f"method dpo needs a preference file (this one is {found.format!r})"
    elif kind == "supervised" and found.format not in ("messages", "prompt_completion"):
        msg = f"method supervised needs a messages or prompt_completion file, not {found.format!r}"
    else:
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
