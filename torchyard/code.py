"""Code archives: a team's own training code, uploaded for `entrypoint` jobs (docs/CONTRACTS.md
section 5).

    with Client() as client:
        archive = client.code.upload("my_project/")   # a directory, or a .tar.gz / .zip file
        spec["entrypoint"]["code"] = archive.id

A directory is archived as a `.tar.gz` of its files, leaving out what its `.gitignore` files
ignore (git's rules, by `pathspec`), `.git/` and `__pycache__/`. The same bytes uploaded again
give back the first archive, so unchanged code is stored once.
``torchyard code upload DIR|FILE`` and ``torchyard submit --code DIR spec.yaml`` do the same.
"""

from __future__ import annotations

import builtins
import gzip
import os
import stat
import tarfile
import tempfile
from pathlib import Path

from pathspec import GitIgnoreSpec

from torchyard.errors import TorchyardError
from torchyard.transport import Transport
from torchyard.types import CodeArchive

SKIP_DIRS = frozenset({".git", "__pycache__"})


class NothingToUpload(TorchyardError, ValueError):
    """A directory holds no file to archive (empty, or everything in it is ignored)."""


def archive_files(root: Path) -> list[str]:
    """The files (and symlinks) under the directory `root` that its archive holds: relative
    POSIX paths, sorted. Leaves out `.git/`, `__pycache__/`, what the `.gitignore` files of
    `root` and its subdirectories ignore (a deeper file's rules win, as in git; an ignored
    directory is not entered), and anything that is not a regular file or a symlink."""
    found: list[str] = []
    specs: dict[str, GitIgnoreSpec] = {}  # directory ("" for root) -> its rules, parents first
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix().removeprefix(".")
        gitignore = here / ".gitignore"
        if gitignore.is_file():
            lines = gitignore.read_text(errors="replace").splitlines()
            specs[rel_dir] = GitIgnoreSpec.from_lines(lines)
        entered = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if name in SKIP_DIRS or _ignored(specs, rel, directory=True):
                continue
            if (here / name).is_symlink():
                found.append(rel)  # kept as a link (os.walk does not follow it)
            else:
                entered.append(name)
        dirnames[:] = entered
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            mode = (here / name).lstat().st_mode
            if (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and not _ignored(specs, rel):
                found.append(rel)
    return sorted(found)


def _ignored(specs: dict[str, GitIgnoreSpec], rel: str, *, directory: bool = False) -> bool:
    """Whether `rel` is ignored: the last verdict of the `.gitignore` files above it, the
    nearest one last."""
    verdict: bool | None = None
    for base, spec in specs.items():
        if base and not rel.startswith(base + "/"):
            continue
        sub = rel[len(base) + 1 :] if base else rel
        include = spec.check_file(sub + "/" if directory else sub).include
        if include is not None:
            verdict = include
    return bool(verdict)


def write_tar_gz(root: Path, dest: Path) -> list[str]:
    """Write the `.tar.gz` of the directory `root` (`archive_files`) to `dest`; returns its
    members. Owners, gzip name and time are left out and members sorted, so an unchanged tree
    gives the same bytes (and the server the same archive). Raises NothingToUpload when no
    file is left, OSError when a file cannot be read."""
    files = archive_files(root)
    if not files:
        raise NothingToUpload(f"{root}: no files to archive (empty, or all ignored)")
    with (
        dest.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf,
    ):
        for rel in files:
            path = root / rel
            info = tf.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            if info.islnk():  # a second name of a file already added: store it again
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", path.stat().st_size
            if info.isreg():
                with path.open("rb") as fh:
                    tf.addfile(info, fh)
            else:
                tf.addfile(info)
    return files


class Code:
    """``client.code``: upload training code, list and read the project's archives."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def upload(
        self, path: str | Path, *, name: str | None = None, timeout_s: float | None = None
    ) -> CodeArchive:
        """Upload a directory (archived as a `.tar.gz`, see `archive_files`) or a `.tar.gz`,
        `.tgz` or `.zip` file. `name` defaults to the directory's or the file's name;
        `timeout_s` bounds each network read/write (default: the client's timeout, at least
        five minutes). Returns the archive (the project's first one when it has these bytes).

        Raises `PayloadTooLarge` over the server's limits, `ValidationFailed` for a file that
        is no such archive or holds a member it may not (absolute path, `..`, a symlink out of
        the tree; named in the message), NothingToUpload, FileNotFoundError.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or directory")
        if not path.is_dir():
            return self._send(path, name or path.name, timeout_s)
        with tempfile.TemporaryDirectory(prefix="torchyard-code-") as tmp:
            label = path.resolve().name or "code"
            archive = Path(tmp) / f"{label}.tar.gz"
            write_tar_gz(path, archive)
            return self._send(archive, name or label, timeout_s)

    def _send(self, file: Path, name: str, timeout_s: float | None) -> CodeArchive:
        timeout = timeout_s if timeout_s is not None else max(self._client.timeout, 300.0)
        with file.open("rb") as fh:
            answer = self._client.request(
                "POST",
                "/v1/code",
                files={"file": (file.name, fh, "application/octet-stream")},
                data={"name": name},
                timeout=timeout,
            )
        return CodeArchive.model_validate(answer)

    def list(self) -> builtins.list[CodeArchive]:
        """The project's archives, newest first (without `files`)."""
        answer = self._client.request("GET", "/v1/code")
        return [CodeArchive.model_validate(a) for a in answer.get("items", [])]

    def get(self, code_id: str) -> CodeArchive:
        """One archive with its `files`. Raises `NotFound`."""
        return CodeArchive.model_validate(self._client.request("GET", f"/v1/code/{code_id}"))
