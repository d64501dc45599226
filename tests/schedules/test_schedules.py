"""Schedules (SPEC §21): the routes and their limit, the cron that makes runs (once, also after an outage, once
for two workers), the pause on access_revoked and after three failures (told through §19), and incremental runs
that hold every committed change exactly once, checked against the database's final state."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.schedules.jobs import run_due
from tests.exports.fixtures import Gate, add_project, add_tickets, background, download, parse_csv, runner, tuned
from tests.helpers import Api, Org, assert_problem

pytestmark = pytest.mark.asyncio


async def _schedule(api: Api, org: Org, body: dict[str, Any], user: Any = None) -> dict[str, Any]:
    r = await api.call("POST", org.path("/schedules"), user or org.admin, json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _make_due(owner: psycopg.Connection[Any], schedule_id: str, hours: int = 1) -> None:
    owner.execute(
        "UPDATE schedules SET next_run_at = now() - make_interval(hours => %s) WHERE id = %s", (hours, schedule_id)
    )


async def _runs(db: Database, org: Org, schedule_id: str) -> list[tuple[uuid.UUID, str, str | None]]:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        rows = await uow.session.execute(
            text(
                "SELECT id, state, error_code FROM export_jobs WHERE org_id = :o AND schedule_id = :s ORDER BY created_at"
            ),
            {"o": org.id, "s": schedule_id},
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_routes_shape_roles_and_limit(api: Api, settings: Settings) -> None:
    org = await api.org()
    body = {"kind": "tickets_csv", "filters": {"status": "open"}, "every": "day", "at": "06:30", "incremental": True}
    s = await _schedule(api, org, body)
    assert {k: s[k] for k in ("kind", "filters", "every", "at", "weekday", "incremental", "paused")} == {
        "kind": "tickets_csv",
        "filters": {"status": "open"},
        "every": "day",
        "at": "06:30",
        "weekday": None,
        "incremental": True,
        "paused": False,
    }
    assert s["nextRunAt"].endswith("06:30:00Z") or "T06:30:00" in s["nextRunAt"]
    assert s["createdBy"] == str(org.admin.id) and s["consecutiveFailures"] == 0 and s["pausedReason"] is None
    for who in (org.member, org.customer):
        r = await api.call("POST", org.path("/schedules"), who, json=body)
        assert r.status_code in (403, 404), r.text
    assert_problem(
        await api.call("POST", org.path("/schedules"), org.owner, json={**body, "every": "hour"}),
        400,
        "invalid_request",
    )
    assert_problem(
        await api.call(
            "POST", org.path("/schedules"), org.owner, json={"kind": "archive", "every": "week", "incremental": True}
        ),
        400,
        "invalid_request",
    )
    r = await api.call("PATCH", org.path(f"/schedules/{s['id']}"), org.owner, json={"paused": True})
    assert r.status_code == 200 and r.json()["paused"] and r.json()["pausedReason"] == "user", r.text
    r = await api.call("GET", org.path("/schedules"), org.owner)
    assert [x["id"] for x in r.json()["items"]] == [s["id"]]
    assert (await api.call("GET", org.path(f"/schedules/{uuid.uuid4()}"), org.owner)).status_code == 404
    for _ in range(settings.schedules_per_org - 1):
        await _schedule(api, org, {"kind": "snapshot", "every": "week", "weekday": 3})
    assert_problem(
        await api.call("POST", org.path("/schedules"), org.owner, json={"kind": "snapshot", "every": "hour"}),
        409,
        "schedule_limit_reached",
    )
    assert (await api.call("DELETE", org.path(f"/schedules/{s['id']}"), org.owner)).status_code == 204
    await _schedule(api, org, {"kind": "snapshot", "every": "hour"})


async def test_due_schedule_runs_once_after_an_outage_even_with_two_workers(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    s = await _schedule(api, org, {"kind": "snapshot", "every": "hour"})
    await _make_due(owner, s["id"], hours=5)  # five slots missed while no worker ran
    made = await asyncio.gather(run_due(settings, db, None), run_due(settings, db, None))
    runs = await _runs(db, org, s["id"])
    assert len(runs) == 1, (made, runs)
    await run_export(runner(settings, db), runs[0][0], uuid.UUID(org.id))
    again = (await api.call("GET", org.path(f"/schedules/{s['id']}"), org.owner)).json()
    assert again["lastExportId"] == str(runs[0][0]) and again["nextRunAt"] > again["lastRunAt"]
    await run_due(settings, db, None)
    assert len(await _runs(db, org, s["id"])) == 1
    export = (await api.call("GET", org.path(f"/exports/{runs[0][0]}"), org.admin)).json()
    assert export["scheduleId"] == s["id"] and export["state"] == "completed" and export["since"] is None
    # Not the creator's request: their own exports are still all theirs to make (3 per minute).
    for _ in range(3):
        r = await api.call("POST", org.path("/exports"), org.admin, json={"kind": "snapshot"})
        assert r.status_code == 202, r.text
    # Deleting the schedule leaves its runs, no longer naming it.
    assert (await api.call("DELETE", org.path(f"/schedules/{s['id']}"), org.owner)).status_code == 204
    export = (await api.call("GET", org.path(f"/exports/{runs[0][0]}"), org.admin)).json()
    assert export["scheduleId"] is None and export["state"] == "completed"


async def _notified(db: Database, org: Org, schedule_id: str) -> set[uuid.UUID]:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        rows = await uow.session.execute(
            text(
                "SELECT user_id FROM notifications WHERE org_id = :o AND schedule_id = :s"
                " AND type = 'schedule.paused' AND channel = 'app'"
            ),
            {"o": org.id, "s": schedule_id},
        )
        return {r[0] for r in rows}


async def test_creator_demoted_the_run_fails_access_revoked_and_the_schedule_pauses(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    s = await _schedule(api, org, {"kind": "snapshot", "every": "day"})
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "member"})
    assert r.status_code == 200, r.text
    await _make_due(owner, s["id"])
    await run_due(settings, db, None)
    [(export_id, _, _)] = await _runs(db, org, s["id"])
    assert await run_export(runner(settings, db), export_id, uuid.UUID(org.id)) == "access_revoked"
    got = (await api.call("GET", org.path(f"/schedules/{s['id']}"), org.owner)).json()
    assert got["paused"] and got["pausedReason"] == "access_revoked", got
    assert await _notified(db, org, s["id"]) == {org.admin.id, org.owner.id}
    await _make_due(owner, s["id"])
    await run_due(settings, db, None)
    assert len(await _runs(db, org, s["id"])) == 1  # paused: no more runs


async def test_three_failed_runs_pause_the_schedule_and_tell_creator_and_owners(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b"])
    s = await _schedule(api, org, {"kind": "tickets_csv", "every": "hour"})
    failing = runner(tuned(settings, export_row_limit=1), db)
    for n in range(1, 4):
        await _make_due(owner, s["id"])
        await run_due(settings, db, None)
        runs = await _runs(db, org, s["id"])
        assert len(runs) == n
        assert await run_export(failing, runs[-1][0], uuid.UUID(org.id)) == "too_many_rows"
        got = (await api.call("GET", org.path(f"/schedules/{s['id']}"), org.owner)).json()
        assert got["consecutiveFailures"] == n and got["paused"] is (n == 3), got
    assert got["pausedReason"] == "failing"
    assert await _notified(db, org, s["id"]) == {org.admin.id, org.owner.id}


# --- incremental exactness ---------------------------------------------------------------------------------


async def _run(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], org: Org, sid: str, gate: Any = None
) -> tuple[dict[str, Any], bytes]:
    await _make_due(owner, sid)
    await run_due(settings, db, None)
    export_id = (await _runs(db, org, sid))[-1][0]
    kw = {"gate": gate} if gate is not None else {}
    assert await run_export(runner(settings, db), export_id, uuid.UUID(org.id), **kw) == "completed"
    export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.admin)).json()
    return export, (await download(api, org, org.admin, str(export_id))).content


def _versions(body: bytes) -> list[tuple[str, str]]:
    # (number, updatedAt): a ticket's version; the header first.
    return [(r[0], r[6]) for r in parse_csv(body)[1:]]


async def test_incremental_runs_hold_every_committed_change_exactly_once(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], owner_url: str
) -> None:
    org = await api.org()
    numbers = await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(6)])
    s = await _schedule(api, org, {"kind": "tickets_csv", "every": "hour", "incremental": True})
    first, body1 = await _run(api, db, settings, owner, org, s["id"])
    assert first["since"] is None and len(_versions(body1)) == 6  # the first run is complete

    async def patch(number: int, priority: str) -> None:
        r = await api.call("PATCH", org.path(f"/tickets/{number}"), org.member, json={"priority": priority})
        assert r.status_code == 200, r.text

    # A transaction that begins before run 2's snapshot and stays open across it (committed after run 2).
    held = await psycopg.AsyncConnection.connect(owner_url)
    try:
        await held.execute(
            "UPDATE tickets SET priority = 'urgent', updated_at = clock_timestamp() WHERE org_id = %s AND number = %s",
            (org.id, numbers[0]),
        )
        await patch(numbers[1], "high")  # committed before run 2
        gate = Gate({"counted"})
        async with background(_run(api, db, settings, owner, org, s["id"], gate), gate) as task:
            await gate.reached("counted")  # run 2's snapshot is taken
            await patch(numbers[2], "low")  # committed while run 2 reads
            await add_tickets(db, org.id, org.member, ["during"])
            gate.resume("counted")
            second, body2 = await asyncio.wait_for(task, 30)
        await held.commit()
    finally:
        await held.close()
    await patch(numbers[3], "high")  # after run 2
    third, body3 = await _run(api, db, settings, owner, org, s["id"])
    _fourth, body4 = await _run(api, db, settings, owner, org, s["id"])
    assert (second["since"], second["sinceExportId"]) == (first["snapshotAt"], first["id"])
    assert (third["since"], third["sinceExportId"]) == (second["snapshotAt"], second["id"])
    runs = [_versions(b) for b in (body1, body2, body3, body4)]
    assert {n for n, _ in runs[1]} == {str(numbers[1])}, runs[1]
    assert {n for n, _ in runs[2]} == {str(numbers[0]), str(numbers[2]), str(numbers[3]), str(numbers[-1] + 1)}, runs[2]
    assert runs[3] == []
    # Against the final state: every ticket's latest version is in the runs, and no version twice.
    seen = [v for run in runs for v in run]
    assert len(seen) == len(set(seen))
    cur = owner.execute(
        "SELECT number::text, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        " FROM tickets WHERE org_id = %s",
        (org.id,),
    )
    final = set(cur.fetchall())
    assert final <= set(seen), final - set(seen)
    latest: dict[str, str] = {}
    for n, v in seen:
        latest[n] = v
    assert set(latest.items()) == final


async def test_incremental_snapshot_lists_changes_and_deletions(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], owner_url: str
) -> None:
    org = await api.org()
    keep = await add_project(db, org.id, "keep", ["k1"])
    gone = await add_project(db, org.id, "gone", ["g1", "g2"])
    late = await add_project(db, org.id, "late", ["l1"])
    s = await _schedule(api, org, {"kind": "snapshot", "every": "day", "incremental": True})
    _, body1 = await _run(api, db, settings, owner, org, s["id"])
    doc1 = json.loads(body1)
    assert len(doc1["projects"]) == 3 and len(doc1["tasks"]) == 4 and "deleted" not in doc1
    tasks_of = {p: sorted(t["id"] for t in doc1["tasks"] if t["projectId"] == str(p)) for p in (gone, late)}
    # A deletion in a transaction that begins before run 2's snapshot and commits after run 2.
    held = await psycopg.AsyncConnection.connect(owner_url)
    try:
        await held.execute("UPDATE projects SET deleted_at = now() WHERE org_id = %s AND id = %s", (org.id, late))
        assert (await api.call("DELETE", org.path(f"/projects/{gone}"), org.owner)).status_code == 204
        new = await add_project(db, org.id, "new", ["n1"])
        second, body2 = await _run(api, db, settings, owner, org, s["id"])
        await held.commit()
    finally:
        await held.close()
    doc2 = json.loads(body2)
    assert [p["id"] for p in doc2["projects"]] == [str(new)]
    assert [t["title"] for t in doc2["tasks"]] == ["n1"]
    assert doc2["deleted"] == {"projects": [str(gone)], "tasks": tasks_of[gone]}
    assert str(keep) not in body2.decode() and str(late) not in body2.decode()
    third, body3 = await _run(api, db, settings, owner, org, s["id"])
    doc3 = json.loads(body3)
    assert (doc3["projects"], doc3["tasks"]) == ([], [])
    assert doc3["deleted"] == {"projects": [str(late)], "tasks": tasks_of[late]}
    assert (third["since"], third["sinceExportId"]) == (second["snapshotAt"], second["id"])


async def test_incremental_workbook_holds_only_the_changed_tickets(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    import io

    import openpyxl

    org = await api.org()
    numbers = await add_tickets(db, org.id, org.member, ["a", "b", "c"])
    s = await _schedule(api, org, {"kind": "tickets_xlsx", "every": "week", "incremental": True})
    _, book1 = await _run(api, db, settings, owner, org, s["id"])
    r = await api.call("PATCH", org.path(f"/tickets/{numbers[1]}"), org.member, json={"status": "solved"})
    assert r.status_code == 200, r.text
    second, book2 = await _run(api, db, settings, owner, org, s["id"])

    def rows(data: bytes) -> list[tuple[Any, ...]]:
        sheet = openpyxl.load_workbook(io.BytesIO(data), read_only=True)["Tickets"]
        return [tuple(row) for row in sheet.iter_rows(min_row=2, values_only=True)]

    assert [row[0] for row in rows(book1)] == numbers
    assert [(row[0], row[1], row[2]) for row in rows(book2)] == [(numbers[1], "b", "solved")]
    assert second["rowCount"] == 1 and second["sinceExportId"] is not None


@pytest.mark.slow
async def test_the_real_worker_makes_and_completes_a_due_run(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    """The cron as the worker registers it (every minute, on the export lane), then the run on the same worker."""
    import contextlib

    from space.worker import run_worker
    from tests.exports.fixtures import wait_for

    org = await api.org()
    s = await _schedule(api, org, {"kind": "snapshot", "every": "hour"})
    await _make_due(owner, s["id"])
    started = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, started=started))
    try:
        await asyncio.wait_for(started.wait(), 30)

        async def completed() -> list[Any] | None:
            runs = await _runs(db, org, s["id"])
            return runs if runs and runs[0][1] == "completed" else None

        # The cron ticks once a minute: the wait allows two ticks.
        runs = await wait_for(completed, "the schedule's run completed by the worker", within=150)
        assert len(runs) == 1
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, 30)


async def test_a_run_after_a_restore_is_complete(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    """A restored database is another database (another oid): the snapshots recorded before mean nothing there,
    so the next run holds everything again, and the one after it continues from that run (decision 0096)."""
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b"])
    s = await _schedule(api, org, {"kind": "tickets_csv", "every": "hour", "incremental": True})
    first, _ = await _run(api, db, settings, owner, org, s["id"])
    # What a pg_restore into a new database leaves: the recorded run names the database it was made in.
    owner.execute("UPDATE export_jobs SET xact_database = 1 WHERE id = %s", (first["id"],))
    second, body2 = await _run(api, db, settings, owner, org, s["id"])
    assert second["since"] is None and len(_versions(body2)) == 2
    third, body3 = await _run(api, db, settings, owner, org, s["id"])
    assert third["sinceExportId"] == second["id"] and _versions(body3) == []
