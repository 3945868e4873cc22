"""The dashboard's assets: static pages and the vendored Plotly bundle."""

from __future__ import annotations

import hashlib

from fastapi.testclient import TestClient

from api import dashboard


def test_the_vendored_plotly_is_the_pinned_file_served_gzipped_and_cacheable(
    client: TestClient,
) -> None:
    vendored = dashboard.PLOTLY_FILE.read_bytes()
    assert hashlib.sha256(vendored).hexdigest() == dashboard.PLOTLY_SHA256
    assert f"plotly.js (basic - minified) v{dashboard.PLOTLY_VERSION}" in vendored[:200].decode()
    assert (dashboard.PLOTLY_FILE.parent / "plotly-basic.LICENSE").read_text().startswith("MIT")
    answer = client.get(dashboard.PLOTLY_PATH, headers={"Accept-Encoding": "gzip"})
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.content == vendored  # httpx decodes the gzip body
    assert int(answer.headers["content-length"]) < 420_000  # of 1.19 MB raw
    etag = answer.headers["etag"]
    again = client.get(dashboard.PLOTLY_PATH, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert f'src="vendor/{dashboard.PLOTLY_FILE.name}"' in client.get("/ui/").text


def test_dashboard_modules_are_served_as_javascript(client: TestClient) -> None:
    names = (
        "app", "api", "jobs", "detail", "code", "compare", "compare_data", "submit", "charts",
        "util", "usage", "evals", "sweeps",
    )  # fmt: skip
    for name in names:
        answer = client.get(f"/ui/js/{name}.js")
        assert answer.status_code == 200, name
        assert "javascript" in answer.headers["content-type"]
    assert client.get("/ui/js/nope.js").status_code == 404


def test_the_nav_leads_to_the_usage_page(client: TestClient) -> None:
    assert '<a href="#/usage" data-nav="usage">Usage</a>' in client.get("/ui/").text
    assert 'parts[0] === "usage"' in client.get("/ui/js/app.js").text


def test_json_is_gzipped_for_clients_that_accept_it(client: TestClient) -> None:
    answer = client.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
    assert answer.headers["content-encoding"] == "gzip"
    assert int(answer.headers["content-length"]) < len(answer.content) // 3
    plain = client.get("/openapi.json", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert plain.json() == answer.json()
