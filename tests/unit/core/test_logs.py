"""core.platform.logs: JSON log lines that carry the request and job ids of the work in progress."""

from __future__ import annotations

import io
import json
import logging

from core.platform.logs import ContextFilter, JsonFormatter, job_id_var, request_id_var


def _logger(stream: io.StringIO) -> logging.Logger:
    logger = logging.getLogger("torchyard.test_logs")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def test_each_record_is_one_json_object_with_the_job_id_of_the_task_in_progress() -> None:
    stream = io.StringIO()
    log = _logger(stream)
    token = job_id_var.set(42)
    try:
        log.info("flushed %d points", 10, extra={"points": 10})
    finally:
        job_id_var.reset(token)
    log.warning("idle")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "flushed 10 points" and first["job_id"] == 42
    assert first["points"] == 10 and first["level"] == "INFO"
    assert second["job_id"] is None


def test_an_explicit_job_id_wins_and_the_request_id_is_carried() -> None:
    stream = io.StringIO()
    log = _logger(stream)
    tokens = job_id_var.set(1), request_id_var.set("req-7")
    try:
        log.error("boom", extra={"job_id": 9})
    finally:
        job_id_var.reset(tokens[0])
        request_id_var.reset(tokens[1])
    record = json.loads(stream.getvalue())
    assert record["job_id"] == 9 and record["request_id"] == "req-7"
