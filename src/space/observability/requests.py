"""Request ids, the one log line per request and the request metrics (SPEC §16).

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
from prometheus_client import Counter, Gauge, Histogram

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


_LABELS = ("method", "path", "status_code", "app_name")
_APP_NAME = "space"
# The names, labels and help of Litestar's Prometheus middleware (`PrometheusConfig(prefix="space_http")`), which
# these replace: what a dashboard reads stays as it was.
_REQUESTS = Counter("space_http_requests_total", "Total requests", _LABELS)
_ERRORS = Counter("space_http_requests_error_total", "Total errors in requests", _LABELS)
_DURATION = Histogram("space_http_request_duration_seconds", "Request duration, in seconds", _LABELS)
_IN_PROGRESS = Gauge(
    "space_http_requests_in_progress", "Total requests currently in progress", _LABELS, multiprocess_mode="livesum"
)
_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}
"""Each (method, route, status)'s counter and histogram, looked up once: prometheus_client's `labels()` converts,
checks and locks at every call."""
_IN_PROGRESS_CHILDREN: dict[tuple[str, str], Any] = {}


def http_metrics(app: ASGIApp) -> ASGIApp:
    """Middleware (inside the router, so the route's path template is known): every HTTP request counted and timed
    by method, route template (never an id from the path) and status, `/metrics` itself excepted.

    A request refused by a middleware inside this one (a 401) is an exception that the app's exception handler,
    outside every middleware, turns into the response: its status is taken from the exception, not assumed 200.
    The work per request is a few dictionary lookups (decision 0104: Litestar's own middleware built a `Request`,
    label dictionaries and a `labels()` call per metric at every request, about a tenth of a range's API CPU).
    """

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["path"] == "/metrics":
            await app(scope, receive, send)
            return
        # The route's template (set by the router, which runs this inside a matched route): never the path itself.
        method, path = scope["method"], scope.get("path_template", "")
        status = 200

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        in_progress = _IN_PROGRESS_CHILDREN.get((method, path))
        if in_progress is None:
            in_progress = _IN_PROGRESS_CHILDREN[(method, path)] = _IN_PROGRESS.labels(method, path, 200, _APP_NAME)
        in_progress.inc()
        try:
            await app(scope, receive, send_status)
        except Exception as exc:
            status = _status_of(exc)
            raise
        finally:
            in_progress.dec()
            children = _CHILDREN.get((method, path, status))
            if children is None:
                labels = (method, path, status, _APP_NAME)
                children = _CHILDREN[(method, path, status)] = (_REQUESTS.labels(*labels), _DURATION.labels(*labels))
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
            if status >= 500:
                _ERRORS.labels(method, path, status, _APP_NAME).inc()

    return middleware


def _status_of(exc: Exception) -> int:
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else 500
