"""The restore case (SPEC §23, §24; `python -m benchmarks.run --restore-only`): an org's complete archive restored
through the real API and a real `space worker`, beside PostgreSQL's own COPY FROM of the same rows, in one run.

For each size (the small org, then the large one): the archive is built by the worker and downloaded; the
baseline is COPY FROM STDIN of the same tickets (every column restore writes, text format, the org's own rows
read out first with COPY TO) into a scratch org, as the owner, timed alone; the restore is `POST /imports` of
the archive with `newIds=true` (the original is still there), polled until completed, timed by the database's
`created_at` -> `completed_at` (checking, writing and verifying; the upload is before it). Peak RSS of the
worker (VmHWM, reset before each restore) shows whether the importer's memory stays flat as the archive grows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from benchmarks.run import (
    TIMEOUT,
    Org,
    _ts,
    create_and_wait,
    download,
    log,
    peak_rss_mib,
    reset_peak_rss,
)

_COLUMNS = "org_id, id, number, title, body, status, priority, creator_id, assignee_id, created_at, updated_at"


def copy_from(url: str, org_id: str, tmp: Path) -> float:
    """Seconds of PostgreSQL's COPY FROM of the org's tickets into a scratch org (the rows read out first)."""
    scratch = uuid.uuid4()
    out = tmp / "tickets.copy"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO organizations (id, name, state) VALUES (%s, %s, 'active')", [scratch, "Scratch"])
        # The same members under the scratch org (memberships are keyed (org_id, id)), so each ticket's assignee
        # key (org_id, assignee_id) is checked by COPY as the restore's insert has it checked.
        conn.execute(
            "INSERT INTO memberships (org_id, id, user_id, role)"
            " SELECT %s, id, user_id, role FROM memberships WHERE org_id = %s",
            [scratch, org_id],
        )
        query = (
            f"COPY (SELECT '{scratch}'::uuid, gen_random_uuid(), number, title, body, status, priority, creator_id,"
            f" assignee_id, created_at, updated_at FROM tickets WHERE org_id = '{org_id}') TO STDOUT"
        )
        with conn.cursor() as cur, out.open("wb") as f, cur.copy(query) as copy:
            for data in copy:
                f.write(data)
        started = time.perf_counter()
        with conn.cursor() as cur, out.open("rb") as f, cur.copy(f"COPY tickets ({_COLUMNS}) FROM STDIN") as copy:
            while piece := f.read(1024 * 1024):
                copy.write(piece)
        seconds = time.perf_counter() - started
    out.unlink()
    return seconds


async def restore_case(
    client: httpx.AsyncClient, url: str, org: Org, tickets: int, worker: Any, tmp: Path
) -> dict[str, Any]:
    """One size: the archive, the COPY FROM baseline, then the restore; the case's line."""
    status, _ = await create_and_wait(client, org, "owner", "archive", poll=1.0)
    archive = tmp / "archive.zip"
    await download(client, org, "owner", status["id"], archive)
    log(f"restore_{tickets}: COPY FROM of {tickets} tickets ...")
    copy_seconds = copy_from(url, org.id, tmp)
    log(f"restore_{tickets}: restoring {archive.stat().st_size} bytes ...")
    auth = {"Authorization": f"Bearer {org.people['owner']}", "content-type": "application/zip"}
    reset_peak_rss(worker)

    async def body() -> Any:
        with archive.open("rb") as f:
            while piece := f.read(1024 * 1024):
                yield piece

    r = await client.post(f"/imports?name=Restored{tickets}&newIds=true", content=body(), headers=auth)
    r.raise_for_status()
    import_id = r.json()["id"]
    deadline = time.monotonic() + TIMEOUT
    while True:
        done = (await client.get(f"/imports/{import_id}", headers=auth)).json()
        if done["state"] in ("completed", "failed"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"import not finished: {done}")
        await asyncio.sleep(1.0)
    if done["state"] != "completed":
        raise RuntimeError(f"import failed: {done['errorCode']}: {done['errorDetail']}")
    seconds = _ts(done["completedAt"]) - _ts(done["createdAt"])
    archive.unlink()
    return {
        "case": f"restore_{tickets}",
        "tickets": tickets,
        "archive_bytes": status["byteSize"],
        "copy_from_seconds": round(copy_seconds, 3),
        "restore_seconds": round(seconds, 3),
        "ratio": round(seconds / copy_seconds, 2),
        "verified": done["report"]["verified"],
        "worker_peak_rss_mib": round(peak_rss_mib(worker), 1),
    }
