"""Prometheus `/metrics`, request ids and structured JSON logs for the API.

- Requests are counted and timed by route *template* (`/v1/jobs/{job_id}`), never the raw
  path, so the series count stays bounded (Prometheus naming and label guidance:
  https://prometheus.io/docs/practices/naming/).
- Jobs by state and queue depth per pool are read from Postgres at scrape time (one GROUP BY
  each): the database is the truth about jobs, whichever API replica is scraped.
- Every request gets a request id (the caller's `X-Request-ID` when sane, else a new one),
  echoed in the response header and carried, with the job id of the path, into every log
  record of the request (`contextvars`), which `core.platform.logs.JsonFormatter` writes as one JSON
  object.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _generate
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.platform.logs import configure_json_logging, job_id_var, request_id_var
from core.platform.tables import Job, JobState

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_JOB_PATH = re.compile(r"^/v1/jobs/(\d{1,18})(?:/|$)")
access_log = logging.getLogger("torchyard.access")


class ApiMetrics:
    """The API's metrics, in a registry of their own (one per app, so tests can build many)."""

    def __init__(self, sessionmaker: Any, streams: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "torchyard_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "torchyard_http_request_duration_seconds",
            "Time to answer (streams: to the first byte), by method and route template.",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.registry.register(_JobsCollector(sessionmaker, streams))

    def render(self) -> bytes:
        return _generate(self.registry)


class _JobsCollector(Collector):
    """Jobs by state and pool, queue depth per pool, stream watchers: read at scrape time."""

    def __init__(self, sessionmaker: Any, streams: Any) -> None:
        self.sessionmaker = sessionmaker
        self.streams = streams

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Names only: registering must not query the database.
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_state = GaugeMetricFamily(
            "torchyard_jobs", "Jobs in the database by state and pool.", labels=["state", "pool"]
        )
        depth = GaugeMetricFamily(
            "torchyard_queue_depth", "Queued jobs waiting for a worker, per pool.", labels=["pool"]
        )
        try:
            with self.sessionmaker() as session:
                rows = session.execute(
                    select(Job.state, Job.pool, func.count()).group_by(Job.state, Job.pool)
                ).all()
        except SQLAlchemyError:  # an outage must not take the other series down with it
            logging.getLogger("torchyard.api").exception("/metrics: cannot count jobs")
            rows = []
        pools: dict[str, int] = {}
        for state, pool, count in rows:
            by_state.add_metric([state, pool], count)
            pools.setdefault(pool, 0)
            if state == JobState.QUEUED:
                pools[pool] += count
        for pool, count in sorted(pools.items()):
            depth.add_metric([pool], count)
        watchers = GaugeMetricFamily(
            "torchyard_stream_watchers", "Open SSE job streams in this API process."
        )
        watchers.add_metric([], self.streams.num_watchers)
        feeds = GaugeMetricFamily(
            "torchyard_stream_feeds", "Job feeds (one DB poller each) in this API process."
        )
        feeds.add_metric([], len(self.streams.feeds))
        yield from (by_state, depth, watchers, feeds)


class RequestContext:
    """ASGI middleware: request id, route-template metrics and one JSON access log per request.

    Pure ASGI (not `BaseHTTPMiddleware`) so streamed responses pass through unbuffered.
    """

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        request_id = given if given and _REQUEST_ID.match(given) else secrets.token_hex(8)
        match = _JOB_PATH.match(scope.get("path", ""))
        rid_token = request_id_var.set(request_id)
        job_token = job_id_var.set(int(match[1]) if match else None)
        start = time.perf_counter()
        status = 500
        first_byte: float | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status, first_byte
            if message["type"] == "http.response.start":
                status = int(message["status"])
                first_byte = time.perf_counter() - start
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            elapsed = time.perf_counter() - start
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(
                first_byte if first_byte is not None else elapsed
            )
            access_log.info(
                "%s %s %d",
                method,
                route,
                status,
                extra={"path": scope.get("path"), "status": status, "duration_s": elapsed},
            )
            request_id_var.reset(rid_token)
            job_id_var.reset(job_token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def install(app: FastAPI) -> None:
    """Add the middleware, JSON logs and the unauthenticated `GET /metrics` to `app`."""
    metrics = ApiMetrics(app.state.sessionmaker, app.state.streams)
    app.state.metrics = metrics
    configure_json_logging()
    app.add_middleware(RequestContext, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics(request: Request) -> Response:
        # Unauthenticated like /healthz: scraped from inside the cluster; no tenant data.
        return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
