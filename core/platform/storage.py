"""Where files live: the storage root (local dir or fsspec URI) and paths under it."""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import fsspec

from core.platform.errors import Forbidden, InvalidInput
from core.platform.settings import Settings


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a local path or a URI."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def job_checkpoint_uri(settings: Settings, job_id: int) -> str:
    return join(settings.storage_url, "jobs", str(job_id), "checkpoints")


def job_export_uri(settings: Settings, job_id: int, step: int) -> str:
    """Where the export of the job's checkpoint at `step` goes (beside `checkpoints/`, so the
    trainer's retention never touches it)."""
    return join(settings.storage_url, "jobs", str(job_id), "exports", f"step_{step:08d}")


def checkpoint_complete(uri: str) -> bool:
    """True when the DCP checkpoint directory `uri` has its `.metadata` (written last)."""
    fs, path = fsspec.core.url_to_fs(uri)
    return bool(fs.exists(f"{path.rstrip('/')}/.metadata"))


def file_size(uri: str) -> int | None:
    """The size of the file at `uri` in bytes; None when there is none."""
    fs, path = fsspec.core.url_to_fs(uri)
    try:
        return int(fs.size(path))
    except FileNotFoundError:
        return None


def read_chunks(uri: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of the file at `uri`, `chunk_bytes` at a time (never whole in memory).
    Raises FileNotFoundError."""
    with fsspec.open(uri, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            yield chunk


def sha256_of(uri: str) -> tuple[int, str]:
    """(size in bytes, hex sha256) of the file at `uri`, read in chunks. Raises
    FileNotFoundError."""
    digest, size = hashlib.sha256(), 0
    for chunk in read_chunks(uri):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def row_cache_dir(settings: Settings, project_id: str) -> Path:
    """The worker host's cache of tokenized training rows of project `project_id`
    (`trainer.data.prep`): local, since the trainer memory-maps them; shared by the project's
    jobs and attempts on the host. One per project: a job's sandbox may write its cache
    (`workers.program`), so a shared one would let one team's program plant rows that another
    team's job then trains on."""
    return settings.home.resolve() / "cache" / "rows" / project_id


def job_run_dir(
    settings: Settings, job_id: int, attempt: int, node_rank: int | None = None
) -> Path:
    """A local directory for one attempt's spec, events and logs (on the worker host).

    A node of a multi-node attempt gets `node_<rank>` under it: nodes may share a host.
    """
    base = settings.storage_path if settings.is_local_storage else settings.home.resolve()
    run_dir = base / "jobs" / str(job_id) / "runs" / f"attempt_{attempt}"
    return run_dir if node_rank is None else run_dir / f"node_{node_rank}"


def allowed_data_roots(settings: Settings) -> list[Path]:
    """Server-side directories a dataset may be registered from (or a job's `data.uri` name).

    The storage root is deliberately not one: it holds every project's uploads and
    checkpoints, and a path into it would read another project's files.
    """
    roots = [Path(sysconfig.get_paths()["stdlib"]).resolve()]
    roots += [Path(r).resolve() for r in settings.data_roots if "://" not in r]
    return roots


def resolve_under(path: str | os.PathLike[str], roots: list[Path]) -> Path:
    """`path` resolved (symlinks and `..` followed); raises Forbidden if it escapes every root."""
    resolved = Path(path).expanduser().resolve()
    for root in roots:
        if resolved == root or resolved.is_relative_to(root):
            return resolved
    raise Forbidden(
        f"path {str(path)!r} is outside the allowed data roots",
        details=[{"loc": ["body", "uri"], "msg": "outside allowed roots", "type": "forbidden"}],
    )


def is_remote(uri: str) -> bool:
    """Whether `uri` names an object store or other fsspec location (`s3://...`), not a
    local path or `file://` URI."""
    return "://" in uri and not uri.startswith("file://")


def remote_under(uri: str, settings: Settings) -> str:
    """`uri` (an object-store URI), without a trailing `/`, when it lies under a data root that
    is itself a URI (`TORCHYARD_DATA_ROOTS`, e.g. `s3://corpora/`); the storage bucket is
    deliberately not one (every project's uploads and checkpoints are there). Raises Forbidden
    (at `["body", "uri"]`) outside every such root or with a `..` segment."""
    prefixes = [r.rstrip("/") + "/" for r in settings.data_roots if is_remote(r)]
    if ".." in uri.split("/") or not any(uri.startswith(p) for p in prefixes):
        raise Forbidden(
            f"{uri!r} is outside the allowed data roots",
            details=[{"loc": ["body", "uri"], "msg": "outside allowed roots", "type": "forbidden"}],
        )
    return uri.rstrip("/")


def model_path(path_or_id: str, settings: Settings) -> Path | None:
    """A Hugging Face `model.hf.path_or_id` given as a server-side path, resolved: it must lie
    under an allowed data root, like `data.uri`. None for a hub id (`org/name`).

    Raises Forbidden (outside the roots) or InvalidInput (unusable path), both at
    `["body", "model", "hf", "path_or_id"]`.
    """
    if not path_or_id.startswith(("/", ".", "~", "file://")):
        return None
    loc = ["body", "model", "hf", "path_or_id"]
    try:
        return resolve_under(path_or_id.removeprefix("file://"), allowed_data_roots(settings))
    except Forbidden as exc:
        raise Forbidden(exc.message, details=[{**d, "loc": loc} for d in exc.details]) from None
    except (OSError, RuntimeError, ValueError) as exc:
        msg = f"not a usable path: {exc}"
        raise InvalidInput(
            f"model.hf.path_or_id: {msg}", details=[{"loc": loc, "msg": msg, "type": "value_error"}]
        ) from None
