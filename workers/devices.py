"""The devices of a worker's host and who holds them: several jobs per host, disjoint devices.

A worker owns its host's devices: the GPUs NVML finds (`nvidia-ml-py`), or, on a host without
GPUs, `TORCHYARD_WORKER_SLOTS` CPU slots (default 1: one job at a time). A node of a job asks for
`resources.procs_per_node` devices (`Job.slots`); the worker claims only a job that fits its
free devices (`core.scheduling.claim.claim_next(max_slots=...)`) and runs it with a `Lease` on the
lowest free indices: `CUDA_VISIBLE_DEVICES` on GPUs, a share of the host's cores on CPU
(`workers.launcher.trainer_env`). Leases of one host never overlap.

One `Allocator` per worker process (`host_allocator()`), shared by the threads of Celery's
`threads` pool; every method is thread-safe. Claim and lease happen together under its lock
(`claim`), so two deliveries never both count the same free device.

A CPU job larger than the whole host (4 processes on a 2-slot host) takes every slot and runs
alone: slots are a share of the CPUs, not a hard count, and such a job ran there before slots
existed. A GPU job larger than the host never fits it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import pynvml  # type: ignore[import-untyped]
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.platform.settings import Settings, get_settings
from core.platform.tables import Job
from core.scheduling import claim as scheduling
from workers.attempt import Dispatch, dispatch_safely

log = logging.getLogger(__name__)

T = TypeVar("T")
DeviceKind = Literal["cuda", "cpu"]


@dataclass(frozen=True, slots=True)
class Inventory:
    """The devices a worker hands out: their indices (CUDA's, in PCI bus order, or CPU slot
    numbers) and what they are."""

    kind: DeviceKind
    indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Lease:
    """Devices held by one node of one attempt until `Allocator.release`."""

    devices: tuple[int, ...]
    host_devices: int  # how many the host has (a CPU lease's share of the cores)


def gpu_indices() -> tuple[int, ...]:
    """Indices of the GPUs NVML sees, limited to the worker's own `CUDA_VISIBLE_DEVICES` when
    that is a list of indices; () without a driver (NVMLError) or GPUs."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    found = tuple(range(count))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(p.strip().isdigit() for p in visible.split(",") if p.strip()):
        allowed = {int(p) for p in visible.split(",") if p.strip()}
        found = tuple(i for i in found if i in allowed)
    return found


def inventory(settings: Settings, gpus: Sequence[int] | None = None) -> Inventory:
    """The host's devices: its GPUs (`gpus`, default `gpu_indices()`), else
    `settings.worker_slots` CPU slots (default 1). A `worker_slots` set on a GPU host limits
    the worker to its first that many GPUs."""
    found = tuple(gpu_indices() if gpus is None else gpus)
    if found:
        limit = settings.worker_slots or len(found)
        return Inventory("cuda", found[:limit])
    return Inventory("cpu", tuple(range(settings.worker_slots or 1)))


def busy_gpus() -> set[int]:
    """Indices of the GPUs with a compute process on them now, whoever started it (NVML);
    empty without a driver. A worker restarted while the trainers of its previous life still
    stop (they get SIGTERM when it dies, and checkpoint first) must not hand their GPUs out."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return set()
    try:
        busy = set()
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                busy.add(index)
        return busy
    except pynvml.NVMLError:
        log.exception("NVML: could not list the GPUs' processes; counting none busy")
        return set()
    finally:
        pynvml.nvmlShutdown()


class Allocator:
    """Hands out disjoint leases on a fixed set of devices; thread-safe.

    `busy()`: devices in use by processes no lease accounts for (`busy_gpus` on a GPU host);
    they are not handed out until they are free again."""

    def __init__(self, devices: Inventory, busy: Callable[[], set[int]] | None = None) -> None:
        self.inventory = devices
        self._free = set(devices.indices)
        self._busy = busy or set
        self._lock = threading.RLock()

    def _available(self) -> list[int]:
        return sorted(self._free - self._busy())

    @property
    def capacity(self) -> int:
        """Devices of the host."""
        return len(self.inventory.indices)

    @property
    def free(self) -> int:
        """Devices no lease holds now."""
        with self._lock:
            return len(self._free)

    def largest_fit(self) -> int | None:
        """The most devices a job may ask for and still get a lease now; None: any number (an
        idle CPU host takes a job of any size, alone)."""
        with self._lock:
            return self._fit(self._available())

    def largest_job(self) -> int | None:
        """The most devices a job may ask for and ever fit this host; None: any number (CPU)."""
        return None if self.inventory.kind == "cpu" else self.capacity

    def acquire(self, n: int) -> Lease | None:
        """A lease on the `n` lowest free devices, or None when fewer are free. Raises
        ValueError for n < 1."""
        with self._lock:
            return self._take(self._available(), n)

    def _fit(self, available: list[int]) -> int | None:
        if self.inventory.kind == "cpu" and len(available) == self.capacity:
            return None
        return len(available)

    def _take(self, available: list[int], n: int) -> Lease | None:
        if n < 1:
            raise ValueError(f"a lease needs at least 1 device, not {n}")
        if self.inventory.kind == "cpu" and n > self.capacity:
            n = self.capacity  # larger than the host: all of it, alone
        if n > len(available):
            return None
        taken = tuple(available[:n])
        self._free.difference_update(taken)
        return Lease(taken, self.capacity)

    def release(self, lease: Lease) -> None:
        """Give the lease's devices back. Raises ValueError when one of them is not held
        (a lease released twice, or another allocator's)."""
        with self._lock:
            held = set(self.inventory.indices) - self._free
            if not set(lease.devices) <= held:
                raise ValueError(f"devices {lease.devices} are not all leased")
            self._free.update(lease.devices)

    @contextlib.contextmanager
    def lease(self, n: int) -> Iterator[Lease | None]:
        """`acquire(n)`, released on exit; yields None (and holds nothing) when it does not fit."""
        held = self.acquire(n)
        try:
            yield held
        finally:
            if held is not None:
                self.release(held)

    def claim(
        self, take: Callable[[int | None], T | None], size: Callable[[T], int]
    ) -> tuple[T, Lease] | None:
        """Run `take(largest_fit())` (a claim of the best job that fits) and lease `size(job)`
        devices for what it returned, atomically: no other thread leases in between.

        Returns None when `take` returns None. Raises RuntimeError when `take` returns something
        larger than it was offered (a claim query that ignored `max_slots`)."""
        with self._lock:
            available = self._available()  # one look at the busy devices for both steps
            taken = take(self._fit(available))
            if taken is None:
                return None
            lease = self._take(available, size(taken))
            if lease is None:
                raise RuntimeError(
                    f"claimed {size(taken)} devices but only {len(available)} are free"
                )
            return taken, lease


_host: Allocator | None = None
_host_lock = threading.Lock()


def host_allocator() -> Allocator:
    """This worker process's allocator over `inventory(get_settings())`, made once (under a
    lock: two allocators of one host would double-book its devices)."""
    global _host
    with _host_lock:
        if _host is None:
            found = inventory(get_settings())
            log.info("worker devices: %d %s %s", len(found.indices), found.kind, found.indices)
            _host = Allocator(found, busy=busy_gpus if found.kind == "cuda" else None)
        return _host


@contextlib.contextmanager
def claimed(
    allocator: Allocator,
    claim: Callable[[int | None, scheduling.Reserve], Job | None],
    *,
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
) -> Iterator[tuple[Job, Lease] | None]:
    """Claim a job that fits the free devices and hold a lease on them for the block.

    `claim(max_slots, reserve)` claims the best queued job needing at most `max_slots` devices
    (None: any), unless the head of the queue reserves them (`scheduling.Reserve`, from
    `settings.reserve_after_s`); it runs under the allocator's lock. Yields (job, lease), or
    None when nothing was claimed. A claim that leaves devices free wakes the pool (another job
    may fit); the end of the block releases the lease and wakes the pool again."""
    reserve = scheduling.Reserve(settings.reserve_after_s, allocator.largest_job())
    got = allocator.claim(lambda fit: claim(fit, reserve), lambda job: job.slots)
    if got is None:
        yield None
        return
    job, lease = got
    try:
        if allocator.free:
            wake(factory=factory, pool=job.pool, dispatch=dispatch)
        yield got
    finally:
        give_back(allocator, lease, factory=factory, pool=job.pool, dispatch=dispatch)


def give_back(
    allocator: Allocator,
    lease: Lease,
    *,
    factory: Callable[[], Session],
    pool: str,
    dispatch: Dispatch,
) -> None:
    """Release `lease`, then `wake` the pool: the devices just freed may fit a job that a
    delivery found too large before."""
    allocator.release(lease)
    wake(factory=factory, pool=pool, dispatch=dispatch)


def wake(*, factory: Callable[[], Session], pool: str, dispatch: Dispatch) -> None:
    """Send one `workers.run_job` message for `pool` when a job is queued there.

    A message is a token ("a job of this pool is runnable"); a delivery that found no job
    fitting the free devices claimed nothing and its token is gone (`core.scheduling.claim`). So a
    worker wakes its pool when devices free up, and after a claim that left devices free (the
    next delivery claims another job or nothing: a chain as long as the free devices last).
    A DB error only logs: the reconciler re-sends jobs that stay queued."""
    try:
        with factory() as session:
            head = scheduling.head_of_queue(session=session, pool=pool)
    except SQLAlchemyError:
        log.exception("pool %r: could not look for queued jobs", pool)
        return
    if head is not None:
        dispatch_safely(dispatch, head, pool)
