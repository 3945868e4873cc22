"""The dashboard's assets: static pages and Plotly's bundle from the installed package."""

from __future__ import annotations

from importlib import resources

from fastapi.testclient import TestClient


def test_plotly_is_served_from_the_installed_package_gzipped_and_cacheable(
    client: TestClient,
) -> None:
    installed = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    answer = client.get("/ui/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.content == installed  # httpx decodes the gzip body
    assert int(answer.headers["content-length"]) < len(installed) // 2
    etag = answer.headers["etag"]
    again = client.get("/ui/vendor/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304


def test_dashboard_modules_are_served_as_javascript(client: TestClient) -> None:
    names = ("app", "api", "jobs", "detail", "code", "compare", "submit", "charts", "util", "usage")
    for name in names:
        answer = client.get(f"/ui/js/{name}.js")
        assert answer.status_code == 200, name
        assert "javascript" in answer.headers["content-type"]
    assert client.get("/ui/js/nope.js").status_code == 404


def test_the_nav_leads_to_the_usage_page(client: TestClient) -> None:
    assert '<a href="#/usage" data-nav="usage">Usage</a>' in client.get("/ui/").text
    assert 'parts[0] === "usage"' in client.get("/ui/js/app.js").text
