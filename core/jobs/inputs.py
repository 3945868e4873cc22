"""A team's program's declared inputs (`entrypoint.inputs`, `jobspec.inputs`): checked and
pinned at submission, located at launch.

At submission (`pin`) every input is checked against the submitting project and server, and
every problem is found in one pass: a dataset or job of another project is "not found" (404, no
oracle), a job without a complete checkpoint is a conflict (409), a path outside the data roots
is forbidden (403). A dataset is pinned to its id and `sha256`, a job to its latest complete
checkpoint, a base model to its registered location, so the job reads what its names named when
it was sent, however long it waits.

At launch (`locate`) the worker turns the pinned inputs into `Located` sources (a local path or
an object-store URI, and what identifies its content), which `workers.inputs` places.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.jobs import init_from
from core.platform import storage
from core.platform.errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, Dataset, Job
from jobspec.inputs import (
    AnyInput,
    BaseModelInput,
    CheckpointInput,
    DatasetInput,
    PathInput,
)
from jobspec.job import ScriptJobSpec

LOC = ("body", "entrypoint", "inputs")


def _problem(cls: type[DomainError], name: str, field: str, msg: str, kind: str) -> DomainError:
    return cls(
        f"entrypoint.inputs.{name}.{field}: {msg}",
        details=[{"loc": [*LOC, name, field], "msg": msg, "type": kind}],
    )


def pin(
    *, session: Session, settings: Settings, project_id: str, spec: ScriptJobSpec
) -> tuple[ScriptJobSpec, list[DomainError]]:
    """`spec` with each input pinned (a copy; `spec` itself without inputs), and every problem
    found, each a DomainError naming `entrypoint.inputs.<name>.<field>`: NotFound (no such
    dataset, base model, job or checkpoint in this project), Conflict (a job without a complete
    checkpoint; a dataset whose content no longer has the given `sha256`), Forbidden (a path
    outside the data roots), InvalidInput (a checkpoint of another job, a path that does not
    exist)."""
    inputs = spec.entrypoint.inputs
    if not inputs:
        return spec, []
    pinned: dict[str, AnyInput] = {}
    problems: list[DomainError] = []
    for name, given in inputs.items():
        try:
            pinned[name] = _pin_one(session, settings, project_id, name, given)
        except DomainError as exc:
            problems.append(exc)
            pinned[name] = given
    entry = spec.entrypoint.model_copy(update={"inputs": pinned})
    return spec.model_copy(update={"entrypoint": entry}), problems


def _pin_one(
    session: Session, settings: Settings, project_id: str, name: str, given: AnyInput
) -> AnyInput:
    if isinstance(given, DatasetInput):
        found = datasets.get(session=session, dataset_id=given.dataset, project_id=project_id)
        if found is None:
            msg = f"no dataset {given.dataset!r} in this project"
            raise _problem(NotFound, name, "dataset", msg, "not_found")
        if given.sha256 is not None and given.sha256 != found.sha256:
            msg = f"dataset {found.id} now has sha256 {found.sha256}, not {given.sha256}"
            raise _problem(Conflict, name, "sha256", msg, "conflict")
        return DatasetInput(dataset=found.id, sha256=found.sha256)
    if isinstance(given, BaseModelInput):
        entry = settings.base_models.get(given.base_model)
        if entry is None:
            known = ", ".join(sorted(settings.base_models)) or "none are registered"
            msg = f"no base model {given.base_model!r} (the server's: {known})"
            raise _problem(NotFound, name, "base_model", msg, "not_found")
        return BaseModelInput(base_model=given.base_model, uri=entry.path)
    if isinstance(given, CheckpointInput):
        checkpoint = _checkpoint(session, project_id, name, given)
        return CheckpointInput(job=given.job, checkpoint=checkpoint.id)
    assert isinstance(given, PathInput)
    _check_path(settings, name, given.path)
    return given


def _checkpoint(session: Session, project_id: str, name: str, given: CheckpointInput) -> Checkpoint:
    job = session.get(Job, given.job)
    if job is None or job.project_id != project_id:
        raise _problem(NotFound, name, "job", f"no job {given.job} in this project", "not_found")
    if given.checkpoint is None:
        latest = init_from.latest(session, job.id)
        if latest is None:
            msg = f"job {job.id} ({job.state}) has no complete checkpoint"
            raise _problem(Conflict, name, "job", msg, "conflict")
        return latest
    found = init_from.checkpoint_of_project(session, project_id, given.checkpoint)
    if found is None:
        msg = f"no checkpoint {given.checkpoint} in this project"
        raise _problem(NotFound, name, "checkpoint", msg, "not_found")
    checkpoint, owner = found
    if owner.id != job.id:
        msg = f"checkpoint {checkpoint.id} belongs to job {owner.id}, not job {job.id}"
        raise _problem(InvalidInput, name, "checkpoint", msg, "mismatch")
    return checkpoint


def _check_path(settings: Settings, name: str, path: str) -> None:
    try:
        if storage.is_remote(path):
            storage.remote_under(path, settings)
            return
        resolved = storage.resolve_under(
            path.removeprefix("file://"), storage.allowed_data_roots(settings)
        )
        exists = resolved.exists()
    except Forbidden as exc:
        raise _problem(Forbidden, name, "path", exc.message, "forbidden") from None
    except (OSError, RuntimeError, ValueError) as exc:  # unknown ~user, name too long, ...
        msg = f"not a usable path: {exc}"
        raise _problem(InvalidInput, name, "path", msg, "value_error") from None
    if not exists:
        raise _problem(InvalidInput, name, "path", f"{path!r} does not exist", "value_error")


def combine(problems: list[DomainError]) -> DomainError:
    """One error for `problems` (at least one): the error itself when alone, else one 422
    (`InvalidInput`) listing every detail, each keeping its own `type` (`not_found`,
    `conflict`, `forbidden`, ...)."""
    if len(problems) == 1:
        return problems[0]
    details = [d for p in problems for d in p.details]
    said = "; ".join(p.message for p in problems)
    return InvalidInput(f"{len(problems)} problems: {said}", details=details)


@dataclass(frozen=True, slots=True)
class Located:
    """Where one pinned input's content lies for the worker: `source`, a local path or an
    object-store URI (a file or a directory/prefix); `key`: what identifies the content (a
    dataset's sha256, a checkpoint's id and URI), the worker's cache key on object storage;
    `sha256`: a dataset's content hash as `core.datasets.service.digest_path` computes it,
    checked after a fetch (None for others: their listing is checked); `label`: for people."""

    name: str
    kind: str
    source: str
    key: str
    sha256: str | None
    label: str

    @property
    def remote(self) -> bool:
        return storage.is_remote(self.source)

    @property
    def local_path(self) -> str:
        return self.source.removeprefix("file://")


def locate(*, session: Session, project_id: str, spec: ScriptJobSpec) -> list[Located]:
    """The pinned inputs of `spec` (a job of `project_id`) as sources the worker can place.
    Raises InvalidInput when a dataset or checkpoint has gone since submission (deleted), or
    its content changed (a registered directory edited on the server)."""
    out = []
    for name, given in spec.entrypoint.inputs.items():
        out.append(_locate_one(session, project_id, name, given))
    return out


def _locate_one(session: Session, project_id: str, name: str, given: AnyInput) -> Located:
    where = f"entrypoint.inputs.{name}"
    if isinstance(given, DatasetInput):
        dataset = session.get(Dataset, given.dataset)
        if dataset is None or dataset.project_id != project_id:
            dataset = datasets.get(session=session, dataset_id=given.dataset, project_id=project_id)
        if dataset is None:
            raise InvalidInput(f"{where}: dataset {given.dataset!r} no longer exists")
        if given.sha256 is not None and dataset.sha256 != given.sha256:
            raise InvalidInput(f"{where}: dataset {dataset.id}'s content changed since submission")
        return Located(
            name, "dataset", dataset.uri, dataset.sha256, dataset.sha256, f"dataset {dataset.name}"
        )
    if isinstance(given, BaseModelInput):
        uri = given.uri
        if uri is None:  # stored without a pin: refused at submission since
            raise InvalidInput(f"{where}: base model {given.base_model!r} was never located")
        return Located(
            name, "base_model", uri, _key("base_model", uri), None, f"model {given.base_model}"
        )
    if isinstance(given, CheckpointInput):
        checkpoint = (
            session.get(Checkpoint, given.checkpoint)
            if given.checkpoint is not None
            else init_from.latest(session, given.job)
        )
        if checkpoint is None or checkpoint.job_id != given.job:
            raise InvalidInput(
                f"{where}: checkpoint {given.checkpoint or '(latest)'} of job {given.job} no "
                "longer exists (deleted by retention or with its job)"
            )
        key = _key("checkpoint", str(checkpoint.id), checkpoint.uri)
        label = f"job {given.job}'s checkpoint at step {checkpoint.step}"
        return Located(name, "checkpoint", checkpoint.uri, key, None, label)
    assert isinstance(given, PathInput)
    return Located(name, "path", given.path, _key("path", given.path), None, given.path)


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def content_key(key: str, listing: str) -> str:
    """The cache key of an input without a content hash of its own: its location's `key` and
    its `listing` (each object's path, size and ETag), hashed."""
    return _key(key, listing)


def describe(located: list[Located]) -> dict[str, Any]:
    """The inputs as the job's launch event shows them: name -> label."""
    return {item.name: item.label for item in located}
