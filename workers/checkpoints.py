"""Keep a resumed attempt consistent with what the database knows.

The trainer resumes from the highest complete `step_XXXXXXXX` under its checkpoint dir
(CONTRACTS.md). A worker that dies (SIGKILL, lost node) may leave a checkpoint on storage whose
`checkpoint` event, and the metrics of the steps before it, never reached the database: resuming
from it would leave those steps missing from the metric series for good. Before the next
attempt starts, such unrecorded checkpoints are moved aside to `unrecorded/` (kept, not
deleted), so the trainer resumes from the latest *recorded* one and the lost steps run, and are
reported, again (metric points are keyed by step: they are stored once).

The converse also happens: retention (`keep_last_checkpoints`) deletes a directory and writes a
`checkpoint_deleted` event that the dying worker never ingests. Such rows, whose directory under
the checkpoint root is gone, are forgotten at the same time, so the job lists only checkpoints
that exist.
"""

from __future__ import annotations

import logging
import re

import fsspec
from fsspec.implementations.local import LocalFileSystem
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.tables import Checkpoint

log = logging.getLogger(__name__)

# The trainer's `step_XXXXXXXX` and, for `transformers.Trainer` scripts (`torchyard.train`
# resumes from those too), the Trainer's own `checkpoint-N`.
STEP_DIR = re.compile(r"^(?:step_(\d{8,})|checkpoint-(\d+))$")
ASIDE = "unrecorded"


def set_aside_unrecorded(*, session: Session, job_id: int, attempt: int, root: str) -> list[int]:
    """Move the checkpoint dirs (`step_XXXXXXXX`, `checkpoint-N`) under `root` that the job has
    no checkpoint row for to `root/unrecorded/<name>.a{attempt}`, and delete (and commit) the
    rows of checkpoints under `root` whose dir is gone; returns the steps moved."""
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.isdir(path):
        return []
    rows = session.execute(select(Checkpoint).where(Checkpoint.job_id == job_id)).scalars().all()
    recorded = {row.step for row in rows}
    moved, present = [], set()
    for entry in fs.ls(path, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        match = STEP_DIR.match(name)
        step = None if match is None else int(match[1] or match[2])
        if step is not None:
            present.add(step)
        if step is None or step in recorded:
            continue
        fs.makedirs(f"{path}/{ASIDE}", exist_ok=True)
        _move_tree(fs, entry.rstrip("/"), f"{path}/{ASIDE}/{name}.a{attempt}")
        moved.append(step)
    if _forget_deleted(session, [r for r in rows if r.step not in present], path):
        session.commit()
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


def _move_tree(fs: fsspec.AbstractFileSystem, src: str, dst: str) -> None:
    """Move the directory `src` to `dst`: a rename on a local filesystem; on an object store,
    each object copied then the prefix deleted (s3fs's recursive `mv` also tries to copy the
    prefix's directory marker, a key that need not exist: `NoSuchKey`)."""
    if isinstance(fs, LocalFileSystem):
        fs.mv(src, dst, recursive=True)
        return
    fs.invalidate_cache(src)
    for key in fs.find(src):
        fs.copy(key, f"{dst}/{key[len(src) + 1 :]}")
    fs.rm(src, recursive=True)


def _forget_deleted(session: Session, missing: list[Checkpoint], root: str) -> bool:
    """Delete the rows of checkpoints recorded under `root` whose directory is gone (retention
    removed it, and its `checkpoint_deleted` event died with its worker); True when any was.
    No commit."""
    prefix = root.rstrip("/") + "/"
    gone = [r for r in missing if fsspec.core.url_to_fs(r.uri)[1].startswith(prefix)]
    for row in gone:
        session.delete(row)
    if gone:
        log.warning(
            "job %s: checkpoints at steps %s are recorded but gone from storage (retention "
            "removed them); forgotten",
            gone[0].job_id,
            [r.step for r in gone],
        )
    return bool(gone)
