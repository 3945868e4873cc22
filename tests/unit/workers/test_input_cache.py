"""The host's cache of remote inputs (`workers.inputs.InputCache`), over fsspec's in-memory
filesystem (a real fsspec filesystem, remote as an object store is: `memory://`): one fetch per
content, checked, renamed into place whole; hits after; least recently used entries evicted,
never one in use. The same cache over the S3 server: tests/integration/hosts/test_host_inputs.py.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

from core.datasets.service import digest_path
from core.jobs.inputs import Located
from workers import inputs
from workers.inputs import FetchFailed, FetchStopped, InputCache, PlacedInputs


def _remote(files: dict[str, bytes]) -> str:
    """A prefix of fresh files in the in-memory filesystem."""
    root = f"memory://bucket-{uuid.uuid4().hex[:8]}/ds"
    fs = fsspec.filesystem("memory")
    for rel, data in files.items():
        fs.pipe(f"{root}/{rel}", data)
    return root


def _dataset(source: str, files: dict[str, bytes], tmp_path: Path, name: str = "corpus") -> Located:
    """A dataset input whose sha256 is that of the same files laid out locally."""
    local = tmp_path / f"expected-{uuid.uuid4().hex[:6]}"
    for rel, data in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    _, sha256, _ = digest_path(local)
    return Located(name, "dataset", source, sha256, sha256, f"dataset {name}")


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, message: str, data: dict[str, Any]) -> None:
        with self.lock:
            self.items.append((message, data))

    def caches(self) -> list[str]:
        return [d["cache"] for _, d in self.items if d.get("cache") != "fetching"]


FILES = {"a.txt": b"alpha\n" * 100, "sub/b.txt": b"beta\n" * 50}


def test_an_input_is_fetched_once_then_read_from_the_cache(tmp_path: Path) -> None:
    source = _remote(FILES)
    item = _dataset(source, FILES, tmp_path)
    cache, events = InputCache(tmp_path / "cache", 10**9), Events()
    first, second = PlacedInputs(), PlacedInputs()
    path = cache.get(item, first, report=events)
    assert cache.get(item, second, report=events) == path
    assert events.caches() == ["miss", "hit"]
    assert (Path(path) / "a.txt").read_bytes() == FILES["a.txt"]
    assert (Path(path) / "sub" / "b.txt").read_bytes() == FILES["sub/b.txt"]
    assert Path(path).parent.name == item.sha256  # content-addressed
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]
    first.release()
    second.release()


def test_a_single_object_is_placed_as_a_file(tmp_path: Path) -> None:
    source = _remote({"corpus.txt": b"one file\n"}) + "/corpus.txt"
    fs = fsspec.filesystem("memory")
    assert fs.isfile(source)
    item = Located("corpus", "path", source, "k", None, source)
    path = InputCache(tmp_path / "cache", 10**9).get(item, PlacedInputs(), report=Events())
    assert Path(path).is_file() and Path(path).read_bytes() == b"one file\n"


def test_a_copy_that_is_not_what_was_pinned_is_refused_and_left_nowhere(tmp_path: Path) -> None:
    source = _remote(FILES)
    pinned = _dataset(source, {**FILES, "a.txt": b"what it held at submission"}, tmp_path)
    cache = InputCache(tmp_path / "cache", 10**9)
    with pytest.raises(FetchFailed, match=r"not the .* pinned at submission"):
        cache.get(pinned, PlacedInputs(), report=Events())
    assert not (tmp_path / "cache" / pinned.key).exists()
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]


def test_a_changed_prefix_is_another_entry(tmp_path: Path) -> None:
    """Without a content hash of its own (a path, a checkpoint), the key includes the listing:
    an object rewritten with another size is fetched again."""
    source = _remote({"x.bin": b"1" * 10})
    item = Located("raw", "path", source, "path-key", None, source)
    cache, events = InputCache(tmp_path / "cache", 10**9), Events()
    before = cache.get(item, PlacedInputs(), report=events)
    fsspec.filesystem("memory").pipe(f"{source}/x.bin", b"2" * 20)
    after = cache.get(item, PlacedInputs(), report=events)
    assert before != after and events.caches() == ["miss", "miss"]
    assert (Path(after) / "x.bin").read_bytes() == b"2" * 20


def test_two_jobs_placing_one_input_at_once_fetch_it_once(tmp_path: Path) -> None:
    source = _remote(FILES)
    item = _dataset(source, FILES, tmp_path)
    cache, events = InputCache(tmp_path / "cache", 10**9), Events()
    paths: list[str] = []
    start = threading.Barrier(2)

    def place() -> None:
        start.wait()
        paths.append(InputCache(tmp_path / "cache", 10**9).get(item, PlacedInputs(), report=events))

    threads = [threading.Thread(target=place) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(paths) == 2 and paths[0] == paths[1]
    assert sorted(events.caches()) == ["hit", "miss"]
    assert cache.evict() == []


def test_eviction_removes_the_least_recently_used_entries_never_one_in_use(
    tmp_path: Path,
) -> None:
    size = sum(len(v) for v in FILES.values())
    cache = InputCache(tmp_path / "cache", limit_bytes=size)  # room for one entry
    held, released = PlacedInputs(), PlacedInputs()
    old = _dataset(_remote(FILES), FILES, tmp_path, "old")
    other = {"c.txt": b"gamma\n" * 120}
    newer = _dataset(_remote(other), other, tmp_path, "newer")
    cache.get(old, held, report=Events())
    cache.get(newer, released, report=Events())
    released.release()
    # Over the limit: the oldest entry is in use, so the newer one goes instead.
    assert cache.evict() == [newer.key]
    assert (tmp_path / "cache" / old.key).exists()
    held.release()
    newest = {"d.txt": b"delta\n" * 10}
    cache.get(
        _dataset(_remote(newest), newest, tmp_path, "newest"), PlacedInputs(), report=Events()
    )
    assert cache.evict() == [old.key]
    assert not (tmp_path / "cache" / old.key).exists()


def test_a_long_fetch_reports_its_progress_and_stops_when_the_attempt_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `PROGRESS_EVERY_S` a fetch reports the bytes it has (and asks the heartbeat whether
    the attempt still stands): a cancelled attempt stops its fetch and leaves nothing behind."""
    monkeypatch.setattr(inputs, "PROGRESS_EVERY_S", 0.0)
    files = {f"part-{i}.bin": bytes([i]) * 300_000 for i in range(4)}
    item = _dataset(_remote(files), files, tmp_path)
    events = Events()
    InputCache(tmp_path / "cache", 10**9).get(item, PlacedInputs(), report=events)
    progress = [d["bytes"] for _, d in events.items if d["cache"] == "fetching"]
    assert progress and progress == sorted(progress) and progress[-1] <= 1_200_000
    assert all(d["total_bytes"] == 1_200_000 for _, d in events.items if d["cache"] == "fetching")
    assert events.items[-1][1]["cache"] == "miss"

    other = {"x.bin": b"x" * 300_000, "y.bin": b"y" * 300_000}
    stopped = _dataset(_remote(other), other, tmp_path, "stopped")
    with pytest.raises(FetchStopped):
        InputCache(tmp_path / "cache", 10**9).get(
            stopped, PlacedInputs(), report=Events(), beat=lambda: False
        )
    assert not (tmp_path / "cache" / stopped.key).exists()
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]
