"""Placing an entrypoint job's declared inputs (`entrypoint.inputs`, docs/CONTRACTS.md section
5) on this host before its ranks start.

A local input (local storage, a registered directory, a base model on the host) is used where it
lies. An input in an object store is fetched by the worker, which holds the storage credentials
the program never sees, into this host's input cache (`<home>/cache/inputs`):

- content-addressed: an entry's key is the dataset's `sha256` (checked again over the fetched
  bytes, `core.datasets.service.digest_path`), or for a checkpoint, base model or path the
  hash of its location and of its listing (every object's path, size and ETag; sizes checked);
- fetched into a temporary directory and renamed into place whole, so a reader never sees half
  an entry; one fetch per entry on the host at a time (a `flock` on `<key>.fetch`), every other
  job and attempt waiting for it and then reading the cached copy;
- evicted least recently used once the cache holds more than `TORCHYARD_INPUT_CACHE_GB`, never
  while a job on the host uses the entry (each user holds a shared `flock` on `<key>.use` for
  the node's lifetime, released when its files close: a crashed worker's go with it).

Each fetch and each cache hit is an event of the job (`data.input`, `data.cache`: `miss` |
`hit`), and a long fetch reports its progress ("fetching input corpus: 1.2 of 3.4 GB").

Inside the sandbox each input is bound read-only at `/inputs/<name>` (`workers.program`); without
the sandbox, `TORCHYARD_INPUT_<NAME>` names the host path.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.callbacks import Callback
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.datasets.service import SKIP_DIRS, digest_path
from core.jobs import inputs as job_inputs
from core.jobs import service as jobs
from core.jobs.inputs import Located
from core.platform.errors import InvalidInput
from core.platform.settings import Settings
from core.platform.tables import Job, JobState
from jobspec.job import ScriptJobSpec
from workers.attempt import with_db_retry

log = logging.getLogger(__name__)

CONTENT = "content"  # an entry's file or directory, as the job sees it
SIZE_FILE = ".size"  # its bytes, written before the entry is renamed into place
PROGRESS_EVERY_S = 2.0  # a long fetch's progress (the starting job's reason), this often
PROGRESS_EVENT_EVERY_S = 30.0  # ... and as an event of the job, at most this often per input
GB = 1024**3


class FetchStopped(Exception):
    """The attempt ended (cancelled, paused, lost) while an input was being fetched."""


class FetchFailed(Exception):
    """An input could not be fetched or did not match what was pinned (storage unreachable, a
    checksum that differs): the attempt is retried on its policy."""


@dataclass
class PlacedInputs:
    """The inputs of one node's attempt: `paths`, name -> host path; `held`: the shared locks
    that keep their cache entries from eviction while the node runs (closed by `release`, or
    when this object is collected)."""

    paths: dict[str, str] = field(default_factory=dict)
    held: list[IO[bytes]] = field(default_factory=list)

    def release(self) -> None:
        for handle in self.held:
            handle.close()
        self.held.clear()


def cache_root(settings: Settings) -> Path:
    """This host's input cache: `<home>/cache/inputs` (local disk, shared by its jobs)."""
    return settings.home.resolve() / "cache" / "inputs"


Report = Callable[[str, dict[str, Any]], None]  # (message, data): one event of the job
Beat = Callable[[], bool]  # the job's heartbeat; False: the attempt is over, stop


def place(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    spec: ScriptJobSpec,
    *,
    beat: Beat | None = None,
    worker: str = "",
) -> PlacedInputs:
    """Locate the job's pinned inputs and make each available on this host: local ones where
    they lie, remote ones through the cache (events of the job, naming `worker`, say which were
    fetched and which came from the cache). Raises InvalidInput (an input gone since submission,
    or a local one missing on this host), FetchStopped, FetchFailed."""
    placed = PlacedInputs()
    if not spec.entrypoint.inputs:
        return placed
    located = with_db_retry(
        factory, lambda s: job_inputs.locate(session=s, project_id=job.project_id, spec=spec)
    )
    report = _reporter(factory, job, worker or settings.worker_hostname or os.uname().nodename)
    cache = InputCache(cache_root(settings), int(settings.input_cache_gb * GB))
    fetched = False
    try:
        for item in located:
            if item.remote:
                placed.paths[item.name] = cache.get(item, placed, report=report, beat=beat)
                fetched = True
                continue
            path = item.local_path
            if not os.path.exists(path):
                raise InvalidInput(
                    f"entrypoint.inputs.{item.name}: {item.label} ({path}) is not on this host"
                )
            placed.paths[item.name] = path
        cache.evict()
        if fetched:  # the starting job waits for nothing more of its inputs
            _clear_wait_reason(factory, job)
    except BaseException:
        placed.release()
        raise
    return placed


def _reporter(factory: Callable[[], Session], job: Job, host: str) -> Report:
    """An event of the job per report; a fetch's progress is what the starting job waits for
    (`waiting_for`, from `jobs.wait_reason`, cleared once its inputs are placed), and an event
    only every `PROGRESS_EVENT_EVERY_S` per input (an hour's fetch is not 1,800 events)."""
    said: dict[str, float] = {}

    def report(message: str, data: dict[str, Any]) -> None:
        progress = data.get("cache") == "fetching"
        name = str(data.get("input"))
        quiet = progress and time.monotonic() - said.get(name, -1e9) < PROGRESS_EVENT_EVERY_S
        try:
            with factory() as session:
                if progress:
                    _set_wait_reason(session, job, message)
                if quiet:
                    session.commit()
                    return
                said[name] = time.monotonic()
                jobs.add_event(
                    session=session,
                    job=job,
                    kind="info",
                    message=message,
                    data={**data, "worker": host},
                )
                session.commit()
        except Exception:  # the fetch matters more than its event
            log.exception("job %s: could not record an input event", job.id)

    return report


def _set_wait_reason(session: Session, job: Job, reason: str | None) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job.id, Job.attempt == job.attempt, Job.state == JobState.STARTING)
        .values(wait_reason=reason)
    )


def _clear_wait_reason(factory: Callable[[], Session], job: Job) -> None:
    try:
        with factory() as session:
            _set_wait_reason(session, job, None)
            session.commit()
    except Exception:  # a stale reason of a starting job is cosmetic; the run matters more
        log.exception("job %s: could not clear its starting reason", job.id)


@dataclass(frozen=True, slots=True)
class _Listing:
    """The objects of a remote input: (path relative to the root, size in bytes, ETag); `root`
    is the fsspec path of the object or prefix; `is_file`: a single object."""

    fs: Any
    root: str
    is_file: bool
    files: list[tuple[str, int, str]]

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)

    def signature(self) -> str:
        return "\n".join(f"{rel}\0{size}\0{etag}" for rel, size, etag in self.files)


def _list(uri: str) -> _Listing:
    """The objects at `uri`: one object, or every file under a prefix (without `SKIP_DIRS`, as
    a dataset's digest counts them). Raises FileNotFoundError when nothing is there."""
    fs, root = fsspec.core.url_to_fs(uri)
    if fs.isfile(root):
        info = fs.info(root)
        return _Listing(fs, root, True, [("", int(info.get("size") or 0), _etag(info))])
    if not fs.isdir(root):
        raise FileNotFoundError(uri)
    root = root.rstrip("/")
    files = []
    for path, info in sorted(fs.find(root, detail=True).items()):
        rel = path[len(root) + 1 :]
        if not SKIP_DIRS.intersection(rel.split("/")):
            files.append((rel, int(info.get("size") or 0), _etag(info)))
    return _Listing(fs, root, False, files)


def _signature(listing: _Listing | None) -> str:
    return "" if listing is None else listing.signature()


def _etag(info: dict[str, Any]) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or "")


class _Progress(Callback):
    """Bytes moved by an fsspec `get` of many files (each file's child callback adds its own)."""

    def __init__(self, on_bytes: Callable[[int], None]) -> None:
        super().__init__()
        self.on_bytes = on_bytes

    def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Callback:
        return _FileProgress(self.on_bytes)


class _FileProgress(Callback):
    def __init__(self, on_bytes: Callable[[int], None]) -> None:
        super().__init__()
        self.on_bytes = on_bytes

    def call(self, *args: Any, **kwargs: Any) -> None:
        pass

    def relative_update(self, inc: int = 1) -> None:
        self.on_bytes(inc)


class InputCache:
    """This host's content-addressed cache of remote inputs (module docstring), `limit_bytes`
    in all."""

    def __init__(self, root: Path, limit_bytes: int) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def entry(self, key: str) -> Path:
        return self.root / key

    @contextlib.contextmanager
    def _lock(self, key: str, kind: str, mode: int) -> Iterator[IO[bytes]]:
        handle = (self.root / f"{key}.{kind}").open("ab")
        try:
            fcntl.flock(handle, mode)
            yield handle
        finally:
            handle.close()

    def get(
        self, item: Located, placed: PlacedInputs, *, report: Report, beat: Beat | None = None
    ) -> str:
        """The local path of `item`'s content, fetched unless cached; the entry is held (a
        shared lock in `placed.held`) until the node ends. A dataset's key is its sha256, so a
        hit asks the object store nothing; another input's key needs its listing. Raises
        FetchFailed, FetchStopped."""
        listing = None if item.sha256 else self._listing(item)
        key = item.sha256 or job_inputs.content_key(item.key, _signature(listing))
        base = {"input": item.name, "kind": item.kind, "key": key}
        with self._lock(key, "fetch", fcntl.LOCK_EX):
            entry = self.entry(key)
            if (entry / CONTENT).exists():
                size = int((entry / SIZE_FILE).read_text() or 0)
                report(
                    f"input {item.name}: {item.label} from this host's cache ({_gb(size)})",
                    {**base, "cache": "hit", "bytes": size},
                )
            else:
                listing = listing or self._listing(item)
                started = time.monotonic()
                self._fetch(item, listing, key, report=report, beat=beat)
                seconds = time.monotonic() - started
                size = listing.total_bytes
                rate = size / seconds / 1e6 if seconds > 0 else 0.0
                report(
                    f"input {item.name}: fetched {item.label} ({_gb(size)} in {seconds:.1f} s, "
                    f"{rate:.0f} MB/s)",
                    {**base, "cache": "miss", "bytes": size, "seconds": round(seconds, 3)},
                )
            used = (self.root / f"{key}.use").open("ab")
            fcntl.flock(used, fcntl.LOCK_SH)  # released when the node's run ends
            placed.held.append(used)
            now = time.time_ns()  # not the kernel's coarse clock: two uses in a tick differ
            os.utime(entry / SIZE_FILE, ns=(now, now))  # the recency eviction orders by
        return str(entry / CONTENT)

    @staticmethod
    def _listing(item: Located) -> _Listing:
        try:
            return _list(item.source)
        except Exception as exc:  # botocore's errors are no OSError
            raise FetchFailed(
                f"input {item.name}: cannot list {item.source}: {type(exc).__name__}: {exc}"
            ) from exc

    def _fetch(
        self, item: Located, listing: _Listing, key: str, *, report: Report, beat: Beat | None
    ) -> None:
        tmp = self.root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        target = tmp / CONTENT
        tmp.mkdir(parents=True)
        total = listing.total_bytes
        moved = [0]
        last = [time.monotonic()]
        lock = threading.Lock()
        stopped = threading.Event()

        def on_bytes(inc: int) -> None:
            with lock:
                moved[0] += inc
                if time.monotonic() - last[0] < PROGRESS_EVERY_S:
                    return
                last[0] = time.monotonic()
                done = moved[0]
            if beat is not None and not beat():
                stopped.set()
                raise FetchStopped(f"input {item.name}: the attempt ended during its fetch")
            report(
                f"fetching input {item.name}: {_gb(done)} of {_gb(total)}",
                {"input": item.name, "cache": "fetching", "bytes": done, "total_bytes": total},
            )

        try:
            if listing.is_file:
                rpaths, lpaths = [listing.root], [str(target)]
            else:
                rpaths = [f"{listing.root}/{rel}" for rel, _, _ in listing.files]
                lpaths = [str(target / rel) for rel, _, _ in listing.files]
                target.mkdir()
                for local in lpaths:
                    Path(local).parent.mkdir(parents=True, exist_ok=True)
            if rpaths:
                listing.fs.get(rpaths, lpaths, callback=_Progress(on_bytes))
            self._verify(item, listing, target)
            (tmp / SIZE_FILE).write_text(str(total))
            try:
                os.rename(tmp, self.entry(key))
            except OSError:  # an entry of that key appeared (another host's copy of the cache?)
                shutil.rmtree(tmp, ignore_errors=True)
        except FetchStopped:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if stopped.is_set():
                raise FetchStopped(
                    f"input {item.name}: the attempt ended during its fetch"
                ) from exc
            if isinstance(exc, FetchFailed):
                raise
            raise FetchFailed(
                f"input {item.name}: fetching {item.source} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _verify(self, item: Located, listing: _Listing, target: Path) -> None:
        """The fetched copy is what was pinned: a dataset's sha256, else every file's size."""
        if item.sha256 is not None:
            _, sha256, _ = digest_path(target)
            if sha256 != item.sha256:
                raise FetchFailed(
                    f"input {item.name}: the fetched {item.label} has sha256 {sha256}, "
                    f"not the {item.sha256} pinned at submission"
                )
            return
        for rel, size, _ in listing.files:
            got = (target / rel).stat().st_size if rel else target.stat().st_size
            if got != size:
                raise FetchFailed(
                    f"input {item.name}: {rel or item.source} has {got} bytes, listed {size}"
                )

    def evict(self) -> list[str]:
        """Remove the least recently used entries until the cache holds at most `limit_bytes`,
        skipping every entry in use or being fetched; the keys removed."""
        entries = []
        for entry in self.root.iterdir():
            size_file = entry / SIZE_FILE
            if entry.name.startswith(".") or not size_file.exists():
                continue
            entries.append((size_file.stat().st_mtime_ns, entry.name, int(size_file.read_text())))
        total = sum(size for _, _, size in entries)
        removed = []
        for _, key, size in sorted(entries):
            if total <= self.limit_bytes:
                break
            if self._remove_unused(key):
                total -= size
                removed.append(key)
        return removed

    def _remove_unused(self, key: str) -> bool:
        fetch = (self.root / f"{key}.fetch").open("ab")
        use = (self.root / f"{key}.use").open("ab")
        try:
            try:
                fcntl.flock(fetch, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            doomed = self.root / f".evict-{key}-{uuid.uuid4().hex[:8]}"
            os.rename(self.entry(key), doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            log.info("input cache: evicted %s", key)
            return True
        finally:
            use.close()
            fetch.close()


def _gb(size: int) -> str:
    if size >= GB / 10:
        return f"{size / GB:.1f} GB"
    return f"{size / 1024**2:.1f} MB"
