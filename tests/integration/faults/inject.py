"""Faults injected from outside the product: a memory limit on a running rank, a read-only
storage directory, a corrupt dataset, ranks killed at a known checkpoint. Nothing here reaches
into the worker or the trainer; each acts on a process, a mount or a file, as the machine or
the user would.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import fsspec
import psutil
import pytest

# The dynamic mmap threshold of glibc's malloc stops rising at 32 MiB: a block at least this
# large is always mapped on allocation and unmapped on free, so a step that allocates one
# grows the address space afresh each time (smaller blocks are reused from the heap).
ALWAYS_MAPPED_BYTES = 32 << 20
POLL_S = 0.01
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V1_MEMORY = CGROUP_ROOT / "memory"
# Page cache left to a capped cgroup's processes (their code pages): less than one step's
# transient blocks (several of `ALWAYS_MAPPED_BYTES`), so a step cannot fit by evicting it.
FILE_HEADROOM_BYTES = 16 << 20


def lowest_over_a_step(sample: Callable[[], int], step: Callable[[], int], timeout_s: float) -> int:
    """The least of `sample()` (polled every `POLL_S`) from now until `step()` (the job's
    latest recorded step) has advanced by one: it includes the low point between two steps,
    when a step's activations are freed. Fails the test at `timeout_s`."""
    start, lowest = step(), sample()
    deadline = time.monotonic() + timeout_s
    next_look = 0.0
    while True:
        lowest = min(lowest, sample())
        now = time.monotonic()
        if now >= next_look:  # the step lives in the database: look less often
            if step() > start:
                return lowest
            next_look = now + 0.1
        if now > deadline:
            pytest.fail(f"no step after step {start} in {timeout_s:.0f} s")
        time.sleep(POLL_S)


def limit_address_space(proc: psutil.Process, step: Callable[[], int], timeout_s: float) -> int:
    """Set `proc`'s RLIMIT_AS (bytes of virtual memory) to the least it used while it trained
    one more step (`lowest_over_a_step`), and return that limit. From then on any growth of its
    address space fails (ENOMEM): torch's CPU allocator raises `DefaultCPUAllocator: can't
    allocate memory` at the step's first block of `ALWAYS_MAPPED_BYTES` or more. Raises
    psutil.NoSuchProcess when `proc` is gone."""
    lowest = lowest_over_a_step(lambda: proc.memory_info().vms, step, timeout_s)
    resource.prlimit(proc.pid, resource.RLIMIT_AS, (lowest, lowest))
    return lowest


@contextmanager
def paused(proc: psutil.Process) -> Iterator[None]:
    """`proc` stopped (SIGSTOP) for the block, continued (SIGCONT) after it: a fault lands
    between two of its instructions, wherever a fast loop would otherwise have run on to."""
    proc.suspend()
    try:
        yield
    finally:
        proc.resume()


def newest_complete_step(checkpoint_root: Path | str) -> int:
    """The highest step of a `step_XXXXXXXX` directory under `checkpoint_root` (a local path or
    an fsspec URI) that holds `.metadata` (DCP writes it last: the checkpoint is complete), as
    docs/CONTRACTS.md lays them out; 0 when there is none. Where a run resumed from
    `checkpoint_root` starts."""
    fs, root = fsspec.core.url_to_fs(str(checkpoint_root))
    fs.invalidate_cache()  # s3fs caches listings; other processes write these
    steps = [
        int(PurePosixPath(d).name.removeprefix("step_"))
        for d in fs.glob(f"{root.rstrip('/')}/step_*")
        if fs.exists(f"{d}/.metadata")
    ]
    return max(steps, default=0)


def crash_ranks(
    victims: list[psutil.Process],
    checkpoint_root: Path | str,
    bystanders: list[psutil.Process] | None = None,
) -> int:
    """SIGKILL the rank processes `victims`, as a crash would, at a checkpoint known to the
    test: first every victim and bystander (the job's other ranks) is stopped (SIGSTOP), so
    none finishes another checkpoint meanwhile; then the newest complete checkpoint under
    `checkpoint_root` is read, the victims are killed and the bystanders continued (SIGCONT).
    Returns that checkpoint's step: where the job must resume. A SIGKILLed rank records no
    exception, so the worker classes the attempt's failure `infra`."""
    everyone = [*victims, *(bystanders or [])]
    for proc in everyone:
        proc.suspend()
    try:
        step = newest_complete_step(checkpoint_root)
        for proc in victims:
            proc.kill()
    finally:
        for proc in everyone:
            with suppress(psutil.Error):  # a killed victim may be gone already
                proc.resume()
    return step


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup (`path`) of this test's making: a v1 memory controller group, or a v2
    group with the memory controller (`version` 2), as `workers.isolation.cgroups` uses."""

    path: Path
    version: int = 1

    def join(self, pid: int) -> None:
        """Move process `pid` (all its threads) here; its later children are born here."""
        (self.path / "cgroup.procs").write_text(str(pid))

    @property
    def anonymous(self) -> int:
        """Bytes of anonymous memory charged to the group and the groups below it now
        (`total_rss` of memory.stat: the worker puts each job in a group of its own below; what
        the kernel cannot reclaim without swap, which these hosts have none of)."""
        key = "anon " if self.version == 2 else "total_rss "  # v2's stats are hierarchical
        for line in (self.path / "memory.stat").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
        raise AssertionError(f"no {key.strip()} in {self.path}/memory.stat")

    def limit(self, step: Callable[[], int], timeout_s: float) -> int:
        """Cap the group at the least anonymous memory it held while the job trained one more
        step (`lowest_over_a_step`) plus `FILE_HEADROOM_BYTES`: page cache (the libraries'
        text, the logs) is reclaimed first, so the cap is on what cannot be; the next step's
        transient blocks (more than the headroom) then exceed it and the kernel's OOM killer
        ends the group's largest process. The kernel refuses (EBUSY) a cap below what it
        cannot reclaim: the write is retried, the cap raised by a quarter of the headroom each
        time (a CI host's reclaim was once too slow for the first cap within the timeout), so it
        settles just above what the group holds. Returns the cap in bytes."""
        cap = lowest_over_a_step(lambda: self.anonymous, step, timeout_s) + FILE_HEADROOM_BYTES
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                limit = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
                (self.path / limit).write_text(str(cap))
                return cap
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
            cap += FILE_HEADROOM_BYTES // 4
            time.sleep(POLL_S)


def memory_cgroup_v1(name: str) -> MemoryCgroup | None:
    """A new memory cgroup (v1) named `name` under this process's own, or None where the
    machine has no writable v1 memory controller."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent = CGROUP_V1_MEMORY / path.lstrip("/")
            try:
                (parent / name).mkdir()
            except OSError:
                return None
            return MemoryCgroup(parent / name)
    return None


def memory_cgroup_v2(name: str) -> MemoryCgroup | None:
    """A new v2 group named `name` with the memory controller, or None where the machine has
    no writable v2 hierarchy with memory (on a hybrid host memory is bound to v1). v2 lets no
    group with processes enable a controller for its children, the root excepted: the group is
    made beside this process's own, in a parent that hands memory down, or below the root."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():  # a hybrid or v1 host's root
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, _, path = line.split(":", 2)
        if hierarchy != "0":
            continue
        own = CGROUP_ROOT / path.lstrip("/")
        parent = own if own == CGROUP_ROOT else own.parent
        try:
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory")
            (parent / name).mkdir()
        except OSError:
            return None
        return MemoryCgroup(parent / name, version=2)
    return None


@contextmanager
def cgroup_for(name: str) -> Iterator[MemoryCgroup]:
    """A memory cgroup for the block, of the layout this host's memory controller is in (v1, or
    v2 on a host with the unified hierarchy only); skips the test where none can be made (the
    suite's skip budget then fails it, naming the capability). At the end its processes are
    moved back to the parent and it is removed."""
    group = memory_cgroup_v1(name) or memory_cgroup_v2(name)
    if group is None:
        pytest.skip("no writable memory cgroup (a v1 memory controller or v2 with memory)")
    try:
        yield group
    finally:
        for pid in (group.path / "cgroup.procs").read_text().split():
            with suppress(OSError):  # gone meanwhile
                (group.path.parent / "cgroup.procs").write_text(pid)
        # The worker's own job groups (workers.isolation.cgroups) below it, once empty, deepest
        # first.
        for child in sorted(group.path.rglob("*/"), key=lambda p: -len(p.parts)):
            if child.is_dir():
                with suppress(OSError):
                    child.rmdir()
        group.path.rmdir()


def can_mount() -> str | None:
    """Why this process cannot make read-only bind mounts (None when it can)."""
    if os.geteuid() != 0:
        return "read-only bind mounts need root"
    if shutil.which("mount") is None:
        return "no mount(8) on this machine"
    return None


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make `directory` read-only for every process, root included, until the block ends: a
    bind mount of it over itself, remounted read-only. Writes under it fail with EROFS, as on
    a storage volume that went read-only. Fails the test when the mount is refused."""
    bind = subprocess.run(
        ["mount", "--bind", str(directory), str(directory)], capture_output=True, text=True
    )
    if bind.returncode != 0:
        pytest.fail(f"mount --bind {directory}: {bind.stderr.strip()}")
    try:
        remount = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(directory)], capture_output=True, text=True
        )
        if remount.returncode != 0:
            pytest.fail(f"remount {directory} read-only: {remount.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def corrupt_jsonl_corpus(directory: Path, good_records: int, bad_line: str) -> Path:
    """A directory of JSONL text records whose last line is `bad_line` (say, a record cut
    short by a failed export). Registered as a directory, the API takes it for text and cannot
    see the records; the trainer reads them and meets the bad line. Returns `directory`."""
    directory.mkdir(parents=True)
    lines = [f'{{"text": "def f{i}(x):\\n    return x * {i}\\n"}}' for i in range(good_records)]
    (directory / "train.jsonl").write_text("\n".join([*lines, bad_line]) + "\n")
    return directory
