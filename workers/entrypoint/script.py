"""Preparing one node's attempt of an `entrypoint` job (docs/CONTRACTS.md section 5).

The job's code archive is fetched from storage (fsspec) and unpacked into `RUN_DIR/code/`
(`core.jobs.code_archives.unpack`, which checks it again) for each attempt on each node (so is a
built-in trainer GRPO job's `method.grpo.code`, `unpack_grader_code`); the job's
Python is the worker's, or with `requirements` a cached virtual environment
(`workers.entrypoint.venvs`), whose installer writes into the job's logs as torchrun's own output
does (rank -1, stream `stdout`). A failed install fails the attempt as a `user_error`, not retried.
Then the job's declared inputs are placed on the host (`workers.inputs`: fetched into the host's
cache from an object store); a fetch that fails is retried as an `infra` failure.

Checkpoints: with local storage the job's checkpoint directory is handed to the program as a
local path. With remote storage the program gets a local staging directory, holding the job's
newest recorded checkpoint downloaded before the attempt starts, and the worker uploads each
checkpoint the program completes (`workers.entrypoint.staging`); a multi-node entrypoint job on
remote storage is refused at launch (each host would stage a part of each checkpoint).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import fsspec
from sqlalchemy.orm import Session

from core.attempts.lifecycle_policy import FailureClass
from core.jobs import code_archives
from core.platform.errors import InvalidInput
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri, job_run_dir
from core.platform.tables import CodeArchive, Job
from jobspec.job import JobSpec, ScriptJobSpec
from workers import inputs
from workers.attempt import Unlaunched, with_db_retry
from workers.checkpoints import set_aside_unrecorded
from workers.entrypoint.staging import stage_latest, staging_dir
from workers.entrypoint.venvs import InstallFailed, InstallStopped, ensure_venv
from workers.ingest import RunIngest
from workers.launcher import RunPaths

log = logging.getLogger(__name__)


def venv_root(settings: Settings) -> Path:
    """`TORCHYARD_VENV_DIR`, default `TORCHYARD_HOME/venvs`: the host's job environments."""
    return (settings.venv_dir or settings.home / "venvs").resolve()


def prepare(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    spec: ScriptJobSpec,
    *,
    node_rank: int | None,
    node_index: int,
    nproc: int,
    beat: Callable[[], bool] | None = None,
    worker: str = "",
) -> RunPaths:
    """Create the run dir of this node's attempt, unpack the code, resolve the Python.

    `node_rank`: the run dir's node part (None: a single node); `node_index`: the node's rank
    in the gang (0 for a single node: its logs' ranks); `nproc`: its ranks; `beat`: the job's
    heartbeat, called while requirements install or inputs are fetched (False: the attempt is
    over; stop); `worker`: this worker's name, in the inputs' events. Raises
    InvalidInput (the archive is gone), Unlaunched (the install failed: its
    output is stored as the job's rank -1 log first; or it was stopped), OSError.
    """
    archive = _archive(factory, job, spec.entrypoint.code, "entrypoint.code")
    storage_dir = job_checkpoint_uri(settings, job.id).removeprefix("file://")
    if settings.is_local_storage:
        Path(storage_dir).mkdir(parents=True, exist_ok=True)
    if job.attempt > 1 and not node_rank:
        with_db_retry(
            factory,
            lambda s: set_aside_unrecorded(
                session=s, job_id=job.id, attempt=job.attempt, root=storage_dir
            ),
        )
    checkpoint_dir, remote = storage_dir, None
    if not settings.is_local_storage:
        staging, remote = staging_dir(settings, job.id), storage_dir
        with_db_retry(
            factory, lambda s: stage_latest(s, job_id=job.id, staging=staging, remote=remote)
        )
        checkpoint_dir = str(staging)
    paths = RunPaths(
        run_dir=job_run_dir(settings, job.id, job.attempt, node_rank),
        checkpoint_dir=checkpoint_dir,
        checkpoint_remote=remote,
        checkpoint_keep_last=spec.entrypoint.keep_last_checkpoints,
        checkpoint_nodes=spec.resources.nodes,
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.spec.write_text(spec.model_dump_json(indent=2))
    _unpack(archive.uri, archive.format, archive.unpacked_bytes, paths)
    python = _python(settings, factory, job, spec, paths, node_index, nproc, beat)
    try:  # last: the cache entries it holds are released with the returned paths
        placed = inputs.place(settings, factory, job, spec, beat=beat, worker=worker)
    except inputs.FetchStopped as exc:  # fail_unlaunched: cancelled, paused or lost
        raise Unlaunched(str(exc), FailureClass.INFRA) from None
    except inputs.FetchFailed as exc:  # the object store, or a copy that differs: retried
        raise Unlaunched(str(exc), FailureClass.INFRA, retryable=True) from None
    return dataclasses.replace(
        paths,
        python=python,
        placed_inputs=tuple(placed.paths.items()),
        input_holds=placed,
    )


def unpack_grader_code(
    factory: Callable[[], Session], job: Job, paths: RunPaths, code: str | None = None
) -> RunPaths:
    """A GRPO job's `method.grpo.code` (or `code`: an eval job's, its GRPO source's) unpacked
    into `paths.code_dir` as an entrypoint job's code is (the program's `--code-dir`, where its
    python graders' files are); `paths` as they are for a job without one. Raises InvalidInput
    (the archive is gone), OSError."""
    if code is None:
        grpo = job.spec.method.grpo if isinstance(job.spec, JobSpec) else None
        code = grpo.code if grpo is not None else None
    if code is None:
        return paths
    archive = _archive(factory, job, code, "method.grpo.code")
    _unpack(archive.uri, archive.format, archive.unpacked_bytes, paths)
    return dataclasses.replace(paths, grader_code=True)


def _archive(factory: Callable[[], Session], job: Job, archive_id: str, field: str) -> CodeArchive:
    """The job's project's archive `archive_id` (named by the spec's `field`). Raises
    InvalidInput when it is gone."""
    archive = with_db_retry(
        factory,
        lambda s: code_archives.get(session=s, archive_id=archive_id, project_id=job.project_id),
    )
    if archive is None:
        raise InvalidInput(f"{field}: code archive {archive_id!r} not found")
    return archive


def _unpack(uri: str, fmt: str, unpacked_bytes: int, paths: RunPaths) -> None:
    """Copy the archive at `uri` next to the run dir and unpack it into `paths.code_dir`
    (emptied first: a redelivered attempt starts from the archive as uploaded)."""
    local = paths.run_dir / f"code.{fmt}"
    with fsspec.open(uri, "rb") as src, local.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(paths.code_dir, ignore_errors=True)
    code_archives.unpack(local, paths.code_dir, max_unpacked_bytes=unpacked_bytes)
    local.unlink()


def _python(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    spec: ScriptJobSpec,
    paths: RunPaths,
    node_rank: int,
    nproc: int,
    beat: Callable[[], bool] | None,
) -> str:
    """The job's interpreter; the installer's output goes to torchrun's own stdout file, which
    the node's ingest stores as rank -1 (and, on failure, stored here before raising)."""
    requirements = spec.entrypoint.requirements
    with paths.launcher_log("stdout").open("ab") as out:
        try:
            return ensure_venv(
                requirements, root=venv_root(settings), log=out, base_env=os.environ, beat=beat
            )
        except InstallFailed as exc:
            failed = exc
        except InstallStopped as exc:  # fail_unlaunched: cancelled, paused or lost
            raise Unlaunched(str(exc), FailureClass.INFRA) from None
    ingest = RunIngest(
        paths=paths, job_id=job.id, attempt=job.attempt, node_rank=node_rank, nproc=nproc
    )
    try:
        ingest.flush(factory, final=True)
    except Exception:  # the failure still stands without its stored log
        log.exception("job %s: could not store the installer's output", job.id)
    raise Unlaunched(str(failed), FailureClass.USER_ERROR, log_tail=failed.log_tail)
