"""Permission changes and leases: the real worker paused at named points, real locks, real queue."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolClosed
from saq import Worker
from saq.queue.postgres import PostgresQueue
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork, queue_conninfo
from space.exports.failures import LeaseLost
from space.exports.formats.registry import ExportKind
from space.exports.jobs import run_export_job
from space.exports.lease import Built, Lease
from space.exports.maintenance import cleanup, reconcile
from space.exports.pipeline import publish, run_export
from space.exports.queue import RUN_EXPORT, export_job
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultKey
from space.queue import open_queue
from tests.exports.fixtures import (
    WAIT,
    Gate,
    add_project,
    add_tickets,
    background,
    blocked_by,
    chunk_count,
    create_export,
    download,
    expire_lease,
    fail_lease,
    job_row,
    parse_csv,
    runner,
    set_org_state,
    snapshot,
    tuned,
    uid,
    wait_for,
)
from tests.helpers import Api, OrgFactory, app_database, assert_problem


async def _stale_writes_refused(db: Database, settings: Settings, lease_a: Lease, org_id: str) -> None:
    """Every write A could still make, each fenced on A's execution id: all refused, the row unchanged."""
    before = snapshot(await job_row(db, org_id, lease_a.export_id))
    with pytest.raises(LeaseLost):
        await lease_a.report_progress(50)
    with pytest.raises(LeaseLost):
        await fail_lease(lease_a, "too_large")
    with pytest.raises(LeaseLost):
        await lease_a.renew()
    with pytest.raises(LeaseLost):
        await lease_a.hand_back()
    fake = Built(row_count=1, byte_size=1, sha256="0" * 64, snapshot_at=dt.datetime.now(dt.UTC))
    with pytest.raises(LeaseLost):
        await publish(runner(settings, db), lease_a, fake)
    assert snapshot(await job_row(db, org_id, lease_a.export_id)) == before


async def test_stale_worker_takeover_changes_nothing(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_project(db, org.id, "old snapshot", ["old task"])
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    gate_a, gate_b = Gate({"before_publish"}), Gate({"before_publish"})
    async with background(run_export(runner(settings, db), eid, oid, gate=gate_a), gate_a) as worker_a:
        lease_a = await gate_a.reached("before_publish")  # A has read "old snapshot" and stored its chunks
        await add_project(db, org.id, "new snapshot", ["new task"])
        await expire_lease(db, org.id, eid)
        async with background(run_export(runner(settings, db), eid, oid, gate=gate_b), gate_b) as worker_b:
            lease_b = await gate_b.reached("before_publish")  # B owns it now, still running
            assert lease_b.execution_id != lease_a.execution_id and lease_b.attempt == 2
            while_b_runs = snapshot(await job_row(db, org.id, eid))
            assert while_b_runs["state"] == "running" and while_b_runs["execution_id"] == lease_b.execution_id
            # A wakes up while B is still running: its publish is refused, so are its other writes.
            gate_a.resume("before_publish")
            assert await worker_a == "lease_lost"
            assert snapshot(await job_row(db, org.id, eid)) == while_b_runs
            await _stale_writes_refused(db, settings, lease_a, org.id)
            gate_b.resume("before_publish")
            assert await worker_b == "completed"
    after_b = snapshot(await job_row(db, org.id, eid))
    assert after_b["state"] == "completed" and after_b["progress"] == 100 and after_b["error_code"] is None
    assert after_b["execution_id"] == lease_b.execution_id and after_b["attempt"] == 2
    assert after_b["expires_at"] is not None and after_b["lease_expires_at"] is None
    # And after B has published: still nothing A does counts.
    await _stale_writes_refused(db, settings, lease_a, org.id)
    assert snapshot(await job_row(db, org.id, eid)) == after_b

    r = await download(api, org, org.owner, export["id"])
    assert r.status_code == 200 and r.headers["etag"] == f'"{after_b["sha256"]}"'
    body = json.loads(r.content)
    assert sorted(p["name"] for p in body["projects"]) == ["new snapshot", "old snapshot"]
    assert "new task" in r.text
    assert after_b["row_count"] == 4
    # A's chunks were never published: they went when A found its lease lost; B's stay, cleanup or not.
    store = PgResultStore(db)
    assert [c async for c in store.read(ResultKey(oid, eid, lease_a.execution_id))] == []
    await cleanup(db, store)
    assert (await download(api, org, org.owner, export["id"])).content == r.content


async def test_stale_worker_stops_at_its_next_progress_write(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(5)])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    one = tuned(settings, export_batch_rows=1)
    gate = Gate({"batch"})
    async with background(run_export(runner(one, db), eid, oid, gate=gate), gate) as worker_a:
        lease_a = await gate.reached("batch")
        await expire_lease(db, org.id, eid)
        assert await run_export(runner(settings, db), eid, oid) == "completed"
        after_b = snapshot(await job_row(db, org.id, eid))
        gate.resume("batch")
        assert await worker_a == "lease_lost"
    assert gate.seen.count("batch") == 1  # A stopped at its second batch's progress write
    assert snapshot(await job_row(db, org.id, eid)) == after_b
    assert after_b["execution_id"] != lease_a.execution_id and after_b["row_count"] == 5


@pytest.mark.parametrize("change", ["demote", "remove"])
async def test_access_lost_during_read_fails_access_revoked(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, change: str
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["a", "b", "c"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    gate = Gate({"batch"})
    async with background(run_export(runner(tuned(settings, export_batch_rows=1), db), eid, oid, gate=gate), gate) as w:
        await gate.reached("batch")
        if change == "demote":
            r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "customer"})
            assert r.status_code == 200, r.text
        else:
            r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
            assert r.status_code == 204, r.text
        gate.open_all()
        # The change cancelled the export in its own transaction (SPEC §12): the worker's next write is refused.
        assert await w == "lease_lost"
    job = await job_row(db, org.id, eid)
    assert (job.state, job.error_code, job.sha256, job.expires_at) == ("cancelled", "access_revoked", None, None)
    assert await chunk_count(db, org.id, eid) == 0
    assert_problem(await download(api, org, org.member, export["id"]), 403, "access_revoked")


async def test_eligibility_is_checked_before_reading(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    # Written directly: the role-change route would cancel the export before any worker saw it (SPEC §12), and
    # this is about the worker's own check (a row changed by anything else, or a cancel it raced with).
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
        await uow.session.execute(
            text("UPDATE memberships SET role = 'customer' WHERE org_id = :org AND user_id = :user"),
            {"org": uid(org.id), "user": org.member.id},
        )
    gate = Gate(set())
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id), gate=gate) == "access_revoked"
    assert "counted" not in gate.seen


async def test_publish_holds_the_org_lock(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["kept"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    worker_app = f"space-worker-{uuid.uuid4().hex[:8]}"
    gate = Gate({"publish_locked"})
    async with (
        app_database(owner_url, worker_app) as worker_db,
        background(run_export(runner(settings, worker_db), eid, oid, gate=gate), gate) as w,
    ):
        await gate.reached("publish_locked")
        # `concurrently` sends from a thread, so this loop stays free while the request waits.
        change = [("PATCH", org.path(f"/members/{org.member.id}"), org.owner, {"role": "customer"})]
        async with background(api.concurrently(change)) as demotion:
            await wait_for(lambda: blocked_by(owner_url, "space-api", worker_app), "the role change to wait")
            assert not demotion.done()
            gate.resume("publish_locked")
            assert await w == "completed"
            [answer] = await asyncio.wait_for(demotion, WAIT)
            assert answer.status_code == 200, answer.text
    job = await job_row(db, org.id, eid)
    assert job.state == "completed" and await chunk_count(db, org.id, eid) > 0
    # Published before the demotion: the file stays, but the (now customer) owner may not take team data.
    assert_problem(await download(api, org, org.member, export["id"]), 403, "access_revoked")


async def test_org_entering_deleting_fails_the_export(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_project(db, org.id, "p", ["t"])
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    queued = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    gate = Gate({"batch"})
    async with background(run_export(runner(settings, db), eid, oid, gate=gate), gate) as w:
        await gate.reached("batch")
        await set_org_state(db, org.id, "deleting")
        gate.open_all()
        assert await w == "org_deleting"
    job = await job_row(db, org.id, eid)
    assert (job.state, job.error_code) == ("failed", "org_deleting")
    assert await chunk_count(db, org.id, eid) == 0
    # Not yet started when the org entered deleting: the re-check before reading refuses it.
    assert await run_export(runner(settings, db), uid(queued["id"]), oid) == "org_deleting"
    assert_problem(await download(api, org, org.owner, export["id"]), 409, "org_deleting")


async def test_queue_report_failing_after_commit_keeps_the_result(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["survives"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    # A queue of its own, so that no other test's job is dequeued here (keys are unique across queues).
    await _drop_queue_entry(owner_url, eid)
    queue = PostgresQueue(url=queue_conninfo(owner_url), name=f"test-{uuid.uuid4().hex[:8]}", min_size=1, max_size=4)
    await queue.connect()
    assert await queue.enqueue(export_job(settings, eid, oid, ExportKind.tickets_csv)) is not None

    async def run_then_lose_the_queue(ctx: Any, **kwargs: Any) -> str:
        # The real job; then the broker goes away before SAQ records the result.
        outcome = await run_export_job(ctx, **kwargs)
        await queue.pool.close()
        return outcome

    worker: Worker[Any] = Worker(queue, functions=[(RUN_EXPORT, run_then_lose_the_queue)], dequeue_timeout=WAIT)
    worker.context.update({"settings": settings, "db": db, "store": PgResultStore(db)})  # type: ignore[typeddict-item]
    with pytest.raises(PoolClosed):
        await worker.process()
    await queue.disconnect()

    job = await job_row(db, org.id, eid)
    assert job.state == "completed" and job.progress == 100
    before = snapshot(job)
    r = await download(api, org, org.member, export["id"])
    assert r.status_code == 200 and parse_csv(r.content)[1][1] == "survives"
    # SAQ will run the job again (sweep/retry): the claim finds it completed and changes nothing.
    ctx = {"settings": settings, "db": db, "store": PgResultStore(db)}
    assert await run_export_job(ctx, export_id=str(eid), org_id=str(oid)) == "not_claimed"
    assert snapshot(await job_row(db, org.id, eid)) == before


async def _drop_queue_entry(owner_url: str, key: uuid.UUID) -> None:
    async with await psycopg.AsyncConnection.connect(queue_conninfo(owner_url), autocommit=True) as conn:
        await conn.execute("DELETE FROM saq_jobs WHERE key = %s", (str(key),))


async def test_reconciler_requeues_lost_and_expired_jobs(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await orgs.make()
    lost = await create_export(api, org, org.owner, {"kind": "snapshot"})
    stalled = await create_export(api, org, org.admin, {"kind": "snapshot"})
    exhausted = await create_export(api, org, org.member, {"kind": "snapshot"})
    oid = uid(org.id)
    queue = await open_queue(settings, db, application_name="space-test-reconciler")
    await queue.connect()
    try:
        assert await queue.job(lost["id"]) is not None  # enqueued after the create committed
        await _drop_queue_entry(owner_url, uid(lost["id"]))
        # A worker claimed `stalled` and died: lease expired, its queue entry gone.
        assert await Lease.claim(db, settings, uid(stalled["id"]), oid) is not None
        await expire_lease(db, org.id, stalled["id"])
        await _drop_queue_entry(owner_url, uid(stalled["id"]))
        # `exhausted` was claimed twice and both workers died; two attempts are all it may have. The org may
        # run two exports at once, so the reconciler wakes both waiting ones.
        two = tuned(settings, export_retries=2, export_org_concurrency=2)
        for _ in range(2):
            assert await Lease.claim(db, two, uid(exhausted["id"]), oid) is not None
            await expire_lease(db, org.id, exhausted["id"])

        report = await reconcile(two, db, queue)
        assert report["requeued"] >= 2 and report["failed"] >= 1
        for key in (lost["id"], stalled["id"]):
            entry = await queue.job(key)
            assert entry is not None and entry.status == "queued"
            assert entry.kwargs == {"export_id": key, "org_id": org.id}
        job = await job_row(db, org.id, exhausted["id"])
        assert (job.state, job.error_code, job.attempt) == ("failed", "worker_lost", 2)
        # Live entries are left alone: a second pass does not enqueue them again.
        await reconcile(two, db, queue)
        assert (await queue.job(lost["id"])).status == "queued"  # type: ignore[union-attr]
    finally:
        await queue.disconnect()
    # The requeued jobs run normally.
    assert await run_export(runner(settings, db), uid(lost["id"]), oid) == "completed"
    assert await run_export(runner(settings, db), uid(stalled["id"]), oid) == "completed"
    assert (await job_row(db, org.id, stalled["id"])).attempt == 2


async def test_cleanup_removes_expired_results_and_orphans(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["x"])
    oid = uid(org.id)
    store = PgResultStore(db)
    short = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    kept = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert await run_export(runner(tuned(settings, export_ttl_seconds=0.001), db), uid(short["id"]), oid) == "completed"
    assert await run_export(runner(settings, db), uid(kept["id"]), oid) == "completed"
    kept_job = await job_row(db, org.id, kept["id"])
    # An execution that never published (a stale or crashed worker's leftovers).
    orphan = ResultKey(oid, uid(kept["id"]), uuid.uuid4())
    await store.write(orphan, 0, b"stale bytes")
    assert await chunk_count(db, org.id, short["id"]) == 1
    assert await chunk_count(db, org.id, kept["id"]) == 2

    report = await cleanup(db, store)
    assert report["purged"] >= 1 and report["orphan_chunks"] >= 1
    short_job = await job_row(db, org.id, short["id"])
    assert short_job.state == "completed" and short_job.purged_at is not None  # the row stays for history
    assert await chunk_count(db, org.id, short["id"]) == 0
    assert await chunk_count(db, org.id, kept["id"]) == 1
    assert snapshot(await job_row(db, org.id, kept["id"])) == snapshot(kept_job)
    assert_problem(await download(api, org, org.member, short["id"]), 410, "export_expired")
    assert (await download(api, org, org.member, kept["id"])).status_code == 200


async def test_heartbeat_keeps_the_lease(api: Api, orgs: OrgFactory, db: Database, settings: Settings) -> None:
    org = await orgs.make()
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    short = tuned(settings, export_lease_seconds=0.6)
    gate = Gate({"counted"})
    async with background(run_export(runner(short, db), eid, oid, gate=gate), gate) as w:
        await gate.reached("counted")  # paused: no progress writes, only the heartbeat
        first = (await job_row(db, org.id, eid)).lease_expires_at
        assert first is not None

        async def renewed_past_a_whole_lease() -> bool:
            current = (await job_row(db, org.id, eid)).lease_expires_at
            return current is not None and (current - first).total_seconds() >= 0.6

        await wait_for(renewed_past_a_whole_lease, "the heartbeat to renew the lease")
        # More than a lease after the claim, the lease still holds: nobody else can claim it.
        assert await Lease.claim(db, short, eid, oid) is None
        gate.resume("counted")
        assert await w == "completed"


async def test_transient_error_gives_the_export_back_for_a_retry(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    two = tuned(settings, export_retries=2)
    broken = Gate(set(), fail_at={"counted": ConnectionResetError("database connection lost")})
    with pytest.raises(ConnectionResetError):
        await run_export(runner(two, db), eid, oid, gate=broken)  # re-raised: SAQ retries the job
    job = await job_row(db, org.id, eid)
    assert (job.state, job.attempt, job.lease_expires_at) == ("queued", 1, None)
    assert await run_export(runner(two, db), eid, oid) == "completed"
    assert (await job_row(db, org.id, eid)).attempt == 2

    # On the last attempt the same error is final.
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid = uid(export["id"])
    with pytest.raises(ConnectionResetError):
        await run_export(runner(two, db), eid, oid, gate=broken)
    assert await run_export(runner(two, db), eid, oid, gate=broken) == "internal_error"
    job = await job_row(db, org.id, eid)
    assert (job.state, job.error_code, job.attempt) == ("failed", "internal_error", 2)
    assert await chunk_count(db, org.id, eid) == 0


async def test_cancelled_run_hands_the_export_back(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["a", "b"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    gate = Gate({"batch"})
    task = asyncio.ensure_future(run_export(runner(tuned(settings, export_batch_rows=1), db), eid, oid, gate=gate))
    try:
        await gate.reached("batch")
        task.cancel()  # what a worker shutdown (SIGTERM) or SAQ's job timeout does
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        gate.open_all()
    job = await job_row(db, org.id, eid)
    assert (job.state, job.lease_expires_at, job.attempt) == ("queued", None, 1)
    assert await run_export(runner(settings, db), eid, oid) == "completed"
