"""The job spec: what a user submits, validated before any GPU is allocated.

This module imports nothing heavier than pydantic, so the API and the client SDK can validate
specs without importing torch. The trainer reads the same model (``JobSpec.load(path)``).
The data section (`DataSpec`) lives in `jobspec.data` and the method section
(`MethodSpec`, `DPOSpec`) in `jobspec.method`; both are importable from here.

Every field is documented where it is declared; ``JobSpec.model_json_schema()`` is the public
JSON Schema served at ``GET /v1/spec/schema`` and rendered into docs/reference/spec.md.

The sections (`ModelSpec`, `TrainSpec`, ...) live in `jobspec.sections`, which the cross-field
checks (`jobspec.checks`) read through its `TrainerSections` protocol; every name there is
importable from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from dataformat.failures import FailureClass as FailureClass
from jobspec.base import StrictSpec
from jobspec.checks import cross_field_errors, get_path, submission_errors
from jobspec.data import DataSpec as DataSpec
from jobspec.entrypoint import EntrypointSpec as EntrypointSpec
from jobspec.evaluate import EvalAfterSpec as EvalAfterSpec
from jobspec.evaluate import EvaluateSpec as EvaluateSpec
from jobspec.method import DPOSpec as DPOSpec
from jobspec.method import MethodSpec as MethodSpec
from jobspec.sections import (
    NAME_FIELD_PATTERN as NAME_FIELD_PATTERN,
)
from jobspec.sections import (
    NAME_PATTERN as NAME_PATTERN,
)
from jobspec.sections import (
    SPEC_VERSION as SPEC_VERSION,
)
from jobspec.sections import (
    STORED as STORED,
)
from jobspec.sections import (
    CheckpointSpec as CheckpointSpec,
)
from jobspec.sections import (
    EvalSpec as EvalSpec,
)
from jobspec.sections import (
    FSDPSpec as FSDPSpec,
)
from jobspec.sections import (
    HFModelSpec as HFModelSpec,
)
from jobspec.sections import (
    InitFromSpec as InitFromSpec,
)
from jobspec.sections import (
    LimitsSpec as LimitsSpec,
)
from jobspec.sections import (
    LoRASpec as LoRASpec,
)
from jobspec.sections import (
    ModelSpec as ModelSpec,
)
from jobspec.sections import (
    Name as Name,
)
from jobspec.sections import (
    OptimSpec as OptimSpec,
)
from jobspec.sections import (
    ParallelismSpec as ParallelismSpec,
)
from jobspec.sections import (
    PipelineSpec as PipelineSpec,
)
from jobspec.sections import (
    ProfileSpec as ProfileSpec,
)
from jobspec.sections import (
    QATSpec as QATSpec,
)
from jobspec.sections import (
    QLoRASpec as QLoRASpec,
)
from jobspec.sections import (
    ResourcesSpec as ResourcesSpec,
)
from jobspec.sections import (
    RetrySpec as RetrySpec,
)
from jobspec.sections import (
    SampleSpec as SampleSpec,
)
from jobspec.sections import (
    TrainSpec as TrainSpec,
)
from jobspec.sections import (
    is_stored as is_stored,
)
from jobspec.session import SessionSpec as SessionSpec


class JobBase(StrictSpec):
    """What every job has, whichever program it runs: name, labels, seed, placement, retry
    policy, limits, priority."""

    spec_version: Literal[1] = Field(default=SPEC_VERSION, description="Spec format version.")
    # What `jobspec.stored.read_stored_spec` repaired to read a stored spec; not a field.
    _stored_problems: list[str] = PrivateAttr(default_factory=list)
    name: Name = Field(description="Human-readable job name (not unique).")
    labels: dict[str, str] = Field(
        default={}, max_length=64, description="Free-form key/value labels."
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for init, data and RNG.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Placement.")
    retries: RetrySpec = Field(default_factory=RetrySpec, description="Retry policy.")
    limits: LimitsSpec = Field(default_factory=LimitsSpec, description="Hard limits.")
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Scheduling priority within the pool: higher runs first, ties by age. On a "
        "pool with preemption on (`TORCHYARD_PREEMPTION_POOLS`), a queued job that does not fit "
        "preempts running jobs of lower priority (they checkpoint and requeue).",
    )

    @property
    def world_size(self) -> int:
        return self.resources.world_size


class JobSpec(JobBase):
    """A training job of the built-in trainer, version 1."""

    model: ModelSpec = Field(default_factory=ModelSpec, description="The network.")
    lora: LoRASpec | None = Field(
        default=None, description="Train LoRA adapters instead of the whole model."
    )
    qlora: QLoRASpec | None = Field(
        default=None,
        description="Quantize the frozen base to 4 bits and train LoRA adapters on it "
        "(`lora`'s settings, or its defaults when `lora` is null).",
    )
    data: DataSpec = Field(description="The training text.")
    method: MethodSpec = Field(
        default_factory=MethodSpec, description="Training objective: sft (default) or dpo."
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Distribution strategy."
    )
    optim: OptimSpec = Field(default_factory=OptimSpec, description="Optimizer and schedule.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Batch, precision, stop.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Evaluation.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    sample: SampleSpec = Field(default_factory=SampleSpec, description="Final text sample.")
    qat: QATSpec | None = Field(
        default=None, description="Quantization-aware training (torchao); null for none."
    )
    eval_after: EvalAfterSpec | None = Field(
        default=None,
        description="Evaluations run automatically, as eval jobs, on the final checkpoint "
        "(and every k-th, and the starting weights): see `jobspec.evaluate.EvalAfterSpec`.",
    )

    @model_validator(mode="after")
    def _defaults_fit(self) -> JobSpec:
        """A default never makes a valid spec invalid: `eval.interval_steps` left out (100)
        with a shorter `train.max_steps` evaluates every `max_steps` steps (at the end), and
        `optim.warmup_steps` left out (50) warms up over the whole of a shorter run."""
        steps = self.train.max_steps
        evaluation, optim = self.eval, self.optim
        if steps is None:
            return self
        interval_given = "interval_steps" in evaluation.model_fields_set
        if not interval_given and evaluation.interval_steps > steps:
            evaluation.interval_steps = steps
        if "warmup_steps" not in optim.model_fields_set and optim.warmup_steps > steps:
            optim.warmup_steps = steps
        return self

    @model_validator(mode="after")
    def _cross_field_checks(self, info: ValidationInfo) -> JobSpec:
        """Checks that span fields; each error names the JSON path of the field to change.
        A spec read back (`STORED`) skips the rules of `submission_errors`."""
        errors: list[tuple[tuple[str | int, ...], str]] = [*cross_field_errors(self)]
        if not is_stored(info):
            errors += submission_errors(self)
        if errors:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("spec_conflict", message),
                        loc=loc,
                        input=get_path(self, loc),
                    )
                    for loc, message in errors
                ],
            )
        return self

    @property
    def data_parallel_size(self) -> int:
        """Ranks that take distinct shares of each global batch (tensor-parallel groups and
        pipelines see one share together)."""
        return self.parallelism.dp_size(self.world_size)

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all ranks."""
        return self.train.micro_batch_size * self.train.grad_accum_steps * self.data_parallel_size

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        """Read a spec from a JSON file written from an accepted spec (the worker's spec file,
        a checkpoint's), as `STORED`. Raises `pydantic.ValidationError` when invalid."""
        return cls.model_validate(json.loads(Path(path).read_text()), context=STORED)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2))


# The built-in trainer's sections: a job with `entrypoint` has none of them.
TRAINER_FIELDS: Final = tuple(
    name for name in JobSpec.model_fields if name not in JobBase.model_fields
)


def _refuse_fields(cls: type[JobBase], data: Any, names: tuple[str, ...], why: str) -> Any:
    """A field of `names` in `data` is a 422 naming it (`why`: what the job runs instead)."""
    if isinstance(data, dict):
        found = [name for name in names if name in data]
        if found:
            raise ValidationError.from_exception_data(
                cls.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "spec_conflict",
                            "`{field}` is a field of {owner}; {why}: remove one of them",
                            {
                                "field": name,
                                "owner": _OWNER.get(name, "the built-in trainer"),
                                "why": why,
                            },
                        ),
                        loc=(name,),
                        input=data[name],
                    )
                    for name in found
                ],
            )
    return data


_OWNER: Final = {"entrypoint": "a script job", "evaluate": "an eval job"}


class ScriptJobSpec(JobBase):
    """A job that runs the team's own training code (`entrypoint`) under torchrun, with the
    same queueing, gangs, retries, pause/resume, cancel, metrics, logs and checkpoints as the
    built-in trainer (docs/CONTRACTS.md section 5)."""

    entrypoint: EntrypointSpec = Field(description="The code, its argv, env and requirements.")

    @model_validator(mode="before")
    @classmethod
    def _no_trainer_fields(cls, data: Any) -> Any:
        """A field of the built-in trainer next to `entrypoint` is a 422 naming that field."""
        return _refuse_fields(
            cls, data, (*TRAINER_FIELDS, "evaluate"), "a job with `entrypoint` runs your own code"
        )


class EvalJobSpec(JobBase):
    """A job that evaluates a checkpoint of an earlier built-in-trainer job (`evaluate`:
    perplexity on datasets, generation scored against references; `jobspec.evaluate`), queued,
    placed, retried and billed like any job. Its results: `GET /v1/jobs/{id}/evals`, and
    metrics named `<evaluation>.<metric>`."""

    evaluate: EvaluateSpec = Field(description="The checkpoint to evaluate, and how.")

    @model_validator(mode="before")
    @classmethod
    def _no_trainer_fields(cls, data: Any) -> Any:
        """A field of the built-in trainer (or `entrypoint`) next to `evaluate` is a 422."""
        return _refuse_fields(
            cls,
            data,
            (*TRAINER_FIELDS, "entrypoint"),
            "a job with `evaluate` runs the source job's model as its spec says",
        )

    @model_validator(mode="after")
    def _one_node(self) -> EvalJobSpec:
        """An eval job runs on one host (its ranks share the rows to score)."""
        if self.resources.nodes != 1:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "spec_conflict", "an eval job runs on one node (hosts: 1)"
                        ),
                        loc=("resources", "nodes"),
                        input=self.resources.nodes,
                    )
                ],
            )
        return self


class SessionJobSpec(JobBase):
    """A job whose program serves one training client of a Tinker-compatible session
    (`trainer.session`, issue 47): it loads `model` with the session's LoRA adapters and runs
    the client's calls (`forward_backward`, `optim_step`, ...) as they come through the control
    plane. Made by the Tinker API's `create_model` only (`core.sessions.training_clients`),
    through the one door like every job; `POST /v1/jobs` takes no `session`."""

    model: ModelSpec = Field(description="The base model (a registered one, `kind: hf`).")
    session: SessionSpec = Field(description="The session and training client it serves.")

    @model_validator(mode="before")
    @classmethod
    def _no_trainer_fields(cls, data: Any) -> Any:
        """A field of the built-in trainer next to `session` is a 422 naming that field."""
        fields = tuple(name for name in TRAINER_FIELDS if name != "model")
        return _refuse_fields(
            cls, data, (*fields, "entrypoint", "evaluate"), "a session job serves its client"
        )


AnySpec = JobSpec | ScriptJobSpec | EvalJobSpec | SessionJobSpec
"""A parsed job spec of any kind."""


def spec_kind(value: Any) -> str:
    """`script` for a job with `entrypoint`, `session` for one with `session`, `eval` for one
    with `evaluate` (dict or model), else `trainer`."""
    if isinstance(value, dict):
        if "entrypoint" in value:
            return "script"
        if "session" in value:
            return "session"
        return "eval" if "evaluate" in value else "trainer"
    if isinstance(value, ScriptJobSpec):
        return "script"
    if isinstance(value, SessionJobSpec):
        return "session"
    return "eval" if isinstance(value, EvalJobSpec) else "trainer"


SPEC_KINDS: Final = ("trainer", "script", "eval")
SPEC_MODELS: Final[dict[str, type[JobBase]]] = {
    "trainer": JobSpec,
    "script": ScriptJobSpec,
    "eval": EvalJobSpec,
    "session": SessionJobSpec,
}
"""Every kind a stored spec can be; `SPEC_KINDS` (and `AnyJobSpec`) are those a user submits."""
AnyJobSpec = Annotated[
    Annotated[JobSpec, Tag("trainer")]
    | Annotated[ScriptJobSpec, Tag("script")]
    | Annotated[EvalJobSpec, Tag("eval")],
    Discriminator(spec_kind),
]
"""Any kind of job. Validation errors of this union carry the kind (`trainer`, `script` or
`eval`) as the first element of their `loc`; `parse_job_spec` and the API leave it out."""


def parse_job_spec(data: Any, *, stored: bool = False) -> AnySpec:
    """Validate `data` (a dict or a spec) as the kind of job it is: `ScriptJobSpec` when it
    has `entrypoint`, `EvalJobSpec` when it has `evaluate`, `SessionJobSpec` when it has
    `session`, else `JobSpec`; `stored`: read back,
    as `STORED`. Raises `pydantic.ValidationError` with the JSON paths of the bad fields."""
    if isinstance(data, JobSpec | ScriptJobSpec | EvalJobSpec | SessionJobSpec):
        return data
    model = SPEC_MODELS[spec_kind(data)]
    parsed = model.model_validate(data, context=STORED if stored else None)
    assert isinstance(parsed, JobSpec | ScriptJobSpec | EvalJobSpec | SessionJobSpec)
    return parsed


def json_schema() -> dict[str, Any]:
    """The public JSON Schema of a job spec: `JobSpec` (built-in trainer), `ScriptJobSpec`
    (`entrypoint`) or `EvalJobSpec` (`evaluate`), one of them."""
    return TypeAdapter(AnyJobSpec).json_schema()
