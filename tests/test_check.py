"""`space check` against real deployments: green on a fresh migrated database, red naming the fix otherwise.

Roles are cluster-wide and other suites share this server, so no test here alters `space_app` (or any role
another test may use). Each deployment gets its own database and its own app role, `space_chk_<hex>`, a
member of `space_app` (it inherits exactly the grants the migrations gave) named by SPACE_APP_DATABASE_URL,
the way production names its app role. The BYPASSRLS test alters only that role; every change is undone in
`finally`, and the role and database are dropped at the end.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import make_url

from space.db.migrate import alembic_config
from tests.helpers import fresh_database

SPACE = str(Path(sys.executable).with_name("space"))


@dataclass(frozen=True)
class Deployment:
    owner_url: str
    app_url: str
    role: str

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_") and k != "DATABASE_URL"}
        return {**env, "DATABASE_URL": self.owner_url, "SPACE_APP_DATABASE_URL": self.app_url}

    def owner(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.owner_url, autocommit=True)


@contextlib.contextmanager
def _deployment(owner_url: str, revision: str | None = "head") -> Iterator[Deployment]:
    """A fresh database migrated to `revision` (None: not at all), with its own app role; both dropped after."""
    role = f"space_chk_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN INHERIT NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(role)))
    try:
        with fresh_database(
            owner_url, "space_chk", migrate=revision is not None, revision=revision or "head"
        ) as database_url:
            deployment = Deployment(
                owner_url=database_url,
                app_url=make_url(database_url).set(username=role, password=None).render_as_string(hide_password=False),
                role=role,
            )
            if revision is not None:
                with psycopg.connect(owner_url, autocommit=True) as conn:
                    # Membership only adds a row naming our role; space_app itself is not changed.
                    conn.execute(sql.SQL("GRANT space_app TO {}").format(sql.Identifier(role)))
            yield deployment
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def deployment(owner_url: str) -> Iterator[Deployment]:
    """A migrated deployment shared by this module's tests; each test undoes what it changes."""
    with _deployment(owner_url) as d:
        yield d


def _check(d: Deployment) -> tuple[int, dict[str, str], str]:
    """Run `space check`: exit code, its lines by check name, and the whole output."""
    out = subprocess.run([SPACE, "check"], env=d.env(), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    lines: dict[str, str] = {}
    for line in out.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("ok", "FAIL"):
            name = rest.strip().split(":", 1)[0]
            lines[name] = line
    return out.returncode, lines, out.stdout + out.stderr


NAMES = {
    "owner connection",
    "app connection",
    "server version",
    "migrations",
    "app role",
    "row level security",
    "maintenance functions",
    "queue",
    "clock",
    "signing key",
    "email",
}


def _failing(lines: dict[str, str]) -> set[str]:
    return {name for name, line in lines.items() if line.startswith("FAIL")}


def test_green_on_a_fresh_migrated_database(deployment: Deployment) -> None:
    code, lines, output = _check(deployment)
    assert set(lines) == NAMES, output
    assert _failing(lines) == set(), output
    assert code == 0, output
    assert deployment.role in lines["app role"]
    # Every SECURITY DEFINER function the migrations left is one the check judged.
    with deployment.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE p.prosecdef AND n.nspname = 'public'"
        ).fetchone()
    assert row is not None and row[0] >= 9, row
    assert f"maintenance functions: {row[0]} functions," in lines["maintenance functions"], output


def test_force_off_on_one_table_is_red_and_names_the_fix(deployment: Deployment) -> None:
    with deployment.owner() as conn:
        conn.execute("ALTER TABLE tickets NO FORCE ROW LEVEL SECURITY")
        try:
            code, lines, output = _check(deployment)
        finally:
            conn.execute("ALTER TABLE tickets FORCE ROW LEVEL SECURITY")
    assert code != 0, output
    assert _failing(lines) == {"row level security"}, output
    assert "ALTER TABLE public.tickets FORCE ROW LEVEL SECURITY" in lines["row level security"], output


def test_a_missing_signing_key_is_red_and_names_the_fix(deployment: Deployment) -> None:
    with deployment.owner() as conn:
        kept = conn.execute("SELECT id, secret FROM signing_keys").fetchall()
        conn.execute("DELETE FROM signing_keys")
        try:
            code, lines, output = _check(deployment)
        finally:
            for row in kept:
                conn.execute("INSERT INTO signing_keys (id, secret) VALUES (%s, %s)", row)
    assert code != 0, output
    assert _failing(lines) == {"signing key"}, output
    assert "space migrate" in lines["signing key"], output


def test_bypassrls_on_the_app_role_is_red_and_names_the_fix(deployment: Deployment) -> None:
    with deployment.owner() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(deployment.role)))
        try:
            code, lines, output = _check(deployment)
        finally:
            conn.execute(sql.SQL("ALTER ROLE {} NOBYPASSRLS").format(sql.Identifier(deployment.role)))
    assert code != 0, output
    assert _failing(lines) == {"app role"}, output
    assert f"ALTER ROLE {deployment.role} NOBYPASSRLS" in lines["app role"], output


def test_app_role_owning_a_table_is_red(deployment: Deployment) -> None:
    with deployment.owner() as conn:
        conn.execute(sql.SQL("ALTER TABLE projects OWNER TO {}").format(sql.Identifier(deployment.role)))
        try:
            code, lines, output = _check(deployment)
        finally:
            conn.execute("ALTER TABLE projects OWNER TO CURRENT_USER")
    assert code != 0, output
    assert "app role" in _failing(lines), output
    assert "public.projects" in lines["app role"] and "OWNER TO" in lines["app role"], output


def test_maintenance_functions_that_cannot_see_rows_are_red(deployment: Deployment) -> None:
    # Owned by a role that neither is superuser nor has BYPASSRLS, a SECURITY DEFINER function reads the
    # FORCE-RLS tables with no tenant context: it sees no rows, and the reconciler silently finds nothing.
    weak = f"{deployment.role}_weak"
    fn = "space_exports_reconcile_candidates(integer)"
    with deployment.owner() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(weak)))
        try:
            conn.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(fn), sql.Identifier(weak)))
            code, lines, output = _check(deployment)
        finally:
            conn.execute(sql.SQL("ALTER FUNCTION {} OWNER TO CURRENT_USER").format(sql.SQL(fn)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(weak)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(weak)))
    assert code != 0, output
    assert _failing(lines) == {"maintenance functions"}, output
    line = lines["maintenance functions"]
    assert "space_exports_reconcile_candidates" in line and weak in line and "BYPASSRLS" in line, output


def test_a_security_definer_function_no_list_names_is_checked(deployment: Deployment) -> None:
    # Made the way a careless migration would: its search_path not pinned, EXECUTE left to PUBLIC.
    fn = "space_chk_unlisted(integer)"
    with deployment.owner() as conn:
        conn.execute(
            "CREATE FUNCTION space_chk_unlisted(n integer) RETURNS integer LANGUAGE sql SECURITY DEFINER AS 'SELECT n'"
        )
        try:
            code, lines, output = _check(deployment)
        finally:
            conn.execute(f"DROP FUNCTION {fn}")
    assert code != 0, output
    assert _failing(lines) == {"maintenance functions"}, output
    line = lines["maintenance functions"]
    assert f"{fn} does not pin its search_path" in line, output
    assert f"ALTER FUNCTION {fn} SET search_path = pg_catalog, pg_temp" in line, output
    assert f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC" in line, output


def test_a_search_path_that_is_not_pinned_is_red(deployment: Deployment) -> None:
    # One of the functions the hand-written list used to miss, its search_path reset, then one that searches
    # pg_temp first (the search_path it gets when pg_temp is not named last).
    fn = "space_ticket_search(text, integer)"
    with deployment.owner() as conn:
        try:
            conn.execute(f"ALTER FUNCTION {fn} RESET search_path")
            code, lines, output = _check(deployment)
            conn.execute(f"ALTER FUNCTION {fn} SET search_path = pg_temp, pg_catalog")
            code2, lines2, output2 = _check(deployment)
        finally:
            conn.execute(f"ALTER FUNCTION {fn} SET search_path = pg_catalog, pg_temp")
    assert code != 0 and code2 != 0, output + output2
    assert _failing(lines) == _failing(lines2) == {"maintenance functions"}, output + output2
    assert f"{fn} does not pin its search_path" in lines["maintenance functions"], output
    line = lines2["maintenance functions"]
    assert "pg_temp not last" in line and "SET search_path = pg_catalog, pg_temp" in line, output2


def test_queue_schema_not_owned_by_the_queue_role_is_red(deployment: Deployment) -> None:
    with deployment.owner() as conn:
        conn.execute("ALTER SCHEMA saq OWNER TO CURRENT_USER")
        try:
            code, lines, output = _check(deployment)
        finally:
            conn.execute("ALTER SCHEMA saq OWNER TO space_queue")
    assert code != 0, output
    assert _failing(lines) == {"queue"}, output
    assert "ALTER SCHEMA saq OWNER TO space_queue" in lines["queue"], output


def test_migrations_one_step_behind_is_red(owner_url: str) -> None:
    script = ScriptDirectory.from_config(alembic_config(owner_url))
    head = script.get_current_head()
    assert head is not None
    previous = script.get_revision(head).down_revision
    assert isinstance(previous, str)
    with _deployment(owner_url, previous) as d:
        code, lines, output = _check(d)
    assert code != 0, output
    assert "migrations" in _failing(lines), output
    line = lines["migrations"]
    assert previous in line and head in line and "run `space migrate`" in line, output


def test_check_on_an_unmigrated_database_is_red_and_writes_nothing(owner_url: str) -> None:
    with _deployment(owner_url, revision=None) as d:
        code, lines, output = _check(d)
        with d.owner() as conn:
            objects = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
            ).fetchone()
            schemas = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'saq'").fetchone()
    assert code != 0, output
    assert "run `space migrate`" in lines["migrations"], output
    assert objects == (0,) and schemas == (0,), output
