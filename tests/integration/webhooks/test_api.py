"""The `/v1/webhooks` REST API: SSRF refusals, validation, isolation, the lifespan loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error
from tests.integration.webhooks.conftest import LOOPBACK, subscribe
from tests.integration.webhooks.receiver import Receiver


@pytest.fixture(scope="module")
def strict_client(settings: Settings) -> Iterator[TestClient]:
    """The API with no allow-list: private destinations are refused."""
    with TestClient(create_app(settings.model_copy(update={"webhook_allow": []}))) as client:
        yield client


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://localhost:8080/hook",  # a name that resolves to loopback
        "http://127.0.0.1:9/hook",
        "http://[::ffff:192.168.1.1]/hook",
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "ftp://example.com/hook",
    ],
)
def test_private_destinations_are_refused_at_subscription(
    strict_client: TestClient, project: ProjectKey, url: str
) -> None:
    answer = strict_client.post(
        "/v1/webhooks", json={"url": url, "event_types": ["*"]}, headers=project.headers
    )
    assert_error(answer, 422, "validation_error", loc=["body", "url"])


def test_a_url_change_to_a_private_destination_is_refused(
    strict_client: TestClient, wh_client: TestClient, project: ProjectKey, receiver: Receiver
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    answer = strict_client.patch(
        f"/v1/webhooks/{hook['id']}", json={"url": receiver.url}, headers=project.headers
    )
    assert_error(answer, 422, "validation_error", loc=["body", "url"])


def test_create_list_update_delete(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.failed"], description="ci")
    assert hook["secret"]["secret"].startswith("whsec_")
    assert [s["id"] for s in hook["secrets"]] == [hook["secret"]["id"]]
    assert "secret" not in hook["secrets"][0]
    url = f"/v1/webhooks/{hook['id']}"
    listed = wh_client.get("/v1/webhooks", headers=project.headers).json()["items"]
    assert [h["id"] for h in listed] == [hook["id"]]
    assert "secret" not in listed[0]
    changed = wh_client.patch(
        url, json={"event_types": ["job.*"], "disabled": True}, headers=project.headers
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["event_types"] == ["job.*"]
    assert changed.json()["disabled_at"] is not None
    assert wh_client.get(url, headers=project.headers).json()["disabled_at"] is not None
    assert wh_client.delete(url, headers=project.headers).status_code == 204
    assert_error(wh_client.get(url, headers=project.headers), 404, "not_found")


def test_bad_bodies_are_refused_with_field_paths(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver
) -> None:
    bad = wh_client.post(
        "/v1/webhooks", json={"url": receiver.url, "event_types": []}, headers=project.headers
    )
    assert_error(bad, 422, "validation_error", loc=["body", "event_types"])
    rules = {"url": receiver.url, "event_types": ["*"], "alert_rules": {"loss_spike_factor": 0.5}}
    bad = wh_client.post("/v1/webhooks", json=rules, headers=project.headers)
    assert_error(bad, 422, "validation_error", loc=["body", "alert_rules", "loss_spike_factor"])


def test_another_projects_webhook_is_404(
    wh_client: TestClient, project: ProjectKey, other_project: ProjectKey, receiver: Receiver
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    ping = wh_client.post(f"/v1/webhooks/{hook['id']}/ping", headers=project.headers).json()
    base = f"/v1/webhooks/{hook['id']}"
    secret_id = hook["secret"]["id"]
    calls = [
        ("get", base, None),
        ("patch", base, {"description": "x"}),
        ("delete", base, None),
        ("post", f"{base}/secrets", None),
        ("delete", f"{base}/secrets/{secret_id}", None),
        ("post", f"{base}/ping", None),
        ("get", f"{base}/deliveries", None),
        ("post", f"{base}/deliveries/{ping['id']}/redeliver", None),
    ]
    for method, path, body in calls:
        answer = wh_client.request(method, path, json=body, headers=other_project.headers)
        assert_error(answer, 404, "not_found")
    other = subscribe(wh_client, other_project, receiver.url, ["job.*"])
    answer = wh_client.post(
        f"/v1/webhooks/{other['id']}/deliveries/{ping['id']}/redeliver",
        headers=other_project.headers,
    )
    assert_error(answer, 404, "not_found")
    assert wh_client.get("/v1/webhooks", headers=other_project.headers).json()["items"] == [
        {k: v for k, v in other.items() if k != "secret"}
    ]


def test_the_api_process_delivers_in_its_lifespan(
    settings: Settings, project: ProjectKey, receiver: Receiver
) -> None:
    looping = settings.model_copy(
        update={
            "webhook_allow": LOOPBACK,
            "webhook_deliver_in_api": True,
            "webhook_deliver_interval_s": 0.05,
        }
    )
    with TestClient(create_app(looping)) as client:
        hook = subscribe(client, project, receiver.url, ["job.*"])
        client.post(f"/v1/webhooks/{hook['id']}/ping", headers=project.headers)
        deadline = time.monotonic() + 20
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.verify(hook["secret"]["secret"])["type"] for r in receiver.received] == ["ping"]
