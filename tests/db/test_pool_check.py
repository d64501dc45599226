"""The pool's check of a connection it hands out (decision 0099): it asks the socket, with no round trip, and still
sees a session the server ended while the connection sat in the pool."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import text

from tests.exports.fixtures import WAIT, wait_for
from tests.helpers import app_database


async def test_a_session_the_server_ended_is_replaced_at_checkout(
    owner_url: str, owner: psycopg.Connection[Any]
) -> None:
    async with app_database(owner_url, "space-pool-check", pool_size=1) as db:
        async with db.engine.connect() as conn:
            first = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        owner.execute("SELECT pg_terminate_backend(%s)", (first,))

        async def gone() -> bool:
            row = owner.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone()
            return row is not None and row[0] == 0

        await wait_for(gone, "the ended session to leave pg_stat_activity", WAIT)
        # The pooled connection is dead: the checkout sees it and opens another, so the statement just works.
        async with db.engine.connect() as conn:
            second = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        assert second != first
