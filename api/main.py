"""The FastAPI application factory: `uvicorn api.main:create_app --factory`."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import Depends, FastAPI
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware

from api import audit as audit_log
from api import (
    dashboard,
    docs_ui,
    errors,
    observability,
    openai_errors,
    openapi_examples,
    openapi_ids,
    permissions,
    ratelimit,
    webhook_loop,
)
from api.dispatch import Dispatcher
from api.limits import MAX_JSON_BYTES, BodyLimit
from api.routes import (
    audit,
    code,
    datasets,
    exports,
    health,
    job_data,
    jobs,
    keys,
    lora_exports,
    me,
    members,
    openai_files,
    openai_jobs,
    projects,
    quotas,
    service_accounts,
    sessions,
    spec,
    streams,
    sweeps,
    usage,
    webhooks,
    workers,
)
from api.routes.tinker_api import calls as tinker_calls
from api.routes.tinker_api import runs as tinker_runs
from api.routes.tinker_api import sessions as tinker
from api.streams import StreamHub
from core.access import oidc
from core.platform.db import SchemaNotMigrated, check_migrated, make_engine, session_factory
from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings, get_settings

log = logging.getLogger("torchyard.api")

UPLOAD_PATH = "/v1/datasets/upload"


class DatabaseUnavailable(RuntimeError):
    """The database could not be reached at startup."""


def _version() -> str:
    try:
        return version("torchyard")
    except PackageNotFoundError:
        return "0.0.0"


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Refuse to serve a database that is not migrated; release the engine and broker at exit."""
    engine = app.state.engine
    try:
        await run_in_threadpool(check_migrated, engine)
    except SchemaNotMigrated as exc:
        log.error("refusing to start: %s", exc)
        raise
    except SQLAlchemyError as exc:
        url = engine.url.render_as_string(hide_password=True)
        log.error("refusing to start: cannot reach database %s: %s", url, exc)
        raise DatabaseUnavailable(f"cannot reach database {url}: {exc}") from exc
    deliveries = webhook_loop.start(app)
    # Everything built so far (modules, the app, its schemas: ~180k objects) lives as long as
    # the process: out of the collector's reach, a full collection no longer walks it (it took
    # ~100 ms, the jobs list's p99 every few dozen requests). Python docs, `gc.freeze`.
    gc.freeze()
    try:
        yield
    finally:
        await webhook_loop.stop(deliveries)
        await app.state.streams.close()
        app.state.dispatcher.close()
        engine.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for `settings` (default: from the `TORCHYARD_*` environment)."""
    settings = settings or get_settings()
    limited = settings.rate_limit_per_minute is not None or settings.rate_limit_burst is not None
    app = FastAPI(
        title="Torchyard",
        version=_version(),
        summary="Training-as-a-service: submit PyTorch training jobs, follow them, get results.",
        description="Every request under `/v1` needs `Authorization: Bearer <api key>`. "
        'Every error has the body `{"error": {"code", "message", "details": '
        '[{"loc", "msg", "type"}]}}`.',
        lifespan=_lifespan,
        generate_unique_id_function=openapi_ids.operation_id,
        docs_url=None,  # served offline by api.docs_ui
        redoc_url=None,
        # Per-key request rates (settings.rate_limit_*): 429 with Retry-After; none unless set.
        dependencies=[Depends(ratelimit.limit_request)] if limited else None,
    )
    openapi_examples.install(app)  # the document keeps the nulls of its examples
    app.state.rate_limiter = ratelimit.RateLimiter(settings) if limited else None
    engine = make_engine(settings.database_url)
    app.state.settings = settings
    app.state.engine = engine
    app.state.dispatcher = Dispatcher(settings)
    # every job a request queues is sent after its commit (core.jobs.outbox)
    app.state.sessionmaker = session_factory(engine, dispatch=app.state.dispatcher.send)
    app.state.server_paths = ServerPaths.of(settings)  # kept out of answers (api.redaction)
    app.state.streams = StreamHub(app.state.sessionmaker, paths=app.state.server_paths)
    app.state.oidc = (
        oidc.Verifier(settings) if settings.oidc_issuer else None
    )  # SSO (core.access.oidc)

    errors.install(app)
    openai_errors.install(app)  # OpenAI's error shape under /openai/
    # Uploads stream under limits of their own (api.uploads).
    app.add_middleware(
        BodyLimit,
        max_bytes=MAX_JSON_BYTES,
        exempt={UPLOAD_PATH, code.PATH, openai_files.FILES_PATH},
    )
    # Inside the request context (its request id), outside everything that may refuse.
    app.add_middleware(audit_log.AuditLog, engine=engine, trusted_proxies=settings.trusted_proxies)
    # JSON and pages gzipped for clients that accept it (the dashboard's metric series and the
    # OpenAPI document shrink ~5x); event streams and binary downloads (weights) pass as they are.
    app.add_middleware(
        GZipMiddleware,
        minimum_size=1024,
        # zlib level 1, not starlette's 9: a 1M-point series (28 MB of JSON) took 3.4 s at 9 and
        # 0.24 s at 1, for a body only 9% larger (bench.query `full_series_once_ms`).
        compresslevel=1,
        exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/octet-stream"),
    )
    observability.install(app)  # outermost: request ids and metrics cover every answer
    routers = (
        health,
        me,
        jobs,
        job_data,
        exports,
        lora_exports,
        streams,
        datasets,
        code,
        spec,
        quotas,
        workers,
    )
    domains = (sweeps, sessions, usage, webhooks, audit)
    access = (projects, members, service_accounts, keys)
    for module in (
        *routers,
        *domains,
        *access,
        openai_files,
        openai_jobs,
        tinker,
        tinker_calls,
        tinker_runs,
    ):
        permissions.document(module.router)  # x-permission on each operation
        app.include_router(module.router)

    docs_ui.mount(app)
    dashboard.mount(app)
    return app
