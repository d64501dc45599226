"""Every refusal as RFC 9457 problem+json: SpaceError's tree (space.errors), Litestar's own HTTP
errors, validation, database timeouts and the unexpected, each mapped to the one body shape with its `code`."""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

import msgspec
import psycopg
import psycopg.errors
from litestar import Request, Response
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import (
    ASGIApp,
    ExceptionHandlersMap,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Receive,
    Scope,
    Send,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from space.db.reads import TripTimeout
from space.errors import (
    TIMEOUT_RETRY_AFTER,
    UNAVAILABLE_RETRY_AFTER,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QueryTimeout,
    SpaceError,
    Unavailable,
)

log = logging.getLogger("space")

PROBLEM_JSON = "application/problem+json"


class Problem(msgspec.Struct, omit_defaults=True):
    """RFC 9457 body; `code` is the machine-readable reason."""

    status: int
    title: str
    detail: str
    code: str
    type: str = "about:blank"
    errors: list[dict[str, Any]] | None = None
    errorCode: str | None = None


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response[Problem]:
    """Build the one problem+json response shape."""
    return Response(
        Problem(status=status, title=title, detail=detail, code=code, **extra),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


# Litestar's own HTTP errors (routing, body size, methods) get codes by status.
_CODES_BY_STATUS = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: PayloadTooLarge.code,
    415: "unsupported_media_type",
}


def problem_for(exc: SpaceError) -> Response[Problem]:
    """The problem+json response of a SpaceError (also for answers sent outside a handler, like a busy download)."""
    return problem(exc.status, exc.code, exc.title, exc.detail, exc.headers, **exc.extra)


def _space_error(_: Request[Any, Any, Any], exc: SpaceError) -> Response[Problem]:
    return problem_for(exc)


def _validation_error(_: Request[Any, Any, Any], exc: ValidationException) -> Response[Problem]:
    errors = exc.extra if isinstance(exc.extra, list) else []
    fields = [_field_error(e) for e in errors if isinstance(e, dict)]
    detail = "; ".join(f"{e['key']}: {e['message']}" for e in fields) or exc.detail
    return problem(400, InvalidRequest.code, InvalidRequest.title, detail, errors=fields or None)


def _field_error(e: dict[str, Any]) -> dict[str, Any]:
    # Litestar names the whole body `data` (the handler's parameter) and reports a missing body as the
    # KeyError text "'data'"; clients know neither, so say "body" and what is missing.
    key = str(e.get("key") or "body")
    message = str(e.get("message"))
    if key == "data":
        key = "body"
        if message == "'data'":
            message = "A JSON object is required"
    return {**e, "key": key, "message": message}


def _http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Problem]:
    status = exc.status_code
    if status >= 500:
        log.error("internal error: %s", exc.detail)
    if status == NotFound.status:
        # An unknown route is answered exactly like an unknown resource: one 404 body, nothing to tell apart.
        return _space_error(_, NotFound())
    code = _CODES_BY_STATUS.get(status, "error" if status >= 500 else "bad_request")
    title = InvalidRequest.title if status == InvalidRequest.status else HTTPStatus(status).phrase
    return problem(status, code, title, exc.detail or title, dict(exc.headers or {}))


def _recursion_error(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Problem]:
    # msgspec raises RecursionError (not DecodeError) for deeply nested JSON: that is the client's input.
    # Any other RecursionError is still our bug and stays a 500.
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _DECODERS:
            return problem(400, InvalidRequest.code, InvalidRequest.title, "body: JSON is nested too deeply")
        tb = tb.tb_next
    return _unexpected(request, exc)


_DECODERS = frozenset({"decode_json", "decode_msgpack"})


# statement_timeout cancels the query (QueryCanceled); idle_in_transaction_session_timeout ends the session.
_TIMEOUTS = (psycopg.errors.QueryCanceled, psycopg.errors.IdleInTransactionSessionTimeout)


# SQLSTATE classes of a server that can't take the request now: 08 connection exception, 53 insufficient resources
# (too many connections, out of memory, disk full), 57P shutting down, starting up, database dropped.
_UNAVAILABLE_SQLSTATES = ("08", "53", "57P")


def _unavailable(cause: BaseException | None) -> bool:
    """Whether `cause` says the database had no connection to give (not that the request was wrong)."""
    if isinstance(cause, (PoolTimeout, TripTimeout)):
        return True
    if not isinstance(cause, psycopg.OperationalError):
        return False
    # No SQLSTATE: no server answered at all (refused, reset, closed), or it refused the connection itself
    # ("too many connections for role" comes as a connection failure, without one).
    return cause.sqlstate is None or cause.sqlstate.startswith(_UNAVAILABLE_SQLSTATES)


def _database_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    # SQLAlchemy wraps the driver's error (DBAPIError.orig); statements run on the driver connection raise it bare.
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(cause, _TIMEOUTS):
        log.warning("request timed out in the database: %s", type(cause).__name__)
        timeout = QueryTimeout(
            "The database took too long to answer; try again shortly.",
            headers={"Retry-After": str(TIMEOUT_RETRY_AFTER)},
        )
        return _space_error(request, timeout)
    if _unavailable(cause):
        # The operator needs the reason (which server, what it said); the client only that it may try again.
        log.warning(
            "database unavailable: %s: %s", type(cause).__name__, str(cause).splitlines()[0] if str(cause) else ""
        )
        unavailable = Unavailable(
            "The database can't take this request now; try again shortly.",
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)},
        )
        return _space_error(request, unavailable)
    return _unexpected(request, exc)


def _unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    log.exception("unhandled error", exc_info=exc)
    return problem(500, "internal_error", "Internal Server Error", "An unexpected error occurred.")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    SpaceError: _space_error,
    ValidationException: _validation_error,
    HTTPException: _http_error,
    RecursionError: _recursion_error,
    DBAPIError: _database_error,
    psycopg.Error: _database_error,
    PoolTimeout: _database_error,
    TripTimeout: _database_error,
    Exception: _unexpected,
}


# A control character (NUL above all) or U+FFFD (what the server made of bytes that are not UTF-8) in a decoded path.
UNREADABLE_PATH = re.compile("[\x00-\x1f\x7f\ufffd]")


def refuse_unreadable_paths(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: a path with a NUL, another control character or an invalid byte is answered 404 (no route
    has one) before any route, file lookup or authentication sees it: the static files' `stat` raises on a NUL."""
    body = msgspec.json.encode(Problem(status=404, title=NotFound.title, detail=NotFound.title, code=NotFound.code))

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or not UNREADABLE_PATH.search(scope["path"]):
            await app(scope, receive, send)
            return
        headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
        start: HTTPResponseStartEvent = {"type": "http.response.start", "status": 404, "headers": headers}
        await send(start)
        head = scope["method"] == "HEAD"
        end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"" if head else body, "more_body": False}
        await send(end)

    return middleware
