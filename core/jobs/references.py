"""What a submitted job spec must satisfy beyond its own model: the references it makes.

`check_references` is what every submission runs (`core.submission.service.check`, after the
storable strings and a priced pool for `limits.max_cost`): data the project may use (a dataset of
the project, of the method's format; a path under the data roots), a model directory the server
may read, a code archive of the project for `entrypoint` and the inputs it declares
(`core.jobs.inputs`, pinned) or for a GRPO job's python graders (`method.grpo.code`), and a
`model.init_from` of the project (pinned to a checkpoint).
`problems` is every problem of a spec as submitted in one list (issue 28): its fields (an
unknown one with the one it most likely meant), the rules across fields the field errors hid
(`jobspec.problems`), and the references of the spec with those repaired.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.jobs import code_archives, evaluations, init_from, inputs
from core.platform import storage
from core.platform.errors import DomainError, Forbidden, InvalidInput
from core.platform.settings import Settings
from core.platform.tables import Dataset
from jobspec.data import DataSpec
from jobspec.job import AnySpec, EvalJobSpec, JobSpec, ScriptJobSpec, SessionJobSpec
from jobspec.method_checks import method_data_error
from jobspec.problems import spec_errors, spec_order


def check_references(
    *, session: Session, settings: Settings, project_id: str, spec: AnySpec
) -> AnySpec:
    """Raise at the first reference `spec` makes that this project or server cannot honour;
    return the spec with `data.format` filled from its dataset and `init_from` pinned.

    Raises InvalidInput (422), Forbidden (403), NotFound (404) or Conflict (409) with the
    field's `["body", ...]` path.
    """
    if isinstance(spec, ScriptJobSpec):
        return _check_entrypoint(
            session=session, settings=settings, project_id=project_id, spec=spec
        )
    if isinstance(spec, EvalJobSpec):
        return evaluations.check(
            session=session, settings=settings, project_id=project_id, spec=spec
        )
    if isinstance(spec, SessionJobSpec):  # built from a registered base model by the server
        return spec
    spec = _check_data(session=session, settings=settings, project_id=project_id, spec=spec)
    code_archives.check_grader_code(session=session, project_id=project_id, spec=spec)
    spec = evaluations.check_after(
        session=session, settings=settings, project_id=project_id, spec=spec
    )
    return init_from.pin(session=session, project_id=project_id, spec=spec)


def problems(
    *, session: Session | None, settings: Settings, project_id: str | None, data: Any
) -> list[dict[str, Any]]:
    """Every problem of `data`, a job spec as submitted, as error details (`loc` from `body`,
    `msg`, `type`): fields, rules across fields, and (given a session and project) the first
    reference problem of the spec with its fields repaired, in the order the spec writes its
    fields. Empty when it is valid and every reference holds."""
    found = spec_errors(data)
    details = [{**e, "loc": ["body", *e["loc"]]} for e in found.errors]
    if found.repaired is None or session is None or project_id is None:
        return details
    try:
        check_references(
            session=session, settings=settings, project_id=project_id, spec=found.repaired
        )
    except DomainError as exc:
        seen = {tuple(d["loc"]) for d in details}
        details += [d for d in exc.details if tuple(d.get("loc", ())) not in seen]
        details.sort(key=lambda d: spec_order(data, list(d.get("loc", ()))[1:]))
    return details


def _check_entrypoint(
    *, session: Session, settings: Settings, project_id: str, spec: ScriptJobSpec
) -> ScriptJobSpec:
    """The code archive and every declared input (`core.jobs.inputs`), all problems in one
    error (`core.jobs.inputs.combine`); returns the spec with its inputs pinned."""
    problems: list[DomainError] = []
    try:
        code_archives.check_entrypoint(session=session, project_id=project_id, spec=spec)
    except DomainError as exc:
        problems.append(exc)
    spec, found = inputs.pin(session=session, settings=settings, project_id=project_id, spec=spec)
    problems += found
    if problems:
        raise inputs.combine(problems)
    return spec


def _check_data(*, session: Session, settings: Settings, project_id: str, spec: JobSpec) -> JobSpec:
    """The spec's data exists for this project (a dataset of the project, or an allowed path)
    and fits the method. Returns the spec with `data.format` and `data.token_dtype` filled in
    from a registered dataset, so the trainer reads the data as it was validated."""
    if spec.data.dataset is not None:
        spec = _with_dataset_format(session=session, project_id=project_id, spec=spec)
    if spec.data.eval_dataset is not None:
        found = datasets.get(
            session=session, dataset_id=spec.data.eval_dataset, project_id=project_id
        )
        if found is None:
            raise _data_error(
                "eval_dataset", f"no dataset {spec.data.eval_dataset!r} in this project"
            )
        if spec.data.format is not None and found.format != spec.data.format:
            raise _data_error(
                "eval_dataset", f"format {found.format!r} differs from the training data's "
                f"{spec.data.format!r}",
            )  # fmt: skip
        # a name is pinned to the dataset's id: the job reads what it named at submission
        spec = spec.model_copy(
            update={"data": spec.data.model_copy(update={"eval_dataset": found.id})}
        )
    for field in ("uri", "eval_uri"):
        uri = getattr(spec.data, field)
        if uri is not None:
            _check_data_uri(uri, settings, field)
    hf = spec.model.hf
    if hf is not None and hf.path_or_id is not None:
        storage.model_path(hf.path_or_id, settings)
    return spec


def _with_dataset_format(*, session: Session, project_id: str, spec: JobSpec) -> JobSpec:
    assert spec.data.dataset is not None
    found = datasets.get(session=session, dataset_id=spec.data.dataset, project_id=project_id)
    if found is None:
        raise _data_error("dataset", f"no dataset {spec.data.dataset!r} in this project")
    if spec.data.format is not None and spec.data.format != found.format:
        raise _data_error(
            "format", f"the dataset's format is {found.format!r}, not {spec.data.format!r}"
        )
    unfit = method_data_error(spec.method.kind, found.format)
    if unfit is not None:
        raise _data_error("dataset", unfit)
    token_dtype = (found.stats or {}).get("token_dtype") if found.format == "tokens" else None
    update: dict[str, Any] = {
        "dataset": found.id,  # a name, pinned to the id it names now
        "format": found.format,
        "token_dtype": spec.data.token_dtype or token_dtype,
    }
    update |= dataset_filter(found, spec.data)
    return spec.model_copy(update={"data": spec.data.model_copy(update=update)})


def dataset_filter(found: Dataset, data: DataSpec) -> dict[str, list[str]]:
    """The `include` / `exclude` a job on the directory dataset `found` reads with: the
    dataset's filter travels with it. The job's `include`, when its spec sets one, replaces
    the dataset's; the excludes it sets add to the dataset's. Empty for a dataset without a kept
    filter (a file, or registered before filters were kept)."""
    if found.include is None or found.exclude is None:
        return {}
    include = data.include if "include" in data.model_fields_set else list(found.include)
    own = data.exclude if "exclude" in data.model_fields_set else []
    exclude = list(found.exclude) + [x for x in own if x not in found.exclude]
    return {"include": include, "exclude": exclude}


def _check_data_uri(uri: str, settings: Settings, field: str = "uri") -> None:
    loc = ["body", "data", field]
    if storage.is_remote(uri):
        try:
            storage.remote_under(uri, settings)
        except Forbidden as exc:
            raise Forbidden(
                f"data.{field}: {exc.message}", details=[{**d, "loc": loc} for d in exc.details]
            ) from None
        return
    try:
        path = storage.resolve_under(
            uri.removeprefix("file://"), storage.allowed_data_roots(settings)
        )
        exists = path.exists()
    except Forbidden as exc:
        raise Forbidden(exc.message, details=[{**d, "loc": loc} for d in exc.details]) from None
    except (OSError, RuntimeError, ValueError) as exc:  # unknown ~user, name too long, ...
        raise _data_error(field, f"not a usable path: {exc}") from None
    if not exists:
        raise _data_error(field, f"{uri!r} does not exist on the server")


def _data_error(field: str, msg: str) -> InvalidInput:
    return InvalidInput(
        f"data.{field}: {msg}",
        details=[{"loc": ["body", "data", field], "msg": msg, "type": "value_error"}],
    )
