"""Helpers for the limits tests: an app with tuned settings, a lock held from a second connection, and a wait
until a number of sessions queue behind it (pg_blocking_pids, never a sleep)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from tests.exports.fixtures import WAIT, tuned
from tests.helpers import Api, UserFactory


@contextlib.asynccontextmanager
async def tuned_api(settings: Settings, users: UserFactory, **overrides: Any) -> AsyncIterator[Api]:
    """The real app with some settings changed, and an Api calling it."""
    async with AsyncTestClient(app=create_app(tuned(settings, **overrides))) as client:
        yield Api(client, users)


class LockHolder:
    """A second connection (the owner's) that takes locks in an open transaction until `release`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.pid = conn.info.backend_pid

    async def hold(self, sql: str, params: Any = None) -> None:
        """Run a locking statement inside the open transaction."""
        await self.conn.execute(sql, params)

    async def release(self) -> None:
        """End the transaction: every lock it took is released."""
        await self.conn.commit()


@contextlib.asynccontextmanager
async def lock_holder(owner_url: str) -> AsyncIterator[LockHolder]:
    """A LockHolder; its transaction ends (rolled back if still open) when the block does."""
    conn = await psycopg.AsyncConnection.connect(owner_url, application_name="space-tests-locker")
    try:
        yield LockHolder(conn)
    finally:
        await conn.rollback()
        await conn.close()


async def queued_behind(owner_url: str, holder_pid: int, application_name: str) -> int:
    """Sessions tagged `application_name` in a lock wait chain that starts at `holder_pid`.

    A second waiter queues behind the first and is reported blocked by it rather than by the holder, so the
    whole chain is counted.
    """
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute(
            "WITH RECURSIVE chain(pid) AS (SELECT %s::int UNION"
            " SELECT a.pid FROM pg_stat_activity a, chain c WHERE c.pid = ANY(pg_blocking_pids(a.pid)))"
            " SELECT count(*) FROM pg_stat_activity a JOIN chain c USING (pid)"
            " WHERE a.application_name = %s AND a.datname = current_database()",
            (holder_pid, application_name),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def wait_queued(owner_url: str, holder: LockHolder, application_name: str, n: int) -> None:
    """Wait (at most WAIT seconds) until `n` sessions tagged `application_name` wait behind the holder."""
    deadline = time.monotonic() + WAIT
    while (seen := await queued_behind(owner_url, holder.pid, application_name)) < n:
        assert time.monotonic() < deadline, f"expected {n} {application_name} sessions behind the lock, saw {seen}"
        await asyncio.sleep(0.02)
