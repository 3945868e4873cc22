"""Request and response bodies of `/v1/webhooks` (api/routes/webhooks.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

from api import openapi_examples
from api.schemas import Timestamp
from api.validation import JsonInt

_SECRET_INFO_EXAMPLE = {"id": "whs_5e8c0a1d3f5b", "created_at": "2026-11-20T08:05:00Z"}
_NEW_SECRET_EXAMPLE = {
    **_SECRET_INFO_EXAMPLE,
    "secret": "whsec_MfKQ9r8GKYqXTwmxfL5c2lU9lHw3Cz1y",
}
_WEBHOOK_EXAMPLE = {
    "id": "wh_7d2b4f6e8c0a1d3f",
    "url": "https://ci.example.com/hooks/torchyard",
    "event_types": ["job.*", "checkpoint.saved"],
    "description": "CI notifications",
    "alert_rules": {
        "nan_loss": True,
        "loss_spike_factor": 3.0,
        "loss_spike_window": 20,
        "eval_regression_margin": None,
        "stalled_minutes": 30.0,
        "queued_minutes": None,
    },
    "secrets": [_SECRET_INFO_EXAMPLE],
    "created_at": "2026-11-20T08:05:00Z",
    "disabled_at": None,
}
_DELIVERY_EXAMPLE = {
    "id": 3391,
    "event_id": "msg_2f1c0a9e7b3d4c55a1b2c3d4",
    "event_type": "job.succeeded",
    "status": "delivered",
    "attempts": 2,
    "next_attempt_at": None,
    "last_status_code": 200,
    "last_response_ms": 84.2,
    "last_error": None,
    "created_at": "2026-11-25T13:02:11Z",
    "delivered_at": "2026-11-25T13:02:16Z",
    "log": [
        {
            "attempt": 1,
            "status_code": 503,
            "response_ms": 1204.7,
            "error": "Service Unavailable",
            "at": "2026-11-25T13:02:11Z",
        },
        {
            "attempt": 2,
            "status_code": 200,
            "response_ms": 84.2,
            "error": None,
            "at": "2026-11-25T13:02:16Z",
        },
    ],
}


# Exact types (`job.failed`), prefixes (`job.*`) or `*`; see
# core.webhooks.subscriptions.EVENT_TYPES.
EventTypes = list[Annotated[str, StringConstraints(min_length=1, max_length=100)]]
_TYPES = Field(
    min_length=1,
    max_length=50,
    description="Event types to receive: exact (`job.failed`), a prefix ending in `*` "
    "(`job.*`), or `*` for all. `ping` is always sent to the webhook pinged.",
)


class AlertRules(BaseModel):
    """Metric alerts whose `alert.<kind>` events go to this webhook; each fires once per job
    and condition (core/jobs/alerts.py). A rule left null is off."""

    model_config = ConfigDict(extra="forbid")

    nan_loss: bool = Field(
        default=False, description="`alert.nan_loss`: a loss series reported NaN or Inf."
    )
    loss_spike_factor: Annotated[float, Strict()] | None = Field(
        default=None,
        gt=1,
        description="`alert.loss_spike`: `loss` above this many times its moving average.",
    )
    loss_spike_window: Annotated[int, Field(ge=2, le=1000), JsonInt] = Field(
        default=20, description="Points in the loss spike's moving average."
    )
    eval_regression_margin: Annotated[float, Strict()] | None = Field(
        default=None,
        ge=0,
        description="`alert.eval_regression`: `eval_loss` above its best so far by this much.",
    )
    stalled_minutes: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, description="`alert.stalled`: a running job's step unchanged so long."
    )
    queued_minutes: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, description="`alert.queued_too_long`: a job queued for so long."
    )


class WebhookCreate(BaseModel):
    """A new webhook subscription of the caller's project."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "url": "https://ci.example.com/hooks/torchyard",
                    "event_types": ["job.*", "checkpoint.saved"],
                    "description": "CI notifications",
                }
            ]
        },
    )

    url: str = Field(
        min_length=8,
        max_length=2000,
        description="The receiver, `http(s)://`; private, loopback and link-local addresses are "
        "refused unless the server's `TORCHYARD_WEBHOOK_ALLOW` permits them.",
    )
    event_types: EventTypes = _TYPES
    description: str = Field(default="", max_length=500, description="A note for humans.")
    alert_rules: AlertRules = Field(
        default_factory=AlertRules, description="Metric alerts sent to this webhook."
    )


class WebhookUpdate(BaseModel):
    """Fields to change; those left out keep their value."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"disabled": True}]})

    url: str | None = Field(
        default=None, min_length=8, max_length=2000, description="A new receiver URL."
    )
    event_types: EventTypes | None = Field(
        default=None, min_length=1, max_length=50, description="New event types."
    )
    description: str | None = Field(default=None, max_length=500, description="A new note.")
    alert_rules: AlertRules | None = Field(default=None, description="New alert rules.")
    disabled: bool | None = Field(
        default=None,
        description="True stops deliveries (they wait, pending); false resumes them.",
    )


class SecretInfo(BaseModel):
    """A signing secret, without its value."""

    model_config = openapi_examples.config(_SECRET_INFO_EXAMPLE)

    id: str = Field(description="The secret's id (to delete it).")
    created_at: str = Field(description="When it was added; UTC, ISO 8601.")


class NewSecret(SecretInfo):
    """A signing secret with its value: shown once, at creation or rotation."""

    model_config = openapi_examples.config(_NEW_SECRET_EXAMPLE)

    secret: str = Field(description="`whsec_` + base64 key, for Standard Webhooks verification.")


class Webhook(BaseModel):
    """A webhook subscription."""

    model_config = openapi_examples.config(_WEBHOOK_EXAMPLE, from_attributes=True)

    id: str = Field(description="The webhook's id.")
    url: str = Field(description="The receiver URL.")
    event_types: list[str] = Field(description="Event types it receives.")
    description: str = Field(description="A note for humans.")
    alert_rules: AlertRules = Field(description="Its metric alert rules.")
    secrets: list[SecretInfo] = Field(description="Its signing secrets; every one signs.")
    created_at: Timestamp = Field(description="When it was created; UTC, ISO 8601.")
    disabled_at: Timestamp | None = Field(description="When it was disabled; null if enabled.")


class WebhookCreated(Webhook):
    """A new webhook with its first secret's value (shown once)."""

    model_config = openapi_examples.config({**_WEBHOOK_EXAMPLE, "secret": _NEW_SECRET_EXAMPLE})

    secret: NewSecret = Field(description="The signing secret; store it now.")


class WebhookList(BaseModel):
    """The project's webhooks, oldest first."""

    model_config = openapi_examples.config({"items": [_WEBHOOK_EXAMPLE]})

    items: list[Webhook] = Field(description="The webhooks.")


class Attempt(BaseModel):
    """One HTTP try of a delivery."""

    model_config = ConfigDict(from_attributes=True)

    attempt: int = Field(description="1 for the first try of its schedule.")
    status_code: int | None = Field(description="The receiver's HTTP status; null if none.")
    response_ms: float | None = Field(description="Milliseconds until the answer (or error).")
    error: str | None = Field(description="What went wrong (network error or body); null if ok.")
    at: Timestamp = Field(description="When it was tried; UTC, ISO 8601.")


class Delivery(BaseModel):
    """One event sent to one webhook, with its delivery log."""

    model_config = openapi_examples.config(_DELIVERY_EXAMPLE)

    id: int = Field(description="The delivery's id (to redeliver it).")
    event_id: str = Field(description="The event's id: the `webhook-id` header.")
    event_type: str = Field(description="The event's type.")
    status: Literal["pending", "delivered", "dead"] = Field(
        description="`pending` (retrying), `delivered` (a 2xx answer) or `dead` (gave up)."
    )
    attempts: int = Field(description="Tries made in its current schedule.")
    next_attempt_at: Timestamp | None = Field(description="When it is tried next; null if done.")
    last_status_code: int | None = Field(description="The latest try's HTTP status.")
    last_response_ms: float | None = Field(description="The latest try's response time in ms.")
    last_error: str | None = Field(description="The latest try's error; null after success.")
    created_at: Timestamp = Field(description="When the event happened; UTC, ISO 8601.")
    delivered_at: Timestamp | None = Field(description="When a 2xx answer came; null before.")
    log: list[Attempt] = Field(description="Every try, oldest first.")


class DeliveryList(BaseModel):
    """A webhook's latest deliveries, newest first."""

    model_config = openapi_examples.config({"items": [_DELIVERY_EXAMPLE]})

    items: list[Delivery] = Field(description="The deliveries.")
