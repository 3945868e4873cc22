"""`/docs` and `/redoc` work offline: every asset they reference is served by the app itself."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from fastapi.testclient import TestClient

_REFERENCE = re.compile(r"""(?:src|href|spec-url)="([^"]+)"|url:\s*'([^']+)'""")
_CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "json"}


def _references(html: str) -> list[str]:
    return [a or b for a, b in _REFERENCE.findall(html)]


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "openapi.json"}),
        ("/redoc", {"redoc.standalone.js", "openapi.json"}),
    ],
)
def test_docs_pages_reference_only_same_origin_assets_that_are_served(
    client: TestClient, page: str, expected: set[str]
) -> None:
    answer = client.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert "://" not in answer.text, "an absolute URL: the page would need the network"
    urls = _references(answer.text)
    assert expected <= {url.rsplit("/", 1)[-1] for url in urls}, urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        suffix = url[url.rfind(".") :]
        assert _CONTENT_TYPES[suffix] in asset.headers["content-type"], (url, asset.headers)
        assert len(asset.content) > 0, url


def test_viewer_bundles_are_the_installed_packages_files(client: TestClient) -> None:
    static = resources.files("fastapi_offline") / "static"
    for name in ("swagger-ui-bundle.js", "redoc.standalone.js"):
        assert client.get(f"/docs-assets/{name}").content == (static / name).read_bytes()
    assert client.get("/docs-assets/nope.js").status_code == 404


def test_swagger_oauth2_redirect_page_is_served(client: TestClient) -> None:
    answer = client.get("/docs/oauth2-redirect")
    assert answer.status_code == 200
    assert "oauth2" in answer.text.lower()
