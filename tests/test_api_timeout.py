"""SPEC §14: API queries run under statement_timeout (and an idle-in-transaction timeout); a request that hits
it answers 503 `timeout` with Retry-After. The worker's connections keep their own bounds.

The slow query is made deterministic with a lock held from a second connection: the request waits on it
until its statement_timeout cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from sqlalchemy import text

from space.app import API_IDLE_IN_TRANSACTION_TIMEOUT_MS
from space.config import Settings
from space.db import Database
from space.errors import TIMEOUT_RETRY_AFTER
from space.worker import run_worker
from tests.exports.fixtures import WAIT, add_tickets, create_export, job_row, tuned, wait_state
from tests.exports.limits_fixtures import lock_holder, queued_behind, tuned_api, wait_queued
from tests.helpers import Api, UserFactory, assert_problem

QUICK_MS = 300


async def test_a_query_past_the_statement_timeout_answers_503_timeout(
    api: Api, db: Database, settings: Settings, users: UserFactory, owner_url: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["waits"])
    async with tuned_api(settings, users, api_statement_timeout_ms=QUICK_MS) as quick:
        # Within the bound: answered.
        r = await quick.call("GET", org.path("/tickets"), org.member)
        assert r.status_code == 200 and r.json()["total"] == 1
        async with lock_holder(owner_url) as holder:
            await holder.hold("LOCK TABLE tickets IN ACCESS EXCLUSIVE MODE")
            # The list waits for the lock until its statement_timeout cancels it.
            r = await quick.call("GET", org.path("/tickets"), org.member)
            body = assert_problem(r, 503, "timeout")
            assert r.headers["retry-after"] == str(TIMEOUT_RETRY_AFTER)
            assert "try again" in body["detail"]
            # What doesn't need the locked table still answers, on the same pool.
            assert (await quick.call("GET", org.path(), org.member)).status_code == 200
        r = await quick.call("GET", org.path("/tickets"), org.member)
        assert r.status_code == 200 and r.json()["total"] == 1


async def test_api_connections_start_with_both_timeouts(settings: Settings, users: UserFactory) -> None:
    async with tuned_api(settings, users, api_statement_timeout_ms=1234) as quick:
        app_db: Database = quick.client.app.state.db
        async with app_db.sessionmaker() as session:
            assert await session.scalar(text("SHOW statement_timeout")) == "1234ms"
            idle = await session.scalar(text("SELECT current_setting('idle_in_transaction_session_timeout')"))
            assert idle == f"{API_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"


async def test_the_workers_connections_are_not_bound_by_the_api_timeout(
    api: Api, db: Database, settings: Settings, users: UserFactory, owner_url: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["published late"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    quick = tuned(settings, api_statement_timeout_ms=QUICK_MS)
    async with (
        tuned_api(settings, users, api_statement_timeout_ms=QUICK_MS) as quick_api,
        lock_holder(owner_url) as holder,
    ):
        await holder.hold("SELECT 1 FROM organizations WHERE id = %s FOR UPDATE", (uuid.UUID(org.id),))
        worker = asyncio.create_task(run_worker(quick))
        try:
            # The worker has built the file and waits for the org lock to publish it.
            await wait_queued(owner_url, holder, "space-worker", 1)
            # A request that needs the same lock, started after the worker began waiting, is cancelled at
            # the API's bound...
            r = await quick_api.call(
                "PATCH", org.path(f"/members/{org.customer.id}"), org.owner, json={"role": "member"}
            )
            assert_problem(r, 503, "timeout")
            # ...while the worker still waits, and publishes once the lock is free.
            assert await queued_behind(owner_url, holder.pid, "space-worker") == 1
            await holder.release()
            done = await wait_state(api, org, org.member, export["id"], {"completed", "failed"})
            assert done["state"] == "completed", done
            # In one attempt: its wait was never cancelled (and retried).
            assert (await job_row(db, org.id, export["id"])).attempt == 1
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(worker, WAIT)
    # The cancelled request changed nothing.
    r = await api.call("GET", org.path("/members"), org.owner)
    assert {m["userId"]: m["role"] for m in r.json()["items"]}[str(org.customer.id)] == "customer"
