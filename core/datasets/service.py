"""Datasets: registered server-side paths or uploaded files, with size, sha256, format and stats
recorded (records are checked by core/datasets/formats.py before any row is written)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import fsspec
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.access.auth import new_id
from core.datasets import formats as dataset_formats
from core.datasets.stats import DatasetStats
from core.platform import storage
from core.platform.errors import Conflict, InvalidInput, NotFound, Unavailable
from core.platform.settings import Settings
from core.platform.tables import Dataset, utcnow
from dataformat import text as dataset_text
from dataformat.errors import InvalidJobError
from dataformat.readers import list_files
from jobspec.data import DataSpec

_CHUNK = 1 << 20
DEFAULT_INCLUDE: list[str] = DataSpec.model_fields["include"].default
DEFAULT_EXCLUDE: list[str] = DataSpec.model_fields["exclude"].default
LEFT_OUT_EXAMPLES = 20  # files named in `left_out.examples`; the counts cover all
# Not part of a corpus: byte-code caches, VCS data, and the third-party packages that live
# inside the standard library directory of an installed Python.
SKIP_DIRS = frozenset({"__pycache__", ".git", "site-packages", "dist-packages"})


def digest_path(path: Path) -> tuple[int, str, int]:
    """(size_bytes, sha256 hex, num_files) of a file or a directory tree.

    A directory's digest hashes each file's relative path and content digest, in sorted order,
    so it changes when any file is added, removed, renamed or edited.
    """
    if path.is_file():
        size, digest = _file_digest(path)
        return size, digest, 1
    files = sorted(
        p for p in path.rglob("*") if p.is_file() and not SKIP_DIRS.intersection(p.parts)
    )
    tree = hashlib.sha256()
    total = 0
    for file in files:
        size, digest = _file_digest(file)
        total += size
        tree.update(f"{file.relative_to(path).as_posix()}\0{digest}\n".encode())
    return total, tree.hexdigest(), len(files)


def tree_files(fs: Any, root: str) -> list[tuple[str, int]]:
    """(path relative to `root`, size in bytes) of every file under the directory `root` of the
    fsspec filesystem `fs`, in path order, without `SKIP_DIRS` (as `digest_path` counts them)."""
    root = root.rstrip("/")
    return sorted(
        (path[len(root) + 1 :], int(info.get("size") or 0))
        for path, info in fs.find(root, detail=True).items()
        if not SKIP_DIRS.intersection(path[len(root) + 1 :].split("/"))
    )


def digest_remote(uri: str) -> tuple[int, str, int] | None:
    """(size_bytes, sha256 hex, num_files) of the object or prefix at `uri` (an object-store
    URI), hashed as `digest_path` hashes a local file or tree (every byte read, streamed); None
    when nothing is there. Raises OSError (or the store client's error) when it cannot be read."""
    fs, root = fsspec.core.url_to_fs(uri)
    if fs.isfile(root):
        size, digest = storage.sha256_of(uri)
        return size, digest, 1
    if not fs.isdir(root):
        return None
    tree, total = hashlib.sha256(), 0
    listed = tree_files(fs, root)
    for rel, _ in listed:
        size, digest = storage.sha256_of(f"{uri.rstrip('/')}/{rel}")
        total += size
        tree.update(f"{rel}\0{digest}\n".encode())
    return total, tree.hexdigest(), len(listed)


def _file_digest(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def register(
    *,
    session: Session,
    settings: Settings,
    project_id: str,
    name: str,
    uri: str,
    format: str | None = None,
    token_dtype: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Dataset:
    """Register a server-side file or directory under an allowed root, or an object or prefix
    of an object store under a data root that is a URI (`s3://corpora/`: read through fsspec
    with the server's credentials, as jobs read it). Commits.

    A file is checked record by record as `format` (None: detected; a `text` file must be
    UTF-8 text without NUL bytes). A directory is `text`: its files are those `include` (glob
    patterns; default `**/*`) selects minus `exclude` (fnmatch; default the spec's: installed
    packages, byte-code caches, `.git`), a filter kept with the dataset that every job on it
    applies; each selected file is read whole, and those that are not UTF-8 text (a static
    library, a wheel, an icon: the standard library's directory holds all three) are left out
    and listed in `left_out`, never read by a job.
    Raises Forbidden (escapes the roots), InvalidInput (missing, empty, a record format or a
    filter on a single file, a filter that selects no text file, or invalid records: line/row
    and field path per detail), Conflict (name taken), Unavailable (the object store cannot be
    read).
    """
    if storage.is_remote(uri):
        location = storage.remote_under(uri, settings)
        try:
            fs, root = fsspec.core.url_to_fs(location)
            is_file = bool(fs.isfile(root))
            digest = digest_remote(location)
        except Exception as exc:  # botocore's connection errors are no OSError
            raise Unavailable(f"cannot read {uri!r}: {type(exc).__name__}: {exc}") from None
    else:
        path = storage.resolve_under(uri, storage.allowed_data_roots(settings))
        digest = digest_path(path) if path.exists() else None
        location, is_file = str(path), path.is_file()
    if digest is None:
        raise InvalidInput(
            f"{uri!r} does not exist on the server",
            details=[{"loc": ["body", "uri"], "msg": "does not exist", "type": "value_error"}],
        )
    size, sha256, num_files = digest
    if size == 0:
        raise InvalidInput(
            f"{uri!r} is empty",
            details=[{"loc": ["body", "uri"], "msg": "no data", "type": "value_error"}],
        )
    checked = dataset_formats.Checked("text", None)
    if is_file:
        checked = check(
            settings=settings,
            uri=location,
            format=format,
            token_dtype=token_dtype,
            where=("body", "uri"),
        )
    elif format not in (None, "text"):
        raise InvalidInput(
            f"format: a {format} dataset is one file; {uri!r} is a directory",
            details=[{"loc": ["body", "format"], "msg": "needs a file", "type": "value_error"}],
        )
    left_out: dict[str, Any] | None = None
    if is_file:
        for field, given in (("include", include), ("exclude", exclude)):
            if given is not None:
                raise InvalidInput(
                    f"{field}: chooses files of a directory; {uri!r} is a file",
                    details=[
                        {"loc": ["body", field], "msg": "needs a directory", "type": "value_error"}
                    ],
                )
    else:
        include = list(include if include is not None else DEFAULT_INCLUDE)
        exclude = list(exclude if exclude is not None else DEFAULT_EXCLUDE)
        try:
            left_out = text_files(location, include, exclude)
        except (InvalidInput, OSError):
            raise
        except Exception as exc:  # botocore's connection errors are no OSError
            raise Unavailable(f"cannot read {uri!r}: {type(exc).__name__}: {exc}") from None
    return create(
        session=session,
        project_id=project_id,
        name=name,
        uri=location,
        size_bytes=size,
        sha256=sha256,
        num_files=num_files,
        format=checked.format,
        stats=checked.stats,
        include=include,
        exclude=exclude,
        left_out=left_out,
    )


def text_files(location: str, include: list[str], exclude: list[str]) -> dict[str, Any]:
    """What `include` minus `exclude` selects under the directory `location`, read whole
    (`dataformat.text.classify`): `{"files", "bytes"}` left out as binary of `{"of_files",
    "of_bytes"}` selected, the first `LEFT_OUT_EXAMPLES` of them (`examples`: `{"path",
    "size_bytes", "reason"}`), and the text files with stray bytes a job drops
    (`repaired_files`, the first few in `repaired`).
    Raises InvalidInput when the filter selects no file or only binary ones, OSError when a
    file cannot be read."""
    where = {"loc": ["body", "include"], "type": "value_error"}
    try:
        files = list_files(location, include, exclude)
    except InvalidJobError:
        msg = f"no file matches include {include} minus exclude {exclude}"
        raise InvalidInput(f"include: {msg}", details=[{**where, "msg": msg}]) from None
    found = dataset_text.classify(files)
    if len(found.binary) == len(files):
        msg = f"none of the {len(files)} selected files is UTF-8 text ({found.binary[0].reason})"
        raise InvalidInput(f"include: {msg}", details=[{**where, "msg": msg}])

    def named(files: list[dataset_text.NotText]) -> list[dict[str, Any]]:
        return [
            {"path": f.path, "size_bytes": f.size_bytes, "reason": f.reason}
            for f in files[:LEFT_OUT_EXAMPLES]
        ]

    return {
        "files": len(found.binary),
        "bytes": sum(f.size_bytes for f in found.binary),
        "of_files": len(files),
        "of_bytes": found.total_bytes,
        "examples": named(found.binary),
        "repaired_files": len(found.repaired),
        "repaired": named(found.repaired),
    }


def check(
    *,
    settings: Settings,
    uri: str,
    format: str | None,
    token_dtype: str | None,
    where: tuple[str, ...],
) -> dataset_formats.Checked:
    """Validate the file at `uri` (streamed) as `format`, or detect it. Raises InvalidInput
    with the first 100 problems (line or row, field path) and their total in the message."""
    return dataset_formats.check(
        uri,
        declared=format,
        token_dtype=token_dtype,
        max_record_bytes=settings.max_record_bytes,
        where=where,
    )


def create(
    *,
    session: Session,
    project_id: str,
    name: str,
    uri: str,
    size_bytes: int,
    sha256: str,
    num_files: int,
    format: str = "text",
    stats: DatasetStats | None = None,
    dataset_id: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    left_out: dict[str, Any] | None = None,
) -> Dataset:
    """Insert a dataset row. Commits; raises Conflict when the project has the name already."""
    dataset = Dataset(
        include=include,
        exclude=exclude,
        left_out=left_out,
        id=dataset_id or new_id("ds"),
        project_id=project_id,
        name=name,
        uri=uri,
        size_bytes=size_bytes,
        sha256=sha256,
        num_files=num_files,
        format=format,
        stats=stats.model_dump(mode="json") if stats is not None else None,
        created_at=utcnow(),
    )
    session.add(dataset)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(
            f"dataset {name!r} exists in this project",
            details=[{"loc": ["body", "name"], "msg": "name taken", "type": "conflict"}],
        ) from None
    return dataset


def get(*, session: Session, dataset_id: str, project_id: str) -> Dataset | None:
    """The project's dataset whose id, or else whose name (unique in a project), is
    `dataset_id`; None when there is none."""
    dataset = session.get(Dataset, dataset_id)
    if dataset is not None and dataset.project_id == project_id:
        return dataset
    by_name = select(Dataset).where(Dataset.project_id == project_id, Dataset.name == dataset_id)
    return session.execute(by_name).scalar_one_or_none()


def get_or_raise(*, session: Session, dataset_id: str, project_id: str) -> Dataset:
    dataset = get(session=session, dataset_id=dataset_id, project_id=project_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found")
    return dataset


def list_all(*, session: Session, project_id: str) -> list[Dataset]:
    query = select(Dataset).where(Dataset.project_id == project_id).order_by(Dataset.created_at)
    return list(session.execute(query).scalars())
