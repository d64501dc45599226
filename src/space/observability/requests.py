"""Request ids and the one log line per request (SPEC §16).

The id is the client's `X-Request-ID` when it is a plausible id (at most 128 letters, digits and `._:-`), else
a new one; it is echoed on the response and bound to every log line written while the request runs. The
request line names the path without its query string (a link's token and a search's `q` live there).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from space.observability import logs

log = logging.getLogger("space.http")

HEADER = "x-request-id"
_VALID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ORG = re.compile(r"^/orgs/([0-9a-fA-F-]{36})(?:/|$)")


def request_id_of(scope: Scope) -> str:
    """The client's X-Request-ID when it is a plausible id, else a fresh one."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1").strip()
            if _VALID.fullmatch(text):
                return text
            break
    return uuid.uuid4().hex


def request_ids(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: a request id for each HTTP request, on its response and its log lines."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        context: dict[str, Any] = {"request_id": request_id}
        if (m := _ORG.match(scope["path"])) is not None:
            context["org_id"] = m.group(1).lower()
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableScopeHeaders.from_message(message)[HEADER] = request_id
            await send(message)

        with logs.bound(**context):
            try:
                await app(scope, receive, send_with_id)
            finally:
                log.info(
                    "request",
                    extra={
                        "method": scope.get("method"),
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    },
                )

    return middleware
