"""A session relay's wake-ups (`core.sessions.wakeup`) on a real Redis: the API's publish after
it queued a training client's calls makes that client's descriptor readable (the worker's
supervisor waits on it beside its trainer's pidfd), and only that client's; with the embedded
`filesystem://` broker there is no descriptor and the relay polls alone."""

from __future__ import annotations

import secrets
import select

from core.sessions import wakeup

WAIT_S = 10.0


def _readable(fd: int, timeout_s: float) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def test_a_publish_for_a_client_wakes_its_relay_and_no_other(redis_url: str) -> None:
    mine, other = (f"ses_{secrets.token_hex(6)}:train:0" for _ in range(2))
    subscription = wakeup.Subscription(redis_url, mine)
    others = wakeup.Subscription(redis_url, other)
    try:
        fd = subscription.fileno()
        assert fd is not None and others.fileno() is not None
        assert not subscription.drain()  # nothing yet
        wakeup.publisher(redis_url).queued(mine)
        assert _readable(fd, WAIT_S)
        assert subscription.drain()
        assert not subscription.drain()  # forgotten once drained
        wakeup.publisher(redis_url).queued(other)  # the other client's: not ours
        other_fd = others.fileno()
        assert other_fd is not None and _readable(other_fd, WAIT_S)
        assert not _readable(fd, 0.0) and not subscription.drain()
        assert others.drain()
    finally:
        subscription.close()
        others.close()
    assert subscription.fileno() is None and not subscription.drain()  # closed


def test_without_a_redis_broker_there_is_no_descriptor_and_publishing_is_a_no_op() -> None:
    subscription = wakeup.Subscription("filesystem://", "ses_x:train:0")
    assert subscription.fileno() is None and not subscription.drain()
    wakeup.publisher("filesystem://").queued("ses_x:train:0")  # nothing to send, no error
    subscription.close()


def test_an_unreachable_redis_leaves_the_relay_polling() -> None:
    """Port 1 on loopback: nothing listens, the connection is refused at once."""
    subscription = wakeup.Subscription("redis://127.0.0.1:1/0", "ses_x:train:0")
    assert subscription.fileno() is None
    wakeup.Publisher("redis://127.0.0.1:1/0").queued("ses_x:train:0")  # logged, not raised
    subscription.close()
