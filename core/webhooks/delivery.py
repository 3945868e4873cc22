"""Sending the outbox: `deliver_due` claims due deliveries, POSTs them signed, records the try.

At least once: a delivery is claimed by a short transaction (`SELECT ... FOR UPDATE SKIP
LOCKED`, so several processes may run `deliver_due` at once; SQLite serialises writers
instead) that pushes its `next_attempt_at` out by a lease; the POST happens outside any
transaction, and its result is recorded fenced on the claimed attempt number. A process that
dies mid-send leaves the delivery to be claimed again when the lease ends.

Signatures follow Standard Webhooks (https://www.standardwebhooks.com/) with its library:
`webhook-id` (the event's id, the same on every retry: receivers dedupe on it),
`webhook-timestamp` (Unix seconds of this send) and `webhook-signature`, one `v1,<base64
HMAC-SHA256>` per secret of the subscription, space-separated (rotation).

Retries: after failed attempt n (1-based) the next waits a random time in
[RETRY_SCHEDULE_S[n-1] / 2, RETRY_SCHEDULE_S[n-1]] ("equal jitter": spread like full jitter,
but never an immediate retry against a receiver that is down); after MAX_ATTEMPTS tries, about
24 hours after the first at the latest, the delivery is `dead`. Redeliver starts it again.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

from core.platform.server_paths import ServerPaths
from core.platform.tables import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    WebhookSubscription,
    utcnow,
)
from core.webhooks import targets as webhook_targets

# Seconds before retry n (after failed attempt n): 5 s, 30 s, 2 min, 10 min, 30 min, 1 h, 2 h,
# 4 h, 8 h, 8 h (about 23.7 h in all, at most).
RETRY_SCHEDULE_S = (5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 28800)
MAX_ATTEMPTS = len(RETRY_SCHEDULE_S) + 1
ERROR_CHARS = 500
USER_AGENT = "torchyard-webhooks/1"


def retry_delay_s(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based), with equal jitter."""
    base = RETRY_SCHEDULE_S[min(attempt, len(RETRY_SCHEDULE_S)) - 1]
    return (rng or random).uniform(base / 2, base)


def body(event: WebhookEvent, paths: ServerPaths) -> str:
    """The JSON body of an event, identical on every retry, with the server's directories in
    its strings (a failure's message, say) made relative to them (`core.platform.server_paths`)."""
    created = event.created_at
    if created.tzinfo is None:  # SQLite hands back naive UTC
        created = created.replace(tzinfo=UTC)
    return json.dumps(
        {
            "id": event.event_id,
            "type": event.type,
            "timestamp": created.isoformat(),
            "project_id": event.project_id,
            "sequence": event.id,
            "data": paths.hide(event.payload),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def sign(*, secrets: list[dict[str, Any]], msg_id: str, at: datetime, data: str) -> dict[str, str]:
    """The Standard Webhooks headers for `data`: one `v1,` signature per secret."""
    signatures = " ".join(Webhook(s["secret"]).sign(msg_id, at, data) for s in secrets)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    attempt: int


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    response_ms: float | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def claim(*, session: Session, now: datetime, limit: int, lease_s: float) -> list[Claimed]:
    """Take up to `limit` due deliveries of enabled subscriptions: attempt + 1, and
    `next_attempt_at` pushed out by `lease_s` while the send is in flight. Commits."""
    rows = session.execute(
        select(WebhookDelivery.id, WebhookDelivery.attempts)
        .join(WebhookSubscription, WebhookSubscription.id == WebhookDelivery.subscription_id)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING,
            WebhookDelivery.next_attempt_at <= now,
            WebhookSubscription.disabled_at.is_(None),
        )
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=WebhookDelivery)
    ).all()
    claimed = [Claimed(delivery_id=row[0], attempt=row[1] + 1) for row in rows]
    for c in claimed:
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == c.delivery_id)
            .values(attempts=c.attempt, next_attempt_at=now + timedelta(seconds=lease_s))
        )
    session.commit()
    return claimed


@dataclass(frozen=True)
class Message:
    """What one send needs, read before the POST so no transaction stays open during it."""

    url: str
    secrets: list[dict[str, Any]]
    msg_id: str
    data: str


def _message(session: Session, delivery_id: int, paths: ServerPaths) -> Message | None:
    """What to send for a claimed delivery; None when its webhook was deleted meanwhile."""
    row = session.execute(
        select(WebhookSubscription, WebhookEvent)
        .join(WebhookDelivery, WebhookDelivery.subscription_id == WebhookSubscription.id)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.id == delivery_id)
    ).first()
    if row is None:
        return None
    subscription, event = row
    return Message(subscription.url, list(subscription.secrets), event.event_id, body(event, paths))


def send(*, client: httpx.Client, message: Message, allow: list[str]) -> Outcome:
    """POST a message to its URL (checked again, connected to by the checked address, no
    redirects). Never raises for what the receiver or the network does."""
    data = message.data
    headers = sign(secrets=message.secrets, msg_id=message.msg_id, at=datetime.now(UTC), data=data)
    try:
        target = webhook_targets.check(message.url, allow=allow)
    except webhook_targets.RefusedDestination as exc:
        return Outcome(status_code=None, response_ms=None, error=f"refused: {exc}")
    url = httpx.URL(target.url)
    headers["host"] = url.netloc.decode("ascii")
    extensions = {"sni_hostname": target.host} if url.scheme == "https" else {}
    started = time.perf_counter()
    try:
        answer = client.post(
            url.copy_with(host=target.address),
            content=data.encode(),
            headers=headers,
            extensions=extensions,
        )
    except httpx.HTTPError as exc:
        elapsed = (time.perf_counter() - started) * 1000
        return Outcome(None, elapsed, f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])
    elapsed = (time.perf_counter() - started) * 1000
    error = None if 200 <= answer.status_code < 300 else answer.text[:ERROR_CHARS]
    return Outcome(status_code=answer.status_code, response_ms=elapsed, error=error)


def record(*, session: Session, claimed: Claimed, outcome: Outcome, now: datetime) -> None:
    """Log the attempt and move the delivery on: delivered, retried later, or dead. Fenced on
    the claimed attempt (a redeliver meanwhile wins). Commits."""
    session.add(
        WebhookAttempt(
            delivery_id=claimed.delivery_id,
            attempt=claimed.attempt,
            status_code=outcome.status_code,
            response_ms=outcome.response_ms,
            error=outcome.error,
            at=now,
        )
    )
    values: dict[str, Any] = {
        "last_status_code": outcome.status_code,
        "last_response_ms": outcome.response_ms,
        "last_error": outcome.error,
    }
    if outcome.ok:
        values.update(status=DeliveryStatus.DELIVERED, delivered_at=now, next_attempt_at=None)
    elif claimed.attempt >= MAX_ATTEMPTS:
        values.update(status=DeliveryStatus.DEAD, next_attempt_at=None)
    else:
        delay = retry_delay_s(claimed.attempt)
        values.update(next_attempt_at=now + timedelta(seconds=delay))
    session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == claimed.delivery_id,
            WebhookDelivery.attempts == claimed.attempt,
            WebhookDelivery.status == DeliveryStatus.PENDING,
        )
        .values(**values)
    )
    session.commit()


def deliver_due(
    *,
    session_factory: Callable[[], Session],
    allow: list[str],
    paths: ServerPaths,
    timeout_s: float = 10.0,
    now: datetime | None = None,
    limit: int = 100,
    client: httpx.Client | None = None,
) -> int:
    """Send up to `limit` deliveries due at `now` (default: the clock), one after the other;
    returns how many were tried. `now` drives the schedule only (tests pass a later one
    instead of sleeping); signatures carry the real time. `paths`: the server's directories,
    hidden in every body. Raises only database errors."""
    now = now or utcnow()
    with session_factory() as session:
        claimed = claim(session=session, now=now, limit=limit, lease_s=timeout_s + 60)
    if not claimed:
        return 0
    own = client is None
    http = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
    try:
        for c in claimed:
            with session_factory() as session:
                message = _message(session, c.delivery_id, paths)
            if message is None:
                continue
            outcome = send(client=http, message=message, allow=allow)
            with session_factory() as session:
                try:
                    record(session=session, claimed=c, outcome=outcome, now=now)
                except IntegrityError:  # the webhook was deleted during the send
                    session.rollback()
    finally:
        if own:
            http.close()
    return len(claimed)
