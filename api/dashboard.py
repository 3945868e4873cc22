"""The web dashboard: static pages under `/ui/` that use the public REST API like any client.

`/` redirects to `/ui/`; `/ui/` serves `api/static/index.html` and its ES modules. Charts are
Plotly's own bundle, read from the installed `plotly` Python package (`package_data/
plotly.min.js`, about 4.8 MB, 1.4 MB gzipped) and served at `/ui/vendor/plotly.min.js`, so the
dashboard needs no CDN, no build step and no copy of a third-party library in this repository.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.metadata import version
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
PLOTLY_PATH = "/ui/vendor/plotly.min.js"


@dataclass(frozen=True)
class Asset:
    """A file served from memory: its bytes, the same gzip-compressed, and a strong ETag."""

    body: bytes
    gzipped: bytes
    etag: str


@cache
def plotly_bundle() -> Asset:
    """Plotly's browser bundle from the installed `plotly` package, compressed once.

    Raises FileNotFoundError when the package lacks `package_data/plotly.min.js`.
    """
    body = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    digest = hashlib.sha256(body).hexdigest()[:16]
    return Asset(
        body=body,
        gzipped=gzip.compress(body, compresslevel=6, mtime=0),
        etag=f'"plotly-{version("plotly")}-{digest}"',
    )


def _plotly(request: Request) -> Response:
    """Plotly's JS: gzip when the browser accepts it, 304 when its cached copy is current."""
    asset = plotly_bundle()
    headers = {
        "ETag": asset.etag,
        "Cache-Control": "public, max-age=86400",
        "Vary": "Accept-Encoding",
    }
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    media_type = "text/javascript; charset=utf-8"
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=media_type, headers=headers)
    return Response(asset.body, media_type=media_type, headers=headers)


def _root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


def mount(app: FastAPI) -> None:
    """Serve the dashboard on `app`: `/` -> `/ui/`, Plotly, then the static pages."""
    app.add_api_route("/", _root, methods=["GET"], include_in_schema=False)
    app.add_api_route(PLOTLY_PATH, _plotly, methods=["GET"], include_in_schema=False)
    app.mount("/ui", StaticFiles(directory=STATIC_DIR, html=True), name="dashboard")
