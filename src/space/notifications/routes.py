"""HTTP routes of the caller's own notifications and email preferences (/me/...). Thin: decode, one service call,
return."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from space.auth.service import Principal
from space.db import UnitOfWork
from space.notifications import service
from space.notifications.schemas import NotificationPage, Preferences, PreferencesUpdate
from space.orgs.deps import parse_id

Limit = Annotated[int, QueryParameter(ge=1, le=service.MAX_LIMIT)]


class MeController(Controller):
    """The caller's notifications across their orgs, and which of them they get by email."""

    path = "/me"
    tags = ["notifications"]

    @get("/notifications")
    async def notifications(
        self,
        uow: NamedDependency[UnitOfWork],
        principal: NamedDependency[Principal],
        before: FromQuery[str | None] = None,
        limit: Limit = service.DEFAULT_LIMIT,
    ) -> NotificationPage:
        """A page of the caller's notifications, newest first; `next` is the older page's cursor (pass it as
        `before`), null at the end; `unread` counts all unread ones."""
        return await service.page(uow.session, principal.user_id, before, limit)

    @post("/notifications/{notification_id:str}/read", status_code=204)
    async def read_one(
        self, uow: NamedDependency[UnitOfWork], principal: NamedDependency[Principal], notification_id: FromPath[str]
    ) -> None:
        """Mark one notification read."""
        await service.mark_read(uow.session, principal.user_id, parse_id(notification_id))

    @post("/notifications/read", status_code=204)
    async def read_all(self, uow: NamedDependency[UnitOfWork], principal: NamedDependency[Principal]) -> None:
        """Mark every notification of the caller read."""
        await service.mark_all_read(uow.session, principal.user_id)

    @get("/preferences")
    async def preferences(self, uow: NamedDependency[UnitOfWork], principal: NamedDependency[Principal]) -> Preferences:
        """Which notifications the caller gets by email."""
        return await service.preferences(uow.session, principal.user_id)

    @put("/preferences")
    async def set_preferences(
        self,
        uow: NamedDependency[UnitOfWork],
        principal: NamedDependency[Principal],
        data: JSONBody[PreferencesUpdate],
    ) -> Preferences:
        """Turn email types on or off (`{"email": {"export.completed": false}}`); types not named keep theirs."""
        return await service.set_preferences(uow.session, principal.user_id, data)
