"""`db.read_in_one_trip` (decision 0101): the tenant setting, the query and COMMIT in one transaction of one Sync,
the setting gone afterwards, and a failing query rolled back with the connection usable again."""

from __future__ import annotations

import psycopg
import pytest

from space.db import driver_connection, read_in_one_trip
from tests.helpers import app_database

_SET = ("SELECT set_config('app.org_id', %(org)s, true)", {"org": "00000000-0000-0000-0000-000000000001"})


async def test_a_read_runs_in_one_transaction_under_the_setting_and_leaves_nothing_behind(owner_url: str) -> None:
    async with app_database(owner_url, "space-one-trip", pool_size=1) as db, db.engine.connect() as pooled:
        conn = await driver_connection(pooled)
        async with conn.cursor() as tenant, conn.cursor() as cur:
            await read_in_one_trip(conn, tenant, _SET, cur, "SELECT current_setting('app.org_id')", {})
            assert await cur.fetchall() == [(_SET[1]["org"],)]  # set transaction-locally, read in that transaction
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with pytest.raises(psycopg.errors.DivisionByZero):
                await read_in_one_trip(conn, tenant, _SET, cur, "SELECT 1 / 0", {})
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            await cur.execute("SELECT current_setting('app.org_id', true)")
            assert await cur.fetchall() in ([("",)], [(None,)])
            await conn.rollback()
