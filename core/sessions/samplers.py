"""Sampling clients of a session (issue 47): weights saved for sampling, sampling sessions of
them, and their `sample` calls.

- `save_weights_for_sampler` is a call of a training client, in its `seq_id` lane: its program
  takes a snapshot of the adapters, named (`tinker://<model_id>/sampler_weights/<name>`), or
  unnamed for `save_weights_and_get_sampling_client`, whose answer is a sampling session of it.
- A sampling session is stored as the client's `create_sampling_session` call, answered at
  once (`core.sessions.requests`): its request id is the `sampling_session_id`, its
  `model_id` the training client whose session job holds the weights, its body the weights'
  name. So it is the project's like any call (another project's id is NotFound), needs no
  table of its own, and its `sample` calls queue for that job.
- A `sample` call is queued for the owning training client with no `seq_id`: the relay hands
  it over as soon as it comes, and the program runs it between training calls (docs/CONTRACTS.md,
  "The session program"), never behind nor in the training lane.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from sqlalchemy.orm import Session

from core.platform.errors import NotFound
from core.platform.tables import SessionRequest
from core.sessions import requests, training_clients

CREATE = "create_sampling_session"
SAVE = "save_weights_for_sampler"
SAMPLE = "sample"
KIND = "sampler_weights"
EPHEMERAL = "~sampler-"  # unnamed weights: a name no client can give (`CheckpointName`)


def sampler_path(model_id: str, name: str) -> str:
    """The client's path of weights `name` saved for sampling by training client `model_id`."""
    return f"{training_clients.TINKER_SCHEME}{model_id}/{KIND}/{name}"


@dataclass(frozen=True)
class Sampler:
    """A sampling session: its id, the training client holding its weights, their name."""

    id: str
    model_id: str
    name: str
    base_model: str

    @property
    def path(self) -> str:
        return sampler_path(self.model_id, self.name)


def _create(
    session: Session, project_id: str, session_id: str, model_id: str, name: str
) -> SessionRequest:
    """The stored, answered `create_sampling_session` call of weights `name` of `model_id`."""
    stored = requests.NewRequest(
        session_id=session_id, kind=CREATE, body=orjson.dumps({"name": name}), model_id=model_id
    )
    row, _ = requests.add(session=session, project_id=project_id, new=stored, answer={})
    row.result = orjson.dumps({"sampling_session_id": row.id, "type": CREATE})  # its own id
    return row


def save(
    *,
    session: Session,
    project_id: str,
    model_id: str,
    seq_id: int,
    name: str | None,
    request_key: str | None = None,
) -> SessionRequest:
    """Queue a `save_weights_for_sampler` call of training client `model_id` in its `seq_id`
    lane; without `name`, with a new sampling session of the weights (named
    `~sampler-<seq_id>`: ephemeral) whose id its answer gives. Raises NotFound (a model not of
    the project), Gone (its session ended). No commit."""
    earlier = requests.find(session=session, project_id=project_id, request_key=request_key)
    if earlier is not None:
        return earlier
    model = training_clients.get(session=session, project_id=project_id, model_id=model_id)
    body: dict[str, str] = {"name": name or f"{EPHEMERAL}{seq_id}"}
    if name is None:
        sampler = _create(session, project_id, model.session_id, model_id, body["name"])
        body["sampling_session_id"] = sampler.id
    new = requests.NewRequest(
        session_id="", kind=SAVE, body=orjson.dumps(body), model_id=model_id, seq_id=seq_id
    )
    return training_clients.call(
        session=session, project_id=project_id, new=new, request_key=request_key
    )


def create(
    *, session: Session, project_id: str, session_id: str, model_path: str
) -> SessionRequest:
    """A new sampling session of the project's session `session_id` on the weights
    `model_path` (`tinker://<model_id>/sampler_weights/<name>`, saved by any training client of
    the project). Raises NotFound (a session or model not of the project), Gone (an ended
    session). No commit."""
    model_id, _, name = model_path.removeprefix(training_clients.TINKER_SCHEME).partition(
        f"/{KIND}/"
    )
    training_clients.active_session(session, project_id, session_id)
    training_clients.get(session=session, project_id=project_id, model_id=model_id)
    return _create(session, project_id, session_id, model_id, name)


def get(*, session: Session, project_id: str, sampler_id: str) -> Sampler:
    """The project's sampling session `sampler_id`. Raises NotFound (another project's too)."""
    try:
        row = requests.get(session=session, project_id=project_id, request_id=sampler_id)
    except NotFound:
        row = None
    if row is None or row.kind != CREATE or row.model_id is None:
        raise NotFound(f"sampling session {sampler_id[:100]!r} not found")
    model = training_clients.get(session=session, project_id=project_id, model_id=row.model_id)
    return Sampler(
        id=row.id,
        model_id=row.model_id,
        name=str(orjson.loads(row.body)["name"]),
        base_model=model.base_model,
    )


def sample(
    *,
    session: Session,
    project_id: str,
    sampler_id: str,
    request: dict[str, object],
    request_key: str | None = None,
) -> SessionRequest:
    """Queue a `sample` call (`request`: the client's validated `SampleRequest`) on sampling
    session `sampler_id`, for the session job of the training client holding its weights,
    outside its `seq_id` lane. Raises NotFound (a sampling session not of the project), Gone
    (the weights' session ended). No commit."""
    earlier = requests.find(session=session, project_id=project_id, request_key=request_key)
    if earlier is not None:
        return earlier
    sampler = get(session=session, project_id=project_id, sampler_id=sampler_id)
    body = orjson.dumps({**request, "name": sampler.name})
    new = requests.NewRequest(session_id="", kind=SAMPLE, body=body, model_id=sampler.model_id)
    return training_clients.call(
        session=session, project_id=project_id, new=new, request_key=request_key
    )
