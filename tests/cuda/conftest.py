"""The CUDA tests (`pytest -m cuda`, issue 50): the trainer on a GPU host, in the device batch
(`bench/gpu_round2.sh`), never in CI, which has no GPU (tests/conftest.py deselects them unless
`-m` names `cuda`).

On a GPU host the image may lack the service's dependencies, so the batch runs this folder with
`--confcutdir tests/cuda` (tests/conftest.py, which imports the control plane, is not loaded)
and these fixtures stand alone. Selected without a CUDA device, every test fails saying so:
a skip would read as green."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.training import stdlib_corpus


@pytest.fixture(autouse=True)
def _a_cuda_device() -> None:
    assert torch.cuda.is_available(), (
        "no CUDA device: the cuda tests run on a GPU host (bench/gpu_round2.sh); CI deselects them"
    )


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred KB of the standard library's own source (as tests/conftest.py's)."""
    return stdlib_corpus(tmp_path_factory.mktemp("corpus"))
