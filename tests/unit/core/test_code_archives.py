"""What a code archive may hold (`core.jobs.code_archives.inspect`/`unpack`): each unsafe member is
refused by name, a good archive unpacks to exactly its files."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from core.jobs.code_archives import UnsafeArchive, inspect, unpack
from core.platform.errors import InvalidInput, TooLarge

LIMIT = 1 << 20


def _tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info in members:
            body = data.get(info.name, b"")
            if info.isfile():
                info.size = len(body)
            tf.addfile(info, io.BytesIO(body) if info.isfile() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, *, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def test_a_good_tar_unpacks_to_its_files_with_an_in_tree_symlink(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar.gz",
        [_file("./train.py"), _file("pkg/util.py"), _link("pkg/link.py", "util.py")],
        {"./train.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n"},
    )
    contents = unpack(archive, tmp_path / "out", max_unpacked_bytes=LIMIT)
    assert contents.format == "tar.gz"
    assert contents.files == ["pkg/util.py", "train.py"]
    assert contents.unpacked_bytes == len(b"print('hi')\n") + len(b"X = 1\n")
    assert (tmp_path / "out/train.py").read_bytes() == b"print('hi')\n"
    assert (tmp_path / "out/pkg/link.py").read_text() == "X = 1\n"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_file("/etc/evil.py"), "absolute path"),
        (_file("pkg/../../evil.py"), "'..'"),
        (_link("escape.py", "../../etc/passwd"), "symlink out of the tree"),
        (_link("abs.py", "/etc/passwd"), "symlink out of the tree"),
        (_link("hard.py", "train.py", hard=True), "hard link"),
    ],
)
def test_an_unsafe_tar_member_is_refused_by_name(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    archive = _tar(tmp_path / "bad.tar.gz", [_file("train.py"), member], {})
    with pytest.raises(UnsafeArchive) as caught:
        inspect(archive, max_unpacked_bytes=LIMIT)
    assert member.name in caught.value.message and why in caught.value.message
    assert caught.value.details[0]["loc"] == ["body", "file"]


def test_a_zip_slip_and_a_zip_symlink_are_refused(tmp_path: Path) -> None:
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as zf:
        zf.writestr("train.py", "pass\n")
        zf.writestr("../outside.py", "pass\n")
    with pytest.raises(UnsafeArchive, match=r"outside\.py"):
        inspect(slip, max_unpacked_bytes=LIMIT)
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("l.py")
        info.external_attr = (0o120777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symlink"):
        inspect(link, max_unpacked_bytes=LIMIT)


def test_a_good_zip_unpacks(tmp_path: Path) -> None:
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("src/train.py", "pass\n")
        zf.writestr("src/", "")
    contents = unpack(good, tmp_path / "out", max_unpacked_bytes=LIMIT)
    assert contents.format == "zip" and contents.files == ["src/train.py"]
    assert (tmp_path / "out/src/train.py").read_text() == "pass\n"


def test_too_big_unpacked_is_413_and_not_an_archive_is_422(tmp_path: Path) -> None:
    big = _tar(tmp_path / "big.tar.gz", [_file("a.bin")], {"a.bin": b"0" * 4096})
    with pytest.raises(TooLarge):
        inspect(big, max_unpacked_bytes=4095)
    text = tmp_path / "x.tar.gz"
    text.write_text("not an archive")
    with pytest.raises(InvalidInput, match=r"not a \.tar\.gz or \.zip"):
        inspect(text, max_unpacked_bytes=LIMIT)
