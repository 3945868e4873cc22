"""SSRF checks of webhook destinations and the retry schedule (no network, no database)."""

from __future__ import annotations

import random

import pytest

from core.webhooks import delivery as webhook_delivery
from core.webhooks.targets import RefusedDestination, check


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://127.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://240.0.0.1/",
        "http://localhost/",
        "file:///etc/passwd",
        "gopher://example.com/",
        "http://user:pw@8.8.8.8/",
        "http:///nohost",
        "http://[::1",
        "http://example.com:99999/",
        "http://exa mple.invalid/",
    ],
)
def test_non_public_or_malformed_destinations_are_refused(url: str) -> None:
    with pytest.raises(RefusedDestination):
        check(url, allow=[])


def test_public_addresses_pass_and_are_the_address_connected_to() -> None:
    target = check("https://8.8.8.8:8443/hook?x=1", allow=[])
    assert (target.address, target.port, target.host) == ("8.8.8.8", 8443, "8.8.8.8")


def test_the_allow_list_permits_networks_and_host_names() -> None:
    assert check("http://10.1.2.3/", allow=["10.0.0.0/8"]).address == "10.1.2.3"
    assert check("http://[::1]:81/", allow=["::1/128"]).address == "::1"
    assert check("http://localhost:81/", allow=["LOCALHOST"]).host == "localhost"
    with pytest.raises(RefusedDestination):
        check("http://10.1.2.3/", allow=["192.168.0.0/16", "127.0.0.1/32"])


def test_retries_wait_between_half_and_all_of_their_step_and_end_within_a_day() -> None:
    rng = random.Random(7)
    schedule = webhook_delivery.RETRY_SCHEDULE_S
    for attempt, base in enumerate(schedule, start=1):
        delays = [webhook_delivery.retry_delay_s(attempt, rng) for _ in range(200)]
        assert base / 2 <= min(delays) and max(delays) <= base
        assert max(delays) - min(delays) > base / 4  # jittered, not fixed
    assert 20 * 3600 < sum(schedule) < 24 * 3600
    assert len(schedule) + 1 == webhook_delivery.MAX_ATTEMPTS
