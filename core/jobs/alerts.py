"""Metric and queue alerts: `alert.<kind>` webhook events, each fired once per condition.

Rules live on a webhook subscription (`alert_rules`, api.schemas.webhooks.AlertRules) and
their events go to that subscription only. An alert fires when its condition becomes true for
a job and an `alert_states` row remembers it; the row is removed when the condition no longer
holds, so the next episode fires again (a NaN loss never clears). Evaluated:

- on metric ingest (`on_metrics`, from workers.ingest in the flush's transaction):
  `nan_loss` (a series whose name contains `loss` reported NaN or Inf), `loss_spike` (a `loss`
  point above `loss_spike_factor` x the mean of the `loss_spike_window` points before it),
  `eval_regression` (an `eval_loss` point above the best earlier one + `eval_regression_margin`);
- periodically (`check_periodic`, from the API's webhook loop): `stalled` (a running job whose
  row has not changed, metrics included, for `stalled_minutes`) and `queued_too_long` (queued
  for `queued_minutes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.jobs.upserts import Metric
from core.platform.tables import AlertState, Job, JobState, MetricPoint, WebhookSubscription, utcnow
from core.webhooks import subscriptions as webhooks

LOSS = "loss"
EVAL_LOSS = "eval_loss"


def _with_rules(session: Session, project_id: str | None, *keys: str) -> list[WebhookSubscription]:
    query = select(WebhookSubscription).where(WebhookSubscription.disabled_at.is_(None))
    if project_id is not None:
        query = query.where(WebhookSubscription.project_id == project_id)
    return [s for s in session.scalars(query) if any(s.alert_rules.get(k) for k in keys)]


def _fire(
    session: Session, subscription: WebhookSubscription, job: Job, kind: str, data: dict[str, Any]
) -> bool:
    """Emit `alert.<kind>` unless it already fired for this condition; True when it did now."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    row = session.execute(
        insert(AlertState)
        .values(subscription_id=subscription.id, job_id=job.id, kind=kind, fired_at=utcnow())
        .on_conflict_do_nothing()
        .returning(AlertState.kind)
    ).first()
    if row is None:
        return False
    payload = {"job": {"id": job.id, "name": job.name, "state": job.state}, "kind": kind, **data}
    webhooks.emit(
        session=session,
        project_id=job.project_id,
        type=f"alert.{kind}",
        payload=payload,
        subscription_ids=[subscription.id],
    )
    return True


def _clear(session: Session, subscription: WebhookSubscription, job_id: int, kind: str) -> None:
    session.execute(
        delete(AlertState).where(
            AlertState.subscription_id == subscription.id,
            AlertState.job_id == job_id,
            AlertState.kind == kind,
        )
    )


def _series(session: Session, job_id: int, name: str, limit: int) -> list[tuple[int, float]]:
    """The last `limit` points of a series as (step, value), oldest first."""
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.job_id == job_id, MetricPoint.name == name)
        .order_by(MetricPoint.step.desc())
        .limit(limit)
    ).all()
    return [(step, value) for step, value in reversed(rows)]


def _spikes(session: Session, sub: WebhookSubscription, job: Job, new: Sequence[Metric]) -> None:
    factor = float(sub.alert_rules["loss_spike_factor"])
    window = int(sub.alert_rules.get("loss_spike_window") or 20)
    series = _series(session, job.id, LOSS, window + len(new))
    fresh = {p.step for p in new}
    for i, (step, value) in enumerate(series):
        if step not in fresh or i < window:
            continue
        mean = sum(v for _, v in series[i - window : i]) / window
        if mean > 0 and value > factor * mean:
            data = {"step": step, "value": value, "moving_average": mean, "factor": factor}
            _fire(session, sub, job, "loss_spike", data)
        else:
            _clear(session, sub, job.id, "loss_spike")


def _eval_regression(
    session: Session, sub: WebhookSubscription, job: Job, new: Sequence[Metric]
) -> None:
    margin = float(sub.alert_rules["eval_regression_margin"])
    steps = sorted(p.step for p in new)
    best = session.scalar(
        select(func.min(MetricPoint.value)).where(
            MetricPoint.job_id == job.id, MetricPoint.name == EVAL_LOSS, MetricPoint.step < steps[0]
        )
    )
    for p in sorted(new, key=lambda p: p.step):
        if best is not None and p.value > best + margin:
            data = {"step": p.step, "value": p.value, "best": best, "margin": margin}
            _fire(session, sub, job, "eval_regression", data)
        else:
            _clear(session, sub, job.id, "eval_regression")
        best = p.value if best is None else min(best, p.value)


def on_metrics(
    *,
    session: Session,
    job: Job,
    points: Sequence[Metric],
    nonfinite: Sequence[tuple[str, int]] = (),
) -> None:
    """Evaluate the ingest-time rules of the job's project over a flush's points (already
    stored) and its non-finite values (`(name, step)`, not stored). In the caller's
    transaction; one query when no subscription has rules."""
    subs = _with_rules(
        session, job.project_id, "nan_loss", "loss_spike_factor", "eval_regression_margin"
    )
    if not subs:
        return
    losses = [p for p in points if p.name == LOSS]
    evals = [p for p in points if p.name == EVAL_LOSS]
    bad = [(name, step) for name, step in nonfinite if "loss" in name]
    for sub in subs:
        rules = sub.alert_rules
        if rules.get("nan_loss") and bad:
            _fire(session, sub, job, "nan_loss", {"metric": bad[0][0], "step": bad[0][1]})
        if rules.get("loss_spike_factor") and losses:
            _spikes(session, sub, job, losses)
        if rules.get("eval_regression_margin") is not None and evals:
            _eval_regression(session, sub, job, evals)


def _periodic_rule(
    session: Session, sub: WebhookSubscription, now: datetime, kind: str, state: JobState
) -> None:
    minutes = float(sub.alert_rules[f"{kind}_minutes"])
    name = "stalled" if kind == "stalled" else "queued_too_long"
    since = now - timedelta(minutes=minutes)
    late = list(
        session.scalars(
            select(Job).where(
                Job.project_id == sub.project_id, Job.state == state, Job.updated_at < since
            )
        )
    )
    for job in late:
        data = {"minutes": minutes, "since": job.updated_at.isoformat(), "step": job.current_step}
        _fire(session, sub, job, name, data)
    session.execute(
        delete(AlertState).where(
            AlertState.subscription_id == sub.id,
            AlertState.kind == name,
            AlertState.job_id.not_in([j.id for j in late]),
        )
    )


def check_periodic(*, session: Session, now: datetime | None = None) -> None:
    """Evaluate `stalled` and `queued_too_long` for every subscription that has them. Does
    not commit."""
    now = now or utcnow()
    for sub in _with_rules(session, None, "stalled_minutes", "queued_minutes"):
        if sub.alert_rules.get("stalled_minutes"):
            _periodic_rule(session, sub, now, "stalled", JobState.RUNNING)
        if sub.alert_rules.get("queued_minutes"):
            _periodic_rule(session, sub, now, "queued", JobState.QUEUED)
