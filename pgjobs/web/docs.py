"""``/api/v1/docs``: the API's interactive reference (Swagger UI) with its script, stylesheet and
icon served by the server itself, so that the page renders on a machine without internet.

The assets are the ones ``fastapi-offline`` ships in its wheel (Swagger UI 5, which reads the
OpenAPI 3.1 document FastAPI writes); only its files are used, not its ``FastAPI`` wrapper.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from pgjobs.web.backend import API_PREFIX
from pgjobs.web.errors import error_response

DOCS_PATH = f"{API_PREFIX}/docs"
OPENAPI_PATH = f"{API_PREFIX}/openapi.json"

# The files served under DOCS_PATH/assets/, by name, with their media types.
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


@functools.cache
def _asset(name: str) -> bytes:
    return (resources.files("fastapi_offline") / "static" / name).read_bytes()


def docs_router() -> APIRouter:
    """The docs page and its assets, left out of the OpenAPI document; both need no token, as
    the OpenAPI document they show needs none."""
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_PATH)
    def docs(request: Request) -> HTMLResponse:
        # Mounted under a prefix (or served behind one, --root-path), the URLs carry it.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        assets = f"{root}{DOCS_PATH}/assets"
        return get_swagger_ui_html(
            openapi_url=root + OPENAPI_PATH,
            title="pgjobs - HTTP API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
            oauth2_redirect_url=None,
        )

    @router.get(DOCS_PATH + "/assets/{name}")
    def asset(name: str) -> Response:
        media_type = _ASSETS.get(name)
        if media_type is None:
            return error_response(404, "not_found", f"no such asset of the docs page: {name}")
        response = Response(_asset(name), media_type=media_type)
        response.headers["Cache-Control"] = "public, max-age=86400"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    return router
