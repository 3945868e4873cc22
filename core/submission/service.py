"""The one door every job comes in by.

`submit` is how a job is made, whoever makes it (`Door`: `POST /v1/jobs`, the OpenAI view's
`fine_tuning.jobs.create`, a sweep's trial, a training job's `eval_after`, a Tinker
session's `create_model`): the checks (`check`:
storable strings, a priced pool for `limits.max_cost`, then `core.jobs.references`), the
project's queue quota, the insert with its `queued` event (`core.jobs.service`), and the run
message sent after the commit (`core.jobs.outbox`). Nothing else inserts a job row
(tests/unit/project/test_one_door.py holds it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.jobs.references import check_references
from core.platform.settings import Settings
from core.platform.storable import require_storable
from core.scheduling import quotas
from core.usage import report as usage_report
from jobspec.job import AnySpec


@dataclass(frozen=True)
class Door:
    """Where a job comes from, and what that asks of `submit`.

    `checks`: run `check` on the spec (else it was checked where it was written: an
    `eval_after` spec with its training spec); `quota`: count it against the project's
    `max_queued_jobs` (an evaluation owed to a finished run is not refused); `commits`: insert
    and commit (replaying an `Idempotency-Key` race) rather than insert into the caller's
    open transaction."""

    name: str
    checks: bool = True
    quota: bool = True
    commits: bool = True


API = Door("api")
OPENAI = Door("openai")
SWEEP = Door("sweep")
EVAL_AFTER = Door("eval_after", checks=False, quota=False, commits=False)
# A session's training client (`core.sessions.training_clients.create`): its job, model row
# and first answer are one transaction.
SESSION = Door("session", commits=False)


def submit(
    *,
    session: Session,
    settings: Settings | None,
    project_id: str,
    spec: AnySpec,
    owner: str | None,
    door: Door,
    idempotency_key: str | None = None,
    submitted: AnySpec | None = None,
    message: str = "submitted",
) -> jobs.Created:
    """Make a queued job of `spec` for `project_id` through `door`; its run message goes to
    its pool after the commit (the session's `core.jobs.outbox` dispatch).

    `owner`: who submitted it (an API key's name); `idempotency_key`: the same key and spec
    return the first job (`created` False), the same key with another spec raises Conflict;
    `submitted`: the spec as its author wrote it when `spec` is already completed (a sweep's
    drawn spec), for that comparison; `settings`: needed by a door with `checks`.

    Raises InvalidInput (422), Forbidden (403), NotFound (404), Conflict (409) with the
    field's `["body", ...]` path, or QuotaExceeded (429, `Retry-After` from
    `settings.quota_retry_after_s`). A door that `commits` commits; another leaves the
    caller's transaction open.
    """
    checked = spec
    if door.checks:
        assert settings is not None, f"door {door.name} checks the spec: it needs settings"
        checked = check(session=session, settings=settings, project_id=project_id, spec=spec)
    if door.quota:
        quotas.check_submit(
            session=session,
            project_id=project_id,
            pool=checked.resources.pool,
            retry_after_s=settings.quota_retry_after_s if settings is not None else 0,
            idempotency_key=idempotency_key,
        )
    if door.commits:
        return jobs.create(
            session=session,
            project_id=project_id,
            spec=checked,
            idempotency_key=idempotency_key,
            owner=owner,
            submitted=submitted or spec,
            message=message,
            origin=door.name,
        )
    job = jobs.add_queued(
        session=session,
        project_id=project_id,
        spec=checked,
        idempotency_key=idempotency_key,
        owner=owner,
        digest=jobs.request_hash(submitted or spec),
        message=message,
        origin=door.name,
    )
    return jobs.Created(job=job, created=True)


def check(*, session: Session, settings: Settings, project_id: str, spec: AnySpec) -> AnySpec:
    """Every check a submission makes beyond the spec's own model (`POST /v1/spec/validate`
    runs it alone, `POST /v1/sweeps` on its base): storable strings, a priced pool for
    `limits.max_cost` (`core.usage.report.check_max_cost`), then `check_references`. Returns
    the spec completed (dataset format, `init_from` and inputs pinned).

    Raises InvalidInput (422), Forbidden (403), NotFound (404) or Conflict (409) with the
    field's `["body", ...]` path.
    """
    require_storable(spec.model_dump(), ("body",))
    usage_report.check_max_cost(spec, settings.slot_prices)
    return check_references(session=session, settings=settings, project_id=project_id, spec=spec)
