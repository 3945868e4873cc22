"""`SessionRelay`: the worker's side of a session job (issue 47), a watcher on its node.

The client never reaches the worker: its calls are rows of `session_requests`
(`core.sessions.requests`). Every `ACTIVE_INTERVAL_S` while its client is at work
(`IDLE_INTERVAL_S` when idle) the relay
1. stores the program's answers: each file `RUN_DIR/session/out/<request_id>` (a JSON header
   line, then the answer's bytes; `trainer.session`) becomes that running call's result or
   error, committed, then the file is removed; an answer to a call already settled (the session
   ended first) is dropped;
2. hands the training client's queued calls to the program: each is written atomically to
   `RUN_DIR/session/in/<seq_id:012d>.<request_id>.<kind>` first, then marked running (its
   sampling clients' `sample` calls, which have no `seq_id`, named by their arrival in
   microseconds instead: the program runs them as they come, outside the `seq_id` order; a
   `load_weights` with the checkpoint its `tinker://` path names copied into the run dir). A call is
   handed over again only if that mark was not committed, and the program answers a request
   once in its life, so no call runs twice.
When the program has exited (`close`), the calls it had and did not answer fail with category
`server`; calls still queued wait for the job's next attempt. `start_file` writes the first
`seq_id` a new program runs (`RUN_DIR/session/start.json`), before it starts, after failing
the calls a lost program held (its worker was killed, so no `close` ran).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import fsspec
from sqlalchemy.orm import Session

from core.attempts.lifecycle_policy import Stop
from core.platform.tables import SessionRequest
from core.sessions import requests, wakeup
from core.sessions.samplers import SAMPLE
from jobspec.job import SessionJobSpec
from jobspec.session import NAMES_FILE

log = logging.getLogger(__name__)

# How often the relay looks: while its client is at work (a call handed over and not answered
# yet, or one in the last BUSY_S), the database for new calls every ACTIVE_INTERVAL_S; an idle
# session every IDLE_INTERVAL_S (a query each time: an idle session costs 20 a second, not
# 100). With a Redis broker the API wakes the relay when it queues calls
# (`core.sessions.wakeup`), and the relay polls every IDLE_INTERVAL_S only, as a safety net.
# While the program holds a call, its outbox (a local directory, no query) every
# ANSWER_INTERVAL_S, so an answer is stored within ~1 ms of being written, not 10.
# bench.sessions: 82 -> 60-64 ms a tiny step, 7.9k -> 11.5k tokens/s batched, against a fixed
# 20 ms; 2026-11-30: each call held 19-21 -> 16-17.5 ms with wake-ups, polling 5x less.
ACTIVE_INTERVAL_S = 0.01
ANSWER_INTERVAL_S = 0.001
IDLE_INTERVAL_S = 0.05
BUSY_S = 2.0


def session_dir(run_dir: Path) -> Path:
    return run_dir / "session"


LOST = (
    "the session's program was lost before answering this call (its worker stopped); the "
    "session goes on from its last saved state"
)


def start_file(factory: Callable[[], Session], run_dir: Path, model_id: str) -> None:
    """Write `session/start.json` (`next_seq`: the first call the program runs) and create
    `session/in` and `session/out`, before the program starts."""
    root = session_dir(run_dir)
    (root / "in").mkdir(parents=True, exist_ok=True)
    (root / "out").mkdir(parents=True, exist_ok=True)
    with factory() as session:
        # calls an earlier attempt's program held when it was lost (its worker killed: no
        # `close` ran) will never be answered: they fail now, and are not run again
        lost = requests.fail_running(session=session, model_id=model_id, reason=LOST)
        first = requests.next_seq(session=session, model_id=model_id)
        session.commit()
    if lost:
        log.warning("session %s: %d calls of a lost program failed", model_id, lost)
    (root / "start.json").write_text(json.dumps({"next_seq": first}))


class SessionRelay:
    """The relay of one session job's node 0 (see the module docstring)."""

    def __init__(
        self,
        *,
        session_factory: Callable[[], Session],
        run_dir: Path,
        model_id: str,
        broker_url: str = "",
    ) -> None:
        self.wakeups = wakeup.Subscription(broker_url, model_id)
        self.interval_s = IDLE_INTERVAL_S
        self.outstanding = 0  # calls handed over and not answered yet
        self.busy_until = 0.0
        self.query_at = 0.0  # when the database is next asked for queued calls
        self.reason: str | None = None
        self.session_factory = session_factory
        self.inbox = session_dir(run_dir) / "in"
        self.outbox = session_dir(run_dir) / "out"
        self.loads = session_dir(run_dir) / "loads"
        self.model_id = model_id

    def wake_fd(self) -> int | None:
        """Readable when the API has queued calls for this client (`core.sessions.wakeup`):
        the supervisor then ticks the relay at once."""
        return self.wakeups.fileno()

    def tick(self, now: float) -> Stop | None:
        moved = self._store_answers()
        if self.wakeups.drain():
            self.query_at = now  # calls were queued: hand them over now, not at the next poll
        if now >= self.query_at:
            moved += self._hand_over()
        if moved:
            self.busy_until = now + BUSY_S
        busy = self.outstanding > 0 or now < self.busy_until
        if now >= self.query_at:
            # woken when calls are queued, the relay polls only as a safety net
            active = IDLE_INTERVAL_S if self.wakeups.fileno() is not None else ACTIVE_INTERVAL_S
            self.query_at = now + (active if busy else IDLE_INTERVAL_S)
        self.interval_s = ANSWER_INTERVAL_S if self.outstanding else max(0.0, self.query_at - now)
        return None

    def _store_answers(self) -> int:
        """Keep the program's answers as the calls' stored answers; how many."""
        done = [p for p in self.outbox.iterdir() if not p.name.startswith(".")]
        if not done:
            return 0
        with self.session_factory() as session:
            for path in done:
                header, _, body = path.read_bytes().partition(b"\n")
                answer = json.loads(header)
                if "error" in answer:
                    kept = requests.settle(
                        session=session,
                        request_id=path.name,
                        error=str(answer["error"]),
                        category=str(answer.get("category") or "server"),
                    )
                else:
                    kept = requests.settle(
                        session=session,
                        request_id=path.name,
                        result=body,
                        result_type=str(answer["type"]),
                    )
                if not kept:
                    log.info("call %s: answer dropped (already settled)", path.name)
            session.commit()
        for path in done:
            path.unlink(missing_ok=True)
        self.outstanding = max(0, self.outstanding - len(done))
        return len(done)

    def _hand_over(self) -> int:
        """Write the queued calls into the program's inbox and mark them running; how many."""
        with self.session_factory() as session:
            calls = requests.queued(session=session, model_id=self.model_id)
            if not calls:
                return 0
            for call in calls:
                name = f"{_lane_place(call):012d}.{call.id}.{call.kind}"
                temporary = self.inbox / f".{name}.tmp"
                body = self._place(call.id, call.body) if call.kind == "load_weights" else call.body
                temporary.write_bytes(body)
                os.replace(temporary, self.inbox / name)
            requests.hand_over(session=session, request_ids=[c.id for c in calls])
            session.commit()
        self.outstanding += len(calls)
        return len(calls)

    def _place(self, request_id: str, body: bytes) -> bytes:
        """A `load_weights` call's body for the program: the checkpoint its `tinker://` path
        names (`source_root`'s `tinker_names.json`, written by the session program that saved
        it), copied into `RUN_DIR/session/loads/<request_id>`, which the sandbox shows; or the
        error that it cannot be."""
        load = json.loads(body)
        fs, root = fsspec.core.url_to_fs(load["source_root"])
        names_path = f"{root.rstrip('/')}/{NAMES_FILE}"
        names = json.loads(fs.cat_file(names_path)) if fs.exists(names_path) else {}
        step = names.get(load["name"])
        source = f"{root.rstrip('/')}/step_{step:08d}" if step is not None else ""
        if step is None or not fs.exists(f"{source}/.metadata"):
            return json.dumps({"error": f"no saved state at {load['path']}"}).encode()
        target = self.loads / request_id
        for file in fs.find(source):
            local = target / file[len(source) :].lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(file, str(local))
        placed = {"checkpoint": str(target), "optimizer": load["optimizer"], "path": load["path"]}
        return json.dumps(placed).encode()

    def close(self) -> None:
        self.wakeups.close()
        try:
            self._store_answers()  # what the program answered before it exited
        except Exception:
            log.exception("session %s: could not store its last answers", self.model_id)
        with self.session_factory() as session:
            failed = requests.fail_running(
                session=session,
                model_id=self.model_id,
                reason="the session's program exited before answering this call",
            )
            session.commit()
        if failed:
            log.warning("session %s: %d unanswered calls failed", self.model_id, failed)


def _lane_place(call: SessionRequest) -> int:
    """A call's place in its lane, its file name's first part: a training call's `seq_id`; a
    `sample` call (no `seq_id`: the sampler lane) its arrival in microseconds."""
    if call.kind == SAMPLE:
        return int(call.created_at.timestamp() * 1_000_000)
    return call.seq_id or 0


def relay_for(
    session_factory: Callable[[], Session],
    spec: object,
    run_dir: Path,
    node_rank: int,
    broker_url: str = "",
) -> list[SessionRelay]:
    """The relay when the job is a session job and this is its node 0; else none. With a Redis
    `broker_url`, it is woken when calls are queued (`core.sessions.wakeup`)."""
    if not isinstance(spec, SessionJobSpec) or node_rank != 0:
        return []
    return [
        SessionRelay(
            session_factory=session_factory,
            run_dir=run_dir,
            model_id=spec.session.model_id,
            broker_url=broker_url,
        )
    ]
