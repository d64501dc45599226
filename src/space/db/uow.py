"""The unit of work: one transaction, the tenant context set inside it, one commit, then after-commit hooks."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from sqlalchemy import Dialect, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

Isolation = Literal["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]


@dataclass(frozen=True)
class Tenant:
    """Row Level Security context: which org, which user, and for customers whose tickets."""

    org_id: uuid.UUID | None = None
    user_id: uuid.UUID | None = None
    customer_id: uuid.UUID | None = None


NO_TENANT = Tenant()
"""No org, no user, no customer: every tenant table shows nothing."""

_SET_TENANT = text(
    "SELECT set_config('app.org_id', :org, true), set_config('app.user_id', :user, true),"
    " set_config('app.customer_id', :customer, true)"
)


def _tenant_params(tenant: Tenant) -> dict[str, str]:
    def s(v: uuid.UUID | None) -> str:
        return "" if v is None else str(v)

    return {"org": s(tenant.org_id), "user": s(tenant.user_id), "customer": s(tenant.customer_id)}


async def set_tenant(conn: AsyncSession | AsyncConnection, tenant: Tenant) -> None:
    """Set the RLS context for the current transaction only (is_local = true): it ends with it."""
    await conn.execute(_SET_TENANT, _tenant_params(tenant))


def tenant_statement(dialect: Dialect, tenant: Tenant) -> tuple[str, dict[str, str]]:
    """`set_tenant` as the driver's SQL and parameters, for a transaction run on a psycopg connection itself
    (`reads`)."""
    return _driver_sql(dialect), _tenant_params(tenant)


@functools.cache
def _driver_sql(dialect: Dialect) -> str:
    return str(_SET_TENANT.compile(dialect=dialect))


class UnitOfWork:
    """`async with UnitOfWork(sm, tenant) as uow:` begins, sets the tenant, commits once on success.

    Services flush, never commit. Jobs are enqueued with `uow.after_commit(...)`, so a rolled-back
    transaction never leaves a queue entry behind.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        tenant: Tenant | None = None,
        *,
        isolation: Isolation | None = None,
        read_only: bool = False,
    ) -> None:
        self._sessionmaker = sessionmaker
        self.tenant = tenant or Tenant()
        self._isolation = isolation
        self._read_only = read_only
        self._hooks: list[Callable[[], Awaitable[None]]] = []
        self.session: AsyncSession

    def after_commit(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` once the transaction has committed (never on rollback)."""
        self._hooks.append(hook)

    async def retenant(self, tenant: Tenant) -> None:
        """Change the RLS context inside the open transaction (e.g. once the org is known); the same context
        again sends nothing."""
        if tenant == self.tenant:
            return
        self.tenant = tenant
        await set_tenant(self.session, tenant)

    async def __aenter__(self) -> Self:
        self.session = self._sessionmaker()
        try:
            await self.session.begin()
            if self._isolation or self._read_only:
                mode = f"ISOLATION LEVEL {self._isolation}" if self._isolation else ""
                if self._read_only:
                    mode += " READ ONLY"
                await self.session.execute(text(f"SET TRANSACTION {mode}"))
            if self.tenant != NO_TENANT:
                # Nothing set reads as unset: every policy takes '' and a missing setting alike (nullif), and
                # nothing ever sets one beyond its transaction. So an empty context costs no round trip.
                await set_tenant(self.session, self.tenant)
        except BaseException:
            # __aexit__ does not run when __aenter__ raises: give the connection back to the pool here.
            await self.session.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None:
                await self.session.commit()
            else:
                await self.session.rollback()
        finally:
            await self.session.close()
        if exc_type is None:
            for hook in self._hooks:
                await hook()
