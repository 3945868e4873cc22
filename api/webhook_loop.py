"""The webhook delivery loop each API process runs in its lifespan (`webhook_deliver_in_api`).

Every `webhook_deliver_interval_s` it sends what is due (`core.webhooks.delivery.deliver_due`,
in a thread) and evaluates the periodic alerts. Several API processes may run it at once: a
delivery is claimed with `FOR UPDATE SKIP LOCKED` on Postgres, and SQLite serialises writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from core.jobs import alerts
from core.platform.settings import Settings
from core.webhooks import delivery as webhook_delivery

log = logging.getLogger("torchyard.webhooks")


def tick(app: FastAPI) -> int:
    """One round: evaluate the periodic alerts, send the due deliveries; returns how many
    deliveries were tried."""
    settings: Settings = app.state.settings
    with app.state.sessionmaker() as session:
        alerts.check_periodic(session=session)
        session.commit()
    return webhook_delivery.deliver_due(
        session_factory=app.state.sessionmaker,
        allow=settings.webhook_allow,
        paths=app.state.server_paths,
        timeout_s=settings.webhook_timeout_s,
    )


async def _run(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    while True:
        try:
            await run_in_threadpool(tick, app)
        except Exception:  # a database outage: log it, try again next round
            log.exception("webhook delivery round failed")
        await asyncio.sleep(settings.webhook_deliver_interval_s)


def start(app: FastAPI) -> asyncio.Task[None] | None:
    """Start the loop when the settings ask for it; the task to pass to `stop`."""
    if not app.state.settings.webhook_deliver_in_api:
        return None
    return asyncio.create_task(_run(app), name="webhook-delivery")


async def stop(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
