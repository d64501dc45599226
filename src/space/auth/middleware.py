"""Bearer authentication before anything else of the request is read (so 401 precedes body errors)."""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult, DefineMiddleware

from space.auth.service import authenticate
from space.db import UnitOfWork

# Routes anyone may call.
PUBLIC_PATHS = ["^/health$", "^/ready$", "^/metrics$", "^/schema", "^/schemas/"]


class BearerAuthentication(AbstractAuthenticationMiddleware):
    """Resolve the token to a Principal in a short transaction of its own; 401 otherwise."""

    async def authenticate_request(self, connection: ASGIConnection[Any, Any, Any, Any]) -> AuthenticationResult:
        """The caller, or Unauthenticated."""
        async with UnitOfWork(connection.app.state.db.sessionmaker) as uow:
            principal = await authenticate(uow.session, connection.headers.get("authorization"))
        return AuthenticationResult(user=principal, auth=None)


AUTHENTICATION = DefineMiddleware(BearerAuthentication, exclude=PUBLIC_PATHS)
