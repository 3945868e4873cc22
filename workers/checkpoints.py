"""Keep a resumed attempt consistent with what the database knows.

The trainer resumes from the highest complete `step_XXXXXXXX` under its checkpoint dir
(CONTRACTS.md). A worker that dies (SIGKILL, lost node) may leave a checkpoint on storage whose
`checkpoint` event, and the metrics of the steps before it, never reached the database: resuming
from it would leave those steps missing from the metric series for good. Before the next
attempt starts, such unrecorded checkpoints are moved aside to `unrecorded/` (kept, not
deleted), so the trainer resumes from the latest *recorded* one and the lost steps run, and are
reported, again (metric points are keyed by step: they are stored once).
"""

from __future__ import annotations

import logging
import re

import fsspec
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Checkpoint

log = logging.getLogger(__name__)

# The trainer's `step_XXXXXXXX` and, for `transformers.Trainer` scripts (`torchyard.train`
# resumes from those too), the Trainer's own `checkpoint-N`.
_STEP_DIR = re.compile(r"^(?:step_(\d{8})|checkpoint-(\d+))$")
ASIDE = "unrecorded"


def set_aside_unrecorded(*, session: Session, job_id: int, attempt: int, root: str) -> list[int]:
    """Move the checkpoint dirs (`step_XXXXXXXX`, `checkpoint-N`) under `root` that the job has
    no checkpoint row for to `root/unrecorded/<name>.a{attempt}`; returns their steps."""
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.isdir(path):
        return []
    recorded = set(
        session.execute(select(Checkpoint.step).where(Checkpoint.job_id == job_id)).scalars()
    )
    moved = []
    for entry in fs.ls(path, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        match = _STEP_DIR.match(name)
        step = None if match is None else int(match[1] or match[2])
        if step is None or step in recorded:
            continue
        fs.makedirs(f"{path}/{ASIDE}", exist_ok=True)
        fs.mv(entry, f"{path}/{ASIDE}/{name}.a{attempt}", recursive=True)
        moved.append(step)
    if moved:
        log.warning(
            "job %s attempt %s: checkpoints at steps %s were never recorded (their worker was "
            "lost); moved to %s/ so the run resumes from the latest recorded one",
            job_id,
            attempt,
            moved,
            ASIDE,
        )
    return sorted(moved)
