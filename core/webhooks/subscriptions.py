"""Webhook subscriptions and the outbox (docs/CONTRACTS.md section 6).

`emit` writes an event to the outbox (`webhook_events`) and one pending delivery per matching
subscription in the caller's transaction: the event exists exactly when the change it reports
committed, so no event is lost when a process dies after the commit, and a rolled-back change
emits nothing. `core.webhooks.delivery.deliver_due` sends what is due.

Event types: `job.<state>` for every job state change (`job.queued`, `job.running`,
`job.paused`, `job.succeeded`, `job.failed`, `job.cancelled`, `job.pruned`, ...), `job.preempted`,
`checkpoint.saved`, `export.ready`, `alert.<kind>` (core/jobs/alerts.py) and `ping`.
"""

from __future__ import annotations

import base64
import secrets as secrets_lib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.errors import Conflict, NotFound
from core.platform.tables import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    WebhookSubscription,
    utcnow,
)
from core.webhooks import targets as webhook_targets

EVENT_TYPES = (
    "job.queued",
    "job.starting",
    "job.running",
    "job.pausing",
    "job.paused",
    "job.preempting",
    "job.cancelling",
    "job.cancelled",
    "job.pruned",
    "job.restarting",
    "job.succeeded",
    "job.failed",
    "job.preempted",
    "checkpoint.saved",
    "export.ready",
    "alert.nan_loss",
    "alert.loss_spike",
    "alert.eval_regression",
    "alert.stalled",
    "alert.queued_too_long",
    "ping",
)
MAX_SECRETS = 5


def matches(patterns: Sequence[str], type: str) -> bool:
    """Whether an event `type` matches a subscription's `event_types` (exact, or `prefix.*`,
    or `*`)."""
    for pattern in patterns:
        if pattern == type or pattern == "*":
            return True
        if pattern.endswith("*") and type.startswith(pattern[:-1]):
            return True
    return False


def new_secret() -> dict[str, Any]:
    """A fresh signing secret (`whsec_` + base64 of 24 random bytes) with its id."""
    raw = base64.b64encode(secrets_lib.token_bytes(24)).decode()
    return {
        "id": f"whs_{secrets_lib.token_hex(6)}",
        "secret": f"whsec_{raw}",
        "created_at": utcnow().isoformat(),
    }


def create(
    *,
    session: Session,
    project_id: str,
    url: str,
    event_types: Sequence[str],
    allow: Sequence[str],
    description: str = "",
    alert_rules: dict[str, Any] | None = None,
) -> WebhookSubscription:
    """A new subscription with one secret. Raises InvalidInput (422 at `body.url`) for a
    destination the SSRF check refuses. Does not commit."""
    webhook_targets.check_or_invalid(url, allow=allow)
    subscription = WebhookSubscription(
        id=f"wh_{secrets_lib.token_hex(8)}",
        project_id=project_id,
        url=url,
        event_types=list(event_types),
        secrets=[new_secret()],
        alert_rules=alert_rules or {},
        description=description,
        created_at=utcnow(),
    )
    session.add(subscription)
    session.flush()
    return subscription


def get_or_raise(*, session: Session, project_id: str, subscription_id: str) -> WebhookSubscription:
    """The project's subscription; NotFound for another project's or none."""
    subscription = session.get(WebhookSubscription, subscription_id)
    if subscription is None or subscription.project_id != project_id:
        raise NotFound(f"webhook {subscription_id} not found")
    return subscription


def list_for(*, session: Session, project_id: str) -> list[WebhookSubscription]:
    query = select(WebhookSubscription).where(WebhookSubscription.project_id == project_id)
    return list(session.scalars(query.order_by(WebhookSubscription.created_at)))


def update(
    *,
    session: Session,
    subscription: WebhookSubscription,
    changes: dict[str, Any],
    allow: Sequence[str],
) -> WebhookSubscription:
    """Apply `changes` (url, event_types, description, alert_rules, disabled). A new url is
    checked as at creation. Does not commit."""
    if "url" in changes:
        webhook_targets.check_or_invalid(changes["url"], allow=allow)
        subscription.url = changes["url"]
    for field in ("event_types", "description", "alert_rules"):
        if field in changes:
            setattr(subscription, field, changes[field])
    if "disabled" in changes:
        subscription.disabled_at = utcnow() if changes["disabled"] else None
    session.flush()
    return subscription


def add_secret(*, session: Session, subscription: WebhookSubscription) -> dict[str, Any]:
    """Rotate: add a new secret (returned with its value, once). Every listed secret signs
    until removed. Conflict beyond MAX_SECRETS. Does not commit."""
    if len(subscription.secrets) >= MAX_SECRETS:
        raise Conflict(f"a webhook has at most {MAX_SECRETS} secrets; delete an old one first")
    secret = new_secret()
    subscription.secrets = [*subscription.secrets, secret]
    session.flush()
    return secret


def delete_secret(*, session: Session, subscription: WebhookSubscription, secret_id: str) -> None:
    """Remove a secret; NotFound if unknown, Conflict for the last one. Does not commit."""
    kept = [s for s in subscription.secrets if s["id"] != secret_id]
    if len(kept) == len(subscription.secrets):
        raise NotFound(f"secret {secret_id} not found")
    if not kept:
        raise Conflict("cannot delete the last secret of a webhook; add a new one first")
    subscription.secrets = kept
    session.flush()


def emit(
    *,
    session: Session,
    project_id: str,
    type: str,
    payload: dict[str, Any],
    subscription_ids: Sequence[str] | None = None,
) -> WebhookEvent | None:
    """Write event `type` with `payload` to the outbox, and a pending delivery per enabled
    subscription of the project whose `event_types` match (or, with `subscription_ids`, to
    those subscriptions only, whatever their types). Nothing is written when none matches.
    In the caller's transaction; does not commit."""
    # Two columns, not the entities: every job event of every project runs this query, and
    # loading subscription objects (secrets and all) costs more than the query itself.
    query = select(WebhookSubscription.id, WebhookSubscription.event_types).where(
        WebhookSubscription.project_id == project_id, WebhookSubscription.disabled_at.is_(None)
    )
    if subscription_ids is not None:
        query = query.where(WebhookSubscription.id.in_(list(subscription_ids)))
    targets = [
        subscription_id
        for subscription_id, event_types in session.execute(query)
        if subscription_ids is not None or matches(event_types, type)
    ]
    if not targets:
        return None
    now = utcnow()
    event = WebhookEvent(
        event_id=f"msg_{secrets_lib.token_hex(12)}",
        project_id=project_id,
        type=type,
        payload=payload,
        created_at=now,
    )
    session.add(event)
    session.flush()
    for subscription_id in targets:
        session.add(
            WebhookDelivery(
                subscription_id=subscription_id,
                event_id=event.id,
                status=DeliveryStatus.PENDING,
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
        )
    return event


def ping(*, session: Session, subscription: WebhookSubscription) -> WebhookDelivery:
    """Queue a `ping` event to this subscription. Does not commit."""
    event = emit(
        session=session,
        project_id=subscription.project_id,
        type="ping",
        payload={"webhook_id": subscription.id},
        subscription_ids=[subscription.id],
    )
    assert event is not None
    session.flush()
    return session.scalars(
        select(WebhookDelivery).where(WebhookDelivery.event_id == event.id)
    ).one()


def deliveries(
    *, session: Session, subscription: WebhookSubscription, limit: int = 100
) -> list[tuple[WebhookDelivery, WebhookEvent]]:
    """The subscription's latest deliveries, newest first, with their events."""
    query = (
        select(WebhookDelivery, WebhookEvent)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.subscription_id == subscription.id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
    )
    return [(row[0], row[1]) for row in session.execute(query)]


def attempts_of(
    *, session: Session, delivery_ids: Sequence[int]
) -> dict[int, list[WebhookAttempt]]:
    """The delivery log of each delivery, oldest attempt first."""
    found: dict[int, list[WebhookAttempt]] = {i: [] for i in delivery_ids}
    query = (
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_id.in_(list(delivery_ids)))
        .order_by(WebhookAttempt.id)
    )
    for attempt in session.scalars(query):
        found[attempt.delivery_id].append(attempt)
    return found


def redeliver(
    *,
    session: Session,
    subscription: WebhookSubscription,
    delivery_id: int,
    now: datetime | None = None,
) -> WebhookDelivery:
    """Send a delivery again (whatever its status) with a fresh retry schedule; the event keeps
    its `webhook-id`. NotFound for a delivery of another subscription. Does not commit."""
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.subscription_id != subscription.id:
        raise NotFound(f"delivery {delivery_id} not found")
    delivery.status = DeliveryStatus.PENDING
    delivery.attempts = 0
    delivery.next_attempt_at = now or utcnow()
    delivery.delivered_at = None
    session.flush()
    return delivery
