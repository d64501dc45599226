"""SPEC §14 fairness: at most SPACE_EXPORT_ORG_CONCURRENCY exports of one org run at once, and one org's backlog
never holds up another org's export by more than one export per free worker slot.

The limit itself (n-1 claim, n deferred) with the real worker code paused at named points; its race with the
org's claim lock held from a second connection; the wake-up that hands an org its next export; and the whole
scenario (20 queued in one org, one in another) through a real SAQ worker, judged by the ledger's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from types import SimpleNamespace
from typing import Any

import psycopg
from saq.job import Status

from space.config import Settings
from space.db import Database
from space.db.locks import ORG_CLAIMS
from space.exports.formats.registry import ExportKind
from space.exports.jobs import wake_after_export_job
from space.exports.lease import Lease
from space.exports.pipeline import run_export
from space.exports.queue import enqueue_export
from space.queue import open_queue
from space.worker import run_worker
from tests.exports.fixtures import (
    WAIT,
    Gate,
    add_tickets,
    background,
    create_export,
    expire_lease,
    fail_lease,
    job_row,
    runner,
    tuned,
    uid,
    wait_for,
)
from tests.exports.limits_fixtures import lock_holder, tuned_api, wait_queued
from tests.helpers import Api, UserFactory

CSV = {"kind": "tickets_csv"}


async def test_org_concurrency_limit_defers_the_nth_claim(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["one", "two"])
    first, second, third = [await create_export(api, org, u, CSV) for u in (org.member, org.admin, org.owner)]
    two = tuned(settings, export_org_concurrency=2)
    gates = [Gate({"claimed"}), Gate({"claimed"})]
    oid = uid(org.id)
    async with (
        background(run_export(runner(two, db), uid(first["id"]), oid, gate=gates[0]), gates[0]) as a,
        background(run_export(runner(two, db), uid(second["id"]), oid, gate=gates[1]), gates[1]) as b,
    ):
        await gates[0].reached("claimed")
        # One running of two allowed: the second claim is taken.
        await gates[1].reached("claimed")
        # Two running: the third is refused without using an attempt, and stays queued.
        assert await run_export(runner(two, db), uid(third["id"]), oid) == "deferred"
        job = await job_row(db, org.id, third["id"])
        assert (job.state, job.attempt, job.execution_id, job.started_at) == ("queued", 0, None, None)
        gates[0].resume("claimed")
        assert await asyncio.wait_for(a, WAIT) == "completed"
        # A slot is free again.
        assert await run_export(runner(two, db), uid(third["id"]), oid) == "completed"
        gates[1].resume("claimed")
        assert await asyncio.wait_for(b, WAIT) == "completed"
    assert (await job_row(db, org.id, third["id"])).attempt == 1


async def test_the_default_is_one_export_of_an_org_at_a_time(api: Api, db: Database, settings: Settings) -> None:
    assert settings.export_org_concurrency == 1
    org = await api.org()
    running, waiting = [await create_export(api, org, u, CSV) for u in (org.member, org.admin)]
    oid = uid(org.id)
    assert await Lease.claim(db, settings, uid(running["id"]), oid) is not None
    assert await run_export(runner(settings, db), uid(waiting["id"]), oid) == "deferred"
    # A lease that ran out (its worker is gone) holds no slot.
    await expire_lease(db, org.id, running["id"])
    assert await run_export(runner(settings, db), uid(waiting["id"]), oid) == "completed"
    # Other orgs were never affected.
    other = await api.org("Other")
    elsewhere = await create_export(api, other, other.member, CSV)
    assert await run_export(runner(settings, db), uid(elsewhere["id"]), uid(other.id)) == "completed"


async def test_concurrent_claims_in_one_org_take_one_slot(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    exports = [await create_export(api, org, u, CSV) for u in (org.member, org.admin)]
    oid = uid(org.id)
    gates = [Gate({"claimed"}), Gate({"claimed"})]
    async with lock_holder(owner_url) as holder:
        await holder.hold("SELECT pg_advisory_xact_lock(%s::int, hashtext(%s))", (ORG_CLAIMS, org.id))
        async with (
            background(run_export(runner(settings, db), uid(exports[0]["id"]), oid, gate=gates[0]), gates[0]) as a,
            background(run_export(runner(settings, db), uid(exports[1]["id"]), oid, gate=gates[1]), gates[1]) as b,
        ):
            # Both counted nothing running yet; the claim lock makes them count one after the other.
            await wait_queued(owner_url, holder, "space-tests", 2)
            await holder.release()
            done, _ = await asyncio.wait({a, b}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, "one of the two claims must be refused"
            refused = done.pop()
            assert refused.result() == "deferred"
            claimed, gate = (b, gates[1]) if refused is a else (a, gates[0])
            await gate.reached("claimed")
            gate.resume("claimed")
            assert await asyncio.wait_for(claimed, WAIT) == "completed"


async def test_creation_queues_only_what_the_org_may_run_and_an_ending_export_wakes_the_next(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    first, second, third = [await create_export(api, org, u, CSV) for u in (org.member, org.admin, org.owner)]
    queue = await open_queue(settings, db, application_name="space-test-wake")
    await queue.connect()
    try:
        # The first is on the queue; the others wait in the ledger behind it, so they can't sit on the queue
        # in front of other orgs' exports.
        entry = await queue.job(first["id"])
        assert entry is not None and entry.status == Status.QUEUED
        assert await queue.job(second["id"]) is None and await queue.job(third["id"]) is None
        assert await run_export(runner(settings, db), uid(first["id"]), uid(org.id)) == "completed"
        ctx: dict[str, Any] = {"settings": settings, "db": db, "worker": SimpleNamespace(queue=queue), "job": entry}
        # While the entry is still unfinished (SAQ keeps it for a retry), the hook leaves the org alone.
        await wake_after_export_job(ctx)
        assert await queue.job(second["id"]) is None
        # Once it has finished: the org's oldest waiting export is enqueued, and only as many as may run.
        await entry.finish(Status.COMPLETE, result="completed")
        await wake_after_export_job(ctx)
        woken = await queue.job(second["id"])
        assert woken is not None and woken.status == Status.QUEUED
        assert woken.kwargs == {"export_id": second["id"], "org_id": org.id}
        assert await queue.job(third["id"]) is None
    finally:
        with contextlib.suppress(Exception):
            await queue.disconnect()


async def test_a_refused_claim_wakes_its_org_once_its_queue_entry_has_finished(
    api: Api, db: Database, settings: Settings
) -> None:
    # The gap the hook closes: room opens after a claim was refused but before its entry finished, so the
    # export that made the room could not enqueue it (its key was still taken). The refused one's own
    # wake-up, after its entry has finished, sees the room and enqueues it again.
    org = await api.org()
    running, waiting = [await create_export(api, org, u, CSV) for u in (org.member, org.admin)]
    oid = uid(org.id)
    queue = await open_queue(settings, db, application_name="space-test-wake")
    await queue.connect()
    try:
        lease = await Lease.claim(db, settings, uid(running["id"]), oid)
        assert lease is not None
        assert await enqueue_export(queue, settings, uid(waiting["id"]), oid, ExportKind.tickets_csv)
        entry = await queue.job(waiting["id"])
        assert entry is not None
        assert await run_export(runner(settings, db), uid(waiting["id"]), oid) == "deferred"
        await fail_lease(lease, "too_large")  # the running one ends; its own wake-up would find `waiting`'s key taken
        assert not await enqueue_export(queue, settings, uid(waiting["id"]), oid, ExportKind.tickets_csv)
        await entry.finish(Status.COMPLETE, result="deferred")
        ctx: dict[str, Any] = {"settings": settings, "db": db, "worker": SimpleNamespace(queue=queue), "job": entry}
        await wake_after_export_job(ctx)
        again = await queue.job(waiting["id"])
        assert again is not None and again.status == Status.QUEUED
    finally:
        with contextlib.suppress(Exception):
            await queue.disconnect()


async def test_a_backlog_in_one_org_does_not_hold_up_another_orgs_export(
    api: Api, db: Database, settings: Settings, users: UserFactory, owner_url: str
) -> None:
    limits = {"export_rate_limit": 20, "export_user_rate_limit": 21}
    fair = tuned(settings, worker_concurrency=2, export_org_concurrency=1, **limits)
    busy = await api.org("Backlog")
    await add_tickets(db, busy.id, busy.member, [f"backlog {i}" for i in range(20)])
    small = await api.org("Small")
    await add_tickets(db, small.id, small.member, ["small"])
    async with tuned_api(settings, users, **limits) as limited:
        backlog = [(await create_export(limited, busy, busy.owner, CSV))["id"] for _ in range(20)]
        single = (await create_export(limited, small, small.member, CSV))["id"]
    ours = [*backlog, single]
    # Only this scenario on the queue: earlier tests leave entries that no worker took.
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("DELETE FROM saq.saq_jobs WHERE status = 'queued' AND NOT key = ANY(%s)", (ours,))

    async def finished() -> bool:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM export_jobs WHERE id = ANY(%s::uuid[]) AND state = 'completed'", (ours,)
            ).fetchone()
        return row is not None and row[0] == len(ours)

    worker = asyncio.create_task(run_worker(fair))
    try:
        # Nothing but the worker's own wake-ups moves the backlog along (the reconciler runs once a lease).
        await wait_for(finished, "all 21 exports to complete", within=120)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, WAIT)
    jobs = {e: await job_row(db, busy.id if e in backlog else small.id, e) for e in ours}
    other = jobs[single]
    assert other.started_at is not None
    started_first = [e for e in backlog if (jobs[e].started_at or other.started_at) < other.started_at]
    # One export per free worker slot at most (here: the one that took the first slot).
    assert len(started_first) <= fair.worker_concurrency, len(started_first)
    # The backlog ran one at a time, oldest first, each claimed once.
    runs = sorted((jobs[e] for e in backlog), key=lambda j: j.started_at or other.started_at)
    assert [str(j.id) for j in runs] == backlog
    for before, after in itertools.pairwise(runs):
        assert before.completed_at is not None and after.started_at is not None
        assert before.completed_at <= after.started_at, (before.id, after.id)
    assert {j.attempt for j in jobs.values()} == {1}
