"""HTTP routes of webhooks (owners and admins). Thin: decode, one service call, return."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from space.config import Settings
from space.errors import WebhookLimitReached
from space.openapi import refusals
from space.orgs.deps import ADMINS, MEMBER, MemberContext, parse_id
from space.schemas import Items
from space.webhooks import service
from space.webhooks.schemas import DeliveryAttempt, Webhook, WebhookCreate, WebhookCreated


class WebhookController(Controller):
    """An org's webhook endpoints and their deliveries log."""

    path = "/orgs/{org_id:str}/webhooks"
    tags = ["webhooks"]
    dependencies = MEMBER
    # Endpoints are the org's settings, not its data: they can be managed (and removed) in any live state.
    opt = {"roles": ADMINS, "state_exempt": True}

    @post("/", responses=refusals(WebhookLimitReached))
    async def create(
        self, state: State, ctx: NamedDependency[MemberContext], data: JSONBody[WebhookCreate]
    ) -> WebhookCreated:
        """Register an endpoint; the answer holds its signing secret, shown this once."""
        settings: Settings = state.settings
        return await service.create_webhook(
            ctx.uow.session,
            ctx.org.id,
            ctx.principal.user_id,
            data,
            allow_private=settings.webhook_allow_private,
            limit=settings.webhooks_per_org,
        )

    @get("/")
    async def list_webhooks(self, ctx: NamedDependency[MemberContext]) -> Items[Webhook]:
        """The org's endpoints, without secrets."""
        return Items(items=await service.list_webhooks(ctx.uow.session, ctx.org.id))

    @delete("/{webhook_id:str}")
    async def remove(self, ctx: NamedDependency[MemberContext], webhook_id: FromPath[str]) -> None:
        """Remove an endpoint; nothing more is sent to it."""
        await service.delete_webhook(ctx.uow.session, ctx.org.id, ctx.principal.user_id, parse_id(webhook_id))

    @get("/{webhook_id:str}/deliveries")
    async def deliveries(
        self, ctx: NamedDependency[MemberContext], webhook_id: FromPath[str]
    ) -> Items[DeliveryAttempt]:
        """The endpoint's recent attempts, newest first."""
        return Items(items=await service.list_attempts(ctx.uow.session, ctx.org.id, parse_id(webhook_id)))
