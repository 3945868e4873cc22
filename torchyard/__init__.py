"""Torchyard client SDK and CLI.

    from torchyard import Client
    client = Client()                      # TORCHYARD_URL, TORCHYARD_API_KEY or `torchyard login`
    job = client.jobs.create(spec)
    job = client.jobs.wait(job.id)

Imports nothing from the server packages (api, core, workers) and no torch. The names below are
loaded on first use, so `import torchyard.train` (what a training script imports) pulls in
nothing but the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchyard.client import Client, Datasets, Jobs
    from torchyard.errors import (
        ApiError,
        BadRequest,
        Conflict,
        ConnectionFailed,
        ErrorDetail,
        NotFound,
        PayloadTooLarge,
        PermissionDenied,
        RateLimited,
        ServerError,
        TorchyardError,
        Unauthorized,
        ValidationFailed,
    )
    from torchyard.types import (
        TERMINAL_STATES,
        Checkpoint,
        CodeArchive,
        Dataset,
        DatasetStats,
        Event,
        Job,
        LogLine,
        Me,
        MetricPoint,
        MetricSeries,
        Page,
    )

__all__ = [
    "TERMINAL_STATES",
    "ApiError",
    "BadRequest",
    "Checkpoint",
    "Client",
    "CodeArchive",
    "Conflict",
    "ConnectionFailed",
    "Dataset",
    "DatasetStats",
    "Datasets",
    "ErrorDetail",
    "Event",
    "Job",
    "Jobs",
    "LogLine",
    "Me",
    "MetricPoint",
    "MetricSeries",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "ServerError",
    "TorchyardError",
    "Unauthorized",
    "ValidationFailed",
]


_MODULES = {
    "Client": "client",
    "Datasets": "client",
    "Jobs": "client",
    **dict.fromkeys(
        ["ApiError", "BadRequest", "Conflict", "ConnectionFailed", "ErrorDetail", "NotFound",
         "PayloadTooLarge", "PermissionDenied", "RateLimited", "ServerError", "TorchyardError",
         "Unauthorized", "ValidationFailed"],
        "errors",
    ),
    **dict.fromkeys(
        ["TERMINAL_STATES", "Checkpoint", "CodeArchive", "Dataset", "DatasetStats", "Event", "Job",
         "LogLine", "Me", "MetricPoint", "MetricSeries", "Page"],
        "models",
    ),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """`torchyard.Client` and the other public names, imported from their module on first use.
    Raises `AttributeError` for any other name."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'torchyard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"torchyard.{module}"), name)
    globals()[name] = value
    return value
