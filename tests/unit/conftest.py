"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread, as the trainer's launcher gives each rank on a shared CPU host: the
    suite runs on several xdist workers, and two threads each on a loaded 2-core machine made a
    training test 20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
