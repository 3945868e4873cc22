"""Structured JSON logs for every process (API and workers): one JSON object per record, with
the request id and job id of the work in progress taken from `contextvars`.

The API sets both per request (`api.observability.RequestContext`); a worker sets the job id
for the duration of a task (`workers.tasks.run_job`). A record may also carry its own
`job_id` (`log.info(..., extra={"job_id": 7})`), which wins.
"""

from __future__ import annotations

import contextvars
import json
import logging
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
job_id_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("job_id", default=None)


class ContextFilter(logging.Filter):
    """Adds `request_id` and `job_id` of the current request or task to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        if getattr(record, "job_id", None) is None:
            record.job_id = job_id_var.get()
        return True


_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request_id, job_id, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logging(name: str = "torchyard", level: int = logging.INFO) -> None:
    """Send logger `name` (and its children; "" for the root) to stderr as JSON lines, once
    per process."""
    logger = logging.getLogger(name)
    if any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger.addHandler(handler)
    logger.setLevel(level)
    if name:
        logger.propagate = False
