"""An entrypoint job's checkpoints on a worker whose storage is remote (docs/CONTRACTS.md
section 5).

The user's program never holds the storage credentials (the environment allow-list keeps them
from it), so it cannot write to the bucket. It writes to a local staging directory instead
(`TORCHYARD_CHECKPOINT_DIR` = `<home>/staging/jobs/<id>/checkpoints`, `staging_dir`), and
`torchyard.train.completed_checkpoint()` marks a step complete there and writes its `checkpoint`
event. The worker (`CheckpointSync`, in a thread of its own so the ingest and the heartbeat go
on) uploads that directory to `<storage>/jobs/<id>/checkpoints/step_XXXXXXXX/`, the completion
marker last, and only then stores the event, with the remote URI: a checkpoint is recorded
(listed, resumable, exportable) only once it is whole in the bucket. The program's retention
(`checkpoint_deleted`) deletes the remote copy the same way; and since a resumed attempt's host
holds only the newest checkpoint, each upload also applies `keep_last_checkpoints` to the
bucket itself, so checkpoints of earlier attempts are pruned too.

Before an attempt starts, `stage_latest` empties this host's staging directory and downloads the
job's newest recorded checkpoint into it, so `torchyard.train.latest_checkpoint()` finds it on
whichever host the attempt runs.

A job of several nodes stages a part of each checkpoint on each host (the files its ranks
wrote there). Local rank 0 of every node but rank 0's declares its part with a
`checkpoint_part` event in its own node's run directory (`TORCHYARD_CHECKPOINT_PARTS`); that
node's worker uploads the part into the same remote step directory, then a marker
`.torchyard_node_<k>.attempt_<a>` (`k`: the gang's node index), and empties its staged copy (the
bucket is the checkpoint; the host's copy was only in transit). The worker of rank 0's node
uploads its own part, waits for every other node's marker of this attempt and only then writes
the completion marker and records the checkpoint; a part that never arrives (its host lost)
leaves the checkpoint unrecorded. Every node downloads the whole checkpoint
before an attempt, so a resumed rank finds whatever files it reads, on any host.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.storage import join
from core.platform.tables import Checkpoint
from workers.checkpoints import STEP_DIR

log = logging.getLogger(__name__)

#: `torchyard.train`'s completion marker: uploaded last, so a remote directory holding it is whole.
COMPLETE_MARKER = ".torchyard_complete"
SYNCED_KINDS = ("checkpoint", "checkpoint_deleted", "checkpoint_part")
PARTS_TIMEOUT_S = 120.0  # node 0 waits this long for the other nodes' parts of a checkpoint
_PARTS_POLL_S = 0.5


def part_marker(node_rank: int, attempt: int) -> str:
    """The name of the marker node `node_rank` uploads after its part of a checkpoint."""
    return f".torchyard_node_{node_rank}.attempt_{attempt}"


def staging_dir(settings: Settings, job_id: int) -> Path:
    """This host's staging directory for job `job_id`'s checkpoints (local disk)."""
    return settings.home.resolve() / "staging" / "jobs" / str(job_id) / "checkpoints"


def upload_dir(
    local: Path,
    remote: str,
    *,
    replace: bool = True,
    before_marker: Callable[[], None] = lambda: None,
) -> int:
    """Copy the directory `local` to `remote` (an fsspec URI), with `COMPLETE_MARKER` last
    (`before_marker` runs just before it: node 0 waits there for the other nodes' parts);
    `replace`: delete what is there first (a single node's checkpoint; not a part, whose
    directory the other nodes fill at the same time). Returns the bytes copied. Raises OSError
    (or the filesystem's error, or `before_marker`'s) when a transfer fails: `remote` is then
    incomplete, never marked."""
    fs, root = fsspec.core.url_to_fs(remote)
    if replace and fs.exists(root):
        fs.rm(root, recursive=True)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    marker = [p for p in files if p.relative_to(local).as_posix() == COMPLETE_MARKER]
    size = 0
    for path in [p for p in files if p not in marker]:
        fs.put_file(str(path), f"{root}/{path.relative_to(local).as_posix()}")
        size += path.stat().st_size
    if marker:
        before_marker()
        fs.put_file(str(marker[0]), f"{root}/{COMPLETE_MARKER}")
    return size


class CheckpointSync:
    """Uploads the checkpoints an entrypoint job stages under `staging` to `remote`, and
    deletes those its retention drops, one at a time in a thread of its own, in the order the
    program declared them.

    `take(event)` claims a `checkpoint` or `checkpoint_deleted` event; `ready()` hands back the
    events whose transfer is done, rewritten to the remote URI, for the ingest to store (after
    an upload, also a `checkpoint_deleted` event for each complete checkpoint in the bucket
    beyond the newest `keep_last`). An upload that fails is logged and its event replaced by an
    `info` event saying so: the checkpoint stays unrecorded (a resume uses the previous one)."""

    def __init__(
        self,
        *,
        job_id: int,
        staging: Path,
        remote: str,
        keep_last: int | None = None,
        attempt: int = 1,
        node_rank: int = 0,
        nnodes: int = 1,
        parts_timeout_s: float = PARTS_TIMEOUT_S,
    ) -> None:
        """`attempt`, `node_rank`, `nnodes`: this node's place (several nodes: each uploads its
        part; node 0 records a checkpoint once every part of this attempt is in)."""
        self.job_id = job_id
        self.staging = Path(os.path.normpath(staging))
        self.remote = remote
        self.keep_last = keep_last
        self.attempt, self.node_rank, self.nnodes = attempt, node_rank, nnodes
        self.parts_timeout_s = parts_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ckpt-sync-{job_id}")
        self._pending: deque[tuple[dict[str, Any], Future[list[dict[str, Any]]]]] = deque()

    def take(self, event: dict[str, Any]) -> bool:
        """Whether `event` is this one's to transfer (it is then queued, not to be stored now)."""
        if event.get("type") not in SYNCED_KINDS:
            return False
        self._pending.append((event, self._pool.submit(self._sync, event)))
        return True

    def pending(self) -> bool:
        return bool(self._pending)

    def ready(self, *, wait: bool = False) -> list[dict[str, Any]]:
        """The events of the transfers done so far, in the order taken (`wait`: of all of
        them, waiting for the rest)."""
        done = []
        while self._pending and (wait or self._pending[0][1].done()):
            event, future = self._pending.popleft()
            try:
                done += future.result()
            except Exception as exc:  # the thread's own failure: the event is not stored
                log.exception("job %s: checkpoint transfer failed", self.job_id)
                done.append(_failed(event, exc))
        return done

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _sync(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        local = Path(os.path.normpath(str(event.get("uri", ""))))
        if not local.is_relative_to(self.staging) or local == self.staging:
            return [_failed(event, ValueError(f"{local} is not under {self.staging}"))]
        remote = join(self.remote, local.relative_to(self.staging).as_posix())
        pruned: list[dict[str, Any]] = []
        try:
            if event["type"] == "checkpoint_part":
                self._upload_part(local, remote)
                return []  # node 0 records the checkpoint
            if event["type"] == "checkpoint":
                several = self.nnodes > 1
                size = upload_dir(
                    local,
                    remote,
                    replace=not several,
                    before_marker=(lambda: self._await_parts(remote)) if several else lambda: None,
                )
                log.info("job %s: checkpoint %s uploaded (%d bytes)", self.job_id, remote, size)
                pruned = self._prune()
            else:
                fs, path = fsspec.core.url_to_fs(remote)
                if fs.exists(path):
                    fs.rm(path, recursive=True)
        except Exception as exc:  # storage unreachable, the dir deleted meanwhile: not recorded
            log.warning("job %s: checkpoint transfer to %s failed: %s", self.job_id, remote, exc)
            return [_failed(event, exc)]
        return [{**event, "uri": remote}, *pruned]

    def _upload_part(self, local: Path, remote: str) -> None:
        """This node's part of a checkpoint: its files, then its marker; the staged copy is
        deleted (it was only in transit: a resume downloads the whole checkpoint)."""
        size = upload_dir(local, remote, replace=False)
        fs, root = fsspec.core.url_to_fs(remote)
        fs.pipe_file(f"{root}/{part_marker(self.node_rank, self.attempt)}", b"")
        shutil.rmtree(local, ignore_errors=True)
        log.info("job %s: node %d's part of %s uploaded (%d bytes)", self.job_id,
                 self.node_rank, remote, size)  # fmt: skip

    def _await_parts(self, remote: str) -> None:
        """Wait until every other node's part of this attempt is in `remote`. Raises
        TimeoutError after `parts_timeout_s` naming the nodes still missing.

        The node whose rank 0 records the checkpoint need not be the gang's node 0: torchrun's
        c10d rendezvous numbers the nodes in the order they joined, not by `--node-rank`."""
        fs, root = fsspec.core.url_to_fs(remote)
        deadline = time.monotonic() + self.parts_timeout_s
        missing = [k for k in range(self.nnodes) if k != self.node_rank]
        while True:
            fs.invalidate_cache(root)
            missing = [
                k for k in missing if not fs.exists(f"{root}/{part_marker(k, self.attempt)}")
            ]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no part from node(s) {missing} after {self.parts_timeout_s:.0f} s"
                )
            time.sleep(_PARTS_POLL_S)  # polling the bucket, with a deadline

    def _prune(self) -> list[dict[str, Any]]:
        """Delete the complete checkpoints in the bucket beyond the newest `keep_last`; their
        `checkpoint_deleted` events."""
        if self.keep_last is None:
            return []
        fs, root = fsspec.core.url_to_fs(self.remote)
        fs.invalidate_cache(root)
        complete = []
        for entry in fs.ls(root, detail=False):
            match = STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match is not None and fs.exists(f"{entry.rstrip('/')}/{COMPLETE_MARKER}"):
                complete.append((int(match[1] or match[2]), entry.rstrip("/")))
        complete.sort()
        events = []
        for step, entry in complete[: max(0, len(complete) - self.keep_last)]:
            fs.rm(entry, recursive=True)
            uri = join(self.remote, entry.rsplit("/", 1)[-1])
            events.append({"type": "checkpoint_deleted", "step": step, "uri": uri})
        return events


def _failed(event: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """An `info` event in place of a checkpoint event whose transfer failed."""
    verb = "upload" if event.get("type") == "checkpoint" else "remote deletion"
    step = event.get("step")
    return {
        "type": "info",
        "message": f"checkpoint at step {step}: {verb} failed ({type(exc).__name__}: {exc}); "
        "not recorded",
        "data": {"step": step, "failure": type(exc).__name__},
    }


def stage_latest(session: Session, *, job_id: int, staging: Path, remote: str) -> int | None:
    """Empty `staging` and download into it the job's newest recorded checkpoint whose remote
    copy is whole (has `COMPLETE_MARKER`); returns its step, None when there is none. Raises
    OSError (or the filesystem's error) when the download fails."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    rows = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc())
    ).scalars()
    prefix = remote.rstrip("/") + "/"
    for row in rows:
        if not row.uri.startswith(prefix):
            continue
        fs, path = fsspec.core.url_to_fs(row.uri)
        if not fs.exists(f"{path}/{COMPLETE_MARKER}"):
            continue
        target = staging / row.uri[len(prefix) :]
        root = path.rstrip("/")
        for name in fs.find(root):
            local = target / name[len(root) + 1 :]
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(name, str(local))
        log.info("job %s: staged checkpoint at step %d from %s", job_id, row.step, row.uri)
        return row.step
    return None
