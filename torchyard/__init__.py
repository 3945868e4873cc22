"""Torchyard client SDK and CLI.

    from torchyard import Client
    client = Client()                      # TORCHYARD_URL, TORCHYARD_API_KEY or `torchyard login`
    job = client.jobs.create(spec)
    job = client.jobs.wait(job.id)

Imports nothing from the server packages (api, core, workers) and no torch.
"""

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
from torchyard.models import (
    TERMINAL_STATES,
    Checkpoint,
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
