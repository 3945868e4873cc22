"""Training runs and their checkpoints, as the Tinker client's `RestClient` reads them (issue 47:
`list_training_runs`, `get_training_run`, `list_checkpoints`, `list_user_checkpoints`,
`get_weights_info_by_tinker_path`, `delete_checkpoint`, `set_checkpoint_ttl`,
`publish_checkpoint`, `unpublish_checkpoint`).

A training run is a training client (`SessionModel`: `tinker://<model_id>/...` names its
states). Its checkpoints are the states it saved by name (`save_state`: the session job's
checkpoint directory, `step_<n>`, named in its `tinker_names.json` by `trainer.session_calls`),
each with the time and size of the job's `Checkpoint` row at that step. An unnamed checkpoint
(the state a stopped program kept) has no `tinker://` path and is not listed here; it is the
job's, in `/v1/jobs/{id}/checkpoints`.

Every function takes the caller's `project_id`: another project's run is NotFound, except
that `weights_info` reads another project's published state (`marks.publish`), as its loads do
(`training_clients.readable`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import fsspec
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.platform.errors import NotFound
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Checkpoint, Job, SessionModel, SessionRequest, TrainingSession
from core.sessions import marks, training_clients
from jobspec.job import SessionJobSpec
from jobspec.session import NAMES_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedState:
    """One named checkpoint of a training run: `tinker://<model_id>/weights/<name>`."""

    model_id: str
    name: str
    step: int
    created_at: datetime
    size_bytes: int | None
    expires_at: datetime | None = None
    public: bool = False  # published: other projects may read and load it

    @property
    def tinker_path(self) -> str:
        return f"{training_clients.TINKER_SCHEME}{self.model_id}/weights/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"weights/{self.name}"


@dataclass(frozen=True)
class Run:
    """A training run: its training client's row, its session's `owner` (the key or SSO subject
    that made it) and `user_metadata`, when its client last called it, and its named
    checkpoints, oldest first."""

    row: SessionModel
    owner: str | None
    user_metadata: dict[str, str]
    last_request_at: datetime
    checkpoints: list[SavedState]


def page(
    *, session: Session, settings: Settings, project_id: str, limit: int, offset: int
) -> tuple[list[Run], int]:
    """The project's training runs, newest first, `limit` of them after `offset`, and how many
    there are."""
    base = select(SessionModel).where(SessionModel.project_id == project_id)
    total = int(session.scalar(select(func.count()).select_from(base.subquery())) or 0)
    rows = session.scalars(
        base.order_by(SessionModel.created_at.desc(), SessionModel.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [_run(session, settings, row) for row in rows], total


def get(*, session: Session, settings: Settings, project_id: str, model_id: str) -> Run:
    """The project's training run `model_id`. Raises NotFound (another project's too)."""
    row = training_clients.get(session=session, project_id=project_id, model_id=model_id)
    return _run(session, settings, row)


def _run(session: Session, settings: Settings, row: SessionModel) -> Run:
    owner = session.get(TrainingSession, row.session_id)
    last = session.scalar(
        select(func.max(SessionRequest.created_at)).where(SessionRequest.model_id == row.id)
    )
    metadata = {} if owner is None else {str(k): str(v) for k, v in owner.user_metadata.items()}
    return Run(
        row,
        None if owner is None else owner.owner,
        metadata,
        last or row.created_at,
        saved_states(session, settings, row),
    )


def all_states(*, session: Session, settings: Settings, project_id: str) -> list[SavedState]:
    """Every named state of the project's training runs, newest first (one storage read per
    run)."""
    rows = session.scalars(select(SessionModel).where(SessionModel.project_id == project_id))
    states = [state for row in rows for state in saved_states(session, settings, row)]
    return sorted(states, key=lambda s: (s.created_at, s.model_id, s.step), reverse=True)


def saved_states(session: Session, settings: Settings, row: SessionModel) -> list[SavedState]:
    """The named states of training client `row`, by step: its job's `tinker_names.json`
    joined to the job's checkpoint rows. A names file the storage cannot read is logged and
    lists none (the run itself still reads)."""
    root = job_checkpoint_uri(settings, row.job_id)
    try:
        fs, base = fsspec.core.url_to_fs(root)
        path = f"{base.rstrip('/')}/{NAMES_FILE}"
        names: dict[str, int] = json.loads(fs.cat_file(path)) if fs.exists(path) else {}
    except (OSError, ValueError) as exc:
        log.warning("training run %s: its checkpoint names are unreadable: %s", row.id, exc)
        return []
    rows = {
        c.step: c
        for c in session.scalars(select(Checkpoint).where(Checkpoint.job_id == row.job_id))
    }
    marked = marks.of(session, row.id)
    states = []
    for name, step in names.items():
        mark = marked.get(name)
        if marks.gone(mark):
            continue  # deleted, or past its expiry
        found = rows.get(int(step))
        when: datetime | None = None if found is None else found.created_at
        if when is None:  # saved, its `checkpoint` event not stored yet: the storage's time
            when = _modified(fs, f"{base.rstrip('/')}/step_{int(step):08d}")
        size = None if found is None else found.size_bytes
        expires = None if mark is None else mark.expires_at
        public = marks.published(mark)
        states.append(
            SavedState(row.id, name, int(step), when or row.created_at, size, expires, public)
        )
    return sorted(states, key=lambda s: (s.step, s.name))


@dataclass(frozen=True)
class WeightsInfo:
    """`get_weights_info_by_tinker_path`'s answer: what loading saved weights needs."""

    base_model: str
    lora_rank: int
    train_mlp: bool
    train_attn: bool
    train_unembed: bool


def weights_info(
    *, session: Session, settings: Settings, project_id: str, path: str
) -> WeightsInfo:
    """The base model and adapter shape of the weights at `path`,
    `tinker://<model_id>/weights/<name>` (a state `save_state` named, listed) or
    `tinker://<model_id>/sampler_weights/<name>` (sampler weights, read as the training client
    that saved them; the project's own only). Raises InvalidInput at `body.tinker_path` for
    another form, NotFound as `_present` (another project's published state is read)."""
    kinds = ("weights", "sampler_weights")
    model_id, kind, name = training_clients.parse_path(path, kinds, "tinker_path")
    if kind == "weights":
        row = _present(session, settings, project_id, model_id, name, readers=True)
    else:
        row = training_clients.get(session=session, project_id=project_id, model_id=model_id)
    job = session.get(Job, row.job_id)
    spec = None if job is None else job.spec
    lora = spec.session if isinstance(spec, SessionJobSpec) else None
    return WeightsInfo(
        base_model=row.base_model,
        lora_rank=row.lora_rank,
        train_mlp=True if lora is None else lora.train_mlp,
        train_attn=True if lora is None else lora.train_attn,
        train_unembed=True if lora is None else lora.train_unembed,
    )


def _present(
    session: Session,
    settings: Settings,
    project_id: str,
    model_id: str,
    name: str,
    *,
    readers: bool = False,
) -> SessionModel:
    """The project's training client `model_id` and its listed state `name` (with `readers`,
    also another project's published state: `training_clients.readable`). Raises NotFound
    (another project's run, a name it never saved, a deleted or expired state)."""
    if readers:
        row = training_clients.readable(
            session=session, project_id=project_id, model_id=model_id, name=name
        )
    else:
        row = training_clients.get(session=session, project_id=project_id, model_id=model_id)
    if name not in {s.name for s in saved_states(session, settings, row)}:
        raise NotFound(f"training run {model_id[:100]!r} has no state {name[:100]!r}")
    return row


def delete_state(
    *, session: Session, settings: Settings, project_id: str, model_id: str, name: str
) -> None:
    """`delete_checkpoint`: the state is no longer listed nor loadable (`marks`). Raises
    NotFound as `_present`. No commit."""
    _present(session, settings, project_id, model_id, name)
    marks.delete(session, model_id, name)


def set_state_ttl(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    model_id: str,
    name: str,
    ttl_seconds: int | None,
) -> None:
    """`set_checkpoint_ttl`: the state expires `ttl_seconds` from now (None: never). Raises
    NotFound as `_present`. No commit."""
    _present(session, settings, project_id, model_id, name)
    marks.set_ttl(session, model_id, name, ttl_seconds)


def publish_state(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    model_id: str,
    name: str,
    public: bool,
) -> None:
    """`publish_checkpoint` (`public`) or `unpublish_checkpoint`: every project may read and
    load the state, or its own project alone again (`marks.publish`: idempotent). Raises
    NotFound as `_present` (only the owner's project publishes). No commit."""
    _present(session, settings, project_id, model_id, name)
    marks.publish(session, model_id, name, public)


def _modified(fs: fsspec.AbstractFileSystem, path: str) -> datetime | None:
    try:
        return fs.modified(path).replace(tzinfo=None)
    except (OSError, NotImplementedError, ValueError):
        return None
