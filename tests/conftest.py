"""The test database: a real PostgreSQL, the real migrations, the code under test connected as the app role."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings, load_settings
from space.db import Database
from space.embedded import embedded_server
from tests.exports.s3_fixtures import s3_server  # noqa: F401 (the session's S3 server, for every test that asks)
from tests.helpers import Api, OrgFactory, UserFactory, app_database, fresh_database


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first, every module's tests in their own order: the two workers take whole files
    (`--dist loadfile`), so a long file collected late runs alone at the end while the other worker idles; first,
    the short ones fill in beside it."""
    slow = {item.nodeid.partition("::")[0] for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.nodeid.partition("::")[0] not in slow)


@contextlib.contextmanager
def _server() -> Iterator[str]:
    url = os.environ.get("SPACE_TEST_DATABASE_URL")
    if url:
        yield url
        return
    with (
        tempfile.TemporaryDirectory(prefix="space-test-pg-") as tmp,
        embedded_server(Path(tmp), "postgres") as u,
    ):
        yield u


@pytest.fixture(scope="session")
def owner_url() -> Iterator[str]:
    """A fresh database on the test server, migrated to head; dropped at the end."""
    with _server() as server_url, fresh_database(server_url, "space_test") as url:
        yield url


@pytest.fixture
def owner(owner_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An owner connection (autocommit): catalogue queries, and rows read or written across orgs, bypassing RLS
    as the app role never can."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def settings(owner_url: str) -> Settings:
    """The default settings (no environment read) on the test database. Tests rely on these defaults (the
    7-day grace period, the export limits); one that needs other values derives them (`tuned`, `settings0`)."""
    return load_settings({}, database_url=owner_url)


@pytest.fixture(scope="session")
async def db(owner_url: str) -> AsyncIterator[Database]:
    """The app role's engine, for fixtures and direct service calls."""
    async with app_database(owner_url, "space-tests") as database:
        yield database


@pytest.fixture(scope="session")
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """An HTTP client against the real app (lifespan included)."""
    async with AsyncTestClient(app=create_app(settings)) as c:
        yield c


@pytest.fixture(scope="session")
def users(db: Database) -> UserFactory:
    """Makes users with tokens, as the app role does."""
    return UserFactory(db)


@pytest.fixture(scope="session")
def orgs(db: Database) -> OrgFactory:
    """Makes orgs with one user per role by direct insert (for tests not about the member routes; those use
    `api.org`, which goes through them)."""
    return OrgFactory(db)


@pytest.fixture(scope="session")
def api(client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """A thin helper to call the API as a given user (it holds no state: one for the session, so module-scoped
    fixtures can use it too)."""
    return Api(client, users)


# --- an app with no deletion grace period (the org lifecycle, the purge, exports in each org state) -----------


@pytest.fixture(scope="module")
def settings0(owner_url: str) -> Settings:
    """Settings with no grace period: a deletion request is due at once."""
    return load_settings({}, database_url=owner_url, deletion_grace_seconds=0)


@pytest.fixture(scope="module")
async def client0(settings0: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app built with settings0."""
    async with AsyncTestClient(app=create_app(settings0)) as c:
        yield c


@pytest.fixture
def api0(client0: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the no-grace app."""
    return Api(client0, users)
