"""Fault injection with real `space worker` processes and a real `space api` process (SPEC §5 step 8).

Each test prints one `OBSERVED` line (see them with `pytest -m faults -rP`) and asserts on the same numbers.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from space.db import Database
from tests.exports.fixtures import create_export, download
from tests.faults.procs import (
    FAULT_SETTINGS,
    ROWS,
    SCENARIO_SECONDS,
    MidRead,
    Owner,
    Procs,
    observed,
    published_csv,
    run_cleanup,
    seeded,
)
from tests.helpers import Api, assert_problem

pytestmark = pytest.mark.faults

RETRIES = int(FAULT_SETTINGS["SPACE_EXPORT_RETRIES"])


async def test_sigkill_mid_export_another_worker_completes_it_once(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, markers = await seeded(fapi, faults_db, "kill")
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    eid = export["id"]
    async with MidRead(owner, org.id, eid) as pause:
        await pause.arm()
        a = await procs.worker("worker-a")
        held = await pause.engage()
        a.send(signal.SIGKILL)
        assert await a.wait() == -signal.SIGKILL
    killed = await owner.export(eid)
    assert (killed["state"], killed["attempt"], str(killed["execution_id"])) == ("running", 1, held.execution_id)
    assert 1 <= killed["progress"] < 95 and killed["sha256"] is None
    chunks_killed = await owner.chunks(eid)
    assert chunks_killed == {held.execution_id: held.chunks}

    b = await procs.worker("worker-b")
    done = await owner.finished(eid)
    assert done["state"] == "completed", (done, procs.logs())
    assert done["attempt"] == 2 and str(done["execution_id"]) != held.execution_id
    assert done["row_count"] == ROWS and done["progress"] == 100
    published = str(done["execution_id"])
    chunks_before = await owner.chunks(eid)
    assert chunks_before.get(held.execution_id, 0) in (0, held.chunks)  # the cleanup cron may have run already
    swept = await run_cleanup(faults_db)
    chunks_after = await owner.chunks(eid)
    assert list(chunks_after) == [published], chunks_after
    body = await published_csv(fapi, org, eid, done, markers)

    # A clean run over the same data gives the same bytes.
    clean = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    clean_row = await owner.finished(clean["id"])
    assert clean_row["state"] == "completed" and clean_row["attempt"] == 1, clean_row
    assert await published_csv(fapi, org, clean["id"], clean_row, markers) == body
    assert clean_row["sha256"] == done["sha256"]
    assert b.alive
    observed(
        "sigkill",
        killed_at_progress=killed["progress"],
        killed_attempt=killed["attempt"],
        killed_chunks=held.chunks,
        chunks_before_cleanup=chunks_before,
        cleanup=swept,
        chunks_after_cleanup=chunks_after,
        final_attempt=done["attempt"],
        rows=done["row_count"],
        bytes=done["byte_size"],
        same_bytes_as_clean_run=True,
        queue=await owner.queue_entries(eid),
    )


async def test_read_connection_terminated_mid_read_retries_and_completes(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, markers = await seeded(fapi, faults_db, "terminate")
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    eid = export["id"]
    async with MidRead(owner, org.id, eid) as pause:
        await pause.arm()
        worker = await procs.worker("worker")
        held = await pause.engage()
        assert await owner.terminate(held.read_pid)
        await pause.release()
        done = await owner.finished(eid)
    assert done["state"] == "completed", (done, procs.logs())
    assert done["attempt"] == 2 and str(done["execution_id"]) != held.execution_id
    assert done["row_count"] == ROWS
    chunks_before = await owner.chunks(eid)
    swept = await run_cleanup(faults_db)
    chunks_after = await owner.chunks(eid)
    assert list(chunks_after) == [str(done["execution_id"])]
    await published_csv(fapi, org, eid, done, markers)
    assert worker.alive  # the same worker retried it
    observed(
        "pg_terminate_backend",
        terminated_read_pid=held.read_pid,
        at_progress=held.progress,
        first_attempt_chunks=held.chunks,
        chunks_before_cleanup=chunks_before,
        cleanup=swept,
        chunks_after_cleanup=chunks_after,
        final_attempt=done["attempt"],
        rows=done["row_count"],
        queue=await owner.queue_entries(eid),
    )


@pytest.mark.timeout(SCENARIO_SECONDS)
async def test_sigterm_mid_export_stops_taking_jobs_and_the_export_completes_once(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, markers = await seeded(fapi, faults_db, "term")
    # Another org's export: one of this org's would wait in the ledger, not the queue, while the first runs.
    other = await fapi.org("term-other")
    first = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    async with MidRead(owner, org.id, first["id"]) as pause:
        await pause.arm()
        # One job at a time: while the first export runs, the second one waits in the queue.
        a = await procs.worker("worker-a", SPACE_WORKER_CONCURRENCY="1")
        held = await pause.engage()
        second = await create_export(fapi, other, other.owner, {"kind": "snapshot"})
        assert [e["status"] for e in await owner.queue_entries(second["id"])] == ["queued"]
        a.send(signal.SIGTERM)
        # Let the held chunk through: the run is cancelled at its next step (or already was), and gives
        # the export back.
        await pause.release()
        assert await a.wait() == 0, a.log()
    after_a = await owner.export(first["id"])
    untouched = await owner.export(second["id"])
    # A stopped taking jobs: the second export was never claimed.
    assert (untouched["state"], untouched["attempt"], untouched["execution_id"]) == ("queued", 0, None)
    # ...and it gave the first one back instead of leaving it to its lease.
    assert (after_a["state"], after_a["attempt"], after_a["lease_expires_at"]) == ("queued", 1, None), after_a
    chunks_a = await owner.chunks(first["id"])

    b = await procs.worker("worker-b")
    done = await owner.finished(first["id"])
    done_second = await owner.finished(second["id"])
    assert done["state"] == "completed" and done_second["state"] == "completed", (done, done_second, procs.logs())
    assert done["attempt"] == 2 and str(done["execution_id"]) != held.execution_id
    assert done_second["attempt"] == 1
    swept = await run_cleanup(faults_db)
    chunks_after = await owner.chunks(first["id"])
    assert list(chunks_after) == [str(done["execution_id"])]
    await published_csv(fapi, org, first["id"], done, markers)
    assert b.alive
    observed(
        "sigterm",
        held_at_progress=held.progress,
        first_after_exit={k: after_a[k] for k in ("state", "attempt", "lease_expires_at")},
        second_after_exit={k: untouched[k] for k in ("state", "attempt")},
        chunks_of_stopped_run=chunks_a,
        cleanup=swept,
        chunks_after_cleanup=chunks_after,
        final_attempts=[done["attempt"], done_second["attempt"]],
        rows=done["row_count"],
    )


async def test_lost_queue_entries_are_reconciled_and_complete(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, markers = await seeded(fapi, faults_db, "lost", rows=50)
    queued = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    stranded = await create_export(fapi, org, org.owner, {"kind": "snapshot"})
    # The second one looks like a run whose worker died and whose queue entry vanished with it.
    await owner.fetch(
        "UPDATE export_jobs SET state = 'running', attempt = 1, execution_id = gen_random_uuid(),"
        " started_at = now(), lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
        stranded["id"],
    )
    for eid in (queued["id"], stranded["id"]):
        await owner.fetch("DELETE FROM saq.saq_jobs WHERE key = %s", eid)
        assert await owner.queue_entries(eid) == []
    await procs.worker("worker")
    done = await owner.finished(queued["id"])
    done_stranded = await owner.finished(stranded["id"])
    assert done["state"] == "completed" and done["attempt"] == 1, (done, procs.logs())
    assert done_stranded["state"] == "completed" and done_stranded["attempt"] == 2, done_stranded
    await published_csv(fapi, org, queued["id"], done, markers)
    entries = {eid: await owner.queue_entries(eid) for eid in (queued["id"], stranded["id"])}
    assert all([e["status"] for e in v] == ["complete"] for v in entries.values()), entries
    observed(
        "lost_queue_entry",
        queue_entries_before=0,
        queue_entries_after=entries,
        attempts={"queued": done["attempt"], "stranded_running": done_stranded["attempt"]},
        rows=done["row_count"],
    )


async def test_retries_run_out_the_export_fails_with_a_stable_code(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, _ = await seeded(fapi, faults_db, "broken", rows=30)
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv", "filters": {"status": "open"}})
    eid = export["id"]
    # A ledger row the read can never use: its stored filters no longer parse. Every attempt fails the same way.
    await owner.fetch('UPDATE export_jobs SET filters = \'{"status": "reopened"}\' WHERE id = %s', eid)
    await procs.worker("worker")
    done = await owner.finished(eid)
    assert (done["state"], done["error_code"]) == ("failed", "internal_error"), (done, procs.logs())
    assert done["attempt"] == RETRIES
    assert done["sha256"] is None and done["expires_at"] is None and done["lease_expires_at"] is None
    assert await owner.chunks(eid) == {}
    body = assert_problem(await download(fapi, org, org.member, eid), 409, "export_failed")
    assert body["errorCode"] == "internal_error"
    queue = await owner.queue_entries(eid)
    assert [(e["status"], e["attempts"]) for e in queue] == [("complete", RETRIES)]
    observed(
        "retries_exhausted",
        attempts=done["attempt"],
        setting=RETRIES,
        error_code=done["error_code"],
        queue=queue,
        chunks=0,
    )


@pytest.mark.timeout(SCENARIO_SECONDS)
async def test_a_worker_killed_on_every_attempt_ends_worker_lost(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, _ = await seeded(fapi, faults_db, "crashloop")
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    eid = export["id"]
    killed: list[dict[str, Any]] = []
    for attempt in range(1, RETRIES + 1):
        async with MidRead(owner, org.id, eid) as pause:
            await pause.arm()
            worker = await procs.worker(f"worker-{attempt}")
            held = await pause.engage()
            assert held.attempt == attempt, (held, procs.logs())
            worker.send(signal.SIGKILL)
            await worker.wait()
        killed.append({"attempt": held.attempt, "progress": held.progress, "chunks": held.chunks})
    last = await procs.worker("worker-last")
    done = await owner.finished(eid)
    assert (done["state"], done["error_code"], done["attempt"]) == ("failed", "worker_lost", RETRIES), done
    assert done["sha256"] is None and done["lease_expires_at"] is None
    chunks_before = await owner.chunks(eid)
    swept = await run_cleanup(faults_db)
    assert await owner.chunks(eid) == {}
    body = assert_problem(await download(fapi, org, org.member, eid), 409, "export_failed")
    assert body["errorCode"] == "worker_lost"
    assert last.alive
    observed(
        "killed_on_every_attempt",
        kills=killed,
        final={k: done[k] for k in ("state", "error_code", "attempt")},
        setting=RETRIES,
        chunks_before_cleanup=chunks_before,
        cleanup=swept,
        chunks_after_cleanup={},
        queue=await owner.queue_entries(eid),
    )


async def test_a_read_timeout_is_final_not_retried(fapi: Api, faults_db: Database, owner: Owner, procs: Procs) -> None:
    org, _ = await seeded(fapi, faults_db, "slow", rows=2000)
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    await procs.worker("worker", SPACE_EXPORT_TIMEOUT_SECONDS="0.001")
    done = await owner.finished(export["id"])
    assert (done["state"], done["error_code"], done["attempt"]) == ("failed", "timeout", 1), (done, procs.logs())
    assert await owner.chunks(export["id"]) == {}
    observed("read_timeout", attempts=done["attempt"], error_code=done["error_code"], rows_in_org=2000)
