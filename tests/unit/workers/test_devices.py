"""A worker's device inventory and allocator: disjoint leases on the lowest free indices."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from core.platform.settings import Settings
from workers.devices import Allocator, Inventory, gpu_indices, inventory


def cpu(slots: int) -> Allocator:
    return Allocator(Inventory("cpu", tuple(range(slots))))


def test_leases_take_the_lowest_free_indices_and_a_release_frees_them() -> None:
    host = cpu(4)
    one, two, three = host.acquire(1), host.acquire(2), host.acquire(1)
    assert (one, two, three) != (None, None, None)
    assert [lease.devices for lease in (one, two, three) if lease] == [(0,), (1, 2), (3,)]
    assert host.free == 0 and host.acquire(1) is None
    assert two is not None
    host.release(two)
    assert host.free == 2
    big = host.acquire(2)
    assert big is not None and big.devices == (1, 2) and big.host_devices == 4


def test_a_job_that_does_not_fit_gets_nothing_and_holds_nothing() -> None:
    host = cpu(4)
    held = host.acquire(3)
    assert held is not None
    assert host.acquire(2) is None
    assert host.free == 1


def test_releasing_twice_or_a_foreign_lease_is_refused() -> None:
    host = cpu(2)
    lease = host.acquire(1)
    assert lease is not None
    host.release(lease)
    with pytest.raises(ValueError, match="not all leased"):
        host.release(lease)
    with pytest.raises(ValueError, match="at least 1"):
        host.acquire(0)


def test_the_context_manager_releases_on_exit_and_on_error() -> None:
    host = cpu(2)
    with host.lease(2) as lease:
        assert lease is not None and host.free == 0
        with host.lease(1) as none:
            assert none is None
    assert host.free == 2
    with pytest.raises(RuntimeError), host.lease(1):
        raise RuntimeError("launch failed")
    assert host.free == 2


def test_a_cpu_job_larger_than_the_host_takes_all_of_it_when_idle() -> None:
    host = cpu(2)
    assert host.largest_fit() is None  # idle: any size runs, alone
    lease = host.acquire(4)
    assert lease is not None and lease.devices == (0, 1)
    host.release(lease)
    small = host.acquire(1)
    assert host.largest_fit() == 1 and host.acquire(4) is None
    assert small is not None


def test_a_gpu_job_larger_than_the_host_never_fits() -> None:
    host = Allocator(Inventory("cuda", (0, 1)))
    assert host.largest_fit() == 2
    assert host.acquire(4) is None


def test_claim_offers_the_free_count_and_leases_what_was_claimed_atomically() -> None:
    host = cpu(4)
    host.acquire(3)
    offered: list[int | None] = []

    def take(fit: int | None) -> int:
        offered.append(fit)
        return 1

    claimed = host.claim(take, size=lambda slots: slots)
    assert offered == [1] and claimed is not None and claimed[1].devices == (3,)
    assert host.claim(lambda fit: None, size=lambda slots: 1) is None
    with pytest.raises(RuntimeError, match="only 0 are free"):
        host.claim(lambda fit: 1, size=lambda slots: slots)


def test_concurrent_acquires_from_threads_never_overlap() -> None:
    host = cpu(8)
    held: list[tuple[int, ...]] = []
    overlaps: list[tuple[int, ...]] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def churn(size: int) -> None:
        start.wait()
        for _ in range(300):
            lease = host.acquire(size)
            if lease is None:
                continue
            with lock:
                in_use = Counter(d for devices in held for d in devices)
                if any(in_use[d] for d in lease.devices):
                    overlaps.append(lease.devices)
                held.append(lease.devices)
            with lock:
                held.remove(lease.devices)
            host.release(lease)

    threads = [threading.Thread(target=churn, args=(1 + i % 3,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and host.free == 8


def test_inventory_is_the_gpus_else_the_configured_cpu_slots() -> None:
    assert gpu_indices() == ()  # no NVIDIA driver on this machine: NVMLError, no GPUs
    assert inventory(Settings(), gpus=()) == Inventory("cpu", (0,))
    assert inventory(Settings(worker_slots=4), gpus=()) == Inventory("cpu", (0, 1, 2, 3))
    assert inventory(Settings(), gpus=(0, 1, 2)) == Inventory("cuda", (0, 1, 2))
    assert inventory(Settings(worker_slots=2), gpus=(0, 1, 2)) == Inventory("cuda", (0, 1))


def test_a_worker_runs_one_pool_thread_per_device_and_the_reconciler_one_thread() -> None:
    from types import SimpleNamespace

    from workers.__main__ import celery_argv
    from workers.app import _size_pool
    from workers.devices import host_allocator

    worker = celery_argv("worker", "gpu-a100", [])
    assert worker[worker.index("--pool") + 1] == "threads" and "--concurrency" not in worker
    exporter = celery_argv("exporter", "exports", [], concurrency=3)
    assert exporter[:6] == ["worker", "-Q", "exports", "--pool", "threads", "--concurrency"]
    assert exporter[6] == "3"  # exports take no device: their own count, not the host's
    control = celery_argv("control", "default", [])
    assert control[control.index("--pool") :][:4] == ["--pool", "solo", "--concurrency", "1"]
    conf = SimpleNamespace(worker_concurrency=0)
    _size_pool(conf=conf, options={"concurrency": None})
    assert conf.worker_concurrency == host_allocator().capacity
    conf = SimpleNamespace(worker_concurrency=3)  # an explicit --concurrency 3 wins
    _size_pool(conf=conf, options={"concurrency": 3})
    assert conf.worker_concurrency == 3


def test_devices_busy_with_processes_no_lease_holds_are_not_handed_out() -> None:
    busy = {0, 2}  # e.g. trainers of a restarted worker's previous life, still stopping
    host = Allocator(Inventory("cuda", (0, 1, 2, 3)), busy=lambda: set(busy))
    assert host.largest_fit() == 2
    lease = host.acquire(2)
    assert lease is not None and lease.devices == (1, 3)
    assert host.acquire(1) is None
    busy.clear()  # they exited
    assert host.largest_fit() == 2
    again = host.acquire(2)
    assert again is not None and again.devices == (0, 2)
