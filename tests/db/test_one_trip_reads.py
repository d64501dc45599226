"""`db.reads` (decision 0105): the tenant setting and the statements of a read are one transaction of one Sync on a
connection in autocommit, the setting is gone afterwards, a failed or interrupted read drops its connection, a
full pool refuses after its timeout (503 `unavailable`), and a database that can't be reached fails at once."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from space.db import Tenant
from space.db.reads import OneTripReads, Read, TripTimeout, socket_open
from tests.exports.fixtures import WAIT, wait_for
from tests.exports.limits_fixtures import lock_holder, wait_queued
from tests.helpers import app_database, free_port

ORG = uuid.UUID(int=1)
_SETTING_AND_TRANSACTION = Read("SELECT current_setting('app.org_id'), txid_current()", {})


async def test_a_read_is_one_transaction_under_the_setting_and_leaves_nothing_behind(owner_url: str) -> None:
    async with app_database(owner_url, "space-one-trip", pool_size=1) as db:
        first, second = await db.reads.read(Tenant(org_id=ORG), _SETTING_AND_TRANSACTION, _SETTING_AND_TRANSACTION)
        assert first[0][0] == second[0][0] == str(ORG)  # set before the statements, seen by both
        assert first[0][1] == second[0][1]  # one transaction
        (again,) = await db.reads.read(Tenant(org_id=ORG), _SETTING_AND_TRANSACTION)
        assert again[0][1] != first[0][1]  # a read is its own transaction, committed at its Sync
        (conn,) = db.reads._idle  # the one connection, handed back idle
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        cur = await conn.execute("SELECT current_setting('app.org_id', true)")
        assert await cur.fetchall() in ([("",)], [(None,)])  # the setting ended with the read's transaction


async def test_a_failed_read_is_rolled_back_and_drops_its_connection(owner_url: str) -> None:
    async with app_database(owner_url, "space-one-trip", pool_size=1) as db:
        await db.reads.read(Tenant(org_id=ORG), Read("SELECT 1", {}))
        (used,) = db.reads._idle
        with pytest.raises(psycopg.errors.DivisionByZero):
            await db.reads.read(Tenant(org_id=ORG), Read("SELECT 1 / 0", {}))
        assert used.closed and db.reads._idle == []
        assert await db.reads.read(Tenant(org_id=ORG), Read("SELECT 2", {})) == [[(2,)]]  # a new one


async def test_a_full_pool_refuses_after_its_timeout_and_an_interrupted_read_gives_its_place_back(
    owner_url: str,
) -> None:
    async with (
        app_database(owner_url, "space-one-trip", pool_size=1, pool_timeout=0.2) as db,
        lock_holder(owner_url) as holder,
    ):
        await holder.hold("SELECT pg_advisory_xact_lock(35)")
        blocked = asyncio.ensure_future(db.reads.read(Tenant(org_id=ORG), Read("SELECT pg_advisory_xact_lock(35)", {})))
        await wait_queued(owner_url, holder, "space-one-trip", 1)  # the pool's one connection is busy
        with pytest.raises(TripTimeout):
            await db.reads.read(Tenant(org_id=ORG), Read("SELECT 1", {}))
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert db.reads._idle == []  # a read cut off midway is not handed out again
        await holder.release()
        assert await db.reads.read(Tenant(org_id=ORG), Read("SELECT 1", {})) == [[(1,)]]


async def test_a_database_that_cannot_be_reached_fails_the_read_at_once() -> None:
    reads = OneTripReads(f"postgresql://space_app@127.0.0.1:{free_port()}/space", size=1, timeout=WAIT)
    async with asyncio.timeout(WAIT / 2):  # well before the pool's own timeout
        with pytest.raises(psycopg.OperationalError):
            await reads.read(Tenant(org_id=ORG), Read("SELECT 1", {}))
    await reads.close()


async def test_a_connection_the_server_ended_is_replaced_and_a_closed_pool_opens_new_ones(owner_url: str) -> None:
    async with app_database(owner_url, "space-one-trip", pool_size=1) as db:
        await db.reads.read(Tenant(org_id=ORG), Read("SELECT 1", {}))
        (ended,) = db.reads._idle
        async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as owner:
            await owner.execute("SELECT pg_terminate_backend(%s)", (ended.info.backend_pid,))

        async def told() -> bool:
            return not socket_open(ended)

        await wait_for(told, "the server's goodbye on the ended connection's socket")
        assert await db.reads.read(Tenant(org_id=ORG), Read("SELECT 3", {})) == [[(3,)]]
        (replacement,) = db.reads._idle
        assert replacement is not ended and ended.closed
        await db.reads.close()
        assert replacement.closed and db.reads._idle == []
        assert await db.reads.read(Tenant(org_id=ORG), Read("SELECT 4", {})) == [[(4,)]]
        assert len(db.reads._idle) == 1  # kept again: closing is not for good
