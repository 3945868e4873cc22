"""Wake-ups for a session's relay (issue 47): the API publishes "calls queued for training
client `model_id`" on Redis once it has committed them, and the relay of that client's session
job, subscribed, hands them over at once instead of at its next poll of the database (10 ms
while its client is at work). A wake-up is only a hint: the relay still polls, so a lost message
(Redis restarted, the embedded `filesystem://` broker, which has no pub/sub) costs one poll
interval, never a call. Redis rather than Postgres' LISTEN: the API and the workers may reach
Postgres through PgBouncer's transaction pooling, which drops LISTEN.

Publisher: `publisher(broker_url).queued(model_id)`. Subscriber: `Subscription`, whose `fileno`
the worker's supervisor waits on beside its trainer's pidfd."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from typing import Any

import redis

log = logging.getLogger(__name__)


def channel(model_id: str) -> str:
    """The Redis channel of training client `model_id`'s queued calls."""
    return f"torchyard:session-calls:{model_id}"


def _is_redis(broker_url: str) -> bool:
    return broker_url.startswith(("redis://", "rediss://"))


class Publisher:
    """Publishes that a training client has new calls (nothing without a Redis broker)."""

    def __init__(self, broker_url: str) -> None:
        # on a request's path: a Redis that is down costs a call 0.2 s at most, not retries
        self._redis = (
            redis.Redis.from_url(
                broker_url, socket_connect_timeout=0.2, socket_timeout=0.2, retry=None
            )
            if _is_redis(broker_url)
            else None
        )

    def queued(self, model_id: str | None) -> None:
        """After the commit that stored a call of `model_id`: wake its relay. Never raises: a
        wake-up not sent costs one poll interval."""
        if self._redis is None or not model_id:
            return
        try:
            self._redis.publish(channel(model_id), b"")
        except redis.RedisError as exc:
            log.debug("session wake-up for %s not sent: %s", model_id, exc)


@functools.lru_cache(maxsize=4)
def publisher(broker_url: str) -> Publisher:
    """The process's publisher for `broker_url` (one connection pool)."""
    return Publisher(broker_url)


class Subscription:
    """Training client `model_id`'s wake-ups, as a file descriptor that becomes readable when
    one came (a pipe written by redis-py's `PubSub.run_in_thread`); `drain()` says whether any
    did since the last call. Without a Redis broker, or when Redis cannot be reached, there is
    no descriptor (`fileno()` None) and the relay polls alone."""

    def __init__(self, broker_url: str, model_id: str) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._thread: Any = None
        self._pubsub: Any = None
        if not _is_redis(broker_url):
            return
        try:
            pubsub = redis.Redis.from_url(broker_url).pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(**{channel(model_id): self._woken})
        except redis.RedisError as exc:
            log.warning("session %s: no wake-ups (%s); polling only", model_id, exc)
            return
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._pubsub = pubsub
        self._thread = pubsub.run_in_thread(
            sleep_time=1.0, daemon=True, exception_handler=self._lost
        )

    def _woken(self, message: object) -> None:
        if self._write_fd is not None:
            with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending
                os.write(self._write_fd, b"\0")

    @staticmethod
    def _lost(exc: BaseException, pubsub: Any, thread: Any) -> None:
        """Redis went away: the relay polls meanwhile; redis-py reconnects (and subscribes
        again) on the thread's next read, a second from now."""
        log.debug("session wake-ups: %s; retrying in 1 s", exc)
        time.sleep(1.0)

    def fileno(self) -> int | None:
        return self._read_fd

    def drain(self) -> bool:
        """Whether a wake-up came since the last call (and forget it)."""
        if self._read_fd is None:
            return False
        woken = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                woken = True
        return woken

    def close(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(Exception):
                self._thread.stop()
                self._thread.join(timeout=2)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._write_fd = None
