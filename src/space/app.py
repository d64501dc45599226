"""create_app(settings) -> Litestar. Nothing is built at import time."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components

from space.audit.routes import AuditController
from space.auth.deps import DEPENDENCIES
from space.auth.middleware import AUTHENTICATION
from space.config import Settings, parse_networks
from space.db import Database, app_url, check_app_role
from space.destinations.routes import DeliveryController, DestinationController
from space.destinations.sealing import load_sealer
from space.exports.downloads import DownloadSlots
from space.exports.links import load_signer
from space.exports.routes import (
    ExportController,
    line_schema_route,
    manifest_schema_route,
    manifest_v2_schema_route,
    snapshot_schema_route,
)
from space.exports.storage.factory import open_result_store
from space.imports.routes import ImportController
from space.notifications.routes import MeController
from space.observability.requests import http_metrics, request_ids
from space.openapi import BEARER, SECURITY_SCHEMES, InputSchemas, allow_every_method, complete_document
from space.orgs.routes import router as orgs_router
from space.problems import EXCEPTION_HANDLERS, refuse_unreadable_paths
from space.projects.routes import router as projects_router
from space.queue import open_outbound_queue, open_queue
from space.schedules.routes import ScheduleController
from space.system import health, me, metrics_text, ready
from space.tickets.routes import router as tickets_router
from space.web.routes import router as web_router
from space.webhooks.routes import WebhookController

MAX_BODY_BYTES = 1024 * 1024
API_IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000
"""How long an API transaction may sit idle (holding its locks, perhaps the org's) before the server ends it.

A request's transaction is idle only between its statements; results stream after the commit.
"""


def api_server_settings(settings: Settings) -> dict[str, str]:
    """The session settings of the API's connections (SPEC §14); workers and CLI commands keep the defaults."""
    return {
        "statement_timeout": str(settings.api_statement_timeout_ms),
        "idle_in_transaction_session_timeout": str(API_IDLE_IN_TRANSACTION_TIMEOUT_MS),
    }


def create_app(settings: Settings) -> Litestar:
    """Build the API. `settings.database_url` must be set (the CLI starts the embedded server first)."""
    assert settings.database_url, "create_app needs a database URL"
    owner_url = settings.database_url

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncGenerator[None, None]:
        db = Database(
            app_url(owner_url, settings.app_database_url),
            application_name="space-api",
            server_settings=api_server_settings(settings),
            pool_timeout=settings.api_pool_timeout_seconds,
        )
        app.state.db = db
        app.state.settings = settings
        app.state.download_slots = DownloadSlots(settings.download_concurrency)
        app.state.trusted_proxies = parse_networks(settings.trusted_proxies)
        queue = None
        outbound = None
        try:
            # SPEC §14: a role that could see past RLS stops start-up (AppRoleError) before any request.
            async with db.engine.connect() as conn:
                await check_app_role(conn)
            app.state.link_signer = await load_signer(settings, db.engine)
            app.state.sealer = await load_sealer(settings, db.engine)
            # The API only enqueues (after commits), onto its installation's queue; workers consume. Its own
            # small pool, as space_queue.
            queue = await open_queue(settings, db, application_name="space-api-queue", max_connections=4)
            app.state.queue = queue
            await queue.connect()
            # What changes owe outward (webhook deliveries, ...) goes onto the outbound lane, never the export queue.
            outbound = await open_outbound_queue(
                settings, db, application_name="space-api-outbound-queue", max_connections=4
            )
            app.state.outbound_queue = outbound
            await outbound.connect()
            async with open_result_store(settings, db) as store:
                app.state.store = store
                yield
        finally:
            try:
                if outbound is not None:
                    await outbound.disconnect()
                if queue is not None:
                    await queue.disconnect()
            finally:
                await db.dispose()

    app = Litestar(
        route_handlers=[
            health,
            ready,
            metrics_text,
            me,
            MeController,
            orgs_router,
            projects_router,
            tickets_router,
            ExportController,
            ImportController,
            AuditController,
            snapshot_schema_route,
            manifest_schema_route,
            manifest_v2_schema_route,
            line_schema_route,
            WebhookController,
            ScheduleController,
            DestinationController,
            DeliveryController,
            web_router,
        ],
        dependencies=DEPENDENCIES,
        exception_handlers=EXCEPTION_HANDLERS,
        # Counted before authentication, so refusals (401) are counted too.
        middleware=[http_metrics, AUTHENTICATION],
        # Logging is set up once per process (space.observability.logs), not by each app.
        logging_config=None,
        lifespan=[lifespan],
        request_max_body_size=MAX_BODY_BYTES,
        before_request=allow_every_method,
        plugins=[InputSchemas()],
        openapi_config=OpenAPIConfig(
            title="Space",
            version="1",
            path="/schema",
            render_plugins=[JsonRenderPlugin()],
            components=Components(security_schemes=dict(SECURITY_SCHEMES)),
            # The default; every operation also says its own (space.openapi), public ones `security: []`.
            security=[{BEARER: []}],
        ),
    )
    complete_document(app)
    # Request ids and request lines wrap everything, the exception handler and the router included (as Litestar's
    # own OpenTelemetry plugin wraps it): a 401 from a middleware and a 404 of an unknown route get them too. Inside
    # them, a path no route could have (a NUL in it) is answered 404 before anything reads it.
    app.asgi_handler = request_ids(refuse_unreadable_paths(app.asgi_handler))
    return app
