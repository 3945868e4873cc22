"""Webhooks: subscriptions of a project, their secrets, pings, deliveries (project admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.deps import AdminPrincipal, SessionDep, SettingsDep
from api.errors import ERROR_RESPONSES
from api.schemas import webhooks as schemas
from core.platform.tables import WebhookDelivery, WebhookEvent, WebhookSubscription
from core.webhooks import subscriptions as webhooks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=ERROR_RESPONSES)

WebhookId = Annotated[str, Path(max_length=40, description="The webhook's id.")]
SecretId = Annotated[str, Path(max_length=40, description="The secret's id.")]
DeliveryId = Annotated[int, Path(ge=1, le=2**62, description="The delivery's id.")]


def _out(subscription: WebhookSubscription) -> schemas.Webhook:
    return schemas.Webhook(
        id=subscription.id,
        url=subscription.url,
        event_types=subscription.event_types,
        description=subscription.description,
        alert_rules=schemas.AlertRules.model_validate(subscription.alert_rules),
        secrets=[schemas.SecretInfo(**s) for s in subscription.secrets],
        created_at=subscription.created_at,
        disabled_at=subscription.disabled_at,
    )


def _delivery(
    delivery: WebhookDelivery, event: WebhookEvent, log: list[schemas.Attempt]
) -> schemas.Delivery:
    return schemas.Delivery(
        id=delivery.id,
        event_id=event.event_id,
        event_type=event.type,
        status=delivery.status,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at,
        last_status_code=delivery.last_status_code,
        last_response_ms=delivery.last_response_ms,
        last_error=delivery.last_error,
        created_at=delivery.created_at,
        delivered_at=delivery.delivered_at,
        log=log,
    )


@router.post("", status_code=201, response_model=schemas.WebhookCreated)
def create_webhook(
    body: schemas.WebhookCreate,
    principal: AdminPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> schemas.WebhookCreated:
    """Subscribe a URL to the project's events; the answer shows the signing secret once."""
    subscription = webhooks.create(
        session=session,
        project_id=principal.project_id,
        url=body.url,
        event_types=body.event_types,
        description=body.description,
        alert_rules=body.alert_rules.model_dump(),
        allow=settings.webhook_allow,
    )
    session.commit()
    secret = schemas.NewSecret(**subscription.secrets[0])
    return schemas.WebhookCreated(**_out(subscription).model_dump(), secret=secret)


@router.get("", response_model=schemas.WebhookList)
def list_webhooks(principal: AdminPrincipal, session: SessionDep) -> schemas.WebhookList:
    """The project's webhooks, oldest first (secrets without their values)."""
    found = webhooks.list_for(session=session, project_id=principal.project_id)
    return schemas.WebhookList(items=[_out(s) for s in found])


@router.get("/{webhook_id}", response_model=schemas.Webhook)
def get_webhook(
    webhook_id: WebhookId, principal: AdminPrincipal, session: SessionDep
) -> schemas.Webhook:
    """One webhook."""
    return _out(_find(session, principal.project_id, webhook_id))


@router.patch("/{webhook_id}", response_model=schemas.Webhook)
def update_webhook(
    webhook_id: WebhookId,
    body: schemas.WebhookUpdate,
    principal: AdminPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> schemas.Webhook:
    """Change a webhook's URL, event types, note or alert rules, or disable/enable it."""
    subscription = _find(session, principal.project_id, webhook_id)
    webhooks.update(
        session=session,
        subscription=subscription,
        changes=body.model_dump(exclude_unset=True, exclude_none=True),
        allow=settings.webhook_allow,
    )
    session.commit()
    return _out(subscription)


@router.delete("/{webhook_id}", status_code=204, response_class=Response)
def delete_webhook(webhook_id: WebhookId, principal: AdminPrincipal, session: SessionDep) -> None:
    """Delete a webhook with its pending deliveries and delivery log."""
    session.delete(_find(session, principal.project_id, webhook_id))
    session.commit()


@router.post("/{webhook_id}/secrets", status_code=201, response_model=schemas.NewSecret)
def add_webhook_secret(
    webhook_id: WebhookId, principal: AdminPrincipal, session: SessionDep
) -> schemas.NewSecret:
    """Rotate: add a signing secret (shown once). Until the old one is deleted, deliveries
    carry a signature by each."""
    subscription = _find(session, principal.project_id, webhook_id)
    secret = webhooks.add_secret(session=session, subscription=subscription)
    session.commit()
    return schemas.NewSecret(**secret)


@router.delete("/{webhook_id}/secrets/{secret_id}", status_code=204, response_class=Response)
def delete_webhook_secret(
    webhook_id: WebhookId, secret_id: SecretId, principal: AdminPrincipal, session: SessionDep
) -> None:
    """Remove a signing secret (409 for the last one)."""
    subscription = _find(session, principal.project_id, webhook_id)
    webhooks.delete_secret(session=session, subscription=subscription, secret_id=secret_id)
    session.commit()


@router.post("/{webhook_id}/ping", status_code=202, response_model=schemas.Delivery)
def ping_webhook(
    webhook_id: WebhookId, principal: AdminPrincipal, session: SessionDep
) -> schemas.Delivery:
    """Queue a `ping` event to this webhook; follow it in its deliveries."""
    subscription = _find(session, principal.project_id, webhook_id)
    delivery = webhooks.ping(session=session, subscription=subscription)
    session.commit()
    event = session.get(WebhookEvent, delivery.event_id)
    assert event is not None
    return _delivery(delivery, event, [])


@router.get("/{webhook_id}/deliveries", response_model=schemas.DeliveryList)
def list_webhook_deliveries(
    webhook_id: WebhookId, principal: AdminPrincipal, session: SessionDep
) -> schemas.DeliveryList:
    """The latest 100 deliveries, newest first, with status codes, response times and tries."""
    subscription = _find(session, principal.project_id, webhook_id)
    found = webhooks.deliveries(session=session, subscription=subscription)
    logs = webhooks.attempts_of(session=session, delivery_ids=[d.id for d, _ in found])
    return schemas.DeliveryList(
        items=[
            _delivery(d, e, [schemas.Attempt.model_validate(a) for a in logs[d.id]])
            for d, e in found
        ]
    )


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/redeliver",
    status_code=202,
    response_model=schemas.Delivery,
)
def redeliver_webhook_delivery(
    webhook_id: WebhookId, delivery_id: DeliveryId, principal: AdminPrincipal, session: SessionDep
) -> schemas.Delivery:
    """Send a delivery again with a fresh retry schedule (same `webhook-id`)."""
    subscription = _find(session, principal.project_id, webhook_id)
    delivery = webhooks.redeliver(
        session=session, subscription=subscription, delivery_id=delivery_id
    )
    session.commit()
    event = session.get(WebhookEvent, delivery.event_id)
    assert event is not None
    return _delivery(delivery, event, [])


def _find(session: SessionDep, project_id: str, webhook_id: str) -> WebhookSubscription:
    return webhooks.get_or_raise(session=session, project_id=project_id, subscription_id=webhook_id)
