"""Test helpers: test databases and engines, users with tokens, an API caller, org set-up through the API or
directly (`OrgFactory`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx
import psycopg
from httpx import Response
from litestar.testing import AsyncTestClient
from litestar.testing.transport import TestClientTransport
from psycopg import sql
from sqlalchemy import func, make_url

from space.auth import service as auth
from space.db import Database, Tenant, UnitOfWork, app_url
from space.db.migrate import upgrade
from space.orgs.models import Membership, Organization, OrgState, Role
from space.tickets.models import TicketCounter


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def space_env(database_url: str, **settings: str) -> dict[str, str]:
    """The environment of a Space process on `database_url`: this one's minus every SPACE_* variable (and its
    DATABASE_URL), plus `settings` (SPACE_* names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_") and k != "DATABASE_URL"}
    env.update(settings, DATABASE_URL=database_url)
    return env


async def spawn_worker(
    database_url: str, *, stderr: int = asyncio.subprocess.DEVNULL, **settings: str
) -> asyncio.subprocess.Process:
    """A real `space worker` process in `space_env(database_url, **settings)`. Whoever spawns it stops it."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from space.cli import main; main()",
        "worker",
        env=space_env(database_url, **settings),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=stderr,
    )


def redis_reachable(url: str) -> bool:
    """Whether something accepts connections at the Redis URL's host and port (within a second)."""
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def fresh_database(
    server_url: str, prefix: str, *, migrate: bool = True, revision: str = "head", owner: str | None = None
) -> Iterator[str]:
    """A new database `<prefix>_<random>` on the server of `server_url` (a URL of any database there, used to
    connect), migrated to `revision` unless `migrate` is false; dropped WITH (FORCE) on exit. Yields its owner
    URL: the server URL's user, or `owner` (an existing role without password that then owns the database and
    runs the migrations).

    The one way the tests make a database: the session's test database, the fault tests' second one, the
    migrations round trip's empty one, the backup's restore target, the ordinary owner's and the search's.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if owner is not None:
            create = sql.SQL("{} OWNER {}").format(create, sql.Identifier(owner))
        conn.execute(create)
    try:
        url = make_url(server_url).set(database=name)
        if owner is not None:
            url = url.set(username=owner, password=None)
        url_text = url.render_as_string(hide_password=False)
        if migrate:
            upgrade(url_text, revision)
        yield url_text
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.asynccontextmanager
async def app_database(owner_url: str, application_name: str, **options: Any) -> AsyncIterator[Database]:
    """The app role's engine on the database of `owner_url`, its connections tagged `application_name` (as
    pg_stat_activity shows them); `options` go to Database (pool_size). Disposed on exit."""
    database = Database(app_url(owner_url), application_name=application_name, **options)
    try:
        yield database
    finally:
        await database.dispose()


@dataclass(frozen=True)
class TestUser:
    """A user and a working token."""

    id: uuid.UUID
    email: str
    name: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """Authorization header for this user."""
        return {"Authorization": f"Bearer {self.token}"}


class UserFactory:
    """Creates users through the real service, as the app role."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def make(self, name: str = "user") -> TestUser:
        """A new user with a fresh token."""
        email = f"{name}-{uuid.uuid4().hex[:8]}@example.test"
        async with UnitOfWork(self.db.sessionmaker) as uow:
            user = await auth.create_user(uow.session, email, name)
            token = await auth.issue_token(uow.session, user.id)
        return TestUser(user.id, user.email, user.name, token)


@dataclass
class Org:
    """An org made through the API, with one user per role."""

    id: str
    owner: TestUser
    admin: TestUser
    member: TestUser
    customer: TestUser
    customer2: TestUser
    memberships: dict[str, str]

    def path(self, suffix: str = "") -> str:
        """/orgs/{id}{suffix}."""
        return f"/orgs/{self.id}{suffix}"


class Api:
    """Calls the API as a user and checks problem bodies."""

    def __init__(self, client: AsyncTestClient, users: UserFactory) -> None:  # type: ignore[type-arg]
        self.client = client
        self.users = users

    async def call(self, method: str, path: str, user: TestUser | None = None, **kw: Any) -> Response:
        """Send a request, authenticated as `user` when given."""
        headers = dict(kw.pop("headers", {}) or {})
        if user is not None:
            headers.update(user.headers)
        return await self.client.request(method, path, headers=headers, **kw)

    async def concurrently(self, calls: list[tuple[str, str, TestUser, Any]]) -> list[Response]:
        """Send (method, path, user, json) requests at the same time.

        The AsyncTestClient runs one request to completion per call, so asyncio.gather over it never
        overlaps; a sync client per worker thread puts all of them on the app's event loop at once.
        """
        transport = TestClientTransport(self.client)  # type: ignore[arg-type]
        with (
            httpx.Client(transport=_SyncTransport(transport), base_url=self.client.base_url) as client,
            ThreadPoolExecutor(max_workers=len(calls)) as pool,
        ):
            loop = asyncio.get_running_loop()

            def send(method: str, path: str, user: TestUser, body: Any) -> Response:
                return client.request(method, path, headers=user.headers, json=body)

            return list(await asyncio.gather(*(loop.run_in_executor(pool, send, *c) for c in calls)))

    async def org(self, name: str = "Acme") -> Org:
        """An org with owner, admin, member and two customers."""
        owner = await self.users.make("owner")
        r = await self.call("POST", "/orgs", owner, json={"name": name})
        assert r.status_code == 201, r.text
        org_id = r.json()["id"]
        people = {"owner": owner}
        memberships: dict[str, str] = {}
        for role, key in [
            ("admin", "admin"),
            ("member", "member"),
            ("customer", "customer"),
            ("customer", "customer2"),
        ]:
            u = await self.users.make(key)
            r = await self.call("POST", f"/orgs/{org_id}/members", owner, json={"email": u.email, "role": role})
            assert r.status_code == 201, r.text
            people[key] = u
            memberships[key] = r.json()["id"]
        r = await self.call("GET", f"/orgs/{org_id}/members", owner)
        memberships["owner"] = next(m["id"] for m in r.json()["items"] if m["role"] == "owner")
        return Org(org_id, memberships=memberships, **people)  # type: ignore[arg-type]


ORG_PEOPLE: tuple[tuple[str, Role], ...] = (
    ("owner", Role.owner),
    ("admin", Role.admin),
    ("member", Role.member),
    ("customer", Role.customer),
    ("customer2", Role.customer),
)
"""Who an `Org` holds (its field names) and their roles, in the order `Api.org` adds them."""


class OrgFactory:
    """Inserts an org, its five people and their memberships directly, for tests that are not about the member
    routes: what `Api.org` leaves behind, in one transaction of the app role and without its member.added audit
    rows.

    Written as POST /orgs writes it (orgs.service.create_org): under the new org's tenant context with the owner
    as the tenant's user, so RLS checks every row (WITH CHECK on organizations), `created_by` is the owner (the
    org counts against their SPACE_ORGS_PER_USER), and the org's ticket counter exists. Memberships get
    increasing created_at (clock_timestamp) so the member list keeps Api.org's order: owner, admin, member,
    customer, customer2.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def make(self, name: str = "Acme", *, owner: TestUser | None = None) -> Org:
        """An org named `name` with owner (`owner`, or a new user), admin, member and two customers."""
        org_id = uuid.uuid4()
        people: dict[str, TestUser] = {}
        memberships: dict[str, str] = {}
        async with UnitOfWork(self.db.sessionmaker) as uow:
            session = uow.session
            for key, _ in ORG_PEOPLE:
                if key == "owner" and owner is not None:
                    people[key] = owner
                    continue
                email = f"{key}-{uuid.uuid4().hex[:8]}@example.test"
                user = await auth.create_user(session, email, key)
                people[key] = TestUser(user.id, user.email, user.name, await auth.issue_token(session, user.id))
            await uow.retenant(Tenant(org_id=org_id, user_id=people["owner"].id))
            session.add(
                Organization(id=org_id, name=name.strip(), state=OrgState.active.value, created_by=people["owner"].id)
            )
            await session.flush()
            for key, role in ORG_PEOPLE:
                membership_id = uuid.uuid4()
                session.add(
                    Membership(
                        id=membership_id,
                        org_id=org_id,
                        user_id=people[key].id,
                        role=role.value,
                        created_at=func.clock_timestamp(),
                    )
                )
                # One flush each: clock_timestamp() is read per INSERT, so their order is the list's.
                await session.flush()
                memberships[key] = str(membership_id)
            session.add(TicketCounter(org_id=org_id, last_number=0))
        return Org(str(org_id), memberships=memberships, **people)  # type: ignore[arg-type]


class _SyncTransport(httpx.BaseTransport):
    """Litestar's test transport (it hands each request to the app's portal loop) as a sync httpx transport."""

    def __init__(self, inner: TestClientTransport) -> None:  # type: ignore[type-arg]
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._inner.handle_request(request)


def assert_problem(r: Response, status: int, code: str) -> dict[str, Any]:
    """The response is problem+json with this status and code; returns the body."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status and body["title"] and body["detail"], body
    return body
