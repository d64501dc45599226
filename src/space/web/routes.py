"""Serve the export center: `/` (the page) and `/static/*` (its CSS, JavaScript modules and icon).

Public (no token: the page asks for one), outside the OpenAPI document (it is not part of the API), and every
answer carries a strict Content-Security-Policy: only this origin's own files and API, no inline script or style,
no framing.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Router, get
from litestar.datastructures import CacheControlHeader
from litestar.enums import MediaType
from litestar.response import File
from litestar.static_files import create_static_files_router
from litestar.types import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).parent / "static"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
# A new release's files must reach a browser that still holds the old ones: revalidate every time.
NO_CACHE = CacheControlHeader(no_cache=True)
# The page and its files are public; the API calls it makes carry the token.
PUBLIC = {"exclude_from_auth": True}


def security_headers(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: the page's security headers on every answer of these routes, files and errors alike."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                headers = [h for h in message.get("headers", []) if h[0].lower() not in names]
                message["headers"] = [*headers, *SECURITY_HEADERS]
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware


@get("/", include_in_schema=False, media_type=MediaType.HTML, cache_control=NO_CACHE)
async def index() -> File:
    """The export center page."""
    return File(STATIC_DIR / "index.html", content_disposition_type="inline", media_type=MediaType.HTML)


router = Router(
    path="/",
    route_handlers=[
        index,
        create_static_files_router(
            path="/static", directories=[STATIC_DIR], cache_control=NO_CACHE, include_in_schema=False, opt=PUBLIC
        ),
    ],
    middleware=[security_headers],
    opt=PUBLIC,
    include_in_schema=False,
)
