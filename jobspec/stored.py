"""Reading a job spec back from the database: never raises.

A stored spec was valid for the release that wrote it. A later release may have tightened,
renamed or added a field, and a row may have been written by hand, so reading one back is not
submitting one:

1. `upgrade` turns a spec of an older `spec_version` into the current one, one version at a
   time (`UPGRADES`), as a database migration does for a table;
2. the result is validated as a submission is (`parse_job_spec`), less the rules added since
   specs were stored (`jobspec.job.STORED`);
3. what still fails is read leniently (`read_stored_spec`): an unknown field is dropped, an
   invalid value falls back to its default, a missing required value gets a placeholder, and
   each such repair is recorded as a problem (`stored_problems`). The API shows the problems
   with the job and the worker refuses to start a job that has any (it would run a spec
   nobody wrote); reading, listing, following, cancelling and ingesting work as for any job.

Pure pydantic (the control plane imports it, as it imports `jobspec.job`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import ValidationError

from jobspec.job import (
    NAME_PATTERN,
    SPEC_VERSION,
    AnySpec,
    EvalJobSpec,
    JobSpec,
    ScriptJobSpec,
    SessionJobSpec,
    parse_job_spec,
    spec_kind,
)

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]

UPGRADES: Final[Mapping[int, Upgrade]] = {}
"""`n -> f`: `f` turns a spec of version `n` into one of version `n + 1`. Empty while version 1
is the only one; a release that changes the format bumps `SPEC_VERSION` and adds its step."""

# Values for required fields a stored spec lacks: enough to read the job, never to run it (a
# job with problems is not started). `name` is the job row's own name where the reader has it.
_PLACEHOLDERS: Final[Mapping[str, Any]] = {
    "name": "unreadable-spec",
    "data": {"dataset": "unknown"},
    "entrypoint": {"code": "code_0000000000000000", "command": ["false"]},
    "entrypoint.code": "code_0000000000000000",
    "entrypoint.command": ["false"],
}
_MAX_REPAIRS: Final = 8  # rounds of repair; each fixes every error the last validation named


def upgrade(
    raw: dict[str, Any], *, upgrades: Mapping[int, Upgrade] = UPGRADES, current: int = SPEC_VERSION
) -> tuple[dict[str, Any], list[str]]:
    """`raw` brought to version `current` by `upgrades`, and the problems met on the way (a
    version with no upgrade step, or a newer one than this release reads). Does not modify
    `raw`. A spec without `spec_version` is version 1 (the field has existed since the first
    release, with that default)."""
    version = raw.get("spec_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        return {**raw, "spec_version": current}, [
            f"spec_version: {version!r} is not a version; read as version {current}"
        ]
    if version > current:
        return {**raw, "spec_version": current}, [
            f"spec_version: {version} was written by a newer release (this one reads up to "
            f"{current}); read as version {current}"
        ]
    data = copy.deepcopy(raw)
    while version < current:
        step = upgrades.get(version)
        if step is None:
            return {**data, "spec_version": current}, [
                f"spec_version: {version} has no upgrade to {version + 1}; read as version "
                f"{current}"
            ]
        data = {**step(data), "spec_version": version + 1}
        version += 1
    return data, []


def read_stored_spec(raw: Any, *, name: str | None = None) -> AnySpec:
    """The spec stored as `raw` (a JSON object), upgraded and validated; never raises.

    A spec that is current and valid (every row the API wrote) is parsed once, as on submit.
    Otherwise each repair made to read it is recorded on the result (`stored_problems`):
    `name` (the job row's name) replaces a missing or invalid spec name."""
    if isinstance(raw, JobSpec | ScriptJobSpec | EvalJobSpec | SessionJobSpec):
        return raw
    try:
        return parse_job_spec(raw, stored=True)
    except (ValidationError, TypeError, ValueError):
        pass
    if not isinstance(raw, dict):
        data: dict[str, Any] = {}
        problems = [f"the stored spec is a {type(raw).__name__}, not an object"]
    else:
        data, problems = upgrade(raw)
    for _ in range(_MAX_REPAIRS):
        try:
            spec = parse_job_spec(data, stored=True)
        except ValidationError as exc:
            if not repair(data, exc, problems, name):
                break
        else:
            spec._stored_problems = problems
            return spec
    return _placeholder(raw, problems, name)


def stored_problems(spec: AnySpec) -> list[str]:
    """What `read_stored_spec` repaired to read `spec` (`field: what was wrong; what was
    used`); empty for a spec read as stored."""
    return list(spec._stored_problems)


def repair(
    data: dict[str, Any], exc: ValidationError, problems: list[str], name: str | None
) -> bool:
    """Fix, in place, every error `exc` names: drop an unknown or invalid field (its default
    applies), fill a missing required one. False when nothing could be changed."""
    changed = False
    for error in exc.errors():
        loc = tuple(error["loc"])
        if not loc:
            continue
        where = ".".join(str(part) for part in loc)
        if error["type"] == "missing":
            filler = _filler(loc, name)
            if filler is None or not _set(data, loc, filler):
                continue
            problems.append(f"{where}: missing in the stored spec; read as {filler!r}")
        else:
            field_loc = _field_loc(loc)
            if not _drop(data, field_loc):
                continue
            shown = ".".join(str(part) for part in field_loc)
            if error["type"] == "extra_forbidden":
                problems.append(f"{shown}: not a field of this release; ignored")
            else:
                problems.append(f"{shown}: {error['msg']}; its default used instead")
        changed = True
    return changed


def _field_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The field to drop for an error at `loc`: the field itself, or the list or mapping field
    that holds a bad item (its default applies as a whole)."""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            return loc[:i]
    return loc


def _filler(loc: tuple[Any, ...], name: str | None) -> Any:
    """The placeholder for the missing required field at `loc`; None when there is none."""
    if loc == ("name",) and name and re.fullmatch(NAME_PATTERN, name):
        return name
    return copy.deepcopy(_PLACEHOLDERS.get(".".join(str(part) for part in loc)))


def _parent(data: dict[str, Any], loc: tuple[Any, ...]) -> dict[str, Any] | None:
    node: Any = data
    for part in loc[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


def _drop(data: dict[str, Any], loc: tuple[Any, ...]) -> bool:
    parent = _parent(data, loc) if loc else None
    if parent is None or loc[-1] not in parent:
        return False
    del parent[loc[-1]]
    return True


def _set(data: dict[str, Any], loc: tuple[Any, ...], value: Any) -> bool:
    parent = _parent(data, loc)
    if parent is None:
        return False
    parent[loc[-1]] = value
    return True


def _placeholder(raw: Any, problems: list[str], name: str | None) -> AnySpec:
    """A spec of the stored kind that says only that it could not be read."""
    script = isinstance(raw, dict) and spec_kind(raw) == "script"
    label = _filler(("name",), name)
    spec: AnySpec = (
        ScriptJobSpec(name=label, entrypoint=_PLACEHOLDERS["entrypoint"])
        if script
        else JobSpec(name=label, data=_PLACEHOLDERS["data"])
    )
    spec._stored_problems = [*problems, "the stored spec could not be read; shown as a placeholder"]
    return spec
