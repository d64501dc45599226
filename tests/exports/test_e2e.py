"""Exports through the API and the real SAQ worker (run_worker), end to end."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from space.db import Database
from space.queue import queue_identity
from space.worker import run_worker
from tests.exports.fixtures import (
    add_project,
    add_tickets,
    create_export,
    download,
    parse_csv,
    wait_state,
)
from tests.helpers import Api, redis_reachable, spawn_worker


async def test_snapshot_and_csv_through_api_and_worker(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org("E2E, Inc.")
    await add_project(db, org.id, "Launch", ["Plan", "Ship"])
    await add_tickets(db, org.id, org.member, ["Printer on fire", "=HYPERLINK()"], status="open")
    await add_tickets(db, org.id, org.member, ["Closed one"], status="closed")

    worker = asyncio.create_task(run_worker(settings))
    try:
        snap = await create_export(api, org, org.owner, {"kind": "snapshot"})
        tickets = await create_export(
            api, org, org.member, {"kind": "tickets_csv", "filters": {"status": "open"}, "delimiter": ";"}
        )
        assert snap["state"] == "queued" and snap["scope"] == "team" and snap["canDownload"] is False
        assert tickets["filters"] == {"status": "open"}

        done = await wait_state(api, org, org.owner, snap["id"], {"completed", "failed"})
        assert done["state"] == "completed", done
        assert done["progress"] == 100 and done["canDownload"] is True
        r = await download(api, org, org.owner, snap["id"])
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.headers["etag"] == f'"{done["sha256"]}"'
        assert hashlib.sha256(r.content).hexdigest() == done["sha256"]
        assert int(r.headers["content-length"]) == len(r.content) == done["byteSize"]
        body = json.loads(r.content)
        assert body["schemaVersion"] == 1 and body["organizationId"] == org.id
        assert body["organizationName"] == "E2E, Inc."
        assert [p["name"] for p in body["projects"]] == ["Launch"]
        assert sorted(t["title"] for t in body["tasks"]) == ["Plan", "Ship"]

        done = await wait_state(api, org, org.member, tickets["id"], {"completed", "failed"})
        assert done["state"] == "completed", done
        assert done["rowCount"] == 2
        r = await download(api, org, org.member, tickets["id"])
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "text/csv; charset=utf-8"
        records = parse_csv(r.content, ";")
        assert records[0] == ["number", "title", "status", "priority", "assignee", "createdAt", "updatedAt"]
        assert [rec[1] for rec in records[1:]] == ["Printer on fire", "'=HYPERLINK()"]
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, 15)
    assert worker.done()


async def test_worker_process_exports_then_stops_on_sigterm(api: Api, db: Database, owner_url: str) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.customer, ["from a real worker process"])
    proc = await spawn_worker(owner_url, stderr=asyncio.subprocess.PIPE)
    try:
        export = await create_export(api, org, org.customer, {"kind": "tickets_csv"})
        done = await wait_state(api, org, org.customer, export["id"], {"completed", "failed"})
        assert done["state"] == "completed", done
        assert parse_csv((await download(api, org, org.customer, export["id"])).content)[1][1] == (
            "from a real worker process"
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode == 0, stderr.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


REDIS_URL = os.environ.get("SPACE_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")


@pytest.mark.skipif(not redis_reachable(REDIS_URL), reason="no Redis to test the optional Redis queue against")
async def test_export_through_the_optional_redis_queue(api: Api, db: Database, settings: Settings) -> None:
    # SPACE_QUEUE_URL=redis://... selects SAQ's Redis backend for both enqueueing (API) and the worker.
    import redis.asyncio as redis

    client = redis.from_url(REDIS_URL)
    await client.flushdb()
    await client.aclose()
    on_redis = msgspec.structs.replace(settings, queue_url=REDIS_URL)
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["via redis"])
    worker = asyncio.create_task(run_worker(on_redis))
    try:
        async with AsyncTestClient(app=create_app(on_redis)) as redis_client:
            rapi = Api(redis_client, api.users)
            export = await create_export(rapi, org, org.member, {"kind": "tickets_csv"})
            done = await wait_state(rapi, org, org.member, export["id"], {"completed", "failed"})
            assert done["state"] == "completed", done
            records = parse_csv((await download(rapi, org, org.member, export["id"])).content, ",")
            assert [rec[1] for rec in records[1:]] == ["via redis"]
        # The job really travelled through Redis (not the PostgreSQL queue), on the installation's queue.
        name = (await queue_identity(on_redis, db)).name
        client = redis.from_url(REDIS_URL)
        assert await client.exists(f"saq:job:{name}:{export['id']}")
        await client.aclose()
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, 15)
