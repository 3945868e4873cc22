"""The interactive API docs, `/docs` (Swagger UI) and `/redoc` (ReDoc), with no CDN.

FastAPI's defaults load Swagger UI and ReDoc from jsdelivr, so the pages are blank on a host
without internet access. Here both pages use FastAPI's own HTML builders
(`get_swagger_ui_html`, `get_redoc_html`) pointed at assets served by this app from the
installed `fastapi-offline` package (MIT; it ships `swagger-ui-bundle.js`, `swagger-ui.css`
and `redoc.standalone.js` under the Apache 2.0 and MIT licences of Swagger UI and ReDoc).
Upgrading that package upgrades the viewers; nothing third-party is copied into this repo.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
ASSETS_PACKAGE = ("fastapi_offline", "static")
SWAGGER_JS = f"{ASSETS_PATH}/swagger-ui-bundle.js"
SWAGGER_CSS = f"{ASSETS_PATH}/swagger-ui.css"
REDOC_JS = f"{ASSETS_PATH}/redoc.standalone.js"
FAVICON = f"{ASSETS_PATH}/favicon.png"


def mount(app: FastAPI) -> None:
    """Serve `/docs`, its OAuth2 redirect, `/redoc` and their assets on `app`.

    `app` must be built with `docs_url=None, redoc_url=None` so these routes are the only ones.
    Raises ModuleNotFoundError when `fastapi-offline` is not installed.
    """
    openapi_url = app.openapi_url or "/openapi.json"
    title = app.title
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=SWAGGER_JS,
            swagger_css_url=SWAGGER_CSS,
            swagger_favicon_url=FAVICON,
        )

    def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=REDOC_JS,
            redoc_favicon_url=FAVICON,
            with_google_fonts=False,
        )

    app.add_api_route("/docs", swagger, methods=["GET"], include_in_schema=False)
    app.add_api_route(redirect_url, oauth2_redirect, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    app.mount(ASSETS_PATH, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")
