"""One error tree with stable machine codes, mapped to RFC 9457 problem+json in one place."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, ClassVar

import msgspec
import psycopg
import psycopg.errors
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("space")

PROBLEM_JSON = "application/problem+json"


class SpaceError(Exception):
    """Base of every refusal Space answers on purpose. Subclasses fix status and code."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"
    title: ClassVar[str] = "Bad request"

    def __init__(self, detail: str | None = None, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.headers = headers or {}
        self.extra = extra


class InvalidRequest(SpaceError):
    status, code, title = 400, "invalid_request", "Invalid request"


class Unauthenticated(SpaceError):
    status, code, title = 401, "unauthenticated", "Authentication required"


class LinkExpired(SpaceError):
    status, code, title = 401, "link_expired", "Download link expired"


class LinkInvalid(SpaceError):
    status, code, title = 401, "link_invalid", "Download link not valid"


class Forbidden(SpaceError):
    status, code, title = 403, "forbidden", "Forbidden"


class AccessRevoked(SpaceError):
    status, code, title = 403, "access_revoked", "Access revoked"


class NotFound(SpaceError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(SpaceError):
    status, code, title = 409, "conflict", "Conflict"


class AlreadyMember(Conflict):
    code, title = "already_member", "Already a member"


class LastOwner(Conflict):
    code, title = "last_owner", "An organization needs an owner"


class InvalidTransition(Conflict):
    code, title = "invalid_transition", "Transition not allowed"


class OrgSuspended(Conflict):
    code, title = "org_suspended", "Organization is suspended"


class OrgDeleting(Conflict):
    code, title = "org_deleting", "Organization is being deleted"


class FinalExportRecommended(Conflict):
    code, title = "final_export_recommended", "Take a final snapshot or archive export first"


class OrgLimitReached(Conflict):
    code, title = "org_limit_reached", "Too many organizations"


class ExportQuotaExceeded(Conflict):
    code, title = "export_quota_exceeded", "Stored exports use the organization's quota"


class ExportNotReady(Conflict):
    code, title = "export_not_ready", "Export is not ready"


class ExportFailed(Conflict):
    code, title = "export_failed", "Export failed"


class ExportExpired(SpaceError):
    status, code, title = 410, "export_expired", "Export expired"


class RangeNotSatisfiable(SpaceError):
    status, code, title = 416, "range_not_satisfiable", "Range not satisfiable"


class ExportRevoked(SpaceError):
    status, code, title = 410, "export_revoked", "Export revoked by an admin"


class RateLimited(SpaceError):
    status, code, title = 429, "export_rate_limited", "Too many exports"


class QueryTimeout(SpaceError):
    status, code, title = 503, "timeout", "The request took too long"


TIMEOUT_RETRY_AFTER = 5
"""Seconds a client is asked to wait before repeating a request that hit the database's time bound."""


class Busy(SpaceError):
    status, code, title = 503, "busy", "Too many downloads at once"


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
    413: "payload_too_large",
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
    Exception: _unexpected,
}
