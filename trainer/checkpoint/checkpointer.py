"""Sharded checkpoints of a dict of `Stateful` objects with `torch.distributed.checkpoint`.

Layout (docs/CONTRACTS.md): `ROOT/step_{step:08d}/` holds DCP's shard files, `.metadata`
(written last, atomically, by the coordinator rank) and `spec.json` (the spec that made the
run: checkpoints carry their config). A checkpoint is complete iff `.metadata` exists; the
run resumes from the highest complete step. Local roots use `FileSystemWriter/Reader`, other
URIs DCP's fsspec writer/reader; listing and deleting go through `fsspec`.

Per-rank state (RNG) is stored under `NAME_rank{r}` so each rank gets its own back; when the
checkpoint came from a smaller world and has no such key, that state keeps its fresh value.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import fsspec
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.stateful import Stateful

from dataformat.errors import CheckpointWriteError, InvalidJobError
from jobspec.job import STORED, CheckpointSpec, JobSpec
from trainer.data.byte_tokenizer import is_uri
from trainer.distributed import DistInfo, broadcast_from_rank0
from trainer.events import Reporter

log = logging.getLogger(__name__)
METADATA = ".metadata"
SPEC_FILE = "spec.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
# A stand-alone process saves and loads with no_dist=True and DCP warns about it on every
# call, also from async_save's writer thread (out of reach of a scoped catch_warnings).
warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")


@dataclass(frozen=True)
class CheckpointDir:
    step: int
    uri: str
    complete: bool


def step_uri(root: str, step: int) -> str:
    return f"{root.rstrip('/')}/step_{step:08d}"


def list_checkpoints(root: str) -> list[CheckpointDir]:
    """All `step_XXXXXXXX` directories under `root`, by step; `complete` iff `.metadata`."""
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.isdir(path):
        return []
    found = []
    for entry in fs.ls(path, detail=False):
        match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
        if match:
            step = int(match.group(1))
            complete = fs.exists(f"{entry.rstrip('/')}/{METADATA}")
            found.append(CheckpointDir(step, step_uri(root, step), complete))
    return sorted(found, key=lambda c: c.step)


def latest_complete(root: str) -> CheckpointDir | None:
    """The complete checkpoint with the highest step, or None."""
    complete = [c for c in list_checkpoints(root) if c.complete]
    return complete[-1] if complete else None


def directory_size(uri: str) -> int:
    """Total bytes of the files under `uri`."""
    fs, path = fsspec.core.url_to_fs(uri)
    return int(fs.du(path, total=True))


def dcp_cause(exc: BaseException) -> BaseException:
    """The error behind `exc`: DCP reports a failed write as a `CheckpointException` (a
    BaseException, which `except Exception` and torchrun's `@record` let through) holding each
    failed rank's own exception (`failures`: rank -> (exception, traceback)); the lowest
    rank's is returned. Any other exception is its own cause."""
    if isinstance(exc, CheckpointException) and exc.failures:
        failure = exc.failures[min(exc.failures)]
        return failure[0] if isinstance(failure, tuple) else failure
    return exc


class Checkpointer:
    """Saves and restores `states` (+ per-rank `rank_states`) under `root`.

    `save(step)` is the public guard (is a checkpoint due?); `_save` does the work. With
    `spec.async_save`, `dcp.async_save` stages the state and writes it in a thread, over a
    gloo group of its own so its collectives never interleave with training's; the previous
    save is awaited before the next one and in `close()`. The `checkpoint` event and the
    retention of `keep_last` complete checkpoints follow each completed save.
    """

    def __init__(
        self,
        *,
        root: str,
        spec: CheckpointSpec,
        states: dict[str, Stateful],
        rank_states: dict[str, Stateful],
        job_spec_json: str,
        dist_info: DistInfo,
        reporter: Reporter,
        reporting_rank: int = 0,
    ) -> None:
        self.root = root
        self.spec = spec
        self.states = states
        self.rank_states = rank_states
        self.job_spec_json = job_spec_json
        self.dist = dist_info
        self.reporter = reporter
        self.reporting_rank = reporting_rank  # reports and applies retention
        self.last_saved_step: int | None = None
        self.last_saved_uri: str | None = None
        self._pending: tuple[int, str, Future[Any], float] | None = None
        self._pg = (
            dist.new_group(backend="gloo") if spec.async_save and dist_info.is_distributed else None
        )

    def _state_dict(self) -> dict[str, Any]:
        """A fresh dict for one DCP call (`dcp.load` replaces its values with plain dicts)."""
        own = {f"{name}_rank{self.dist.rank}": s for name, s in self.rank_states.items()}
        return {**self.states, **own}

    def load_latest(self) -> int | None:
        """Restore the highest complete checkpoint; returns its step, or None if there is none.

        Rank 0 picks the checkpoint and tells the others, so all ranks load the same one.
        """
        found = broadcast_from_rank0(latest_complete(self.root), self.dist)
        if found is None:
            return None
        state = self._state_dict()
        saved_keys = _reader(found.uri).read_metadata().state_dict_metadata.keys()
        for key in [k for k in state if k.endswith(f"_rank{self.dist.rank}")]:
            if not any(k == key or k.startswith(f"{key}.") for k in saved_keys):
                log.warning("checkpoint %s has no %s; keeping it fresh", found.uri, key)
                del state[key]
        dcp.load(state, storage_reader=_reader(found.uri), no_dist=not self.dist.is_distributed)
        self.last_saved_step, self.last_saved_uri = found.step, found.uri
        log.info("resumed from %s", found.uri)
        return found.step

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoint at `step` if it is due (every `interval_steps`, or `force`) and new."""
        if step == self.last_saved_step:
            return
        if force or step % self.spec.interval_steps == 0:
            try:
                self._save(step)
            except CheckpointWriteError:
                raise
            except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
                cause = dcp_cause(exc)
                raise CheckpointWriteError(f"checkpoint at step {step}: {cause}") from cause

    def _save(self, step: int) -> None:
        self.wait()
        uri = step_uri(self.root, step)
        if self.dist.rank == 0:
            fs, path = fsspec.core.url_to_fs(uri)
            fs.makedirs(path, exist_ok=True)
            fs.pipe_file(f"{path}/{SPEC_FILE}", self.job_spec_json.encode("utf-8"))
        started = time.perf_counter()
        if self.spec.async_save:
            result = dcp.async_save(
                self._state_dict(),
                storage_writer=_writer(uri),
                process_group=self._pg,
                no_dist=not self.dist.is_distributed,
            )
            if isinstance(result, AsyncSaveResponse):
                result = result.upload_completion
            self._pending = (step, uri, result, started)
        else:
            dcp.save(
                self._state_dict(),
                storage_writer=_writer(uri),
                no_dist=not self.dist.is_distributed,
            )
            self._completed(step, uri, started)
        self.last_saved_step, self.last_saved_uri = step, uri

    def poll(self) -> None:
        """Finish the bookkeeping of an async save that has completed; never blocks."""
        if self._pending is not None and self._pending[2].done():
            self.wait()

    def wait(self) -> None:
        """Block until the pending async save (if any) is complete, then report it.

        Raises `CheckpointWriteError` from whatever the save raised.
        """
        if self._pending is None:
            return
        step, uri, future, started = self._pending
        self._pending = None
        try:
            future.result()
        except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
            cause = dcp_cause(exc)
            raise CheckpointWriteError(f"checkpoint at step {step} to {uri}: {cause}") from cause
        self._completed(step, uri, started)

    def close(self) -> None:
        """Wait for the last save."""
        self.wait()

    def _completed(self, step: int, uri: str, started: float) -> None:
        if self.dist.rank != self.reporting_rank:
            return
        size = directory_size(uri)
        log.info("checkpoint %s: %d bytes in %.2f s", uri, size, time.perf_counter() - started)
        self.reporter.checkpoint(step=step, uri=uri, size_bytes=size)
        self._apply_retention()

    def _apply_retention(self) -> None:
        """Delete complete checkpoints beyond the newest `keep_last`, and incomplete ones
        older than the newest complete one (debris of a crashed attempt: saves run one at a
        time, so none of those is in progress). Newer incomplete ones are never touched."""
        found = list_checkpoints(self.root)
        complete = [c for c in found if c.complete]
        if not complete:
            return
        keep = {c.step for c in complete[-self.spec.keep_last :]}
        newest = complete[-1].step
        fs, _ = fsspec.core.url_to_fs(self.root)
        for c in found:
            if (c.complete and c.step not in keep) or (not c.complete and c.step < newest):
                log.info("retention: deleting %s", c.uri)
                fs.rm(fsspec.core.url_to_fs(c.uri)[1], recursive=True)
                if c.complete:
                    self.reporter.checkpoint_deleted(step=c.step, uri=c.uri)


def _writer(uri: str) -> dcp.StorageWriter:
    return FsspecWriter(uri) if is_uri(uri) else dcp.FileSystemWriter(uri)


def checkpoint_spec(checkpoint_uri: str) -> JobSpec:
    """The `JobSpec` stored with a checkpoint (`spec.json`). Raises `FileNotFoundError`."""
    fs, path = fsspec.core.url_to_fs(checkpoint_uri)
    text = fs.cat_file(f"{path.rstrip('/')}/{SPEC_FILE}")
    return JobSpec.model_validate_json(text, context=STORED)


def _reader(uri: str) -> dcp.StorageReader:
    return FsspecReader(uri) if is_uri(uri) else dcp.FileSystemReader(uri)


def load_model_only(
    model: nn.Module, uri: str, *, dist_info: DistInfo, names: Collection[str] | None = None
) -> None:
    """Initialize `model` (any layout: DDP, FSDP2/TP DTensors, a pipeline rank's part) with
    the weights of the complete checkpoint at `uri`, whatever layout and world size saved it
    (DCP reshards by parameter name). Optimizer, schedule and step are not read. `names`:
    only these entries of the model's state dict (e.g. a LoRA run's trainable parameters,
    all its checkpoints hold); the others keep their values.

    Raises `InvalidJobError` when `uri` is no complete checkpoint, lacks one of the model's
    parameters, or holds one with another shape.
    """
    try:
        saved = _reader(uri).read_metadata().state_dict_metadata
    except (FileNotFoundError, OSError) as exc:
        raise InvalidJobError(f"init_from: {uri} is not a complete checkpoint: {exc}") from exc
    weights = get_model_state_dict(model)
    if names is not None:
        weights = {k: v for k, v in weights.items() if k in set(names)}
    state = {"model_optim": {"model": weights}}
    problems = []
    for name, tensor in weights.items():
        meta = saved.get(f"model_optim.model.{name}")
        shape = tuple(tensor.shape) if isinstance(tensor, Tensor) else ()
        size = tuple(getattr(meta, "size", ()))  # () for non-tensor (bytes) entries
        if meta is None:
            problems.append(f"{name} is missing")
        elif size != shape:
            problems.append(f"{name} has shape {size}, the model {shape}")
    if problems:
        raise InvalidJobError(
            f"init_from: checkpoint {uri} does not fit the model: {'; '.join(problems[:5])}"
        )
    dcp.load(state, storage_reader=_reader(uri), no_dist=not dist_info.is_distributed)
    set_model_state_dict(
        model, state["model_optim"]["model"], options=StateDictOptions(strict=names is None)
    )
    log.info("initialized the model from %s", uri)
