"""Database access: engines, the unit of work (the only place that commits) and the tenant context."""

from space.db.driver import compiled, driver_connection, server_version
from space.db.engine import (
    APP_ROLE,
    QUEUE_ROLE,
    AppRoleError,
    Database,
    app_role_problems,
    app_url,
    check_app_role,
    queue_conninfo,
    sync_url,
)
from space.db.uow import Tenant, UnitOfWork, set_tenant, tenant_statement

__all__ = [
    "APP_ROLE",
    "QUEUE_ROLE",
    "AppRoleError",
    "Database",
    "Tenant",
    "UnitOfWork",
    "app_role_problems",
    "app_url",
    "check_app_role",
    "compiled",
    "driver_connection",
    "queue_conninfo",
    "server_version",
    "set_tenant",
    "sync_url",
    "tenant_statement",
]
