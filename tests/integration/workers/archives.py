"""Code archives for entrypoint jobs in worker tests, kept through `core.jobs.code_archives.create`
(the upload route's service) rather than HTTP, and `STEPS_PY`, a light job for control-plane
tests."""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import code_archives
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey


def tar_gz(files: dict[str, str]) -> bytes:
    """A `.tar.gz` holding `files` ({name: text}, mode 0755), as a code upload's body."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def store_archive(
    engine: Engine, settings: Settings, project: ProjectKey, files: dict[str, str]
) -> str:
    """A `.tar.gz` of `files` kept as a code archive of `project` (`core.jobs.code_archives.create`,
    as `POST /v1/code` does); returns its id."""
    raw = tar_gz(files)
    local = settings.home / f"upload-{secrets.token_hex(4)}.tar.gz"
    local.write_bytes(raw)
    with Session(engine) as s:
        archive, _ = code_archives.create(
            session=s,
            storage_url=settings.storage_url,
            project_id=project.project_id,
            name="test",
            path=local,
            sha256=hashlib.sha256(raw).hexdigest(),
            size_bytes=len(raw),
            contents=code_archives.inspect(local, max_unpacked_bytes=1 << 30),
        )
        return archive.id


# Grows by 32 MiB of touched pages at a time up to 3 GiB (a bound, should no limit stop it).
OVER_PY = """
import sys
import torchyard.train as ty
ty.report(1, loss=1.0)
chunks = [bytearray(32 * 2**20) for _ in range(96)]
sys.exit(3)
"""

# A training program that trains nothing, for tests of the control plane (scheduling, slots, cancel,
# preemption): its ranks import no torch, so a job costs torchrun's start and little more, where the
# built-in trainer costs every rank about 6 CPU-s of imports and model set-up. `--steps` steps
# (declared with `set_max_steps`, so the queue has an ETA) reporting a loss that depends only on the
# step; a checkpoint (`state.json`) every `--checkpoint-every` steps and at a stop; a resumed
# attempt starts after the newest complete one. With `--gate NAME` the last step waits until the
# file NAME exists in the job's checkpoint directory (or a stop comes; `open_gate`), so a test
# decides when the job ends instead of racing its running time. (That directory: the job sees it,
# in its sandbox, from every attempt; a checkpoint is only a `step_N` directory in it.)
UNTIL_STOPPED = 1_000_000  # `steps_spec(steps=...)` of a job that runs until cancelled or paused
STEPS_PY = """
import argparse
import json
import os
import time
from pathlib import Path

import torchyard.train as ty

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--checkpoint-every", type=int, default=0)
parser.add_argument("--step-s", type=float, default=0.02)
parser.add_argument("--gate")
args = parser.parse_args()
gate = args.gate and Path(os.environ["TORCHYARD_CHECKPOINT_DIR"]) / args.gate


def save(step):
    path = ty.checkpoint_dir(step)
    (path / "state.json").write_text(json.dumps({"step": step}))
    ty.completed_checkpoint(path)


ty.set_max_steps(args.steps)
latest = ty.latest_checkpoint()
step = saved = json.loads((latest / "state.json").read_text())["step"] if latest else 0
ty.log_event("steps program started", start_step=step)
while step < args.steps:
    if gate and step == args.steps - 1:
        while not gate.exists() and not ty.should_stop():
            time.sleep(0.05)
    if ty.should_stop():
        break
    time.sleep(args.step_s)
    step += 1
    ty.report(step, loss=10.0 / (1 + step))
    if args.checkpoint_every and step % args.checkpoint_every == 0:
        save(step)
        saved = step
if ty.should_stop() and step > saved:
    save(step)
"""


def steps_spec(
    code: str,
    *,
    pool: str,
    steps: int,
    procs: int = 1,
    checkpoint_every: int = 0,
    step_s: float = 0.02,
    gate: str | None = None,
    **more: Any,
) -> ScriptJobSpec:
    """A job of `STEPS_PY` (archive `code`, from `store_archive(..., {"steps.py": STEPS_PY})`)
    on `procs` devices of `pool`, `step_s` seconds a step; `gate`: the name of the file its
    last step waits for (`open_gate`); `more`: other sections of the spec (e.g. `priority`)."""
    command = ["python", "steps.py", "--steps", str(steps)]
    command += ["--checkpoint-every", str(checkpoint_every), "--step-s", str(step_s)]
    if gate is not None:
        command += ["--gate", gate]
    body: dict[str, Any] = {
        "name": "steps",
        "entrypoint": {"code": code, "command": command},
        "resources": {"procs_per_node": procs, "pool": pool},
        **more,
    }
    return ScriptJobSpec.model_validate(body)


def open_gate(settings: Settings, job_id: int, gate: str) -> None:
    """Let job `job_id` (a `steps_spec(gate=gate)` job) take its last step: the file `gate` in
    its checkpoint directory (local storage), which every attempt of the job sees."""
    root = Path(job_checkpoint_uri(settings, job_id).removeprefix("file://"))
    root.mkdir(parents=True, exist_ok=True)
    (root / gate).touch()
