"""The web dashboard: static pages under `/ui/` that use the public REST API like any client.

`/` redirects to `/ui/`; `/ui/` serves `api/static/index.html` and its ES modules. Charts are
Plotly's basic partial bundle (scatter, bar and pie traces; the same `Plotly.react` API as the
full bundle), vendored as one file: npm `plotly.js-basic-dist-min` 4.1.1 (MIT, its license in
`api/static/vendor/plotly-basic.LICENSE`), `plotly-basic.min.js`, 1,191,749 bytes, sha256
99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba. It is served gzipped (about
395 KB on the wire) at `/ui/vendor/plotly-basic.min.js`, so the dashboard needs no CDN and no
build step, and a cold job page stays under 800 KB (the full bundle alone was 1.4 MB gzipped).
To upgrade: `npm pack plotly.js-basic-dist-min@<version>`, copy the file and the license, and
update the version and digest here (`vendor_sha256` checks them).
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
PLOTLY_FILE = STATIC_DIR / "vendor" / "plotly-basic.min.js"
PLOTLY_VERSION = "4.1.1"
PLOTLY_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"
PLOTLY_PATH = "/ui/vendor/plotly-basic.min.js"


@dataclass(frozen=True)
class Asset:
    """A file served from memory: its bytes, the same gzip-compressed, and a strong ETag."""

    body: bytes
    gzipped: bytes
    etag: str


@cache
def plotly_bundle() -> Asset:
    """The vendored Plotly bundle, compressed once.

    Raises FileNotFoundError when the file is missing and ValueError when its sha256 is not
    `PLOTLY_SHA256` (a partial copy or an upgrade that forgot to update the pin)."""
    body = PLOTLY_FILE.read_bytes()
    digest = hashlib.sha256(body).hexdigest()
    if digest != PLOTLY_SHA256:
        raise ValueError(f"{PLOTLY_FILE} has sha256 {digest}, expected {PLOTLY_SHA256}")
    return Asset(
        body=body,
        gzipped=gzip.compress(body, compresslevel=9, mtime=0),
        etag=f'"plotly-basic-{PLOTLY_VERSION}-{digest[:16]}"',
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
