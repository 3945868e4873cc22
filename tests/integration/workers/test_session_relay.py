"""Issue 47: the worker's relay of a session job's calls (`workers.watchers.session_relay`), on
the real database and run dir: a queued call is written for the program and marked running, its
answer is stored once and its file removed, and a new attempt fails the calls that a lost
program held instead of leaving their futures waiting forever."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.platform.db import session_scope
from core.platform.tables import RequestState, SessionRequest, TrainingSession
from core.sessions import requests
from core.sessions import service as sessions
from tests.conftest import ProjectKey
from workers.watchers.session_relay import LOST, SessionRelay, start_file


def _call(engine: Engine, project: ProjectKey, model_id: str, seq_id: int) -> str:
    with session_scope(engine) as s:
        session_id = model_id.split(":")[0]
        if s.get(TrainingSession, session_id) is None:
            row = sessions.create(
                session=s,
                project_id=project.project_id,
                owner=None,
                new=sessions.NewSession(tags=[], user_metadata={}, sdk_version="0.38.0"),
            )
            model_id = model_id.replace(session_id, row.id)
            session_id = row.id
        new = requests.NewRequest(
            session_id=session_id, kind="optim_step", body=b"{}", model_id=model_id, seq_id=seq_id
        )
        call, _ = requests.add(session=s, project_id=project.project_id, new=new)
        return call.id


def _state(engine: Engine, request_id: str) -> SessionRequest:
    with Session(engine, expire_on_commit=False) as s:
        row = s.get(SessionRequest, request_id)
        assert row is not None
        return row


def test_a_call_is_handed_over_once_and_its_answer_stored_once(
    engine: Engine, project: ProjectKey, tmp_path: Path
) -> None:
    request_id = _call(engine, project, "ses_x:train:0", 1)
    model_id = _state(engine, request_id).model_id
    assert model_id is not None
    start_file(lambda: Session(engine), tmp_path, model_id)
    assert json.loads((tmp_path / "session" / "start.json").read_text()) == {"next_seq": 1}
    relay = SessionRelay(
        session_factory=lambda: Session(engine), run_dir=tmp_path, model_id=model_id
    )

    relay.tick(0.0)
    handed = list((tmp_path / "session" / "in").iterdir())
    assert [p.name for p in handed] == [f"{1:012d}.{request_id}.optim_step"]
    assert _state(engine, request_id).state == RequestState.RUNNING
    handed[0].unlink()  # the program took it
    relay.tick(0.0)
    assert list((tmp_path / "session" / "in").iterdir()) == []  # not handed over again

    out = tmp_path / "session" / "out" / request_id
    out.write_bytes(b'{"type": "application/json"}\n{"metrics": {}}')
    relay.tick(0.0)
    row = _state(engine, request_id)
    assert (row.state, row.result, row.result_type) == (
        RequestState.DONE, b'{"metrics": {}}', "application/json")  # fmt: skip
    assert not out.exists()
    out.write_bytes(b'{"error": "late", "category": "server"}\n')  # a second answer: dropped
    relay.tick(0.0)
    assert _state(engine, request_id).state == RequestState.DONE


def test_a_new_attempt_fails_the_calls_a_lost_program_held_and_starts_after_them(
    engine: Engine, project: ProjectKey, tmp_path: Path
) -> None:
    held = _call(engine, project, "ses_y:train:0", 1)
    model_id = _state(engine, held).model_id
    assert model_id is not None
    queued = _call(engine, project, model_id, 2)
    with session_scope(engine) as s:
        requests.hand_over(session=s, request_ids=[held])  # the lost program had it

    start_file(lambda: Session(engine), tmp_path, model_id)
    row = _state(engine, held)
    assert (row.state, row.error, row.error_category) == (RequestState.FAILED, LOST, "server")
    assert _state(engine, queued).state == RequestState.QUEUED  # the new program runs it
    assert json.loads((tmp_path / "session" / "start.json").read_text()) == {"next_seq": 2}
