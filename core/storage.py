"""Where files live: the storage root (local dir or fsspec URI) and paths under it."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from core.errors import Forbidden
from core.settings import Settings


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a local path or a URI."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def job_checkpoint_uri(settings: Settings, job_id: int) -> str:
    return join(settings.storage_url, "jobs", str(job_id), "checkpoints")


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
