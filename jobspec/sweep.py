"""A sweep: many trials of one base job spec, each with values drawn from a search space.

`SweepSpec` is what `POST /v1/sweeps` takes. Every problem it can see without the database is
reported at once, each at the JSON path of the field to change: a search-space path that is no
field of the base spec, a distribution the field cannot take (a float range for `lora.r`),
bounds or choices the field refuses, a metric the built-in trainer never reports, a grid larger
than `max_trials`. Trials are ordinary jobs; `core.sweeps` asks Optuna for their values.

Pure pydantic, like the rest of `jobspec`.
"""

from __future__ import annotations

import itertools
import math
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from dataformat.metrics import trainer_metrics
from jobspec.base import StrictSpec
from jobspec.job import (
    AnyJobSpec,
    AnySpec,
    EvalJobSpec,
    JobSpec,
    Name,
    ScriptJobSpec,
    is_stored,
    parse_job_spec,
)

Int = int  # `Dimension.int` shadows the builtin inside that class
Scalar = float | Int | str | bool
# `entrypoint.params.<name>`: free names a team's program reads with `torchyard.train.params()`.
PARAMS_PREFIX = ("entrypoint", "params")
MAX_GRID = 100_000  # enumerating a grid larger than this to check it is itself the problem


class Dimension(StrictSpec):
    """One dimension of the search space: exactly one of `uniform`, `log_uniform`, `int`,
    `choice` (Optuna's FloatDistribution, FloatDistribution(log=True), IntDistribution,
    CategoricalDistribution)."""

    uniform: Annotated[list[float], Field(min_length=2, max_length=2)] | None = Field(
        default=None, description="[low, high]: a float drawn uniformly, low <= x <= high."
    )
    log_uniform: Annotated[list[float], Field(min_length=2, max_length=2)] | None = Field(
        default=None,
        description="[low, high], 0 < low: a float whose logarithm is uniform (learning rates).",
    )
    int: Annotated[list[Annotated[Int, Field(strict=True)]], Field(min_length=2, max_length=3)] | (
        None
    ) = Field(
        default=None,
        description="[low, high] or [low, high, step]: an integer low, low+step, ... <= high.",
    )
    choice: Annotated[list[Scalar], Field(min_length=1, max_length=1000)] | None = Field(
        default=None, description="One of these values."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        given = [k for k in ("uniform", "log_uniform", "int", "choice") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of uniform, log_uniform, int, choice"
                + (f" (got {', '.join(given)})" if given else "")
            )
        low_high = self.uniform or self.log_uniform or self.int
        if low_high is not None and low_high[0] >= low_high[1]:
            raise ValueError(f"low ({low_high[0]}) must be below high ({low_high[1]})")
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError("log_uniform needs 0 < low")
        if self.int is not None and len(self.int) == 3 and self.int[2] < 1:
            raise ValueError("the step of int must be at least 1")
        if self.choice is not None and len({repr(c) for c in self.choice}) != len(self.choice):
            raise ValueError("choices repeat")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("uniform", "log_uniform", "int", "choice") if getattr(self, k))

    def grid_values(self) -> list[Scalar] | None:
        """Every value of a discrete dimension (`choice`, `int`); None for a float range."""
        if self.choice is not None:
            return list(self.choice)
        if self.int is not None:
            step = self.int[2] if len(self.int) == 3 else 1
            return list(range(self.int[0], self.int[1] + 1, step))
        return None

    def probes(self) -> list[Scalar]:
        """Values the field must accept for the dimension to be usable: every choice, else
        the bounds (an int's last reachable value, not `high`, when a step skips it)."""
        if self.choice is not None:
            return list(self.choice)
        if self.int is not None:
            values = self.grid_values() or []
            return [values[0], values[-1]]
        low_high = self.uniform or self.log_uniform
        assert low_high is not None
        return [low_high[0], low_high[1]]


class PrunerSpec(StrictSpec):
    """When to stop a trial that is doing worse than the others at the same point.

    `asha`: successive halving (Li et al., "A System for Massively Parallel Hyperparameter
    Tuning", MLSys 2020; Optuna's SuccessiveHalvingPruner): at rungs `min_resource *
    reduction_factor**k` a trial continues only if it is in the top 1/`reduction_factor` of the
    trials that reached that rung. `median`: Optuna's MedianPruner, stop a trial whose value is
    worse than the median of earlier trials at the same step, after `startup_trials` trials and
    `warmup` of its own. `axis`: what a report's position is measured in, `step` (optimizer
    steps) or `tokens` (steps x tokens per step of that trial, fair between batch sizes).
    """

    kind: Literal["none", "asha", "median"] = Field(default="none", description="The pruner.")
    axis: Literal["step", "tokens"] = Field(
        default="step", description="What `min_resource` and `warmup` count: steps or tokens."
    )
    min_resource: int | None = Field(
        default=None,
        ge=1,
        description="asha: the first rung, in `axis` units; null lets Optuna estimate it from "
        "the first trial that completes.",
    )
    reduction_factor: int = Field(
        default=3, ge=2, le=16, description="asha: 1/reduction_factor go on at each rung."
    )
    startup_trials: int = Field(
        default=2, ge=0, description="median: trials completed before any is pruned."
    )
    warmup: int = Field(
        default=0, ge=0, description="median: reports (in `axis` units) before a trial may stop."
    )


class SweepLimits(StrictSpec):
    max_cost: float | None = Field(
        default=None,
        gt=0,
        description="Stop starting trials once the trials' cost together reaches this "
        "(the currency of `TORCHYARD_SLOT_PRICES`); running trials finish.",
    )


class SweepSpec(StrictSpec):
    """A hyperparameter sweep: `max_trials` jobs made from `base` with values from `space`,
    `max_concurrent_trials` at a time, searched by `searcher` for the best `metric`."""

    name: Name = Field(description="Human-readable sweep name; each trial's job is `<name>-<n>`.")
    base: AnyJobSpec = Field(description="The job spec every trial starts from.")
    space: dict[str, Dimension] = Field(
        min_length=1,
        max_length=32,
        description="Dotted spec paths (`optim.lr`, `lora.r`, `train.micro_batch_size`, "
        "`entrypoint.params.<name>`) and the values each may take.",
    )
    metric: str = Field(
        default="eval_loss",
        min_length=1,
        max_length=100,
        description="The reported metric a trial is judged by (its last value).",
    )
    direction: Literal["minimize", "maximize"] = Field(
        default="minimize", description="Whether a lower or a higher `metric` is better."
    )
    searcher: Literal["grid", "random", "tpe"] = Field(
        default="tpe",
        description="grid: every combination (discrete dimensions only); random; tpe: Optuna's "
        "Tree-structured Parzen Estimator (Bergstra et al., NeurIPS 2011).",
    )
    pruner: PrunerSpec = Field(
        default_factory=PrunerSpec, description="When to stop a lagging trial early."
    )
    max_trials: int = Field(default=16, ge=1, le=1000, description="Trials in all.")
    max_concurrent_trials: int = Field(default=2, ge=1, le=100, description="Trials at once.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the searcher.")
    limits: SweepLimits = Field(
        default_factory=SweepLimits, description="Limits over all the trials together."
    )

    @model_validator(mode="after")
    def _space_fits_base(self, info: ValidationInfo) -> SweepSpec:
        """Every problem with the space, the metric and the grid, each at its JSON path; a
        sweep read back (`jobspec.job.STORED`) was checked when it was submitted."""
        if is_stored(info):
            return self
        problems = space_problems(self)
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("sweep_conflict", message), loc=loc, input=value
                    )
                    for loc, message, value in problems
                ],
            )
        return self

    def grid(self) -> dict[str, list[Scalar]]:
        """The grid searcher's values per path (every dimension is discrete by then)."""
        return {path: dim.grid_values() or [] for path, dim in self.space.items()}


Problem = tuple[tuple[str | int, ...], str, Any]


def space_problems(sweep: SweepSpec) -> list[Problem]:
    """(path, message, value) for each dimension the base spec cannot take, a metric the
    built-in trainer never reports, and a grid the searcher cannot run."""
    problems: list[Problem] = []
    if isinstance(sweep.base, EvalJobSpec):
        message = "an eval job is not swept: sweep the training job, then evaluate its best trial"
        return [(("base", "evaluate"), message, None)]
    for path, dim in sweep.space.items():
        loc: tuple[str | int, ...] = ("space", path)
        error = _path_error(sweep.base, path, dim)
        if error is None:
            error = _probe_error(sweep.base, path, dim)
        if error is not None:
            problems.append((loc, error, dim.model_dump(exclude_none=True)))
    problems += _warmup_problems(sweep)
    if isinstance(sweep.base, JobSpec):
        grpo = sweep.base.method.grpo
        known = trainer_metrics(
            sweep.base.method.kind,
            qat=sweep.base.qat is not None,
            graders=tuple(g.name for g in grpo.graders) if grpo is not None else (),
        )
        if sweep.metric not in known:
            problems.append(
                (
                    ("metric",),
                    f"the built-in trainer never reports {sweep.metric!r}; it reports "
                    + ", ".join(sorted(known)),
                    sweep.metric,
                )
            )
    elif sweep.pruner.axis == "tokens":
        problems.append(
            (
                ("pruner", "axis"),
                "tokens per step are known only for the built-in trainer; use axis 'step'",
                "tokens",
            )
        )
    if sweep.searcher == "grid":
        problems += _grid_problems(sweep)
    return problems


WARMUP, MAX_STEPS = "optim.warmup_steps", "train.max_steps"


def _warmup_problems(sweep: SweepSpec) -> list[Problem]:
    """A space that draws both `optim.warmup_steps` and `train.max_steps` so that some trial
    would warm up longer than it runs; each dimension alone is probed against the base."""
    warmup, steps = sweep.space.get(WARMUP), sweep.space.get(MAX_STEPS)
    if warmup is None or steps is None:
        return []
    highest = max((float(v) for v in warmup.probes() if _is_number(v)), default=None)
    lowest = min((float(v) for v in steps.probes() if _is_number(v)), default=None)
    if highest is None or lowest is None or highest <= lowest:
        return []
    message = (
        f"{WARMUP} goes up to {highest:g} but {MAX_STEPS} down to {lowest:g}: a trial would warm "
        f"up longer than it runs; keep the largest warmup at most the smallest max_steps"
    )
    return [(("space", WARMUP), message, warmup.model_dump(exclude_none=True))]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _grid_problems(sweep: SweepSpec) -> list[Problem]:
    problems: list[Problem] = []
    size = 1
    for path, dim in sweep.space.items():
        values = dim.grid_values()
        if values is None:
            problems.append(
                (
                    ("space", path),
                    f"the grid searcher needs discrete values (choice or int), not {dim.kind}",
                    dim.model_dump(exclude_none=True),
                )
            )
        else:
            size *= len(values)
    if not problems and size > sweep.max_trials:
        problems.append(
            (
                ("max_trials",),
                f"the grid has {size} points but max_trials is {sweep.max_trials}: raise "
                "max_trials or shrink the space",
                sweep.max_trials,
            )
        )
    return problems


def _path_error(base: AnySpec, path: str, dim: Dimension) -> str | None:
    """Why `path` names no field of `base` that `dim` can set, or None."""
    parts = tuple(path.split("."))
    if isinstance(base, ScriptJobSpec) and parts[:2] == PARAMS_PREFIX:
        if len(parts) != 3 or not parts[2]:
            return "entrypoint.params takes one name: entrypoint.params.<name>"
        return None
    model: type[BaseModel] | None = type(base)
    annotation: Any = None
    for i, part in enumerate(parts):
        if model is None or part not in model.model_fields:
            where = ".".join(parts[:i]) or "the spec"
            hint = (
                "; a program's own values go under entrypoint.params.<name>"
                if (isinstance(base, ScriptJobSpec))
                else ""
            )
            return f"{part!r} is not a field of {where}{hint}"
        annotation = model.model_fields[part].annotation
        model = _submodel(annotation)
    if model is not None:
        return f"{path} is a section; name one of its fields ({', '.join(model.model_fields)})"
    leaf = _leaf_types(annotation)
    if dim.kind in ("uniform", "log_uniform") and float not in leaf:
        return f"{path} takes {_names(leaf)}, not a float range: use int or choice"
    if dim.kind == "int" and not leaf & {int, float}:
        return f"{path} takes {_names(leaf)}, not integers: use choice"
    return None


def _probe_error(base: AnySpec, path: str, dim: Dimension) -> str | None:
    """The base spec's own message for the first value of `dim` it refuses at `path`."""
    for value in dim.probes():
        try:
            with_values(base, {path: value})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f"{value!r} at {path}: {where}: {first['msg']}"
    return None


def with_values(base: AnySpec, values: dict[str, Any]) -> AnySpec:
    """`base` with each dotted path set to its value, validated again as a whole (so a value
    that breaks a rule across fields is refused). Raises `pydantic.ValidationError`."""
    data = base.model_dump(mode="json")
    for path, value in values.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}  # an optional section (`lora`) the base leaves out
            node = node[part]
        node[last] = value
    return parse_job_spec(data)


def grid_size(sweep: SweepSpec) -> int:
    """Points of the grid (the product of the discrete dimensions' sizes)."""
    return math.prod(len(v) for v in sweep.grid().values())


def grid_points(sweep: SweepSpec) -> list[dict[str, Scalar]]:
    """Every point of the grid, in order (at most `MAX_GRID`)."""
    grid = sweep.grid()
    points = itertools.islice(itertools.product(*grid.values()), MAX_GRID)
    return [dict(zip(grid, p, strict=True)) for p in points]


def _submodel(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _leaf_types(annotation: Any) -> set[type]:
    """The scalar types a field's annotation admits (Literal values count as their type)."""
    found: set[type] = set()
    stack = [annotation]
    while stack:
        item = stack.pop()
        origin = get_origin(item)
        if origin is Literal:
            found |= {type(v) for v in get_args(item)}
        elif origin is Annotated:
            stack.append(get_args(item)[0])
        elif origin in (Union, UnionType):
            stack += list(get_args(item))
        elif isinstance(item, type) and item in (Int, float, str, bool):
            found.add(item)
    return found


def _names(types: set[type]) -> str:
    return " or ".join(sorted(t.__name__ for t in types)) or "no scalar"
