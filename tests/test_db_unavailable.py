"""A database with no connection to spare answers 503 `unavailable` with Retry-After, never 500 (SPEC §25, issue 29).

Three real situations, each against the real app: every connection of its pool held (with a short pool timeout),
the server refusing the role more connections ("too many connections for role"), and the server's port closed
(connection refused). Each recovers once the connections are there again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from space.app import create_app
from space.config import Settings
from space.db import APP_ROLE
from tests.exports.fixtures import tuned, wait_for
from tests.helpers import TestUser as Caller
from tests.helpers import UserFactory, assert_problem

WAIT = 15.0
POOL_CONNECTIONS = 20
"""What the app's pool holds at most: pool_size 10 plus max_overflow 10 (space.db.Database)."""
READS_CONNECTIONS = 10
"""What the app's reads of one trip hold at most: pool_size (space.db.Database.reads)."""


def _assert_unavailable(r: Any) -> None:
    body = assert_problem(r, 503, "unavailable")
    assert r.headers["retry-after"] == "5", r.headers
    assert "try again" in body["detail"], body


async def _me(client: AsyncTestClient, user: Caller) -> Any:  # type: ignore[type-arg]
    return await client.get("/me", headers=user.headers)


# --- every pooled connection busy -----------------------------------------------------------------------------


async def test_a_pool_with_no_connection_to_spare_answers_503(settings: Settings, users: UserFactory) -> None:
    user = await users.make("pool")
    async with AsyncTestClient(app=create_app(tuned(settings, api_pool_timeout_seconds=0.2))) as client:
        assert (await _me(client, user)).status_code == 200
        engine = client.app.state.db.engine
        held: list[AsyncConnection] = []
        try:
            # Held as long-running requests would hold them: every connection the pool may open, checked out. On a
            # busy shared server the server may run out of slots first: the app has no connection to spare either way.
            for _ in range(POOL_CONNECTIONS):
                try:
                    held.append(await engine.connect())
                except OperationalError:
                    break
            _assert_unavailable(await _me(client, user))
            # An authenticated route's own transaction, past the middleware, too.
            _assert_unavailable(await client.get("/orgs", headers=user.headers))
        finally:
            for conn in held:
                await conn.close()
        assert (await _me(client, user)).status_code == 200


async def test_reads_of_one_trip_with_no_connection_to_spare_answer_503(settings: Settings, users: UserFactory) -> None:
    """The status GET's authorization runs on `db.reads`, a pool of its own (decision 0105): it too answers 503."""
    user = await users.make("reads")
    status = f"/orgs/{uuid.uuid4()}/exports/{uuid.uuid4()}"  # authorized in the trip before anything is looked up
    async with AsyncTestClient(app=create_app(tuned(settings, api_pool_timeout_seconds=0.2))) as client:
        assert (await client.get(status, headers=user.headers)).status_code == 404
        reads = client.app.state.db.reads
        async with contextlib.AsyncExitStack() as held:
            for _ in range(READS_CONNECTIONS):
                await held.enter_async_context(reads.connection())
            _assert_unavailable(await client.get(status, headers=user.headers))
        assert (await client.get(status, headers=user.headers)).status_code == 404


# --- the server refuses more connections of the role ----------------------------------------------------------


@contextlib.contextmanager
def limited_role(owner_url: str, limit: int) -> Iterator[str]:
    """A login role that acts as the app role (a member of it, so its grants and policies) with `limit`
    connections at most; yields its URL on the test database. Dropped at the end."""
    name = f"space_app_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS CONNECTION LIMIT {} IN ROLE {}").format(
                sql.Identifier(name), sql.Literal(limit), sql.Identifier(APP_ROLE)
            )
        )
    try:
        yield make_url(owner_url).set(username=name, password=None).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            _terminate(conn, name)
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _terminate(owner: psycopg.Connection[Any], role: str) -> int:
    """End every backend of `role`, waiting (up to 10 s each) until it is gone; how many."""
    rows = owner.execute(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = %s", (role,)
    ).fetchall()
    assert all(ok for (ok,) in rows), rows
    return len(rows)


async def test_too_many_connections_for_the_role_answers_503(
    owner_url: str, settings: Settings, users: UserFactory
) -> None:
    user = await users.make("slots")
    limit = 2
    with limited_role(owner_url, limit) as url:
        role = make_url(url).username
        assert role is not None
        async with AsyncTestClient(app=create_app(tuned(settings, app_database_url=url))) as client:
            assert (await _me(client, user)).status_code == 200
            with psycopg.connect(owner_url, autocommit=True) as owner:
                # The app's connections end (as a restarted server or a pooler would end them); then something
                # else takes every slot the role has, before the app can reconnect.
                assert _terminate(owner, role) >= 1
                others = [await psycopg.AsyncConnection.connect(url) for _ in range(limit)]
                try:
                    with pytest.raises(psycopg.OperationalError, match="too many connections"):
                        await psycopg.AsyncConnection.connect(url)
                    _assert_unavailable(await _me(client, user))
                    _assert_unavailable(await client.get("/orgs", headers=user.headers))
                finally:
                    for conn in others:
                        await conn.close()

                # A closed connection's backend leaves a moment after its client: the role's slots are free again
                # once the server no longer counts them (else the next connect races their exit).
                async def slots_free() -> bool:
                    row = owner.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)).fetchone()
                    return row is not None and int(row[0]) < limit

                await wait_for(slots_free, "the other connections' backends to exit")
            assert (await _me(client, user)).status_code == 200


# --- the server's port closed ---------------------------------------------------------------------------------


class Relay:
    """A TCP relay on 127.0.0.1 to the database server, in a thread and event loop of its own (the test client
    starts the app from the test's loop, blocking it): closing it closes its port (new connections are refused)
    and every connection through it; opening it again listens on the same port."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        """The server: (host, port), or the path of its Unix socket."""
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="db-relay", daemon=True)
        self.thread.start()

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def open(self) -> None:
        """Listen (on the port of the first opening, ever after)."""
        self._run(self._open())

    def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        self._run(self._close())

    def stop(self) -> None:
        """Close, and end the relay's thread."""
        if self.server is not None and self.server.is_serving():
            self.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    async def _open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if isinstance(self.target, str):
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        else:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self.writers.discard(w)
                w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        # One side ended: so does the other.
        writer.transport.abort()


@contextlib.contextmanager
def relay_to(owner_url: str) -> Iterator[Relay]:
    """A relay to the test database's server, open until the block ends."""
    u = make_url(owner_url)
    folder = u.query.get("host")
    if isinstance(folder, str) and folder.startswith("/"):
        # The embedded server listens on a Unix socket only (the suite's server when SPACE_TEST_DATABASE_URL is unset).
        relay = Relay(f"{folder}/.s.PGSQL.{u.port or u.query.get('port') or 5432}")
    else:
        relay = Relay((u.host or "127.0.0.1", u.port or 5432))
    try:
        relay.open()
        yield relay
    finally:
        relay.stop()


async def test_a_closed_database_port_answers_503(owner_url: str, settings: Settings, users: UserFactory) -> None:
    user = await users.make("refused")
    with relay_to(owner_url) as relay:
        url = (
            make_url(owner_url)
            .difference_update_query(["host", "port"])
            .set(username=APP_ROLE, password=None, host="127.0.0.1", port=relay.port)
        )
        app_url = url.render_as_string(hide_password=False)
        async with AsyncTestClient(app=create_app(tuned(settings, app_database_url=app_url))) as client:
            assert (await _me(client, user)).status_code == 200
            relay.close()
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", relay.port)
            _assert_unavailable(await _me(client, user))
            _assert_unavailable(await client.get("/orgs", headers=user.headers))
            relay.open()
            assert (await _me(client, user)).status_code == 200
