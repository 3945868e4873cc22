"""Training clients of a session and their session jobs (issue 47, `session_models`).

`create_model` (the client's `create_lora_training_client`) makes a training client: a row
whose id is the client's `model_id` (`<session_id>:train:<model_seq_id>`, the form the client
builds itself for create-via-load) and a session job (`jobspec.job.SessionJobSpec`) that serves
it, made through the one door (`core.submission.service.SESSION`), queued, placed, sandboxed
and billed like any job. The call is answered at once with the model id: the model exists from
then on, and its calls queue for the job (`core.sessions.requests`). When its session ends
(`finish`, idle), its jobs are cancelled (`stop_jobs`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.errors import Gone, InvalidInput, NotFound
from core.platform.settings import BaseModelEntry, Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import (
    TERMINAL_STATES,
    Job,
    SessionModel,
    SessionRequest,
    SessionState,
    StateMark,
    TrainingSession,
    utcnow,
)
from core.sessions import marks, requests
from core.submission import service as submission
from jobspec.job import SessionJobSpec


@dataclass(frozen=True)
class NewModel:
    """`create_model`'s body, validated at the edge: the client's LoRA config."""

    session_id: str
    model_seq_id: int
    base_model: str
    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


def model_id(session_id: str, model_seq_id: int) -> str:
    """The client's id of a training client (`service_client.py:398-400`)."""
    return f"{session_id}:train:{model_seq_id}"


def create(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    owner: str | None,
    new: NewModel,
    body: bytes,
    request_key: str | None = None,
) -> SessionRequest:
    """The answered `create_model` request for `new`: a new training client and its session
    job, or, for a `model_seq_id` the session has already (a retried call), that one. Raises
    NotFound (a session not of the project), Gone (an ended session), InvalidInput at
    `body.base_model` (not registered) or at `body.model_seq_id` (taken by another base model),
    QuotaExceeded (the project's queue is full). No commit."""
    earlier = requests.find(session=session, project_id=project_id, request_key=request_key)
    if earlier is not None:  # the client's retry of this very call
        return earlier
    row = active_session(session, project_id, new.session_id)
    entry = _base_model(settings, new.base_model)
    mid = model_id(row.id, new.model_seq_id)
    existing = session.get(SessionModel, mid)
    if existing is not None and existing.base_model != new.base_model:
        msg = f"training client {new.model_seq_id} of the session is {existing.base_model!r}"
        raise InvalidInput(
            f"model_seq_id: {msg}",
            details=[{"loc": ["body", "model_seq_id"], "msg": msg, "type": "value_error"}],
        )
    stored = requests.NewRequest(session_id=row.id, kind="create_model", body=body)
    answer = {"model_id": mid, "type": "create_model"}
    if existing is None:
        job = submission.submit(
            session=session,
            settings=settings,
            project_id=project_id,
            spec=_spec(entry, new, mid, row.id),
            owner=owner,
            door=submission.SESSION,
            message=f"submitted: training client {mid} of session {row.id}",
        ).job
        session.add(
            SessionModel(
                id=mid,
                project_id=project_id,
                session_id=row.id,
                model_seq_id=new.model_seq_id,
                base_model=new.base_model,
                lora_rank=new.rank,
                job_id=job.id,
                created_at=utcnow(),
            )
        )
        session.flush()
    req, _ = requests.add(
        session=session, project_id=project_id, new=stored, request_key=request_key, answer=answer
    )
    return req


@dataclass(frozen=True)
class NewFromState:
    """A create-via-load (`create_training_client_from_state[_with_optimizer]`): a new training
    client `model_seq_id` of `session_id` whose LoRA is the saved state's at `path`, loaded as
    its first call (seq 0)."""

    session_id: str
    model_seq_id: int
    path: str
    optimizer: bool
    base_model: str | None = None


def create_from_state(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    owner: str | None,
    new: NewFromState,
    request_key: str | None = None,
) -> SessionRequest:
    """The load call that makes training client `new.model_seq_id` of the session from the
    saved state `new.path`: the client gets the base model and LoRA config (rank, seed,
    targets) of the training client that saved it, and a session job (`create`); the load is
    queued as its seq 0, so its later calls (from seq 1) run on the loaded state. Raises what
    `create` and `saved_state` raise, NotFound for a state of another project, InvalidInput at
    `body.base_model` for a registered name whose weights are not the state's base model's. No
    commit."""
    earlier = requests.find(session=session, project_id=project_id, request_key=request_key)
    if earlier is not None:  # the client's retry of this very call
        return earlier
    state = saved_state(session=session, settings=settings, project_id=project_id, path=new.path)
    source = state.source
    job = session.get(Job, source.job_id)
    assert job is not None and isinstance(job.spec, SessionJobSpec)  # a training client's job
    lora = job.spec.session
    base = new.base_model or source.base_model
    if base != source.base_model:
        own, other = settings.base_models.get(source.base_model), _base_model(settings, base)
        if own is None or own.path != other.path:
            msg = f"{base!r} is not the saved state's base model {source.base_model!r}"
            raise InvalidInput(
                f"base_model: {msg}",
                details=[{"loc": ["body", "base_model"], "msg": msg, "type": "value_error"}],
            )
    create(
        session=session,
        settings=settings,
        project_id=project_id,
        owner=owner,
        new=NewModel(
            session_id=new.session_id,
            model_seq_id=new.model_seq_id,
            base_model=base,
            rank=lora.lora_rank,
            seed=lora.lora_seed,
            train_mlp=lora.train_mlp,
            train_attn=lora.train_attn,
            train_unembed=lora.train_unembed,
        ),
        body=b"{}",
    )
    row, _ = requests.add(
        session=session,
        project_id=project_id,
        new=requests.NewRequest(
            session_id=new.session_id,
            kind="load_weights",
            body=state.load_body(new.path, new.optimizer),
            model_id=model_id(new.session_id, new.model_seq_id),
            seq_id=FROM_STATE_SEQ,
        ),
        request_key=request_key,
    )
    return row


FROM_STATE_SEQ = 0
"""The `seq_id` of a create-via-load's load: before the client's first own call (seq 1)."""


# Placements again after a lost worker (`retries.on.node_lost`); other failures end the session
# (a preemption is requeued anyway, without using this).
NODE_LOST_RESTARTS = 3


def _spec(entry: BaseModelEntry, new: NewModel, mid: str, session_id: str) -> SessionJobSpec:
    return SessionJobSpec.model_validate(
        {
            "name": f"session-{session_id}-train-{new.model_seq_id}",
            "labels": {"tinker.session": session_id, "tinker.model": mid},
            "seed": (new.seed or 0) % 2**31,
            "model": {"kind": "hf", "hf": {"path_or_id": entry.path}, "seq_len": entry.seq_len},
            "session": {
                "session_id": session_id,
                "model_id": mid,
                "base_model": new.base_model,
                "lora_rank": new.rank,
                "lora_seed": new.seed,
                "train_mlp": new.train_mlp,
                "train_attn": new.train_attn,
                "train_unembed": new.train_unembed,
            },
            "resources": {**entry.resources, "pool": entry.pool},
            # a lost worker's session is placed again and resumes from its last saved state
            # (`trainer.session`); the call its program held fails, nothing runs twice
            "retries": {"on": {"node_lost": NODE_LOST_RESTARTS}},
        }
    )


def active_session(session: Session, project_id: str, session_id: str) -> TrainingSession:
    row = session.get(TrainingSession, session_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"session {session_id[:100]!r} not found")
    if row.state != SessionState.ACTIVE:
        raise Gone(f"session {session_id} has ended: {row.ended_reason or 'ended'}")
    return row


def _base_model(settings: Settings, name: str) -> BaseModelEntry:
    entry = settings.base_models.get(name)
    if entry is not None:
        return entry
    near = difflib.get_close_matches(name, list(settings.base_models), n=1)
    msg = f"no registered base model {name[:200]!r}" + (
        f" (did you mean {near[0]!r}?)" if near else ""
    )
    raise InvalidInput(
        f"base_model: {msg}",
        details=[{"loc": ["body", "base_model"], "msg": msg, "type": "model_not_found"}],
    )


def get(*, session: Session, project_id: str, model_id: str) -> SessionModel:
    """The project's training client `model_id`. Raises NotFound (another project's too)."""
    row = session.get(SessionModel, model_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"model {model_id[:100]!r} not found")
    return row


def call(
    *,
    session: Session,
    project_id: str,
    new: requests.NewRequest,
    request_key: str | None = None,
) -> SessionRequest:
    """Queue `new`, a call of the project's training client `new.model_id` (`forward_backward`,
    `optim_step`, ...), for its session job; a retry with the same `request_key` finds the
    first. Raises NotFound (a model not of the project), Gone (its session has ended). No
    commit."""
    earlier = requests.find(session=session, project_id=project_id, request_key=request_key)
    if earlier is not None:
        return earlier
    assert new.model_id is not None
    model = get(session=session, project_id=project_id, model_id=new.model_id)
    active_session(session, project_id, model.session_id)
    row, _ = requests.add(
        session=session,
        project_id=project_id,
        new=replace(new, session_id=model.session_id),
        request_key=request_key,
    )
    return row


TINKER_SCHEME = "tinker://"


@dataclass(frozen=True)
class StatePath:
    """A saved state's path, resolved: the training client that saved it (`source`), the
    checkpoint directory of its session job (`root`) and the state's name."""

    source: SessionModel
    root: str
    name: str

    def load_body(self, path: str, optimizer: bool) -> bytes:
        """The body of a `load_weights` call of this state, as the session program reads it."""
        load = {"path": path, "name": self.name, "optimizer": optimizer, "source_root": self.root}
        return orjson.dumps(load)


def parse_path(path: str, kinds: tuple[str, ...], field: str) -> tuple[str, str, str]:
    """`tinker://<model_id>/<kind>/<name>` as (model_id, kind, name), `kind` one of `kinds` (the
    client's forms, docs/TINKER-WIRE.md). Raises InvalidInput at `body.<field>` for another
    form."""
    parts = path.removeprefix(TINKER_SCHEME).split("/") if path.startswith(TINKER_SCHEME) else []
    if len(parts) != 3 or parts[1] not in kinds or not parts[0] or not parts[2]:
        forms = " or ".join(f"tinker://<model_id>/{kind}/<name>" for kind in kinds)
        msg = f"a {field} is {forms}"
        raise InvalidInput(
            f"{field}: {msg}",
            details=[{"loc": ["body", field], "msg": msg, "type": "value_error"}],
        )
    model_id, kind, name = parts
    return model_id, kind, name


def readable(*, session: Session, project_id: str, model_id: str, name: str) -> SessionModel:
    """The training client `model_id` whose state `name` the project may read: its own, or
    another project's published one (`marks.publish`). Raises NotFound for a state deleted or
    expired, and for another project's state that is not published, answered as a model that
    does not exist (another project learns nothing of it)."""
    row = session.get(SessionModel, model_id)
    mine = row is not None and row.project_id == project_id
    if row is None or not (mine or marks.published(session.get(StateMark, (model_id, name)))):
        raise NotFound(f"model {model_id[:100]!r} not found")
    marks.check_present(session, row.id, name)
    return row


def saved_state(*, session: Session, settings: Settings, project_id: str, path: str) -> StatePath:
    """The saved state at `path`, `tinker://<model_id>/weights/<name>`, of the project or
    published by another (`readable`). Raises InvalidInput at `body.path` for another form,
    NotFound as `readable`."""
    model_id, _, name = parse_path(path, ("weights",), "path")
    source = readable(session=session, project_id=project_id, model_id=model_id, name=name)
    return StatePath(source, job_checkpoint_uri(settings, source.job_id), name)


def stop_jobs(*, session: Session, session_ids: Sequence[str]) -> list[int]:
    """Cancel the running or queued session jobs of the sessions `session_ids` (they ended),
    and fail their unanswered calls. Returns the cancelled job ids. No commit."""
    if not session_ids:
        return []
    job_ids = session.scalars(
        select(Job.id)
        .join(SessionModel, SessionModel.job_id == Job.id)
        .where(SessionModel.session_id.in_(session_ids), Job.state.not_in(TERMINAL_STATES))
    ).all()
    for job_id in job_ids:
        jobs.cancel(session=session, job_id=job_id)
    requests.fail_open(session=session, session_ids=list(session_ids), reason="session ended")
    return list(job_ids)


def info(row: SessionModel, entry: BaseModelEntry | None) -> dict[str, object]:
    """`get_info`'s answer for a training client (`GetInfoResponse`)."""
    return {
        "model_id": row.id,
        "model_data": {
            "arch": "lora",
            "model_name": row.base_model,
            "tokenizer_id": entry.path if entry is not None else None,
        },
        "is_lora": True,
        "lora_rank": row.lora_rank,
        "model_name": row.base_model,
    }
