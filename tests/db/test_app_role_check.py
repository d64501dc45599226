"""Start-up refuses an app role that could see past RLS (SPEC §14), and a derived app URL connects as the app role."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql
from sqlalchemy import make_url

from space.app import create_app
from space.config import Settings
from space.db import APP_ROLE, QUEUE_ROLE, AppRoleError, app_url, queue_conninfo
from space.worker import run_worker
from tests.helpers import free_port, space_env

SPACE = str(Path(sys.executable).with_name("space"))


def _as_user(url: str, user: str) -> str:
    return make_url(url).set(username=user, password=None).render_as_string(hide_password=False)


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def _role(owner_url: str, kind: str) -> Iterator[str]:
    """A login role of `kind` (bypassrls | table_owner), unique on the cluster; dropped afterwards. Yields its URL."""
    name = f"space_chk_{uuid.uuid4().hex[:10]}"
    role = sql.Identifier(name)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        attributes = sql.SQL("BYPASSRLS" if kind == "bypassrls" else "NOBYPASSRLS")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER {}").format(role, attributes))
        if kind == "table_owner":
            # Its own schema, so the session's database gains nothing another test could trip over.
            conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(role, role))
            conn.execute(sql.SQL("CREATE TABLE {}.notes (id int)").format(role))
            conn.execute(sql.SQL("ALTER TABLE {}.notes OWNER TO {}").format(role, role))
        try:
            yield _as_user(owner_url, name)
        finally:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(role))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))


def _connecting_as(settings: Settings, url: str) -> Settings:
    return msgspec.structs.replace(settings, app_database_url=url)


CASES = {
    "superuser": "is a superuser",
    "bypassrls": "has BYPASSRLS",
    "table_owner": r"owns space_chk_\w+\.notes",
}


@contextlib.contextmanager
def _bad_role(owner_url: str, kind: str) -> Iterator[str]:
    if kind == "superuser":
        # The mistake a deployment makes: the migrating URL handed to the app as well.
        yield owner_url
        return
    with _role(owner_url, kind) as url:
        yield url


def _found(exc: BaseException) -> AppRoleError | None:
    if isinstance(exc, AppRoleError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((f for e in exc.exceptions if (f := _found(e)) is not None), None)
    return None


@pytest.mark.parametrize("kind", list(CASES))
async def test_api_refuses_to_start_as_a_role_that_sees_past_rls(settings: Settings, owner_url: str, kind: str) -> None:
    with _bad_role(owner_url, kind) as url:
        app = create_app(_connecting_as(settings, url))
        try:
            async with AsyncTestClient(app=app) as client:
                await client.get("/health")
        except BaseException as exc:  # the test client hands the lifespan's error over in an exception group
            failed = _found(exc)
        else:
            raise AssertionError("the app started")
    assert failed is not None
    message = str(failed)
    assert message.startswith("refusing to start: database role") and re.search(CASES[kind], message), message
    assert "NOBYPASSRLS" in message and "owns no table" in message


@pytest.mark.parametrize("kind", list(CASES))
async def test_worker_refuses_to_start_as_a_role_that_sees_past_rls(
    settings: Settings, owner_url: str, kind: str
) -> None:
    with _bad_role(owner_url, kind) as url, pytest.raises(AppRoleError, match=CASES[kind]):
        await run_worker(_connecting_as(settings, url))


async def test_the_app_role_itself_starts(settings: Settings) -> None:
    async with AsyncTestClient(app=create_app(settings)) as client:
        assert (await client.get("/health")).status_code == 200


def test_cli_prints_the_refusal(owner_url: str) -> None:
    # On a free port: the refusal must be the role check's, not a busy default port's.
    env = space_env(owner_url, SPACE_APP_DATABASE_URL=owner_url, SPACE_PORT=str(free_port()))
    for command in ("api", "worker"):
        out = subprocess.run([SPACE, command], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0, out
        assert "refusing to start" in out.stderr and "is a superuser" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr


def test_derived_urls_drop_credentials_given_as_query_parameters() -> None:
    owner = "postgresql://owner:secret@db.example:5432/space?user=postgres&password=hunter2&sslmode=require"
    for derived in (make_url(app_url(owner)), make_url(queue_conninfo(owner))):
        assert "user" not in derived.query and "password" not in derived.query, derived
        assert derived.password is None and derived.query["sslmode"] == "require"
    assert make_url(app_url(owner)).username == APP_ROLE
    assert make_url(queue_conninfo(owner)).username == QUEUE_ROLE


def test_a_user_query_parameter_does_not_make_the_app_connect_as_the_owner(owner_url: str) -> None:
    u = make_url(owner_url)
    owner = u.update_query_dict({"user": u.username or "postgres"}).render_as_string(hide_password=False)
    with psycopg.connect(owner) as conn:
        superuser = conn.execute("SELECT current_user, usesuper FROM pg_user WHERE usename = current_user").fetchone()
    assert superuser is not None and superuser[1], "the URL's query parameter connects as the superuser"
    with psycopg.connect(_libpq(app_url(owner))) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_ROLE,)
    with psycopg.connect(queue_conninfo(owner)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (QUEUE_ROLE,)
