"""How the client archives a code directory (`torchyard.code`): git's ignore rules, `.git/` and
`__pycache__/` left out, the same tree the same bytes, and an archive the server's checks pass."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from core.jobs.code_archives import inspect, unpack
from torchyard.code import NothingToUpload, archive_files, write_tar_gz


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    return _tree(
        tmp_path / "proj",
        {
            ".gitignore": "*.log\n/data/\nbuild/\n!keep.log\n",
            "train.py": "print('hi')\n",
            "run.log": "x",
            "keep.log": "kept: negated\n",
            "data/big.bin": "x",
            "src/data/loader.py": "# /data/ is anchored to the root\n",
            "src/build/out.o": "x",
            "src/.gitignore": "secret.txt\n!debug.log\n",
            "src/secret.txt": "x",
            "src/debug.log": "re-included below\n",
            "src/pkg/secret.txt": "ignored: a parent's rule\n",
            "src/model.py": "W = 1\n",
            ".git/config": "x",
            "src/__pycache__/model.cpython-311.pyc": "x",
            "notes/.gitignore": "*\n",
            "notes/todo.md": "x",
        },
    )


def test_ignored_files_and_directories_are_left_out(project_dir: Path) -> None:
    assert archive_files(project_dir) == [
        ".gitignore",
        "keep.log",
        "src/.gitignore",
        "src/data/loader.py",
        "src/debug.log",
        "src/model.py",
        "train.py",
    ]


def test_the_archive_passes_the_servers_checks_and_unpacks_to_those_files(
    project_dir: Path, tmp_path: Path
) -> None:
    (project_dir / "src" / "model_link.py").symlink_to("model.py")
    os.link(project_dir / "train.py", project_dir / "train_again.py")
    dest = tmp_path / "code.tar.gz"
    members = write_tar_gz(project_dir, dest)
    contents = inspect(dest, max_unpacked_bytes=1 << 20)
    assert contents.format == "tar.gz"
    regular = [m for m in members if m != "src/model_link.py"]
    assert contents.files == regular
    out = unpack(dest, tmp_path / "out", max_unpacked_bytes=1 << 20)
    assert out.files == regular
    assert (tmp_path / "out" / "train_again.py").read_text() == "print('hi')\n"
    assert (tmp_path / "out" / "src" / "model_link.py").read_text() == "W = 1\n"
    with tarfile.open(dest) as tf:
        assert {(m.uid, m.gid, m.uname, m.gname) for m in tf} == {(0, 0, "", "")}


def test_the_same_tree_gives_the_same_bytes(project_dir: Path, tmp_path: Path) -> None:
    write_tar_gz(project_dir, tmp_path / "a.tar.gz")
    write_tar_gz(project_dir, tmp_path / "b.tar.gz")
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    (project_dir / "train.py").write_text("print('changed')\n")
    write_tar_gz(project_dir, tmp_path / "c.tar.gz")
    assert (tmp_path / "c.tar.gz").read_bytes() != (tmp_path / "a.tar.gz").read_bytes()


def test_a_directory_with_nothing_left_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "empty", {".git/HEAD": "x", "__pycache__/a.pyc": "x"})
    with pytest.raises(NothingToUpload, match="no files"):
        write_tar_gz(root, tmp_path / "x.tar.gz")
