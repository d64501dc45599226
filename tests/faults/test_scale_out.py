"""Scale-out (SPEC §1, issue 18): two `space api` and three `space worker` processes on one database, thirty
exports of ten orgs asked through both APIs, one worker SIGKILLed while it holds an export. Every export
completes exactly once (one published execution), and both APIs serve the same bytes.

Prints an `OBSERVED` line (see it with `pytest -m faults -rP`).
"""

from __future__ import annotations

import hashlib
import signal
from collections import Counter

import httpx
import pytest

from space.db import Database
from tests.exports.fixtures import create_export, download
from tests.faults.procs import (
    ROWS,
    SCENARIO_SECONDS,
    MidRead,
    Owner,
    Procs,
    observed,
    published_csv,
    run_cleanup,
    seeded,
    wait_until,
)
from tests.helpers import Api, Org, UserFactory

pytestmark = pytest.mark.faults

ORGS = 10
PER_ORG = 3


async def _workers(owner: Owner) -> set[str]:
    """Ids of the export workers SAQ knows as alive (each writes its row when it starts, then every few seconds); a
    worker process's outbound lane is a SAQ worker of its own, on the `-outbound` queue, and is not counted."""
    rows = await owner.fetch(
        "SELECT worker_id FROM saq.saq_stats WHERE expire_at >= extract(epoch FROM now())"
        " AND right(queue_key, 9) <> '-outbound'"
    )
    return {r["worker_id"] for r in rows}


async def _ran_by(owner: Owner, export_ids: list[str]) -> dict[str, str]:
    """The worker whose run finished each export's queue entry (SAQ keeps it in the entry)."""
    rows = await owner.fetch(
        "SELECT key, convert_from(job, 'UTF8')::jsonb ->> 'worker_id' AS worker FROM saq.saq_jobs WHERE key = ANY(%s)",
        export_ids,
    )
    return {r["key"]: r["worker"] for r in rows}


@pytest.mark.timeout(SCENARIO_SECONDS)
async def test_two_apis_three_workers_thirty_exports_one_worker_killed(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    _, base2 = await procs.api("api-2")
    async with httpx.AsyncClient(base_url=base2, timeout=30) as client2:
        api2 = Api(client2, UserFactory(faults_db))  # type: ignore[arg-type]
        apis = [fapi, api2]
        orgs: list[tuple[Org, list[str]]] = [await seeded(fapi, faults_db, f"scale{i}") for i in range(ORGS)]
        held_org, held_markers = orgs[0]
        held_id = (await create_export(fapi, held_org, held_org.member, {"kind": "tickets_csv"}))["id"]

        before = await _workers(owner)
        async with MidRead(owner, held_org.id, held_id) as pause:
            await pause.arm()
            # The victim starts with the held export alone on the queue: it claims it at once and stops in its read.
            # (Started behind the other exports, it would reach the held one only after working through them in one
            # slot: its other slot waits in the reconciler's wake-up of the held org, on the org lock the pause holds.)
            victim = await procs.worker("worker-victim")
            held = await pause.engage()
            [victim_id] = await wait_until(lambda: _new_workers(owner, before, 1), "the victim in SAQ's worker list")
            # Each org's member asks three times in all, alternately through each API; each org runs one export at
            # a time, so its later ones wait in the ledger and are woken as the earlier ones end.
            exports: list[tuple[Org, list[str], str]] = [(held_org, held_markers, held_id)]
            for round_ in range(PER_ORG):
                for i, (org, markers) in enumerate(orgs):
                    if (round_, i) == (0, 0):
                        continue
                    api = apis[(i + round_) % 2]
                    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
                    exports.append((org, markers, export["id"]))
            ids = [e[2] for e in exports]
            survivors = [await procs.worker("worker-2"), await procs.worker("worker-3")]
            alive = await wait_until(lambda: _new_workers(owner, before, 3), "all three workers in SAQ's worker list")
            victim.send(signal.SIGKILL)
            assert await victim.wait() == -signal.SIGKILL
        survivor_ids = alive - {victim_id}
        killed = await owner.export(held_id)
        assert (killed["state"], str(killed["execution_id"])) == ("running", held.execution_id), killed

        rows = {eid: await owner.finished(eid) for eid in ids}
        assert all(p.alive for p in survivors), procs.logs()
        states = Counter(r["state"] for r in rows.values())
        assert states == {"completed": ORGS * PER_ORG}, (states, procs.logs())
        # The held export was claimed again after the kill, by a survivor, and published once.
        assert rows[held_id]["attempt"] == 2 and str(rows[held_id]["execution_id"]) != held.execution_id
        ran_by = await _ran_by(owner, ids)
        assert ran_by[held_id] in survivor_ids, (ran_by[held_id], survivor_ids)

        # Exactly once: one published execution per export, and after the cleanup no chunk of any other.
        swept = await run_cleanup(faults_db)
        for eid, row in rows.items():
            assert row["row_count"] == ROWS and row["progress"] == 100 and row["sha256"], row
            assert list(await owner.chunks(eid)) == [str(row["execution_id"])], eid

        # Both APIs serve the same bytes, the published ones.
        for org, markers, eid in exports:
            body = await published_csv(fapi, org, eid, rows[eid], markers)
            other = await download(api2, org, org.member, eid)
            assert other.status_code == 200 and other.content == body, eid
            assert other.headers["etag"].strip('"') == hashlib.sha256(body).hexdigest() == rows[eid]["sha256"]

    observed(
        "scale_out",
        apis=2,
        workers=3,
        exports=len(ids),
        orgs=ORGS,
        killed_at_progress=killed["progress"],
        attempts=dict(Counter(r["attempt"] for r in rows.values())),
        exports_per_worker=dict(Counter("victim" if w == victim_id else "survivor" for w in ran_by.values())),
        cleanup=swept,
    )


async def _new_workers(owner: Owner, before: set[str], n: int) -> set[str] | None:
    """The workers that appeared since `before`, once there are `n` of them."""
    new = await _workers(owner) - before
    return new if len(new) >= n else None
