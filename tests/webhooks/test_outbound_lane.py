"""The outbound lane (SPEC §25, issue 29): a real `space worker` process, the real app, and a receiver on 127.0.0.1
that accepts connections and never answers (`receiver.silent`), as a slow customer's endpoint is.

- One org's ten endpoints hang: another org's export completes before any of the first org's attempts has
  timed out (no attempt of theirs is logged yet), with one export slot only.
- One org never holds more than SPACE_OUTBOUND_ORG_CONCURRENCY connections to its receiver at once, over several
  rounds of attempts, while another org's delivery goes through; the waits never count as attempts.

A database of its own, so that the worker process sees only this module's queue entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings, load_settings
from space.db import Database
from tests.exports.fixtures import add_tickets, create_export, wait_for, wait_state
from tests.helpers import Api, Org, UserFactory, app_database, fresh_database, spawn_worker
from tests.orgs.fixtures import request_deletion
from tests.webhooks.receiver import Silent, receiver, silent, verifies

pytestmark = pytest.mark.slow

ENDPOINTS = 10
ORG_SHARE = Settings().outbound_org_concurrency
"""SPACE_OUTBOUND_ORG_CONCURRENCY as the worker process has it: the default, 2."""


@pytest.fixture(scope="module")
def lane_url(owner_url: str) -> Iterator[str]:
    """A fresh migrated database: no other module's queue entries reach this module's worker."""
    with fresh_database(owner_url, "space_lane") as url:
        yield url


@pytest.fixture(scope="module")
async def lane_db(lane_url: str) -> AsyncIterator[Database]:
    """The app role on that database."""
    async with app_database(lane_url, "space-tests-lane") as database:
        yield database


@pytest.fixture(scope="module")
async def lane_api(lane_url: str, lane_db: Database) -> AsyncIterator[Api]:
    """The real app on that database, allowing webhooks to this machine."""
    settings = load_settings({}, database_url=lane_url, webhook_allow_private=True)
    async with AsyncTestClient(app=create_app(settings)) as client:
        yield Api(client, UserFactory(lane_db))


@pytest.fixture(scope="module")
async def worker_process(lane_url: str, lane_api: Api, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Path]:
    """One real `space worker` with one export slot (so a delivery in it would stall every export) and the
    default outbound lane (8 slots, 2 per org); failed deliveries retry at once. Yields its log's path."""
    log = tmp_path_factory.mktemp("lane") / "worker.log"
    with log.open("wb") as out:
        proc = await spawn_worker(
            lane_url,
            stderr=out.fileno(),
            SPACE_WORKER_CONCURRENCY="1",
            SPACE_WEBHOOK_ALLOW_PRIVATE="1",
            SPACE_WEBHOOK_RETRY_SECONDS="0",
            SPACE_WORKER_METRICS_PORT="0",
        )
    try:
        yield log
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _hooks(api: Api, org: Org, url: str, events: list[str], n: int) -> list[dict[str, Any]]:
    created = []
    for _ in range(n):
        r = await api.call("POST", org.path("/webhooks"), org.owner, json={"url": url, "events": events})
        assert r.status_code == 201, r.text
        created.append(r.json())
    return created


def _deliveries(lane_url: str, org: Org) -> list[tuple[str, int, int]]:
    """Each delivery of the org: state, attempts, and the attempts its log holds (read in one snapshot)."""
    with psycopg.connect(lane_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT d.state, d.attempts, (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id)"
            " FROM webhook_deliveries d WHERE d.org_id = %s",
            (org.id,),
        ).fetchall()
    return [(str(s), int(n), int(logged)) for s, n, logged in rows]


async def _holding(slow: Silent, n: int, log: Path) -> None:
    async def check() -> bool:
        return slow.seen()[1] >= n

    try:
        await wait_for(check, f"{n} connections held at the silent receiver")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {slow.seen()}\n{_tail(log)}") from None


def _tail(log: Path) -> str:
    """The end of the worker's log, for a failure message."""
    return log.read_text(errors="replace")[-4000:]


async def test_an_orgs_hanging_endpoints_never_hold_up_another_orgs_export(
    lane_api: Api, lane_db: Database, lane_url: str, worker_process: Path
) -> None:
    a = await lane_api.org("Slow customer")
    b = await lane_api.org("Bystander")
    await add_tickets(lane_db, b.id, b.member, ["b-1", "b-2"])
    with silent() as slow:
        await _hooks(lane_api, a, slow.url, ["export.completed"], ENDPOINTS)
        # a's export ends in the worker: its export.completed is owed to ten endpoints that never answer.
        done_a = await wait_state(
            lane_api,
            a,
            a.member,
            (await create_export(lane_api, a, a.member, {"kind": "snapshot"}))["id"],
            {"completed", "failed"},
        )
        assert done_a["state"] == "completed", done_a
        await _holding(slow, 1, worker_process)
        # While they hang, b's export runs in the one export slot.
        export_b = await create_export(lane_api, b, b.member, {"kind": "tickets_csv"})
        done_b = await wait_state(lane_api, b, b.member, export_b["id"], {"completed", "failed"})
        # Read at once: has any of a's attempts ended (its 5 s timeout) before b's export completed?
        rows = _deliveries(lane_url, a)
        seen = slow.seen()
    assert done_b["state"] == "completed", done_b
    assert len(rows) == ENDPOINTS
    # No attempt of a's is logged: b's export completed within one delivery timeout of a's hanging.
    assert [logged for _, _, logged in rows] == [0] * ENDPOINTS, rows
    assert {state for state, _, _ in rows} <= {"pending", "sending"}, rows
    assert seen[2] <= ORG_SHARE, seen


async def test_one_org_holds_at_most_its_outbound_share_while_another_orgs_delivery_goes_through(
    lane_api: Api, lane_url: str, worker_process: Path
) -> None:
    a = await lane_api.org()
    b = await lane_api.org()
    with silent() as slow, receiver() as rx:
        await _hooks(lane_api, a, slow.url, ["org.deletion_requested"], ENDPOINTS)
        [hook_b] = await _hooks(lane_api, b, rx.url, ["org.deletion_requested"], 1)
        await request_deletion(lane_api, a)
        await _holding(slow, ORG_SHARE, worker_process)
        # b's event while a's attempts hang: the lane has room for it.
        await request_deletion(lane_api, b)
        got = await rx.next()

        async def b_delivered() -> bool:
            return _deliveries(lane_url, b) == [("delivered", 1, 1)]

        await wait_for(b_delivered, "b's delivery to be recorded")
        # Still none of a's attempts has ended: b's went through beside them.
        assert [logged for _, _, logged in _deliveries(lane_url, a)] == [0] * ENDPOINTS

        # a's first two attempts time out and two more take their places; never a third beside them.
        async def next_round() -> bool:
            return slow.seen()[0] >= 2 * ORG_SHARE

        await wait_for(next_round, "a's second round of attempts")
        rows = _deliveries(lane_url, a)
        seen = slow.seen()
    assert seen[2] == ORG_SHARE, seen
    assert verifies(hook_b["secret"], got)
    # Each attempt made is logged when it ends; the waits at the cap are none of them.
    for state, attempts, logged in rows:
        assert attempts == logged + (state == "sending"), rows
    assert sum(attempts for _, attempts, _ in rows) >= 2 * ORG_SHARE
