"""Code archives of `entrypoint` jobs (docs/CONTRACTS.md section 5): what an archive may hold
(`inspect`, at upload), keeping it (`create`: stored once per content under
`<storage>/code/<sha256>.<format>`, one row per project and content), unpacking it on a worker
(`unpack`, which checks again), lookup, and the submission checks of a spec's `entrypoint` and
of a GRPO job's `method.grpo.code` (where its python graders' files are) against the archive.

An archive is a gzipped tar (`.tar.gz`, `.tgz`) or a zip. Refused, with the member's name:
absolute paths, `..` components, links that leave the tree (and any hard link or zip symlink),
devices and fifos, more than `MAX_FILES` files or `max_unpacked_bytes` unpacked. Unpacking uses
the standard library's own guards as well (`tarfile`'s `data` filter, PEP 706).
"""

from __future__ import annotations

import posixpath
import secrets
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import fsspec
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.access.auth import new_id
from core.platform import storage
from core.platform.errors import InvalidInput, TooLarge
from core.platform.tables import CodeArchive
from jobspec.graders import file_graders
from jobspec.job import JobSpec, ScriptJobSpec

MAX_FILES: Final = 20_000
ArchiveFormat = Literal["tar.gz", "zip"]


class UnsafeArchive(InvalidInput):
    """A member the archive may not hold (422; `details[0].loc` is `["body", "file"]`)."""

    def __init__(self, member: str, why: str) -> None:
        message = f"file: archive member {member!r} {why}"
        super().__init__(
            message, details=[{"loc": ["body", "file"], "msg": message, "type": "unsafe_archive"}]
        )


@dataclass(frozen=True, slots=True)
class Contents:
    """What `inspect` found: the regular files (relative POSIX paths, sorted) and their total
    unpacked size in bytes."""

    format: ArchiveFormat
    files: list[str]
    unpacked_bytes: int


def detect_format(path: Path) -> ArchiveFormat:
    """`zip` or `tar.gz` by the file's magic bytes. Raises InvalidInput (422) for neither."""
    if zipfile.is_zipfile(path):
        return "zip"
    with path.open("rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return "tar.gz"
    raise InvalidInput(
        "file: not a .tar.gz or .zip archive",
        details=[
            {"loc": ["body", "file"], "msg": "not a .tar.gz or .zip archive", "type": "format"}
        ],
    )


def _relative(name: str) -> str:
    """`name` as a normalised relative path; UnsafeArchive for an absolute one, `..`, or a
    name the database cannot store (NUL, bytes that are not UTF-8)."""
    if "\x00" in name or not _utf8(name):
        raise UnsafeArchive(name, "has a name that is not valid UTF-8 text")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(name, "has an absolute path")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(name, "climbs out of the archive ('..')")
    return "/".join(parts)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")  # tarfile decodes other bytes to lone surrogates
    except UnicodeEncodeError:
        return False
    return True


def _inside(link_dir: str, target: str) -> bool:
    """Whether a symlink in `link_dir` pointing at `target` stays inside the tree."""
    if target.startswith("/"):
        return False
    resolved = posixpath.normpath(posixpath.join(link_dir, target))
    return resolved != ".." and not resolved.startswith("../")


def inspect(path: Path, *, max_unpacked_bytes: int) -> Contents:
    """Check every member of the archive at `path` without extracting it.

    Raises UnsafeArchive (422) for a member it may not hold, InvalidInput (422) for a file that
    is not a readable archive, TooLarge (413) beyond `MAX_FILES` files or `max_unpacked_bytes`.
    """
    fmt = detect_format(path)
    files: list[str] = []
    total = 0
    try:
        if fmt == "zip":
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    rel = _relative(info.filename)
                    kind = stat.S_IFMT(info.external_attr >> 16)
                    if kind == stat.S_IFLNK:
                        raise UnsafeArchive(info.filename, "is a symlink (zip); use a .tar.gz")
                    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                        raise UnsafeArchive(info.filename, "is not a file or directory")
                    if not info.is_dir() and rel:
                        files.append(rel)
                        total += info.file_size
                    _check_size(len(files), total, max_unpacked_bytes)
        else:
            with tarfile.open(path, "r:gz") as tf:
                for member in tf:
                    rel = _relative(member.name)
                    if member.issym():
                        if not _inside(posixpath.dirname(rel), member.linkname):
                            raise UnsafeArchive(
                                member.name, f"is a symlink out of the tree ({member.linkname})"
                            )
                    elif member.islnk():
                        raise UnsafeArchive(member.name, "is a hard link")
                    elif member.isfile():
                        files.append(rel)
                        total += member.size
                    elif not member.isdir():
                        raise UnsafeArchive(member.name, "is not a file, directory or symlink")
                    _check_size(len(files), total, max_unpacked_bytes)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InvalidInput(
            f"file: not a readable archive: {exc}",
            details=[{"loc": ["body", "file"], "msg": str(exc), "type": "format"}],
        ) from None
    return Contents(format=fmt, files=sorted(set(files)), unpacked_bytes=total)


def _check_size(files: int, total: int, max_unpacked_bytes: int) -> None:
    if files > MAX_FILES:
        raise TooLarge(f"file: the archive holds more than {MAX_FILES} files")
    if total > max_unpacked_bytes:
        raise TooLarge(f"file: the archive unpacks to more than {max_unpacked_bytes} bytes")


def unpack(path: Path, dest: Path, *, max_unpacked_bytes: int) -> Contents:
    """Extract the archive at `path` into the directory `dest` (created; should be empty),
    after the same checks as `inspect`. Raises as `inspect` does."""
    contents = inspect(path, max_unpacked_bytes=max_unpacked_bytes)
    dest.mkdir(parents=True, exist_ok=True)
    if contents.format == "zip":
        with zipfile.ZipFile(path) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(path, "r:gz") as tf:
            tf.extractall(dest, filter="data")
    return contents


def stored_uri(storage_url: str, sha256: str, fmt: str) -> str:
    """Where the archive with digest `sha256` lives: `<storage>/code/<sha256>.<fmt>` (one file
    per content, whichever projects uploaded it)."""
    return storage.join(storage_url, "code", f"{sha256}.{fmt}")


def store(path: Path, uri: str) -> None:
    """Copy the local archive `path` to `uri`, unless a file is there already (content
    addressed: the same bytes). Written under a temporary name and renamed into place, so no
    reader sees part of an archive. Raises OSError when storage cannot be written."""
    fs, target = fsspec.core.url_to_fs(uri)
    if fs.exists(target):
        return
    fs.makedirs(posixpath.dirname(target), exist_ok=True)
    partial = f"{target}.part-{secrets.token_hex(4)}"
    try:
        fs.put_file(str(path), partial)
        fs.mv(partial, target)
    finally:
        if fs.exists(partial):
            fs.rm(partial)


def create(
    *,
    session: Session,
    storage_url: str,
    project_id: str,
    name: str,
    path: Path,
    sha256: str,
    size_bytes: int,
    contents: Contents,
) -> tuple[CodeArchive, bool]:
    """Keep the inspected archive at the local `path` (`sha256`, `size_bytes` of its bytes) as
    a code archive of `project_id`, stored once per content. Commits.

    Returns (archive, created): the project's existing archive with the same `sha256` and
    False when it has one. Raises OSError when storage cannot be written.
    """
    existing = _by_digest(session, project_id, sha256)
    if existing is not None:
        return existing, False
    uri = stored_uri(storage_url, sha256, contents.format)
    store(path, uri)
    archive = CodeArchive(
        id=new_id("code"),
        project_id=project_id,
        name=name,
        uri=uri,
        format=contents.format,
        sha256=sha256,
        size_bytes=size_bytes,
        unpacked_bytes=contents.unpacked_bytes,
        files=contents.files,
    )
    session.add(archive)
    try:
        session.commit()
    except IntegrityError:  # the same bytes uploaded at the same moment: theirs won
        session.rollback()
        existing = _by_digest(session, project_id, sha256)
        if existing is None:
            raise
        return existing, False
    return archive, True


def _by_digest(session: Session, project_id: str, sha256: str) -> CodeArchive | None:
    return session.scalars(
        select(CodeArchive).where(
            CodeArchive.project_id == project_id, CodeArchive.sha256 == sha256
        )
    ).one_or_none()


def list_all(*, session: Session, project_id: str) -> list[CodeArchive]:
    """The project's archives, newest first."""
    query = (
        select(CodeArchive)
        .where(CodeArchive.project_id == project_id)
        .order_by(CodeArchive.created_at.desc(), CodeArchive.id.desc())
    )
    return list(session.scalars(query))


def get(*, session: Session, archive_id: str, project_id: str) -> CodeArchive | None:
    """The project's archive `archive_id`; None when it is absent or another project's."""
    return session.scalars(
        select(CodeArchive).where(
            CodeArchive.id == archive_id, CodeArchive.project_id == project_id
        )
    ).one_or_none()


def check_entrypoint(*, session: Session, project_id: str, spec: ScriptJobSpec) -> CodeArchive:
    """The archive `spec.entrypoint.code` of `project_id`, which holds the script `command`
    runs. Raises InvalidInput (422) naming `entrypoint.code` (no such archive in the project)
    or `entrypoint.command` (the script is not in it)."""
    entry = spec.entrypoint
    archive = get(session=session, archive_id=entry.code, project_id=project_id)
    if archive is None:
        raise _error("code", f"no code archive {entry.code!r} in this project", entry.code)
    script = entry.script
    if script is not None:
        path = posixpath.normpath(script)
        if path.startswith(("/", "../")) or path == "..":
            raise _error("command", f"{script!r} is outside the archive", entry.command)
        if path not in set(archive.files):
            raise _error(
                "command",
                f"{script!r} is not in code archive {archive.id} ({len(archive.files)} files)",
                entry.command,
            )
    return archive


def check_grader_code(*, session: Session, project_id: str, spec: JobSpec) -> None:
    """A GRPO job's `method.grpo.code` is an archive of `project_id` that holds every python
    grader's `file`. Raises InvalidInput (422) at `method.grpo.code` (no such archive in the
    project: another project's is not found) or at each `graders[i]...file` it lacks, all in
    one error."""
    grpo = spec.method.grpo
    if grpo is None or grpo.code is None:
        return
    archive = get(session=session, archive_id=grpo.code, project_id=project_id)
    if archive is None:
        message = f"no code archive {grpo.code!r} in this project"
        raise InvalidInput(
            f"method.grpo.code: {message}",
            details=[
                {
                    "loc": ["body", "method", "grpo", "code"],
                    "msg": message,
                    "type": "grader_code",
                    "input": grpo.code,
                }
            ],
        )
    files, details = set(archive.files), []
    for index, inside, file in file_graders(grpo.graders):
        if posixpath.normpath(file) not in files:
            message = f"{file!r} is not in code archive {archive.id} ({len(files)} files)"
            loc: list[str | int] = ["body", "method", "grpo", "graders", index, *inside, "file"]
            details.append({"loc": loc, "msg": message, "type": "grader_code"})
    if details:
        said = "; ".join(f"{'.'.join(map(str, d['loc'][1:]))}: {d['msg']}" for d in details)
        raise InvalidInput(said, details=details)


def _error(field: str, message: str, value: object) -> InvalidInput:
    loc = ["body", "entrypoint", field]
    return InvalidInput(
        f"entrypoint.{field}: {message}",
        details=[{"loc": loc, "msg": message, "type": "entrypoint", "input": value}],
    )
