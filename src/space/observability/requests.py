"""Request ids, the one log line per request and the request metrics (SPEC §16).

The id is the client's `X-Request-ID` when it is a plausible id (at most 128 letters, digits and `._:-`), else
a new one; it is echoed on the response and bound to every log line written while the request runs. The
request line names the path without its query string (a link's token and a search's `q` live there).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.plugins.prometheus import PrometheusConfig, PrometheusMiddleware
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


_SPAN: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("space_http_span")


class HttpMetrics(PrometheusMiddleware):
    """Litestar's Prometheus middleware, which also counts a request refused by a middleware inside it (a 401).

    Such a refusal is an exception that the app's exception handler, outside every middleware, turns into the
    response; the plugin alone would count it as a 200. Here its status is taken from the exception.
    """

    def __init__(self, app: ASGIApp, config: PrometheusConfig) -> None:
        super().__init__(app, config)
        inner = self.app

        async def app_with_status(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await inner(scope, receive, send)
            except Exception as exc:
                span = _SPAN.get(None)
                if span is not None:
                    span["status_code"] = _status_of(exc)
                raise

        self.app = app_with_status

    def _get_wrapped_send(self, send: Send, request_span: dict[str, float]) -> Callable[..., Any]:
        _SPAN.set(request_span)
        return super()._get_wrapped_send(send, request_span)


def _status_of(exc: Exception) -> int:
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else 500


HTTP_METRICS = PrometheusConfig(
    app_name="space", prefix="space_http", group_path=True, exclude=["^/metrics$"], middleware_class=HttpMetrics
)
"""HTTP request counts and latencies, labelled by the route's path template (never an id from the path)."""
