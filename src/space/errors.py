"""One error tree with stable machine codes; `space.problems` maps it to RFC 9457 problem+json, in one place.

Nothing here knows HTTP's framework: services and the worker raise and catch these without importing Litestar.
"""

from __future__ import annotations

from typing import Any, ClassVar


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


class PayloadTooLarge(SpaceError):
    """A body over the API's limit; Litestar refuses it before any handler (space.problems maps it to this code)."""

    status, code, title = 413, "payload_too_large", "Request body too large"


class DestinationUnreachable(SpaceError):
    """Saving a destination wrote no test object into it (SPEC §22); the detail is the store's reason."""

    status, code, title = 400, "destination_unreachable", "The destination can't be written"


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


class WebhookLimitReached(Conflict):
    code, title = "webhook_limit_reached", "Too many webhook endpoints"


class ScheduleLimitReached(Conflict):
    code, title = "schedule_limit_reached", "Too many schedules"


class DestinationInUse(Conflict):
    code, title = "destination_in_use", "A schedule delivers to this destination"


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


class LinkRateLimited(SpaceError):
    status, code, title = 429, "rate_limited", "Too many download links"


class QueryTimeout(SpaceError):
    status, code, title = 503, "timeout", "The request took too long"


TIMEOUT_RETRY_AFTER = 5
"""Seconds a client is asked to wait before repeating a request that hit the database's time bound."""


class Unavailable(SpaceError):
    status, code, title = 503, "unavailable", "The database has no connection to spare"


UNAVAILABLE_RETRY_AFTER = 5
"""Seconds a client is asked to wait when the database could not be reached or had no connection to spare."""


class Busy(SpaceError):
    status, code, title = 503, "busy", "Too many downloads at once"
