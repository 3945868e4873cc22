"""What a session test says when a call's answer does not come in time: instead of the client's
bare `TimeoutError`, the state of everything the answer depends on (the worker and API
processes, the session jobs and their events, the calls' rows, the logs' last lines). Two CI runs
saw session calls wait past 300 s where they take seconds; this is how the next one says why."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from sqlalchemy import Engine, select

from core.platform.db import session_scope
from core.platform.tables import Job, JobEvent, SessionModel, SessionRequest
from tests.integration.workers.controllers import Controller
from tests.integration.workers.helpers import Worker
from tests.support.sessions import ADAM, tinker_datums

TAIL_LINES = 40


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.exists():
        return f"--- {path}: none"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(line[:400] for line in text)


def _alive(name: str, proc: subprocess.Popen[Any] | None) -> str:
    if proc is None:
        return f"{name}: not started"
    code = proc.poll()
    return f"{name} (pid {proc.pid}): " + ("running" if code is None else f"exited {code}")


def _oom_kills() -> str:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "kernel log: unreadable"
    kills = [line for line in out.splitlines() if "out of memory" in line.lower()]
    return "kernel OOM kills: " + ("; ".join(kills[-5:]) if kills else "none")


@dataclass
class Stall:
    """Explains a wait on a session call of this module (`explain`); `api_log` is the API's
    `uvicorn.log`, `api` its process when the fixture holds it."""

    engine: Engine
    worker: Worker
    api_log: Path
    controller: Controller | None = None
    api: subprocess.Popen[Any] | None = None
    extra: list[Path] = field(default_factory=list)

    def explain(self) -> str:
        lines = [
            _alive("worker", self.worker.proc),
            _alive("controller", self.controller.proc if self.controller else None),
            _oom_kills(),
        ]
        with session_scope(self.engine) as s:
            models = s.scalars(select(SessionModel).order_by(SessionModel.created_at)).all()
            for model in models[-3:]:
                job = s.get(Job, model.job_id)
                lines.append(
                    f"model {model.id}: job {model.job_id} "
                    + (f"{job.state} attempt {job.attempt} {job.error or ''}" if job else "none")
                )
                if job is not None:
                    events = s.scalars(
                        select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)
                    ).all()
                    lines += [
                        f"  event {e.created_at:%H:%M:%S.%f} {e.kind} {e.state_from}->"
                        f"{e.state_to} {e.message[:200]}"
                        for e in events[-8:]
                    ]
                calls = s.scalars(
                    select(SessionRequest)
                    .where(SessionRequest.model_id == model.id)
                    .order_by(SessionRequest.created_at)
                ).all()
                lines += [
                    f"  call {c.seq_id} {c.kind} {c.state} {c.error or ''}" for c in calls[-6:]
                ]
        lines += [_tail(self.worker.log_path), _tail(self.api_log, 20)]
        if self.controller is not None:
            lines.append(_tail(self.controller.log_path, 20))
        lines += [_tail(path, 20) for path in self.extra]
        return "\n".join(lines)

    def answer(self, future: Any, timeout_s: float) -> Any:
        """`future.result(timeout_s)`; past it, a failure that says what the call waited on.
        The call's own errors (`tinker.RequestFailedError`, ...) are raised as they are."""
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            pytest.fail(f"no answer in {timeout_s:.0f} s; what it waited on:\n{self.explain()}")

    def step(self, client: Any, batch: list[dict[str, np.ndarray]], timeout_s: float) -> float:
        """One training step of `client` on `batch` (`forward_backward(cross_entropy)` then
        `optim_step` with the session tests' `ADAM`), each answered within `timeout_s`; its
        `loss:sum`."""
        backward = client.forward_backward(tinker_datums(batch), "cross_entropy")
        step = client.optim_step(tinker.AdamParams(**ADAM))
        loss = self.answer(backward, timeout_s).metrics["loss:sum"]
        self.answer(step, timeout_s)
        return float(loss)
