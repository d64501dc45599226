"""The test database: a real PostgreSQL, the real migrations, the code under test connected as the app role."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql

from space.app import create_app
from space.config import Settings, load_settings
from space.db import Database, UnitOfWork, app_url
from space.db.migrate import upgrade
from space.embedded import embedded_server
from tests.helpers import Api, UserFactory


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
    with _server() as server_url:
        name = f"space_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        base = psycopg.conninfo.conninfo_to_dict(server_url)
        url = _with_dbname(server_url, name)
        upgrade(url)
        try:
            yield url
        finally:
            with psycopg.connect(psycopg.conninfo.make_conninfo(**{**base}), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _with_dbname(url: str, name: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def settings(owner_url: str) -> Settings:
    """Settings for the code under test, with small limits so tests can reach them."""
    return load_settings({}, database_url=owner_url)


@pytest.fixture(scope="session")
async def db(settings: Settings) -> AsyncIterator[Database]:
    """The app role's engine, for fixtures and direct service calls."""
    assert settings.database_url
    database = Database(app_url(settings.database_url), application_name="space-tests")
    yield database
    await database.dispose()


@pytest.fixture(scope="session")
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """An HTTP client against the real app (lifespan included)."""
    async with AsyncTestClient(app=create_app(settings)) as c:
        yield c


@pytest.fixture(scope="session")
def users(db: Database) -> UserFactory:
    """Makes users with tokens, as the app role does."""
    return UserFactory(db)


@pytest.fixture
def api(client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """A thin helper to call the API as a given user."""
    return Api(client, users)


async def open_uow(db: Database) -> UnitOfWork:
    """A unit of work with no tenant context."""
    return UnitOfWork(db.sessionmaker)
