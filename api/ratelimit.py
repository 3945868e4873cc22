"""Per-key request rate limits: `settings.rate_limit_per_minute` and `rate_limit_burst`.

The `limits` library counts, with its sliding-window counter (two counters per key and
window: one Redis round trip per limit), in Redis when the broker is Redis (shared by every
API process) and in this process otherwise. The key is the sha256 of the bearer secret, the
same digest `core.access.auth` stores, so each API key has its own budget without a database read.
Over a limit: 429 `too_many_requests` with `Retry-After` (seconds until the window frees a
request). Requests without a bearer secret are not counted (they get 401). When the counter
store is unreachable, requests pass (logged): a rate limit is not worth an outage.
"""

from __future__ import annotations

import logging
import math
import time

from fastapi import Request
from limits import RateLimitItem, parse
from limits.storage import storage_from_string
from limits.strategies import SlidingWindowCounterRateLimiter

from core.access.auth import hash_key
from core.platform.errors import TooManyRequests
from core.platform.settings import Settings

log = logging.getLogger("torchyard.api")


class RateLimiter:
    """The per-key limits of `settings`; `check(secret)` counts one request."""

    def __init__(self, settings: Settings) -> None:
        self.items: list[RateLimitItem] = []
        if settings.rate_limit_per_minute is not None:
            self.items.append(parse(f"{settings.rate_limit_per_minute}/minute"))
        if settings.rate_limit_burst is not None:
            self.items.append(parse(f"{settings.rate_limit_burst}/second"))
        redis = settings.broker_url.startswith(("redis://", "rediss://"))
        storage = storage_from_string(settings.broker_url if redis else "memory://")
        self.strategy = SlidingWindowCounterRateLimiter(storage)

    def check(self, secret: str) -> None:
        """Count one request of the key `secret`. Raises TooManyRequests (429) over a limit."""
        key = hash_key(secret)
        for item in self.items:
            try:
                allowed = self.strategy.hit(item, "torchyard-key", key)
            except Exception:  # the store is down: let the request through
                log.warning("rate limit store unreachable; request not counted", exc_info=True)
                return
            if not allowed:
                reset = self.strategy.get_window_stats(item, "torchyard-key", key).reset_time
                wait = max(1, math.ceil(reset - time.time()))
                raise TooManyRequests(
                    f"rate limit: at most {item.amount} requests per {item.GRANULARITY.name} "
                    f"per API key; retry in {wait} s",
                    retry_after_s=wait,
                )


def limit_request(request: Request) -> None:
    """App dependency: count the request against its key's limits (when configured)."""
    limiter: RateLimiter | None = request.app.state.rate_limiter
    if limiter is None:
        return
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secret:
        limiter.check(secret.strip())
