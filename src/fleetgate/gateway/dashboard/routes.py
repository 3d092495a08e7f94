"""``GET /dashboard`` and its two assets, read once from the package's ``static/`` folder.

The answers forbid anything from another origin (``Content-Security-Policy``), so the page
cannot load a script, a style, a font or data from a CDN even by mistake, and ask the
browser to revalidate (``no-cache``) so an upgraded gateway serves its own page.

May touch: starlette, importlib.resources. Must not touch: the app state.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from starlette.exceptions import HTTPException
from starlette.responses import Response

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "scaling.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
HEADERS = {
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}

router = APIRouter(tags=["dashboard"], include_in_schema=False)


@cache
def asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _serve(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)


@router.get("/dashboard")
async def page() -> Response:
    """The live dashboard page."""
    return _serve("index.html")


@router.get("/dashboard/{name}")
async def static_file(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404)
    return _serve(name)
